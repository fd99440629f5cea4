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
from typing import TypeGuard

import msgspec

from mounts import actions as A
from mounts.driver import DriverLib, Gpu, Inventory, Mig, dri_link
from mounts.elf import read_elf
from mounts.errors import DriverError, RequestError
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
                 "libGLESv1_CM_nvidia.so", "libnvidia-glvkspirv.so", "libnvidia-cbl.so",
                 "libnvidia-egl-wayland.so", "libnvidia-egl-gbm.so", "libnvidia-egl-xcb.so",
                 "libnvidia-egl-xlib.so"),
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
                 "/usr/share/glvnd/egl_vendor.d/10_nvidia.json", "/etc/glvnd/egl_vendor.d/10_nvidia.json",
                 "/usr/share/nvidia/nvoptix.bin"),
    "compute": ("/etc/OpenCL/vendors/nvidia.icd",),
}
# Xorg's driver and GLX modules (display): where Xorg looks, then Debian's own directory
# (its alternatives link the first to the second). Bound where Xorg looks.
XORG_MODULES = (
    ("/usr/lib/xorg/modules/drivers/nvidia_drv.so", "/usr/lib/nvidia/current/nvidia_drv.so"),
    ("/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{version}",
     "/usr/lib/nvidia/current/libglxserver_nvidia.so.{version}"),
)
CUDA_COMPAT = "/usr/local/cuda/compat"  # where CUDA images keep the forward-compatible driver
EGL_PLATFORMS = ("/usr/share/egl/egl_external_platform.d", "/etc/egl/egl_external_platform.d")
_PLATFORM_FILE = re.compile(r"[A-Za-z0-9_.+-]{0,100}nvidia[A-Za-z0-9_.+-]{0,100}\.json")  # (never a "::")
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
    compat_version: str | None = None  # the version of the image's CUDA_COMPAT libcuda, if any
    compat: tuple[str, ...] = ()  # the SONAME links there (libcuda.so.1 ...)


def layout_of(rootfs: str) -> Layout:
    """Debian-like roots (``/etc/debian_version``) use multiarch dirs, others lib64. The
    image's CUDA forward-compatibility libraries are listed, never opened: only names and
    link targets inside the rootfs are read."""
    version, links = _compat_of(rootfs)
    if exists_in_root(rootfs, "etc/debian_version"):
        return Layout("/usr/lib/x86_64-linux-gnu", "/usr/lib/i386-linux-gnu", compat_version=version, compat=links)
    return Layout("/usr/lib64", "/usr/lib32" if exists_in_root(rootfs, "usr/lib32") else "/usr/lib",
                  compat_version=version, compat=links)


_COMPAT_CUDA = re.compile(r"libcuda\.so\.([0-9]{1,6}\.[0-9]{1,6}(?:\.[0-9]{1,6})?)")
_SONAME_LINK = re.compile(r"lib[A-Za-z0-9_+-]{1,64}(?:\.[A-Za-z0-9_+-]{1,64})*\.so\.[0-9]{1,4}")


def _compat_of(rootfs: str) -> tuple[str | None, tuple[str, ...]]:
    """(version, SONAME links) of the libcuda in the image's CUDA_COMPAT directory: the
    version from the real file's name (libcuda.so.545.23.08, as the package names it), the
    links those whose target is a regular file in the same directory."""
    host = resolve_in_root(rootfs, CUDA_COMPAT.lstrip("/"))
    if host is None or not os.path.isdir(host) or os.path.islink(host):
        return None, ()
    try:
        names = sorted(os.listdir(host))
    except OSError:
        return None, ()
    version, links = None, []
    for name in names:
        target = resolve_in_root(rootfs, f"{CUDA_COMPAT.lstrip('/')}/{name}")
        if target is None or os.path.dirname(target) != host or not _is_file(target):
            continue
        m = _COMPAT_CUDA.fullmatch(os.path.basename(target))
        if m and name == "libcuda.so.1":
            version = m.group(1)
        if _SONAME_LINK.fullmatch(name) and os.path.islink(os.path.join(host, name)):
            links.append(name)
    return (version, tuple(links)) if version else (None, ())


class Plan(msgspec.Struct, frozen=True):
    driver: dict[str, str | None]
    gpus: list[Gpu]
    actions: list[A.AnyAction]
    migs: list[Mig] = []


