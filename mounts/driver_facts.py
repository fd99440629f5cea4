"""What driver discovery finds (mounts/driver.py): the inventory and its parts, as Structs;
and how discovery reads a file under the driver root or the device root (never a FIFO, a
device or a link out of the root; every read noted for the kept inventory, mounts/reads.py)."""

from __future__ import annotations

import os
import stat

import msgspec

from mounts import reads
from mounts.errors import DriverError
from mounts.paths import LinkLoop, Resolver, file_kind, opened_at, resolve_in_root


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
    soname: str | None = None  # its ELF DT_SONAME
    needed: tuple[str, ...] = ()  # its ELF DT_NEEDED entries
    broken: str | None = None  # why its ELF headers cannot be read: an error for a container that needs it


class Mig(msgspec.Struct, frozen=True):
    """A MIG device: compute instance ``ci`` of GPU instance ``gi`` on the GPU of minor
    ``minor``, with the nvidia-caps minors that grant access to each instance."""

    minor: int
    gi: int
    ci: int
    gi_cap: int
    ci_cap: int

    @property
    def proc_files(self) -> tuple[str, str]:
        """Its access files, relative to /proc/driver/nvidia."""
        gi = f"capabilities/gpu{self.minor}/mig/gi{self.gi}"
        return f"{gi}/access", f"{gi}/ci{self.ci}/access"


class Inventory(msgspec.Struct, frozen=True):
    root: str
    dev_root: str  # where the kernel module's dev/ and proc/ are read (often the same root)
    version: str
    gpus: list[Gpu]
    devices: dict[str, DeviceNode]  # by node name: nvidiactl, nvidia0, nvidia-uvm ...
    libraries: list[DriverLib]  # every cache entry whose file carries the driver version
    firmware: dict[str, str]  # /lib/firmware/nvidia/<ver>/gsp*.bin -> its host path
    dri: dict[str, tuple[str, ...]] = {}  # GPU bus id -> its DRI nodes in devices (dri/card1 ...)
    migs: list[Mig] = []
    mig_caps: dict[str, int] = {}  # "config", "monitor" -> their nvidia-caps minors
    binaries: dict[str, str] = {}  # catalog.BINARIES' names -> host path of the driver's ELF executable
    refused: dict[str, str] = {}  # a binary found only as files that are not the driver's (a wrapper ...): why
    configs: dict[str, str] = {}  # the loaders' files: container path -> host path (regular files)
    loader_texts: dict[str, str] = {}  # container path -> text of those that are .json or .icd
    xorg: dict[str, str] = {}  # Xorg's modules: where Xorg looks -> host path (regular files)
    ipc: dict[str, str] = {}  # catalog.IPC's sockets and directories present: container path -> host path
    procfs: str | None = None  # the host's proc/driver/nvidia directory under the device root
    libraries_from: str = "etc/ld.so.cache"  # or the directories searched, when the cache lists no driver
    notes: tuple[str, ...] = ()  # candidates passed over (wrappers, links leading nowhere ...): --debug says them

    @property
    def cuda_version(self) -> str | None:
        return cuda_version(self.version)


MAX_TEXT = 1 << 20  # a /proc file of the driver is a few hundred bytes
MAX_CACHE = 64 << 20  # a host's ld.so.cache is well under a MiB
POINT_AT_DRIVER = "point --driver-root (or driver-root in /etc/gpu-sandbox/config.toml) at the driver's files"


def read_file(root: str, rel: str, limit: int = MAX_TEXT, resolver: Resolver | None = None) -> tuple[str, bytes] | None:
    """(host path, content) of ``rel`` inside ``root`` (links resolved as if ``root`` were
    "/"; through ``resolver``'s directories when given), or None when it does not exist.
    Anything but a regular file of at most ``limit`` bytes is a DriverError naming the
    path: a FIFO would block, a device such as /dev/zero never end. Opened non-blocking,
    without following a last link, no controlling tty."""
    path = resolve_in_root(root, rel) if resolver is None else in_root(resolver, rel)
    if path is None:
        if reads.lexists(os.path.join(root, rel)):  # a link out of the root, or one that loops
            raise DriverError(f"{os.path.join(root, rel)}: a symlink that leads to no file inside the driver root")
        return None
    data = read_resolved(path, limit)
    return None if data is None else (path, data)


def read_resolved(path: str, limit: int = MAX_TEXT) -> bytes | None:
    """read_file's reading, of a path already resolved inside the root."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        reads.lexists(path)  # (noted: absent)
        return None
    except OSError as e:
        raise DriverError(f"{path}: cannot read: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        mode = st.st_mode
        if not stat.S_ISREG(mode):
            raise DriverError(f"{path}: expected a regular file, found {file_kind(mode)}")
        if not opened_at(fd, path):
            raise DriverError(f"{path}: changed while being opened (a directory on the way became a link)")
        data = _read_all(fd, limit + 1)
        reads.opened(path, fd, data, st)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise DriverError(f"{path}: larger than {limit} bytes: not a driver file")
    return data


def _read_all(fd: int, n: int) -> bytes:
    chunks, size = [], 0
    while size < n:
        chunk = os.read(fd, min(n - size, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def in_root(resolver: Resolver, rel: str) -> str | None:
    """resolve_in_root(resolver.root, rel), each directory on the way resolved once."""
    try:
        found = resolver.file("/" + rel.strip("/"))
    except LinkLoop:
        return None
    return found[0] if found else None


def read_text(kernel: Resolver, rel: str) -> str | None:
    found = read_file(kernel.root, rel, resolver=kernel)
    return found[1].decode("utf-8", "replace") if found else None


# Newest CUDA version each driver branch supports (CUDA toolkit release notes, "minimum
# required driver"): the driver's CUDA version without calling cuDriverGetVersion.
CUDA_BY_BRANCH = (
    (418, "10.1"), (440, "10.2"), (450, "11.0"), (455, "11.1"), (460, "11.2"), (465, "11.3"),
    (470, "11.4"), (495, "11.5"), (510, "11.6"), (515, "11.7"), (520, "11.8"), (525, "12.0"),
    (530, "12.1"), (535, "12.2"), (545, "12.3"), (550, "12.4"), (555, "12.5"), (560, "12.6"),
    (565, "12.7"), (570, "12.8"), (575, "12.9"), (580, "13.0"),
)


def cuda_version(driver_version: str) -> str | None:
    major = int(driver_version.split(".")[0])
    found = None
    for branch, cuda in CUDA_BY_BRANCH:
        if major >= branch:
            found = cuda
    return found


def plain_file(resolver: Resolver, path: str) -> str | None:
    """The host path of ``path`` inside the root when it is a regular file."""
    try:
        found = resolver.file(path)
    except LinkLoop:
        return None
    return found[0] if found is not None and stat.S_ISREG(found[1]) else None


def lstat_or_none(path: str) -> os.stat_result | None:
    try:
        return reads.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
