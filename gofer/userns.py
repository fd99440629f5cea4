"""The container's user namespace, made first so that it owns every other namespace of the
container (runc's order): root in the container is then root over its mounts, network and
hostname, and nothing of the host's.

    keeper (the gofer as started: host root)        gofer in the namespace
    ----------------------------------------        ----------------------
    fork  ------------------------------------>     unshare(CLONE_NEWUSER) (or setns by path)
                   <------ "u" (socketpair) ---
    write /proc/<pid>/uid_map, gid_map
    clone the rootfs, idmapped to the namespace
                   ------- "m" + its fd ------>     setresgid/setresuid(0): root in there
    wait for it (signals, exit status, the          everything else: namespaces, mounts on
    cgroups if the supervisor dies)                 the idmapped root, pivot_root, the process

The keeper stays outside because a process in the new namespace has no privilege over the
host's files: it could not write its own maps, make an idmapped mount, nor remove the
container's cgroups. The rootfs is idmapped (Linux 5.12) so that its files, the host's
root's, are the container's root's in there: without that, root in the container could
create nothing in the image's directories, not even the mount points of its GPU files.
"""

from __future__ import annotations

import os
import socket

from gofer import syscalls as sc
from mounts.errors import SandboxError
from mounts.spec import Spec

AT_FDCWD = -100


def new_namespace(spec: Spec) -> tuple[bool, str | None]:
    """(whether the container has a user namespace, the path it is joined by or None)."""
    for ns in spec.linux.namespaces:
        if ns.type == "user":
            return True, ns.path or None
    return False, None


def write_maps(pid: int, spec: Spec) -> None:
    """The spec's mappings for ``pid``'s new user namespace, written from the parent one."""
    for name, mappings in (("uid_map", spec.linux.uid_mappings), ("gid_map", spec.linux.gid_mappings)):
        path = f"/proc/{pid}/{name}"
        field = "linux.uidMappings" if name == "uid_map" else "linux.gidMappings"
        data = "".join(f"{m.container_id} {m.host_id} {m.size}\n" for m in mappings)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, data.encode())
            finally:
                os.close(fd)
        except OSError as e:
            raise SandboxError(f"{field}: {path}: cannot write {data.strip()!r}: {e.strerror}", op="map",
                               path=path) from None


def idmapped_root(rootfs: str, userns: str) -> int:
    """A detached clone of ``rootfs`` (and the mounts below it) whose owners are mapped
    through the user namespace at ``userns``; the caller passes its fd into the namespace."""
    tree = sc.open_tree(AT_FDCWD, rootfs, sc.OPEN_TREE_CLONE | sc.OPEN_TREE_CLOEXEC | sc.AT_RECURSIVE,
                        what=rootfs)
    try:
        ns = os.open(userns, os.O_RDONLY | os.O_CLOEXEC)
        try:
            sc.mount_setattr(tree, sc.MOUNT_ATTR_IDMAP, recursive=True, what=f"idmap {rootfs}", userns_fd=ns)
        finally:
            os.close(ns)
    except OSError as e:
        os.close(tree)
        raise SandboxError(f"root.path {rootfs}: cannot map its owners into the user namespace: {e.strerror} "
                           "(its filesystem may not support idmapped mounts)", op="idmap", path=rootfs) from None
    return tree


def enter(path: str | None, chan) -> int:
    """In the forked gofer: a new user namespace (the keeper writes its maps, see above),
    or the one at ``path``; then become its root. Returns the idmapped root's fd."""
    if path:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise SandboxError(f"linux.namespaces: cannot open the user namespace {path}: {e.strerror}") from None
        try:
            sc.setns(fd, sc.CLONE_NEWUSER, what=f"user namespace {path}")
        finally:
            os.close(fd)
    else:
        sc.unshare(sc.CLONE_NEWUSER)
    chan.send(b"u")
    msg, fds, _, _ = socket.recv_fds(chan, 1, 1)
    chan.close()
    if msg != b"m" or not fds:
        raise SandboxError("the user namespace was not set up")
    try:
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        os.setgroups([])
    except OSError as e:
        raise SandboxError(f"linux.uidMappings: cannot become the container's root: {e.strerror}") from None
    return fds[0]
