"""Our interpreter, unwritable through /proc/<pid>/exe, for the verbs that reach a container
(CVE-2019-5736).

Processes of ours in a container's pid namespace before they exec (a created init waiting
for start, the child of `sandbox exec`, an init created into a pid namespace that has other
tenants) run the host's Python. They are not dumpable, but a container process that holds
CAP_SYS_PTRACE reads past that: it keeps /proc/<pid>/exe open and, once the interpreter is
no longer busy, rewrites the host's Python, which root runs next. Whether some process of a
container holds the capability cannot be told from one command line (an earlier `exec -d`
may have been granted it), so every run, create and exec is sealed.

The `sandbox` executable (sandbox/launcher.c) already runs the interpreter from a detached
read-only bind mount of itself. Started any other way (``python -m sandbox.cli``, pip's
script, a kernel or a user that refused that mount), these verbs re-execute from a sealed
memfd copy of the interpreter first, as runc 1.1 re-executes itself: a copy the kernel
refuses to write. That costs a second interpreter start.

The shared libpython and the extension modules are reachable only through
/proc/<pid>/map_files, which the kernel opens only for a holder of CAP_SYS_ADMIN or
CAP_CHECKPOINT_RESTORE in the host's user namespace (a container with those is not contained
by any runtime: runc's own libc is as reachable there).
"""

from __future__ import annotations

import os
import sys


def sealed() -> bool:
    """Whether /proc/self/exe is a file no one can write: on a read-only mount, or a memfd
    (ours is sealed against writes)."""
    if os.statvfs("/proc/self/exe").f_flag & os.ST_RDONLY:
        return True
    return os.readlink("/proc/self/exe").startswith("/memfd:sandbox-python")


def exec_sealed() -> None:
    """Re-execute this very command line from a sealed in-memory copy of the interpreter."""
    import fcntl

    fd = os.memfd_create("sandbox-python", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    with open("/proc/self/exe", "rb") as f:
        os.write(fd, f.read())
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                | fcntl.F_SEAL_WRITE)
    os.execve(fd, sys.orig_argv, os.environ)


def of_pid(pid: int) -> bool:
    """Whether another process's exe is sealed so (False where it cannot be told)."""
    try:
        if os.statvfs(f"/proc/{pid}/exe").f_flag & os.ST_RDONLY:
            return True
        return os.readlink(f"/proc/{pid}/exe").startswith("/memfd:sandbox-python")
    except OSError:
        return False
