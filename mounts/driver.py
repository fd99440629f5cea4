"""Driver discovery under a driver root: version, GPUs, device nodes, libraries, binaries,
firmware and IPC sockets, read from files only (no NVML, nothing executed).

The same code serves a host install (``/``), a driver container (``/run/nvidia/driver``) and
the test fixtures, because every path is read relative to the driver root.
"""

from __future__ import annotations

import os
import re
import stat

import msgspec

from mounts import ldcache
from mounts.errors import DriverError, LdCacheError
from mounts.paths import Resolver, resolve_in_root

NVIDIA_MAJOR = 195
CTL_MINOR, MODESET_MINOR = 255, 254

# Newest CUDA version each driver branch supports (CUDA toolkit release notes, "minimum
# required driver"): the driver's CUDA version without calling cuDriverGetVersion.
CUDA_BY_BRANCH = (
    (418, "10.1"), (440, "10.2"), (450, "11.0"), (455, "11.1"), (460, "11.2"), (465, "11.3"),
    (470, "11.4"), (495, "11.5"), (510, "11.6"), (515, "11.7"), (520, "11.8"), (525, "12.0"),
    (530, "12.1"), (535, "12.2"), (545, "12.3"), (550, "12.4"), (555, "12.5"), (560, "12.6"),
    (565, "12.7"), (570, "12.8"), (575, "12.9"), (580, "13.0"),
)
BIN_DIRS = ("usr/bin", "usr/sbin", "bin", "sbin")
_VERSION_RE = re.compile(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)")
_LIB_VERSION_RE = re.compile(r"^lib(?:cuda|nvidia-ml)\.so\.(\d+\.\d+(?:\.\d+)?)$")


class Gpu(msgspec.Struct, frozen=True):
    index: int
    minor: int
    uuid: str
    busid: str
    model: str


class DeviceNode(msgspec.Struct, frozen=True):
    path: str  # the node's path in the container, e.g. /dev/nvidiactl
    source: str  # the host path of the node (under the driver root)
    major: int
    minor: int


class DriverLib(msgspec.Struct, frozen=True):
    key: str  # the ld.so.cache key that led here (e.g. libcuda.so.1)
    path: str  # host path of the real file (links resolved inside the driver root)
    name: str  # its file name, e.g. libcuda.so.535.261.03
    flags: int  # ld.so.cache flags: architecture of the entry


class Inventory(msgspec.Struct, frozen=True):
    root: str
    dev_root: str  # where the kernel module's dev/ and proc/ are read (often the same root)
    version: str
    gpus: list[Gpu]
    devices: dict[str, DeviceNode]  # by node name: nvidiactl, nvidia0, nvidia-uvm ...
    libraries: list[DriverLib]  # every cache entry whose file carries the driver version
    firmware: dict[str, str]  # /lib/firmware/nvidia/<ver>/gsp*.bin -> its host path

    @property
    def cuda_version(self) -> str | None:
        return cuda_version(self.version)

    def find_binary(self, name: str) -> str | None:
        for d in BIN_DIRS:
            path = resolve_in_root(self.root, os.path.join(d, name))
            if path is not None and os.path.isfile(path):
                return path
        return None

    def host(self, rel: str) -> str | None:
        return resolve_in_root(self.root, rel)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _version(root: str, dev_root: str, cache: list[ldcache.Entry], resolver: Resolver) -> str:
    text = _read(os.path.join(dev_root, "proc/driver/nvidia/version"))
    if text:
        m = _VERSION_RE.search(text)
        if m:
            return m.group(1)
    for e in cache:
        found = resolver.file(e.value)
        m = _LIB_VERSION_RE.match(found[0].rpartition("/")[2]) if found else None
        if m:
            return m.group(1)
    raise DriverError(f"{root}: no NVIDIA driver found (no proc/driver/nvidia/version, "
                      "no libcuda.so.<version> or libnvidia-ml.so.<version> in etc/ld.so.cache)")


def cuda_version(driver_version: str) -> str | None:
    major = int(driver_version.split(".")[0])
    found = None
    for branch, cuda in CUDA_BY_BRANCH:
        if major >= branch:
            found = cuda
    return found


def _gpus(root: str) -> list[Gpu]:
    base = os.path.join(root, "proc/driver/nvidia/gpus")
    try:
        busids = sorted(os.listdir(base))
    except OSError:
        return []
    gpus = []
    for index, busid in enumerate(busids):
        info_path = os.path.join(base, busid, "information")
        info = {}
        for line in (_read(info_path) or "").splitlines():
            key, sep, value = line.partition(":")
            if sep:
                info[key.strip()] = value.strip()
        try:
            minor = int(info["Device Minor"])
        except (KeyError, ValueError):
            raise DriverError(f"{info_path}: no valid 'Device Minor:' line") from None
        gpus.append(Gpu(index, minor, info.get("GPU UUID", ""), info.get("Bus Location", busid).lower(),
                        info.get("Model", "")))
    return gpus


