"""Driver discovery under a driver root: version, GPUs, device nodes, libraries (with their
ELF SONAME and DT_NEEDED), binaries, firmware, the loaders' files, Xorg's modules and IPC
sockets, read from files only (no NVML, nothing executed). Every fact the plan uses is
collected here: the plan itself reads nothing.

The same code serves a host install (``/``), a driver container (``/run/nvidia/driver``) and
the test fixtures, because every path is read relative to the driver root.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat

import msgspec

from mounts import catalog, ldcache, reads
from mounts.elf import not_an_executable, read_elf
from mounts.errors import DriverError, ElfError, LdCacheError
from mounts.ldcache import FLAG_ELF_LIBC6, FLAG_REQUIRED_MASK, FLAGS_I386, FLAGS_X86_64
from mounts.paths import LinkLoop, Resolver, file_kind, opened_at, resolve_in_root

NVIDIA_MAJOR = 195
CTL_MINOR, MODESET_MINOR = 255, 254
DRM_MAJOR = 226  # /dev/dri/card<N> (minor N) and renderD<N> (minor N)

# Newest CUDA version each driver branch supports (CUDA toolkit release notes, "minimum
# required driver"): the driver's CUDA version without calling cuDriverGetVersion.
CUDA_BY_BRANCH = (
    (418, "10.1"), (440, "10.2"), (450, "11.0"), (455, "11.1"), (460, "11.2"), (465, "11.3"),
    (470, "11.4"), (495, "11.5"), (510, "11.6"), (515, "11.7"), (520, "11.8"), (525, "12.0"),
    (530, "12.1"), (535, "12.2"), (545, "12.3"), (550, "12.4"), (555, "12.5"), (560, "12.6"),
    (565, "12.7"), (570, "12.8"), (575, "12.9"), (580, "13.0"),
)
# ASCII digits only, and few of them: int() takes "١" and "０", and refuses 5,000 digits.
_VERSION_RE = re.compile(r"Kernel Module\s+(?:for \S+\s+)?([0-9]{1,6}\.[0-9]{1,6}(?:\.[0-9]{1,6})?)")
_LIB_VERSION_RE = re.compile(r"^lib(?:cuda|nvidia-ml)\.so\.([0-9]{1,6}\.[0-9]{1,6}(?:\.[0-9]{1,6})?)$")
_NUMBER = re.compile(r"[0-9]{1,9}")
_BUS_ID = re.compile(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")


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
    path = resolve_in_root(root, rel) if resolver is None else _in(resolver, rel)
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


def _in(resolver: Resolver, rel: str) -> str | None:
    """resolve_in_root(resolver.root, rel), each directory on the way resolved once."""
    try:
        found = resolver.file("/" + rel.strip("/"))
    except LinkLoop:
        return None
    return found[0] if found else None


def _text(kernel: Resolver, rel: str) -> str | None:
    found = read_file(kernel.root, rel, resolver=kernel)
    return found[1].decode("utf-8", "replace") if found else None


def _cache_version(cache: list[ldcache.Entry], resolver: Resolver) -> tuple[str, str] | None:
    """(version, file) of the first cache entry whose file is libcuda.so.<v> or
    libnvidia-ml.so.<v>: None when the cache lists no driver."""
    for e in cache:
        if not _drivers_key(e.key):
            continue
        found = _resolve_lib(resolver, e)
        m = _LIB_VERSION_RE.match(found[0].rpartition("/")[2]) if found else None
        if m and found:
            return m.group(1), found[0]
    return None


def _version(root: str, kernel: Resolver, from_libs: tuple[str, str] | None, where: str) -> str:
    """The kernel module's version from /proc, else the version in libcuda's or
    libnvidia-ml's file name (``from_libs``: that version and file). When both are there
    they must agree: a /proc version that no library carries would give a GPU container
    without libraries, silently."""
    text = _text(kernel, "proc/driver/nvidia/version")
    m = _VERSION_RE.search(text) if text else None
    if m:
        if from_libs is not None and from_libs[0] != m.group(1):
            raise DriverError(f"{kernel.root}/proc/driver/nvidia/version: kernel module {m.group(1)} does not "
                              f"match the driver's libraries ({from_libs[1]} is {from_libs[0]})")
        return m.group(1)
    if from_libs is not None:
        return from_libs[0]
    raise DriverError(f"{root}: no NVIDIA driver found (no proc/driver/nvidia/version, {where}): {POINT_AT_DRIVER}")


def cuda_version(driver_version: str) -> str | None:
    major = int(driver_version.split(".")[0])
    found = None
    for branch, cuda in CUDA_BY_BRANCH:
        if major >= branch:
            found = cuda
    return found


def _gpus(kernel: Resolver) -> list[Gpu]:
    base = _in(kernel, "proc/driver/nvidia/gpus")
    if base is None:
        return []
    try:
        busids = sorted(reads.listdir(base))
    except OSError:
        return []
    gpus = []
    for index, busid in enumerate(busids):
        info_path = os.path.join(base, busid, "information")
        if not _BUS_ID.fullmatch(busid):  # it becomes a path in the container and on the host
            raise DriverError(f"{base}/{busid}: not a PCI bus id (domain:bus:device.function)")
        info = {}
        for line in (_text(kernel, f"proc/driver/nvidia/gpus/{busid}/information") or "").splitlines():
            key, sep, value = line.partition(":")
            if sep:
                info[key.strip()] = value.strip()
        if not _NUMBER.fullmatch(info.get("Device Minor", "")):
            raise DriverError(f"{info_path}: no valid 'Device Minor:' line")
        minor = int(info["Device Minor"])
        location = info.get("Bus Location", busid).lower()
        if location != busid.lower():
            raise DriverError(f"{info_path}: 'Bus Location: {location[:40]}' is not its directory's bus id {busid}")
        gpus.append(Gpu(index, minor, info.get("GPU UUID", ""), busid.lower(), info.get("Model", "")))
    return gpus


def _majors(kernel: Resolver) -> dict[str, int]:
    majors = {}
    for line in (_text(kernel, "proc/devices") or "").splitlines():
        if line.startswith("Block"):
            break
        num, _, name = line.strip().partition(" ")
        if _NUMBER.fullmatch(num):
            majors[name.strip()] = int(num)
    return majors


IMEX_DIR = "nvidia-caps-imex-channels"  # /dev/<this>/channel<N>, the major of the same name in /proc/devices
IMEX_MAJOR_NAME = "nvidia-caps-imex-channels"


def _devices(root: str, gpus: list[Gpu], majors: dict[str, int]) -> dict[str, DeviceNode]:
    """Every NVIDIA node present under ``root``/dev, each checked to be the char device it
    should be (a regular file or a wrong number under that name is an error, not a skip)."""
    wanted = {"nvidiactl": (NVIDIA_MAJOR, CTL_MINOR), "nvidia-modeset": (NVIDIA_MAJOR, MODESET_MINOR)}
    wanted.update({f"nvidia{g.minor}": (NVIDIA_MAJOR, g.minor) for g in gpus})
    if "nvidia-uvm" in majors:
        wanted["nvidia-uvm"] = (majors["nvidia-uvm"], 0)
        wanted["nvidia-uvm-tools"] = (majors["nvidia-uvm"], 1)
    caps_dir = os.path.join(root, "dev/nvidia-caps")
    if "nvidia-caps" in majors and reads.isdir(caps_dir):
        for name in sorted(reads.listdir(caps_dir)):
            m = re.fullmatch(r"nvidia-cap([0-9]{1,9})", name)
            if m:
                wanted[f"nvidia-caps/{name}"] = (majors["nvidia-caps"], int(m.group(1)))
    imex_dir = os.path.join(root, "dev", IMEX_DIR)
    if IMEX_MAJOR_NAME in majors and reads.isdir(imex_dir):
        for name in sorted(reads.listdir(imex_dir)):
            m = re.fullmatch(r"channel([0-9]{1,9})", name)
            if m:
                wanted[f"{IMEX_DIR}/{name}"] = (majors[IMEX_MAJOR_NAME], int(m.group(1)))
    found = {}
    for name, (major, minor) in wanted.items():
        source = os.path.join(root, "dev", name)
        try:
            st = reads.lstat(source)
        except FileNotFoundError:
            continue
        if not stat.S_ISCHR(st.st_mode) or (os.major(st.st_rdev), os.minor(st.st_rdev)) != (major, minor):
            kind = "char" if stat.S_ISCHR(st.st_mode) else "not a char device"
            raise DriverError(f"{source}: expected char device {major}:{minor}, found {kind} "
                              f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")
        found[name] = DeviceNode("/dev/" + name, source, major, minor)
    return found


_DRI_LINK = re.compile(r"\.\./((card|renderD)([0-9]{1,5}))")


def dri_link(busid: str, node: str) -> str:
    """The /dev/dri/by-path name of a GPU's DRI node (udev's: pci-<domain:bus:dev.fn>-card)."""
    domain, _, rest = busid.partition(":")
    return f"by-path/pci-{int(domain, 16):04x}:{rest}-{'card' if node.startswith('card') else 'render'}"


def _dri(root: str, gpus: list[Gpu]) -> tuple[dict[str, tuple[str, ...]], dict[str, DeviceNode]]:
    """Each GPU's DRI nodes, found through udev's /dev/dri/by-path links (matched by PCI bus
    id, never by index); each node checked to be char 226:<its number>."""
    by_gpu, nodes = {}, {}
    for g in gpus:
        names = []
        for kind in ("card", "render"):
            link = os.path.join(root, "dev/dri", dri_link(g.busid, kind))
            try:
                m = _DRI_LINK.fullmatch(reads.readlink(link))
            except (FileNotFoundError, NotADirectoryError, ValueError):
                continue
            except OSError as e:
                raise DriverError(f"{link}: cannot read: {e.strerror}") from None
            if m is None:
                raise DriverError(f"{link}: expected a link to ../card<N> or ../renderD<N>")
            source = os.path.join(root, "dev/dri", m.group(1))
            st = _lstat(source)
            if st is None:
                continue
            if not stat.S_ISCHR(st.st_mode) or (os.major(st.st_rdev), os.minor(st.st_rdev)) != (DRM_MAJOR, int(m.group(3))):
                raise DriverError(f"{source}: expected char device {DRM_MAJOR}:{int(m.group(3))}")
            nodes["dri/" + m.group(1)] = DeviceNode("/dev/dri/" + m.group(1), source, DRM_MAJOR, int(m.group(3)))
            names.append("dri/" + m.group(1))
        if names:
            by_gpu[g.busid] = tuple(names)
    return by_gpu, nodes


def _lstat(path: str) -> os.stat_result | None:
    try:
        return reads.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _cap_minor(kernel: Resolver, rel: str) -> int | None:
    """DeviceFileMinor of a capability's access file (/proc/driver/nvidia/capabilities/...)."""
    text = _text(kernel, f"proc/driver/nvidia/{rel}")
    if text is None:
        return None
    m = re.search(r"^DeviceFileMinor:\s*([0-9]{1,9})\s*$", text, re.M)
    if m is None:
        raise DriverError(f"{kernel.root}/proc/driver/nvidia/{rel}: no valid 'DeviceFileMinor:' line")
    return int(m.group(1))


