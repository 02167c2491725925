"""`vyre-async trace timeline`: OTLP-JSON trace files become Perfetto-ready trace events."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vyre_async.cli import main
from vyre_async.timeline import Span, read_otlp_json, to_trace_events

MS = 1_000_000  # ns


def check_trace_events(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Assert the trace-event format: fields, types, and proper nesting per track."""
    events = document["traceEvents"]
    assert isinstance(events, list) and events
    slices = []
    for event in events:
        assert event["ph"] in ("X", "M")
        assert isinstance(event["pid"], int)
        if event["ph"] == "M":
            assert event["name"] in ("process_name", "thread_name")
            assert isinstance(event["args"]["name"], str)
            if event["name"] == "thread_name":
                assert isinstance(event["tid"], int)
            continue
        for key, kind in (("name", str), ("tid", int), ("ts", float), ("dur", float)):
            assert isinstance(event[key], kind), (key, event)
        assert event["ts"] >= 0 and event["dur"] >= 0
        slices.append(event)
    named = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    by_track: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for event in slices:
        assert (event["pid"], event["tid"]) in named  # every track has a name
        by_track.setdefault((event["pid"], event["tid"]), []).append(event)
    for track in by_track.values():
        assert track == sorted(track, key=lambda e: (e["ts"], -e["dur"]))  # ordered per track
        open_ends: list[int] = []
        for event in track:  # a slice is inside the enclosing one, or after it: exactly, in ns
            start = round(event["ts"] * 1000)
            end = start + round(event["dur"] * 1000)
            while open_ends and start >= open_ends[-1]:
                open_ends.pop()
            if open_ends:
                assert end <= open_ends[-1], ("partial overlap", event)
            open_ends.append(end)
    json.dumps(document, allow_nan=False)  # serialisable as is, strict JSON
    return slices


def dispatch(span_id: str, start_ms: float, end_ms: float, **attributes: Any) -> Span:
    base = {"vyre.backend.id": "reference", "vyre.program.op_id": "std.xor"}
    return Span(
        trace_id="t1",
        span_id=span_id,
        parent_id=attributes.pop("parent", ""),
        name="vyre.dispatch",
        start_ns=int(start_ms * MS),
        end_ns=int(end_ms * MS),
        service=attributes.pop("service", "app"),
        attributes={**base, **attributes},
    )


def test_dispatches_in_flight_together_sit_on_separate_lanes() -> None:
    spans = [
        dispatch("a", 0, 10),
        dispatch("b", 2, 8),  # overlaps a
        dispatch("c", 12, 14),  # after both: back on the first lane
    ]
    slices = check_trace_events(to_trace_events(spans))
    tid = {e["args"]["span_id"]: e["tid"] for e in slices if e["cat"] == "vyre.dispatch"}
    assert tid["a"] != tid["b"] and tid["c"] == tid["a"]


def test_streams_and_services_get_their_own_tracks_and_processes() -> None:
    spans = [
        dispatch("a", 0, 10, **{"vyre.backend.id": "cupy", "vyre.stream": 0}),
        dispatch("b", 0, 10, **{"vyre.backend.id": "cupy", "vyre.stream": 1}),
        dispatch("w", 1, 9, service="vyre-ray-worker-0", parent="a"),
    ]
    document = to_trace_events(spans)
    slices = check_trace_events(document)
    names = {
        (e["pid"], e.get("tid")): e["args"]["name"]
        for e in document["traceEvents"]
        if e["ph"] == "M"
    }
    where = {
        e["args"]["span_id"]: (e["pid"], e["tid"]) for e in slices if e["cat"] == "vyre.dispatch"
    }
    assert names[where["a"]] == "cupy stream 0" and names[where["b"]] == "cupy stream 1"
    assert where["w"][0] != where["a"][0]  # the worker's process
    assert names[(where["w"][0], None)] == "vyre-ray-worker-0"


def test_phases_nest_inside_their_dispatch() -> None:
    approximate = dispatch(
        "a", 0, 10, **{"vyre.phase.compile_s": 0.002, "vyre.phase.launch_s": 0.005}
    )
    exact = dispatch("b", 20, 30)
    child = Span("t1", "c", "b", "vyre.launch", 22 * MS, 29 * MS, "app")
    slices = check_trace_events(to_trace_events([approximate, exact, child]))
    phases = {(e["name"], e["args"]["approximate"]): e for e in slices if e["cat"] == "vyre.phase"}
    assert phases["compile", True]["ts"] == 0 and phases["compile", True]["dur"] == 2000
    assert phases["launch", True]["ts"] + phases["launch", True]["dur"] == 10_000  # ends it
    assert (phases["launch", False]["ts"], phases["launch", False]["dur"]) == (22_000, 7000)


def test_arm_graph_layers_are_named_and_graphs_have_a_track() -> None:
    graph = Span("t1", "g", "", "vyre.graph", 0, 20 * MS, "app", {"vyre.graph.label": "mix"})
    arms = [
        dispatch(
            "a", 1, 5, parent="g", **{"vyre.arm.label": "encrypt", "vyre.policy.arm.layer": 0}
        ),
        dispatch("b", 6, 9, parent="g", **{"vyre.arm.label": "mix", "vyre.policy.arm.layer": 1}),
    ]
    slices = check_trace_events(to_trace_events([graph, *arms]))
    names = {e["name"] for e in slices}
    assert {"graph mix", "std.xor [arm encrypt, layer 0]", "std.xor [arm mix, layer 1]"} <= names