def select_gpus(request: GpuRequest, inventory: Inventory) -> list[Gpu]:
    """The whole GPUs ``request.devices`` names: indices, GPU-UUIDs, PCI bus ids (MIG
    devices are select_migs'); any unknown entry is an error."""
    if request.devices == ("all",):
        return list(inventory.gpus)
    by_minor = request.source == "linux.devices"
    return _pick(request, [e for e in request.devices if not is_mig(e)],
                 lambda e: _find_gpu(e, inventory.gpus, by_minor), "device", f"{len(inventory.gpus)} GPUs",
                 inventory.dev_root)


def _pick(request: GpuRequest, entries: list[str], find, what: str, have: str, where: str) -> list:
    """What each entry names (once each, in order); one that names nothing is an error."""
    chosen = []
    for entry in entries:
        found = find(entry)
        if found is None:
            raise RequestError(f"{request.source}: unknown {what} {entry!r} ({have} under {where})")
        if found not in chosen:
            chosen.append(found)
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


_MIG_INDEX = re.compile(r"([0-9]{1,9}):([0-9]{1,4})")  # nvidia-container-cli's GPU:MIG-device-index
_MIG_IDS = re.compile(r"([0-9]{1,9}):([0-9]{1,4}):([0-9]{1,4})")  # ours: GPU:GI:CI
_MIG_LEGACY = re.compile(r"MIG-(GPU-[0-9a-fA-F-]{1,64})/([0-9]{1,4})/([0-9]{1,4})")


def is_mig(entry: str) -> bool:
    return entry.startswith("MIG-") or bool(_MIG_INDEX.fullmatch(entry) or _MIG_IDS.fullmatch(entry))


def select_migs(request: GpuRequest, inventory: Inventory) -> list[Mig]:
    """The MIG devices ``request.devices`` names: ``GPU:GI:CI`` (the GPU's index, then the
    instance ids) and ``MIG-GPU-<uuid>/<gi>/<ci>`` from the driver's files; ``MIG-<uuid>`` and
    ``GPU:N`` (the N-th MIG device in NVML's order, as nvidia-container-cli counts them) from
    NVML (mounts/nvml.py). A name that matches no MIG device is an error. ``all`` means
    whole GPUs, never MIG devices."""
    entries = [e for e in request.devices if is_mig(e)] if request.devices != ("all",) else []
    return _pick(request, entries, lambda e: _find_mig(e, inventory), "MIG device",
                 f"{len(inventory.migs)} MIG devices", inventory.dev_root)


def _find_mig(entry: str, inventory: Inventory) -> Mig | None:
    if m := _MIG_IDS.fullmatch(entry):
        gpu = next((g for g in inventory.gpus if g.index == int(m.group(1))), None)
        where = (gpu.minor, int(m.group(2)), int(m.group(3))) if gpu else None
    elif m := _MIG_LEGACY.fullmatch(entry):
        gpu = next((g for g in inventory.gpus if g.uuid.lower() == m.group(1).lower()), None)
        where = (gpu.minor, int(m.group(2)), int(m.group(3))) if gpu else None
    else:
        from mounts.nvml import mig_lookup

        if m := _MIG_INDEX.fullmatch(entry):
            gpu = next((g for g in inventory.gpus if g.index == int(m.group(1))), None)
            where = mig_lookup(inventory, entry, gpu.busid, int(m.group(2))) if gpu else None
        else:
            where = mig_lookup(inventory, entry)
    return next((x for x in inventory.migs if (x.minor, x.gi, x.ci) == where), None)


def mig_nodes(request: GpuRequest, inventory: Inventory, gpus: list[Gpu], migs: list[Mig]) -> list[tuple[str, str]]:
    """(device name, /proc/driver/nvidia file) pairs the MIG devices and the
    NVIDIA_MIG_CONFIG_DEVICES / NVIDIA_MIG_MONITOR_DEVICES capabilities need. Those two are
    the toolkit's: ``all`` only, for a container of whole GPUs (configuring MIG reshapes
    every tenant's slices of them)."""
    out = []
    for x in migs:
        gi_file, ci_file = x.proc_files
        out += [(f"nvidia-caps/nvidia-cap{x.gi_cap}", gi_file), (f"nvidia-caps/nvidia-cap{x.ci_cap}", ci_file)]
    for what, wanted in (("config", request.mig_config), ("monitor", request.mig_monitor)):
        if not wanted:
            continue
        name = f"NVIDIA_MIG_{what.upper()}_DEVICES"
        if wanted != ("all",):
            raise RequestError(f"{name}: only 'all' is supported (got {','.join(wanted)!r})")
        if migs or not gpus:
            raise RequestError(f"{name}: only for a container of whole GPUs "
                               f"({'MIG devices are' if migs else 'no GPU is'} selected)")
        if what not in inventory.mig_caps:
            raise RequestError(f"{name}: the driver has no MIG {what} capability "
                               f"({inventory.dev_root}/proc/driver/nvidia/capabilities/mig/{what})")
        out.append((f"nvidia-caps/nvidia-cap{inventory.mig_caps[what]}", f"capabilities/mig/{what}"))
    return list(dict.fromkeys(out))


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


