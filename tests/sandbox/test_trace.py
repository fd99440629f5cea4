from gofer.spans import Span
from sandbox.trace import Event, critical_path, read_trace, svg, table, top_level, write_trace


def ms(x):
    return int(x * 1e6)


def test_round_trip_table_and_critical_path(tmp_path):
    sup, gof, pid1 = 100, 200, 300
    spans = [
        Span("imports", ms(0), ms(1), sup), Span("closure + stream", ms(2), ms(3), sup),
        Span("event loop start", ms(3), ms(90), sup),
        Span("gofer:start", ms(0), ms(5), gof), Span("unshare", ms(5), ms(6), gof),
        Span("fork pid 1", ms(6), ms(7), pid1), Span("gpu mounts", ms(7), ms(9), pid1),
        Span("gpu libraries", ms(7), ms(8), pid1, {"count": 16}), Span("exec", ms(10), ms(10), pid1),
    ]
    path = tmp_path / "t.json"
    write_trace(str(path), spans)
    events = read_trace(str(path))
    assert {e.name for e in top_level(events)} == {s.name for s in spans} - {"gpu libraries"}
    # exec waited on the gofer's chain, not on the supervisor's event loop import
    assert [e.name for e in critical_path(events)] == ["gofer:start", "unshare", "fork pid 1", "gpu mounts", "exec"]
    out = table(events)
    assert "gofer (container pid 1)" in out and "count=16" in out
    assert out.strip().endswith("gofer:start -> unshare -> fork pid 1 -> gpu mounts -> exec")
    picture = svg(events)
    assert picture.startswith("<svg") and "cut at the axis' end" in picture  # the event loop's import runs past exec
    _every_phase_is_named(picture, events)


def _every_phase_is_named(picture: str, events) -> None:
    """Every phase of 1 ms or more is named in the picture's visible text (not in a tooltip),
    and so are the processes, the kinds of phase, the title's time to exec and the path."""
    import xml.etree.ElementTree as ET

    from sandbox.trace import KINDS, process_names

    root = ET.fromstring(picture)
    ns = "{http://www.w3.org/2000/svg}"
    texts = ["".join(t.itertext()) for t in root.iter(f"{ns}text")]
    shown = {t.removeprefix("\u2605 ") for t in texts}
    for e in events:
        if e.ph == "X" and (e.dur or 0) >= 1000:
            assert e.name in shown, e.name
    assert set(process_names(events).values()) <= shown
    assert {label for label, _, _ in KINDS} <= shown
    assert any(t.startswith("sandbox start: exec at 10.0 ms; critical path") for t in texts), texts[:3]
    marked = [t for t in texts if t.startswith("\u2605 ")]
    assert sorted(t.removeprefix("\u2605 ") for t in marked) == sorted(e.name for e in critical_path(events))


def test_empty_trace():
    assert critical_path([]) == [] and "PROCESS" in table([Event("process_name", "M", 1)])


def test_critical_path_crosses_to_the_supervisor_when_the_gofer_waited(tmp_path):
    sup, gof = 100, 200
    spans = [Span("imports + argv", ms(0), ms(1), sup), Span("closure + stream", ms(1), ms(7.9), sup),
             Span("gofer:start", ms(0), ms(3), gof), Span("devices", ms(3), ms(5), gof),
             Span("gpu mounts", ms(8), ms(9), gof), Span("exec", ms(9), ms(9), gof)]
    path = tmp_path / "t.json"
    write_trace(str(path), spans)
    names = [e.name for e in critical_path(read_trace(str(path)))]
    assert names == ["imports + argv", "closure + stream", "gpu mounts", "exec"]
