"""``sandbox``: the command line. Each verb is a short module in sandbox/; this file only
parses arguments, calls the verb, and turns a SandboxError into one line and an exit code."""

from __future__ import annotations

import sys

VERBS = {
    "plan": "print the GPU mount plan for a bundle",
    "run": "run an OCI bundle, with the host's NVIDIA GPUs when it asks for them",
    "trace": "print (or draw) the phases of a startup trace",
    "hook": "OCI prestart/createRuntime hook for runc and crun (hook install: add it to a bundle)",
    "list": "list the running containers",
    "state": "print a container's state as JSON",
    "kill": "send a signal to a container (default SIGTERM)",
}


def _gpu_options(p) -> None:
    p.add_argument("--driver-root", default="/", help="where the driver is installed (default /)")
    p.add_argument("--dev-root", help="where the kernel module's dev/ and proc/ are (default: the driver root)")
    p.add_argument("--gpus", help="override NVIDIA_VISIBLE_DEVICES (all, none, indices, UUIDs, bus ids)")
    p.add_argument("--capabilities", help="override NVIDIA_DRIVER_CAPABILITIES")


def _size(value: str) -> str:
    """A tmpfs size= value: bytes with an optional k/m/g suffix, or a percentage of RAM."""
    import argparse
    import re

    if not re.fullmatch(r"[0-9]{1,15}[kKmMgG%]?", value) or int(value.rstrip("kKmMgG%")) == 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a size (such as 256m, 2g or 10%)")
    return value


def parser():
    import argparse  # here, not at the top: the hook's fast path never needs it

    ap = argparse.ArgumentParser(prog="sandbox", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="verb", required=True, metavar="VERB")

    p = sub.add_parser("plan", help=VERBS["plan"])
    p.add_argument("bundle")
    _gpu_options(p)
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")

    p = sub.add_parser("run", help=VERBS["run"])
    p.add_argument("bundle")
    _gpu_options(p)
    p.add_argument("--id", help="container id (default: the bundle directory's name)")
    p.add_argument("--root", default="/run/sandbox", help="state directory (default /run/sandbox)")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome trace-event JSON of the startup")
    p.add_argument("--scratch-size", type=_size, metavar="SIZE",
                   help="cap of the tmpfs holding a GPU container's writes to its root (default 256m)")

    p = sub.add_parser("trace", help=VERBS["trace"])
    p.add_argument("file")
    p.add_argument("--svg", metavar="FILE", help="also draw the timeline as an SVG picture")

    p = sub.add_parser("hook", help=VERBS["hook"])
    p.add_argument("action", nargs="?", choices=["install"], help="install: add the hook to a bundle")
    p.add_argument("bundle", nargs="?", help="(install) the bundle whose config.json gets the hook")
    p.add_argument("--driver-root", default="/", help="where the driver is installed (default /)")
    p.add_argument("--dev-root", help="where the kernel module's dev/ and proc/ are (default: the driver root)")
    p.add_argument("--capabilities", help="capabilities allowed at most (default: any)")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome trace-event JSON of the hook")
    p.add_argument("--stage", choices=["prestart", "createRuntime"], default="createRuntime",
                   help="(install) which hook list to add it to")
    for verb in ("list", "state", "kill"):
        p = sub.add_parser(verb, help=VERBS[verb])
        if verb != "list":
            p.add_argument("id")
        if verb == "kill":
            p.add_argument("signal", nargs="?", default="TERM")
        p.add_argument("--root", default="/run/sandbox", help="state directory (default /run/sandbox)")
    return ap


HOOK_OPTIONS = ("--driver-root", "--dev-root", "--capabilities", "--trace")


def hook_args(argv: list[str]):
    """The hook's command line as `hook install` writes it, read without argparse: argparse
    (and the shutil, gettext, lzma it pulls in) is ~11 ms of every container start under a
    runtime. Anything else returns None and goes through the full parser."""
    import types

    if not argv or argv[0] != "hook" or len(argv) % 2 == 0:
        return None
    opts = dict(zip(argv[1::2], argv[2::2], strict=True))
    if not set(opts) <= set(HOOK_OPTIONS):
        return None
    return types.SimpleNamespace(verb="hook", action=None, bundle=None, stage=None,
                                 **{o[2:].replace("-", "_"): opts.get(o) for o in HOOK_OPTIONS})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    gofer = None
    if argv[:1] == ["run"]:
        # Fork the gofer before anything is imported or parsed (see sandbox/run_cmd.py).
        from sandbox.run_cmd import spawn_gofer

        gofer = spawn_gofer()
    args = hook_args(argv) or parser().parse_args(argv)
    if args.verb == "hook" and args.driver_root is None:
        args.driver_root = "/"
    from mounts.errors import SandboxError

    try:
        if args.verb == "plan":
            from sandbox import plan_cmd as verb
        elif args.verb == "run":
            from sandbox import run_cmd as verb
        elif args.verb == "trace":
            from sandbox import trace_cmd as verb
        elif args.verb in ("list", "state", "kill"):
            from sandbox import state_cmd as verb
        else:
            from sandbox import hook_cmd as verb
        return verb.main(args, gofer) if gofer is not None else verb.main(args)
    except SandboxError as e:
        print(f"sandbox {args.verb}: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:  # a syscall that failed outside a typed error (it names its operation)
        print(f"sandbox {args.verb}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
