"""What both cgroup layouts share: where the hierarchies are, our own cgroups, the device
rules a container gets, the directory a cgroupsPath names, writing one file (and, for an
update, putting it back), the memory limits an update merges, and the names of
linux.resources fields both conversions use."""

from __future__ import annotations

import os

from gofer.devfilter import Rule
from mounts.errors import SandboxError

ROOT = "/sys/fs/cgroup"
# What every container may use (runc's list): mknod of anything (the rules still govern
# opening), the standard nodes, ptys, the console, tun.
DEFAULT_ALLOW = (Rule(True, "c", None, None, "m"), Rule(True, "b", None, None, "m"),
                 *(Rule(True, "c", 1, n) for n in (3, 5, 7, 8, 9)), *(Rule(True, "c", 5, n) for n in (0, 1, 2)),
                 Rule(True, "c", 136, None), Rule(True, "c", 10, 200))


def unified(root: str = ROOT) -> bool:
    """Whether ``root`` is a cgroup v2 hierarchy (the whole layout on a unified host)."""
    return os.path.exists(os.path.join(root, "cgroup.controllers"))


def own_cgroups(pid: int | str = "self", only: str | None = None) -> dict[str, str]:
    """{hierarchy: path} of ``pid``'s v1 cgroups, by the directory each hierarchy is mounted
    at under ROOT: its controller, or its name (name=systemd at systemd); ``only``: that one
    alone (the others' mounts are not looked at). The container gets a cgroup of its own in
    every one, named ones included, as under runc: the container is shown only its own
    (gofer/rootfs.py), never the caller's or a hierarchy's root."""
    out = {}
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(","):
                name = c.removeprefix("name=")
                if name and only in (None, name) and os.path.ismount(os.path.realpath(os.path.join(ROOT, name))):
                    # (realpath: cpu -> cpu,cpuacct)
                    out[name] = path
    return out


def own_unified(pid: int | str = "self") -> str:
    """``pid``'s cgroup in the v2 hierarchy (the ``0::`` line)."""
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return line[3:].rstrip("\n")
    raise SandboxError(f"/proc/{pid}/cgroup: no cgroup v2 entry")


def cgroup_dirs(pid: int | str = "self") -> list[str]:
    """The directory of each of ``pid``'s cgroups, one per hierarchy mounted under ROOT (the
    v1 ones by own_cgroups, the unified one at ROOT or ROOT/unified): where writing a pid
    into cgroup.procs moves it into (or back to) them all."""
    dirs = {os.path.realpath(os.path.join(ROOT, name)) + path for name, path in own_cgroups(pid).items()}
    top = ROOT if unified() else os.path.join(ROOT, "unified")
    if os.path.isdir(top):
        dirs.add(os.path.join(top, own_unified(pid).lstrip("/")))
    return sorted(dirs)


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


def below(root: str, mine: str, path: str) -> str:
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


def hierarchy(d: str) -> str:
    """The root of the cgroup hierarchy ``d`` is in (the mount point above it)."""
    while d != "/" and not os.path.ismount(d):
        d = os.path.dirname(d)
    return d


def read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def limit_of(text: str) -> int:
    """A memory limit file's bytes, -1 for none (v2's "max"; v1's PAGE_COUNTER_MAX pages,
    9223372036854771712 with 4 KiB pages)."""
    if text == "max":
        return -1
    n = int(text)
    return -1 if n >= 1 << 62 else n


def merge_memory(mem, limit_now: int, memsw_now: int):
    """linux.resources.memory of an update merged as runc's update merges it into the
    container's config (which it keeps; our state has none: the cgroup's limits as they stand,
    ``limit_now`` and ``memsw_now`` in v1's terms, -1 for none, 0 where there is no such
    file): memory alone keeps the memory+swap limit (on v2 the swap becomes what is left of
    it), memory+swap alone keeps the memory limit, memory -1 alone lifts both (runc's
    fix-up). Memory+swap below memory is refused here, before anything is written (on v1 the
    kernel would refuse it halfway through)."""
    limit, swap = mem.limit or 0, mem.swap or 0
    if not (limit or swap):
        return mem
    if limit == -1 and not swap:
        swap = -1
    limit, swap = limit or limit_now, swap or memsw_now
    if 0 < swap < limit:
        if mem.swap:
            raise SandboxError(f"linux.resources.memory.swap: {swap} is below the memory limit {limit} (it counts "
                               "memory and swap together)")
        raise SandboxError(f"linux.resources.memory.limit: {limit} is above the container's memory+swap limit "
                           f"{swap}: give a new memory+swap limit too (memory.swap, --memory-swap)")
    import msgspec

    return msgspec.structs.replace(mem, limit=limit or None, swap=swap or None)


# The files keyed by a device (an interface, an RDMA device): a write sets one key's entry,
# put back from the line the file had for that key, or with what means none for it.
_UNSET = {**{f"blkio.{name}": "0" for name in ("weight_device", "leaf_weight_device", "throttle.read_bps_device",
                                               "throttle.write_bps_device", "throttle.read_iops_device",
                                               "throttle.write_iops_device")},
          "net_prio.ifpriomap": "0", "io.max": "rbps=max wbps=max riops=max wiops=max", "io.weight": "default",
          "io.bfq.weight": "default", "rdma.max": "hca_handle=max hca_object=max"}


def previous(d: str, name: str, value: str) -> str | None:
    """What puts ``d/name`` back as it is before ``value`` is written to it; None where the
    file cannot be read (the write will say why) or not as one value."""
    try:
        text = read(os.path.join(d, name))
    except OSError:
        return None
    if name in _UNSET:
        key = value.split(" ", 1)[0] if " " in value else "default"  # io.weight's plain N: "default N"
        line = next((line for line in text.splitlines() if line.split(" ", 1)[0] == key), None)
        return line or (f"{key} {_UNSET[name]}" if key != "default" else None)
    if name == "memory.oom_control":  # "oom_kill_disable N\nunder_oom N ..."
        return text.split()[1]
    if "\n" in text:
        return None
    return text or "\n"  # (an empty write is no write: v2's cpuset.cpus, empty, is "\n")


class Journal:
    """The files an update wrote, each with what it held before: should a later write fail,
    they are put back, last first, so that a failed update changes nothing (the kernel's write
    of one file is all or nothing)."""

    def __init__(self) -> None:
        self.done: list[tuple[str, str, str | None]] = []

    def write(self, d: str, name: str, value: str, what: str = "") -> None:
        before = previous(d, name, value)
        write_file(d, name, value, what)
        self.done.append((d, name, before))

    def undo(self) -> list[str]:
        """Put every file written back, last first; returns those that could not be."""
        failed = []
        for d, name, before in reversed(self.done):
            try:
                if before is None:
                    raise SandboxError("not readable as one value")
                write_file(d, name, before)
            except SandboxError:
                failed.append(os.path.join(d, name))
        self.done.clear()
        return failed


THROTTLE = (("throttle_read_bps_device", "read_bps"), ("throttle_write_bps_device", "write_bps"),
            ("throttle_read_iops_device", "read_iops"), ("throttle_write_iops_device", "write_iops"))


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


def rdma(dev: str, limit) -> str:
    parts = [dev]
    if limit.hca_handles is not None:
        parts.append(f"hca_handle={limit.hca_handles}")
    if limit.hca_objects is not None:
        parts.append(f"hca_object={limit.hca_objects}")
    return " ".join(parts)