def _majors(root: str) -> dict[str, int]:
    majors = {}
    for line in (_read(os.path.join(root, "proc/devices")) or "").splitlines():
        if line.startswith("Block"):
            break
        num, _, name = line.strip().partition(" ")
        if num.isdigit():
            majors[name.strip()] = int(num)
    return majors


def _devices(root: str, gpus: list[Gpu], majors: dict[str, int]) -> dict[str, DeviceNode]:
    """Every NVIDIA node present under ``root``/dev, each checked to be the char device it
    should be (a regular file or a wrong number under that name is an error, not a skip)."""
    wanted = {"nvidiactl": (NVIDIA_MAJOR, CTL_MINOR), "nvidia-modeset": (NVIDIA_MAJOR, MODESET_MINOR)}
    wanted.update({f"nvidia{g.minor}": (NVIDIA_MAJOR, g.minor) for g in gpus})
    if "nvidia-uvm" in majors:
        wanted["nvidia-uvm"] = (majors["nvidia-uvm"], 0)
        wanted["nvidia-uvm-tools"] = (majors["nvidia-uvm"], 1)
    caps_dir = os.path.join(root, "dev/nvidia-caps")
    if "nvidia-caps" in majors and os.path.isdir(caps_dir):
        for name in sorted(os.listdir(caps_dir)):
            m = re.fullmatch(r"nvidia-cap(\d+)", name)
            if m:
                wanted[f"nvidia-caps/{name}"] = (majors["nvidia-caps"], int(m.group(1)))
    found = {}
    for name, (major, minor) in wanted.items():
        source = os.path.join(root, "dev", name)
        try:
            st = os.lstat(source)
        except FileNotFoundError:
            continue
        if not stat.S_ISCHR(st.st_mode) or (os.major(st.st_rdev), os.minor(st.st_rdev)) != (major, minor):
            kind = "char" if stat.S_ISCHR(st.st_mode) else "not a char device"
            raise DriverError(f"{source}: expected char device {major}:{minor}, found {kind} "
                              f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")
        found[name] = DeviceNode("/dev/" + name, source, major, minor)
    return found


def _libraries(cache: list[ldcache.Entry], version: str, resolver: Resolver) -> list[DriverLib]:
    libs, seen = [], set()
    suffix = "." + version
    for e in cache:
        found = resolver.file(e.value)
        if found is None or not found[0].endswith(suffix) or (e.key, e.flags) in seen:
            continue
        path, mode = found
        if not stat.S_ISREG(mode):  # never open a FIFO or device as an ELF file
            raise DriverError(f"{path}: library {e.key} of the driver is not a regular file")
        seen.add((e.key, e.flags))
        libs.append(DriverLib(e.key, path, path.rpartition("/")[2], e.flags))
    return libs


def _firmware(root: str, version: str) -> dict[str, str]:
    target = f"/lib/firmware/nvidia/{version}"
    host = resolve_in_root(root, target)
    if host is None or not os.path.isdir(host):
        return {}
    return {f"{target}/{n}": f"{host}/{n}" for n in sorted(os.listdir(host))
            if n.startswith("gsp") and n.endswith(".bin")}


def discover(root: str = "/", dev_root: str | None = None) -> Inventory:
    """Everything the plan needs to know about the driver under ``root``. The kernel side
    (``dev/`` nodes, ``proc/devices``, ``proc/driver/nvidia``) is read under ``dev_root``,
    by default the same root; a driver container mounted at /run/nvidia/driver keeps its
    user-space files there while the nodes and /proc stay the host's (``dev_root="/"``)."""
    root = os.path.abspath(root)
    dev_root = os.path.abspath(dev_root) if dev_root else root
    for path, what in ((root, "driver root"), (dev_root, "device root")):
        if not os.path.isdir(path):
            raise DriverError(f"{path}: {what} is not a directory")
    cache_path = resolve_in_root(root, "etc/ld.so.cache")
    if cache_path is None:
        raise DriverError(f"{root}: no etc/ld.so.cache under the driver root")
    try:
        cache = ldcache.read(cache_path)
    except LdCacheError as e:
        raise DriverError(str(e)) from None
    resolver = Resolver(root)  # shared: the version fallback and the libraries resolve the same files
    version = _version(root, dev_root, cache, resolver)
    gpus = _gpus(dev_root)
    return Inventory(
        root=root,
        dev_root=dev_root,
        version=version,
        gpus=gpus,
        devices=_devices(dev_root, gpus, _majors(dev_root)),
        libraries=_libraries(cache, version, resolver),
        firmware=_firmware(root, version),
    )
