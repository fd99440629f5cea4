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
"""

from __future__ import annotations

import errno
import os

from gofer.devfilter import Rule
from mounts.errors import MountError, SandboxError

ROOT = "/sys/fs/cgroup"
# What every container may use (runc's list): mknod of anything (the rules still govern
# opening), the standard nodes, ptys, the console, tun.
DEFAULT_ALLOW = (Rule(True, "c", None, None, "m"), Rule(True, "b", None, None, "m"),
                 *(Rule(True, "c", 1, n) for n in (3, 5, 7, 8, 9)), *(Rule(True, "c", 5, n) for n in (0, 1, 2)),
                 Rule(True, "c", 136, None), Rule(True, "c", 10, 200))


def unified(root: str = ROOT) -> bool:
    """Whether ``root`` is a cgroup v2 hierarchy (the whole layout on a unified host)."""
    return os.path.exists(os.path.join(root, "cgroup.controllers"))


def own_cgroups(pid: int | str = "self") -> dict[str, str]:
    """{hierarchy: path} of ``pid``'s v1 cgroups, by the directory each hierarchy is mounted
    at under ROOT: its controller, or its name (name=systemd at systemd). The container gets
    a cgroup of its own in every one, named ones included, as under runc: the container is
    shown only its own (gofer/rootfs.py), never the caller's or a hierarchy's root."""
    out = {}
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(","):
                name = c.removeprefix("name=")
                if name and os.path.ismount(os.path.realpath(os.path.join(ROOT, name))):  # cpu -> cpu,cpuacct
                    out[name] = path
    return out


def own_unified(pid: int | str = "self") -> str:
    """``pid``'s cgroup in the v2 hierarchy (the ``0::`` line)."""
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return line[3:].rstrip("\n")
    raise SandboxError(f"/proc/{pid}/cgroup: no cgroup v2 entry")


def device_rules(resources, devices) -> list[Rule]:
    """The container's rules in order: deny all, linux.resources.devices, runc's defaults,
    the linux.devices nodes (the plan's GPU nodes come after, through allow())."""
    rules = [Rule(False)]
    for r in (resources.devices if resources is not None else []):
        if (r.type or "a") == "a":  # every device, whatever numbers or letters follow (v1's and runc's reading)
            rules.append(Rule(r.allow))
            continue
        major = None if r.major is None or r.major < 0 else r.major
        minor = None if r.minor is None or r.minor < 0 else r.minor
        rules.append(Rule(r.allow, r.type, major, minor, r.access or "rwm"))
    rules += DEFAULT_ALLOW
    for d in devices:
        kind = {"u": "c", "p": None}.get(d.type, d.type)
        if kind in ("c", "b"):
            rules.append(Rule(True, kind, d.major or 0, d.minor or 0))
    return rules


def _below(root: str, mine: str, path: str) -> str:
    """The cgroup directory for cgroupsPath ``path`` under hierarchy ``root``: absolute, or
    relative to ``mine``; never above the root."""
    rel = os.path.normpath("/" + (path if path.startswith("/") else os.path.join(mine, path))).lstrip("/")
    if not rel:  # (normpath of "/..." never climbs above "/")
        raise SandboxError(f"linux.cgroupsPath {path!r}: not a cgroup below the root")
    return os.path.join(root, rel)


def write_file(d: str, name: str, value: str, what: str = "") -> None:
    """One value into the cgroup file ``d/name``; errors name the file (and the spec field)."""
    path = os.path.join(d, name)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise SandboxError(f"{what or 'linux.resources'}: {path}: no such file (is the "
                           f"{name.split('.')[0]} controller available here?)", op="cgroup", path=path) from None
    except OSError as e:
        raise SandboxError(f"{path}: {e.strerror}", op="cgroup", path=path) from None
    try:
        os.write(fd, value.encode())
    except OSError as e:
        raise SandboxError(f"{what + ': ' if what else ''}{path}: cannot write {value!r}: {e.strerror}",
                           op="cgroup", path=path) from None
    finally:
        os.close(fd)


