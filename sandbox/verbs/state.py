"""``sandbox state ID``, ``list``, ``kill [--all] ID [SIGNAL]``, ``ps ID``: the containers
recorded under ``--root``, as runc's verbs of the same names show and signal them."""

from __future__ import annotations

import sys

from mounts.errors import SandboxError
from sandbox import jsonlite
from sandbox.processes import container_pids, signal_all, signal_init
from sandbox.state import StateDir, being_created, list_states


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


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"
