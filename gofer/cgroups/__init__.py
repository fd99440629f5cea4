"""The container's cgroup, on either layout the kernel offers: cgroup v1 (one hierarchy per
controller under /sys/fs/cgroup, hybrid hosts included) or v2 (one unified hierarchy at
/sys/fs/cgroup). Its limits from linux.resources, its device rules, the GPU nodes allowed
in them; and, for a container another runtime created (the hook), only the GPU nodes added
to its rules.

The device rules are what keep a container that holds CAP_MKNOD (Docker grants it) from
making and opening the host's disks: deny all first, then the spec's rules, runc's default
nodes and the GPU nodes of the plan. v1 writes them to the devices controller; v2 has no
such controller, so they become an eBPF program attached to the cgroup (gofer/devfilter.py),
as runc does.

One module per job: common.py (layouts, rules, files), base.py, v1.py and v2.py (the two
managers and their conversions of linux.resources), remove.py, and embedded.py (another
runtime's container: only the GPU nodes added). This file picks the layout.
"""

from __future__ import annotations

import os

from gofer.cgroups.common import (
    ROOT,
    device_rules,
    hierarchy,
    own_cgroups,
    own_unified,
    unified,
    write_file,
)
from gofer.cgroups.embedded import allow_devices
from gofer.cgroups.remove import Pinned, remove_dirs
from gofer.cgroups.v1 import CgroupV1, v1_files
from gofer.cgroups.v2 import CgroupV2, attach_rules, v2_files
from mounts.errors import SandboxError

__all__ = ["ROOT", "CgroupV1", "CgroupV2", "Pinned", "allow_devices", "attach_rules", "container_cgroup",
           "device_rules", "devices_enforced", "hierarchy", "own_cgroups", "own_unified", "remove_dirs", "unified",
           "update", "v1_files", "v2_files", "write_file"]


def container_cgroup(path: str) -> CgroupV1 | CgroupV2 | None:
    """The container's cgroup on this host's layout; None where there is none to make."""
    if unified():
        return CgroupV2(path)
    cgroup = CgroupV1(path)
    return cgroup if cgroup.dirs else None


def update(dirs: list[str], resources) -> None:
    """New limits for a container's existing cgroup directories (``sandbox update``), in the
    same files and conversions as at create; the device rules are not touched."""
    if unified():
        d = dirs[0]
        for name, value, what in v2_files(resources, lambda f: os.path.exists(os.path.join(d, f))):
            write_file(d, name, str(value), what)
        return
    by_ctrl = {}
    for d in dirs:
        for ctrl in os.path.basename(hierarchy(d)).split(","):
            by_ctrl[ctrl] = d
    for ctrl, name, value, what in v1_files(resources):
        if ctrl not in by_ctrl:
            raise SandboxError(f"{what}: the container has no {ctrl} cgroup to update")
        if name in ("blkio.weight", "blkio.leaf_weight") and not os.path.exists(os.path.join(by_ctrl[ctrl], name)):
            name = "blkio.bfq.weight"  # the BFQ scheduler's name for it (runc's fallback)
        write_file(by_ctrl[ctrl], name, str(value), what)


def devices_enforced(dirs) -> bool:
    """Whether the cgroup directories ``dirs`` carry device rules: one in a v1 devices
    hierarchy, or any on v2 (where every container's cgroup gets its program)."""
    return any(os.path.basename(h) == "devices" or unified(h) for h in map(hierarchy, dirs))
