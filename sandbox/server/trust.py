"""Whom the warm server serves, and from where: its peer (root with CAP_SYS_ADMIN in our
namespaces and root), its own interpreter (sealed), and the directories its socket and
filter cache live in (root's alone, all the way from /)."""

from __future__ import annotations

import os
import sys


def unpack_cred(data: bytes) -> tuple[int, int, int]:
    """SO_PEERCRED's struct ucred: (pid, uid, gid)."""
    return (int.from_bytes(data[0:4], sys.byteorder, signed=True), int.from_bytes(data[4:8], sys.byteorder),
            int.from_bytes(data[8:12], sys.byteorder))


def trusted_peer(conn) -> bool:
    """The client must be what a runtime's hook is: root with CAP_SYS_ADMIN, in our user,
    mount, pid and cgroup namespaces, with our root (a uid-0 process without capabilities, or
    a container's root, may not have us widen a container's device rules, mount into it or
    signal it; a chrooted client's paths are not ours, nor would pivot_root take its child's
    root along)."""
    import socket

    pid, uid, _gid = unpack_cred(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    if uid != 0 or pid <= 0:
        return False
    try:
        pidfd = conn.getsockopt(socket.SOL_SOCKET, 77)  # SO_PEERPIDFD (6.5): the very process, not a reused pid
    except OSError:
        pidfd = None
    try:
        with open(f"/proc/{pid}/status") as f:
            caps = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
        same = all(os.stat(f"/proc/{pid}/ns/{ns}").st_ino == os.stat(f"/proc/self/ns/{ns}").st_ino
                   for ns in ("user", "mnt", "pid", "cgroup"))  # pid: the state's pid names the same process
        root, ours = os.stat(f"/proc/{pid}/root"), os.stat("/")
        same = same and (root.st_dev, root.st_ino) == (ours.st_dev, ours.st_ino)
        if pidfd is not None:
            with open(f"/proc/self/fdinfo/{pidfd}") as f:
                same = same and any(line.split() == ["Pid:", str(pid)] for line in f)
    except (OSError, StopIteration, ValueError):
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return bool(caps & (1 << 21)) and same  # CAP_SYS_ADMIN


def sealed() -> bool:
    """Whether our interpreter is a file no one can write (CVE-2019-5736): on a read-only
    mount, or a memfd sealed against writes (sandbox/executor/launcher.c runs a server so)."""
    import fcntl

    if os.statvfs("/proc/self/exe").f_flag & os.ST_RDONLY:
        return True
    try:
        fd = os.open("/proc/self/exe", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return bool(fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_WRITE)
    except OSError:
        return False
    finally:
        os.close(fd)


def root_only_dir(directory: str, what: str, why: str) -> int:
    """``directory`` (an fd to close), made 0700 where missing: it and every directory and
    link on the way from / root's and writable by no one else (mounts/trusted.py; what is
    missing is made only below a directory that passes)."""
    from mounts.trusted import open_root_only

    directory = os.path.abspath(directory)
    there = directory
    while not os.path.lexists(there):
        there = os.path.dirname(there)
    if there != directory:
        os.close(open_root_only(there, what, why, leaf=False))
        for name in directory[len(there):].strip("/").split("/"):
            there = os.path.join(there, name)
            try:
                os.mkdir(there, 0o700)
            except FileExistsError:
                pass  # (made meanwhile: checked below like the rest)
    return open_root_only(directory, what, why)