def _migs(kernel: Resolver, gpus: list[Gpu]) -> tuple[list[Mig], dict[str, int]]:
    """The MIG devices the driver shows under /proc/driver/nvidia/capabilities: a
    gpu<minor>/mig/gi<G>/ci<C> directory per compute instance (the instances that exist;
    /proc/driver/nvidia-caps/mig-minors lists every possible one)."""
    caps = {n: m for n in ("config", "monitor") if (m := _cap_minor(kernel, f"capabilities/mig/{n}")) is not None}
    migs = []
    for g in gpus:
        base = _in(kernel, f"proc/driver/nvidia/capabilities/gpu{g.minor}/mig")
        if base is None or not reads.isdir(base):
            continue
        for gi_name in sorted(reads.listdir(base), key=_number_in):
            gi = re.fullmatch(r"gi([0-9]{1,4})", gi_name)
            if gi is None or (gi_cap := _cap_minor(kernel, f"capabilities/gpu{g.minor}/mig/{gi_name}/access")) is None:
                continue
            gi_dir = _in(kernel, f"proc/driver/nvidia/capabilities/gpu{g.minor}/mig/{gi_name}")
            if gi_dir is None or not reads.isdir(gi_dir):
                continue
            for ci_name in sorted(reads.listdir(gi_dir), key=_number_in):
                ci = re.fullmatch(r"ci([0-9]{1,4})", ci_name)
                rel = f"capabilities/gpu{g.minor}/mig/{gi_name}/{ci_name}/access"
                if ci is not None and (ci_cap := _cap_minor(kernel, rel)) is not None:
                    migs.append(Mig(g.minor, int(gi.group(1)), int(ci.group(1)), gi_cap, ci_cap))
    return migs, caps