def config_files(inventory: Inventory, caps: frozenset[str]) -> list[tuple[str, str]]:
    """(path in the container, host path) of the loaders' files of ``caps`` the driver root
    has (regular files only)."""
    wanted = [p for cap in sorted(caps & CONFIGS.keys()) for p in CONFIGS[cap]]
    if "graphics" in caps:
        for d in EGL_PLATFORMS:
            host = inventory.host(d)
            if host is not None and os.path.isdir(host):
                wanted += [f"{d}/{n}" for n in sorted(os.listdir(host)) if _PLATFORM_FILE.fullmatch(n)]
    return [(p, host) for p in wanted if _is_file(host := inventory.host(p))]


MAX_LOADER_FILE = 64 << 10  # an ICD file is a few hundred bytes; a CDI hook's argument is at most 128 KiB


def loader_file(inventory: Inventory, target: str, made: dict[str, int]) -> str | None:
    """A loader's file that names its library by a host path (an ICD or layer JSON's
    ``library_path``, an OpenCL .icd line), as the container needs it: that path replaced by
    where the plan puts the 64-bit library of that name (``made``: container paths of
    libraries and links, with their cache flags), else by its file name for the container's
    ld.so.cache to resolve. None when it names its libraries by name only, as Debian's do
    (the file is bound as it is), or is no JSON we can read (bound as it is: the loader
    judges it). Read inside the driver root, as every driver file is."""
    from mounts.driver import read_file

    if not target.endswith((".json", ".icd")):
        return None
    found = read_file(inventory.root, target.lstrip("/"))
    if found is None:
        return None
    by_name = {os.path.basename(p): p for p, flags in made.items() if flags & FLAG_REQUIRED_MASK}

    def fix(path):
        if not isinstance(path, str) or not path.startswith("/"):
            return path
        name = os.path.basename(path)
        return by_name.get(name, name)

    text = found[1].decode("utf-8", "replace")
    if target.endswith(".icd"):
        lines = [line.strip() for line in text.splitlines()]
        fixed = [fix(line) for line in lines]
        data = "\n".join(fixed) + "\n" if fixed != lines else None
    else:
        data = _fix_json(text, fix)
    if data is not None and len(data) > MAX_LOADER_FILE:
        raise DriverError(f"{found[0]}: {len(data)} bytes, too large for a loader's file")
    return data


def _fix_json(text: str, fix) -> str | None:
    try:
        doc = msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    entries: list = []
    for key in ("ICD", "layer", "layers"):
        part = doc.get(key)
        entries += part if isinstance(part, list) else [part]
    changed = False
    for entry in entries:
        if isinstance(entry, dict) and fix(entry.get("library_path")) != entry.get("library_path"):
            entry["library_path"] = fix(entry["library_path"])
            changed = True
    return msgspec.json.encode(doc).decode() + "\n" if changed else None


