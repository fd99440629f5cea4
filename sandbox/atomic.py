"""A file written whole or not at all, the one way every verb writes one (--pid-file, a
spec, a bundle's config.json, an engine's config): a fresh temp name beside it, created
exclusively and never through a link, then rename(2)."""

from __future__ import annotations

import os


def write_atomically(path: str, data: bytes, what: str, mode: int = 0o644) -> None:
    """``data`` at ``path`` whole or not at all (a one-line error naming ``what``)."""
    from mounts.errors import SandboxError

    path = os.path.abspath(path)
    # a fresh name, created exclusively and never through a link: the directory may be
    # writable by others, who could plant a link at a name they can guess (our pid)
    tmp = f"{path}.{os.getpid()}.{os.urandom(6).hex()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise SandboxError(f"{what} {path}: {e.strerror}") from None
