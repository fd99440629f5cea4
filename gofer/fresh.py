"""A forked child of ours becomes a fresh interpreter before it joins a container: what the
process that forked it held (its caller's command line and environment, parsed and copied
into Python objects and the interpreter's own configuration, which no one can blank in
place) is then gone from its memory, which a container process holding CAP_SYS_PTRACE could
read while it waits in there (issue 29). The same interpreter runs again: the sealed one,
through /proc/self/exe (sandbox/sealed.py, the launcher's read-only view of it), never a path
a container could have us open. Builtins only: sandbox/fork.py calls it right after its fork."""

from __future__ import annotations

import os
import sys


def exec_fresh(code: str, fds: tuple[int, ...]) -> None:
    """Execute ``code`` in a new interpreter of this same program, with our import paths,
    ``fds`` (and the caller's inheritable ones) open, an environment of SANDBOX_DEBUG alone.
    Never returns."""
    for fd in fds:
        os.set_inheritable(fd, True)
    env = {"SANDBOX_DEBUG": os.environ["SANDBOX_DEBUG"]} if "SANDBOX_DEBUG" in os.environ else {}
    program = f"import sys; sys.path[:0] = {[p for p in sys.path if p]!r}; {code}"
    try:
        os.execve("/proc/self/exe", [sys.executable or "python3", "-IS", "-c", program], env)
    finally:
        os._exit(127)
