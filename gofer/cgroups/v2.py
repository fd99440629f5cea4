"""cgroup v2: the one unified hierarchy at /sys/fs/cgroup: the container's cgroup, the
controllers enabled down to it, linux.resources as v2's files (runc's conversions), and the
device rules as an eBPF program attached to it (gofer/devfilter.py), as runc does."""

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
    own_unified,
    rdma,
    read,
)
from gofer.devfilter import Rule
from mounts.errors import SandboxError


class CgroupV2(Base):
    """cgroup v2: one directory in the unified hierarchy at ``root``; ``path`` absolute, or
    relative to the parent of ``caller``'s cgroup (a pid, or "self"; that cgroup holds
    processes, and v2 lets only a cgroup without any give controllers to its children:
    runc's rule)."""

    def __init__(self, path: str, root: str = ROOT, dirs: dict[str, str] | None = None, caller: int | str = "self"):
        super().__init__()
        self.root = root
        self.dirs = dirs if dirs is not None else {
            "unified": below(root, os.path.dirname(own_unified(caller)), path)}
        self.rules: list[Rule] = []

    def create(self) -> None:
        d = self.dirs["unified"]
        self._mkdirs(d)
        # every controller the root has, down to the container's cgroup (runc enables them
        # all, so the container sees its memory.max, pids.max ... whatever the spec set)
        level = self.root
        for part in os.path.relpath(d, self.root).split("/"):
            want = set(read(os.path.join(level, "cgroup.controllers")).split())
            have = set(read(os.path.join(level, "cgroup.subtree_control")).split())
            for c in sorted(want - have):
                try:
                    self._write(level, "cgroup.subtree_control", "+" + c)
                except SandboxError:
                    pass  # not enabled: a limit that needs it is an error when it is written
            level = os.path.join(level, part)

    def apply(self, resources, devices) -> None:
        d = self.dirs["unified"]
        if resources is not None:
            self.limits(resources)
        self.rules = device_rules(resources, devices)
        if d not in self.created and _programs(d):
            # a cgroup that existed may hold an earlier container's program, which would judge
            # the gofer's own mknods until seal(): the spec's rules replace it now, before Start
            attach_rules(d, self.rules)

    def allow(self, major: int, minor: int) -> None:
        self.rules.append(Rule(True, "c", major, minor, "rw"))

    def limits(self, resources) -> None:
        """linux.resources' files (create's, and update's with a journal)."""
        d = self.dirs["unified"]
        for name, value, what in v2_files(resources, lambda f: os.path.exists(os.path.join(d, f))):
            self._write(d, name, str(value), what)

    def memory_now(self) -> tuple[int, int]:
        """The memory and memory+swap limits as they stand, in v1's terms (what runc's config
        would hold: memory.max plus memory.swap.max; the swap alone under no memory limit): -1
        for none, 0 where there is no such file (no memory controller; no swap accounting)."""
        d = self.dirs["unified"]
        try:
            limit = limit_of(read(os.path.join(d, "memory.max")))
        except FileNotFoundError:
            return 0, 0
        try:
            swap = limit_of(read(os.path.join(d, "memory.swap.max")))
        except FileNotFoundError:
            return limit, 0
        return limit, swap if swap == -1 or limit == -1 else limit + swap

    def seal(self) -> None:
        """Load the device program for every rule and attach it to the container's cgroup
        (before the container's process runs: End is sent after this)."""
        attach_rules(self.dirs["unified"], self.rules)


