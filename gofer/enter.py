"""The container's namespaces as the executor joins them (sandbox/executor/frontend.c): opened through
one pinned /proc/<init> (open_namespaces), for exec's plan (sandbox/executor/exec_plan.py) and for
the builder (gofer/remote_init.py); and the executor's report ("pid N", "err CODE MESSAGE"),
read back as a pid or a one-line error (parse_report).
"""

from __future__ import annotations

import os

from gofer import syscalls as sc
from mounts.errors import SandboxError
from mounts.proc import start_time as _start_time

# user first: in it we hold the privileges over the namespaces it owns, and no other (so the
# cgroups, rlimits and scheduling come before it). mnt last: joining it moves our root and
# cwd into the container, after which the host's /proc/<pid>/ns files are out of reach (all
# fds are opened first anyway).
NAMESPACES = (("user", sc.CLONE_NEWUSER), ("ipc", sc.CLONE_NEWIPC), ("uts", sc.CLONE_NEWUTS), ("net", sc.CLONE_NEWNET),
              ("pid", sc.CLONE_NEWPID), ("cgroup", sc.CLONE_NEWCGROUP), ("mnt", sc.CLONE_NEWNS))


def open_namespaces(init: int, start_time: int | None = None) -> list[tuple[int, int, str]]:
    """(fd, CLONE_NEW*, name) of every namespace of ``init`` that is not ours, in joining
    order. Everything through one fd of /proc/<init>: should the pid be reused meanwhile,
    reads through it fail instead of reaching another process. The start time is checked
    through it after the namespaces are open, and a container always has a mount namespace
    of its own: one equal to ours is not our container's init."""
    fds = []
    try:
        pdir = os.open(f"/proc/{init}", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for name, flag in NAMESPACES:
                if os.stat(f"ns/{name}", dir_fd=pdir).st_ino != os.stat(f"/proc/self/ns/{name}").st_ino:
                    fds.append((os.open(f"ns/{name}", os.O_RDONLY | os.O_CLOEXEC, dir_fd=pdir), flag, name))
                elif name == "mnt":
                    raise SandboxError(f"pid {init} shares our mount namespace: it is not the container's init")
            if start_time is not None and _start_time(init, pdir) != start_time:
                raise SandboxError(f"pid {init} is no longer the container's init")
        finally:
            os.close(pdir)
    except (OSError, SandboxError) as e:
        for fd, _, _ in fds:
            os.close(fd)
        if isinstance(e, SandboxError):
            raise
        raise SandboxError(f"pid {init}: cannot open its namespaces: {e.strerror}") from None
    return fds


def parse_report(report: str) -> tuple[int | None, SandboxError | None]:
    """The child's report ("pid N", then nothing or "err CODE MESSAGE"; sandbox/executor/frontend.c
    writes the same): G's pid, and the error that kept it from exec'ing."""
    pid = None
    for line in report.splitlines():
        word, _, rest = line.partition(" ")
        if word == "pid":
            pid = int(rest)
        elif word == "err":
            code, _, message = rest.partition(" ")
            return pid, SandboxError(message, code=int(code))
    if pid is None:
        return None, SandboxError("the process could not be started in the container's namespaces")
    return pid, None
