"""``sandbox``: the command line, runc's contract plus our own verbs. Each verb is a short
module in sandbox/verbs/; this file only calls the verb (sandbox/flags.py reads the command line,
sandbox/config.py fills it in) and turns an error into one line (on stderr, and in the
``--log`` file) and an exit code."""

from __future__ import annotations

import os
import sys

from sandbox import flags
from sandbox.messages import flush_stdio, log_error, one_line, stderr_line

TYPE_CHECKING = False  # typing's flag without importing typing (start-up time); mypy reads it as True
if TYPE_CHECKING:
    import types


def main(argv: list[str] | None = None, frontend=None, entry: bool = False) -> int:
    """``frontend``: the exec or create front end (sandbox/executor/exec_plan.py,
    sandbox/executor/create_plan.py), in a planner's child (the server's, or the launcher's own):
    run, create and exec are planned there and carried out by the `sandbox` executable.
    ``entry``: called as the process's own entry (python -m sandbox.cli), where run, create
    and exec are handed to the launcher (_to_the_launcher)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["serve", "--once"] and frontend is None:  # the launcher's own planner: its command line, as it writes it
        from sandbox.server import requests

        return requests.serve_once(main)
    at = flags.verb_index(argv)
    if at is not None and flags.hook_call(argv[at:]) and not {"-h", "--help"} & set(argv) and os.isatty(0):
        import importlib

        how = importlib.import_module(f"sandbox.verbs.{argv[at]}").HOW  # (hook's or cdi's: where each comes from)
        stderr_line(f"sandbox {' '.join(argv[at:at + 1 + (argv[at] == 'cdi')])}: the container's state is read on "
                    f"stdin, not from a terminal: {how}")
        return 2
    flags._ARGV[:] = argv
    args = flags.hook_args(argv) or flags.cdi_hook_args(argv) or flags.lean_args(argv) or flags.parser().parse_args(argv)
    from mounts.errors import SandboxError

    try:
        from sandbox.config import resolve

        resolve(args)
        mod: types.ModuleType  # the verb's module: each has main(args); run's, create's and exec's main(args, frontend)
        if args.verb == "plan":
            from sandbox.verbs import plan as mod
        elif args.verb == "run":
            from sandbox.verbs import run as mod
        elif args.verb == "create":
            from sandbox.verbs import create as mod
        elif args.verb == "start":
            from sandbox.verbs import start as mod
        elif args.verb == "delete":
            from sandbox.verbs import delete as mod
        elif args.verb == "exec":
            from sandbox.verbs import exec as mod
        elif args.verb == "configure":
            from sandbox.verbs import configure as mod
        elif args.verb == "update":
            from sandbox.verbs import update as mod
        elif args.verb == "features":
            from sandbox.verbs import features as mod
        elif args.verb == "trace":
            from sandbox.verbs import trace as mod
        elif args.verb == "cdi":
            from sandbox.verbs import cdi as mod
        elif args.verb in ("list", "state", "kill", "ps"):
            from sandbox.verbs import state as mod
        elif args.verb == "serve" or (args.verb == "hook" and args.action == "serve"):
            from sandbox.server import listen

            return listen.serve(args, main)  # (its children run the served verbs with this main)
        else:
            from sandbox.verbs import hook as mod
        if args.verb in ("run", "create", "exec"):
            if frontend is None:  # (Python's own entry: python -m sandbox.cli, pip's script)
                why = _to_the_launcher(argv) if entry else "called without a planner's front end"
                stderr_line(f"sandbox {args.verb}: only the `sandbox` launcher runs it: {why}")
                return 2
            return mod.main(args, frontend)
        return mod.main(args)
    except (SandboxError, OSError) as e:  # a SyscallError names its operation and path
        msg = f"sandbox {args.verb}: {one_line(e)}"
        log_error(args, msg)  # first: under an engine's shim stderr may be /dev/null, read-only
        if args.debug:
            import traceback

            traceback.print_exc()
        stderr_line(msg)
        return e.exit_code if isinstance(e, SandboxError) else 1
    except KeyboardInterrupt:
        return 130


FROM_PYTHON = "SANDBOX_FROM_PYTHON"  # set for the launcher we exec: it must not run us again for the verb


def _to_the_launcher(argv: list[str]) -> str:
    """Python's own entry has the `sandbox` launcher run a container (it alone makes container
    processes): exec'd in our place with the same command line. Returns only where there is
    none to hand it to, with why."""
    from mounts.errors import SandboxError
    from sandbox.executor.build import installed

    try:
        launcher = installed()
    except SandboxError as e:
        return str(e)
    if FROM_PYTHON in os.environ:  # (a launcher older than this code runs Python for the verb: never a loop)
        return f"{launcher} ran Python for it (a launcher older than this code: scripts/setup builds it anew)"
    flush_stdio()
    os.execve(launcher, [launcher, *argv], {**os.environ, FROM_PYTHON: "1"})
    raise AssertionError("unreachable")


def run(argv: list[str] | None = None) -> None:
    """main, then exit at once: an engine pays for our teardown on every verb (~7 ms for the
    modules create imports). Everything we write is closed or flushed by then."""
    code = main(argv, entry=True)
    flush_stdio()
    os._exit(code)


if __name__ == "__main__":
    run()
