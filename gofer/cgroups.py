"""cgroups v1 (the hierarchy per controller under /sys/fs/cgroup, as this kind of host
mounts it): the container's cgroup with its memory, pids and cpu limits and its device rules,
and the GPU nodes allowed in them; and, for a container another runtime created (the hook),
only the GPU nodes added to its devices controller.

The devices controller is what keeps a container that holds CAP_MKNOD (Docker grants it) from
making and opening the host's disks: every container gets one, deny-all first, then the
spec's rules, runc's default nodes and the GPU nodes of the plan.
"""

from __future__ import annotations

import errno
import os

from mounts.errors import MountError, SandboxError

ROOT = "/sys/fs/cgroup"
V1_ROOT = ROOT + "/devices"
# What every container may use (runc's list): mknod of anything (the rules still govern
# opening), the standard nodes, ptys, the console, tun.
DEFAULT_ALLOW = ("c *:* m", "b *:* m", "c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm",
                 "c 5:0 rwm", "c 5:1 rwm", "c 5:2 rwm", "c 136:* rwm", "c 10:200 rwm")


def own_cgroups(pid: int | str = "self") -> dict[str, str]:
    """{controller: path} of ``pid``'s v1 cgroups (named hierarchies and v2 left out)."""
    out = {}
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(","):
                if c and not c.startswith("name=") and os.path.isdir(os.path.join(ROOT, c)):
                    out[c] = path
    return out


