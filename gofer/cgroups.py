"""Device access for a container another runtime created: its cgroup v1 ``devices``
controller denies every node not allowed in config.json, so the GPU nodes we bind in must
be allowed there too (what nvidia-container-cli does). Only the exact nodes of the plan."""

from __future__ import annotations

import os

from mounts.errors import MountError

V1_ROOT = "/sys/fs/cgroup/devices"


def devices_cgroup(pid: int) -> str | None:
    """The v1 devices cgroup directory of ``pid``, or None where no v1 devices hierarchy is
    mounted at /sys/fs/cgroup/devices (a cgroup v2 view)."""
    if not os.path.isdir(V1_ROOT):
        return None
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "devices" in controllers.split(","):
                return os.path.join(V1_ROOT, path.lstrip("/"))
    return None


def allow_devices(pid: int, nodes: list[tuple[int, int]]) -> int:
    """Allow read/write/mknod of each (major, minor) char device for ``pid``'s cgroup.
    Returns how many rules were written (0 where there is no v1 devices controller: on
    cgroup v2 the runtime's device program governs, see the README)."""
    directory = devices_cgroup(pid)
    if directory is None or not nodes:
        return 0
    path = os.path.join(directory, "devices.allow")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as e:
        raise MountError(path, f"cannot open to allow GPU devices: {e.strerror}") from None
    try:
        for major, minor in nodes:
            os.write(fd, f"c {major}:{minor} rwm".encode())
    except OSError as e:
        raise MountError(path, f"cannot allow GPU devices: {e.strerror}") from None
    finally:
        os.close(fd)
    return len(nodes)
