"""The gofer's mounting, embedded in another runtime's container (the hook, the Python API):
join the container's mount namespace, allow the GPU nodes in its devices cgroup, apply the
plan inside its rootfs, and undo everything on any error.

Unlike `sandbox run`, the root here is another runtime's: each image directory that must
gain entries gets its own private overlay (gofer/root.py), nothing is pivoted or exec'd.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from gofer import gpu
from gofer import syscalls as sc
from gofer.cgroups import allow_devices
from gofer.root import Root, mount_table
from mounts.actions import AnyAction, Device, ProcFs
from mounts.errors import SandboxError


def check_mount_namespace(pid: int) -> None:
    """``pid``'s mount namespace must not be ours: a container's init lives in a namespace of
    its own, and a pid in ours (a wrong or stale pid in the state JSON) would have us mount
    straight into the host's tree."""
    try:
        theirs, ours = os.stat(f"/proc/{pid}/ns/mnt").st_ino, os.stat("/proc/self/ns/mnt").st_ino
    except OSError as e:
        raise SandboxError(f"pid {pid}: cannot see its mount namespace: {e.strerror}", path=f"/proc/{pid}/ns/mnt") from None
    try:
        host = os.stat("/proc/1/ns/mnt").st_ino
    except OSError:
        host = None  # (pid 1 hidden: our /proc is a container's)
    if theirs in (ours, host):
        whose = "our" if theirs == ours else "pid 1's"
        raise SandboxError(f"pid {pid} shares {whose} mount namespace: it is not a container's init; "
                           "refusing to mount into the host's tree")


def join_mount_namespace(pid: int) -> None:
    """setns into ``pid``'s mount namespace (checked first, see check_mount_namespace)."""
    check_mount_namespace(pid)
    fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        sc.setns(fd, sc.CLONE_NEWNS, what=f"mount namespace of pid {pid}")
    finally:
        os.close(fd)


APPLIED = "/run/gpu-sandbox/applied"  # a file per container set up: <mnt ns>-<pid>-<start time>
LOCK_PATIENCE = 60.0  # s to wait for another setup of the same container


class _Claim:
    """One setup of a container at a time (two hooks of the same container, a hook and the
    API): an flock on its mount namespace, held until we are done, which also goes with the
    namespace. Whether it was set up already is a file under APPLIED naming the namespace
    and the init's pid and start time (never a recycled one's); stale ones are pruned."""

    def __init__(self, pid: int):
        import fcntl
        import time

        from mounts.proc import start_time

        self.fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        deadline = time.monotonic() + LOCK_PATIENCE
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise SandboxError(f"pid {pid}: another GPU setup of this container has held it for "
                                       f"{LOCK_PATIENCE:.0f} s") from None
                time.sleep(0.005)
        self.name = f"{os.fstat(self.fd).st_ino}-{pid}-{start_time(pid)}"
        self.done = os.path.exists(os.path.join(APPLIED, self.name))

    def record(self) -> None:
        from mounts.proc import start_time

        os.makedirs(APPLIED, mode=0o700, exist_ok=True)
        for name in os.listdir(APPLIED):  # containers gone since
            _, _, rest = name.partition("-")
            pid, _, start = rest.partition("-")
            if not pid.isdigit() or str(start_time(int(pid))) != start:
                try:
                    os.unlink(os.path.join(APPLIED, name))
                except FileNotFoundError:
                    pass
        os.close(os.open(os.path.join(APPLIED, self.name), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600))

    def release(self) -> None:
        os.close(self.fd)


def apply_plan(actions: Iterable[AnyAction], rootfs: str, pid: int | None = None) -> int:
    """Perform ``actions`` inside ``rootfs`` (as the mount namespace sees it); returns how
    many were applied. With ``pid``, first allow the GPU nodes in its device rules (host
    side), then join its mount namespace; a container set up already (by a second hook
    running at the same time or later) is left as it is: 0. On any error, everything
    already mounted is detached again, the device rules are put back, and the error is
    raised."""
    actions = list(actions)
    if pid is None:
        return _apply(actions, rootfs, None)
    check_mount_namespace(pid)  # first: a stale pid must not get GPU nodes in anyone's cgroup
    claim = _Claim(pid)
    try:
        if claim.done:
            return 0
        n = _apply(actions, rootfs, pid)
        claim.record()
        return n
    finally:
        claim.release()


def _apply(actions: list[AnyAction], rootfs: str, pid: int | None) -> int:
    grant = root = None
    n = 0
    try:
        if pid is not None:
            grant = allow_devices(pid, [(a.major, a.minor) for a in actions if isinstance(a, Device)])
            join_mount_namespace(pid)
        root = Root(rootfs)
        table = mount_table()  # (one reading for both: neither mounts before the overlays)
        root.adopt_tmpfs("/dev", table)
        root.prepare([a.target for a in actions if not isinstance(a, ProcFs)], table)
        for action in actions:
            gpu.apply(root, action)
            n += 1
    except BaseException:
        if root is not None:
            root.undo()
        if grant is not None:  # (its fds, opened before we joined the container's mount namespace)
            try:
                grant.undo()
            except SandboxError:
                pass  # (the error to report is the first; the container is refused with it)
        raise
    else:
        if grant is not None:
            grant.release()
    finally:
        if root is not None:
            root.close()
    return n
