"""The mount plan: (GPU request, driver inventory, rootfs layout) in, actions out.

``iter_plan`` yields the actions in a fixed order, cheapest first, so the supervisor can stream
each one to the gofer as soon as it is known: device nodes (no file reads), then libraries
as the DT_NEEDED closure discovers them, their links, binaries, firmware, IPC, /proc, and
last the ld.so.cache that needs every library.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import msgspec

from mounts import actions as A
from mounts.driver import DriverLib, Gpu, Inventory
from mounts.elf import read_elf
from mounts.errors import RequestError
from mounts.ldcache import FLAG_REQUIRED_MASK, Entry
from mounts.paths import exists_in_root, resolve_in_root
from mounts.request import GpuRequest, brand_of, check_requirements

# Library name prefixes per capability (matched against ld.so.cache keys).
LIBRARIES = {
    "utility": ("libnvidia-ml.so", "libnvidia-cfg.so", "libnvidia-nscq.so"),
    "compute": ("libcuda.so", "libcudadebugger.so", "libnvidia-opencl.so", "libnvidia-gpucomp.so",
                "libnvidia-ptxjitcompiler.so", "libnvidia-fatbinaryloader.so",
                "libnvidia-allocator.so", "libnvidia-compiler.so", "libnvidia-pkcs11.so",
                "libnvidia-pkcs11-openssl3.so", "libnvidia-nvvm.so"),
    "video": ("libvdpau_nvidia.so", "libnvidia-encode.so", "libnvidia-opticalflow.so", "libnvcuvid.so"),
    "graphics": ("libnvidia-eglcore.so", "libnvidia-glcore.so", "libnvidia-tls.so",
                 "libnvidia-glsi.so", "libnvidia-fbc.so", "libnvidia-ifr.so", "libnvidia-rtcore.so",
                 "libnvoptix.so", "libGLX_nvidia.so", "libEGL_nvidia.so", "libGLESv2_nvidia.so",
                 "libGLESv1_CM_nvidia.so", "libnvidia-glvkspirv.so", "libnvidia-cbl.so"),
    "ngx": ("libnvidia-ngx.so",),
}
BINARIES = {
    "utility": ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager"),
    "compute": ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"),
}
IPC = {
    "utility": ("/var/run/nvidia-persistenced/socket", "/var/run/nvidia-fabricmanager/socket"),
    "compute": ("/tmp/nvidia-mps",),
}
# The loaders' configuration files, by capability: where a host keeps them (Debian's layout
# first, then /etc's), bound at the same path. Each names its library by SONAME (Debian's
# do), which the container's ld.so.cache resolves: nothing in them needs rewriting.
CONFIGS = {
    "graphics": ("/usr/share/vulkan/icd.d/nvidia_icd.json", "/etc/vulkan/icd.d/nvidia_icd.json",
                 "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
                 "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
                 "/usr/share/glvnd/egl_vendor.d/10_nvidia.json", "/etc/glvnd/egl_vendor.d/10_nvidia.json"),
    "compute": ("/etc/OpenCL/vendors/nvidia.icd",),
}
EGL_PLATFORMS = ("/usr/share/egl/egl_external_platform.d", "/etc/egl/egl_external_platform.d")
# Extra links nvidia-container-cli creates: (capability, link name, what it points to)
EXTRA_LINKS = (
    ("compute", "libcuda.so", "libcuda.so.1"),
    ("graphics", "libGLX_indirect.so.0", "libGLX_nvidia.so.{version}"),
    ("video", "libnvidia-opticalflow.so", "libnvidia-opticalflow.so.1"),
)


class Layout(msgspec.Struct, frozen=True):
    """Where things go in this rootfs."""

    lib64: str  # e.g. /usr/lib/x86_64-linux-gnu or /usr/lib64
    lib32: str  # e.g. /usr/lib/i386-linux-gnu, /usr/lib32 or /usr/lib
    bin: str = "/usr/bin"


def layout_of(rootfs: str) -> Layout:
    """Debian-like roots (``/etc/debian_version``) use multiarch dirs, others lib64."""
    if exists_in_root(rootfs, "etc/debian_version"):
        return Layout("/usr/lib/x86_64-linux-gnu", "/usr/lib/i386-linux-gnu")
    return Layout("/usr/lib64", "/usr/lib32" if exists_in_root(rootfs, "usr/lib32") else "/usr/lib")


class Plan(msgspec.Struct, frozen=True):
    driver: dict[str, str | None]
    gpus: list[Gpu]
    actions: list[A.AnyAction]


def select_gpus(request: GpuRequest, inventory: Inventory) -> list[Gpu]:
    """The GPUs ``request.devices`` names: indices, GPU-UUIDs, PCI bus ids; any unknown
    entry (MIG devices included: none exist under this driver root) is an error."""
    if request.devices == ("all",):
        return list(inventory.gpus)
    chosen: list[Gpu] = []
    for entry in request.devices:
        gpu = _find_gpu(entry, inventory.gpus, by_minor=request.source == "linux.devices")
        if gpu is None:
            raise RequestError(f"{request.source}: unknown device {entry!r} "
                               f"({len(inventory.gpus)} GPUs under {inventory.dev_root})")
        if gpu not in chosen:
            chosen.append(gpu)
    return chosen


_INDEX = re.compile(r"[0-9]{1,9}")  # ASCII only: int() would take "١", "０" and "²" too
_BUSID = re.compile(r"([0-9a-f]{1,8}):([0-9a-f]{2}:[0-9a-f]{2}\.[0-7])")


def _norm_busid(busid: str) -> str | None:
    """A PCI bus id with its domain widened to 8 digits (0000:3b:00.0 -> 00000000:3b:00.0)."""
    m = _BUSID.fullmatch(busid.lower())
    return f"{int(m.group(1), 16):08x}:{m.group(2)}" if m else None


def _find_gpu(entry: str, gpus: list[Gpu], by_minor: bool) -> Gpu | None:
    index = int(entry) if _INDEX.fullmatch(entry) else None
    busid = _norm_busid(entry) if entry.count(":") == 2 else None
    for g in gpus:
        if index is not None and index == (g.minor if by_minor else g.index):
            return g
        if entry.upper().startswith("GPU-") and entry.lower() == g.uuid.lower():
            return g
        if busid is not None and busid == _norm_busid(g.busid):
            return g
    return None


def library_caps(caps: frozenset[str]) -> frozenset[str]:
    """The capabilities whose libraries (and links) come along: video needs the compute
    libraries, display the graphics ones."""
    return caps | ({"compute"} if "video" in caps else set()) | ({"graphics"} if "display" in caps else set())


def _selected_libs(inventory: Inventory, caps: frozenset[str]) -> list[DriverLib]:
    prefixes = tuple(p for cap in library_caps(caps) for p in LIBRARIES.get(cap, ()))
    picked: dict[tuple[str, int], DriverLib] = {}
    for lib in inventory.libraries:
        is64 = bool(lib.flags & FLAG_REQUIRED_MASK)
        if (is64 or "compat32" in caps) and lib.key.startswith(prefixes):
            picked.setdefault((lib.path, lib.flags), lib)
    return list(picked.values())


def _closure(inventory: Inventory, roots: list[DriverLib]) -> Iterator[tuple[DriverLib, str | None]]:
    """Each library once, with its SONAME, then every driver library it needs (DT_NEEDED),
    breadth first. System libraries (libc, libX11 ...) are left to the image."""
    by_key = {(lib.key, lib.flags): lib for lib in inventory.libraries}
    queue = list(roots)
    seen = {(lib.path, lib.flags) for lib in roots}
    while queue:
        lib = queue.pop(0)
        info = read_elf(lib.path)
        yield lib, info.soname
        for name in info.needed:
            dep = by_key.get((name, lib.flags))
            if dep is not None and (dep.path, dep.flags) not in seen:
                seen.add((dep.path, dep.flags))
                queue.append(dep)


def config_files(inventory: Inventory, caps: frozenset[str]) -> list[str]:
    """The loaders' files of ``caps`` the driver root has (regular files only)."""
    out = []
    for cap in sorted(caps & CONFIGS.keys()):
        out += [p for p in CONFIGS[cap] if _is_file(inventory.host(p))]
    if "graphics" in caps:
        for d in EGL_PLATFORMS:
            host = inventory.host(d)
            if host is not None and os.path.isdir(host):
                out += [f"{d}/{n}" for n in sorted(os.listdir(host))
                        if "nvidia" in n and n.endswith(".json") and _is_file(inventory.host(f"{d}/{n}"))]
    return out


