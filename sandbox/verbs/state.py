"""``sandbox state ID``, ``list``, ``kill [--all] ID [SIGNAL]``, ``ps ID``: the containers
recorded under ``--root``, as runc's verbs of the same names show and signal them."""

from __future__ import annotations

import os
import sys

from mounts.errors import SandboxError
from sandbox import jsonlite
from sandbox.state import State, StateDir, being_created, list_states, not_running, start_time


def main(args) -> int:
    if args.verb == "list":
        return _list(args)
    state = StateDir(args.root, args.container_id).load()
    if args.verb == "state":
        sys.stdout.write(jsonlite.dumps(state.public(), indent=2) + "\n")
    elif args.verb == "kill":
        signum = parse_signal(args.signal)
        if state.status == "creating":  # no init known: nothing to signal yet
            raise being_created(state, args.root)
        if args.all:  # a stopped container too, as runc: what it left in its cgroup
            signal_all(state, signum)
        else:
            signal_init(state, signum)
    else:  # ps
        pids = container_pids(state)
        if args.format == "json":
            sys.stdout.write(jsonlite.dumps(pids) + "\n")
        else:
            sys.stdout.write("PID    CMD\n")
            for pid in pids:
                sys.stdout.write(f"{pid:<6} {_cmdline(pid)}\n")
    return 0


def _list(args) -> int:
    states = list_states(args.root)
    if args.quiet:
        sys.stdout.write("".join(s.id + "\n" for s in states))
    elif args.format == "json":
        sys.stdout.write(jsonlite.dumps([s.public() for s in states]) + "\n")
    else:
        rows = [("ID", "PID", "STATUS", "BUNDLE", "CREATED", "OWNER")]
        rows += [(s.id, str(s.public()["pid"]), s.status, s.bundle, s.created, s.owner) for s in states]
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        for r in rows:
            sys.stdout.write("  ".join(f"{c:<{widths[i]}}" for i, c in enumerate(r[:5])) + "  " + r[5] + "\n")
    return 0


def parse_signal(value: str) -> int:
    """KILL, SIGKILL, kill or 9, through the C module alone (the signal module's enums are
    3 ms of a 4 ms verb)."""
    name = value.upper()
    if name.isascii() and name.isdigit() and len(name) <= 2 and 0 < int(name) <= 64:
        return int(name)
    import _signal  # type: ignore[import-not-found]  # signal's C module: no typeshed stub

    signum = getattr(_signal, name if name.startswith("SIG") else "SIG" + name, None)
    if not isinstance(signum, int) or isinstance(signum, bool) or signum not in _signal.valid_signals():
        raise SandboxError(f"kill: unknown signal {value!r}")
    return signum


def container_pids(state: State) -> list[int]:
    """Every process of the container, and never one that is not: none before its init is
    known (a container being created, or whose create died); with a pid namespace of its
    own, the processes in it (the cgroup's members in it, else a walk of /proc: a
    cgroupsPath may name a cgroup with the host's processes in it); with a joined or the
    host's one, the members of a cgroup that is the container's own (made for it: of one
    that was there before, only the init), in that namespace."""
    if state.creating:
        return []
    alive = start_time(state.pid) == state.start_time
    ns = state.pid_ns or (_pid_ns(state.pid) if alive else None)
    if state.pid_ns_own and not alive:
        return []  # the kernel killed every process of the namespace with its init
    members = _members(state.cgroup)
    if not state.pid_ns_own and not _made_for_it(state):
        members = None  # others may be in it: they are not told from the container's by namespace
    if ns is None:  # (a state of an older version: no namespace recorded, init gone)
        return members or []
    if members is not None:
        pids = [p for p in members if _pid_ns(p) == ns]
    elif state.pid_ns_own:
        pids = [int(n) for n in os.listdir("/proc") if n.isdigit() and _pid_ns(int(n)) == ns]
    else:
        pids = []
    if alive and state.pid not in pids:
        pids.append(state.pid)
    return sorted(pids)


def _made_for_it(state: State) -> bool:
    """Whether the container's cgroup was made for it: by us, or the systemd unit we started."""
    return bool(state.cgroup) and (state.cgroup[0] in state.cgroup_created or bool(state.systemd_invocation))


def signal_init(state: State, signum: int) -> None:
    """``signum`` to the container's init, through a pidfd: to the very process recorded,
    never to one that got its pid since (a container that has exited: runc's words)."""
    import _signal

    if state.creating:  # (a create that died: its pid was the creating process's)
        raise not_running(state)
    try:
        fd = os.pidfd_open(state.pid)
    except ProcessLookupError:
        raise not_running(state) from None
    try:
        if start_time(state.pid) != state.start_time:  # (read after the pidfd: it names this process)
            raise not_running(state)
        _signal.pidfd_send_signal(fd, signum)
    except ProcessLookupError:
        raise not_running(state) from None
    finally:
        os.close(fd)


def _members(dirs: list[str]) -> list[int] | None:
    for d in dirs[:1]:
        try:
            with open(os.path.join(d, "cgroup.procs")) as f:
                return [int(p) for p in f.read().split()]
        except OSError:
            pass
    return None


def _pid_ns(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def signal_all(state: State, signum: int) -> None:
    for pid in container_pids(state):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"
