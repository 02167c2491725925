"""A trace to look at: OTLP-JSON spans become Chrome trace-event JSON for Perfetto.

``vyre-async trace timeline TRACE.jsonl -o timeline.json`` reads the OTLP-JSON
lines that ``--trace file:PATH`` (`vyre_async.tracing.OtlpJsonFileExporter`)
writes and writes a trace-event file that https://ui.perfetto.dev and
``chrome://tracing`` open:

- one process per service (``service.name``: the application, each Ray worker);
- in it, one track per place work ran: per backend stream (``vyre.stream``),
  else per backend, split into lanes so that dispatches in flight together sit
  side by side — concurrency and copy overlap show as parallel slices;
- each ``vyre.dispatch`` span is a slice named by its program (and its arm and
  layer in an arm graph), with its attributes as arguments and its phases
  nested inside: the phase child spans when the trace has them (the
  ``phases`` detail), else slices laid out from the ``vyre.phase.*_s``
  durations (compile and wait from the start, upload, launch and readback
  ending at the end; marked ``approximate``); zero-length phases are left out;
- ``vyre.graph`` spans on a track of their own, other spans (requests) on
  lanes of their own, their children nested inside.

Slices share a track only where Perfetto's importer nests them as meant:
inside the slice they belong to or after it, never across its end; a
zero-length slice at its parent's end, or at another zero-length slice's
instant, would be nested elsewhere and goes to a lane of its own, as does a
slice that would nest 255 deep (Perfetto drops deeper ones).

Only the standard library is used: no SDK is needed to convert a file.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from vyre_async._exports import public_dir as _public_dir

__all__ = ["Span", "TimelineReport", "read_otlp_json", "to_trace_events", "write_timeline"]
__dir__ = _public_dir(__name__)

#: Phase attribute, in the order phases happen within a dispatch.
_PHASES = (
    ("vyre.phase.compile_s", "compile"),
    ("vyre.phase.wait_s", "wait"),
    ("vyre.phase.upload_s", "upload"),
    ("vyre.phase.launch_s", "launch"),
    ("vyre.phase.readback_s", "readback"),
)
#: Phases laid out from the dispatch's start; the others end at its end.
_LEADING = ("compile", "wait")


@dataclass(slots=True)
class Span:
    """One span of an OTLP-JSON trace file."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start_ns: int
    end_ns: int
    service: str
    attributes: dict[str, Any] = field(default_factory=dict)
    children: list[Span] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TimelineReport:
    """What `write_timeline` did: spans read, events and tracks written, what was damaged.

    Attributes:
        skipped_lines: Lines with something unreadable (the readable rest was kept).
        cyclic_spans: Ids of spans whose parent chain loops back to them (a span
            naming itself, two naming each other): shown as top-level slices.
    """

    spans: int
    events: int
    tracks: int
    skipped_lines: tuple[int, ...]
    cyclic_spans: tuple[str, ...] = ()


#: Errors a damaged line or span may raise while it is read (a line nested past the
#: recursion limit, ``Infinity`` where nanoseconds go): each skips that line or span.
_DAMAGE = (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError)
#: Times outside this many nanoseconds since the epoch are damage, not times.
_MAX_NS = 1 << 63
#: Slices nested this deep on one track are dropped by Perfetto's importer (older ones
#: keep the depth in a byte): a span that would nest deeper starts a lane of its own.
_MAX_DEPTH = 255


def _value(raw: Mapping[str, Any]) -> Any:
    """An OTLP ``AnyValue`` as a Python value, or None for a value of no kind.

    The kinds as the OTLP/JSON mapping writes them: a string, a bool, a double (a
    number, or ``"NaN"``, ``"Infinity"``, ``"-Infinity"``), a 64-bit int (a
    decimal string or a number), an array, a key-value list (read as a dict)
    and bytes (kept as their base64 text). A value of the wrong type for its
    kind is damage (``TypeError`` or ``ValueError``): its span is skipped and
    its line reported, as for any other damage.
    """
    if "stringValue" in raw:
        return _typed(raw["stringValue"], str)
    if "boolValue" in raw:
        return _typed(raw["boolValue"], bool)
    if "doubleValue" in raw:
        double = raw["doubleValue"]
        if isinstance(double, str) and double not in ("NaN", "Infinity", "-Infinity"):
            raise ValueError(f"not a double: {double!r}")
        return float(_typed(double, int | float | str))
    if "intValue" in raw:
        return int(_typed(raw["intValue"], int | str))
    if "arrayValue" in raw:
        return [_value(v) for v in raw["arrayValue"].get("values", ())]
    if "kvlistValue" in raw:
        return _attributes(raw["kvlistValue"].get("values", ()))
    if "bytesValue" in raw:
        return _typed(raw["bytesValue"], str)
    return None


