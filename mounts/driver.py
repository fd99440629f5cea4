"""Driver discovery under a driver root: version, GPUs, device nodes, libraries (with their
ELF SONAME and DT_NEEDED), binaries, firmware, the loaders' files, Xorg's modules and IPC
sockets, read from files only (no NVML, nothing executed). Every fact the plan uses is
collected here: the plan itself reads nothing.

The same code serves a host install (``/``), a driver container (``/run/nvidia/driver``) and
the test fixtures, because every path is read relative to the driver root.
"""

from __future__ import annotations

import os
import re
import stat

import msgspec

from mounts import catalog, ldcache
from mounts.elf import read_elf
from mounts.errors import DriverError, ElfError, LdCacheError
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
    binaries: dict[str, str] = {}  # catalog.BINARIES' names -> host path
    configs: dict[str, str] = {}  # the loaders' files: container path -> host path (regular files)
    loader_texts: dict[str, str] = {}  # container path -> text of those that are .json or .icd
    xorg: dict[str, str] = {}  # Xorg's modules: where Xorg looks -> host path (regular files)
    ipc: dict[str, str] = {}  # catalog.IPC's sockets and directories present: container path -> host path
    procfs: str | None = None  # the host's proc/driver/nvidia directory under the device root

    @property
    def cuda_version(self) -> str | None:
        return cuda_version(self.version)


MAX_TEXT = 1 << 20  # a /proc file of the driver is a few hundred bytes
MAX_CACHE = 64 << 20  # a host's ld.so.cache is well under a MiB


POINT_AT_DRIVER = "point --driver-root (or driver-root in /etc/gpu-sandbox/config.toml) at the driver's files"

def read_file(root: str, rel: str, limit: int = MAX_TEXT) -> tuple[str, bytes] | None:
    """(host path, content) of ``rel`` inside ``root`` (links resolved as if ``root`` were
    "/"), or None when it does not exist. Anything but a regular file of at most ``limit``
    bytes is a DriverError naming the path: a FIFO would block, a device such as /dev/zero
    never end. Opened non-blocking, without following a last link, no controlling tty."""
    path = resolve_in_root(root, rel)
    if path is None:
        if os.path.lexists(os.path.join(root, rel)):  # a link out of the root, or one that loops
            raise DriverError(f"{os.path.join(root, rel)}: a symlink that leads to no file inside the driver root")
        return None
    data = read_resolved(path, limit)
    return None if data is None else (path, data)