def _number_in(name: str) -> tuple[int, str]:
    m = re.search(r"[0-9]{1,9}", name)
    return (int(m.group()) if m else -1, name)


_NVIDIA_KEY = re.compile(r"lib(?:cuda|nv|.*nvidia)")


def _drivers_key(key: str) -> bool:
    """Whether a cache entry's name may be one of the driver's (catalog.LIBRARIES' names and
    the EGL platform libraries all are): a host's cache lists 1,000-3,000 libraries, and only
    these are resolved (and noted, for a kept inventory to ask again)."""
    return bool(_NVIDIA_KEY.match(key)) or key in catalog.EGL_PLATFORM_LIBS


def _resolve_lib(resolver: Resolver, e: ldcache.Entry) -> tuple[str, int] | None:
    """The file a cache entry names. A link loop is an error for a driver library (it would
    be dropped from every container without a word) and a skip for anything else."""
    try:
        return resolver.file(e.value)
    except LinkLoop:
        if _NVIDIA_KEY.match(e.key):
            raise DriverError(f"{resolver.root}{e.value}: symbolic links loop (library {e.key} "
                              "of the driver cannot be resolved)") from None
        return None


def _libraries(cache: list[ldcache.Entry], version: str, resolver: Resolver) -> list[DriverLib]:
    """Every cache entry whose file carries the driver's version (or is an EGL platform
    library), with its ELF facts: read once a file, ~15 us each. A file that is no usable
    ELF is kept with the reason, for the plan to refuse only where a container needs it."""
    libs, seen = [], set()
    elf: dict[str, tuple[str | None, tuple[str, ...], str | None]] = {}
    suffix = "." + version
    for e in cache:
        if not _drivers_key(e.key):
            continue
        found = _resolve_lib(resolver, e)
        if found is None or (e.key, e.flags) in seen:
            continue
        if not found[0].endswith(suffix) and e.key not in catalog.EGL_PLATFORM_LIBS:
            continue
        path, mode = found
        if not stat.S_ISREG(mode):  # never open a FIFO or device as an ELF file
            raise DriverError(f"{path}: library {e.key} of the driver is not a regular file")
        seen.add((e.key, e.flags))
        if path not in elf:
            try:
                info = read_elf(path)
                elf[path] = info.soname, info.needed, None
            except ElfError as err:
                elf[path] = None, (), str(err)
        libs.append(DriverLib(e.key, path, path.rpartition("/")[2], e.flags, *elf[path]))
    return libs