def _typed(value: Any, kind: Any) -> Any:
    """``value`` when it is a ``kind`` (never a bool where a number goes), else TypeError."""
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise TypeError(f"an attribute value of the wrong type: {value!r}")
    return value


def _attributes(items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    return {_typed(item["key"], str): _value(item.get("value", {})) for item in items}


def read_otlp_json(lines: Iterable[str]) -> tuple[list[Span], list[int]]:
    """Parse OTLP-JSON lines (``{"resourceSpans": [...]}`` each); return spans and bad lines.

    A line that is not such an object (a file cut short by a crash, a stray
    line) is skipped and its number returned, so nothing else is lost.
    """
    spans: list[Span] = []
    skipped: list[int] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        bad = [False]
        try:
            document = json.loads(line)
            spans += _spans_of(document, bad)
        except _DAMAGE:
            bad[0] = True
        if bad[0]:  # the line, or some span of it, was not readable (the rest was kept)
            skipped.append(number)
    return spans, skipped


def _spans_of(document: Mapping[str, Any], bad: list[bool]) -> Iterator[Span]:
    """The spans of one batch; ``bad[0]`` is set when one of them could not be read."""
    for resource_spans in document["resourceSpans"]:
        resource = _attributes(resource_spans.get("resource", {}).get("attributes", ()))
        service = str(resource.get("service.name", "unknown service"))
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for raw in scope_spans.get("spans", ()):
                try:
                    start, end = int(raw["startTimeUnixNano"]), int(raw["endTimeUnixNano"])
                    if not (0 <= start < _MAX_NS and 0 <= end < _MAX_NS):
                        raise ValueError(f"span times out of range: {start}, {end}")
                    yield Span(
                        trace_id=str(raw.get("traceId", "")),
                        span_id=str(raw["spanId"]),
                        parent_id=str(raw.get("parentSpanId", "")),
                        name=str(raw["name"]),
                        start_ns=start,
                        end_ns=max(start, end),  # (a clock that stepped back: zero length)
                        service=service,
                        attributes=_attributes(raw.get("attributes", ())),
                    )
                except _DAMAGE:
                    bad[0] = True


class _Lanes:
    """Lanes of one track group: a slice goes to the first lane free at its start.

    A lane is free when its last slice ended before ``start_ns``, or ended at it
    and was not zero-length: Perfetto closes a slice where it ends (intervals
    are closed on the left and open on the right) but puts a slice that starts
    at a zero-length slice's instant on top of it, nested.
    """

    def __init__(self) -> None:
        self.ends: list[tuple[int, bool]] = []  # (end, zero-length) of each lane's last slice

    def place(self, start_ns: int, end_ns: int) -> int:
        last = (end_ns, start_ns == end_ns)
        for lane, (busy_until, zero) in enumerate(self.ends):
            if busy_until < start_ns or (busy_until == start_ns and not zero):
                self.ends[lane] = last
                return lane
        self.ends.append(last)
        return len(self.ends) - 1


def _track_group(span: Span) -> str:
    """Where a top-level slice goes: its backend's stream or the backend, graphs, other spans."""
    attributes = span.attributes
    if span.name == "vyre.dispatch":
        backend = attributes.get("vyre.backend.id", "backend")
        stream = attributes.get("vyre.stream")
        return f"{backend} stream {stream}" if stream is not None else str(backend)
    if span.name == "vyre.graph":
        return "arm graphs"
    return "spans"


def _slice_name(span: Span) -> str:
    attributes = span.attributes
    if span.name != "vyre.dispatch":
        label = attributes.get("vyre.graph.label")
        return f"graph {label}" if span.name == "vyre.graph" and label else span.name
    name = str(attributes.get("vyre.label") or attributes.get("vyre.program.op_id") or "dispatch")
    arm = attributes.get("vyre.arm.label", attributes.get("vyre.arm.index"))
    layer = attributes.get("vyre.policy.arm.layer")
    if arm is not None:
        name += f" [arm {arm}" + (f", layer {layer}]" if layer is not None else "]")
    return name


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)  # whole nanoseconds, written exactly


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # (NaN is not JSON)
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {key: _json_value(v) for key, v in value.items()}
    return value


def _args(span: Span) -> dict[str, Any]:
    args = {key: _json_value(value) for key, value in span.attributes.items()}
    args["span_id"] = span.span_id
    args["trace_id"] = span.trace_id
    if span.parent_id:
        args["parent_span_id"] = span.parent_id
    return args