def v2_files(r, exists) -> list[tuple[str, object, str]]:
    """(file, value, spec field) for linux.resources on v2, converted as runc converts the
    v1-shaped spec; ``exists(name)`` tells which of the I/O weight files the kernel has."""
    out: list[tuple[str, object, str]] = []
    mem = r.memory
    if mem is not None:
        where = "linux.resources.memory"
        # the swap first, as runc writes them (v2 has no order between the two to keep)
        swap = swap_v2(mem.swap or 0, mem.limit or 0)  # 0 is unset, as on v1
        if swap is not None and (swap not in ("max", 0) or exists("memory.swap.max")):  # (runc: none to lift)
            out.append(("memory.swap.max", swap, f"{where}.swap"))
        if mem.limit:
            out.append(("memory.max", "max" if mem.limit < 0 else mem.limit, f"{where}.limit"))
        if mem.reservation:
            out.append(("memory.low", "max" if mem.reservation < 0 else mem.reservation, f"{where}.reservation"))
        if mem.swappiness is not None and mem.swappiness != -1:
            raise SandboxError(f"{where}.swappiness: cgroup v2 has no swappiness (as under runc, set it "
                               "only on v1 hosts)")
        if mem.disable_oom_killer:
            raise SandboxError(f"{where}.disableOOMKiller: cgroup v2 cannot disable the OOM killer")
    cpu = r.cpu
    if cpu is not None:
        where = "linux.resources.cpu"
        if cpu.shares:  # runc's map of 2..262144 onto 1..10000
            out.append(("cpu.weight", 1 + (min(max(cpu.shares, 2), 262144) - 2) * 9999 // 262142, f"{where}.shares"))
        if cpu.quota or cpu.period:
            quota = "max" if cpu.quota is None or cpu.quota <= 0 else cpu.quota
            out.append(("cpu.max", f"{quota} {cpu.period or 100000}", f"{where}.quota"))
        if cpu.realtime_runtime or cpu.realtime_period:
            raise SandboxError(f"{where}.realtimeRuntime: cgroup v2 has no realtime scheduling limits")
        for name, value in (("cpus", cpu.cpus), ("mems", cpu.mems)):
            if value:
                out.append((f"cpuset.{name}", value, f"{where}.{name}"))
    if r.pids is not None and r.pids.limit:
        out.append(("pids.max", r.pids.limit if r.pids.limit > 0 else "max", "linux.resources.pids.limit"))
    io = r.block_io
    if io is not None:
        where = "linux.resources.blockIO"
        bfq = exists("io.bfq.weight")
        if io.weight:
            out.append(("io.bfq.weight", io.weight, f"{where}.weight") if bfq else
                       ("io.weight", _io_weight(io.weight), f"{where}.weight"))
        for dev in io.weight_device:
            if dev.weight:
                value = dev.weight if bfq else _io_weight(dev.weight)
                out.append(("io.bfq.weight" if bfq else "io.weight", f"{dev.major}:{dev.minor} {value}",
                            f"{where}.weightDevice"))
        for field, name in THROTTLE:
            key = {"read_bps": "rbps", "write_bps": "wbps", "read_iops": "riops", "write_iops": "wiops"}[name]
            for dev in getattr(io, field):
                out.append(("io.max", f"{dev.major}:{dev.minor} {key}={dev.rate or 'max'}", f"{where}.{camel(field)}"))
    for h in r.hugepage_limits:
        out.append((f"hugetlb.{h.page_size}.max", h.limit, "linux.resources.hugepageLimits"))
    if r.network is not None and (r.network.class_id is not None or r.network.priorities):
        raise SandboxError("linux.resources.network: cgroup v2 has no net_cls or net_prio controller")
    for dev, limit in r.rdma.items():
        out.append(("rdma.max", rdma(dev, limit), "linux.resources.rdma"))
    for key, value in (r.unified or {}).items():
        if "/" in key or key.startswith(".") or "." not in key or key in ("cgroup.procs", "cgroup.threads",
                                                                          "cgroup.subtree_control"):
            raise SandboxError(f"linux.resources.unified: {key!r} is not a cgroup interface file we may set")
        out.append((key, value, f"linux.resources.unified[{key!r}]"))
    return out


def swap_v2(swap: int, limit: int) -> int | str | None:
    """The spec's swap is memory+swap (v1's memsw), v2's memory.swap.max the swap alone (runc's
    conversion; 0 is unset, None nothing to write): memory -1 alone lifts the swap too, and
    under no memory limit the swap is taken as it is."""
    if (limit == -1 and not swap) or swap == -1:
        return "max"
    if not swap:
        return None
    if limit == -1:
        return swap
    if limit <= 0:
        raise SandboxError("linux.resources.memory.swap: a swap limit needs a memory limit")
    if swap < limit:
        raise SandboxError(f"linux.resources.memory.swap: {swap} is below the memory limit {limit} "
                           "(it counts memory and swap together)")
    return swap - limit


def _io_weight(w: int) -> int:
    """blkio's 10..1000 onto io.weight's 1..10000 (runc's map)."""
    return 1 + (min(max(w, 10), 1000) - 10) * 9999 // 990


def _programs(directory: str) -> list[int]:
    """The ids of the device programs attached to the v2 cgroup ``directory``."""
    from gofer import syscalls as sc

    cg = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return sc.bpf_prog_query(cg, directory)[1]
    finally:
        os.close(cg)


def attach_rules(directory: str, rules: list[Rule]) -> None:
    """Load the program for ``rules`` and attach it to the v2 cgroup ``directory`` in place
    of any there (a cgroup that existed keeps an earlier container's programs, and every one
    attached must allow a request: runc replaces them too). It stays attached as long as
    the cgroup exists; our fds go now."""
    from gofer import syscalls as sc
    from gofer.devfilter import program

    prog = sc.bpf_prog_load_device(program(rules), f"device rules of {directory}")
    try:
        cg = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _, old = sc.bpf_prog_query(cg, directory)
            sc.bpf_prog_attach(cg, prog, sc.BPF_F_ALLOW_MULTI, what=directory)
            for prog_id in old:  # ours first: at no moment is the cgroup without rules
                fd = sc.bpf_prog_get_fd(prog_id, directory)
                try:
                    sc.bpf_prog_detach(cg, fd, directory)
                finally:
                    os.close(fd)
        finally:
            os.close(cg)
    finally:
        os.close(prog)
