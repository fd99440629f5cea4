"""Lexical path resolution inside a root directory (no side effects, no ctypes).

Used to read a driver root (where absolute symlinks such as ``/etc/alternatives/...`` mean
"inside this root") and to look at an image before planning. It is not a security boundary:
the gofer resolves every container path again with openat2(RESOLVE_IN_ROOT) before it acts.
"""

from __future__ import annotations

import os
import stat

from mounts import reads
from mounts.errors import SandboxError

MAX_LINKS = 40


def file_kind(mode: int) -> str:
    """What an st_mode is, for messages: "a directory", "a FIFO" ..."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"), (stat.S_ISLNK, "a symlink"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a char device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a special file"


def opened_at(fd: int, path: str, proc: int | None = None) -> bool:
    """Whether the file ``fd`` is the one at ``path`` as the kernel names it: a path resolved
    in userspace and then opened can have had a directory on the way swapped for a link in
    between (the kernel then names where the open really went). ``proc``: an fd of the
    procfs to ask (the host's, where /proc may be the container's by now)."""
    try:
        name = os.readlink(f"/proc/self/fd/{fd}") if proc is None else os.readlink(f"self/fd/{fd}", dir_fd=proc)
    except OSError:
        return False
    return name in (path, path + " (deleted)")  # (replaced since, as ldconfig replaces its cache: it was there)


class LinkLoop(SandboxError):
    """Resolving a path met more than MAX_LINKS symlinks (a loop)."""

    def __init__(self, path: str):
        super().__init__(f"{path}: too many levels of symbolic links", op="resolve", path=path)


def resolve_in_root(root: str, path: str) -> str | None:
    """Host path of ``path`` (absolute or relative, inside ``root``), symlinks followed as if
    ``root`` were ``/`` and ``..`` clamped at ``root``. None if a component is missing or
    the links loop."""
    try:
        return _resolve(root, path)
    except LinkLoop:
        return None


class Walk:
    """The component walk of a path inside a root, shared by this lexical resolver and the
    gofer's O_PATH walk (gofer/root.py): iterate to get each component in turn (``..``
    included: the walker stays at the root when it has nothing to climb), and ``follow`` a
    symlink met on the way."""

    def __init__(self, path: str):
        self.path = path
        self.todo = [p for p in path.split("/") if p not in ("", ".")]
        self.links = 0

    def __iter__(self):
        while self.todo:
            yield self.todo.pop(0)

    def follow(self, target: str) -> bool:
        """Splice a link's ``target`` into what is left; True when it is absolute (the
        walker goes back to the root). More than MAX_LINKS links raise LinkLoop."""
        self.links += 1
        if self.links > MAX_LINKS:
            raise LinkLoop(self.path)
        self.todo[:0] = [p for p in target.split("/") if p not in ("", ".")]
        return target.startswith("/")


def _resolve(root: str, path: str) -> str | None:
    """resolve_in_root, with a loop raised as LinkLoop rather than taken for absence."""
    base = root.rstrip("/")
    done = [base]  # the host paths walked so far; [0] is the root
    walk = Walk(path)
    for part in walk:
        if part == "..":
            if len(done) > 1:
                done.pop()
            continue
        candidate = done[-1] + "/" + part
        try:
            st = reads.lstat(candidate)
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode):
            if walk.follow(reads.readlink(candidate)):
                del done[1:]
            continue
        done.append(candidate)
    return done[-1] or "/"


def exists_in_root(root: str, path: str) -> bool:
    return resolve_in_root(root, path) is not None



_LOOP = "\0loop"  # a directory whose links loop (no path holds a NUL)


class Resolver:
    """resolve_in_root for many files in few directories: each directory is resolved once,
    and same-directory links (the usual SONAME links) are followed without a full walk."""

    def __init__(self, root: str):
        self.root = root
        self._dirs: dict[str, str | None] = {}
        self._files: dict[str, tuple[str, int] | None] = {}  # file()'s answers: a cache entry and the version ask alike

    def directory(self, path: str) -> str | None:
        """The host path ``path`` leads to inside the root (resolved once), or None if it does
        not exist. Links that loop raise LinkLoop. From its parent's answer: one lstat a
        directory, where the parent was resolved before (a walk from the root otherwise)."""
        head = path.rstrip("/")
        d = self._dirs.get(head, _LOOP)
        if d is _LOOP and head not in self._dirs:
            d = self._dirs[head] = self._directory(head)
        if d is _LOOP:
            raise LinkLoop(path)
        return d

    def _directory(self, head: str) -> str | None:
        parent, _, name = head.rpartition("/")
        try:
            if name in ("", ".", "..") or (host := self.directory(parent)) is None:
                return _resolve(self.root, head) if name in ("", ".", "..") else None
            st = reads.lstat(host.rstrip("/") + "/" + name)
        except LinkLoop:
            return _LOOP
        except OSError:
            return None
        if not stat.S_ISLNK(st.st_mode):
            return host.rstrip("/") + "/" + name
        # a link: the walk goes on from the parent's real path, as _resolve's would
        base = self.root.rstrip("/")
        try:
            return _resolve(self.root, host[len(base):] + "/" + name)
        except LinkLoop:
            return _LOOP

    def file(self, path: str) -> tuple[str, int] | None:
        """(host path, st_mode of the file found) for ``path`` inside the root, or None if it
        does not exist, each path resolved once. Links that loop raise LinkLoop."""
        if path in self._files:
            return self._files[path]
        found = self._files[path] = self._file(path)
        return found

    def _file(self, path: str) -> tuple[str, int] | None:
        head, _, name = path.rstrip("/").rpartition("/")
        d = self._dirs.get(head, _LOOP)  # (inline: this is discovery's hottest call)
        if d is _LOOP:
            d = self.directory(head)
        if d is None:
            return None
        if name in ("", ".", ".."):
            return self._slow(path)
        for _ in range(MAX_LINKS):
            try:
                st = reads.lstat(d + "/" + name)
            except OSError:
                return None
            if not stat.S_ISLNK(st.st_mode):
                return d + "/" + name, st.st_mode
            target = reads.readlink(d + "/" + name)
            if "/" in target or target in (".", ".."):
                return self._slow(path)
            name = target
        raise LinkLoop(path)

    def _slow(self, path: str) -> tuple[str, int] | None:
        host = _resolve(self.root, path)
        if host is None:
            return None
        try:
            return host, reads.stat_(host).st_mode
        except OSError:
            return None
