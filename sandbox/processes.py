"""The container's processes, as its state names them: listed (never one that is not the
container's), signalled (the init through a pidfd), killed and waited for."""

from __future__ import annotations

import os
import time

from mounts.errors import SandboxError
from sandbox.state import State, not_running, start_time


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
    import _signal  # type: ignore[import-not-found]  # signal's C module: no typeshed stub

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


def kill_all(state) -> None:
    """SIGKILL every process of the container, and wait until they are gone (none before its
    init is known)."""
    if state.creating:
        return

    signal_all(state, 9)  # SIGKILL
    deadline = time.monotonic() + 10
    while start_time(state.pid) == state.start_time or (
            not state.pid_ns_own and any(start_time(p) is not None for p in container_pids(state))):
        if time.monotonic() > deadline:
            raise SandboxError(f"container {state.id!r}: pid {state.pid} did not die after SIGKILL")
        time.sleep(0.002)
