"""cgroup v1: one hierarchy per controller under /sys/fs/cgroup (hybrid hosts included):
the container's cgroup in each, linux.resources as v1's files (memory and memory+swap in the
order the kernel takes them), the device rules in the devices controller."""

from __future__ import annotations

import os

from gofer.cgroups.base import Base
from gofer.cgroups.common import (
    ROOT,
    THROTTLE,
    below,
    camel,
    device_rules,
    limit_of,
    own_cgroups,
    rdma,
    read,
)
from mounts.errors import SandboxError


class CgroupV1(Base):
    """cgroup v1: the container's cgroup in every controller's hierarchy; ``path`` absolute
    (under each controller's root) or relative to the cgroup there of ``caller`` (a pid, or
    "self": runc's rule, relative to its own)."""

    def __init__(self, path: str, dirs: dict[str, str] | None = None, caller: int | str = "self"):
        super().__init__()
        # by the hierarchy's real directory: cpu and cpuacct -> cpu,cpuacct name the same cgroup;
        # or ``dirs`` someone else made (systemd)
        self.dirs = dirs if dirs is not None else {
            ctrl: below(os.path.realpath(os.path.join(ROOT, ctrl)), mine, path)
            for ctrl, mine in own_cgroups(caller).items()}

    def create(self) -> None:
        for ctrl, d in self.dirs.items():
            for m in self._mkdirs(d):
                if ctrl == "cpuset":  # an empty cpuset takes no task: start from the parent's
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        self._write(m, f, read(os.path.join(os.path.dirname(m), f)))

    def set(self, ctrl: str, name: str, value, what: str = "") -> None:
        if ctrl not in self.dirs:
            raise SandboxError(f"{what or 'linux.resources'}: the {ctrl} cgroup controller is not mounted "
                               f"under {ROOT}")
        self._write(self.dirs[ctrl], name, str(value), what)

    def apply(self, resources, devices) -> None:
        """linux.resources, then the device rules."""
        if resources is not None:
            self.limits(resources)
        if "devices" not in self.dirs:
            return
        for rule in device_rules(resources, devices):
            if rule.type == "a" and rule.major is rule.minor is None:
                self.set("devices", "devices.allow" if rule.allow else "devices.deny", "a")
            else:
                self.set("devices", "devices.allow" if rule.allow else "devices.deny", rule.line())

    def allow(self, major: int, minor: int) -> None:
        """A GPU node of the plan: read and write (it is bound in, never mknod'ed)."""
        if "devices" in self.dirs:
            self.set("devices", "devices.allow", f"c {major}:{minor} rw")

    def limits(self, resources) -> None:
        """linux.resources' files (create's, and update's with a journal)."""
        mem = resources.memory
        now = self.memory_now() if mem is not None and (mem.limit or mem.swap) else (-1, -1)
        for ctrl, name, value, what in v1_files(resources, now):
            if ctrl == "blkio" and name in ("blkio.weight", "blkio.leaf_weight") and "blkio" in self.dirs \
                    and not os.path.exists(os.path.join(self.dirs["blkio"], name)):
                name = "blkio.bfq.weight"  # the BFQ scheduler's name for it (runc's fallback)
            try:
                self.set(ctrl, name, value, what)
            except SandboxError:
                if name == "memory.limit_in_bytes" and "memory" in self.dirs:
                    _too_low(self.dirs["memory"], value, what)
                raise

    def memory_now(self) -> tuple[int, int]:
        """The memory cgroup's limit and memory+swap limit as they stand: -1 for none, memsw 0
        where the kernel accounts no swap (no file). No memory cgroup: a new one's (the
        writes will name what is missing)."""
        d = self.dirs.get("memory")
        try:
            limit = limit_of(read(os.path.join(d, "memory.limit_in_bytes"))) if d else -1
        except FileNotFoundError:
            return -1, -1
        try:
            return limit, limit_of(read(os.path.join(d, "memory.memsw.limit_in_bytes"))) if d else -1
        except FileNotFoundError:
            return limit, 0


def _too_low(d: str, value, what: str) -> None:
    """A memory limit the kernel refused: below what the container uses (EBUSY: it could not
    reclaim enough) is said so, as runc says it."""
    try:
        usage, peak = (int(read(os.path.join(d, f))) for f in ("memory.usage_in_bytes", "memory.max_usage_in_bytes"))
    except (OSError, ValueError):
        return
    if 0 < int(value) < usage:
        path = os.path.join(d, "memory.limit_in_bytes")
        raise SandboxError(f"{what}: {path}: cannot set the limit to {value}: the container uses {usage} "
                           f"(peak {peak})", op="cgroup", path=path) from None


