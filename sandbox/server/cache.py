"""The seccomp filter cache beside the server's socket (gofer/seccomp.py's CACHE)."""

from __future__ import annotations

import os
import sys

from sandbox.server.trust import root_only_dir


def filter_cache(path: str) -> None:
    """Exported seccomp filters kept beside the socket (gofer/seccomp.py's CACHE), for the
    creates and execs our children serve; without it each compiles its filter. Each server
    has a directory of its own there, and removes the others' as it starts: what another
    server compiled (older code, an older libseccomp) is not ours, even from a child of
    its still at work. Its way from / is checked here and at each use (gofer/seccomp.py)."""
    import shutil
    import stat

    from gofer import seccomp
    from mounts.errors import SandboxError

    top = f"{path}.bpf"  # (this socket's own: a --server in a shared directory empties nobody else's)
    why = "a filter planted there would be a container's"
    try:
        fd = root_only_dir(top, "seccomp filter cache", why)  # (the socket's directory too: a socket unit's)
        try:
            for name in os.listdir(fd):
                if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    shutil.rmtree(name, dir_fd=fd)
                else:
                    os.unlink(name, dir_fd=fd)
            os.mkdir(str(os.getpid()), 0o700, dir_fd=fd)
        finally:
            os.close(fd)
    except (OSError, SandboxError) as e:
        print(f"sandbox serve: no seccomp filter cache: {e}", file=sys.stderr, flush=True)
        return
    seccomp.CACHE = os.path.join(top, str(os.getpid()))

