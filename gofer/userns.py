"""The container's user namespace, made first so that it owns every other namespace of the
container (runc's order): root in the container is then root over its mounts, network and
hostname, and nothing of the host's.

    keeper (the gofer as started: host root)        gofer in the namespace
    ----------------------------------------        ----------------------
    fork  ------------------------------------>     unshare(CLONE_NEWUSER) (or setns by path)
                   <------ "u" (socketpair) ---
    write /proc/<pid>/uid_map, gid_map
                   ------- "m" --------------->     a mount namespace (locked copies of the
                                                    host's mounts), the bind sources cloned
                                                    from it as the host's uid; then root in
    wait for it (signals, exit status, the          there: the other namespaces, mounts,
    cgroups if the supervisor dies)                 pivot_root, the container's process

The keeper stays outside because a process in the new namespace has no privilege over the
host's files: it could not write its own maps nor remove the container's cgroups. The
image's files stay the host's (nobody's in there, as under runc): root in the container
cannot write them, and the GPU mount points go into overlays of their directories.
"""

from __future__ import annotations

import os

from gofer import syscalls as sc
from mounts.errors import SandboxError
from mounts.spec import Spec


def new_namespace(spec: Spec) -> tuple[bool, str | None]:
    """(whether the container has a user namespace, the path it is joined by or None)."""
    for ns in spec.linux.namespaces:
        if ns.type == "user":
            return True, ns.path or None
    return False, None


def map_text(mappings) -> str:
    """linux.uidMappings or gidMappings as /proc/PID/uid_map takes them (what Python writes
    here, and the launcher's child, sandbox/frontend.c, for a served create)."""
    return "".join(f"{m.container_id} {m.host_id} {m.size}\n" for m in mappings)


def write_maps(pid: int, spec: Spec) -> None:
    """The spec's mappings for ``pid``'s new user namespace, written from the parent one."""
    for name, mappings in (("uid_map", spec.linux.uid_mappings), ("gid_map", spec.linux.gid_mappings)):
        path = f"/proc/{pid}/{name}"
        field = "linux.uidMappings" if name == "uid_map" else "linux.gidMappings"
        data = map_text(mappings)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, data.encode())
            finally:
                os.close(fd)
        except OSError as e:
            raise SandboxError(f"{field}: {path}: cannot write {data.strip()!r}: {e.strerror}", op="map",
                               path=path) from None


def enter(path: str | None, chan) -> None:
    """In the forked gofer: a new user namespace (the keeper writes its maps, see above),
    or the one at ``path``. We stay the host's uid 0 until become_root()."""
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
    if chan.recv(1) != b"m":
        raise SandboxError("the user namespace was not set up")
    chan.close()


def become_root() -> None:
    """Root of the namespace, and not dumpable (a change of credentials resets that)."""
    import prctl

    try:
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        os.setgroups([])
    except OSError as e:
        raise SandboxError(f"linux.uidMappings: cannot become the container's root: {e.strerror}") from None
    prctl.set_dumpable(False)
