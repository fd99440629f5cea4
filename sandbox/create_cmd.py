"""``sandbox create ID``: build the whole container (namespaces, every mount, the GPU ones
included, pivot_root), leave its init waiting on exec.fifo, write its pid, and return. The
caller (conmon, containerd-shim: a subreaper) becomes the init's parent and reaps it."""

from __future__ import annotations

from sandbox.fork import Gofer, spawn_gofer
from sandbox.launch import launch, options, write_pid_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sandbox.create_frontend import CreateFrontend


def main(args, gofer: Gofer | None = None, frontend: CreateFrontend | None = None) -> int:
    """``frontend``: a server's (or planner's) child: the launcher forks (sandbox/create_frontend.py)."""
    import os

    from gofer.spans import Spans

    if frontend is not None:
        frontend.check(args)  # (a Decline: the launcher runs create in Python, nothing done)
    gofer = gofer or spawn_gofer(fresh=frontend is None)
    spans = Spans(True, os.getpid())  # kept only if a trace is asked for (flag or annotation)
    spans.add("imports + argv", gofer.t0)
    started = launch(options(args, detached=True, foreground=False), gofer, spans,
                     *((frontend.launcher(), frontend.read) if frontend is not None else ()))
    if args.pid_file:
        write_pid_file(args.pid_file, started.pid)
    if started.trace:  # the container exists now: a trace that cannot be written only warns

        from mounts.errors import SandboxError
        from sandbox.trace import write_trace

        try:
            write_trace(started.trace, spans.items + started.spans)
        except SandboxError as e:
            from sandbox.messages import warn

            warn(str(e))
    return 0