def test_a_trace_of_the_demo_converts_through_the_command_line(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    env = {**os.environ, "VYRE_TRACE_DETAIL": "phases"}
    subprocess.run(
        [sys.executable, "-m", "vyre_async.cli", "demo", "--tasks", "4", "--per-task", "5",
         "--backend", "reference", "--trace", f"file:{trace}"],
        check=True, env=env, capture_output=True, timeout=120,
    )  # fmt: skip
    output = tmp_path / "timeline.json"
    assert main(["trace", "timeline", str(trace), "-o", str(output)]) == 0
    slices = check_trace_events(json.loads(output.read_text()))
    dispatches = [e for e in slices if e["cat"] == "vyre.dispatch"]
    assert len(dispatches) == 20
    assert any(e["cat"] == "vyre.phase" and e["args"]["approximate"] is False for e in slices)


def test_bad_lines_are_skipped_and_reported_the_rest_converted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    span = {
        "traceId": "t",
        "spanId": "a",
        "name": "vyre.dispatch",
        "startTimeUnixNano": "1000000",
        "endTimeUnixNano": "2000000",
        "attributes": [{"key": "vyre.stream", "value": {"intValue": "3"}}],
    }
    service = {"key": "service.name", "value": {"stringValue": "s"}}
    good = {
        "resourceSpans": [
            {"resource": {"attributes": [service]}, "scopeSpans": [{"spans": [span]}]}
        ]
    }
    trace = tmp_path / "cut.jsonl"
    trace.write_text(json.dumps(good) + "\nnot json\n" + json.dumps(good)[:40])
    spans, skipped = read_otlp_json(trace.read_text().splitlines())
    assert len(spans) == 1 and spans[0].attributes["vyre.stream"] == 3 and skipped == [2, 3]
    output = tmp_path / "out.json"
    assert main(["trace", "timeline", str(trace), "-o", str(output)]) == 0
    assert "skipped 2 line(s)" in capsys.readouterr().err
    check_trace_events(json.loads(output.read_text()))


def test_missing_or_empty_trace_files_are_refused_with_a_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace", "timeline", str(tmp_path / "nope.jsonl"), "-o", "x.json"]) == 2
    assert "Fix: write one first" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert main(["trace", "timeline", str(empty), "-o", str(tmp_path / "o.json")]) == 1
    assert "holds no spans" in capsys.readouterr().err


def test_the_arm_graph_example_writes_a_timeline_with_its_layers(tmp_path: Path) -> None:
    output = tmp_path / "arms.json"
    example = Path(__file__).resolve().parents[1] / "examples" / "megakernel_arms.py"
    run = subprocess.run(
        [
            sys.executable,
            str(example),
            "--size",
            "4096",
            "--rounds",
            "1",
            "--timeline",
            str(output),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "timeline:" in run.stdout
    document = json.loads(output.read_text())
    slices = check_trace_events(document)
    layers = {e["name"] for e in slices if "layer" in e["name"]}
    assert {"std.xor [arm encrypt, layer 0]", "std.xor [arm mix, layer 1]"} <= layers
    tracks = {e["args"]["name"] for e in document["traceEvents"] if e["name"] == "thread_name"}
    assert "arm graphs" in tracks


def test_concurrent_children_get_lanes_not_dropped_and_nothing_is_invalid_json() -> None:
    request = Span("t1", "r", "", "request", 0, 10 * MS, "app")
    first = Span("t1", "c1", "r", "fetch", 1 * MS, 6 * MS, "app", {"x": float("nan")})
    second = Span("t1", "c2", "r", "fetch", 2 * MS, 5 * MS, "app")  # concurrent with first
    instant = Span("t1", "c3", "r", "mark", 7 * MS, 7 * MS, "app")  # zero length: kept
    document = to_trace_events([request, first, second, instant])
    slices = check_trace_events(document)
    by_id = {e["args"]["span_id"]: e for e in slices}
    assert set(by_id) == {"r", "c1", "c2", "c3"}  # nothing dropped
    assert by_id["c1"]["tid"] != by_id["c2"]["tid"]  # side by side
    assert by_id["c1"]["args"]["x"] == "nan" and by_id["c1"]["args"]["parent_span_id"] == "r"


def test_a_bad_span_loses_only_itself_and_the_trace_file_is_never_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = {"spanId": "a", "name": "s", "startTimeUnixNano": "1000", "endTimeUnixNano": "2000"}
    bad = {"spanId": "b", "name": "s", "startTimeUnixNano": "soon"}
    line = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [good, bad]}]}]})
    spans, skipped = read_otlp_json([line])
    assert [s.span_id for s in spans] == ["a"] and skipped == [1]
    trace = tmp_path / "trace.jsonl"
    trace.write_text(line + "\n")
    assert main(["trace", "timeline", str(trace), "-o", str(trace)]) == 2
    assert "erase the trace" in capsys.readouterr().err
    assert trace.read_text() == line + "\n"
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    output = tmp_path / "out.json"
    assert main(["trace", "timeline", str(binary), "-o", str(output)]) == 2
    assert "cannot read" in capsys.readouterr().err and not output.exists()