class _Cgroup:
    """What both layouts share: the directories (one per hierarchy), making them (and
    remembering which we made, so only those are removed), writing their files, joining."""

    dirs: dict[str, str]

    def __init__(self) -> None:
        self.created: list[str] = []

    def missing(self) -> list[str]:
        """The directories create() will make (those not there yet), parents first."""
        out: list[str] = []
        for d in dict.fromkeys(self.dirs.values()):
            chain = []
            while not os.path.isdir(d):
                chain.append(d)
                d = os.path.dirname(d)
            out += reversed(chain)
        return out

    def members(self) -> list[int]:
        """The processes already in the directories that exist (a cgroupsPath naming a
        cgroup someone else made)."""
        pids: set[int] = set()
        for d in dict.fromkeys(self.dirs.values()):
            try:
                with open(os.path.join(d, "cgroup.procs")) as f:
                    pids.update(int(p) for p in f.read().split())
            except OSError:
                pass
        return sorted(pids)

    def _mkdirs(self, d: str) -> list[str]:
        made = []
        for m in [m for m in self.missing() if m == d or d.startswith(m + "/")]:
            try:
                os.mkdir(m)
            except FileExistsError:
                continue
            except OSError as e:
                raise SandboxError(f"{m}: cannot create the cgroup: {e.strerror}") from None
            self.created.append(m)
            made.append(m)
        return made

    def _write(self, d: str, name: str, value: str, what: str = "") -> None:
        write_file(d, name, value, what)

    def add(self, pid: int) -> None:
        for d in dict.fromkeys(self.dirs.values()):
            self._write(d, "cgroup.procs", str(pid))

    def seal(self) -> None:
        """Called once every allow() is in: the rules take effect (v2: the program)."""

    def remove(self) -> None:
        remove_dirs(self.created)


class Cgroup(_Cgroup):
    """cgroup v1: the container's cgroup in every controller's hierarchy; ``path`` absolute
    (under each controller's root) or relative to our own cgroup there (runc's rule)."""

    def __init__(self, path: str, dirs: dict[str, str] | None = None):
        super().__init__()
        # by the hierarchy's real directory: cpu and cpuacct -> cpu,cpuacct name the same cgroup;
        # or ``dirs`` someone else made (systemd)
        self.dirs = dirs if dirs is not None else {
            ctrl: _below(os.path.realpath(os.path.join(ROOT, ctrl)), mine, path) for ctrl, mine in own_cgroups().items()}

    def create(self) -> None:
        for ctrl, d in self.dirs.items():
            for m in self._mkdirs(d):
                if ctrl == "cpuset":  # an empty cpuset takes no task: start from the parent's
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        self._write(m, f, _read(os.path.join(os.path.dirname(m), f)))

    def set(self, ctrl: str, name: str, value, what: str = "") -> None:
        if ctrl not in self.dirs:
            raise SandboxError(f"{what or 'linux.resources'}: the {ctrl} cgroup controller is not mounted "
                               f"under {ROOT}")
        self._write(self.dirs[ctrl], name, str(value), what)

    def apply(self, resources, devices) -> None:
        """linux.resources, then the device rules."""
        if resources is not None:
            for ctrl, name, value, what in v1_files(resources):
                if ctrl == "blkio" and name in ("blkio.weight", "blkio.leaf_weight") and "blkio" in self.dirs \
                        and not os.path.exists(os.path.join(self.dirs["blkio"], name)):
                    name = "blkio.bfq.weight"  # the BFQ scheduler's name for it (runc's fallback)
                self.set(ctrl, name, value, what)
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


