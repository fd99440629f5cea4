"""The container's user namespace, made first so that it owns every other namespace of the
container (runc's order): root in the container is then root over its mounts, network and
hostname, and nothing of the host's.

The launcher's child enters it (sandbox/executor/frontend.c's userns_init: a new one, whose maps the
launcher writes from outside, as the host's root; or the one named by path), then the gofer
joins it with pid 1's other namespaces: still the host's uid there, it clones the bind
sources (locked copies of the host's mounts) before it becomes root in there. The image's
files stay the host's (nobody's in there, as under runc): root in the container cannot write
them, and the GPU mount points go into overlays of their directories.
"""

from __future__ import annotations

import os

from mounts.errors import SandboxError
from mounts.spec import Spec


def new_namespace(spec: Spec) -> tuple[bool, str | None]:
    """(whether the container has a user namespace, the path it is joined by or None)."""
    for ns in spec.linux.namespaces:
        if ns.type == "user":
            return True, ns.path or None
    return False, None


def map_text(mappings) -> str:
    """linux.uidMappings or gidMappings as /proc/PID/uid_map takes them (the launcher writes
    them, sandbox/executor/frontend.c)."""
    return "".join(f"{m.container_id} {m.host_id} {m.size}\n" for m in mappings)


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
