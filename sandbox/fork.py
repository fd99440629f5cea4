"""Fork the gofer: `sandbox run` and `create`, in the planner, do this as soon as the bundle
is read, so that the child starts building the root while the parent resolves the GPU
closure. This module imports only builtins. The process is single-threaded at the fork and
the child runs plain Python (no locks held, no exec), so forking here is safe. See
docs/design.md.
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
    """Fork the gofer (in the child this never returns): it runs on in this warm
    interpreter (the planner's: pid 1 is the launcher's child, never this process's)."""
    t0 = time.monotonic_ns()
    ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        ours.close()
        from gofer.main import serve

        serve(theirs, t0, me)  # type: ignore[arg-type]  # never returns; a _socket.socket (socket.socket's base) has all serve uses
    theirs.close()
    return Gofer((pid, ours, t0, warm_cgroup_lock()))


MAX_WARM = 1.0  # seconds: the thread's whole life, whatever happens to the flag


def warm_cgroup_lock() -> list:
    """Start a thread that keeps the kernel's cgroup attach lock warm until its flag is cleared.

    The first write to any cgroup.procs after a quiet spell waits for an RCU grace period
    (cgroup_threadgroup_rwsem's rcu_sync: 10-14 ms on the development VM; runc pays it too),
    and later writes are fast for as long as each comes within a grace period of the last.
    The thread writes its own tid to the cgroup.threads of our own v2 cgroup every 2 ms while
    the main thread imports and parses, so that the container's cgroup step finds the lock
    warm. That moves one thread (this one, which is about to end) to where it already is;
    should anyone have moved our process to another cgroup meanwhile, the kernel refuses to
    split it (EOPNOTSUPP) and the thread ends, undoing nothing; the same refusal meets a path
    that names another cgroup (a cgroup namespace or mount that does not match
    /proc/self/cgroup), so nothing need be read first (the root's file lists every thread of
    the host). MAX_WARM at most. Each write holds the lock for microseconds, during which forks and
    exits on the host wait. Best effort: any error ends the thread, and the step pays as
    before. (A pid no task has is refused before the lock is taken, on 6.x: it does not warm it.)"""
    flag: list = [True, _thread.allocate_lock()]  # [go on, held around each write]

    def keep_warm() -> None:
        me = str(_thread.get_native_id())
        deadline = time.monotonic() + MAX_WARM
        try:
            with open("/proc/self/cgroup") as f:
                rel = next(x[3:].strip() for x in f if x.startswith("0::")).lstrip("/")
            target = next(p for p in (os.path.join("/sys/fs/cgroup/unified", rel, "cgroup.threads"),
                                      os.path.join("/sys/fs/cgroup", rel, "cgroup.threads")) if os.path.exists(p))
            fd = os.open(target, os.O_WRONLY | os.O_CLOEXEC)
            try:
                while flag[0] and time.monotonic() < deadline:
                    with flag[1]:
                        if not flag[0]:
                            break
                        os.write(fd, me.encode())
                    time.sleep(0.002)
            finally:
                os.close(fd)
        except (OSError, StopIteration, ValueError):
            pass

    _thread.start_new_thread(keep_warm, ())
    return flag
