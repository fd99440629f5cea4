"""``sandbox run``: start a container and stay with it until it exits (runc's run, and our
``sandbox run BUNDLE``); ``-d`` creates and starts it, then leaves it to the caller.

The event loop (anyio on trio, ~100 ms to import) supervises a running container, forwarding
signals. It is imported only once the container has started and is still running after
SHORT_LIVED seconds: a failed start, or a container that is done by then, never pays for it.
Served by the warm server (sandbox/create_frontend.py), the launcher is pid 1's parent and
waits for it; this code, in the server's process, starts the container and removes it.
"""

from __future__ import annotations

import os
import signal
import time

from mounts.proc import exit_code
from sandbox.fork import Gofer, spawn_gofer
from sandbox.launch import forward_signals, launch, options, write_pid_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sandbox.create_frontend import CreateFrontend


def main(args, gofer: Gofer | None = None, frontend: CreateFrontend | None = None) -> int:
    """``frontend``: a server's (or planner's) child: the launcher forks (sandbox/create_frontend.py)."""
    from gofer.hooks import run_hooks, state_json
    from gofer.spans import Spans
    from mounts.errors import SandboxError

    if frontend is not None:
        frontend.check(args)  # (a Decline: the launcher runs the verb in Python, nothing done)
    pid, _sock, t0, _warm = gofer = gofer or spawn_gofer(fresh=frontend is None)
    if frontend is None:
        forward_signals(pid)  # until the event loop, if any, takes over
    if args.trace and not os.path.isdir(os.path.dirname(os.path.abspath(args.trace))):
        _kill(pid)
        raise SandboxError(f"--trace {args.trace}: its directory does not exist")
    spans = Spans(True, os.getpid())  # kept only if a trace is asked for (flag or annotation)
    spans.add("imports + argv", t0)
    # served, the launcher's init waits on exec.fifo as a created one does, even in the foreground
    opts = options(args, detached=args.detach or frontend is not None, foreground=not args.detach)
    try:
        started = launch(opts, gofer, spans, *((frontend.launcher(), frontend.read) if frontend is not None else ()))
    except BaseException:
        if args.trace:
            _write_trace(args.trace, spans, [])
        raise
    from sandbox.state import StateDir

    sd = StateDir(opts.root, opts.cid)
    if args.pid_file:
        write_pid_file(args.pid_file, started.pid)
    hooks = started.hooks
    state = state_json(opts.cid, "running", started.pid, opts.bundle, started.state.annotations)
    if opts.detached:
        from sandbox.start_cmd import release

        try:
            release(sd, started.state)  # (and the poststart hooks)
        except (SandboxError, OSError):
            if not args.detach:  # (a served foreground run: its init gone before start)
                _remove(sd, started.state)
            raise
        if args.detach:
            return 0
    else:
        _warn_hooks(run_hooks, hooks.poststart if hooks else [], "poststart", state)
    t = time.monotonic_ns()
    status = frontend.wait(started.state) if frontend is not None else _exited_within(pid, SHORT_LIVED)
    spans.add("wait (short-lived)" if frontend is None else "wait", t)
    if status is None:  # still running: the event loop supervises it from here on
        t = time.monotonic_ns()
        from sandbox.supervisor import wait_container

        spans.add("import event loop", t)
        t = time.monotonic_ns()
        status = wait_container(pid)
        spans.add("supervise", t)
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


SHORT_LIVED = 0.1  # seconds: a container done by then never pays the event loop's import


def _exited_within(pid: int, timeout: float) -> int | None:
    """The wait status of ``pid`` if it exits within ``timeout``, else None. Signals are
    forwarded meanwhile by the plain handlers main() installed."""
    import select

    fd = os.pidfd_open(pid)
    try:
        readable, _, _ = select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    if not readable:
        return None
    _, status = os.waitpid(pid, 0)
    return status



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