_CONF_DEPTH = 4  # ld.so.conf's includes, nested: enough for any distribution's, and no loop


def _ld_so_conf(resolver: Resolver, rel: str = "etc/ld.so.conf", depth: int = 0) -> list[str]:
    """The directories ``rel`` (etc/ld.so.conf and what it includes) names, as ldconfig
    reads them: ``include`` globs relative to the file's directory, ``hwcap`` lines and
    comments skipped, ``dir=type`` taken as dir. Read inside the root as every driver file."""
    text = _text(resolver, rel)
    dirs: list[str] = []
    for line in (text or "").splitlines():
        words = line.partition("#")[0].split()
        if not words or words[0] == "hwcap":
            continue
        if words[0] != "include":
            dirs.append(words[0].partition("=")[0])
            continue
        for pattern in words[1:] if depth < _CONF_DEPTH else ():
            pattern = pattern if pattern.startswith("/") else f"/{os.path.dirname(rel)}/{pattern}"
            head, _, glob = pattern.rpartition("/")
            host = _in(resolver, head)
            for name in sorted(reads.listdir(host)) if host is not None and reads.isdir(host) else ():
                if fnmatch.fnmatchcase(name, glob):
                    dirs += _ld_so_conf(resolver, f"{head.strip('/')}/{name}", depth + 1)
    return dirs


