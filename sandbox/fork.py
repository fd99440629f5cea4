"""Fork the gofer first: `sandbox run` and `create` do this before anything else is imported,
even before the command line is parsed (cli.main), so that the child imports what it needs
and starts building the root while the parent imports, parses the bundle and resolves the
GPU closure. This module imports only builtins: everything it costs is on the critical path.
The process is single-threaded at the fork and the child runs plain Python (no locks held,
no exec), so forking here is safe. See docs/design.md.
"""

from __future__ import annotations

import _socket
import _thread
import os
import time


class Gofer(tuple):
    """(pid, our end of the socketpair, CLOCK_MONOTONIC at the fork: the trace's origin,
    the cgroup warm-up's flag: clear it to stop that thread)."""

    pid = property(lambda self: self[0])
    sock = property(lambda self: self[1])
    t0 = property(lambda self: self[2])
    warm = property(lambda self: self[3])


def spawn_gofer() -> Gofer:
    """Fork the gofer; in the child this never returns."""
    t0 = time.monotonic_ns()
    ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        ours.close()
        from gofer.main import serve

        serve(theirs, t0, me)  # never returns
    theirs.close()
    return Gofer((pid, ours, t0, warm_cgroup_lock()))


def warm_cgroup_lock() -> list | None:
    """Start a thread that keeps the kernel's cgroup attach lock warm until its flag is cleared.

    The first write to any cgroup.procs after a quiet spell waits for an RCU grace period
    (cgroup_threadgroup_rwsem's rcu_sync: 10-14 ms on the development VM; runc pays it too),
    and later writes are fast for as long as each comes within a grace period of the last.
    The thread writes our own pid to our own cgroup (a move to where we already are:
    nothing changes) every 2 ms while the main thread imports and parses, so that the
    container's cgroup step finds the lock warm. Best effort: an error ends the thread, and
    the step pays as before."""
    try:
        with open("/proc/self/cgroup", "rb") as f:
            line = next((x for x in f.read().splitlines() if x.startswith(b"0::")), None)
    except OSError:
        return None
    if line is None:
        return None
    rel = line[3:].decode(errors="replace").lstrip("/")
    target = next((p for p in (os.path.join("/sys/fs/cgroup/unified", rel, "cgroup.procs"),
                               os.path.join("/sys/fs/cgroup", rel, "cgroup.procs")) if os.path.exists(p)), None)
    if target is None:
        return None
    flag = [True]

    def keep_warm() -> None:
        me = str(os.getpid()).encode()
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CLOEXEC)
            try:
                while flag[0]:
                    os.write(fd, me)
                    time.sleep(0.002)
            finally:
                os.close(fd)
        except OSError:
            pass

    _thread.start_new_thread(keep_warm, ())
    return flag