def v1_files(r) -> list[tuple[str, str, object, str]]:
    """(controller, file, value, spec field) for linux.resources on v1, in runc's order."""
    out = []
    mem = r.memory
    if mem is not None:
        for name, value, field in (("memory.limit_in_bytes", mem.limit, "limit"),
                                   ("memory.soft_limit_in_bytes", mem.reservation, "reservation"),
                                   ("memory.memsw.limit_in_bytes", mem.swap, "swap")):
            if value:  # 0 is unset (runc's rule: engines send zeros for what nobody asked)
                out.append(("memory", name, value, f"linux.resources.memory.{field}"))
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
                            f"{where}.{_camel(field)}"))
    for h in r.hugepage_limits:
        out.append(("hugetlb", f"hugetlb.{h.page_size}.limit_in_bytes", h.limit, "linux.resources.hugepageLimits"))
    if r.network is not None:
        if r.network.class_id is not None:
            out.append(("net_cls", "net_cls.classid", r.network.class_id, "linux.resources.network.classID"))
        for p in r.network.priorities:
            out.append(("net_prio", "net_prio.ifpriomap", f"{p.name} {p.priority}", "linux.resources.network.priorities"))
    for dev, limit in r.rdma.items():
        out.append(("rdma", "rdma.max", _rdma(dev, limit), "linux.resources.rdma"))
    if r.unified:
        raise SandboxError("linux.resources.unified: needs cgroup v2 (this host has v1 controllers)")
    return out


THROTTLE = (("throttle_read_bps_device", "read_bps"), ("throttle_write_bps_device", "write_bps"),
            ("throttle_read_iops_device", "read_iops"), ("throttle_write_iops_device", "write_iops"))


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


def _rdma(dev: str, limit) -> str:
    parts = [dev]
    if limit.hca_handles is not None:
        parts.append(f"hca_handle={limit.hca_handles}")
    if limit.hca_objects is not None:
        parts.append(f"hca_object={limit.hca_objects}")
    return " ".join(parts)


class Cgroup2(_Cgroup):
    """cgroup v2: one directory in the unified hierarchy at ``root``; ``path`` absolute, or
    relative to our own cgroup's parent (ours holds processes, and v2 lets only a cgroup
    without any give controllers to its children: runc's rule)."""

    def __init__(self, path: str, root: str = ROOT, dirs: dict[str, str] | None = None):
        super().__init__()
        self.root = root
        self.dirs = dirs if dirs is not None else {"unified": _below(root, os.path.dirname(own_unified()), path)}
        self.rules: list[Rule] = []

    def create(self) -> None:
        d = self.dirs["unified"]
        self._mkdirs(d)
        # every controller the root has, down to the container's cgroup (runc enables them
        # all, so the container sees its memory.max, pids.max ... whatever the spec set)
        level = self.root
        for part in os.path.relpath(d, self.root).split("/"):
            want = set(_read(os.path.join(level, "cgroup.controllers")).split())
            have = set(_read(os.path.join(level, "cgroup.subtree_control")).split())
            for c in sorted(want - have):
                try:
                    self._write(level, "cgroup.subtree_control", "+" + c)
                except SandboxError:
                    pass  # not enabled: a limit that needs it is an error when it is written
            level = os.path.join(level, part)

    def apply(self, resources, devices) -> None:
        d = self.dirs["unified"]
        if resources is not None:
            for name, value, what in v2_files(resources, lambda f: os.path.exists(os.path.join(d, f))):
                self._write(d, name, str(value), what)
        self.rules = device_rules(resources, devices)

    def allow(self, major: int, minor: int) -> None:
        self.rules.append(Rule(True, "c", major, minor, "rw"))

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
        if mem.limit:  # 0 is unset, as on v1
            out.append(("memory.max", "max" if mem.limit < 0 else mem.limit, f"{where}.limit"))
        if mem.reservation:
            out.append(("memory.low", "max" if mem.reservation < 0 else mem.reservation, f"{where}.reservation"))
        if mem.swap:
            out.append(("memory.swap.max", _swap_v2(mem.swap, mem.limit), f"{where}.swap"))
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
                out.append(("io.max", f"{dev.major}:{dev.minor} {key}={dev.rate or 'max'}", f"{where}.{_camel(field)}"))
    for h in r.hugepage_limits:
        out.append((f"hugetlb.{h.page_size}.max", h.limit, "linux.resources.hugepageLimits"))
    if r.network is not None and (r.network.class_id is not None or r.network.priorities):
        raise SandboxError("linux.resources.network: cgroup v2 has no net_cls or net_prio controller")
    for dev, limit in r.rdma.items():
        out.append(("rdma.max", _rdma(dev, limit), "linux.resources.rdma"))
    for key, value in (r.unified or {}).items():
        if "/" in key or key.startswith(".") or "." not in key or key in ("cgroup.procs", "cgroup.threads",
                                                                          "cgroup.subtree_control"):
            raise SandboxError(f"linux.resources.unified: {key!r} is not a cgroup interface file we may set")
        out.append((key, value, f"linux.resources.unified[{key!r}]"))
    return out