def _search(resolver: Resolver) -> tuple[list[tuple[str, str]], list[str]]:
    """For a driver root whose ld.so.cache lists no driver: the lib*.so.* names of the
    directories ldconfig would have read (etc/ld.so.conf's, then catalog.LIB_DIRS), each
    directory once; and those directories."""
    names, searched, seen = [], [], set()
    for d in _ld_so_conf(resolver) + list(catalog.LIB_DIRS):
        rel = "/" + os.path.normpath("/" + d).strip("/")
        try:
            host = resolver.directory(rel)
        except LinkLoop:
            continue
        if host is None or host in seen or not reads.isdir(host):
            continue
        seen.add(host)
        searched.append(rel)
        names += [(rel, n) for n in sorted(reads.listdir(host)) if n.startswith("lib") and ".so." in n]
    return names, searched


def _searched_version(names: list[tuple[str, str]], resolver: Resolver) -> tuple[str, str] | None:
    """_cache_version's answer from the names found by _search."""
    for d, n in names:
        m = _LIB_VERSION_RE.match(n)
        if m and (found := _plain(resolver, f"{d}/{n}")) is not None:
            return m.group(1), found
    return None


# ld.so.cache's flags for a library of each machine, as ldconfig sets them
_MACHINE_FLAGS = {(64, "EM_X86_64"): FLAGS_X86_64, (64, "EM_AARCH64"): FLAG_ELF_LIBC6 | 0x0A00,
                  (32, "EM_386"): FLAGS_I386}


def _searched_libraries(names: list[tuple[str, str]], version: str, resolver: Resolver) -> list[DriverLib]:
    """_libraries' answer without a cache: every file found by _search whose name carries
    the driver's version (or is an EGL platform library), keyed by its ELF SONAME with the
    flags of its class and machine, as ldconfig would have listed it; the first of a SONAME
    and machine wins, as in ldconfig's cache. A file no ELF reader can read is kept with
    the reason, keyed by its name, like _libraries' broken ones."""
    suffix = "." + version
    egl = tuple(n + "." for n in catalog.EGL_PLATFORM_LIBS)
    libs, paths, keys = [], set(), set()
    for d, n in names:
        if not n.endswith(suffix) and not n.startswith(egl):
            continue
        try:
            found = resolver.file(f"{d}/{n}")
        except LinkLoop:
            raise DriverError(f"{resolver.root}{d}/{n}: symbolic links loop (a library of the driver "
                              "cannot be resolved)") from None
        if found is None or found[0] in paths:
            continue
        path, mode = found
        name = path.rpartition("/")[2]
        if not name.endswith(suffix) and not name.startswith(egl):
            continue
        if not stat.S_ISREG(mode):  # never open a FIFO or device as an ELF file
            raise DriverError(f"{path}: library {n} of the driver is not a regular file")
        paths.add(path)
        try:
            info = read_elf(path)
        except ElfError as err:
            libs.append(DriverLib(name, path, name, FLAGS_X86_64, broken=str(err)))
            continue
        flags = _MACHINE_FLAGS.get((info.elfclass, info.machine))
        key = info.soname or name
        if flags is None or (key, flags) in keys or (not name.endswith(suffix) and key not in catalog.EGL_PLATFORM_LIBS):
            continue
        keys.add((key, flags))
        libs.append(DriverLib(key, path, name, flags, info.soname, info.needed))
    return libs


_RELEASE = re.compile(r"[A-Za-z0-9._+~-]{1,64}")


