"""What every verb says: one line on stderr whatever state stdio is in, a warning, an
error as one line, and the same line in the --log file (containerd's shim reads it)."""

from __future__ import annotations

import sys


def stderr_line(line: str) -> None:
    """One line on stderr, whatever state stdio is in (closed, read-only, a full pipe)."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def flush_stdio() -> None:
    """stdout and stderr flushed, as far as they can be (None: the caller closed that fd)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass


def warn(message: str) -> None:
    """A warning line (poststart and poststop hooks, CDI, a cgroup not ours), written as
    errors are: stderr may be /dev/null read-only under an engine's shim."""
    stderr_line(f"sandbox: warning: {message}")


def one_line(e: BaseException) -> str:
    """An error as one line: a plain OSError as "PATH: what" (never "[Errno N] ...")."""
    if isinstance(e, OSError) and type(e).__str__ is OSError.__str__ and e.strerror:
        paths = [p for p in (e.filename, e.filename2) if p is not None]
        return ": ".join([*map(str, paths), e.strerror])
    return " ".join(str(e).split())


def log_error(args, msg: str) -> None:
    """The error line in --log as well: containerd's shim reads the last json entry."""
    path = args.log
    if not path:
        return
    import time

    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if args.log_format == "json":
        import json

        line = json.dumps({"level": "error", "msg": msg, "time": now})
    else:
        line = f'time="{now}" level=error msg={msg!r}'
    try:
        with open(path, "a") as f:
            f.write(line + "\n")
    except OSError:
        pass


def log_flags(argv: list[str]):
    """--log and --log-format from a command line argparse could not read."""
    import types

    found = {"log": None, "log_format": "text"}
    for i, a in enumerate(argv):
        for flag, key in (("--log", "log"), ("--log-format", "log_format")):
            if a == flag and i + 1 < len(argv):
                found[key] = argv[i + 1]
            elif a.startswith(flag + "="):
                found[key] = a.split("=", 1)[1]
    return types.SimpleNamespace(**found)
