"""The container's root filesystem, seen only through file descriptors.

Every container-side path is an ``unsafe_path``: it comes from the image or the plan and is
resolved by the kernel with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS) relative to the
rootfs fd, so a symlink in the image (``/usr/lib/x86_64-linux-gnu -> /``, ``../../..``) can
never lead outside the root (CVE-2024-0132, CVE-2024-0133, CVE-2025-23359). Mounts are made
onto the resolved fd (move_mount), never onto a path string.

The image itself is never modified. A directory of the image that must gain an entry (a mount
point, a link) first gets a private overlay whose upper layer lives on a detached tmpfs: the
new entries exist only in this mount namespace and vanish with it, even if the gofer is killed
halfway. `sandbox run` overlays the whole root this way before any other mount; embedded in
another runtime, each such directory gets its own, and the mounts already below it are moved
on top. Directories on the spec's own tmpfs mounts (/dev) are written directly.
See docs/design.md, "The root".
"""

from __future__ import annotations

import bisect
import errno
import os
import re
import stat
from collections.abc import Iterable
from typing import NamedTuple

from gofer import syscalls as sc
from mounts.errors import MountError
from mounts.paths import LinkLoop, Walk, file_kind

O_PATH_DIR = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
RESOLVE = sc.RESOLVE_IN_ROOT | sc.RESOLVE_NO_MAGICLINKS

ATTRS = {"ro": sc.MOUNT_ATTR_RDONLY, "nosuid": sc.MOUNT_ATTR_NOSUID, "nodev": sc.MOUNT_ATTR_NODEV,
         "noexec": sc.MOUNT_ATTR_NOEXEC}
MS = {"ro": sc.MS_RDONLY, "nosuid": sc.MS_NOSUID, "nodev": sc.MS_NODEV, "noexec": sc.MS_NOEXEC}

AT_FDCWD = -100
# The tmpfs under our overlays holds the mount points, links and ld.so.cache we add and, in
# a writable GPU container, everything the container writes to its root: its pages are
# host memory, so it is capped (tmpfs size=, ENOSPC past it). `sandbox run --scratch-size`.
SCRATCH_SIZE = "256m"


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040)."""
    if "\\" not in field:
        return field
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


class Mount(NamedTuple):
    """A line of our namespace's mountinfo (the fields we use)."""

    id: str
    root: str  # what of its filesystem is mounted ("/": the whole of it)
    point: str
    options: str  # the mount's own (ro, nosuid, ...)
    fstype: str


def parse_mountinfo(line: str) -> Mount:
    """One line of /proc/PID/mountinfo: id, parent, dev, root, point, options, optional
    fields (none or more), "-", fs type, source, superblock options."""
    left, _, right = line.partition(" - ")
    fields = left.split(" ", 6)
    return Mount(fields[0], _unescape(fields[3]), _unescape(fields[4]), fields[5], right.split(" ", 1)[0])


def mount_table() -> list[Mount]:
    """Our namespace's mounts, in the order they were mounted (mountinfo's)."""
    with open(sc.open_proc("self/mountinfo", os.O_RDONLY)) as f:  # (ours, whatever /proc is here)
        return [parse_mountinfo(line) for line in f]


def _mounts_below(host_dir: str, table: list[Mount]) -> list[str]:
    """Mount points strictly below ``host_dir`` in ``table``, outermost only, in the order
    they were mounted: put back in that order they keep it, as the spec's mounts list wants."""
    prefix = host_dir.rstrip("/") + "/"
    out: list[str] = []
    for m in table:
        mp = m.point
        if not mp.startswith(prefix) or any(mp == o or mp.startswith(o + "/") for o in out):
            continue  # (below or on one listed: its tree's clone takes it along)
        out = [o for o in out if not o.startswith(mp + "/")]  # covered by this later one: hidden, not put back
        out.append(mp)
    return out


def outermost(paths: Iterable[str]) -> list[str]:
    """Those of the absolute ``paths`` below none of the others, parents first ("/" alone
    where it is one of them)."""
    chosen: list[str] = []
    for path in sorted(paths, key=lambda p: len([part for part in p.split("/") if part])):
        if path not in chosen and not any(path.startswith(c.rstrip("/") + "/") for c in chosen):
            chosen.append(path)
    return chosen