def _firmware(resolver: Resolver, kernel: Resolver, version: str, notes: list[str]) -> dict[str, str]:
    """The GSP firmware of ``version``, where the kernel looks for it: firmware_class's path
    parameter (a directory of the device root's, as the kernel names it), then each of
    catalog.FIRMWARE_DIRS in the driver root (and in the device root, when that is another:
    a driver container's kernel reads the host's /lib/firmware). Per file name the first
    directory that has it wins, as in the kernel; the container sees it at that path. A
    gsp*.bin that is no regular file is passed over (noted)."""
    dirs = []
    param = (_text(kernel, catalog.FIRMWARE_PARAM) or "").strip()
    if param.startswith("/") and "\0" not in param:
        dirs.append((kernel, "/" + os.path.normpath(param).strip("/")))
    release = (_text(kernel, "proc/sys/kernel/osrelease") or "").strip()
    for d in catalog.FIRMWARE_DIRS:
        if "{release}" in d and not _RELEASE.fullmatch(release):
            continue
        d = d.format(release=release)
        dirs += [(resolver, d)] + ([(kernel, d)] if kernel is not resolver else [])
    found: dict[str, str] = {}
    names: set[str] = set()
    for base, d in dirs:
        target = f"{d.rstrip('/')}/nvidia/{version}"
        host = _in(base, target)
        try:
            entries = sorted(reads.listdir(host)) if host is not None else []
        except OSError:  # not a directory
            continue
        for name in entries:
            if not (name.startswith("gsp") and name.endswith(".bin")) or name in names:
                continue
            path: str | None = f"{host}/{name}"
            st = _lstat(f"{host}/{name}")
            if st is None:
                continue
            if stat.S_ISLNK(st.st_mode):  # resolved inside its root
                path = _in(base, f"{target}/{name}")
                st = _lstat(path) if path is not None else None
                why = file_kind(st.st_mode) if st else "a symlink that leads to no file inside its root"
            else:
                why = file_kind(st.st_mode)
            if st is None or not stat.S_ISREG(st.st_mode) or path is None:
                if (note := f"firmware: passed over {host}/{name}: {why}") not in notes:  # (a directory seen twice)
                    notes.append(note)
                continue
            names.add(name)
            found[f"{target}/{name}"] = path
    return found


def _plain(resolver: Resolver, path: str) -> str | None:
    """The host path of ``path`` inside the root when it is a regular file."""
    try:
        found = resolver.file(path)
    except LinkLoop:
        return None
    return found[0] if found is not None and stat.S_ISREG(found[1]) else None


def _bin_dirs(root: str, libraries: list[DriverLib], search_path: str | None) -> list[str]:
    """Where the driver's binaries are looked for, in order: beside its 64-bit libcuda and
    libnvidia-ml (<libdir>/../bin: /usr/local/nvidia/lib64 -> /usr/local/nvidia/bin), the PATH given
    (the host's, for the host's own root), catalog.BIN_DIRS. Root-relative, each once."""
    base = root.rstrip("/")
    libdirs = dict.fromkeys(lib.path.rpartition("/")[0] for lib in libraries
                            if lib.key in ("libcuda.so.1", "libnvidia-ml.so.1") and lib.flags & FLAG_REQUIRED_MASK)
    dirs = []
    for d in libdirs:  # real paths inside the root (resolved there): their parent is one too
        parent = d.rpartition("/")[0]
        if len(parent) >= len(base) and reads.isdir(parent + "/bin"):
            dirs.append(parent[len(base):] + "/bin")
    dirs += [d for d in (search_path or "").split(":") if d.startswith("/")]
    return list(dict.fromkeys(dirs + ["/" + d for d in catalog.BIN_DIRS]))


def _not_the_drivers(path: str, mode: int) -> str | None:
    """Why the file at ``path`` (resolved inside the root; ``mode`` its lstat's) is not a
    driver binary to bind, or None: it must be a regular, executable ELF executable (a
    wrapper script would exec a path the container lacks). Its first 4 KiB are read as
    every driver file is: non-blocking, never through a last link, checked to be where the
    kernel opened it."""
    if not stat.S_ISREG(mode):
        return file_kind(mode)
    if not mode & 0o111:
        return "not executable"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        return f"cannot read: {e.strerror}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return file_kind(st.st_mode)
        if not opened_at(fd, path):
            return "changed while being opened"
        reads.opened(path, fd, st=st)
        head = os.pread(fd, 4096, 0)
    except OSError as e:
        return f"cannot read: {e.strerror}"
    finally:
        os.close(fd)
    return not_an_executable(head)


def _says_version(path: str, version: str) -> bool:
    """Whether the binary at ``path`` carries ``version`` in its bytes (the driver's own
    binaries print it: "NVIDIA System Management Interface -- v535.261.03")."""
    import mmap

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return False
        with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as m:
            return m.find(version.encode()) >= 0
    except (OSError, ValueError):
        return False
    finally:
        os.close(fd)