def _seconds(value: Any) -> float | None:
    """A phase duration as a finite float, or None for anything else (damage, a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return None
    return seconds if math.isfinite(seconds) else None


def _within(start: int, end: int, lo: int, hi: int) -> tuple[int, int]:
    start = min(max(start, lo), hi)
    return start, min(max(end, start), hi)


def _phase_slices(span: Span) -> list[tuple[str, int, int, bool]]:
    """(name, start, end, approximate) of a dispatch's phases, inside its interval."""
    lo, hi = span.start_ns, span.end_ns
    children = [c for c in span.children if c.name.startswith("vyre.")]
    if children:
        out = []
        cursor = lo
        for child in sorted(children, key=lambda c: c.start_ns):
            start, end = _within(max(child.start_ns, cursor), child.end_ns, lo, hi)
            out.append((child.name.removeprefix("vyre."), start, end, False))
            cursor = end
        return out
    durations = [
        (name, span.attributes.get(key)) for key, name in _PHASES if key in span.attributes
    ]
    # (at most the span's length, exactly: a damaged 1e300 s must not overflow the arithmetic)
    known = [
        (name, hi - lo if (ns := max(seconds, 0.0) * 1e9) >= hi - lo else round(ns))
        for name, d in durations
        if (seconds := _seconds(d)) is not None
    ]
    leading = [p for p in known if p[0] in _LEADING]
    trailing = [p for p in known if p[0] not in _LEADING]
    out = []
    cursor = lo
    for name, ns in leading:
        start, end = _within(cursor, cursor + ns, lo, hi)
        out.append((name, start, end, True))
        cursor = end
    floor = cursor
    cursor = hi
    for name, ns in reversed(trailing):
        start, end = _within(cursor - ns, cursor, floor, hi)
        out.append((name, start, end, True))
        cursor = start
    return sorted(out, key=lambda p: p[1])


def _nesting(spans: list[Span]) -> tuple[dict[int, Span], list[str]]:
    """Each span's parent slice (by ``id(span)``), and the ids of spans in a parent loop.

    A span nests in its parent when both are of one service and it is not a
    dispatch (a dispatch is a top-level slice of its track even under a request
    span). A span whose parent chain comes back to it (it names itself, two name
    each other) would belong to no root: each span of such a loop is made a root
    and reported.
    """
    by_id = {(s.trace_id, s.span_id): s for s in spans}
    parent_of: dict[int, Span] = {}
    for span in spans:
        parent = by_id.get((span.trace_id, span.parent_id)) if span.parent_id else None
        if parent is not None and parent.service == span.service and span.name != "vyre.dispatch":
            parent_of[id(span)] = parent
    cyclic: list[str] = []
    settled: set[int] = set()  # spans whose chain is known to end at a root
    for span in spans:
        chain: list[Span] = []
        on_chain: set[int] = set()
        node: Span | None = span
        while node is not None and id(node) not in settled and id(node) not in on_chain:
            chain.append(node)
            on_chain.add(id(node))
            node = parent_of.get(id(node))
        if node is not None and id(node) in on_chain:  # the walk came back: a loop
            loop = chain[chain.index(node) :]
            for member in loop:
                del parent_of[id(member)]
                cyclic.append(member.span_id)
        settled.update(on_chain)
    return parent_of, cyclic


