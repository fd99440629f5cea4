"""Startup traces: Chrome trace-event JSON (Perfetto loads it), a phase table with the
critical path, and an SVG timeline. Spans come from both processes on CLOCK_MONOTONIC."""

from __future__ import annotations

import msgspec

from gofer.spans import Span


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
    otherData: dict[str, int] = {}  # noqa: N815 - origin_monotonic_ns: CLOCK_MONOTONIC at ts 0


def write_trace(path: str, spans: list[Span]) -> None:
    origin = min((s.start_ns for s in spans), default=0)
    names: dict[int, str] = {}
    for s in spans:
        names.setdefault(s.pid, "sandbox supervisor" if not names else "sandbox gofer")
    events = [Event("process_name", "M", pid, args={"name": name}) for pid, name in names.items()]
    events += [Event(s.name, "X", s.pid, 0, (s.start_ns - origin) / 1e3, (s.end_ns - s.start_ns) / 1e3, s.args)
               for s in spans]
    data = msgspec.json.encode(Trace(events, otherData={"origin_monotonic_ns": origin}))
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError as e:
        from mounts.errors import SandboxError

        raise SandboxError(f"--trace {path}: cannot write the trace: {e.strerror}") from None


def read_trace(path: str) -> list[Event]:
    with open(path, "rb") as f:
        return msgspec.json.decode(f.read(), type=Trace).traceEvents


def top_level(events: list[Event]) -> list[Event]:
    """Spans not nested inside another span of the same process, by start time."""
    spans = sorted((e for e in events if e.ph == "X"), key=lambda e: (e.ts, -(e.dur or 0)))
    out: list[Event] = []
    for e in spans:
        # nested: starts inside o (an instant at o's very end, like exec, is not) and ends in it
        if not any(o.pid == e.pid and o.ts <= e.ts < o.ts + (o.dur or 0)
                   and e.ts + (e.dur or 0) <= o.ts + (o.dur or 0) and o is not e for o in out):
            out.append(e)
    return out


def critical_path(events: list[Event]) -> list[Event]:
    """Walk back from exec (or the last span), one top-level span at a time: the previous
    span of the same process family (supervisor, or gofer and its pid 1) if it ended right
    before (it ran into this one), else whichever span of either process ended last: what
    this one waited for."""
    spans = top_level(events)
    if not spans:
        return []
    names = process_names(events)

    def family(e: Event) -> str:
        return "supervisor" if "supervisor" in str(names.get(e.pid, "")) else "gofer"

    def end(e: Event) -> float:
        return e.ts + (e.dur or 0)

    execs = [e for e in spans if e.name == "exec"]
    cur = execs[0] if execs else max(spans, key=end)
    path = [cur]
    while True:
        before = [e for e in spans if end(e) <= cur.ts + 1e-3 and e is not cur]
        if not before:
            break
        own = [e for e in before if family(e) == family(cur)]
        last_own = max(own, key=end) if own else None
        if last_own is not None and cur.ts - end(last_own) < 200:  # µs: it ran straight into cur
            cur = last_own
        else:
            cur = max(before, key=end)
        path.append(cur)
    return path[::-1]


def table(events: list[Event]) -> str:
    names = process_names(events)
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


def process_names(events: list[Event]) -> dict[int, str]:
    """Lane names: the supervisor, the gofer, and the gofer's child that became pid 1."""
    names = {e.pid: str(e.args.get("name", e.pid)) for e in events if e.ph == "M"}
    for e in events:
        if e.ph == "X" and e.name == "fork pid 1":
            names[e.pid] = "gofer (container pid 1)"
    return names


def svg(events: list[Event]) -> str:
    """A timeline, one lane per process, nested spans one row down; the time axis ends just
    after exec (longer spans are clipped and marked) so the start-up phases stay readable."""
    spans = [e for e in events if e.ph == "X"]
    names = process_names(events)
    pids = sorted({e.pid for e in spans}, key=lambda p: min(e.ts for e in spans if e.pid == p))
    execs = [e.ts for e in spans if e.name == "exec"]
    end = (execs[0] * 1.08 if execs else max((e.ts + (e.dur or 0) for e in spans), default=1.0)) or 1.0
    width, lane, left = 1100, 22, 190
    scale = (width - left - 20) / end
    rows: list[tuple[int, Event]] = []
    y = 34
    out = []
    for pid in pids:
        mine = sorted((e for e in spans if e.pid == pid), key=lambda e: (e.ts, -(e.dur or 0)))
        seen: list[Event] = []
        out.append(f'<text x="5" y="{y + 15}" font-size="12">{str(names.get(pid, pid)).removeprefix("sandbox ")}</text>')
        depth_max = 0
        for e in mine:
            depth = sum(1 for o in seen if o.ts <= e.ts < o.ts + (o.dur or 0))
            seen.append(e)
            depth_max = max(depth_max, depth)
            rows.append((y + depth * lane, e))
        y += (depth_max + 1) * lane + 12
    colors = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1", "#9c755f"]
    for i, (row, e) in enumerate(rows):
        if e.ts > end:
            continue
        x = left + e.ts * scale
        full = (e.dur or 0) * scale
        w = max(min(full, width - 20 - x), 1.5)
        title = f"{e.name}: {(e.dur or 0) / 1e3:.3f} ms at {e.ts / 1e3:.3f} ms"
        out.append(f'<rect x="{x:.1f}" y="{row}" width="{w:.1f}" height="{lane - 4}" '
                   f'fill="{colors[i % len(colors)]}"><title>{title}</title></rect>')
        label = e.name + (f" ({(e.dur or 0) / 1e3:.0f} ms, clipped)" if full > w + 1 else "")
        if w > 7 * len(label):
            out.append(f'<text x="{x + 3:.1f}" y="{row + 13}" font-size="10" fill="white">{label}</text>')
    for ms in range(0, int(end / 1e3) + 1, max(1, int(end / 1e3 / 10))):
        x = left + ms * 1e3 * scale
        out.append(f'<line x1="{x:.1f}" y1="24" x2="{x:.1f}" y2="{y}" stroke="#ddd"/>'
                   f'<text x="{x:.1f}" y="18" font-size="10" text-anchor="middle">{ms} ms</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y + 6}" '
            f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>' + "".join(out) + "</svg>\n")
