"""Apply one GPU action of the plan inside the root: bind a checked source, make a link,
write the container's ld.so.cache, populate /proc/driver/nvidia."""

from __future__ import annotations

import errno
import os
import stat

from gofer import syscalls as sc
from gofer.root import O_PATH_DIR, Root
from mounts import actions as A
from mounts import ldcache
from mounts.errors import LdCacheError, MountError
from mounts.paths import opened_at

_EXPECT = {  # what each kind's source must be, checked on the opened fd (no TOCTOU)
    "library": (stat.S_ISREG, "a regular file"),
    "binary": (stat.S_ISREG, "a regular file"),
    "firmware": (stat.S_ISREG, "a regular file"),
    "config": (stat.S_ISREG, "a regular file"),
    "device": (stat.S_ISCHR, "a char device"),
    "ipc": (lambda m: stat.S_ISSOCK(m) or stat.S_ISDIR(m), "a socket or a directory"),
}


def open_source(action: A.Action) -> tuple[int, os.stat_result]:
    """Open the host source with O_NOFOLLOW and check its type (and numbers, for devices)."""
    try:
        fd = os.open(action.source, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise MountError(action.target, f"source {action.source}: {e.strerror}") from None
    st = os.fstat(fd)
    test, want = _EXPECT[action.kind]
    problem = None
    if not test(st.st_mode):
        problem = f"is not {want}"
    elif not opened_at(fd, action.source, sc.PROC):
        problem = "changed since it was planned (a directory on the way became a link)"
    elif isinstance(action, A.Device) and (os.major(st.st_rdev), os.minor(st.st_rdev)) != (action.major, action.minor):
        problem = (f"is char {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}, "
                   f"expected {action.major}:{action.minor}")
    if problem:
        os.close(fd)
        raise MountError(action.target, f"source {action.source} {problem}")
    return fd, st


def apply(root: Root, action: A.AnyAction) -> None:
    match action:
        case A.Symlink():
            root.symlink(action.target, action.source)
        case A.LdCache():
            write_ldcache(root, action)
        case A.ProcFs():
            proc_driver(root, action)
        case A.Config(data=str(content)):
            bind_content(root, content.encode(), action.target, action.flags)
        case _:
            src, st = open_source(action)
            try:
                root.bind(src, action.target, action.flags, is_dir=stat.S_ISDIR(st.st_mode))
            finally:
                os.close(src)


MAX_IMAGE_CACHE = 64 << 20  # an image's ld.so.cache larger than this is not read


def write_ldcache(root: Root, action: A.LdCache) -> None:
    """The image's cache (read through the root, never trusted: a malformed or huge one
    counts as empty, as glibc would ignore it) plus our entries, written by our own writer
    into the private scratch tmpfs and bound read-only over /etc/ld.so.cache. Nothing from
    the image runs, ldconfig least of all (CVE-2024-0136, CVE-2025-23267)."""
    data = None
    try:
        # a FIFO or device planted as /etc/ld.so.cache is never opened for reading
        path = root.open(action.target)
        try:
            fd = sc.open_regular(path)
        finally:
            os.close(path)
        if fd is not None:
            with os.fdopen(fd, "rb") as f:
                image = f.read(MAX_IMAGE_CACHE + 1)
            if len(image) <= MAX_IMAGE_CACHE:
                data = ldcache.extend(image, list(action.entries), action.target)
    except (OSError, LdCacheError):
        pass
    if data is None:
        data = ldcache.build(list(action.entries))
    bind_content(root, data, action.target, action.flags)


def bind_content(root: Root, data: bytes, target: str, flags: tuple[str, ...]) -> None:
    """A new file of ``data`` in the private scratch tmpfs (named by a count: never by the
    target), bound over ``target``."""
    root.scratch_files += 1
    name = f"file{root.scratch_files}"
    s = root.scratch()
    fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644, dir_fd=s)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    src = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=s)
    try:
        root.bind(src, target, flags)
    finally:
        os.close(src)


def proc_driver(root: Root, action: A.ProcFs) -> None:
    """On a host whose container /proc has driver/nvidia: a tmpfs there with copies of
    version, params (ModifyDeviceFiles: 0, so the driver never mknods in the container) and
    registry, and the selected GPUs' directories bound read-only. Skipped where the kernel
    module is absent (the container's procfs has no driver/nvidia to cover)."""
    try:
        fd = root.open(action.target, O_PATH_DIR)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return
        raise
    os.close(fd)
    # Every source is opened beneath the driver's proc directory without following any link
    # (a real procfs has none there): a dev root's symlink must not lead to a host file.
    base = os.open(action.source, O_PATH_DIR | os.O_NOFOLLOW)
    try:
        if not opened_at(base, action.source, sc.PROC):
            raise MountError(action.target, f"source {action.source} changed since it was planned "
                                            "(a directory on the way became a link)")
        _proc_tmpfs(root, action, base)
    finally:
        os.close(base)


MAX_PROC_FILE = 1 << 20


def _beneath(base: int, rel: str, where: str) -> int:
    try:
        return sc.openat2(base, rel, os.O_PATH, sc.RESOLVE_BENEATH | sc.RESOLVE_NO_SYMLINKS, what=where)
    except OSError as e:
        raise MountError(where, f"source {rel}: {e.strerror}: not a plain file or directory of the "
                                "driver's proc directory") from None


def _proc_tmpfs(root: Root, action: A.ProcFs, base: int) -> None:
    tmp = root.mount_fs("tmpfs", "tmpfs", action.target, sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC, "mode=0555")
    root.mark_writable(tmp)
    for name in ("version", "params", "registry"):
        try:
            path = sc.openat2(base, name, os.O_PATH, sc.RESOLVE_BENEATH | sc.RESOLVE_NO_SYMLINKS)
        except FileNotFoundError:
            continue
        try:
            fd = sc.open_regular(path)  # a FIFO would hang us, a device never end
        finally:
            os.close(path)
        if fd is None:
            raise MountError(f"{action.target}/{name}", f"source {action.source}/{name} is not a regular file")
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_PROC_FILE)
        if name == "params":
            data = data.replace(b"ModifyDeviceFiles: 1", b"ModifyDeviceFiles: 0")
        out = os.open(name, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o444, dir_fd=tmp)
        with os.fdopen(out, "wb") as w:
            w.write(data)
    for rel, is_dir in [(f"gpus/{busid}", True) for busid in action.gpus] + [(f, False) for f in action.files]:
        src = _beneath(base, rel, f"{action.target}/{rel}")
        try:
            if not (stat.S_ISDIR if is_dir else stat.S_ISREG)(os.fstat(src).st_mode):
                raise MountError(f"{action.target}/{rel}", f"source {action.source}/{rel} is not a "
                                 f"{'directory' if is_dir else 'regular file'}")
            root.bind(src, f"{action.target}/{rel}", ("ro", "nosuid", "nodev", "noexec"), is_dir=is_dir)
        finally:
            os.close(src)
    sc.mount(None, sc.fdpath(tmp), None, sc.MS_REMOUNT | sc.MS_RDONLY | sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC)