def _swap_v2(swap: int, limit: int | None) -> int | str:
    """The spec's swap is memory+swap (v1's memsw); v2's memory.swap.max is the swap alone."""
    if swap < 0:
        return "max"
    if limit is None or limit <= 0:
        raise SandboxError("linux.resources.memory.swap: a swap limit needs a memory limit")
    if swap < limit:
        raise SandboxError(f"linux.resources.memory.swap: {swap} is below the memory limit {limit} "
                           "(it counts memory and swap together)")
    return swap - limit


def _io_weight(w: int) -> int:
    """blkio's 10..1000 onto io.weight's 1..10000 (runc's map)."""
    return 1 + (min(max(w, 10), 1000) - 10) * 9999 // 990


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


def container_cgroup(path: str) -> Cgroup | Cgroup2 | None:
    """The container's cgroup on this host's layout; None where there is none to make."""
    if unified():
        return Cgroup2(path)
    cgroup = Cgroup(path)
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


def hierarchy(d: str) -> str:
    """The root of the cgroup hierarchy ``d`` is in (the mount point above it)."""
    while d != "/" and not os.path.ismount(d):
        d = os.path.dirname(d)
    return d


def devices_enforced(dirs) -> bool:
    """Whether the cgroup directories ``dirs`` carry device rules: one in a v1 devices
    hierarchy, or any on v2 (where every container's cgroup gets its program)."""
    return any(os.path.basename(h) == "devices" or unified(h) for h in map(hierarchy, dirs))


def remove_dirs(dirs: list[str], patience: float = 2.0) -> None:
    """rmdir the cgroups we created, deepest first. A cgroup is busy until its last process
    is reaped (a zombie still counts): retried for ``patience`` seconds, then left."""
    _rmdir_all([(None, d) for d in sorted(dirs, key=len, reverse=True)], patience)


def _rmdir_all(entries: list[tuple[int, str]] | list[tuple[None, str]], patience: float) -> None:
    import time

    deadline = time.monotonic() + patience
    for dir_fd, path in entries:
        while True:
            try:
                os.rmdir(path, dir_fd=dir_fd)
            except OSError as e:
                if e.errno == errno.EBUSY and time.monotonic() < deadline:
                    time.sleep(0.005)
                    continue
                if e.errno not in (errno.ENOENT, errno.EBUSY):
                    raise
            break


