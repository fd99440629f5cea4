"""``sandbox trace FILE``: the phases of a startup trace as a table, the critical path,
and optionally an SVG timeline."""

from __future__ import annotations

import sys

import msgspec

from mounts.errors import SandboxError
from sandbox.trace import read_trace, svg, table


def main(args) -> int:
    try:
        events = read_trace(args.file)
    except OSError as e:
        raise SandboxError(f"{args.file}: cannot read: {e.strerror}") from None
    except msgspec.DecodeError as e:
        raise SandboxError(f"{args.file}: not a trace written by sandbox run: {e}") from None
    sys.stdout.write(table(events))
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(svg(events))
    return 0
