"""`vyre-async trace timeline`, behaviour by behaviour: what surviving mutants showed unchecked.

Issue 28: each test asserts what a user of `vyre_async.timeline` sees (the
trace-event document written, the report returned, how damaged OTLP input is
read) and names the mutants of ``scripts/mutation.py`` it kills. The mutants
that no user can tell apart are in ``scripts/mutation_equivalent/timeline.toml``.
"""

from __future__ import annotations

import contextlib
import io
import json
import locale
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from tests.trace_event_rules import check_trace_events as check_importer_rules
from vyre_async.timeline import (
    Span,
    TimelineReport,
    convert,
    read_otlp_json,
    to_trace_events,
    write_timeline,
)

MS = 1_000_000  # ns
MAX_NS = 1 << 63  # times from here on are damage, not times


def _reject_constant(name: str) -> None:
    raise AssertionError(f"{name} is not JSON")


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Fail (TimeoutError) if the block runs past ``seconds``: a walk that never ends."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def otlp_span(
    span_id: str,
    name: str = "request",
    start: Any = 1_000,
    end: Any = 2_000,
    *,
    trace: str | None = "t1",
    parent: str | None = None,
    attributes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One OTLP-JSON span; ``attributes`` maps keys to AnyValue objects."""
    span: dict[str, Any] = {
        "spanId": span_id,
        "name": name,
        "startTimeUnixNano": start,
        "endTimeUnixNano": end,
    }
    if trace is not None:
        span["traceId"] = trace
    if parent is not None:
        span["parentSpanId"] = parent
    if attributes:
        span["attributes"] = [{"key": k, "value": v} for k, v in attributes.items()]
    return span


def otlp_line(*spans: dict[str, Any], service: str | None = "app") -> str:
    """One OTLP-JSON batch line of ``spans`` from ``service`` (None: no resource at all)."""
    resource_spans: dict[str, Any] = {"scopeSpans": [{"spans": list(spans)}]}
    if service is not None:
        name = {"key": "service.name", "value": {"stringValue": service}}
        resource_spans["resource"] = {"attributes": [name]}
    return json.dumps({"resourceSpans": [resource_spans]}, ensure_ascii=False)


def convert_lines(*lines: str) -> tuple[dict[str, Any], TimelineReport]:
    """`write_timeline` on ``lines``: the document written (strict JSON) and the report."""
    target = io.StringIO()
    report = write_timeline(io.StringIO("\n".join(lines) + "\n"), target)
    document = json.loads(target.getvalue(), parse_constant=_reject_constant)
    check_importer_rules(target.getvalue())
    return document, report


def slices_of(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in document["traceEvents"] if e["ph"] == "X"]


def track_names(document: dict[str, Any]) -> dict[tuple[int, int], str]:
    return {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in document["traceEvents"]
        if e["name"] == "thread_name"
    }


def by_span(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["args"]["span_id"]: e for e in slices_of(document) if "span_id" in e["args"]}


# --- A whole document -----------------------------------------------------------------------


def test_a_small_trace_becomes_exactly_this_document() -> None:
    """Processes, tracks, slices, args and the report of a four-span trace, field by field.

    Kills: x__args__mutmut_6/7/8 (trace_id arg), x_to_trace_events__mutmut_23 (pids from 1),
    _32 (tids from 1), _308/309/310 (displayTimeUnit), x__track_group__mutmut_22-28,
    x_write_timeline__mutmut_16/18-24/26/27/36/39/40/41 (the report's counts),
    x_read_otlp_json__mutmut_9 (a blank line ends nothing), x__spans_of__mutmut_6/10/14-17
    (service.name from the resource).
    """
    request = otlp_span("r", "request", 1 * MS, 5 * MS, attributes={"route": {"stringValue": "/x"}})
    fetch = otlp_span("f", "fetch", 2 * MS, 3 * MS, parent="r")
    phase = {"doubleValue": 0.0005}
    work = otlp_span(
        "d",
        "vyre.dispatch",
        int(1.5 * MS),
        4 * MS,
        parent="r",  # a dispatch is a top-level slice of its own track even under a request
        attributes={
            "vyre.backend.id": {"stringValue": "cupy"},
            "vyre.stream": {"intValue": "1"},
            "vyre.program.op_id": {"stringValue": "std.xor"},
            "vyre.phase.compile_s": phase,
        },
    )
    graph = otlp_span(
        "g",
        "vyre.graph",
        1 * MS,
        2 * MS,
        trace="t2",
        attributes={"vyre.graph.label": {"stringValue": "mix"}},
    )
    document, report = convert_lines(
        otlp_line(request, fetch, service="api"),
        "",
        otlp_line(work, service="api"),
        "not json",
        otlp_line(graph, service=None),
    )
    assert document == {
        "displayTimeUnit": "ms",
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "api"}},
            {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "unknown service"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "spans"}},
            {"ph": "M", "name": "thread_name", "pid": 2, "tid": 1, "args": {"name": "arm graphs"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2,
             "args": {"name": "cupy stream 1"}},
            {"ph": "X", "name": "request", "cat": "request", "pid": 1, "tid": 1, "ts": 0.0,
             "dur": 4000.0, "args": {"route": "/x", "span_id": "r", "trace_id": "t1"}},
            {"ph": "X", "name": "fetch", "cat": "fetch", "pid": 1, "tid": 1, "ts": 1000.0,
             "dur": 1000.0, "args": {"span_id": "f", "trace_id": "t1", "parent_span_id": "r"}},
            {"ph": "X", "name": "std.xor", "cat": "vyre.dispatch", "pid": 1, "tid": 2,
             "ts": 500.0, "dur": 2500.0,
             "args": {"vyre.backend.id": "cupy", "vyre.stream": 1,
                      "vyre.program.op_id": "std.xor", "vyre.phase.compile_s": 0.0005,
                      "span_id": "d", "trace_id": "t1", "parent_span_id": "r"}},
            {"ph": "X", "name": "compile", "cat": "vyre.phase", "pid": 1, "tid": 2, "ts": 500.0,
             "dur": 500.0, "args": {"approximate": True}},
            {"ph": "X", "name": "graph mix", "cat": "vyre.graph", "pid": 2, "tid": 1, "ts": 0.0,
             "dur": 1000.0,
             "args": {"vyre.graph.label": "mix", "span_id": "g", "trace_id": "t2"}},
        ],
    }  # fmt: skip
    assert report == TimelineReport(spans=4, events=5, tracks=3, skipped_lines=(4,))


# --- Reading OTLP-JSON ----------------------------------------------------------------------

NAN = float("nan")


@pytest.mark.parametrize(
    ("value", "read", "written"),
    [
        ({"stringValue": "fast"}, "fast", "fast"),
        ({"stringValue": ""}, "", ""),
        ({"boolValue": True}, True, True),
        ({"boolValue": False}, False, False),
        ({"doubleValue": 2.5}, 2.5, 2.5),
        ({"doubleValue": NAN}, NAN, "nan"),  # (NaN is not JSON: written as text)
        ({"intValue": "42"}, 42, 42),  # (int64 is a string in OTLP-JSON)
        ({"intValue": "-9007199254740993"}, -9007199254740993, -9007199254740993),
        ({"intValue": 7}, 7, 7),
        (
            {"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "a"}]}},
            [1, "a"],
            [1, "a"],
        ),
        ({"arrayValue": {"values": [{"doubleValue": NAN}]}}, [NAN], ["nan"]),
        ({"arrayValue": {}}, [], []),  # (an empty repeated field is left out)
        ({"doubleValue": "NaN"}, NAN, "nan"),  # (proto3 JSON writes non-finite doubles so)
        ({"doubleValue": "-Infinity"}, float("-inf"), "-inf"),
        ({"doubleValue": "Infinity"}, float("inf"), "inf"),
        ({"kvlistValue": {}}, {}, {}),  # (an empty repeated field is left out)
        ({"doubleValue": 3}, 3.0, 3.0),
        (
            {"kvlistValue": {"values": [{"key": "a", "value": {"intValue": "1"}}, {"key": "b"}]}},
            {"a": 1, "b": None},
            {"a": 1, "b": None},
        ),
        (
            {"kvlistValue": {"values": [{"key": "x", "value": {"doubleValue": NAN}}]}},
            {"x": NAN},
            {"x": "nan"},
        ),
        ({"bytesValue": "AAE="}, "AAE=", "AAE="),  # (bytes: their base64 text)
        ({}, None, None),  # (a value of no kind)
    ],
    ids=repr,
)
def test_attribute_values_are_read_by_kind_and_written_as_args(
    value: dict[str, Any], read: Any, written: Any
) -> None:
    """Kills: x__value__mutmut_1-6 (string, bool), _19-22 (arrays), _24/25/27/31/32 (array
    values, empty arrays), x__json_value__mutmut_5 (array items written)."""
    line = otlp_line(otlp_span("a", attributes={"k": value}))
    spans, skipped = read_otlp_json([line])
    assert skipped == [] and len(spans) == 1
    got = spans[0].attributes["k"]
    assert repr(got) == repr(read) and type(got) is type(read)  # (repr: NaN equals itself)
    document, _ = convert_lines(line)
    assert by_span(document)["a"]["args"]["k"] == written


def test_an_attribute_without_a_value_reads_as_none_and_keeps_its_span() -> None:
    """Kills: x__attributes__mutmut_5, _7 (a missing value made the span unreadable)."""
    line = otlp_line(otlp_span("a") | {"attributes": [{"key": "k"}]})
    spans, skipped = read_otlp_json([line])
    assert [s.attributes for s in spans] == [{"k": None}] and skipped == []


def test_the_service_is_the_resource_service_name_else_unknown() -> None:
    """Kills: x__spans_of__mutmut_6/10/14-17/19-27 (the resource and its service.name)."""
    named = otlp_line(otlp_span("a"), service="ray worker 3")
    bare = otlp_line(otlp_span("b"), service=None)
    other = json.dumps(
        {
            "resourceSpans": [
                {
                    "resource": {"attributes": [{"key": "host", "value": {"stringValue": "h"}}]},
                    "scopeSpans": [{"spans": [otlp_span("c")]}],
                }
            ]
        }
    )
    spans, skipped = read_otlp_json([named, bare, other])
    assert skipped == []
    assert [(s.span_id, s.service) for s in spans] == [
        ("a", "ray worker 3"),
        ("b", "unknown service"),
        ("c", "unknown service"),
    ]
    document, _ = convert_lines(named, bare)
    processes = [e["args"]["name"] for e in document["traceEvents"] if e["name"] == "process_name"]
    assert processes == ["ray worker 3", "unknown service"]


def test_batches_without_scope_spans_or_spans_are_empty_not_damaged() -> None:
    """Kills: x__spans_of__mutmut_29/31 (no scopeSpans), _36/38 (no spans)."""
    line = json.dumps(
        {
            "resourceSpans": [
                {"resource": {}},
                {"scopeSpans": [{}, {"spans": [otlp_span("a")]}]},
                {"scopeSpans": [{"spans": [otlp_span("b")]}]},
            ]
        }
    )
    spans, skipped = read_otlp_json([line])
    assert [s.span_id for s in spans] == ["a", "b"] and skipped == []


@pytest.mark.parametrize(
    ("start", "end", "kept"),
    [
        (0, 0, (0, 0)),  # the epoch itself is a time
        ("0", "5", (0, 5)),
        (0, MAX_NS - 1, (0, MAX_NS - 1)),
        (MAX_NS - 1, MAX_NS - 1, (MAX_NS - 1, MAX_NS - 1)),
        (10, 4, (10, 10)),  # a clock that stepped back: zero length
        (MAX_NS, MAX_NS - 1, None),
        (MAX_NS - 1, MAX_NS, None),
        (0, MAX_NS, None),
        (MAX_NS, 0, None),
        (-1, 5, None),
        (5, -1, None),
    ],
)
def test_span_times_inside_the_range_are_kept_outside_it_skipped(
    start: Any, end: Any, kept: tuple[int, int] | None
) -> None:
    """Kills: x__spans_of__mutmut_51-57 (the bounds of the time range)."""
    spans, skipped = read_otlp_json([otlp_line(otlp_span("a", start=start, end=end))])
    assert [(s.start_ns, s.end_ns) for s in spans] == ([kept] if kept else [])
    assert skipped == ([] if kept else [1])


def test_missing_trace_and_parent_ids_are_empty_and_written_as_such() -> None:
    """Kills: x__spans_of__mutmut_59/75-83 (traceId), _90/92/96 (parentSpanId)."""
    line = otlp_line(otlp_span("a", trace=None), otlp_span("b", trace="abc", parent="zz"))
    spans, _ = read_otlp_json([line])
    assert [(s.trace_id, s.parent_id) for s in spans] == [("", ""), ("abc", "zz")]
    document, _ = convert_lines(line)
    args = {k: v["args"] for k, v in by_span(document).items()}
    assert args == {
        "a": {"span_id": "a", "trace_id": ""},
        "b": {"span_id": "b", "trace_id": "abc", "parent_span_id": "zz"},
    }


def test_blank_lines_are_passed_over_and_later_lines_read() -> None:
    """Kills: x_read_otlp_json__mutmut_9 (a blank line stopped the reading)."""
    lines = [otlp_line(otlp_span("a")), "", "   ", otlp_line(otlp_span("b")), "\n"]
    spans, skipped = read_otlp_json(lines)
    assert [s.span_id for s in spans] == ["a", "b"] and skipped == []


def test_a_bad_span_costs_only_itself_even_before_good_ones() -> None:
    """Kills: x_read_otlp_json__mutmut_17 (the spans after a bad one in its line were lost)."""
    bad = otlp_span("bad", start="soon")
    line = otlp_line(otlp_span("a"), bad, otlp_span("b"), otlp_span("c", start=MAX_NS))
    spans, skipped = read_otlp_json([otlp_line(otlp_span("x")), line])
    assert [s.span_id for s in spans] == ["x", "a", "b"] and skipped == [2]


# --- Names and tracks -----------------------------------------------------------------------

OP = {"vyre.program.op_id": "std.xor"}


@pytest.mark.parametrize(
    ("name", "attributes", "shown"),
    [
        ("vyre.dispatch", {"vyre.label": "saxpy step", **OP}, "saxpy step"),
        ("vyre.dispatch", {"vyre.label": "", **OP}, "std.xor"),
        ("vyre.dispatch", OP, "std.xor"),
        ("vyre.dispatch", {}, "dispatch"),
        ("vyre.dispatch", {**OP, "vyre.arm.index": 2}, "std.xor [arm 2]"),
        ("vyre.dispatch", {**OP, "vyre.arm.index": 0}, "std.xor [arm 0]"),
        (
            "vyre.dispatch",
            {**OP, "vyre.arm.label": "mix", "vyre.arm.index": 2},
            "std.xor [arm mix]",
        ),
        (
            "vyre.dispatch",
            {**OP, "vyre.arm.index": 1, "vyre.policy.arm.layer": 0},
            "std.xor [arm 1, layer 0]",
        ),
        ("vyre.dispatch", {**OP, "vyre.policy.arm.layer": 3}, "std.xor"),  # no arm, no suffix
        ("vyre.graph", {"vyre.graph.label": "mix"}, "graph mix"),
        ("vyre.graph", {"vyre.graph.label": ""}, "vyre.graph"),
        ("vyre.graph", {}, "vyre.graph"),
        ("request", {"vyre.graph.label": "mix"}, "request"),  # only a graph is named by it
        ("request", {"vyre.label": "x"}, "request"),
    ],
)
def test_slice_names(name: str, attributes: dict[str, Any], shown: str) -> None:
    """Kills: x__slice_name__mutmut_11 (graph label on other spans), _19-21 (vyre.label),
    _25/26 (the default name), _29/31/34-36 (arm index), _46/48 (the layer suffix)."""
    span = Span("t", "a", "", name, 0, MS, "app", attributes)
    (slice_,) = [e for e in to_trace_events([span])["traceEvents"] if e.get("cat") == name]
    assert slice_["name"] == shown


@pytest.mark.parametrize(
    ("name", "attributes", "track"),
    [
        ("vyre.dispatch", {"vyre.backend.id": "cupy", "vyre.stream": 0}, "cupy stream 0"),
        ("vyre.dispatch", {"vyre.backend.id": "cupy"}, "cupy"),
        ("vyre.dispatch", {"vyre.stream": 2}, "backend stream 2"),
        ("vyre.dispatch", {}, "backend"),
        ("vyre.graph", {"vyre.backend.id": "cupy"}, "arm graphs"),
        ("request", {"vyre.stream": 1}, "spans"),
        ("vyre.launch", {}, "spans"),
    ],
)
def test_track_names(name: str, attributes: dict[str, Any], track: str) -> None:
    """Kills: x__track_group__mutmut_7/9/12/13 (no backend), _19/21 (no stream), _22-28."""
    document = to_trace_events([Span("t", "a", "", name, 0, MS, "app", attributes)])
    assert list(track_names(document).values()) == [track]


def test_concurrent_top_level_slices_get_named_lanes_the_longest_first() -> None:
    """Kills: x_to_trace_events__mutmut_35 (lane names), _249 (the longer of two slices that
    start together takes the first lane)."""
    spans = [
        Span("t", "short", "", "vyre.dispatch", 0, 5 * MS, "app", {"vyre.backend.id": "ref"}),
        Span("t", "long", "", "vyre.dispatch", 0, 10 * MS, "app", {"vyre.backend.id": "ref"}),
        Span("t", "mid", "", "vyre.dispatch", 2 * MS, 3 * MS, "app", {"vyre.backend.id": "ref"}),
        Span("t", "late", "", "vyre.dispatch", 6 * MS, 7 * MS, "app", {"vyre.backend.id": "ref"}),
    ]
    document = to_trace_events(spans)
    check_importer_rules(json.dumps(document))
    names = track_names(document)
    where = {k: names[(e["pid"], e["tid"])] for k, e in by_span(document).items()}
    assert where == {
        "long": "ref",
        "short": "ref · lane 1",
        "mid": "ref · lane 2",
        "late": "ref · lane 1",  # the first lane free at its start
    }


# --- Nesting --------------------------------------------------------------------------------


def test_children_that_touch_their_parent_or_each_other_nest_on_its_track() -> None:
    """Kills: x_to_trace_events__mutmut_146 (a child at its parent's start), _171 (a child
    ending at its parent's end), _182 (a child starting where its sibling ended)."""
    spans = [
        Span("t", "r", "", "request", 0, 10 * MS, "app"),
        Span("t", "a", "r", "fetch", 0, 4 * MS, "app"),
        Span("t", "b", "r", "fetch", 4 * MS, 10 * MS, "app"),
        Span("t", "c", "b", "fetch", 4 * MS, 10 * MS, "app"),
    ]
    document = to_trace_events(spans)
    slices = check_importer_rules(json.dumps(document))
    parents = {
        s.event["args"]["span_id"]: s.parent and s.parent.event["args"]["span_id"] for s in slices
    }
    assert parents == {"r": None, "a": "r", "b": "r", "c": "b"}
    assert len(track_names(document)) == 1


def test_a_chain_deeper_than_perfetto_keeps_fills_each_track_to_255() -> None:
    """Kills: x_to_trace_events__mutmut_157 (the root counted at depth 1), _187 (one level
    short), _227 (a lane's first slice counted at depth 1)."""
    chain = [Span("t", "c0", "", "request", 0, 10**6, "app")] + [
        Span("t", f"c{i}", f"c{i - 1}", "request", i, 10**6 - i, "app") for i in range(1, 600)
    ]
    document = to_trace_events(chain)
    slices = check_importer_rules(json.dumps(document))
    per_track: dict[int, int] = {}
    for s in slices:
        per_track[s.tid] = per_track.get(s.tid, 0) + 1
    assert sorted(per_track.values(), reverse=True) == [255, 255, 90]
    assert max(s.depth for s in slices) == 254


# --- Phases ---------------------------------------------------------------------------------


def _phases(span: Span, *children: Span) -> list[tuple[str, float, float, bool]]:
    document = to_trace_events([span, *children])
    check_importer_rules(json.dumps(document, allow_nan=False))
    return [
        (e["name"], e["ts"], e["dur"], e["args"]["approximate"])
        for e in slices_of(document)
        if e["cat"] == "vyre.phase"
    ]


def test_phase_durations_lay_out_from_the_start_and_to_the_end() -> None:
    """Kills: x__phase_slices__mutmut_51 (seconds to ns off by one in 1e9: a ns a second)."""
    seconds = {
        "vyre.phase.compile_s": 2.0,
        "vyre.phase.wait_s": 1.0,
        "vyre.phase.upload_s": 0.5,
        "vyre.phase.launch_s": 3.0,
        "vyre.phase.readback_s": 1.0,
    }
    head = Span("t", "h", "", "request", 0, 1000 * MS, "app")  # the origin: 1 s before
    dispatch = Span("t", "d", "", "vyre.dispatch", 1000 * MS, 11_000 * MS, "app", seconds)
    document = to_trace_events([head, dispatch])
    phases = [
        (e["name"], e["ts"], e["dur"]) for e in slices_of(document) if e["cat"] == "vyre.phase"
    ]
    assert phases == [
        ("compile", 1_000_000.0, 2_000_000.0),
        ("wait", 3_000_000.0, 1_000_000.0),
        ("upload", 6_500_000.0, 500_000.0),
        ("launch", 7_000_000.0, 3_000_000.0),
        ("readback", 10_000_000.0, 1_000_000.0),
    ]


@pytest.mark.parametrize("key", ["vyre.phase.compile_s", "vyre.phase.readback_s"])
def test_a_phase_longer_than_its_dispatch_covers_exactly_the_dispatch(key: str) -> None:
    """Kills: x__phase_slices__mutmut_50 (the clamp to the dispatch's length cut 10 ns short)."""
    span = Span("t", "d", "", "vyre.dispatch", 0, 10_000 * MS, "app", {key: 20.0})
    name = key.removeprefix("vyre.phase.").removesuffix("_s")
    assert _phases(span) == [(name, 0.0, 10_000_000.0, True)]


def test_a_zero_length_phase_is_left_out_and_the_phases_after_it_kept() -> None:
    """Kills: x_to_trace_events__mutmut_94 (the first zero-length phase ended the phases)."""
    durations = {"vyre.phase.compile_s": 0.0, "vyre.phase.launch_s": 0.004}
    span = Span("t", "d", "", "vyre.dispatch", 0, 10 * MS, "app", durations)
    assert _phases(span) == [("launch", 6000.0, 4000.0, True)]
    exact = Span("t", "e", "", "vyre.dispatch", 0, 10 * MS, "app")
    children = [
        Span("t", "p1", "e", "vyre.compile", MS, MS, "app"),
        Span("t", "p2", "e", "vyre.launch", 2 * MS, 5 * MS, "app"),
    ]
    assert _phases(exact, *children) == [("launch", 2000.0, 3000.0, False)]


@pytest.mark.parametrize(
    "value", [True, False, "0.002", None, [0.002], NAN, float("inf"), -float("inf")], ids=repr
)
def test_a_phase_duration_that_is_not_a_finite_number_is_left_out(value: Any) -> None:
    """Kills: x__seconds__mutmut_1 (bools and text read as seconds), _6 (NaN read as seconds:
    the conversion raised)."""
    attributes = {"vyre.phase.compile_s": value, "vyre.phase.launch_s": 0.004}
    span = Span("t", "d", "", "vyre.dispatch", 0, 10 * MS, "app", attributes)
    assert _phases(span) == [("launch", 6000.0, 4000.0, True)]


# --- Parent loops ---------------------------------------------------------------------------


def test_spans_in_a_parent_loop_are_top_level_and_reported() -> None:
    """A self-loop, and a 2-loop two spans above a chain: each looped span a top-level slice,
    the others nested under them, the loop's ids in the document and the report.

    Kills: x__nesting__mutmut_16/20/22/23/25-33/35/36/38-42 (the loop walk; _22/26/29/30
    never ended), x_to_trace_events__mutmut_313/314/315, x_write_timeline__mutmut_29/34/44/
    48/49 (the ids reported), _39 (slices counted, not metadata).
    """
    lines = [
        otlp_line(
            otlp_span("w", parent="z", start=3_000, end=4_000),
            otlp_span("z", parent="x", start=2_000, end=5_000),
            otlp_span("x", parent="y", start=1_000, end=6_000),
            otlp_span("y", parent="x", start=1_000, end=7_000),
            otlp_span("s", parent="s", start=8_000, end=9_000),
        )
    ]
    with time_limit(5):
        document, report = convert_lines(*lines)
    assert report.cyclic_spans == ("x", "y", "s")
    assert (report.spans, report.events, report.tracks) == (5, 5, 2)  # (3 metadata events)
    assert document["vyre.cyclic_spans"] == ["x", "y", "s"]
    slices = check_importer_rules(json.dumps(document))
    parents = {
        s.event["args"]["span_id"]: s.parent and s.parent.event["args"]["span_id"] for s in slices
    }
    assert parents == {"y": None, "x": None, "z": "x", "w": "z", "s": None}


def test_a_span_with_an_empty_id_is_no_loop_and_no_parent() -> None:
    """Kills: x__nesting__mutmut_5 (a span without a parent was looked up as the child of a
    span whose id is empty: that span became its own parent, a loop)."""
    lines = [otlp_line(otlp_span(""), otlp_span("b", start=1_200, end=1_500))]
    with time_limit(5):
        document, report = convert_lines(*lines)
    assert report.cyclic_spans == () and "vyre.cyclic_spans" not in document
    assert sorted(e["args"]["span_id"] for e in slices_of(document)) == ["", "b"]
    assert len(track_names(document)) == 2  # side by side: b is not nested under ""


def test_a_deep_chain_converts_in_linear_time() -> None:
    """Each span's parent walk stops at a span already known to reach a root (8000 deep:
    well under a second here; walking every chain to its root took minutes).

    Kills: x__nesting__mutmut_21, _24 (the walk went on to the root from every span).
    """
    depth = 8000
    chain = [Span("t", "c0", "", "request", 0, 10**9, "app")] + [
        Span("t", f"c{i}", f"c{i - 1}", "request", i, 10**9 - i, "app") for i in range(1, depth)
    ]
    with time_limit(3):
        document = to_trace_events(chain)
    assert len(slices_of(document)) == depth


# --- Writing --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        {"stringValue": {"x": NAN}},  # (an object where a string goes, holding NaN)
        {"stringValue": 5},
        {"boolValue": "true"},
        {"boolValue": 1},
        {"doubleValue": "2.5"},
        {"doubleValue": True},
        {"doubleValue": None},
        {"intValue": "1.5"},
        {"intValue": 2.5},
        {"intValue": False},
        {"bytesValue": 7},
        {"arrayValue": {"values": [{"stringValue": []}]}},
        {"kvlistValue": {"values": [{"key": 1, "value": {"intValue": "1"}}]}},
    ],
    ids=repr,
)
def test_a_value_of_the_wrong_type_for_its_kind_is_damage_reported_by_line(
    value: dict[str, Any],
) -> None:
    """Its span is skipped and its line reported; the rest is converted and valid JSON.

    (It used to pass through: an object holding NaN made the conversion raise and left
    the output cut short.) Kills: x_write_timeline__mutmut_7/10/11 (allow_nan dropped).
    """
    bad = otlp_line(otlp_span("a", attributes={"k": value}))
    good = otlp_line(otlp_span("b", attributes={"k": {"stringValue": "fine"}}))
    target = io.StringIO()
    report = write_timeline(io.StringIO(bad + "\n" + good + "\n"), target)
    assert report.skipped_lines == (1,) and report.spans == 1
    written = target.getvalue()
    assert "NaN" not in written
    assert [e["args"]["span_id"] for e in json.loads(written)["traceEvents"] if e["ph"] == "X"] == [
        "b"
    ]