def read_resolved(path: str, limit: int = MAX_TEXT) -> bytes | None:
    """read_file's reading, of a path already resolved inside the root."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise DriverError(f"{path}: cannot read: {e.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise DriverError(f"{path}: expected a regular file, found {file_kind(mode)}")
        if not opened_at(fd, path):
            raise DriverError(f"{path}: changed while being opened (a directory on the way became a link)")
        data = _read_all(fd, limit + 1)
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


def _text(root: str, rel: str) -> str | None:
    found = read_file(root, rel)
    return found[1].decode("utf-8", "replace") if found else None


def _version(root: str, dev_root: str, cache: list[ldcache.Entry], resolver: Resolver) -> str:
    """The kernel module's version from /proc, else the version in libcuda's or
    libnvidia-ml's file name. When both are there they must agree: a /proc version that
    no library carries would give a GPU container without libraries, silently."""
    lib_version = lib_name = None
    for e in cache:
        found = _resolve_lib(resolver, e)
        m = _LIB_VERSION_RE.match(found[0].rpartition("/")[2]) if found else None
        if m and found:
            lib_version, lib_name = m.group(1), found[0]
            break
    text = _text(dev_root, "proc/driver/nvidia/version")
    m = _VERSION_RE.search(text) if text else None
    if m:
        if lib_version is not None and lib_version != m.group(1):
            raise DriverError(f"{dev_root}/proc/driver/nvidia/version: kernel module {m.group(1)} does not "
                              f"match the driver's libraries ({lib_name} is {lib_version})")
        return m.group(1)
    if lib_version is not None:
        return lib_version
    raise DriverError(f"{root}: no NVIDIA driver found (no proc/driver/nvidia/version, "
                      f"no libcuda.so.<version> or libnvidia-ml.so.<version> in etc/ld.so.cache): {POINT_AT_DRIVER}")


def cuda_version(driver_version: str) -> str | None:
    major = int(driver_version.split(".")[0])
    found = None
    for branch, cuda in CUDA_BY_BRANCH:
        if major >= branch:
            found = cuda
    return found


def _gpus(root: str) -> list[Gpu]:
    base = resolve_in_root(root, "proc/driver/nvidia/gpus")
    if base is None:
        return []
    try:
        busids = sorted(os.listdir(base))
    except OSError:
        return []
    gpus = []
    for index, busid in enumerate(busids):
        info_path = os.path.join(base, busid, "information")
        if not _BUS_ID.fullmatch(busid):  # it becomes a path in the container and on the host
            raise DriverError(f"{base}/{busid}: not a PCI bus id (domain:bus:device.function)")
        info = {}
        for line in (_text(root, f"proc/driver/nvidia/gpus/{busid}/information") or "").splitlines():
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


def _majors(root: str) -> dict[str, int]:
    majors = {}
    for line in (_text(root, "proc/devices") or "").splitlines():
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
    if "nvidia-caps" in majors and os.path.isdir(caps_dir):
        for name in sorted(os.listdir(caps_dir)):
            m = re.fullmatch(r"nvidia-cap([0-9]{1,9})", name)
            if m:
                wanted[f"nvidia-caps/{name}"] = (majors["nvidia-caps"], int(m.group(1)))
    imex_dir = os.path.join(root, "dev", IMEX_DIR)
    if IMEX_MAJOR_NAME in majors and os.path.isdir(imex_dir):
        for name in sorted(os.listdir(imex_dir)):
            m = re.fullmatch(r"channel([0-9]{1,9})", name)
            if m:
                wanted[f"{IMEX_DIR}/{name}"] = (majors[IMEX_MAJOR_NAME], int(m.group(1)))
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
                m = _DRI_LINK.fullmatch(os.readlink(link))
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
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _cap_minor(root: str, rel: str) -> int | None:
    """DeviceFileMinor of a capability's access file (/proc/driver/nvidia/capabilities/...)."""
    text = _text(root, f"proc/driver/nvidia/{rel}")
    if text is None:
        return None
    m = re.search(r"^DeviceFileMinor:\s*([0-9]{1,9})\s*$", text, re.M)
    if m is None:
        raise DriverError(f"{root}/proc/driver/nvidia/{rel}: no valid 'DeviceFileMinor:' line")
    return int(m.group(1))


def _migs(root: str, gpus: list[Gpu]) -> tuple[list[Mig], dict[str, int]]:
    """The MIG devices the driver shows under /proc/driver/nvidia/capabilities: a
    gpu<minor>/mig/gi<G>/ci<C> directory per compute instance (the instances that exist;
    /proc/driver/nvidia-caps/mig-minors lists every possible one)."""
    caps = {n: m for n in ("config", "monitor") if (m := _cap_minor(root, f"capabilities/mig/{n}")) is not None}
    migs = []
    for g in gpus:
        base = resolve_in_root(root, f"proc/driver/nvidia/capabilities/gpu{g.minor}/mig")
        if base is None or not os.path.isdir(base):
            continue
        for gi_name in sorted(os.listdir(base), key=_number_in):
            gi = re.fullmatch(r"gi([0-9]{1,4})", gi_name)
            if gi is None or (gi_cap := _cap_minor(root, f"capabilities/gpu{g.minor}/mig/{gi_name}/access")) is None:
                continue
            gi_dir = resolve_in_root(root, f"proc/driver/nvidia/capabilities/gpu{g.minor}/mig/{gi_name}")
            if gi_dir is None or not os.path.isdir(gi_dir):
                continue
            for ci_name in sorted(os.listdir(gi_dir), key=_number_in):
                ci = re.fullmatch(r"ci([0-9]{1,4})", ci_name)
                rel = f"capabilities/gpu{g.minor}/mig/{gi_name}/{ci_name}/access"
                if ci is not None and (ci_cap := _cap_minor(root, rel)) is not None:
                    migs.append(Mig(g.minor, int(gi.group(1)), int(ci.group(1)), gi_cap, ci_cap))
    return migs, caps


def _number_in(name: str) -> tuple[int, str]:
    m = re.search(r"[0-9]{1,9}", name)
    return (int(m.group()) if m else -1, name)


_NVIDIA_KEY = re.compile(r"lib(?:cuda|nv|.*nvidia)")


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


def _firmware(root: str, version: str) -> dict[str, str]:
    target = f"/lib/firmware/nvidia/{version}"
    host = resolve_in_root(root, target)
    if host is None or not os.path.isdir(host):
        return {}
    return {f"{target}/{n}": f"{host}/{n}" for n in sorted(os.listdir(host))
            if n.startswith("gsp") and n.endswith(".bin")}


