"""`vyre-async trace timeline`: OTLP-JSON trace files become Perfetto-ready trace events."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.otlp_receiver import parse_otlp_json
from tests.trace_event_rules import Slice, load
from tests.trace_event_rules import check_trace_events as check_importer_rules
from vyre_async.cli import main
from vyre_async.timeline import Span, read_otlp_json, to_trace_events

MS = 1_000_000  # ns


def check_trace_events(document: dict[str, Any] | str) -> list[dict[str, Any]]:
    """Assert Perfetto's rules (`tests.trace_event_rules`) and vyre's layout; return the X events.

    ``document`` is the text written, or the object `to_trace_events` returns
    (then written as `write_timeline` writes it). Beyond the format's rules:
    vyre writes only slices and metadata, names every process and track, and
    the nesting Perfetto builds is the one meant: a slice nests under its
    parent span's slice or under none (a dispatch: none), and under it when it
    lies within it on the same track; a phase nests under a dispatch.
    """
    text = document if isinstance(document, str) else json.dumps(document, allow_nan=False)
    slices = check_importer_rules(text)
    events = load(text)
    assert events and {e["ph"] for e in events} <= {"X", "M"}
    named = {(e["pid"], e.get("tid")) for e in events if e["ph"] == "M"}
    by_span = {s.event["args"]["span_id"]: s for s in slices if "span_id" in s.event["args"]}
    for s in slices:
        assert (s.pid, None) in named and (s.pid, s.tid) in named, ("unnamed track", s.event)
        args = s.event["args"]
        if s.event["cat"] == "vyre.phase":
            assert s.parent is not None and s.parent.event["cat"] == "vyre.dispatch", (
                "a phase outside its dispatch",
                s.event,
                s.parent and s.parent.event,
            )
            continue
        meant = by_span.get(args.get("parent_span_id", ""))
        if s.event["cat"] == "vyre.dispatch":
            meant = None
        within = meant is not None and (meant.pid, meant.tid) == (s.pid, s.tid)
        within = within and meant.start <= s.start < meant.end and s.end <= meant.end
        assert s.parent is meant or (s.parent is None and not within), (
            "nested under the wrong slice",
            s.event["name"],
            args.get("span_id"),
            s.parent and s.parent.event["args"].get("span_id"),
        )
    return [s.event for s in sorted(slices, key=lambda s: s.index)]


def phases_under(slices: list[Slice]) -> dict[str, list[str]]:
    """The phase names Perfetto nests under each dispatch slice, by the dispatch's span id."""
    out: dict[str, list[str]] = {}
    for s in slices:
        if s.event["cat"] == "vyre.dispatch":
            out.setdefault(s.event["args"]["span_id"], [])
        if s.event["cat"] == "vyre.phase" and s.parent is not None:
            out.setdefault(s.parent.event["args"]["span_id"], []).append(s.name)
    return out


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
    slices = check_trace_events(output.read_text())
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
    check_trace_events(output.read_text())


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


CONCURRENT = textwrap.dedent(
    """
    import sys
    import anyio, numpy as np
    from opentelemetry import trace
    from vyre_async import acquire_backend, telemetry
    from vyre_async.programs import elementwise_xor, saxpy
    from vyre_async.tracing import configure_tracing

    provider = configure_tracing("file:" + sys.argv[1])
    tracer = trace.get_tracer("timeline-test")
    backend = acquire_backend("reference")
    xor, axpy = elementwise_xor(4096), saxpy(1024)
    floats = [np.ones(1024, np.float32), np.ones(1024, np.float32), np.ones(1, np.float32)]

    async def run(program, inputs):
        await backend.dispatch(program, inputs)

    async def request(i):
        with tracer.start_as_current_span(f"request-{i}"):
            async with anyio.create_task_group() as tg:  # two dispatches in flight together
                tg.start_soon(run, xor, [np.full(4096, i, np.uint32)] * 2)
                tg.start_soon(run, axpy, floats)

    async def main():
        for detail in ("phases", "span"):  # phase child spans, then phase attributes
            telemetry.set_trace_detail(detail)
            async with anyio.create_task_group() as tg:
                for i in range(32):
                    tg.start_soon(request, i)

    anyio.run(main)
    provider.shutdown()
    """
)


