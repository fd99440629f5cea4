"""Startup traces: Chrome trace-event JSON (Perfetto loads it), a phase table with the
critical path, and an SVG timeline. Spans come from both processes on CLOCK_MONOTONIC."""

from __future__ import annotations

import msgspec

from gofer.protocol import Span


class Event(msgspec.Struct, omit_defaults=True):
    name: str
    ph: str
    pid: int
    tid: int = 0
    ts: float = 0.0
    dur: float | None = None
    args: dict[str, str | int] = {}


class Trace(msgspec.Struct):
    traceEvents: list[Event]  # noqa: N815 - the format's own field name
    displayTimeUnit: str = "ms"  # noqa: N815


def write_trace(path: str, spans: list[Span]) -> None:
    origin = min((s.start_ns for s in spans), default=0)
    names = {}
    for s in spans:
        names.setdefault(s.pid, "sandbox supervisor" if not names else "sandbox gofer")
    events = [Event("process_name", "M", pid, args={"name": name}) for pid, name in names.items()]
    events += [Event(s.name, "X", s.pid, 0, (s.start_ns - origin) / 1e3, (s.end_ns - s.start_ns) / 1e3, s.args)
               for s in spans]
    with open(path, "wb") as f:
        f.write(msgspec.json.encode(Trace(events)))


def read_trace(path: str) -> list[Event]:
    with open(path, "rb") as f:
        return msgspec.json.decode(f.read(), type=Trace).traceEvents


def top_level(events: list[Event]) -> list[Event]:
    """Spans not nested inside another span of the same process, by start time."""
    spans = sorted((e for e in events if e.ph == "X"), key=lambda e: (e.ts, -(e.dur or 0)))
    out = []
    for e in spans:
        if not any(o.pid == e.pid and o.ts <= e.ts and e.ts + (e.dur or 0) <= o.ts + (o.dur or 0)
                   and o is not e for o in out):
            out.append(e)
    return out


def critical_path(events: list[Event]) -> list[Event]:
    """Walk back from exec (or the last span): each step takes the top-level span (of
    either process) that ended last before the current one started: what exec waited on."""
    spans = top_level(events)
    if not spans:
        return []
    execs = [e for e in spans if e.name == "exec"]
    cur = execs[0] if execs else max(spans, key=lambda e: e.ts + (e.dur or 0))
    path = [cur]
    while True:
        before = [e for e in spans if e.ts + (e.dur or 0) <= cur.ts + 1e-3 and e is not cur]
        if not before:
            break
        cur = max(before, key=lambda e: e.ts + (e.dur or 0))
        path.append(cur)
    return path[::-1]


def table(events: list[Event]) -> str:
    names = {e.pid: e.args.get("name", str(e.pid)) for e in events if e.ph == "M"}
    rows = [("PROCESS", "PHASE", "START ms", "DUR ms", "")]
    crit = {id(e) for e in critical_path(events)}
    for e in sorted((e for e in events if e.ph == "X"), key=lambda e: e.ts):
        extra = " ".join(f"{k}={v}" for k, v in e.args.items())
        mark = "*" if id(e) in crit else ""
        rows.append((str(names.get(e.pid, e.pid)).removeprefix("sandbox "), mark + e.name,
                     f"{e.ts / 1e3:.2f}", f"{(e.dur or 0) / 1e3:.2f}", extra))
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:>{w[2]}}  {r[3]:>{w[3]}}  {r[4]}".rstrip() for r in rows]
    path = critical_path(events)
    if path:
        total = (path[-1].ts + (path[-1].dur or 0) - path[0].ts) / 1e3
        lines.append(f"critical path (*, {total:.2f} ms): " + " -> ".join(e.name for e in path))
    return "\n".join(lines) + "\n"


def svg(events: list[Event]) -> str:
    spans = [e for e in events if e.ph == "X"]
    names = {e.pid: e.args.get("name", str(e.pid)) for e in events if e.ph == "M"}
    pids = sorted({e.pid for e in spans}, key=lambda p: min(e.ts for e in spans if e.pid == p))
    end = max((e.ts + (e.dur or 0) for e in spans), default=1.0) or 1.0
    width, lane, left = 1000, 22, 150
    scale = (width - left - 10) / end
    rows: list[tuple[int, Event]] = []  # (row, event): nested spans go one row down
    y = 30
    out = []
    for pid in pids:
        mine = sorted((e for e in spans if e.pid == pid), key=lambda e: (e.ts, -(e.dur or 0)))
        depth_of: list[Event] = []
        base = y
        out.append(f'<text x="5" y="{base + 15}" font-size="12">{names.get(pid, pid)}</text>')
        max_depth = 0
        for e in mine:
            depth = sum(1 for o in depth_of if o.ts <= e.ts < o.ts + (o.dur or 0))
            depth_of.append(e)
            max_depth = max(max_depth, depth)
            rows.append((base + depth * lane, e))
        y = base + (max_depth + 1) * lane + 10
    colors = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1"]
    for i, (row, e) in enumerate(rows):
        x, w = left + e.ts * scale, max((e.dur or 0) * scale, 1.0)
        title = f"{e.name}: {(e.dur or 0) / 1e3:.3f} ms"
        out.append(f'<rect x="{x:.1f}" y="{row}" width="{w:.1f}" height="{lane - 4}" '
                   f'fill="{colors[i % len(colors)]}"><title>{title}</title></rect>')
        if w > 40:
            out.append(f'<text x="{x + 2:.1f}" y="{row + 13}" font-size="10" fill="white">{e.name}</text>')
    out.append(f'<text x="{left}" y="18" font-size="11">0 ms</text>'
               f'<text x="{width - 60}" y="18" font-size="11">{end / 1e3:.2f} ms</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y + 10}" '
            f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>' + "".join(out) + "</svg>\n")