class Pinned:
    """The cgroups we created, held by fds opened now, for a process whose view of the host
    is about to go (the gofer: pid 1's pivot_root in the mount namespace they share detaches
    the host's cgroup mounts from it). remove() leaves them and removes them."""

    def __init__(self, dirs: list[str]):
        self.entries = [(os.open(os.path.dirname(d), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC),
                         os.path.basename(d)) for d in sorted(dirs, key=len, reverse=True)]
        self.roots = [os.open(os.path.join(h, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
                      for h in {hierarchy(d) for d in dirs}]

    def close(self) -> None:
        """In the forked init, which must not keep them."""
        for fd in self.roots + [fd for fd, _name in self.entries]:
            os.close(fd)

    def remove(self) -> None:
        for fd in self.roots:  # out of them first: we are in them too
            try:
                os.write(fd, str(os.getpid()).encode())
            except OSError:
                pass
        _rmdir_all(self.entries, 2.0)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def allow_devices(pid: int, nodes: list[tuple[int, int]]):
    """Allow read/write/mknod of each (major, minor) char device for ``pid``'s cgroup, which
    another runtime made: in its v1 devices controller, or on v2 by putting our rules in
    front of each device program attached to it (a program of ours alone could not widen
    what theirs allows: every program attached must allow a request). Returns what undoes
    it (for a hook that fails afterwards), or None where nothing was changed."""
    if not nodes:
        return None
    rules = [Rule(True, "c", major, minor) for major, minor in nodes]
    if unified():
        return _allow_v2(os.path.join(ROOT, own_unified(pid).lstrip("/")), rules)
    path = own_cgroups(pid).get("devices")
    if path is None:
        return None
    directory = os.path.join(ROOT, "devices", path.lstrip("/"))

    def opened(name: str) -> int:
        target = os.path.join(directory, name)
        try:
            return os.open(target, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as e:
            raise MountError(target, f"cannot open to allow GPU devices: {e.strerror}") from None

    def write(fd: int, lines: list[str]) -> None:
        try:
            for line in lines:
                os.write(fd, line.encode())
        except OSError as e:
            raise MountError(directory, f"cannot change the GPU devices' rules: {e.strerror}") from None
        finally:
            os.close(fd)

    with open(os.path.join(directory, "devices.list")) as f:
        had = [line.split() for line in f.read().splitlines()]
    # only what no rule there allows already ("a *:* rwm" of a privileged container, "c 195:*
    # rwm"): the undo denies what we added, and must not take away what the container had
    added = [r.line() for r in rules if not any(
        t in ("a", "c") and num in ("*:*", f"*:{r.minor}", f"{r.major}:*", f"{r.major}:{r.minor}")
        and set("rwm") <= set(access) for t, num, access in (h for h in had if len(h) == 3))]
    if not added:
        return None
    deny = opened("devices.deny")  # now: past joining the container's mount namespace, no path leads here
    try:
        write(opened("devices.allow"), added)
    except BaseException:
        os.close(deny)
        raise
    return lambda: write(deny, added)


def _allow_v2(directory: str, rules: list[Rule]):
    """Replace each device program attached to ``directory`` by ours-then-theirs; returns
    what puts theirs back."""
    from gofer import syscalls as sc
    from gofer.devfilter import allow_first

    try:
        cg = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise MountError(directory, f"cannot open the container's cgroup: {e.strerror}") from None
    swapped: list[tuple[int, int]] = []  # (their program, ours), both held until undone
    try:
        flags, ids = sc.bpf_prog_query(cg, directory)
        for prog_id in ids:
            old, insns = sc.bpf_prog_instructions(prog_id, directory)
            try:
                new = sc.bpf_prog_load_device(allow_first(rules, insns), f"GPU device rules of {directory}")
            except BaseException:
                os.close(old)
                raise
            _swap(cg, flags, new, old, directory)
            swapped.append((old, new))
    except OSError as e:
        _put_back(cg, flags, swapped, directory)
        os.close(cg)
        raise MountError(directory, f"cannot allow GPU devices: {e}") from None
    if not swapped:
        os.close(cg)
        return None

    def undo() -> None:
        _put_back(cg, flags, swapped, directory)
        os.close(cg)
    return undo


def _swap(cg: int, flags: int, new: int, old: int, directory: str) -> None:
    from gofer import syscalls as sc

    if flags & sc.BPF_F_ALLOW_MULTI:
        sc.bpf_prog_attach(cg, new, sc.BPF_F_ALLOW_MULTI | sc.BPF_F_REPLACE, old, directory)
    else:  # a single program: attaching another replaces it
        sc.bpf_prog_attach(cg, new, flags, what=directory)


def _put_back(cg: int, flags: int, swapped: list[tuple[int, int]], directory: str) -> None:
    for old, new in reversed(swapped):
        try:
            _swap(cg, flags, old, new, directory)
        except OSError:
            pass  # the cgroup went with its container
        finally:
            os.close(old)
            os.close(new)
    swapped.clear()
