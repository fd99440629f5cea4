"""A file written whole or not at all, the one way every verb writes one (state.json,
--pid-file, a spec, a bundle's config.json, an engine's config): a fresh temp name beside
it, created exclusively and never through a link, then rename(2)."""

from __future__ import annotations

import os


def replace_whole(name: str, data: bytes, mode: int = 0o644, dir_fd: int | None = None) -> None:
    """``data`` at ``name`` (relative to ``dir_fd`` if given) whole or not at all; OSError as
    it comes. The temp name is unguessable: the directory may be writable by others, who
    could plant a link at a name they can predict."""
    tmp = f"{name}.{os.urandom(8).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def write_atomically(path: str, data: bytes, what: str, mode: int = 0o644) -> None:
    """``data`` at ``path`` whole or not at all (a one-line error naming ``what``)."""
    from mounts.errors import SandboxError

    path = os.path.abspath(path)
    try:
        replace_whole(path, data, mode)
    except OSError as e:
        raise SandboxError(f"{what} {path}: {e.strerror}") from None
