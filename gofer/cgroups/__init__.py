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
    Journal,
    device_rules,
    hierarchy,
    merge_memory,
    own_cgroups,
    own_unified,
    unified,
    write_file,
)
from gofer.cgroups.embedded import allow_devices
from gofer.cgroups.remove import Pinned, remove_dirs
from gofer.cgroups.v1 import CgroupV1, v1_files
from gofer.cgroups.v2 import CgroupV2, attach_rules, swap_v2, v2_files
from mounts.errors import SandboxError

__all__ = ["ROOT", "CgroupV1", "CgroupV2", "Pinned", "allow_devices", "attach_rules", "container_cgroup",
           "device_rules", "devices_enforced", "existing", "hierarchy", "merged", "own_cgroups", "own_unified",
           "remove_dirs", "swap_v2", "unified", "update", "v1_files", "v2_files", "write_file"]


def container_cgroup(path: str, caller: int | str = "self") -> CgroupV1 | CgroupV2 | None:
    """The container's cgroup on this host's layout, a relative ``path`` below the cgroups of
    ``caller`` (the process whose limits the container stays under: ours, or a served
    create's launcher); None where there is none to make."""
    if unified():
        return CgroupV2(path, caller=caller)
    cgroup = CgroupV1(path, caller=caller)
    return cgroup if cgroup.dirs else None


def existing(dirs: list[str]) -> CgroupV1 | CgroupV2:
    """The container's cgroup from the directories its state names (one per hierarchy)."""
    if unified():
        return CgroupV2("", dirs={"unified": dirs[0]})
    by_ctrl = {}
    for d in dirs:
        for ctrl in os.path.basename(hierarchy(d)).split(","):
            by_ctrl[ctrl] = d
    return CgroupV1("", dirs=by_ctrl)


def merged(dirs: list[str], resources):
    """An update's linux.resources merged with the container's memory limits as they stand
    (common.merge_memory: runc's update merges into the container's config)."""
    mem = resources.memory
    if mem is None or not (mem.limit or mem.swap):
        return resources
    import msgspec

    return msgspec.structs.replace(resources, memory=merge_memory(mem, *existing(dirs).memory_now()))


def update(dirs: list[str], resources) -> None:
    """New limits for a container's existing cgroup directories (``sandbox update``, after
    merged()), in the same files, conversions and order as at create; the device rules are
    not touched. All or nothing: each file is read before it is written, and should a write
    fail (a memory limit below what the container uses, a value the kernel refuses), those
    written are put back, last first."""
    cgroup = existing(dirs)
    journal = cgroup.journal = Journal()
    try:
        cgroup.limits(resources)
    except BaseException as e:
        failed = journal.undo()
        if failed and isinstance(e, SandboxError):
            raise SandboxError(f"{e}; could not put back {', '.join(failed)}", op=e.op, path=e.path) from None
        raise


def devices_enforced(dirs) -> bool:
    """Whether the cgroup directories ``dirs`` carry device rules: one in a v1 devices
    hierarchy, or any on v2 (where every container's cgroup gets its program)."""
    return any(os.path.basename(h) == "devices" or unified(h) for h in map(hierarchy, dirs))
