"""Host directories that only root can change: what the warm server keeps beside its socket
(the socket itself, gofer/seccomp.py's filter cache) is used only from a directory reached
from / through directories and links no other user can rename, replace or write into.

The parent alone is not enough: with /tmp/a another user's and the socket at
/tmp/a/srv/s.sock, that user renames srv away, makes a srv of their own, links the socket
back into it, and a filter cache below it is theirs to swap files in. So every component is
checked, from / down, as OpenSSH's safe_path checks a key's directories: a directory must be
root's and writable by neither group nor others, but for a sticky one of root's on the way
(/tmp: no one else may rename or remove root's entries in it) that is not the last; a link
must be root's, and where it leads is checked the same way. Reads only; the walk goes by
fds, each component opened without following a link, so what is checked is what is used."""

from __future__ import annotations

import errno
import os
import stat

from mounts.errors import SandboxError

MAX_LINKS = 40


class UntrustedPath(SandboxError):
    """A directory another user could change is on the way: names the path and the component."""


def _fault(st: os.stat_result, last: bool) -> str | None:
    """What makes a directory (or link) untrusted, or None."""
    if st.st_uid != 0:
        return f"owned by uid {st.st_uid}"
    if stat.S_ISLNK(st.st_mode):
        return None
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_mode & 0o022 and (last or not st.st_mode & stat.S_ISVTX):
        return f"writable by {'others' if st.st_mode & 0o002 else 'its group'} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def open_root_only(path: str, what: str, why: str, leaf: bool = True) -> int:
    """An O_RDONLY fd of the directory ``path`` (absolute), every directory and link on the
    way root's and writable by no one else (see above); UntrustedPath naming ``what`` (the
    flag or file it is for), the component at fault and ``why`` it matters; FileNotFoundError
    where a component is missing. ``leaf``: files are kept in ``path`` itself, which may
    then not be a sticky directory others write either (False: directories of root's are
    to be made in it)."""
    if not os.path.isabs(path):
        raise UntrustedPath(f"{what}: {path} is not an absolute path")
    todo = [c for c in path.split("/") if c not in ("", ".")]
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    here, links = "/", 0
    try:
        _check(fd, here, leaf and not todo, what, why)
        while todo:
            name = todo.pop(0)
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)  # (FileNotFoundError as it is)
            if stat.S_ISLNK(st.st_mode):
                fault = _fault(st, False)
                if fault is not None:
                    raise UntrustedPath(f"{what}: {os.path.join(here, name)} is a link {fault} ({_RULE}: {why})")
                links += 1
                if links > MAX_LINKS:
                    raise UntrustedPath(f"{what}: {path}: too many levels of links")
                target = os.readlink(name, dir_fd=fd)
                todo[:0] = [c for c in target.split("/") if c not in ("", ".")]
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                    here = "/"
                continue
            try:
                new = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ENOTDIR, errno.ELOOP):  # (or replaced by one since the stat)
                    raise UntrustedPath(f"{what}: {os.path.join(here, name)} is not a directory") from None
                raise
            os.close(fd)
            fd = new
            here = os.path.normpath(os.path.join(here, name))
            _check(fd, here, leaf and not todo, what, why)
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)


_RULE = "every directory on the way must be root's and writable by no one else"


def _check(fd: int, here: str, last: bool, what: str, why: str) -> None:
    fault = _fault(os.fstat(fd), last)
    if fault is not None:
        raise UntrustedPath(f"{what}: {here} is {fault} ({_RULE}: {why})")
