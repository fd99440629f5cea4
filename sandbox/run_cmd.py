"""``sandbox run BUNDLE``: fork the gofer first, stream it the plan, then supervise it.

The gofer is forked right after the imports both sides share: the child starts building
the root (its own imports, unshare, spec mounts) while the parent parses the bundle and
resolves the GPU closure; only then does the parent import the event loop (anyio on trio,
~100 ms) to wait, which overlaps with the container's own start. The process is
single-threaded at the fork and the child runs plain Python (no locks held), so forking
here is safe.
"""

from __future__ import annotations

import os
import signal
import socket
import time

# Both processes need msgspec, the spec and the protocol (~20 ms of imports): load them once,
# before the fork, so the child inherits them instead of importing them again.
from gofer import protocol  # noqa: F401
from gofer.spans import Spans
from mounts.errors import SandboxError
from sandbox.state import StateDir

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def main(args) -> int:
    t0 = time.monotonic_ns()
    bundle_path = os.path.abspath(args.bundle)
    state = StateDir(args.root, args.id or os.path.basename(bundle_path))
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        ours.close()
        from gofer.main import serve

        serve(theirs, t0, me)  # never returns
    theirs.close()

    # Until the event loop takes over, forward signals with plain handlers.
    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    try:
        spans = Spans(bool(args.trace), os.getpid())
        spans.add("imports", t0)
        error = None
        try:
            state.create(pid, bundle_path)
        except (SandboxError, OSError) as e:
            ours.close()
            raise SandboxError(str(e)) from None
        try:
            from sandbox.stream import stream_plan

            stream_plan(args, ours, spans)
        except BrokenPipeError:
            pass  # the gofer failed first: its Error frame says why
        except (SandboxError, OSError) as e:
            error = e
            ours.shutdown(socket.SHUT_WR)  # the gofer sees EOF before End and gives up
        t = time.monotonic_ns()
        from sandbox.supervisor import supervise

        spans.add("import supervisor", t)
        return supervise(args, pid, ours, spans, state, error)
    finally:
        state.remove()
        # never leave the gofer behind, whatever happened above
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