def to_trace_events(spans: Iterable[Span]) -> dict[str, Any]:
    """Return the Chrome trace-event JSON object (``{"traceEvents": [...]}``) of ``spans``.

    Spans in a parent loop are top-level slices; the ids are under
    ``"vyre.cyclic_spans"`` in the object (when there are any).
    """
    spans = list(spans)
    for span in spans:
        span.children = []
    parent_of, cyclic = _nesting(spans)
    roots: list[Span] = []
    for span in spans:
        parent = parent_of.get(id(span))
        if parent is not None:
            parent.children.append(span)
        else:
            roots.append(span)
    origin = min((s.start_ns for s in spans), default=0)
    services = sorted({s.service for s in spans})
    pid_of = {service: index + 1 for index, service in enumerate(services)}
    events: list[dict[str, Any]] = []
    tracks: dict[tuple[int, str, int], int] = {}
    lanes: dict[tuple[int, str], _Lanes] = {}

    def tid_for(pid: int, group: str, lane: int) -> int:
        key = (pid, group, lane)
        if key not in tracks:
            tracks[key] = len([k for k in tracks if k[0] == pid]) + 1
            label = group if lane == 0 else f"{group} · lane {lane}"
            events.append(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tracks[key],
                 "args": {"name": label}}
            )  # fmt: skip
        return tracks[key]

    def slice_of(span: Span, pid: int, tid: int, lo: int, hi: int) -> tuple[int, int]:
        """Append the span's slice (and a dispatch's phases); return its interval."""
        start, end = _within(span.start_ns, span.end_ns, lo, hi)
        events.append(
            {
                "ph": "X",
                "name": _slice_name(span),
                "cat": span.name,
                "pid": pid,
                "tid": tid,
                "ts": _us(start - origin),
                "dur": _us(end - start),
                "args": _args(span),
            }
        )
        if span.name == "vyre.dispatch":
            for name, p_start, p_end, approximate in _phase_slices(span):
                if p_start == p_end:  # (Perfetto would nest it under a neighbour, or outside)
                    continue
                events.append(
                    {
                        "ph": "X",
                        "name": name,
                        "cat": "vyre.phase",
                        "pid": pid,
                        "tid": tid,
                        "ts": _us(p_start - origin),
                        "dur": _us(p_end - p_start),
                        "args": {"approximate": approximate},
                    }
                )
        return start, end

    def emit(root: Span, pid: int, group: str, tid: int, lo: int, hi: int) -> None:
        """Emit a tree of spans depth first, without recursion (a file may nest deeply).

        Each frame: the children still to place, the cursor (the end of the
        last child nested on the track, and whether it was zero-length), the
        parent's interval, its track and its depth there. A child nests on the
        parent's track where Perfetto nests it under that parent: inside it (a
        zero-length child at a longer parent's end is after it), after the last
        nested child (not at a zero-length child's instant, where it would nest
        under that child), and not past Perfetto's depth limit.
        """
        frames: list[tuple[Iterator[Span], list[Any], int, int, int, int]] = []

        def open_(span: Span, tid: int, lo: int, hi: int, depth: int) -> None:
            start, end = slice_of(span, pid, tid, lo, hi)
            if span.name != "vyre.dispatch" and span.children:
                children = iter(sorted(span.children, key=lambda c: c.start_ns))
                frames.append((children, [start, False], start, end, tid, depth))

        open_(root, tid, lo, hi, 0)
        while frames:
            children, cursor, start, end, track, depth = frames[-1]
            child = next(children, None)
            if child is None:
                frames.pop()
                continue
            zero = child.start_ns == child.end_ns
            inside = child.end_ns <= end and (child.start_ns < end or start == end)
            after = child.start_ns > cursor[0] or (child.start_ns == cursor[0] and not cursor[1])
            if inside and after and depth + 1 < _MAX_DEPTH:  # nests: on this track
                cursor[:] = [child.end_ns, zero]
                open_(child, track, child.start_ns, child.end_ns, depth + 1)
            else:  # overlaps a sibling (concurrent children) or its parent's end: a lane
                lane = lanes.setdefault((pid, group), _Lanes()).place(child.start_ns, child.end_ns)
                open_(child, tid_for(pid, group, lane), child.start_ns, child.end_ns, 0)

    for service in services:
        pid = pid_of[service]
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": service}})
    for span in sorted(roots, key=lambda s: (s.start_ns, -s.end_ns)):
        pid = pid_of[span.service]
        group = _track_group(span)
        lane = lanes.setdefault((pid, group), _Lanes()).place(span.start_ns, span.end_ns)
        emit(span, pid, group, tid_for(pid, group, lane), span.start_ns, span.end_ns)
    slices = [e for e in events if e["ph"] == "X"]
    meta = [e for e in events if e["ph"] == "M"]
    slices.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], -e["dur"]))
    document: dict[str, Any] = {"traceEvents": meta + slices, "displayTimeUnit": "ms"}
    if cyclic:
        document["vyre.cyclic_spans"] = cyclic
    return document


def write_timeline(source: TextIO, target: TextIO) -> TimelineReport:
    """Convert the OTLP-JSON lines of ``source`` into trace-event JSON written to ``target``."""
    spans, skipped = read_otlp_json(source)
    document = to_trace_events(spans)
    target.write(json.dumps(document, allow_nan=False))  # (whole: nothing half written)
    events = document["traceEvents"]
    tracks = sum(1 for e in events if e.get("name") == "thread_name")
    return TimelineReport(
        spans=len(spans),
        events=sum(1 for e in events if e["ph"] == "X"),
        tracks=tracks,
        skipped_lines=tuple(skipped),
        cyclic_spans=tuple(document.get("vyre.cyclic_spans", ())),
    )


def convert(trace: str | Path, output: str | Path) -> TimelineReport:
    """Convert the file ``trace`` into ``output`` (see `write_timeline`).

    The trace is read and converted whole before ``output`` is opened, so a
    failure to read or convert it leaves ``output`` untouched.

    Raises:
        OSError: ``trace`` cannot be read or ``output`` written.
        UnicodeDecodeError: ``trace`` is not UTF-8 text.
    """
    text = Path(trace).read_text(encoding="utf-8")
    converted = io.StringIO()
    report = write_timeline(io.StringIO(text), converted)
    with open(output, "w", encoding="utf-8") as target:
        target.write(converted.getvalue())
    return report
