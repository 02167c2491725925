"""The rules a Trace Event Format file must follow to load into Perfetto as meant.

`check_trace_events(text)` reads a trace-event JSON text the way Perfetto's
JSON importer does and asserts each rule below; it returns the slices with the
parent each one gets in the importer, so a test can also check that the
nesting Perfetto shows is the nesting it meant. Sources: the format
("Trace Event Format", https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU),
and where the format leaves a choice, Perfetto's importer
(https://github.com/google/perfetto, ``src/trace_processor/importers/json/``
``json_trace_tokenizer.cc`` and ``json_utils.cc``, and
``importers/common/slice_tracker.cc``):

1. The file is the JSON Object Format (an object whose ``traceEvents`` is an
   array) or the JSON Array Format (the array itself); ``displayTimeUnit``,
   when present, is ``"ms"`` or ``"ns"``. Strict JSON: no NaN or Infinity.
2. Every event is an object with a ``ph`` of the format's phases.
3. ``ts`` is a number of microseconds, required on every event but metadata
   (Perfetto drops others: ``json_tokenizer_failure``). Perfetto turns the
   number's decimal text into integer nanoseconds by moving the point three
   places and cutting what is left (``CoerceToTs``), so more than three
   decimals is lost precision: here every ``ts`` and ``dur`` must be a whole
   number of nanoseconds, and times are compared exactly, in nanoseconds.
4. ``pid`` and ``tid`` are integers from 0 to 2**32 - 1 (``CoerceToUint32``);
   ``tid`` is needed on every event but process metadata.
5. No top-level field of an event but ``args`` is an array: Perfetto's
   tokenizer looks for ``ts`` and ``dur`` in each event and fails the whole
   file on an array before them ("unsupported JSON dictionary with array").
   ``args``, when present, is an object.
6. Complete events (``X``) have a ``dur`` that is a number >= 0 (a negative
   one is dropped: ``slice_negative_duration``).
7. Duration events (``B``/``E``) balance per thread: in timestamp order every
   ``E`` ends an open ``B`` and every ``B`` is ended.
8. Instant events (``i``, ``I``) have a scope ``s`` of ``g``, ``p`` or ``t``
   when they have one.
9. Metadata events (``M``) are ``process_name``, ``process_labels``,
   ``process_sort_index``, ``thread_name`` or ``thread_sort_index``; the
   ``*_name`` ones carry ``args.name`` as a string, the sort ones an integer
   ``args.sort_index``.
10. Slices nest, per thread: Perfetto orders events by ``ts`` (an older
    importer keeps the file's order for equal ``ts``, the current one puts the
    longer slice first, so both agree only when the file already has the
    longer first) and keeps a stack per thread. A slice that starts inside an
    open one and ends after it is dropped (``misplaced_end_event``,
    ``slice_drop_overlapping_complete_event``). An open slice is closed by a
    slice starting at or after its end, except that zero-length slices at one
    instant stack ("intervals are closed on left and open on right"). Nesting
    deeper than 255 was dropped by older importers (``uint8`` depth).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

PHASES = frozenset("BEXiICbneSTpFsftPONDMVvRc(),=")
METADATA = ("process_name", "process_labels", "process_sort_index", "thread_name",
            "thread_sort_index")  # fmt: skip
MAX_DEPTH = 255


@dataclass
class Slice:
    """One slice as the importer builds it, times in nanoseconds."""

    index: int  # the event's position in the file
    pid: int
    tid: int
    name: str
    start: int
    end: int
    event: dict[str, Any]
    depth: int = 0
    parent: Slice | None = None


def _ns(value: Any, what: str) -> int:
    """A ``ts``/``dur`` value as exact integer nanoseconds (rule 3)."""
    assert isinstance(value, int | Decimal) and not isinstance(value, bool), (what, value)
    ns = Decimal(value) * 1000
    assert ns == ns.to_integral_value(), f"{what}={value}: not a whole number of nanoseconds"
    return int(ns)


def _uint32(event: dict[str, Any], key: str) -> int:
    value = event.get(key)
    assert isinstance(value, int) and not isinstance(value, bool), (key, event)
    assert 0 <= value < 2**32, (key, event)
    return value


def _reject_constant(name: str) -> None:
    raise AssertionError(f"{name} is not JSON")


def load(text: str) -> list[dict[str, Any]]:
    """The events of a trace-event JSON text, numbers as written (rule 1)."""
    document = json.loads(text, parse_float=Decimal, parse_constant=_reject_constant)
    if isinstance(document, dict):
        events = document["traceEvents"]
        unit = document.get("displayTimeUnit", "ms")
        assert unit in ("ms", "ns"), f"displayTimeUnit {unit!r}"
    else:
        events = document
    assert isinstance(events, list), "traceEvents is not an array"
    return events


def check_trace_events(text: str, *, max_depth: int = MAX_DEPTH) -> list[Slice]:
    """Assert rules 1-10 on the trace-event JSON ``text``; return its slices, nested."""
    events = load(text)
    slices: list[Slice] = []
    durations: dict[tuple[int, int], list[tuple[int, str, int, dict[str, Any]]]] = {}
    for index, event in enumerate(events):
        assert isinstance(event, dict), f"event {index} is not an object"
        ph = event.get("ph")
        assert isinstance(ph, str) and ph in PHASES, f"event {index}: ph={ph!r}"
        for key, value in event.items():  # rule 5
            assert key == "args" or not isinstance(value, list), f"event {index}: {key} is an array"
        assert isinstance(event.get("args", {}), dict), f"event {index}: args is not an object"
        pid = _uint32(event, "pid")
        if ph == "M":  # rule 9
            name = event.get("name")
            assert name in METADATA, f"event {index}: metadata {name!r}"
            if name.startswith("thread"):
                _uint32(event, "tid")
            if name.endswith("_name"):
                assert isinstance(event["args"]["name"], str), f"event {index}: args.name"
            if name.endswith("_sort_index"):
                sort_index = event["args"]["sort_index"]
                assert isinstance(sort_index, int) and not isinstance(sort_index, bool), event
            continue
        tid = _uint32(event, "tid")
        assert "ts" in event, f"event {index}: no ts"  # rule 3
        ts = _ns(event["ts"], f"event {index} ts")
        assert isinstance(event.get("name", ""), str), f"event {index}: name"
        if ph == "X":  # rule 6
            assert "dur" in event, f"event {index}: a complete event without dur"
            dur = _ns(event["dur"], f"event {index} dur")
            assert dur >= 0, f"event {index}: negative dur"
            slices.append(Slice(index, pid, tid, event.get("name", ""), ts, ts + dur, event))
        elif ph in "BE":
            durations.setdefault((pid, tid), []).append((ts, ph, index, event))
        elif ph in "iI":  # rule 8
            assert event.get("s", "t") in ("g", "p", "t"), f"event {index}: scope {event['s']!r}"
            if event.get("s", "t") == "t":  # a thread-scoped instant is a zero-length slice
                slices.append(Slice(index, pid, tid, event.get("name", ""), ts, ts, event))
    for (pid, tid), marks in durations.items():  # rule 7
        marks.sort(key=lambda m: m[0])  # (stable: the file's order for equal ts)
        open_: list[tuple[int, int, dict[str, Any]]] = []
        for ts, ph, index, event in marks:
            if ph == "B":
                open_.append((ts, index, event))
            else:
                assert open_, f"event {index}: E without an open B on {pid}/{tid}"
                start, begin, first = open_.pop()
                slices.append(Slice(begin, pid, tid, first.get("name", ""), start, ts, first))
        assert not open_, f"B without E on {pid}/{tid}: events {[o[1] for o in open_]}"
    _nest(slices, max_depth)
    return slices


def _nest(slices: list[Slice], max_depth: int) -> None:
    """Rule 10: Perfetto's per-thread stack, on the importer's order; set depth and parent."""
    by_track: dict[tuple[int, int], list[Slice]] = {}
    for s in slices:
        by_track.setdefault((s.pid, s.tid), []).append(s)
    for (pid, tid), track in by_track.items():
        in_file = sorted(track, key=lambda s: (s.start, s.index))  # an older importer
        longest_first = sorted(track, key=lambda s: (s.start, -(s.end - s.start), s.index))
        assert [s.index for s in in_file] == [s.index for s in longest_first], (
            f"track {pid}/{tid}: at equal ts a shorter slice comes first in the file: "
            f"importers would nest these differently"
        )
        stack: list[Slice] = []
        for s in in_file:
            zero = s.end == s.start
            while stack and (
                stack[-1].end < s.start
                or (stack[-1].end == s.start and not (zero and stack[-1].end == stack[-1].start))
            ):
                stack.pop()
            if stack:
                top = stack[-1]
                assert s.end <= top.end, (
                    f"track {pid}/{tid}: {s.name!r} [{s.start}, {s.end}] ns starts inside "
                    f"{top.name!r} [{top.start}, {top.end}] and ends after it: Perfetto drops it"
                )
            s.parent = stack[-1] if stack else None
            s.depth = len(stack)
            assert s.depth < max_depth, f"track {pid}/{tid}: {s.name!r} nested {s.depth} deep"
            stack.append(s)
