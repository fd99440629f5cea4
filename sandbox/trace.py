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


# One colour per kind of phase (the legend's order), by the phase's name
KINDS = (
    ("Python: start, imports", "#9c755f", ("import", "gofer:start")),
    ("namespaces, processes", "#4e79a7", ("unshare", "fork pid 1", "user", "exec", "setns")),
    ("GPU: discovery, plan, mounts", "#f28e2b", ("gpu", "discovery", "closure", "plan", "mounts", "state + bundle")),
    ("root filesystem", "#59a14f", ("rootfs", "spec mounts", "devices", "pivot_root", "masks", "bundle parse")),
    ("cgroup, devices, seccomp", "#e15759", ("cgroup", "device rules", "seccomp")),
    ("hooks", "#b07aa1", ()),
    ("waiting", "#bab0ac", ("wait", "supervise", "supervisor done")),
)
OTHER = ("other", "#76b7b2")


def kind_of(name: str) -> tuple[str, str]:
    if name.endswith("hooks"):
        return KINDS[5][0], KINDS[5][1]
    for label, colour, words in KINDS:
        if any(name.startswith(w) for w in words):
            return label, colour
    return OTHER


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def svg(events: list[Event]) -> str:
    """A Gantt chart of the start: one row per phase, grouped by process (each named in a
    header), every phase named beside its bar with its duration, one colour per kind of
    phase (legend below), the critical path outlined and marked, a title with the time to
    exec. The axis ends just after exec: longer spans are cut there and say so."""
    spans = [e for e in events if e.ph == "X"]
    names = process_names(events)
    pids = sorted({e.pid for e in spans}, key=lambda p: min(e.ts for e in spans if e.pid == p))
    execs = [e.ts for e in spans if e.name == "exec"]
    last = max((e.ts + (e.dur or 0) for e in spans), default=1.0)
    end = (execs[0] * 1.08 if execs else last) or 1.0
    crit = {id(e) for e in critical_path(events)}
    path = critical_path(events)
    width, row, left, right = 1300, 17, 330, 260
    scale = (width - left - right) / end
    out: list[str] = []
    total = (path[-1].ts + (path[-1].dur or 0) - path[0].ts) / 1e3 if path else last / 1e3
    title = (f"sandbox start: exec at {execs[0] / 1e3:.1f} ms" if execs else f"sandbox trace: {last / 1e3:.1f} ms")
    star = "\u2605"
    out.append(f'<text x="8" y="20" font-size="15" font-weight="bold">{_esc(title)}; critical path '
               f'{total:.1f} ms ({len(path)} phases, outlined and marked {star})</text>')
    y = 52
    for ms in _ticks(end / 1e3):
        x = left + ms * 1e3 * scale
        out.append(f'<text x="{x:.1f}" y="{y - 8}" font-size="10" text-anchor="middle" fill="#555">{ms:g} ms</text>')
    top = y - 4
    for pid in pids:
        out.append(f'<text x="8" y="{y + 12}" font-size="12" font-weight="bold">'
                   f'{_esc(str(names.get(pid, pid)))}</text>')
        y += row
        for e in sorted((e for e in spans if e.pid == pid), key=lambda e: e.ts):
            label, colour = kind_of(e.name)
            x = left + min(e.ts, end) * scale
            full = (e.dur or 0) * scale
            w = max(min(full, left + end * scale - x), 1.5)
            on_path = id(e) in crit
            extra = " ".join(f"{k}={v}" for k, v in e.args.items() if k != "name")
            bold = ' font-weight="bold"' if on_path else ""
            mark = star + " " if on_path else ""
            out.append(f'<text x="22" y="{y + 12}" font-size="11"{bold}>{mark}{_esc(e.name)}</text>')
            stroke = ' stroke="#000" stroke-width="1.5"' if on_path else ""
            out.append(f'<rect x="{x:.1f}" y="{y + 2}" width="{w:.1f}" height="{row - 4}" fill="{colour}"{stroke}>'
                       f"<title>{_esc(e.name)}: {(e.dur or 0) / 1e3:.3f} ms at {e.ts / 1e3:.3f} ms ({label})"
                       f"</title></rect>")
            cut = ", cut at the axis' end" if full > w + 1 or e.ts > end else ""
            note = f"{(e.dur or 0) / 1e3:.2f} ms{cut}" + (f"  {extra}" if extra else "")
            out.append(f'<text x="{x + w + 4:.1f}" y="{y + 12}" font-size="10" fill="#333">{_esc(note)}</text>')
            y += row
        y += 6
    for ms in _ticks(end / 1e3):
        x = left + ms * 1e3 * scale
        out.insert(0, f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{y}" stroke="#e4e4e4"/>')
    y += 10
    out.append(f'<text x="8" y="{y + 12}" font-size="12" font-weight="bold">kinds of phase</text>')
    x = 120
    for label, colour in [(k[0], k[1]) for k in KINDS] + [OTHER]:
        out.append(f'<rect x="{x}" y="{y + 2}" width="12" height="12" fill="{colour}"/>'
                   f'<text x="{x + 16}" y="{y + 12}" font-size="11">{_esc(label)}</text>')
        x += 24 + 6.2 * len(label)
    y += row + 10
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y}" font-family="sans-serif">'
            f'<rect width="100%" height="100%" fill="white"/>' + "".join(out) + "</svg>\n")


def _ticks(end_ms: float) -> list[float]:
    """Axis ticks every 1, 2, 5, 10 ... ms: about ten of them."""
    step = 1.0
    while end_ms / step > 12:
        step *= 2.5 if str(step)[0] == "2" else 2
    return [i * step for i in range(int(end_ms / step) + 1)]
