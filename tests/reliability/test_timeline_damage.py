"""Issue 26, defect 6: one damaged line of a trace never costs the good spans, and no span vanishes.

A line nested past the recursion limit, ``Infinity`` or 10**30 where nanoseconds
go, a phase of 1e300 s: each used to raise out of the conversion and lose every
span. A span naming itself as parent, or two naming each other, belonged to no
root and vanished without a word. Now damaged lines are skipped and reported,
looped spans are top-level slices and reported, and deep nesting converts
without recursion.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from vyre_async.cli import main
from vyre_async.timeline import read_otlp_json, to_trace_events, write_timeline


def _span(span_id: str, parent: str = "", name: str = "request", **fields: Any) -> dict[str, Any]:
    span: dict[str, Any] = {
        "traceId": "t1",
        "spanId": span_id,
        "name": name,
        "startTimeUnixNano": fields.pop("start", 1_000),
        "endTimeUnixNano": fields.pop("end", 2_000),
        **fields,
    }
    if parent:
        span["parentSpanId"] = parent
    return span


def _line(*spans: dict[str, Any]) -> str:
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "app"}}]}
    return json.dumps(
        {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": list(spans)}]}]}
    )


PHASE = [{"key": "vyre.phase.compile_s", "value": {"doubleValue": 1e300}}]
LINES = [
    _line(_span("good1")),  # 1
    "[" * 100_000,  # 2: nested past the recursion limit
    _line(_span("inf", start=float("inf"))),  # 3: Infinity (json.dumps writes it)
    _line(_span("d1", name="vyre.dispatch", attributes=PHASE)),  # 4: kept, phase clamped
    _line(_span("huge", start=10**30, end=10**30)),  # 5: not a time
    _line(_span("self", parent="self")),  # 6: names itself
    _line(_span("a", parent="b"), _span("b", parent="a")),  # 7: a 2-cycle
    _line(_span("good2")),  # 8
]


def test_damaged_lines_are_skipped_and_the_good_spans_kept() -> None:
    spans, skipped = read_otlp_json(LINES)
    assert skipped == [2, 3, 5]
    assert {s.span_id for s in spans} == {"good1", "d1", "self", "a", "b", "good2"}


def test_a_huge_phase_is_clamped_to_its_dispatch() -> None:
    spans, _ = read_otlp_json([LINES[3]])
    events = to_trace_events(spans)["traceEvents"]
    compile_slice = next(e for e in events if e.get("name") == "compile")
    dispatch = next(e for e in events if e.get("cat") == "vyre.dispatch")
    assert compile_slice["dur"] == dispatch["dur"] == 1.0  # the whole 1 µs dispatch, no more


def test_spans_in_a_parent_loop_are_top_level_slices_and_reported() -> None:
    out = io.StringIO()
    report = write_timeline(io.StringIO("\n".join(LINES)), out)
    assert sorted(report.cyclic_spans) == ["a", "b", "self"]
    names = [
        e["args"]["span_id"]
        for e in json.loads(out.getvalue())["traceEvents"]
        if e["ph"] == "X" and "span_id" in e["args"]  # (phase slices have none)
    ]
    assert {"self", "a", "b", "good1", "good2", "d1"} <= set(names)
    assert report.skipped_lines == (2, 3, 5)


def test_a_chain_of_thousands_of_nested_spans_converts() -> None:
    chain = [_span("c0", start=0, end=10**6)] + [
        _span(f"c{i}", parent=f"c{i - 1}", start=i, end=10**6 - i) for i in range(1, 5_000)
    ]
    spans, skipped = read_otlp_json([_line(*chain)])
    events = to_trace_events(spans)["traceEvents"]
    assert not skipped and sum(e["ph"] == "X" for e in events) == 5_000


def test_the_command_reports_what_it_skipped_and_looped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(LINES) + "\n")
    status = main(["trace", "timeline", str(trace), "-o", str(tmp_path / "timeline.json")])
    err = capsys.readouterr().err
    assert status == 0, err
    assert "skipped 3 line(s)" in err and "2, 3, 5" in err
    assert "3 span(s) name a parent chain that loops" in err
    assert "Traceback" not in err