def _is_file(path: str | None) -> bool:
    return path is not None and os.path.isfile(path) and not os.path.islink(path)


def imex_channels(request: GpuRequest, inventory: Inventory) -> list[str]:
    """The IMEX channel nodes NVIDIA_IMEX_CHANNELS asks for (all: every one the host has);
    one the host lacks is an error."""
    from mounts.driver import IMEX_DIR

    have = sorted((n for n in inventory.devices if n.startswith(IMEX_DIR + "/")),
                  key=lambda n: int(n.rsplit("channel", 1)[1]))
    if request.imex == ("all",):
        return have
    for ch in request.imex:
        if f"{IMEX_DIR}/channel{ch}" not in have:
            raise RequestError(f"NVIDIA_IMEX_CHANNELS: channel {ch} not found "
                               f"({inventory.dev_root}/dev/{IMEX_DIR}/channel{ch})")
    return [f"{IMEX_DIR}/channel{ch}" for ch in request.imex]


def iter_plan(request: GpuRequest, inventory: Inventory, layout: Layout,
              gpus: list[Gpu] | None = None) -> Iterator[A.AnyAction]:
    """The actions for ``request`` (on ``gpus``, selected here unless given), in streaming
    order. Raises RequestError first if the request cannot be met (unknown device, failed
    requirement)."""
    if gpus is None:
        gpus = select_gpus(request, inventory)
    check_requirements(request, inventory.version, inventory.cuda_version,
                       [brand_of(g.model) for g in gpus], [])
    caps = request.capabilities

    # Device nodes: control nodes for every GPU container, then the selected GPUs.
    names = ["nvidiactl"]
    if "compute" in caps or "video" in caps:
        names += ["nvidia-uvm", "nvidia-uvm-tools"]
    if "display" in caps:
        names.append("nvidia-modeset")
    names += [f"nvidia{g.minor}" for g in gpus]
    names += imex_channels(request, inventory)
    for name in names:
        node = inventory.devices.get(name)
        if node is None:
            if name == "nvidiactl" or name.startswith("nvidia") and name[6:].isdigit():
                raise RequestError(f"{inventory.dev_root}/dev/{name}: device node missing")
            continue
        yield A.Device(node.source, node.path, A.RO_DEV, node.major, node.minor)

    # Libraries and their links, as the closure finds them.
    entries: list[Entry] = []
    made: dict[str, int] = {}  # container paths of libraries and links -> cache flags
    for lib, soname in _closure(inventory, _selected_libs(inventory, caps)):
        libdir = layout.lib64 if lib.flags & FLAG_REQUIRED_MASK else layout.lib32
        yield A.Library(lib.path, f"{libdir}/{lib.name}", A.RO_LIB)
        made[f"{libdir}/{lib.name}"] = lib.flags
        key = soname or lib.name
        if key != lib.name:
            yield A.Symlink(lib.name, f"{libdir}/{key}")
            made[f"{libdir}/{key}"] = lib.flags
        entries.append(Entry(key, f"{libdir}/{key}", lib.flags))
    lib_caps = library_caps(caps)
    for cap, link, to in EXTRA_LINKS:
        to = to.format(version=inventory.version)
        flags = made.get(f"{layout.lib64}/{to}")
        if cap in lib_caps and flags is not None:
            yield A.Symlink(to, f"{layout.lib64}/{link}")
            entries.append(Entry(link, f"{layout.lib64}/{link}", flags))

    for cap in sorted(caps & BINARIES.keys()):
        for name in BINARIES[cap]:
            path = inventory.find_binary(name)
            if path is not None:
                yield A.Binary(path, f"{layout.bin}/{name}", A.RO_LIB)

    for target, host in inventory.firmware.items():
        yield A.Firmware(host, target, A.RO_LIB)

    for target in config_files(inventory, lib_caps):
        yield A.Config(inventory.host(target), target, A.RO_LIB)

    for cap in sorted(caps & IPC.keys()):
        for path in IPC[cap]:
            host = inventory.host(path)
            if host is not None:
                yield A.Ipc(host, path, A.IPC)

    procdir = resolve_in_root(inventory.dev_root, "proc/driver/nvidia")
    if procdir is not None and os.path.isdir(procdir):
        yield A.ProcFs(procdir, "/proc/driver/nvidia", ("nosuid", "nodev", "noexec"),
                       tuple(g.busid for g in gpus))

    if entries:
        yield A.LdCache("", "/etc/ld.so.cache", A.RO_LIB, tuple(entries))


def compute_plan(request: GpuRequest | None, inventory: Inventory | None, layout: Layout) -> Plan:
    if request is None or inventory is None:
        return Plan({}, [], [])
    gpus = select_gpus(request, inventory)
    actions = list(iter_plan(request, inventory, layout, gpus))
    driver = {"version": inventory.version, "cuda": inventory.cuda_version, "root": inventory.root,
              "dev_root": inventory.dev_root}
    return Plan(driver, gpus, actions)
