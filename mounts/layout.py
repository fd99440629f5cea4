"""The image's side of the plan: where a rootfs keeps its libraries and binaries, and the
CUDA forward-compatibility libraries it ships. Read from the image's names and links only
(no file is opened), before the plan."""

from __future__ import annotations

import os
import re

import msgspec

from mounts.paths import exists_in_root, resolve_in_root

CUDA_COMPAT = "/usr/local/cuda/compat"  # where CUDA images keep the forward-compatible driver


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
        if target is None or os.path.dirname(target) != host or not (os.path.isfile(target) and not os.path.islink(target)):
            continue
        m = _COMPAT_CUDA.fullmatch(os.path.basename(target))
        if m and name == "libcuda.so.1":
            version = m.group(1)
        if _SONAME_LINK.fullmatch(name) and os.path.islink(os.path.join(host, name)):
            links.append(name)
    return (version, tuple(links)) if version else (None, ())

