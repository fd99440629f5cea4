"""``sandbox run BUNDLE``: fork the gofer first, then supervise it.

The gofer is forked before anything heavy is imported: the child starts building the root
(its own imports, unshare, spec mounts) while the parent imports anyio/trio, parses the
bundle and resolves the GPU closure. The process is single-threaded at the fork, and the
child runs plain Python (no exec, no locks held), so forking here is safe.
"""

from __future__ import annotations

import os
import socket
import time


def main(args) -> int:
    t0 = time.monotonic_ns()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        ours.close()
        from gofer.main import serve

        serve(theirs, t0)  # never returns
    theirs.close()
    from sandbox.supervisor import supervise

    return supervise(args, pid, ours, t0)
