"""Driver discovery under a driver root: version, GPUs, device nodes, libraries (with their
ELF SONAME and DT_NEEDED), binaries, firmware, the loaders' files, Xorg's modules and IPC
sockets, read from files only (no NVML, nothing executed). Every fact the plan uses is
collected here: the plan itself reads nothing. This module finds the version and the
libraries and puts the inventory together; the kernel's side is mounts/driver_nodes.py's,
the files beside the libraries mounts/driver_files.py's, the inventory's Structs and the
reading of a file under the root mounts/driver_facts.py's.

The same code serves a host install (``/``), a driver container (``/run/nvidia/driver``) and
the test fixtures, because every path is read relative to the driver root.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat

from mounts import catalog, driver_files, driver_nodes, ldcache, reads
from mounts.driver_facts import (  # (Gpu, Inventory ... live there: import them from mounts.driver_facts)
    MAX_CACHE,
    POINT_AT_DRIVER,
    DriverLib,
    Inventory,
    in_root,
    plain_file,
    read_file,
    read_text,
)
from mounts.elf import read_elf
from mounts.errors import DriverError, ElfError, LdCacheError
from mounts.ldcache import FLAG_ELF_LIBC6, FLAGS_I386, FLAGS_X86_64
from mounts.paths import LinkLoop, Resolver

# ASCII digits only, and few of them: int() takes "١" and "０", and refuses 5,000 digits.
_VERSION_RE = re.compile(r"Kernel Module\s+(?:for \S+\s+)?([0-9]{1,6}\.[0-9]{1,6}(?:\.[0-9]{1,6})?)")
_LIB_VERSION_RE = re.compile(r"^lib(?:cuda|nvidia-ml)\.so\.([0-9]{1,6}\.[0-9]{1,6}(?:\.[0-9]{1,6})?)$")


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
    text = read_text(kernel, "proc/driver/nvidia/version")
    m = _VERSION_RE.search(text) if text else None
    if m:
        if from_libs is not None and from_libs[0] != m.group(1):
            raise DriverError(f"{kernel.root}/proc/driver/nvidia/version: kernel module {m.group(1)} does not "
                              f"match the driver's libraries ({from_libs[1]} is {from_libs[0]})")
        return m.group(1)
    if from_libs is not None:
        return from_libs[0]
    raise DriverError(f"{root}: no NVIDIA driver found (no proc/driver/nvidia/version, {where}): {POINT_AT_DRIVER}")


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
    text = read_text(resolver, rel)
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
            host = in_root(resolver, head)
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
        if m and (found := plain_file(resolver, f"{d}/{n}")) is not None:
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
    binaries, refused = driver_files.binaries(resolver, driver_files.bin_dirs(root, libraries, search_path), version, notes)
    gpus = driver_nodes.gpus(kernel)
    devices = driver_nodes.devices(dev_root, gpus, driver_nodes.majors(kernel))
    dri, dri_nodes = driver_nodes.dri(dev_root, gpus)
    migs, mig_caps = driver_nodes.migs(kernel, gpus)
    configs, loader_texts = driver_files.configs(resolver)
    procfs = in_root(kernel, "proc/driver/nvidia")
    return Inventory(
        root=root,
        dev_root=dev_root,
        version=version,
        gpus=gpus,
        devices=devices | dri_nodes,
        libraries=libraries,
        firmware=driver_files.firmware(resolver, kernel, version, notes),
        dri=dri,
        migs=migs,
        mig_caps=mig_caps,
        binaries=binaries,
        refused=refused,
        configs=configs,
        loader_texts=loader_texts,
        xorg=driver_files.xorg(resolver, version),
        ipc=driver_files.ipc(resolver),
        procfs=procfs if procfs is not None and reads.isdir(procfs) else None,
        libraries_from="etc/ld.so.cache" if names is None else "search of " + (", ".join(searched) or "no directory"),
        notes=tuple(notes),
    )