def test_an_attribute_key_that_is_not_a_string_is_damage() -> None:
    line = otlp_line(otlp_span("a") | {"attributes": [{"key": 3, "value": {"intValue": "1"}}]})
    assert read_otlp_json([line]) == ([], [1])


@pytest.mark.skipif(bool(sys.flags.utf8_mode), reason="UTF-8 mode reads every file as UTF-8")
def test_convert_reads_the_trace_as_utf8_whatever_the_locale(tmp_path: Path) -> None:
    """Kills: x_convert__mutmut_2 (the trace read in the locale's encoding: ASCII under C)."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text(otlp_line(otlp_span("a"), service="café µs") + "\n", encoding="utf-8")
    output = tmp_path / "timeline.json"
    previous = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        report = convert(trace, output)
    finally:
        locale.setlocale(locale.LC_CTYPE, previous)
    assert report.spans == 1
    document = json.loads(output.read_text(encoding="utf-8"))
    assert document["traceEvents"][0]["args"]["name"] == "café µs"


def test_a_damaged_phase_of_a_very_long_dispatch_covers_it_exactly() -> None:
    """A phase clamped to a dispatch of 2**52 ns and more ends at its end, not 1 ns short.

    (The clamp went through float seconds and lost the last nanosecond past 2**51 ns.)
    Kills: x__phase_slices__mutmut_48, _49 (the bound computed otherwise).
    """
    for length in (4253050134376719, 2**62 + 1, 10_000_000_000):
        span = Span(
            "t", "d", "", "vyre.dispatch", 0, length, "app", {"vyre.phase.compile_s": 1e300}
        )
        events = [e for e in to_trace_events([span])["traceEvents"] if e["ph"] == "X"]
        durs = {e["cat"]: e["dur"] for e in events}
        assert durs["vyre.phase"] == durs["vyre.dispatch"] == round(length / 1000.0, 3)
