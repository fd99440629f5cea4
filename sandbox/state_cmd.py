"""``sandbox list``, ``sandbox state ID``, ``sandbox kill ID [SIGNAL]``: the containers that
``sandbox run`` recorded under ``--root``, as runc's verbs of the same names show them."""

from __future__ import annotations

import os
import signal
import sys
import time

import msgspec

from mounts.errors import SandboxError
from sandbox.state import StateDir, list_states


def _find(args):
    state = StateDir(args.root, args.id).read()
    if state is None:
        raise SandboxError(f"container {args.id!r} does not exist (under {args.root})")
    return state


def main(args) -> int:
    if args.verb == "list":
        rows = [("ID", "PID", "STATUS", "CREATED", "BUNDLE")]
        rows += [(s.id, str(s.pid), s.status, time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(s.created)), s.bundle)
                 for s in list_states(args.root)]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        for r in rows:
            sys.stdout.write("  ".join(f"{c:<{widths[i]}}" for i, c in enumerate(r[:4])) + "  " + r[4] + "\n")
        return 0
    state = _find(args)
    if args.verb == "state":
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(state).decode(), indent=2) + "\n")
        return 0
    name = args.signal.upper()
    if name.isascii() and name.isdigit() and len(name) <= 3:
        signum = int(name)
    else:
        signum = getattr(signal, name if name.startswith("SIG") else "SIG" + name, None)
    if not isinstance(signum, int) or signum not in signal.valid_signals():
        raise SandboxError(f"kill: unknown signal {args.signal!r}")
    try:
        os.kill(state.pid, signum)
    except ProcessLookupError:
        raise SandboxError(f"container {args.id!r} has exited") from None
    return 0
