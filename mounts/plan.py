"""The mount plan: (GPU request, driver inventory, rootfs layout) in, actions out.

A pure function: every fact from disk is the inventory's (mounts/driver.py) or the layout's
(mounts/layout.py), so the plan reads no file and its tests build both by hand. The one
exception is selection's (mounts/select.py): a MIG device named the way only NVML knows.

``iter_plan`` yields the actions in a fixed order, cheapest first, so the supervisor can stream
each one to the gofer as soon as it is known: device nodes, then libraries in the order of
their DT_NEEDED closure, their links, binaries, firmware, the loaders' files, IPC, /proc, and
last the ld.so.cache that needs every library.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import msgspec

from mounts import actions as A
from mounts.catalog import (
    BINARIES,
    CONFIGS,
    EGL_PLATFORMS,
    EXTRA_LINKS,
    IPC,
    LIBRARIES,
)
from mounts.driver_facts import POINT_AT_DRIVER, DriverLib, Gpu, Inventory, Mig
from mounts.driver_nodes import IMEX_DIR, dri_link
from mounts.errors import DriverError, ElfError, RequestError
from mounts.layout import CUDA_COMPAT, Layout
from mounts.ldcache import FLAG_REQUIRED_MASK, Entry
from mounts.request import GpuRequest, brand_of, check_requirements
from mounts.select import select_gpus, select_migs


class Plan(msgspec.Struct, frozen=True):
    driver: dict[str, str | None]
    gpus: list[Gpu]
    actions: list[A.AnyAction]
    migs: list[Mig] = []
    notes: list[str] = []  # discovery's: the candidates it passed over (--debug prints them)


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
        if lib.broken is not None:
            raise ElfError(lib.broken)
        yield lib, lib.soname
        for name in lib.needed:
            dep = by_key.get((name, lib.flags))
            if dep is not None and (dep.path, dep.flags) not in seen:
                seen.add((dep.path, dep.flags))
                queue.append(dep)


def config_files(inventory: Inventory, caps: frozenset[str]) -> list[tuple[str, str]]:
    """(path in the container, host path) of the loaders' files of ``caps`` the driver root
    has."""
    wanted = [p for cap in sorted(caps & CONFIGS.keys()) for p in CONFIGS[cap]]
    if "graphics" in caps:
        wanted += sorted(p for p in inventory.configs if p.startswith(tuple(d + "/" for d in EGL_PLATFORMS)))
    return [(p, inventory.configs[p]) for p in wanted if p in inventory.configs]


MAX_LOADER_FILE = 64 << 10  # an ICD file is a few hundred bytes; a CDI hook's argument is at most 128 KiB


def loader_file(inventory: Inventory, target: str, made: dict[str, int]) -> str | None:
    """A loader's file that names its library by a host path (an ICD or layer JSON's
    ``library_path``, an OpenCL .icd line), as the container needs it: that path replaced by
    where the plan puts the 64-bit library of that name (``made``: container paths of
    libraries and links, with their cache flags), else by its file name for the container's
    ld.so.cache to resolve. None when it names its libraries by name only, as Debian's do
    (the file is bound as it is), or is no JSON we can read (bound as it is: the loader
    judges it)."""
    text = inventory.loader_texts.get(target)
    if text is None:
        return None
    by_name = {os.path.basename(p): p for p, flags in made.items() if flags & FLAG_REQUIRED_MASK}

    def fix(path):
        if not isinstance(path, str) or not path.startswith("/"):
            return path
        name = os.path.basename(path)
        return by_name.get(name, name)

    if target.endswith(".icd"):
        lines = [line.strip() for line in text.splitlines()]
        fixed = [fix(line) for line in lines]
        data = "\n".join(fixed) + "\n" if fixed != lines else None
    else:
        data = _fix_json(text, fix)
    if data is not None and len(data) > MAX_LOADER_FILE:
        raise DriverError(f"{inventory.configs[target]}: {len(data)} bytes, too large for a loader's file")
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


def imex_channels(request: GpuRequest, inventory: Inventory) -> list[str]:
    """The IMEX channel nodes NVIDIA_IMEX_CHANNELS asks for (all: every one the host has);
    one the host lacks is an error."""
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

    for cap in sorted(caps & BINARIES.keys()):  # the driver's ELF executables, where images run them by PATH
        for name in BINARIES[cap]:
            path = inventory.binaries.get(name)
            if path is not None:
                yield A.Binary(path, f"{layout.bin}/{name}", A.RO_LIB)
            elif name in inventory.refused:  # a wrapper alone: bound, it would exec what the container lacks
                raise DriverError(f"{name}: no ELF executable of the driver's found, only {inventory.refused[name]}: "
                                  f"{POINT_AT_DRIVER}")

    for target, host in inventory.firmware.items():
        yield A.Firmware(host, target, A.RO_LIB)

    for target, host in config_files(inventory, lib_caps):
        yield A.Config(host, target, A.RO_LIB, loader_file(inventory, target, made))
    if "display" in caps:
        for target, host in inventory.xorg.items():
            yield A.Library(host, target, A.RO_LIB)
            if target.endswith("." + inventory.version):  # Xorg loads libglxserver_nvidia.so
                name = target.rpartition("/")[2]
                yield A.Symlink(name, target[:-len(inventory.version) - 1])

    for cap in sorted(caps & IPC.keys()):
        for path in IPC[cap]:
            if path in inventory.ipc:
                yield A.Ipc(inventory.ipc[path], path, A.IPC)

    if inventory.procfs is not None:
        yield A.ProcFs(inventory.procfs, "/proc/driver/nvidia", ("nosuid", "nodev", "noexec"),
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
              "dev_root": inventory.dev_root, "libraries_from": inventory.libraries_from}
    return Plan(driver, gpus, actions, migs, list(inventory.notes))
