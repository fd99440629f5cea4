"""What a driver discovery read, so that a long-lived process can tell cheaply whether the
same discovery would give the same inventory (mounts/inventories.py).

Discovery reads the driver root and the device root only through the functions below
(and ``opened``, for a file it opened itself). While ``recording`` is on, each call notes
its question and the answer the file system gave: the lstat or stat of a path (its type,
inode, size, times, device numbers) or the error, a directory's listing, a small file's
bytes. Asking the same questions again and getting the same answers means discovery would
read the same things: a library replaced or rewritten has another inode or ctime, a GPU or
a MIG instance that appears changes a listing of /proc, a device node made again another
inode and ctime, a driver reloaded another /proc/driver/nvidia/version.

A file's times have the kernel's clock tick as their grain: a file changed within a tick
of being read could keep its times. As git does with a racily clean index, an answer
whose ctime is less than RACY seconds older than the recording is not trusted: such a
recording is never reused (``Reads.settled``).
"""

from __future__ import annotations

import os
import stat
import time
from typing import Any

RACY = 1.0  # seconds: a ctime this close to the recording may not show a change made within a tick
MAX_TEXT = 1 << 16  # a file's bytes are kept up to this size (/proc's texts); larger ones by their stat

Key = tuple[int, int, int, int, int, int, int]  # mode, dev, ino, size, mtime_ns, ctime_ns, rdev


def key(st: os.stat_result) -> Key:
    return (st.st_mode, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_rdev)


class Reads:
    """The questions asked and their answers: {(kind, path): answer}."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], Any] = {}
        self.started = time.time_ns()
        self.newest = 0  # the newest ctime among the answers (ns)
        self.unsure = False  # a question whose answer says nothing (a large /proc text's stat)

    def note(self, kind: str, path: str, answer: Any) -> None:
        self.answers.setdefault((kind, path), answer)
        if kind in ("lstat", "stat") and isinstance(answer, tuple):
            self.newest = max(self.newest, answer[5])

    @property
    def settled(self) -> bool:
        """No answer came from a file changed within RACY seconds of the recording."""
        return not self.unsure and self.newest < self.started - int(RACY * 1e9)

    def unchanged(self) -> bool:
        """Whether every question gets the same answer now."""
        return all(ASK[kind](path) == answer for (kind, path), answer in self.answers.items())


_current: Reads | None = None


class recording:
    """``with recording() as reads:`` every read below is noted in ``reads``."""

    def __enter__(self) -> Reads:
        global _current
        self.outer, _current = _current, Reads()
        return _current

    def __exit__(self, *exc) -> None:
        global _current
        _current = self.outer


def _ask_lstat(path: str) -> Key | int:
    try:
        return key(os.lstat(path))
    except OSError as e:
        return e.errno or -1


def _ask_stat(path: str) -> Key | int:
    try:
        return key(os.stat(path))
    except OSError as e:
        return e.errno or -1


def _ask_listdir(path: str) -> tuple[str, ...] | int:
    try:
        return tuple(sorted(os.listdir(path)))
    except OSError as e:
        return e.errno or -1


def _ask_text(path: str) -> bytes | int:
    """A small regular file's bytes, read as discovery reads driver files (non-blocking,
    never through a last link); anything else by its lstat."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        return e.errno or -1
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_TEXT:
            return -2
        return os.read(fd, MAX_TEXT + 1)
    except OSError as e:
        return e.errno or -1
    finally:
        os.close(fd)


ASK = {"lstat": _ask_lstat, "stat": _ask_stat, "listdir": _ask_listdir, "text": _ask_text}


def _noted(kind: str, path: str, answer: Any) -> None:
    if _current is not None:
        _current.note(kind, path, answer)


def _stat(kind: str, how, path: str) -> os.stat_result:
    try:
        st = how(path)
    except OSError as e:
        _noted(kind, path, e.errno or -1)
        raise
    _noted(kind, path, key(st))
    return st


def lstat(path: str) -> os.stat_result:
    """os.lstat, noted."""
    return _stat("lstat", os.lstat, path)


def stat_(path: str) -> os.stat_result:
    """os.stat, noted."""
    return _stat("stat", os.stat, path)


def listdir(path: str) -> list[str]:
    """os.listdir, noted (the listing itself: procfs's directories keep no times)."""
    try:
        names = os.listdir(path)
    except OSError as e:
        _noted("listdir", path, e.errno or -1)
        raise
    _noted("listdir", path, tuple(sorted(names)))
    return names


def readlink(path: str) -> str:
    """os.readlink, noted as the link's lstat (a link's target changes only with its inode)."""
    if _current is not None:
        _noted("lstat", path, _ask_lstat(path))
    return os.readlink(path)


def isdir(path: str) -> bool:
    try:
        return stat.S_ISDIR(stat_(path).st_mode)
    except OSError:
        return False


def lexists(path: str) -> bool:
    try:
        lstat(path)
    except OSError:
        return False
    return True


def islink(path: str) -> bool:
    try:
        return stat.S_ISLNK(lstat(path).st_mode)
    except OSError:
        return False


def opened(path: str, fd: int, data: bytes | None = None, st: os.stat_result | None = None) -> os.stat_result:
    """A file discovery opened at ``path`` (never through a last link), noted: its bytes where
    they were read whole and are small (a /proc text: its times say nothing), else its stat
    (``st``, the caller's fstat of ``fd``, else one made here). Returns that stat."""
    st = st if st is not None else os.fstat(fd)
    if _current is None:
        return st
    if data is not None and stat.S_ISREG(st.st_mode) and len(data) <= MAX_TEXT:
        _noted("text", path, data)
    else:
        if data is not None and len(data) != st.st_size:  # (/proc's: its stat would show no change)
            _current.unsure = True
        _noted("lstat", path, key(st))
    return st