class Cgroup:
    """The container's cgroup in every v1 controller: ``path`` absolute (under each
    controller's root) or relative to our own cgroup there (runc's rule)."""

    def __init__(self, path: str):
        self.dirs: dict[str, str] = {}
        for ctrl, mine in own_cgroups().items():
            rel = path if path.startswith("/") else os.path.join(mine, path)
            rel = os.path.normpath("/" + rel).lstrip("/")
            if not rel or rel.startswith(".."):
                raise SandboxError(f"linux.cgroupsPath {path!r}: not a cgroup below the root")
            self.dirs[ctrl] = os.path.join(ROOT, ctrl, rel)
        self.created: list[str] = []

    def missing(self) -> list[str]:
        """The directories create() will make (those not there yet), parents first."""
        out = []
        for d in self.dirs.values():
            chain = []
            while not os.path.isdir(d):
                chain.append(d)
                d = os.path.dirname(d)
            out += reversed(chain)
        return out

    def create(self) -> None:
        for ctrl, d in self.dirs.items():
            missing = []
            p = d
            while not os.path.isdir(p):
                missing.append(p)
                p = os.path.dirname(p)
            for m in reversed(missing):
                try:
                    os.mkdir(m)
                except FileExistsError:
                    continue
                except OSError as e:
                    raise SandboxError(f"{m}: cannot create the cgroup: {e.strerror}") from None
                self.created.append(m)
                if ctrl == "cpuset":  # an empty cpuset takes no task: start from the parent's
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        self._write(m, f, _read(os.path.join(os.path.dirname(m), f)))

    def _write(self, d: str, name: str, value: str) -> None:
        path = os.path.join(d, name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as e:
            raise SandboxError(f"{path}: {e.strerror}", op="cgroup", path=path) from None
        try:
            os.write(fd, value.encode())
        except OSError as e:
            raise SandboxError(f"{path}: cannot write {value!r}: {e.strerror}", op="cgroup", path=path) from None
        finally:
            os.close(fd)

    def set(self, ctrl: str, name: str, value) -> None:
        if ctrl not in self.dirs:
            raise SandboxError(f"linux.resources: the {ctrl} cgroup controller is not mounted under {ROOT}")
        self._write(self.dirs[ctrl], name, str(value))

    def apply(self, resources, devices) -> None:
        """linux.resources, then the device rules: deny all, the spec's, runc's defaults and
        the spec's linux.devices nodes."""
        if resources is not None:
            mem = resources.memory
            if mem is not None:
                if mem.limit is not None:
                    self.set("memory", "memory.limit_in_bytes", mem.limit)
                if mem.reservation is not None:
                    self.set("memory", "memory.soft_limit_in_bytes", mem.reservation)
                if mem.swap is not None:
                    self.set("memory", "memory.memsw.limit_in_bytes", mem.swap)
                if mem.swappiness is not None:
                    self.set("memory", "memory.swappiness", mem.swappiness)
                if mem.disable_oom_killer:
                    self.set("memory", "memory.oom_control", 1)
            cpu = resources.cpu
            if cpu is not None:
                for name, value in (("cpu.shares", cpu.shares), ("cpu.cfs_period_us", cpu.period),
                                    ("cpu.cfs_quota_us", cpu.quota), ("cpu.rt_period_us", cpu.realtime_period),
                                    ("cpu.rt_runtime_us", cpu.realtime_runtime)):
                    if value is not None:
                        self.set("cpu", name, value)
                if cpu.cpus:
                    self.set("cpuset", "cpuset.cpus", cpu.cpus)
                if cpu.mems:
                    self.set("cpuset", "cpuset.mems", cpu.mems)
            if resources.pids is not None:
                self.set("pids", "pids.max", resources.pids.limit if resources.pids.limit > 0 else "max")
        if "devices" not in self.dirs:
            return
        self.set("devices", "devices.deny", "a")
        for rule in (resources.devices if resources is not None else []):
            line = f"{rule.type or 'a'} {_num(rule.major)}:{_num(rule.minor)} {rule.access or 'rwm'}"
            if line.startswith("a ") and rule.allow:  # allow everything: the rules end here
                self.set("devices", "devices.allow", "a")
                continue
            self.set("devices", "devices.allow" if rule.allow else "devices.deny", line)
        for line in DEFAULT_ALLOW:
            self.set("devices", "devices.allow", line)
        for d in devices:
            kind = {"u": "c", "p": None}.get(d.type, d.type)
            if kind in ("c", "b"):
                self.set("devices", "devices.allow", f"{kind} {d.major or 0}:{d.minor or 0} rwm")

    def allow(self, major: int, minor: int) -> None:
        """A GPU node of the plan: read and write (it is bound in, never mknod'ed)."""
        if "devices" in self.dirs:
            self.set("devices", "devices.allow", f"c {major}:{minor} rw")

    def add(self, pid: int) -> None:
        for d in self.dirs.values():
            self._write(d, "cgroup.procs", str(pid))

    def remove(self) -> None:
        remove_dirs(self.created)


def devices_enforced(dirs) -> bool:
    """Whether the cgroup directories ``dirs`` include one of the devices controller."""
    return any(os.path.relpath(d, ROOT).split("/")[0] == "devices" for d in dirs)


def remove_dirs(dirs: list[str], patience: float = 2.0) -> None:
    """rmdir the cgroups we created, deepest first. A cgroup is busy until its last process
    is reaped (a zombie still counts): retried for ``patience`` seconds, then left."""
    _rmdir_all([(None, d) for d in sorted(dirs, key=len, reverse=True)], patience)


def _rmdir_all(entries: list[tuple[int | None, str]], patience: float) -> None:
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
        ctrls = {os.path.relpath(d, ROOT).split("/")[0] for d in dirs}
        self.roots = [os.open(os.path.join(ROOT, c, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC) for c in ctrls]

    def remove(self) -> None:
        for fd in self.roots:  # out of them first: we are in them too
            try:
                os.write(fd, str(os.getpid()).encode())
            except OSError:
                pass
        _rmdir_all(self.entries, 2.0)


def _num(n: int | None) -> str:
    return "*" if n is None or n < 0 else str(n)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def devices_cgroup(pid: int) -> str | None:
    """The v1 devices cgroup directory of ``pid``, or None where no v1 devices hierarchy is
    mounted at /sys/fs/cgroup/devices (a cgroup v2 view)."""
    if not os.path.isdir(V1_ROOT):
        return None
    path = own_cgroups(pid).get("devices")
    return None if path is None else os.path.join(V1_ROOT, path.lstrip("/"))
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
