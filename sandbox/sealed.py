"""The interpreter from a sealed memfd, for containers that may ptrace (CVE-2019-5736).

Our processes in a container's pid namespace (a created init waiting for start, the child
of `sandbox exec` before it execs) run the host's Python. They are not dumpable, so a
container process cannot open their /proc/<pid>/exe, unless it holds CAP_SYS_PTRACE: then
it can keep that link and, once the interpreter is no longer busy, rewrite the host's
Python, which root runs next. runc re-executes itself from a sealed memfd for the same
reason. We do it only where a container is granted CAP_SYS_PTRACE (it costs a second
interpreter start, ~10 ms): then /proc/<pid>/exe is a copy the kernel refuses to write.

(The shared libpython is reachable only through /proc/<pid>/map_files, which takes
CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE of the host's user namespace: a container that
has those is not contained by any runtime.)
"""

from __future__ import annotations

import os
import stat
import sys


def sealed() -> bool:
    return os.readlink("/proc/self/exe").startswith("/memfd:")


def exec_sealed() -> None:
    """Re-execute this very command line from a sealed in-memory copy of the interpreter."""
    import fcntl

    fd = os.memfd_create("sandbox-python", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    with open("/proc/self/exe", "rb") as f:
        os.write(fd, f.read())
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                | fcntl.F_SEAL_WRITE)
    os.execve(fd, sys.orig_argv, os.environ)


def may_ptrace(argv: list[str], verb: str) -> bool:
    """Whether the container this command starts or enters may hold CAP_SYS_PTRACE: named in
    its config.json, an exec's --process file or --cap flag. Read as bytes, before anything
    is parsed; an escaped name (\\u...) counts as a yes."""
    files: list[str | None] = []
    root = "/run/sandbox"
    for i, a in enumerate(argv):
        value = argv[i + 1] if i + 1 < len(argv) else ""
        if a in ("-b", "--bundle"):
            files.append(os.path.join(value, "config.json"))
        elif a.startswith(("--bundle=", "-b")):  # --bundle=B, -bB, -b=B
            files.append(os.path.join(a.removeprefix("--bundle=").removeprefix("-b").removeprefix("="),
                                      "config.json"))
        elif a in ("--process", "-p"):
            files.append(value)
        elif a == "--root":
            root = value
        elif a in ("--cap", "-c") and "ptrace" in value.lower():
            return True
    files.append("config.json")  # runc's default bundle is the working directory
    for a in argv:
        if not a.startswith("-"):
            files.append(os.path.join(a, "config.json"))  # sandbox run BUNDLE
            if verb == "exec":
                files.append(_bundle_of(os.path.join(root, a, "state.json")))
    for path in filter(None, files):
        try:  # non-blocking: a FIFO or a terminal given as --process is the real parse's to read
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return True  # unread, so it may ask: sealed
            data = f.read().lower()
        if b"sys_ptrace" in data or b"\\u" in data:
            return True
    return False


def _bundle_of(state: str) -> str | None:
    try:
        from sandbox.jsonlite import loads

        with open(state, "rb") as f:
            return os.path.join(loads(f.read().decode())["bundle"], "config.json")
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
