"""``sandbox create ID``: build the whole container (namespaces, every mount, the GPU ones
included, pivot_root), leave its init waiting on exec.fifo, write its pid, and return. Run
in the planner (the server's child, or the launcher's own): the launcher makes the init, its
child, and the caller (conmon, containerd-shim: a subreaper) reaps it."""

from __future__ import annotations

from sandbox.fork import spawn_gofer
from sandbox.launch import launch, options, write_pid_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sandbox.executor.create_plan import CreateFrontend


def main(args, frontend: CreateFrontend) -> int:
    import os

    from gofer.spans import Spans

    frontend.check(args)
    gofer = spawn_gofer()
    spans = Spans(True, os.getpid())  # kept only if a trace is asked for (flag or annotation)
    spans.add("imports + argv", gofer.t0)
    started = launch(options(args, foreground=False), gofer, spans, frontend.launcher(), frontend.read)
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
