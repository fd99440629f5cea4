"""The driver's files beside its libraries, under the driver root: the firmware, the
binaries (nvidia-smi and the rest, never a wrapper or another version's), the loaders'
files (Vulkan, EGL, OpenCL ICDs), Xorg's modules and the IPC sockets."""

from __future__ import annotations

import os
import re
import stat

from mounts import catalog, reads
from mounts.driver_facts import (
    DriverLib,
    in_root,
    lstat_or_none,
    plain_file,
    read_resolved,
    read_text,
)
from mounts.elf import not_an_executable
from mounts.ldcache import FLAG_REQUIRED_MASK
from mounts.paths import LinkLoop, Resolver, file_kind, opened_at, resolve_in_root

_RELEASE = re.compile(r"[A-Za-z0-9._+~-]{1,64}")


def firmware(resolver: Resolver, kernel: Resolver, version: str, notes: list[str]) -> dict[str, str]:
    """The GSP firmware of ``version``, where the kernel looks for it: firmware_class's path
    parameter (a directory of the device root's, as the kernel names it), then each of
    catalog.FIRMWARE_DIRS in the driver root (and in the device root, when that is another:
    a driver container's kernel reads the host's /lib/firmware). Per file name the first
    directory that has it wins, as in the kernel; the container sees it at that path. A
    gsp*.bin that is no regular file is passed over (noted)."""
    dirs = []
    param = (read_text(kernel, catalog.FIRMWARE_PARAM) or "").strip()
    if param.startswith("/") and "\0" not in param:
        dirs.append((kernel, "/" + os.path.normpath(param).strip("/")))
    release = (read_text(kernel, "proc/sys/kernel/osrelease") or "").strip()
    for d in catalog.FIRMWARE_DIRS:
        if "{release}" in d and not _RELEASE.fullmatch(release):
            continue
        d = d.format(release=release)
        dirs += [(resolver, d)] + ([(kernel, d)] if kernel is not resolver else [])
    found: dict[str, str] = {}
    names: set[str] = set()
    for base, d in dirs:
        target = f"{d.rstrip('/')}/nvidia/{version}"
        host = in_root(base, target)
        try:
            entries = sorted(reads.listdir(host)) if host is not None else []
        except OSError:  # not a directory
            continue
        for name in entries:
            if not (name.startswith("gsp") and name.endswith(".bin")) or name in names:
                continue
            path: str | None = f"{host}/{name}"
            st = lstat_or_none(f"{host}/{name}")
            if st is None:
                continue
            if stat.S_ISLNK(st.st_mode):  # resolved inside its root
                path = in_root(base, f"{target}/{name}")
                st = lstat_or_none(path) if path is not None else None
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


def bin_dirs(root: str, libraries: list[DriverLib], search_path: str | None) -> list[str]:
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


def binaries(resolver: Resolver, dirs: list[str], version: str,
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


def configs(resolver: Resolver) -> tuple[dict[str, str], dict[str, str]]:
    """The loaders' files the driver root has (regular files only), and the text of those
    that may name a library by a host path (.json, .icd), read as every driver file is."""
    wanted = [p for paths in catalog.CONFIGS.values() for p in paths]
    for d in catalog.EGL_PLATFORMS:
        host = resolve_in_root(resolver.root, d)
        if host is not None and reads.isdir(host):
            wanted += [f"{d}/{n}" for n in sorted(reads.listdir(host)) if catalog.PLATFORM_FILE.fullmatch(n)]
    configs = {p: host for p in wanted if (host := plain_file(resolver, p)) is not None}
    texts = {}
    for p, host in configs.items():
        if p.endswith((".json", ".icd")) and (data := read_resolved(host)) is not None:
            texts[p] = data.decode("utf-8", "replace")
    return configs, texts


def xorg(resolver: Resolver, version: str) -> dict[str, str]:
    """Xorg's modules: where Xorg looks, else in Debian's flavour directory of this driver
    (the first, current first, whose GLX module carries its version; else current)."""
    found = {}
    for target, *elsewhere in catalog.XORG_MODULES:
        target = target.format(version=version)
        host = next((h for p in (target, *elsewhere) if (h := plain_file(resolver, p.format(version=version)))), None)
        if host is not None:
            found[target] = host
    if len(found) < len(catalog.XORG_MODULES) and (flavour := _flavour(resolver, version)) is not None:
        for target, *_elsewhere in catalog.XORG_MODULES:
            target = target.format(version=version)
            host = plain_file(resolver, f"{catalog.XORG_FLAVOURS}/{flavour}/{target.rpartition('/')[2]}")
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
    if plain_file(resolver, f"{catalog.XORG_FLAVOURS}/current/{glx}"):
        return "current"
    names = sorted(reads.listdir(host))
    return next((n for n in names if plain_file(resolver, f"{catalog.XORG_FLAVOURS}/{n}/{glx}")),
                "current" if "current" in names else None)


def ipc(resolver: Resolver) -> dict[str, str]:
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