def memory_v1(mem, limit_now: int, memsw_now: int) -> list[tuple[str, str, object, str]]:
    """memory.limit_in_bytes and memory.memsw.limit_in_bytes in the order the kernel takes them
    (runc's setMemoryAndSwap): it keeps memory <= memory+swap at every write, so a memory+swap
    limit above the memory limit as it stands (``limit_now``, -1 for none) goes first, any
    other last. Memory -1 alone lifts memory+swap too where the kernel accounts swap
    (``memsw_now``: the memory+swap limit, 0 where there is no such file)."""
    where = "linux.resources.memory"
    limit, swap = mem.limit or 0, mem.swap or 0  # 0 is unset (runc's rule: engines send zeros for what nobody asked)
    if limit == -1 and not swap and memsw_now:
        swap = -1
    if swap and not memsw_now:
        raise SandboxError(f"{where}.swap: this kernel accounts no swap (no memory.memsw.limit_in_bytes; it "
                           "takes swapaccount=1 on its command line): no memory+swap limit can be set")
    pair = [("memory", "memory.limit_in_bytes", limit, f"{where}.limit"),
            ("memory", "memory.memsw.limit_in_bytes", swap, f"{where}.swap")]
    if limit and swap and (swap == -1 or -1 < limit_now < swap):
        pair.reverse()
    return [p for p in pair if p[2]]


def v1_files(r, memory_now: tuple[int, int] = (-1, -1)) -> list[tuple[str, str, object, str]]:
    """(controller, file, value, spec field) for linux.resources on v1, in runc's order;
    ``memory_now``: the memory cgroup's limits as they stand (memory_v1; a new cgroup's)."""
    out = []
    mem = r.memory
    if mem is not None:
        out += memory_v1(mem, *memory_now)
        if mem.reservation:
            out.append(("memory", "memory.soft_limit_in_bytes", mem.reservation, "linux.resources.memory.reservation"))
        if mem.swappiness is not None and mem.swappiness != -1:
            out.append(("memory", "memory.swappiness", mem.swappiness, "linux.resources.memory.swappiness"))
        if mem.disable_oom_killer:
            out.append(("memory", "memory.oom_control", 1, "linux.resources.memory.disableOOMKiller"))
    cpu = r.cpu
    if cpu is not None:
        for name, value, field in (("cpu.shares", cpu.shares, "shares"), ("cpu.cfs_period_us", cpu.period, "period"),
                                   ("cpu.cfs_quota_us", cpu.quota, "quota"),
                                   ("cpu.rt_period_us", cpu.realtime_period, "realtimePeriod"),
                                   ("cpu.rt_runtime_us", cpu.realtime_runtime, "realtimeRuntime")):
            if value:
                out.append(("cpu", name, value, f"linux.resources.cpu.{field}"))
        for name, value in (("cpus", cpu.cpus), ("mems", cpu.mems)):
            if value:
                out.append(("cpuset", f"cpuset.{name}", value, f"linux.resources.cpu.{name}"))
    if r.pids is not None and r.pids.limit:
        out.append(("pids", "pids.max", r.pids.limit if r.pids.limit > 0 else "max", "linux.resources.pids.limit"))
    io = r.block_io
    if io is not None:
        where = "linux.resources.blockIO"
        if io.weight:
            out.append(("blkio", "blkio.weight", io.weight, f"{where}.weight"))
        if io.leaf_weight:
            out.append(("blkio", "blkio.leaf_weight", io.leaf_weight, f"{where}.leafWeight"))
        for d in io.weight_device:
            if d.weight:
                out.append(("blkio", "blkio.weight_device", f"{d.major}:{d.minor} {d.weight}", f"{where}.weightDevice"))
            if d.leaf_weight:
                out.append(("blkio", "blkio.leaf_weight_device", f"{d.major}:{d.minor} {d.leaf_weight}",
                            f"{where}.weightDevice"))
        for field, name in THROTTLE:
            for d in getattr(io, field):
                out.append(("blkio", f"blkio.throttle.{name}_device", f"{d.major}:{d.minor} {d.rate}",
                            f"{where}.{camel(field)}"))
    for h in r.hugepage_limits:
        out.append(("hugetlb", f"hugetlb.{h.page_size}.limit_in_bytes", h.limit, "linux.resources.hugepageLimits"))
    if r.network is not None:
        if r.network.class_id is not None:
            out.append(("net_cls", "net_cls.classid", r.network.class_id, "linux.resources.network.classID"))
        for p in r.network.priorities:
            out.append(("net_prio", "net_prio.ifpriomap", f"{p.name} {p.priority}", "linux.resources.network.priorities"))
    for dev, limit in r.rdma.items():
        out.append(("rdma", "rdma.max", rdma(dev, limit), "linux.resources.rdma"))
    if r.unified:
        raise SandboxError("linux.resources.unified: needs cgroup v2 (this host has v1 controllers)")
    return out