def _plain(resolver: Resolver, path: str) -> str | None:
    """The host path of ``path`` inside the root when it is a regular file."""
    try:
        found = resolver.file(path)
    except LinkLoop:
        return None
    return found[0] if found is not None and stat.S_ISREG(found[1]) else None


def _binaries(resolver: Resolver) -> dict[str, str]:
    found = {}
    for name in (n for names in catalog.BINARIES.values() for n in names):
        host = next((h for d in catalog.BIN_DIRS if (h := _plain(resolver, f"/{d}/{name}")) is not None), None)
        if host is not None:
            found[name] = host
    return found


def _configs(resolver: Resolver) -> tuple[dict[str, str], dict[str, str]]:
    """The loaders' files the driver root has (regular files only), and the text of those
    that may name a library by a host path (.json, .icd), read as every driver file is."""
    wanted = [p for paths in catalog.CONFIGS.values() for p in paths]
    for d in catalog.EGL_PLATFORMS:
        host = resolve_in_root(resolver.root, d)
        if host is not None and os.path.isdir(host):
            wanted += [f"{d}/{n}" for n in sorted(os.listdir(host)) if catalog.PLATFORM_FILE.fullmatch(n)]
    configs = {p: host for p in wanted if (host := _plain(resolver, p)) is not None}
    texts = {}
    for p, host in configs.items():
        if p.endswith((".json", ".icd")) and (data := read_resolved(host)) is not None:
            texts[p] = data.decode("utf-8", "replace")
    return configs, texts


def _xorg(resolver: Resolver, version: str) -> dict[str, str]:
    found = {}
    for target, debian in catalog.XORG_MODULES:
        target, debian = target.format(version=version), debian.format(version=version)
        host = next((h for p in (target, debian) if (h := _plain(resolver, p)) is not None), None)
        if host is not None:
            found[target] = host
    return found


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


def discover(root: str = "/", dev_root: str | None = None) -> Inventory:
    """Everything the plan needs to know about the driver under ``root``. The kernel side
    (``dev/`` nodes, ``proc/devices``, ``proc/driver/nvidia``) is read under ``dev_root``,
    by default the same root; a driver container mounted at /run/nvidia/driver keeps its
    user-space files there while the nodes and /proc stay the host's (``dev_root="/"``)."""
    # real paths: every source is then the path the kernel names what it opens by (opened_at)
    given = {"driver root": root, "device root": dev_root or root}
    root = os.path.realpath(root)
    dev_root = os.path.realpath(dev_root) if dev_root else root
    for (what, asked), path in zip(given.items(), (root, dev_root), strict=True):
        if not os.path.isdir(path):
            raise DriverError(f"{path}: {what} is not a directory")
        a, b = os.stat(asked), os.stat(path)
        if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):  # /proc/<pid>/root: realpath reads "/"
            raise DriverError(f"{asked}: the {what} is reached through a link that names no path here "
                              f"(realpath gives {path}); give its real path")
    found = read_file(root, "etc/ld.so.cache", MAX_CACHE)
    if found is None:
        raise DriverError(f"{root}: no etc/ld.so.cache under the driver root: {POINT_AT_DRIVER}")
    try:
        cache = ldcache.parse(*found[::-1])
    except LdCacheError as e:
        raise DriverError(str(e)) from None
    resolver = Resolver(root)  # shared: the version fallback and the libraries resolve the same files
    version = _version(root, dev_root, cache, resolver)
    gpus = _gpus(dev_root)
    devices = _devices(dev_root, gpus, _majors(dev_root))
    dri, dri_nodes = _dri(dev_root, gpus)
    migs, mig_caps = _migs(dev_root, gpus)
    configs, loader_texts = _configs(resolver)
    procfs = resolve_in_root(dev_root, "proc/driver/nvidia")
    return Inventory(
        root=root,
        dev_root=dev_root,
        version=version,
        gpus=gpus,
        devices=devices | dri_nodes,
        libraries=_libraries(cache, version, resolver),
        firmware=_firmware(root, version),
        dri=dri,
        migs=migs,
        mig_caps=mig_caps,
        binaries=_binaries(resolver),
        configs=configs,
        loader_texts=loader_texts,
        xorg=_xorg(resolver, version),
        ipc=_ipc(resolver),
        procfs=procfs if procfs is not None and os.path.isdir(procfs) else None,
    )