def test_a_timeline_of_many_concurrent_dispatches_loads_in_perfetto_as_nested(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "trace.jsonl"
    subprocess.run(
        [sys.executable, "-c", CONCURRENT, str(trace)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    for line in trace.read_text().splitlines():
        parse_otlp_json(line)  # the input is proto-exact OTLP/JSON
    output = tmp_path / "timeline.json"
    assert main(["trace", "timeline", str(trace), "-o", str(output)]) == 0
    text = output.read_text()
    events = check_trace_events(text)
    slices = check_importer_rules(text)
    dispatches = [e for e in events if e["cat"] == "vyre.dispatch"]
    requests = [e for e in events if e["name"].startswith("request-")]
    assert len(dispatches) == 128 and len(requests) == 64
    phases = phases_under(slices)
    assert len(phases) == 128 and all(phases.values())  # each dispatch has its phases inside


#: Times on a coarse grid, in ms: equal starts and ends, zero lengths, nesting and overlap.
GRID = st.integers(0, 4)
PHASE_SECONDS = st.sampled_from([0.0, 0.0005, 0.001, 0.003, 1.0])
PHASE_KEYS = [
    "vyre.phase.compile_s",
    "vyre.phase.wait_s",
    "vyre.phase.upload_s",
    "vyre.phase.launch_s",
    "vyre.phase.readback_s",
]


@st.composite
def traces(draw: st.DrawFn) -> tuple[list[Span], dict[str, int]]:
    """Spans of requests, graphs, their children and dispatches; each dispatch's phase count."""
    spans: list[Span] = []
    phases: dict[str, int] = {}
    ids = itertools.count()

    def interval() -> tuple[int, int]:
        start = draw(GRID)
        return start * MS, draw(st.one_of(st.just(start), st.integers(start, 4))) * MS

    def add_dispatch(parent: str) -> None:
        span_id = f"d{next(ids)}"
        attributes: dict[str, Any] = {
            "vyre.backend.id": draw(st.sampled_from(["reference", "cupy"])),
            "vyre.program.op_id": "std.xor",
        }
        stream = draw(st.sampled_from([None, 0, 1]))
        if stream is not None:
            attributes["vyre.stream"] = stream
        start, end = interval()
        spans.append(Span("t", span_id, parent, "vyre.dispatch", start, end, "app", attributes))
        if draw(st.booleans()):  # the phases detail: child spans, anywhere, even outside
            names = draw(st.lists(st.sampled_from(["vyre.compile", "vyre.wait", "vyre.launch"])))
            for name in names:
                spans.append(Span("t", f"p{next(ids)}", span_id, name, *interval(), "app"))
            phases[span_id] = len(names)
        else:
            keys = draw(st.lists(st.sampled_from(PHASE_KEYS), unique=True))
            attributes.update({key: draw(PHASE_SECONDS) for key in keys})
            phases[span_id] = len(keys)

    def add_tree(parent: str, depth: int) -> None:
        span_id = f"s{next(ids)}"
        name = draw(st.sampled_from(["request", "vyre.graph", "fetch"]))
        service = draw(st.sampled_from(["app", "app", "worker"]))
        spans.append(Span("t", span_id, parent, name, *interval(), service))
        for _ in range(draw(st.integers(0, 3 if depth < 2 else 0))):
            if draw(st.booleans()):
                add_dispatch(span_id)
            else:
                add_tree(span_id, depth + 1)

    for _ in range(draw(st.integers(1, 3))):
        add_tree("", 0)
    for _ in range(draw(st.integers(0, 3))):
        add_dispatch("")
    return spans, phases


@settings(max_examples=300, deadline=None)
@given(traces())
def test_any_trace_becomes_a_timeline_perfetto_nests_as_meant(
    trace: tuple[list[Span], dict[str, int]],
) -> None:
    spans, phases = trace
    text = json.dumps(to_trace_events(spans), allow_nan=False)
    events = check_trace_events(text)
    dispatch_ids = {s.span_id for s in spans if s.name == "vyre.dispatch"}
    shown = [e["args"]["span_id"] for e in events if e["cat"] != "vyre.phase"]
    assert sorted(shown) == sorted(s.span_id for s in spans if s.parent_id not in dispatch_ids)
    # Every phase Perfetto shows nests under its own dispatch: each dispatch has the
    # phases it has in a timeline of its own (zero-length ones are left out).
    nested = phases_under(check_importer_rules(text))
    for span_id, defined in phases.items():
        alone = [s for s in spans if span_id in (s.span_id, s.parent_id)]
        own = [e for e in to_trace_events(alone)["traceEvents"] if e.get("cat") == "vyre.phase"]
        assert len(nested[span_id]) == len(own) <= defined, span_id


def test_spans_nested_deeper_than_perfetto_keeps_go_to_lanes() -> None:
    chain = [Span("t1", "c0", "", "request", 0, 10**6, "app")] + [
        Span("t1", f"c{i}", f"c{i - 1}", "request", i, 10**6 - i, "app") for i in range(1, 600)
    ]
    events = check_trace_events(to_trace_events(chain))  # depth < 255 on every track
    assert len(events) == 600 and len({e["tid"] for e in events}) == 3  # 600 = 255 + 255 + 90


def _events(*events: dict[str, Any]) -> str:
    meta = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "p"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "t"}},
    ]
    return json.dumps({"traceEvents": meta + list(events), "displayTimeUnit": "ms"})


