"""``sandbox run BUNDLE``: fork the gofer first, stream it the plan, then supervise it.

The gofer is forked before anything else is imported, even before the command line is
parsed (cli.main calls spawn_gofer for ``run``): the child imports what it needs and starts
building the root (unshare, spec mounts) while the parent parses the bundle and resolves the
GPU closure; only then does the parent import the event loop (anyio on trio, ~100 ms) to
wait, which overlaps with the container's own start. The process is single-threaded at the
fork and the child runs plain Python (no locks held, no exec), so forking here is safe.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import NamedTuple

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Gofer(NamedTuple):
    pid: int
    sock: socket.socket  # our end of the socketpair
    t0: int  # CLOCK_MONOTONIC at the fork: the trace's origin


def spawn_gofer() -> Gofer:
    """Fork the gofer; in the child this never returns."""
    t0 = time.monotonic_ns()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        ours.close()
        from gofer.main import serve

        serve(theirs, t0, me)  # never returns
    theirs.close()
    return Gofer(pid, ours, t0)


def exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def main(args, gofer: Gofer | None = None) -> int:
    from gofer import protocol
    from gofer.spans import Spans
    from mounts.errors import SandboxError
    from sandbox.state import StateDir
    from sandbox.stream import read_replies, stream_plan

    pid, ours, t0 = gofer or spawn_gofer()
    bundle_path = os.path.abspath(args.bundle)

    # Until the event loop takes over, forward signals with plain handlers.
    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    state = None
    waited = False
    try:
        if args.trace and not os.path.isdir(os.path.dirname(os.path.abspath(args.trace))):
            raise SandboxError(f"--trace {args.trace}: its directory does not exist")
        spans = Spans(bool(args.trace), os.getpid())
        spans.add("imports + argv", t0)
        error = None
        state = StateDir(args.root, args.id or os.path.basename(bundle_path))
        state.create(pid, bundle_path)  # an id in use or an unusable --root: one line, gofer killed below
        try:
            stream_plan(args, ours, spans)
        except BrokenPipeError:
            pass  # the gofer failed first: its Error frame says why
        except (SandboxError, OSError) as e:
            error = e
            ours.shutdown(socket.SHUT_WR)  # the gofer sees EOF before End and gives up
        t = time.monotonic_ns()
        replies = read_replies(ours)  # until the container exec'd, or the gofer gave up
        ours.close()
        spans.add("wait for exec", t)
        failure = next((m.error() for m in replies if isinstance(m, protocol.Error)), None)
        ready = next((m for m in replies if isinstance(m, protocol.Ready)), None)
        if ready is not None and failure is None and error is None:
            state.running(ready.pid)
            t = time.monotonic_ns()
            from sandbox.supervisor import wait_container

            spans.add("import event loop", t)
            t = time.monotonic_ns()
            status = wait_container(pid)
            spans.add("supervise", t)
        else:  # nothing started: no container to supervise, no event loop needed
            _, status = os.waitpid(pid, 0)
        waited = True
        if args.trace:
            _write_trace(args.trace, spans, ready.spans if ready is not None else [])
        if error is not None:
            raise error
        code = exit_code(status)
        if failure is None and ready is None:
            how = f"was killed by signal {code - 128}" if code > 128 else f"exited with status {code}"
            failure = SandboxError(f"the gofer {how} before the container started")
        if failure is not None:
            raise failure
        return code
    finally:
        if state is not None:
            state.remove()
        if not waited:  # never leave the gofer behind, whatever happened above
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def _write_trace(path: str, spans, gofer_spans: list) -> None:
    import resource

    from sandbox.trace import write_trace

    spans.add("supervisor done", time.monotonic_ns(), maxrss_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    write_trace(path, spans.items + gofer_spans)
