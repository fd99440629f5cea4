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
from gofer.root import Root
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
    if theirs == ours:
        raise SandboxError(f"pid {pid} shares our mount namespace: it is not a container's init; "
                           "refusing to mount into the host's tree")


def join_mount_namespace(pid: int) -> None:
    """setns into ``pid``'s mount namespace (checked first, see check_mount_namespace)."""
    check_mount_namespace(pid)
    fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        sc.setns(fd, sc.CLONE_NEWNS, what=f"mount namespace of pid {pid}")
    finally:
        os.close(fd)


def apply_plan(actions: Iterable[AnyAction], rootfs: str, pid: int | None = None) -> int:
    """Perform ``actions`` inside ``rootfs`` (as the mount namespace sees it); returns how
    many were applied. With ``pid``, first allow the GPU nodes in its device rules (host
    side), then join its mount namespace. On any error, everything already mounted is
    detached again, the device rules are put back, and the error is raised."""
    actions = list(actions)
    undo_devices = None
    if pid is not None:
        check_mount_namespace(pid)  # first: a stale pid must not get GPU nodes in anyone's cgroup
        undo_devices = allow_devices(pid, [(a.major, a.minor) for a in actions if isinstance(a, Device)])
        try:
            join_mount_namespace(pid)
        except BaseException:
            if undo_devices is not None:
                undo_devices()
            raise
    root = Root(rootfs)
    n = 0
    try:
        root.adopt_tmpfs("/dev")
        root.prepare([a.target for a in actions if not isinstance(a, ProcFs)])
        for action in actions:
            gpu.apply(root, action)
            n += 1
    except BaseException:
        root.undo()
        if undo_devices is not None:  # (the host's cgroupfs: reached from here by path)
            undo_devices()
        raise
    finally:
        root.close()
    return n