def _begin_end(ts: float, end: float) -> list[dict[str, Any]]:
    return [
        {"ph": p, "name": "be", "pid": 1, "tid": 1, "ts": t} for p, t in (("B", ts), ("E", end))
    ]


def _x(ts: float, dur: float, **extra: Any) -> dict[str, Any]:
    return {"ph": "X", "name": "s", "pid": 1, "tid": 1, "ts": ts, "dur": dur, **extra}


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ('{"traceEvents": {}}', "not an array"),
        (json.dumps({"traceEvents": [], "displayTimeUnit": "s"}), "displayTimeUnit"),
        ('{"traceEvents": [{"ph": "X", "pid": 1, "tid": 1, "ts": NaN, "dur": 1}]}', "NaN"),
        (_events({"ph": "Q", "pid": 1, "tid": 1, "ts": 0}), "ph="),
        (_events({"ph": "X", "pid": 1, "tid": 1, "dur": 1}), "no ts"),
        (_events(_x(0.0001, 1)), "nanoseconds"),
        (_events(_x("5", 1)), "ts"),
        (_events(_x(0, 1, pid="1")), "pid"),
        (_events(_x(0, 1, tid=-1)), "tid"),
        (_events(_x(0, 1, stack=[1, 2])), "array"),
        (_events(_x(0, 1, args=[1])), "args"),
        (_events({"ph": "X", "pid": 1, "tid": 1, "ts": 0}), "without dur"),
        (_events(_x(5, -1)), "negative"),
        (_events({"ph": "B", "pid": 1, "tid": 1, "ts": 0}), "B without E"),
        (_events({"ph": "E", "pid": 1, "tid": 1, "ts": 0}), "E without"),
        (_events({"ph": "i", "pid": 1, "tid": 1, "ts": 0, "s": "x"}), "scope"),
        (_events({"ph": "M", "name": "thread_title", "pid": 1, "tid": 1, "args": {}}), "metadata"),
        (_events({"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {}}), "name"),
        (_events(_x(0, 10), _x(5, 10)), "ends after it"),  # partial overlap
        (_events(_x(5, 10), *_begin_end(0, 10)), "ends after it"),  # B/E nest like slices
        (_events(_x(0, 1), _x(0, 10)), "shorter slice comes first"),
        (_events(*[_x(i / 1000, 1000 - i / 500) for i in range(300)]), "deep"),
    ],
)
def test_the_importer_rules_refuse_what_perfetto_refuses(text: str, complaint: str) -> None:
    with pytest.raises((AssertionError, KeyError)) as refused:
        check_importer_rules(text)
    assert complaint in str(refused.value)


def test_the_importer_rules_accept_what_perfetto_nests() -> None:
    text = _events(
        _x(0, 10),
        _x(0, 4),  # nested at the same start: the longer one first
        *[{"ph": "i", "pid": 1, "tid": 1, "ts": 3, "s": "t"}] * 2,  # instants stack
        *_begin_end(4, 6),  # B/E nest like slices
        _x(6, 4),  # from the end of the last one to the end of the parent
        _x(10, 0),  # a zero-length slice at its parent's end is after it, not in it
    )
    slices = check_importer_rules(text)
    depths = [s.depth for s in sorted(slices, key=lambda s: (s.start, s.index))]
    assert depths == [0, 1, 2, 3, 1, 1, 0]