def _binaries(resolver: Resolver, dirs: list[str], version: str,
              notes: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """Each of catalog.BINARIES' names: the driver's ELF executable of that name in the
    first of ``dirs`` that has one; where several different files qualify, the first whose
    bytes carry the driver's version. Others (a wrapper script, a FIFO, a file that cannot
    be read, a link that leads nowhere inside the root) are passed over, in ``notes``; a
    name found only as such files is in the second dict, with why."""
    found: dict[str, str] = {}
    refused: dict[str, str] = {}
    where: list[tuple[str, str]] = []  # (root-relative dir, its host path): each directory once
    for d in dirs:
        try:
            host = resolver.directory(d)
        except LinkLoop:
            continue
        if host is not None and all(host != h for _d, h in where):
            where.append((d, host))
    for name in (n for names in catalog.BINARIES.values() for n in names):
        elfs: list[str] = []
        passed: list[str] = []
        for d, host in where:
            try:
                hit = resolver.file(f"{d}/{name}")
            except LinkLoop:
                passed.append(f"{host}/{name}: symbolic links loop")
                continue
            if hit is None or hit[0] in elfs:
                continue
            why = _not_the_drivers(*hit)
            if why is None:
                elfs.append(hit[0])
            else:
                via = "" if hit[0] == f"{host}/{name}" else f" -> {hit[0]}"
                passed.append(f"{host}/{name}{via}: {why}")
        if len(elfs) > 1:  # different files (or hard links of one): the driver's version first
            inodes: dict[tuple[int, int], str] = {}
            for p in elfs:
                st = reads.stat_(p)
                inodes.setdefault((st.st_dev, st.st_ino), p)
            elfs = sorted(inodes.values(), key=lambda p: (not _says_version(p, version), elfs.index(p)))
        if elfs:
            found[name] = elfs[0]
            notes += [f"{name}: took {elfs[0]}, passed over {p}" for p in passed + elfs[1:]]
            continue
        if passed:
            refused[name] = "; ".join(passed)
            notes += [f"{name}: passed over {p}" for p in passed]
        for _d, host in where:
            if reads.islink(f"{host}/{name}"):
                notes.append(f"{name}: passed over {host}/{name}: a symlink that leads to no file inside the driver root")
    return found, refused


def _configs(resolver: Resolver) -> tuple[dict[str, str], dict[str, str]]:
    """The loaders' files the driver root has (regular files only), and the text of those
    that may name a library by a host path (.json, .icd), read as every driver file is."""
    wanted = [p for paths in catalog.CONFIGS.values() for p in paths]
    for d in catalog.EGL_PLATFORMS:
        host = resolve_in_root(resolver.root, d)
        if host is not None and reads.isdir(host):
            wanted += [f"{d}/{n}" for n in sorted(reads.listdir(host)) if catalog.PLATFORM_FILE.fullmatch(n)]
    configs = {p: host for p in wanted if (host := _plain(resolver, p)) is not None}
    texts = {}
    for p, host in configs.items():
        if p.endswith((".json", ".icd")) and (data := read_resolved(host)) is not None:
            texts[p] = data.decode("utf-8", "replace")
    return configs, texts


def _xorg(resolver: Resolver, version: str) -> dict[str, str]:
    """Xorg's modules: where Xorg looks, else in Debian's flavour directory of this driver
    (the first, current first, whose GLX module carries its version; else current)."""
    found = {}
    for target, *elsewhere in catalog.XORG_MODULES:
        target = target.format(version=version)
        host = next((h for p in (target, *elsewhere) if (h := _plain(resolver, p.format(version=version)))), None)
        if host is not None:
            found[target] = host
    if len(found) < len(catalog.XORG_MODULES) and (flavour := _flavour(resolver, version)) is not None:
        for target, *_elsewhere in catalog.XORG_MODULES:
            target = target.format(version=version)
            host = _plain(resolver, f"{catalog.XORG_FLAVOURS}/{flavour}/{target.rpartition('/')[2]}")
            if target not in found and host is not None:
                found[target] = host
    return found


def _flavour(resolver: Resolver, version: str) -> str | None:
    """Debian's directory of this driver's Xorg modules under catalog.XORG_FLAVOURS."""
    try:
        host = resolver.directory(catalog.XORG_FLAVOURS)
    except LinkLoop:
        return None
    if host is None or not reads.isdir(host):
        return None
    glx = f"libglxserver_nvidia.so.{version}"
    if _plain(resolver, f"{catalog.XORG_FLAVOURS}/current/{glx}"):
        return "current"
    names = sorted(reads.listdir(host))
    return next((n for n in names if _plain(resolver, f"{catalog.XORG_FLAVOURS}/{n}/{glx}")),
                "current" if "current" in names else None)


def _ipc(resolver: Resolver) -> dict[str, str]:
    """The IPC sockets and directories present (any kind: the gofer checks it)."""
    found = {}
    for p in (p for paths in catalog.IPC.values() for p in paths):
        try:
            hit = resolver.file(p)
        except LinkLoop:
            continue
        if hit is not None:
            found[p] = hit[0]
    return found


def discover(root: str = "/", dev_root: str | None = None, search_path: str | None = None) -> Inventory:
    """Everything the plan needs to know about the driver under ``root``. The kernel side
    (``dev/`` nodes, ``proc/devices``, ``proc/driver/nvidia``, the firmware path and the
    kernel's release) is read under ``dev_root``, by default the same root; a driver
    container mounted at /run/nvidia/driver keeps its user-space files there while the
    nodes and /proc stay the host's (``dev_root="/"``). ``search_path``: a PATH whose
    directories (inside the root) may hold the driver's binaries; for the host's own root
    ("/") by default our PATH, the host's, as nvidia-ctk reads it."""
    # real paths: every source is then the path the kernel names what it opens by (opened_at)
    given = {"driver root": root, "device root": dev_root or root}
    root = os.path.realpath(root)  # (the answer noted below: what the path the caller gave leads to)
    dev_root = os.path.realpath(dev_root) if dev_root else root
    for (what, asked), path in zip(given.items(), (root, dev_root), strict=True):
        if not reads.isdir(path):
            raise DriverError(f"{path}: {what} is not a directory")
        a, b = reads.stat_(asked), reads.stat_(path)
        if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):  # /proc/<pid>/root: realpath reads "/"
            raise DriverError(f"{asked}: the {what} is reached through a link that names no path here "
                              f"(realpath gives {path}); give its real path")
    cache: list[ldcache.Entry] = []
    found = read_file(root, "etc/ld.so.cache", MAX_CACHE)
    if found is not None:
        try:
            cache = ldcache.parse(*found[::-1])
        except LdCacheError as e:
            raise DriverError(str(e)) from None
    resolver = Resolver(root)  # shared: the version, the libraries and the binaries resolve the same files
    from_libs = _cache_version(cache, resolver)
    names: list[tuple[str, str]] | None = None
    searched: list[str] = []
    if from_libs is None:  # no cache, or it lists no driver (GKE, a driver unpacked anywhere): search
        names, searched = _search(resolver)
        from_libs = _searched_version(names, resolver)
    libs = "no libcuda.so.<version> or libnvidia-ml.so.<version>"
    where = f"{libs} in etc/ld.so.cache"
    if names is not None:
        dirs = ", ".join(searched) or "its library directories (it has none)"
        where = f"{where} nor in {dirs}" if found else f"no etc/ld.so.cache, {libs} in {dirs}"
    kernel = resolver if dev_root == root else Resolver(dev_root)  # the device root's files, likewise
    version = _version(root, kernel, from_libs, where)
    libraries = _libraries(cache, version, resolver) if names is None else _searched_libraries(names, version, resolver)
    notes: list[str] = []
    if search_path is None and root == "/":
        search_path = os.environ.get("PATH")
    binaries, refused = _binaries(resolver, _bin_dirs(root, libraries, search_path), version, notes)
    gpus = _gpus(kernel)
    devices = _devices(dev_root, gpus, _majors(kernel))
    dri, dri_nodes = _dri(dev_root, gpus)
    migs, mig_caps = _migs(kernel, gpus)
    configs, loader_texts = _configs(resolver)
    procfs = _in(kernel, "proc/driver/nvidia")
    return Inventory(
        root=root,
        dev_root=dev_root,
        version=version,
        gpus=gpus,
        devices=devices | dri_nodes,
        libraries=libraries,
        firmware=_firmware(resolver, kernel, version, notes),
        dri=dri,
        migs=migs,
        mig_caps=mig_caps,
        binaries=binaries,
        refused=refused,
        configs=configs,
        loader_texts=loader_texts,
        xorg=_xorg(resolver, version),
        ipc=_ipc(resolver),
        procfs=procfs if procfs is not None and reads.isdir(procfs) else None,
        libraries_from="etc/ld.so.cache" if names is None else "search of " + (", ".join(searched) or "no directory"),
        notes=tuple(notes),
    )
