"""Startup spans on CLOCK_MONOTONIC, recorded by both processes for one trace. Tracing off
costs one branch per span."""

from __future__ import annotations

import time

import msgspec


class Span(msgspec.Struct, frozen=True, array_like=True):
    name: str
    start_ns: int  # CLOCK_MONOTONIC
    end_ns: int
    pid: int
    args: dict[str, str | int] = {}


class Spans:
    """Records spans on CLOCK_MONOTONIC; costs one branch when tracing is off."""

    def __init__(self, enabled: bool, pid: int = 0):
        self.enabled = enabled
        self.pid = pid
        self.items: list[Span] = []

    def add(self, name: str, start_ns: int, end_ns: int | None = None, **args) -> None:
        if self.enabled:
            self.items.append(Span(name, start_ns, end_ns or time.monotonic_ns(), self.pid, args))

    def span(self, name: str, **args):
        return _SpanCtx(self, name, args)


class _SpanCtx:
    __slots__ = ("rec", "name", "args", "t0")

    def __init__(self, rec: Spans, name: str, args: dict):
        self.rec, self.name, self.args = rec, name, args

    def __enter__(self):
        self.t0 = time.monotonic_ns()
        return self

    def __exit__(self, *exc):
        self.rec.add(self.name, self.t0, **self.args)
        return False