def _is_plain(dirfd: int, name: str) -> bool:
    """Whether ``name`` exists in ``dirfd`` and is not a link (a link gets replaced)."""
    try:
        return not stat.S_ISLNK(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


class _DirCache(dict[str, int]):
    """Directory fds by their path ("a/b"), with the paths kept sorted too: those at or below
    one path (what a new mount hides) are found by bisection, not by a scan of all (10,000
    spec mounts made that quadratic)."""

    def __init__(self) -> None:
        super().__init__()
        self._keys: list[str] = []

    def __setitem__(self, key: str, fd: int) -> None:
        if key not in self:
            bisect.insort(self._keys, key)
        super().__setitem__(key, fd)

    def pop(self, key: str, *default):
        if key in self:
            del self._keys[bisect.bisect_left(self._keys, key)]
        return super().pop(key, *default)

    def clear(self) -> None:
        super().clear()
        self._keys.clear()

    def at_or_below(self, key: str) -> list[str]:
        """``key`` itself if cached, and every cached path under it ("key/..."): those sort
        together, from "key/" up to "key0" ("0" follows "/")."""
        if not key:  # the root: everything
            return list(self._keys)
        below = self._keys[bisect.bisect_left(self._keys, key + "/"):bisect.bisect_left(self._keys, key + "0")]
        return ([key] if key in self else []) + below


class Root:
    """The rootfs at ``path`` (already a mount point in our private namespace)."""

    def __init__(self, path: str, scratch_size: str | None = None, upper_owner: tuple[int, int] | None = None):
        self.fd = os.open(path, O_PATH_DIR)
        self.image = os.dup(self.fd)  # the image's root, under any overlay we put on "/"
        # who owns an overlay's top: the image directory's owner, unless told (in a user
        # namespace that owner reads as the overflow uid, a real uid of a wide map there)
        self.upper_owner = upper_owner
        self.scratch_size = scratch_size or SCRATCH_SIZE
        self.writable_devs: set[int] = set()  # filesystems we may add entries to
        self.overlays: dict[tuple[int, int], int] = {}  # lower dir (dev, ino) -> overlay root fd
        self._scratch: int | None = None
        self.scratch_files = 0  # files written into the scratch tmpfs (gofer/gpu.py bind_content)
        self._dirs = _DirCache()  # resolved directories by path, owned here
        self.created = 0  # entries created (mount points, dirs, links): for the trace

    def close(self) -> None:
        for fd in {self.fd, self.image, self._scratch, *self.overlays.values(), *self._dirs.values()}:
            if fd is not None:
                os.close(fd)

    # -- resolution --------------------------------------------------------------------

    def open(self, unsafe_path: str, flags: int = os.O_PATH, mode: int = 0) -> int:
        """Open ``unsafe_path`` inside the root; symlinks and ``..`` cannot leave it."""
        rel = unsafe_path.lstrip("/") or "."
        if sc.OPENAT2_AVAILABLE:
            try:
                return sc.openat2(self.fd, rel, flags | os.O_CLOEXEC, RESOLVE, mode, what=unsafe_path)
            except OSError as e:
                if e.errno != errno.ENOSYS:
                    raise
                sc.OPENAT2_AVAILABLE = False  # an old kernel: walk from now on
        return self._walk(rel, flags, unsafe_path)

    def _walk(self, rel: str, flags: int, unsafe_path: str) -> int:
        """openat2(RESOLVE_IN_ROOT) by hand for kernels without it: one O_PATH|O_NOFOLLOW
        open per component from the root fd, along mounts.paths.Walk (a symlink spliced into
        the rest of the path, absolute ones from the root, ``..`` never above the root).
        Only magic links cannot arise: we never open through /proc of the container."""
        walk = Walk(rel)
        stack = [os.dup(self.fd)]  # fds of the directories walked so far; [0] is the root
        try:
            for part in walk:
                if part == "..":
                    if len(stack) > 1:
                        os.close(stack.pop())
                    continue
                try:
                    fd = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=stack[-1])
                except OSError as e:
                    raise sc.SyscallError(e.errno, "open (walk)", unsafe_path) from None  # type: ignore[arg-type]  # os.open always sets errno
                if stat.S_ISLNK(os.fstat(fd).st_mode):
                    os.close(fd)
                    try:
                        absolute = walk.follow(os.readlink(part, dir_fd=stack[-1]))
                    except LinkLoop:
                        raise sc.SyscallError(errno.ELOOP, "open (walk)", unsafe_path) from None
                    if absolute:
                        while len(stack) > 1:
                            os.close(stack.pop())
                    continue
                if walk.todo and not stat.S_ISDIR(os.fstat(fd).st_mode):
                    os.close(fd)
                    raise sc.SyscallError(errno.ENOTDIR, "open (walk)", unsafe_path)
                stack.append(fd)
            last = stack.pop()
            if flags & os.O_DIRECTORY and not stat.S_ISDIR(os.fstat(last).st_mode):
                os.close(last)
                raise sc.SyscallError(errno.ENOTDIR, "open (walk)", unsafe_path)
            if flags & os.O_PATH:
                return last
            try:  # reopen what we reached with the wanted flags, through its fd
                return os.open(sc.fdpath(last), (flags & ~os.O_NOFOLLOW) | os.O_CLOEXEC)
            finally:
                os.close(last)
        finally:
            for fd in stack:
                os.close(fd)

    def prepare(self, unsafe_paths: list[str], table: list[Mount] | None = None) -> None:
        """For an embedded root, which knows every target before it starts: overlay now each
        image directory that will need a new entry, parents first. Else a parent overlaid
        later (/usr/lib for the firmware, after /usr/lib/x86_64-linux-gnu for the libraries)
        hides the child's overlay and every bind in it, which are then cloned back on top:
        twice the mounts for the same files. ``table``: our mounts as they are now, if read
        already (the overlays made here never lie below one another, so one reading serves
        them all; a mount propagated into the container's namespace meanwhile, from a peer
        of a shared rootfs, is not put back on top: runc's rootfs is rslave or rprivate)."""
        heads: dict[str, tuple[int, str] | None] = {}  # head -> (fd, real path), None: not a directory there
        wanted: dict[str, tuple[int, str]] = {}  # real path -> (fd, unsafe path)
        try:
            for path in unsafe_paths:
                parts = [p for p in path.split("/") if p not in ("", ".")]
                for depth in range(len(parts) - 1, -1, -1):
                    head = "/" + "/".join(parts[:depth])
                    if head not in heads:
                        try:
                            fd = self.open(head, O_PATH_DIR)
                        except OSError:
                            heads[head] = None  # missing (or not a directory: the action will say so)
                        else:
                            try:
                                heads[head] = (fd, os.readlink(sc.fdpath(fd)))
                            except OSError:
                                os.close(fd)
                                raise
                    opened = heads[head]
                    if opened is None:
                        continue
                    fd, real = opened
                    if depth == len(parts) - 1 and parts and _is_plain(fd, parts[-1]):
                        break  # the target is there already: nothing to add in its parent
                    wanted.setdefault(real, (fd, head))
                    break
            for real in outermost(wanted):
                fd, head = wanted[real]
                if table is None:
                    table = mount_table()
                self.writable(fd, head, table)
        finally:
            for opened in heads.values():
                if opened is not None:
                    os.close(opened[0])

    def adopt_tmpfs(self, unsafe_path: str, table: list[Mount] | None = None) -> None:
        """Write directly into the directory ``unsafe_path`` if it is a whole tmpfs mounted
        there by the container's runtime (runc's /dev): it is the container's own, not the
        image, and an overlay would hide its devpts, shm and mqueue. ``table``: our mounts,
        if read already."""
        try:
            fd = self.open(unsafe_path, O_PATH_DIR)
        except OSError:
            return
        try:
            with open(sc.open_proc(f"self/fdinfo/{fd}", os.O_RDONLY)) as f:
                mnt_id = next(line.split()[1] for line in f if line.startswith("mnt_id:"))
            real = os.readlink(sc.fdpath(fd))
            for m in table if table is not None else mount_table():
                if m.id == mnt_id:
                    if m.fstype == "tmpfs" and m.root == "/" and m.point == real and "ro" not in m.options.split(","):
                        self.mark_writable(fd)
                    break
        finally:
            os.close(fd)

    def mark_writable(self, fd: int) -> None:
        """Entries may be created in the filesystem of ``fd`` (a tmpfs the spec mounted)."""
        self.writable_devs.add(os.fstat(fd).st_dev)

    def scratch(self) -> int:
        if self._scratch is None:
            self._scratch = sc.fsmount("tmpfs", {"mode": "0700", "size": self.scratch_size})
        return self._scratch

    def writable(self, dirfd: int, unsafe_path: str, table: list[Mount] | None = None) -> int:
        """An fd for the directory ``dirfd`` in which entries can be created without
        touching the image: itself if it is on a writable fs, else its private overlay.
        ``table``: our mounts as they are now, if read already."""
        st = os.fstat(dirfd)
        key = (st.st_dev, st.st_ino)
        if key in self.overlays:
            return self.overlays[key]
        lower = dirfd
        if st.st_dev in self.writable_devs:
            if self.upper_owner is None or os.access(sc.fdpath(dirfd), os.W_OK):
                return dirfd
            # In a user namespace an image directory under our overlay of "/" reads as
            # nobody's: root there may not add to it. It gets an overlay of its own, over the
            # image's directory itself (over ours, an overlayfs image would stack too deep).
            lower = self._image_dir(dirfd, unsafe_path)
        s = self.scratch()
        n = len(self.overlays)
        os.mkdir(f"o{n}", 0o700, dir_fd=s)
        for sub in ("upper", "work"):
            os.mkdir(f"o{n}/{sub}", 0o755, dir_fd=s)
        # the overlay's root takes its owner and mode from the upper dir
        os.chown(f"o{n}/upper", *(self.upper_owner or (st.st_uid, st.st_gid)), dir_fd=s)
        os.chmod(f"o{n}/upper", stat.S_IMODE(st.st_mode), dir_fd=s)
        # An overlay on a directory hides every mount below it (an earlier overlay, /dev,
        # /proc ...): clone those subtrees first and put them back on top afterwards.
        host_dir = os.readlink(sc.fdpath(dirfd))
        below: list[tuple[str, int]] = []
        ov, attached = -1, False
        try:
            for mp in _mounts_below(host_dir, mount_table() if table is None else table):
                below.append((mp[len(host_dir):].lstrip("/"),
                              sc.open_tree(AT_FDCWD, mp, sc.OPEN_TREE_CLONE | sc.OPEN_TREE_CLOEXEC | sc.AT_RECURSIVE)))
            ov = sc.fsmount("overlay", {
                "lowerdir": sc.fdpath(lower),
                "upperdir": f"{sc.fdpath(s)}/o{n}/upper",
                "workdir": f"{sc.fdpath(s)}/o{n}/work",
            })
            sc.move_mount(ov, dirfd, what=f"overlay on {unsafe_path}")
            attached = True
            for rel, tree in below:
                target = sc.openat2(ov, rel, os.O_PATH | os.O_NOFOLLOW, sc.RESOLVE_IN_ROOT | sc.RESOLVE_NO_SYMLINKS,
                                    what=f"{unsafe_path}/{rel}")
                try:
                    sc.move_mount(tree, target, what=f"back onto {unsafe_path}/{rel}")
                finally:
                    os.close(target)
        except BaseException as e:
            if attached:  # (with whatever was put back on it: the mounts under it are seen again)
                try:
                    sc.umount2(sc.fdpath(ov), sc.MNT_DETACH)
                except OSError:
                    pass
            if ov >= 0:
                os.close(ov)
            if isinstance(e, OSError):
                raise MountError(unsafe_path, f"cannot overlay the image directory: {e}") from None
            raise
        finally:
            for _rel, tree in below:
                os.close(tree)
            if lower != dirfd:
                os.close(lower)
        self.writable_devs.add(os.fstat(ov).st_dev)
        self.overlays[key] = ov
        root_st = os.fstat(self.fd)
        if key == (root_st.st_dev, root_st.st_ino):
            # the image's root itself (a lib dir linked to "/" resolves here): pivot into the
            # overlay, not the bind mount now hidden under it
            os.close(self.fd)
            self.fd = os.dup(ov)
        if below:
            # cached fds below host_dir now name hidden mounts: resolve them afresh
            self._refresh()
        return self.overlays[key]

    def _image_dir(self, dirfd: int, unsafe_path: str) -> int:
        """The image's own directory that ``dirfd`` (under our overlay of "/") shows."""
        top, real = os.readlink(sc.fdpath(self.fd)), os.readlink(sc.fdpath(dirfd))
        if not real.startswith(top.rstrip("/") + "/"):
            raise MountError(unsafe_path, f"{real} is not under the root {top}")
        return sc.openat2(self.image, real[len(top):].lstrip("/"), O_PATH_DIR,
                          sc.RESOLVE_IN_ROOT | sc.RESOLVE_NO_SYMLINKS, what=unsafe_path)

    def _refresh(self) -> None:
        for fd in set(self._dirs.values()) - set(self.overlays.values()) - {self.fd}:
            os.close(fd)
        self._dirs.clear()
        for key, fd in list(self.overlays.items()):
            path = os.readlink(sc.fdpath(fd))
            if path.startswith("/"):  # still attached: reopen whatever is visible there now
                top = os.open(path, O_PATH_DIR)
                st = os.fstat(top)
                if (st.st_dev, st.st_ino) == (os.fstat(fd).st_dev, os.fstat(fd).st_ino):
                    os.close(fd)
                    self.overlays[key] = top
                else:
                    os.close(top)

    def ensure_dir(self, unsafe_path: str) -> int:
        """An O_PATH fd of the directory ``unsafe_path``, created (in an overlay) if missing.
        The fd is cached and owned by the Root: callers do not close it."""
        parts = [p for p in unsafe_path.split("/") if p not in ("", ".")]
        key = "/".join(parts)
        if key in self._dirs:
            return self._dirs[key]
        for depth in range(len(parts), -1, -1):
            try:
                fd = self.open("/".join(parts[:depth]), O_PATH_DIR)
                break
            except OSError as e:
                if e.errno == errno.ENOTDIR:
                    raise MountError(unsafe_path, f"{'/' + '/'.join(parts[:depth])} is not a directory") from None
                if e.errno != errno.ENOENT:
                    raise
        if depth < len(parts):
            parent = self.writable(fd, "/" + "/".join(parts[:depth]))
            if parent != fd:
                os.close(fd)
            for part in parts[depth:]:
                try:
                    os.mkdir(part, 0o755, dir_fd=parent)
                    self.created += 1
                except FileExistsError:
                    # a dangling symlink or a file in the image: never followed, never replaced
                    raise MountError(unsafe_path, f"cannot create directory {part!r}: "
                                     "it exists and is not a directory inside the root") from None
                child = os.open(part, O_PATH_DIR | os.O_NOFOLLOW, dir_fd=parent)
                if parent not in self.overlays.values():
                    os.close(parent)
                parent = child
            fd = parent
        self._dirs[key] = fd
        return fd

    def ensure_node(self, unsafe_path: str, is_dir: bool = False) -> tuple[int, int, str, bool]:
        """(parent fd, target fd, name, created) for a mount point at ``unsafe_path``: an
        existing entry of the right type (its directory left as it is), or a new empty
        file/dir in a writable parent. A symlink in the way is replaced (in the overlay),
        never followed."""
        head, _, name = unsafe_path.rstrip("/").rpartition("/")
        if not name or name in (".", ".."):
            raise MountError(unsafe_path, "not a valid mount point path")
        parent = self.ensure_dir(head or "/")
        try:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except FileNotFoundError:
            fd = None
        if fd is not None:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode) == is_dir and not stat.S_ISLNK(mode):
                return parent, fd, name, False
            os.close(fd)
            if not stat.S_ISLNK(mode):
                raise MountError(unsafe_path, f"exists and is {file_kind(mode)}")
        parent = self.writable(parent, head or "/")
        if fd is not None:  # a link: replaced in the overlay, the image keeps it
            os.unlink(name, dir_fd=parent)
        try:
            if is_dir:
                os.mkdir(name, 0o755, dir_fd=parent)
                fd = os.open(name, O_PATH_DIR | os.O_NOFOLLOW, dir_fd=parent)
            else:  # the created fd is the mount target: no second lookup
                fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o644, dir_fd=parent)
        except FileExistsError:
            raise MountError(unsafe_path, "appeared while we were creating it") from None
        self.created += 1
        return parent, fd, name, True

    # -- actions -----------------------------------------------------------------------

    def bind(self, source_fd: int, unsafe_path: str, flags: tuple[str, ...], recursive: bool = False,
             is_dir: bool = False, detached: bool = False) -> None:
        """Bind what ``source_fd`` refers to (or attach it, a ``detached`` clone already) onto
        ``unsafe_path`` with ``flags`` (ro, nosuid, nodev, noexec) already in force when the
        mount appears. On failure the mount point we created is removed again."""
        parent, target, name, created = self.ensure_node(unsafe_path, is_dir)
        try:
            self.not_the_root(target, unsafe_path)
            tree = source_fd if detached else sc.clone_tree(source_fd, recursive, what=unsafe_path)
            try:
                attrs = sum(ATTRS[f] for f in flags if f in ATTRS)
                if attrs:
                    sc.mount_setattr(tree, attrs, recursive, what=unsafe_path)
                sc.move_mount(tree, target, what=f"onto {unsafe_path}")
            finally:
                if not detached:  # (the caller's fd)
                    os.close(tree)
        except OSError as e:
            if created:
                (os.rmdir if is_dir else os.unlink)(name, dir_fd=parent)
            raise MountError(unsafe_path, str(e)) from None
        finally:
            os.close(target)

    def symlink(self, unsafe_path: str, content: str) -> None:
        """A link at ``unsafe_path`` created relative to its parent's fd (CVE-2024-0134): a
        link already there is replaced in the overlay, anything else is an error."""
        head, _, name = unsafe_path.rpartition("/")
        parent = self.writable(self.ensure_dir(head or "/"), head or "/")
        try:
            os.symlink(content, name, dir_fd=parent)
        except FileExistsError:
            mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
            if not stat.S_ISLNK(mode):
                raise MountError(unsafe_path, f"cannot create link: exists and is {file_kind(mode)}") from None
            os.unlink(name, dir_fd=parent)
            os.symlink(content, name, dir_fd=parent)
        self.created += 1

    def mount_fs(self, fstype: str | None, source: str | None, unsafe_path: str, flags: int, data: str | None) -> int:
        """Mount a new ``fstype`` on the directory ``unsafe_path``; returns an fd of its root."""
        fd = self.ensure_dir(unsafe_path)
        self.not_the_root(fd, unsafe_path)
        under = os.fstat(fd).st_dev
        try:
            sc.mount(source, sc.fdpath(fd), fstype, flags, data)
        except OSError as e:
            raise MountError(unsafe_path, str(e)) from None
        # cached fds at or under it name what is now hidden; later lookups must see the mount
        key = "/".join(p for p in unsafe_path.split("/") if p not in ("", "."))
        for k in self._dirs.at_or_below(key):
            stale = self._dirs.pop(k)
            if stale not in self.overlays.values() and stale != self.fd:
                os.close(stale)
        top = self.open(unsafe_path, O_PATH_DIR)
        if os.fstat(top).st_dev == under:  # what the path reaches now must be the new mount
            os.close(top)
            raise MountError(unsafe_path, f"the new {fstype} mount is not what the path reaches")
        self._dirs[key] = top
        return top

    def not_the_root(self, fd: int, unsafe_path: str) -> None:
        """A mount destination that resolves to the root itself (an image's /dev -> /) would
        cover the whole root, and what is created "in" it would land in the image."""
        st, root = os.fstat(fd), os.fstat(self.fd)
        if (st.st_dev, st.st_ino) == (root.st_dev, root.st_ino) and unsafe_path.strip("/"):
            raise MountError(unsafe_path, "resolves to the container's root (a symlink to / in the image?)")

    def undo(self) -> None:
        """Detach every overlay we made (and with it everything mounted inside), newest
        first: the directories look as they did before. Used when embedded in another
        runtime's namespace, where nothing half-mounted may remain after an error."""
        for ov in reversed(list(self.overlays.values())):
            try:
                sc.umount2(sc.fdpath(ov), sc.MNT_DETACH)
            except OSError:
                pass

    def readonly_overlays(self) -> None:
        for ov in self.overlays.values():
            sc.mount_setattr(ov, sc.MOUNT_ATTR_RDONLY, what="overlay")
