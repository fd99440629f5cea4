"""``sandbox run``: start a container and stay with it until it exits (runc's run, and our
``sandbox run BUNDLE``); ``-d`` creates and starts it, then leaves it to the caller.

Run in the planner (the server's child, or the launcher's own): a create that it then starts
through exec.fifo. In the foreground the launcher, pid 1's parent, waits for the container and
reports its end (sandbox/executor/create_plan.py's wait); this code then runs the poststop hooks
and removes the container.
"""

from __future__ import annotations

import os
import signal
import time

from mounts.proc import exit_code
from sandbox.fork import spawn_gofer
from sandbox.launch import launch, options, write_pid_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sandbox.executor.create_plan import CreateFrontend


def main(args, frontend: CreateFrontend) -> int:
    from gofer.hooks import run_hooks, state_json
    from gofer.spans import Spans
    from mounts.errors import SandboxError

    frontend.check(args)
    gofer = spawn_gofer()
    if args.trace and not os.path.isdir(os.path.dirname(os.path.abspath(args.trace))):
        _kill(gofer.pid)
        raise SandboxError(f"--trace {args.trace}: its directory does not exist")
    spans = Spans(True, os.getpid())  # kept only if a trace is asked for (flag or annotation)
    spans.add("imports + argv", gofer.t0)
    opts = options(args, foreground=not args.detach)
    try:
        started = launch(opts, gofer, spans, frontend.launcher(), frontend.read)
    except BaseException:
        if args.trace:
            _write_trace(args.trace, spans, [])
        raise
    from sandbox.state import StateDir
    from sandbox.verbs.start import release

    sd = StateDir(opts.root, opts.cid)
    if args.pid_file:
        write_pid_file(args.pid_file, started.pid)
    hooks = started.hooks
    state = state_json(opts.cid, "running", started.pid, opts.bundle, started.state.annotations)
    try:
        release(sd, started.state)  # (and the poststart hooks)
    except (SandboxError, OSError):
        if not args.detach:  # (its init gone before start)
            _remove(sd, started.state)
        raise
    if args.detach:
        return 0
    t = time.monotonic_ns()
    status = frontend.wait(started.state)
    spans.add("wait", t)
    _warn_hooks(run_hooks, hooks.poststop if hooks else [], "poststop", state)
    _remove(sd, started.state)
    if started.trace:
        _write_trace(started.trace, spans, started.spans)
    return exit_code(status)


def _remove(sd, state) -> None:
    """The container's cgroups (sandbox/state.py), then its state."""
    from sandbox.state import remove_cgroups

    remove_cgroups(state)
    sd.remove()


def _warn_hooks(run_hooks, hooks, stage: str, state: bytes) -> None:
    """poststart and poststop failures are warnings (the runtime spec's rule)."""

    from mounts.errors import SandboxError

    try:
        run_hooks(hooks, stage, state)
    except SandboxError as e:
        from sandbox.messages import warn

        warn(str(e))


def _kill(pid: int) -> None:
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