def _is_file(path: str | None) -> TypeGuard[str]:
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
              gpus: list[Gpu] | None = None, migs: list[Mig] | None = None) -> Iterator[A.AnyAction]:
    """The actions for ``request`` (on ``gpus`` and ``migs``, selected here unless given:
    a MIG name may cost an NVML start), in streaming order. Raises RequestError first if the
    request cannot be met (unknown device, failed requirement)."""
    if gpus is None:
        gpus = select_gpus(request, inventory)
    if migs is None:
        migs = select_migs(request, inventory)
    # a MIG device's parent GPU: its node, its /proc directory; never its DRI nodes
    parents = [g for g in inventory.gpus if g not in gpus and any(x.minor == g.minor for x in migs)]
    check_requirements(request, inventory.version, inventory.cuda_version,
                       [brand_of(g.model) for g in gpus + parents], [])
    caps = request.capabilities
    lib_caps = library_caps(caps)
    caps_files = mig_nodes(request, inventory, gpus, migs)

    # Device nodes: control nodes for every GPU container, then the selected GPUs.
    names = ["nvidiactl"]
    if "compute" in caps or "video" in caps:
        names += ["nvidia-uvm", "nvidia-uvm-tools"]
    if "display" in caps:
        names.append("nvidia-modeset")
    required = ["nvidiactl"] + [f"nvidia{g.minor}" for g in gpus + parents] + [n for n, _file in caps_files]
    names += required[1:] + imex_channels(request, inventory)
    dri = [n for g in gpus for n in inventory.dri.get(g.busid, ())] if "graphics" in lib_caps else []
    for name in names + dri:
        node = inventory.devices.get(name)
        if node is None:
            if name in required:
                raise RequestError(f"{inventory.dev_root}/dev/{name}: device node missing")
            continue
        yield A.Device(node.source, node.path, A.RO_DEV, node.major, node.minor)
    for g in gpus if dri else ():  # udev's by-path links, which the loaders look up by bus id
        for name in inventory.dri.get(g.busid, ()):
            yield A.Symlink("../" + name.rpartition("/")[2], "/dev/dri/" + dri_link(g.busid, name.rpartition("/")[2]))

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

    host: str | None
    for target, host in inventory.firmware.items():
        yield A.Firmware(host, target, A.RO_LIB)

    for target, host in config_files(inventory, lib_caps):
        yield A.Config(host, target, A.RO_LIB, loader_file(inventory, target, made))
    if "display" in caps:
        for target, debian in XORG_MODULES:
            target, debian = target.format(version=inventory.version), debian.format(version=inventory.version)
            host = next((h for p in (target, debian) if _is_file(h := inventory.host(p))), None)
            if host is not None:
                yield A.Library(host, target, A.RO_LIB)
                if target.endswith("." + inventory.version):  # Xorg loads libglxserver_nvidia.so
                    name = target.rpartition("/")[2]
                    yield A.Symlink(name, target[:-len(inventory.version) - 1])

    for cap in sorted(caps & IPC.keys()):
        for path in IPC[cap]:
            host = inventory.host(path)
            if host is not None:
                yield A.Ipc(host, path, A.IPC)

    procdir = resolve_in_root(inventory.dev_root, "proc/driver/nvidia")
    if procdir is not None and os.path.isdir(procdir):
        yield A.ProcFs(procdir, "/proc/driver/nvidia", ("nosuid", "nodev", "noexec"),
                       tuple(g.busid for g in gpus + parents), tuple(f for _name, f in caps_files))

    if entries:
        yield A.LdCache("", "/etc/ld.so.cache", A.RO_LIB, tuple(compat_first(entries, inventory, layout)))


def compat_first(entries: list[Entry], inventory: Inventory, layout: Layout) -> list[Entry]:
    """CUDA forward compatibility: when the image's CUDA_COMPAT libcuda is of a newer
    driver branch than the host's, its SONAME links take the place of ours in the cache (as
    nvidia-ctk's enable-cuda-compat puts that directory first for ldconfig). Only the cache
    changes: nothing of the image is mounted, on the host or anywhere."""
    if layout.compat_version is None or int(layout.compat_version.split(".")[0]) <= int(inventory.version.split(".")[0]):
        return entries
    flags = next((e.flags for e in entries if e.key == "libcuda.so.1"), None)
    if flags is None:  # no libcuda of ours to replace: not a compute container
        return entries
    compat = [Entry(name, f"{CUDA_COMPAT}/{name}", flags) for name in layout.compat]
    keys = {(e.key, e.flags) for e in compat}
    return compat + [e for e in entries if (e.key, e.flags) not in keys]


def compute_plan(request: GpuRequest | None, inventory: Inventory | None, layout: Layout) -> Plan:
    if request is None or inventory is None:
        return Plan({}, [], [])
    gpus, migs = select_gpus(request, inventory), select_migs(request, inventory)
    actions = list(iter_plan(request, inventory, layout, gpus, migs))
    driver = {"version": inventory.version, "cuda": inventory.cuda_version, "root": inventory.root,
              "dev_root": inventory.dev_root}
    return Plan(driver, gpus, actions, migs)
