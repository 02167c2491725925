"""What a user sees of `vyre_async.telemetry`, pinned down (issue 28, telemetry.py's mutants).

Each test that reads spans or metrics installs its own in-memory SDK as the
API's global providers (the API's globals are patched and restored, as is every
piece of telemetry's state), so the API is loaded afresh for it: the tracer's
scope, the instruments' names, units, descriptions and buckets, the tallies the
observable counters read. Counts are then exact, not deltas. The environment
switches are read by importing a private copy of the module with the variables
set (nothing is added to ``sys.modules``).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import anyio
import numpy as np
import opentelemetry.metrics as otel_metrics
import opentelemetry.metrics._internal as metrics_internal
import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace as trace_api
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    InMemoryMetricReader,
    Metric,
    NumberDataPoint,
    Sum,
)
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    Decision,
    Sampler,
    SamplingResult,
)
from opentelemetry.trace import StatusCode
from opentelemetry.util._once import Once

from tests.driver.fakes import BytesBackend
from tests.helpers import backend_of
from vyre_async import (
    DispatchConfig,
    DispatchFailed,
    DispatchTimeout,
    InvalidProgram,
    Program,
    telemetry,
)
from vyre_async._pipeline import Launch
from vyre_async._version import __version__
from vyre_async.programs import elementwise_xor
from vyre_async.telemetry import (
    SECONDS_BUCKETS,
    _otel_compat,
    _spans,
    dispatch_attributes,
    prometheus_text,
)
from vyre_async.telemetry._metrics import COUNTERS
from vyre_async.telemetry._state import STATE, TelemetryState

XOR = elementwise_xor(64)
UNNAMED = Program(list(XOR.buffers), XOR.workgroup_size, list(XOR.body))
INPUTS = [np.zeros(64, np.uint32), np.ones(64, np.uint32)]
LABELS = {"vyre.backend.id": "scripted", "vyre.program.op_id": "std.xor"}


def _isolate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Save telemetry's state and the API's globals; start with nothing known about the SDK."""
    for name in TelemetryState.__slots__:
        if name != "_lock":
            monkeypatch.setattr(STATE, name, getattr(STATE, name))
    monkeypatch.setattr(_otel_compat, "PROVIDERS_FROM_ENV", _otel_compat.PROVIDERS_FROM_ENV)
    monkeypatch.setattr(trace_api, "_TRACER_PROVIDER", trace_api._TRACER_PROVIDER)
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", metrics_internal._METER_PROVIDER)
    monkeypatch.setattr(
        metrics_internal, "_PROXY_METER_PROVIDER", type(metrics_internal._PROXY_METER_PROVIDER)()
    )
    STATE.reset({})  # on, one span per dispatch, nothing counted, no SDK seen yet


@dataclass
class Sdk:
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider
    meter_provider: MeterProvider

    def spans(self) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == "vyre.dispatch"]

    def metrics(self) -> dict[str, Metric]:
        data = self.reader.get_metrics_data()
        out: dict[str, Metric] = {}
        for rm in data.resource_metrics if data is not None else ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out[m.name] = m
        return out

    def series(self, name: str) -> dict[frozenset[tuple[str, Any]], Any]:
        """``name``'s points by their exact label set."""
        metric = self.metrics().get(name)
        if metric is None:
            return {}
        return {frozenset((p.attributes or {}).items()): p for p in metric.data.data_points}

    def value(self, name: str, **labels: Any) -> Any:
        point = self.series(name).get(frozenset(labels.items()))
        return 0 if point is None else point.value

    def counts(self) -> dict[tuple[str, Any, Any], Any]:
        """Every counter's series, as ``(name, op_id, status or '')`` -> value."""
        out: dict[tuple[str, Any, Any], Any] = {}
        for name in COUNTERS:
            for labels, point in self.series(name).items():
                d = dict(labels)
                key = (name, d.get("vyre.program.op_id"), d.get("vyre.status", ""))
                out[key] = point.value
        return out


def _install(
    monkeypatch: pytest.MonkeyPatch,
    *,
    traces: bool = True,
    metrics: bool = True,
    sampler: Sampler | None = None,
    processors: Sequence[SpanProcessor] = (),
) -> Sdk:
    """Install a fresh in-memory SDK as the API's providers, with the API loaded afresh."""
    _isolate(monkeypatch)
    monkeypatch.setattr(STATE, "api", None)  # loaded afresh, on these providers
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider(sampler=sampler, shutdown_on_exit=False)
    for processor in processors:
        tracer_provider.add_span_processor(processor)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    monkeypatch.setattr(trace_api, "_TRACER_PROVIDER", tracer_provider if traces else None)
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", meter_provider if metrics else None)
    return Sdk(exporter, reader, tracer_provider, meter_provider)


class Scripted(BytesBackend):
    """Settles inline as scripted: phases, annotations, a prefetch verdict, an error."""

    id = "scripted"

    def __init__(self) -> None:
        super().__init__()
        self.phases: list[tuple[str, int, int]] = []
        self.notes: dict[str, Any] = {}
        self.prefetch: tuple[bool, float] | None = None
        self.error: Exception | None = None
        self.refuse: BaseException | None = None
        self.hold = False
        self.held: list[Launch] = []

    def enqueue(self, launch: Launch) -> None:
        if self.refuse is not None:
            raise self.refuse
        completer = launch.completer
        if self.prefetch is not None:
            completer.record.prefetch = self.prefetch
        for phase in self.phases:
            completer.record_phase(*phase)
        if self.notes:
            completer.annotate_all(self.notes)
        if self.hold:
            self.held.append(launch)
            return
        completer.mark_started()
        if self.error is not None:
            completer.fail(self.error)
        else:
            completer.resolve(_outputs(launch), device_s=0.25)


def _outputs(launch: Launch) -> list[np.ndarray]:
    return [np.zeros(launch.plan.count_of(d.name), d.dtype.numpy) for d in launch.plan.outputs]


def _attrs(item: Any) -> dict[str, Any]:
    """A span's or an event's attributes."""
    return dict(item.attributes or {})


@pytest.fixture
def reported(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What reaches `threading.excepthook` during the test."""
    seen: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", seen.append)
    return seen


# The API, loaded afresh: scope, instruments ------------------------------------------


def test_the_api_loaded_afresh_gives_vyres_scope_and_instruments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sdk = _install(monkeypatch)
    backend = backend_of(Scripted)
    backend.dispatch(XOR, INPUTS).result()
    backend.dispatch(XOR, INPUTS).result()
    (first, second) = sdk.spans()
    assert first.instrumentation_scope is not None
    assert first.instrumentation_scope.name == "vyre_async"
    assert first.instrumentation_scope.version == __version__
    data = sdk.reader.get_metrics_data()
    assert data is not None
    scopes = {
        (sm.scope.name, sm.scope.version) for rm in data.resource_metrics for sm in rm.scope_metrics
    }
    assert scopes == {("vyre_async", __version__)}
    metrics = sdk.metrics()
    described = {name: (m.unit, m.description) for name, m in metrics.items()}
    assert described == {
        **{name: spec for name, spec in COUNTERS.items() if name in metrics},
        "vyre.dispatch.duration": ("s", "dispatch() to result ready, host clock"),
        "vyre.dispatch.device_time": ("s", "Execution time measured by the backend"),
    }
    assert {"vyre.dispatch.count", "vyre.pipeline.cache.misses", "vyre.bytes.in"} <= set(metrics)
    for name in ("vyre.dispatch.duration", "vyre.dispatch.device_time"):
        (point,) = sdk.series(name).values()
        assert isinstance(point, HistogramDataPoint)
        assert tuple(point.explicit_bounds) == SECONDS_BUCKETS
        assert point.count == 2
        assert _attrs(point) == LABELS
    assert sdk.series("vyre.dispatch.device_time")[frozenset(LABELS.items())].sum == 0.5
    assert sdk.counts() == {
        ("vyre.dispatch.count", "std.xor", "ok"): 2,
        ("vyre.pipeline.cache.misses", "std.xor", ""): 1,
        ("vyre.pipeline.cache.hits", "std.xor", ""): 1,
        ("vyre.bytes.in", "std.xor", ""): 1024,
        ("vyre.bytes.out", "std.xor", ""): 512,
    }
    assert [_attrs(s)["vyre.pipeline.cache_hit"] for s in (first, second)] == [False, True]
    assert first.status.status_code is StatusCode.UNSET


def test_a_failed_span_uses_the_apis_error_status(monkeypatch: pytest.MonkeyPatch) -> None:
    sdk = _install(monkeypatch)
    backend = backend_of(Scripted)
    backend.executor.error = DispatchFailed("the device said no", fix="retry")
    error = backend.dispatch(XOR, INPUTS).exception()
    assert isinstance(error, DispatchFailed)
    (span,) = sdk.spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == f"DispatchFailed: {error}"
    assert _attrs(span)["vyre.error.code"] == 1005
    (event,) = span.events
    assert event.name == "exception"
    assert _attrs(event)["exception.type"] == "vyre_async.errors.DispatchFailed"
    assert _attrs(event)["exception.message"] == str(error)


# Outcomes and their counts ----------------------------------------------------------------


def test_failures_count_by_outcome_and_cache_and_prediction_never_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sdk = _install(monkeypatch)
    backend = backend_of(Scripted)
    backend.executor.error = DispatchFailed("no", fix="retry")
    backend.executor.prefetch = (True, 0.0)  # a hit, with a rate that reads as false
    backend.dispatch(XOR, INPUTS)  # a cache miss
    backend.dispatch(XOR, INPUTS)  # a cache hit
    backend.executor.prefetch = (False, 0.5)  # a miss, with a rate that reads as true
    backend.dispatch(XOR, INPUTS)
    assert sdk.counts() == {
        ("vyre.dispatch.count", "std.xor", "error"): 3,
        ("vyre.pipeline.cache.misses", "std.xor", ""): 1,
        ("vyre.pipeline.cache.hits", "std.xor", ""): 2,
        ("vyre.prefetch.hits", "std.xor", ""): 2,
        ("vyre.prefetch.misses", "std.xor", ""): 1,
    }
    (point,) = sdk.series("vyre.dispatch.duration").values()
    assert point.count == 3


def test_successes_count_their_prediction(monkeypatch: pytest.MonkeyPatch) -> None:
    sdk = _install(monkeypatch)
    backend = backend_of(Scripted)
    backend.executor.prefetch = (True, 0.75)
    backend.dispatch(XOR, INPUTS)
    backend.executor.prefetch = (False, 0.5)
    backend.dispatch(XOR, INPUTS)
    backend.dispatch(XOR, INPUTS)
    assert sdk.counts() == {
        ("vyre.dispatch.count", "std.xor", "ok"): 3,
        ("vyre.pipeline.cache.misses", "std.xor", ""): 1,
        ("vyre.pipeline.cache.hits", "std.xor", ""): 2,
        ("vyre.prefetch.hits", "std.xor", ""): 1,
        ("vyre.prefetch.misses", "std.xor", ""): 2,
        ("vyre.bytes.in", "std.xor", ""): 1536,
        ("vyre.bytes.out", "std.xor", ""): 768,
    }
    first = sdk.spans()[0]
    assert _attrs(first)["vyre.prefetch.hit"] is True
    assert _attrs(first)["vyre.prefetch.hit_rate"] == 0.75


def test_a_timeout_counts_as_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    sdk = _install(monkeypatch)
    backend = backend_of(Scripted)
    backend.executor.hold = True
    pending = backend.dispatch(XOR, INPUTS, DispatchConfig(timeout=0.02))
    with pytest.raises(DispatchTimeout):
        pending.result()
    assert sdk.counts() == {
        ("vyre.dispatch.count", "std.xor", "timeout"): 1,
        ("vyre.pipeline.cache.misses", "std.xor", ""): 1,
    }
    (span,) = sdk.spans()
    assert _attrs(span)["vyre.error.code"] == 1009


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_cancelled_await_counts_cancelled_then_its_work_and_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sdk = _install(monkeypatch)
    backend = backend_of(Scripted)
    backend.executor.hold = True
    pending = backend.dispatch(XOR, INPUTS)
    with anyio.move_on_after(0.01):
        await pending
    (span,) = sdk.spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "await cancelled; the dispatch keeps running on the backend"
    assert _attrs(span)["vyre.await.cancelled"] is True
    (launch,) = backend.executor.held
    launch.completer.resolve(_outputs(launch), device_s=0.25)
    assert len(sdk.spans()) == 1
    assert sdk.counts() == {
        ("vyre.dispatch.count", "std.xor", "cancelled"): 1,
        ("vyre.pipeline.cache.misses", "std.xor", ""): 1,
        ("vyre.bytes.in", "std.xor", ""): 512,
        ("vyre.bytes.out", "std.xor", ""): 256,
    }


class FailingEnd(SpanProcessor):
    """A span processor whose ``on_end`` (or ``on_start``) raises, once."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.error = RuntimeError(f"processor bug in {where}")

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.where == "start" and span.name == "vyre.dispatch":
            self.where = ""
            raise self.error

    def on_end(self, span: Any) -> None:
        if self.where == "end" and span.name == "vyre.dispatch":
            self.where = ""
            raise self.error


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_processor_failing_a_cancelled_span_is_reported_and_it_still_counts(
    monkeypatch: pytest.MonkeyPatch, reported: list[Any]
) -> None:
    failing = FailingEnd("end")
    sdk = _install(monkeypatch, processors=[failing])
    backend = backend_of(Scripted)
    backend.executor.hold = True
    pending = backend.dispatch(XOR, INPUTS)
    with anyio.move_on_after(0.01):
        await pending
    assert [(r.exc_type, r.exc_value) for r in reported] == [(RuntimeError, failing.error)]
    assert sdk.counts() == {("vyre.dispatch.count", "std.xor", "cancelled"): 1}


def test_a_processor_failing_at_start_is_reported_and_the_dispatch_goes_on_untraced(
    monkeypatch: pytest.MonkeyPatch, reported: list[Any]
) -> None:
    failing = FailingEnd("start")
    sdk = _install(monkeypatch, processors=[failing])
    backend_of(Scripted).dispatch(XOR, INPUTS).result()
    (report,) = reported
    assert report.exc_type is RuntimeError and report.exc_value is failing.error
    assert report.exc_traceback is not None and report.thread is threading.current_thread()
    assert sdk.spans() == []
    assert sdk.value("vyre.dispatch.count", **LABELS, **{"vyre.status": "ok"}) == 1


# Span attributes set at the end ---------------------------------------------------------


def test_phases_queue_and_later_annotations_end_the_span(monkeypatch: pytest.MonkeyPatch) -> None:
    sdk = _install(monkeypatch)
    backend = backend_of(Scripted)
    backend.dispatch(XOR, INPUTS).result()  # warm: the next one has no compile phase
    scripted = backend.executor
    scripted.phases = [
        ("vyre.wait", 1000, 1000),  # zero long
        ("vyre.launch", 5000, 4000),  # ends before it starts: zero
        ("vyre.upload", 0, 1_000_000_000),  # one second, exactly
        ("vyre.readback", 0, 500_000_000),  # twice: summed
        ("vyre.readback", 0, 250_000_000),
        ("vyre.other", 0, 7),  # not a phase: ignored
    ]
    scripted.notes = {"vyre.policy.demo": "changed", "vyre.stream": 3, "vyre.policy.kept": "same"}
    with dispatch_attributes({"vyre.policy.demo": "at launch", "vyre.policy.kept": "same"}):
        backend.dispatch(XOR, INPUTS).result()
    span = sdk.spans()[1]
    a = _attrs(span)
    assert a["vyre.phase.wait_s"] == 0.0
    assert a["vyre.phase.launch_s"] == 0.0
    assert a["vyre.phase.upload_s"] == 1.0
    assert a["vyre.phase.readback_s"] == 0.75
    assert not any("other" in key for key in a)
    assert a["vyre.policy.demo"] == "changed"
    assert a["vyre.policy.kept"] == "same"
    assert a["vyre.stream"] == 3
    assert a["vyre.device.time_s"] == 0.25
    assert 0 <= a["vyre.queue.time_s"] < 5


def test_finish_dispatch_with_the_dispatch_alone_reads_its_timing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sdk = _install(monkeypatch)
    backend = backend_of(Scripted)
    backend.executor.hold = True
    pending = backend.dispatch(XOR, INPUTS)
    record = pending.record
    record.on_settled = lambda p, *times: telemetry.finish_dispatch(p)
    (launch,) = backend.executor.held
    launch.completer.mark_started()
    launch.completer.resolve(_outputs(launch), device_s=0.25)
    (span,) = sdk.spans()
    assert _attrs(span)["vyre.device.time_s"] == 0.25
    assert _attrs(span)["vyre.queue.time_s"] >= 0
    for name in ("vyre.dispatch.duration", "vyre.dispatch.device_time"):
        (point,) = sdk.series(name).values()
        assert point.count == 1


# Rejections -----------------------------------------------------------------------------


def test_a_backend_refusing_the_launch_is_a_rejection(
    monkeypatch: pytest.MonkeyPatch, reported: list[Any]
) -> None:
    sdk = _install(monkeypatch)
    backend = backend_of(Scripted)
    backend.executor.refuse = RuntimeError("queue full")
    with pytest.raises(RuntimeError):
        backend.dispatch(UNNAMED, INPUTS)
    (span,) = sdk.spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "RuntimeError: queue full"
    assert _attrs(span)["vyre.error.code"] == 0  # not a vyre error: no code
    (event,) = span.events
    assert _attrs(event)["exception.type"] == "RuntimeError"
    assert _attrs(event)["exception.message"] == "queue full"
    assert sdk.counts() == {("vyre.dispatch.count", "unnamed", "rejected"): 1}
    assert reported == []


class StartsThenRaises(Scripted):
    """Settles the launch, then raises from ``enqueue`` (a backend that fails late)."""

    id = "scripted"

    def enqueue(self, launch: Launch) -> None:
        super().enqueue(launch)
        raise RuntimeError("raised after the work settled")


def test_a_rejection_that_wins_the_claim_from_the_settling_counts_it_once(
    monkeypatch: pytest.MonkeyPatch, reported: list[Any]
) -> None:
    """The settling dispatch read its trace, then the front end's rejection claimed it first.

    Forced interleaving: the rejection runs between ``finish_dispatch`` reading the
    record's trace and its claim. The dispatch is counted once, as rejected: no
    cache, byte or duration points of a dispatch that ran.
    """
    sdk = _install(monkeypatch)
    claim = _spans._claim
    raced: list[Any] = []

    def rejection_first(started: Any) -> Any:
        if started is not None and not raced:
            raced.append(started)
            _spans.fail_before_launch(started, RuntimeError("first"), "scripted", XOR)
        return claim(started)

    monkeypatch.setattr(_spans, "_claim", rejection_first)
    with pytest.raises(RuntimeError, match="raised after the work settled"):
        backend_of(StartsThenRaises).dispatch(XOR, INPUTS)
    assert len(raced) == 1
    assert sdk.counts() == {("vyre.dispatch.count", "std.xor", "rejected"): 1}
    assert sdk.series("vyre.dispatch.duration") == {}
    assert reported == []


def test_a_dispatch_refused_before_launch_opens_its_span_with_the_programs_attributes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sdk = _install(monkeypatch)
    with pytest.raises(InvalidProgram):
        backend_of(Scripted).dispatch(XOR, INPUTS[:1])
    (span,) = sdk.spans()
    assert {k: _attrs(span)[k] for k in ("vyre.backend.id", "vyre.program.op_id")} == LABELS
    assert _attrs(span)["vyre.program.fingerprint"] == XOR.fingerprint().hex()
    assert _attrs(span)["vyre.error.code"] == 1006
    assert sdk.counts() == {("vyre.dispatch.count", "std.xor", "rejected"): 1}


def test_a_rejected_object_that_is_no_program_counts_as_unnamed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sdk = _install(monkeypatch)
    with pytest.raises(InvalidProgram):
        backend_of(Scripted).dispatch("not a program", INPUTS)  # type: ignore[arg-type]
    assert sdk.counts() == {("vyre.dispatch.count", "unnamed", "rejected"): 1}
    (span,) = sdk.spans()
    assert _attrs(span)["vyre.backend.id"] == "scripted"


class DropsLaunchedSpans(Sampler):
    """Drops a span opened with launch attributes (``vyre.pipeline.cache_hit``), keeps others."""

    def should_sample(
        self,
        parent_context: Any,
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        links: Any = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        if attributes and "vyre.pipeline.cache_hit" in attributes:
            return SamplingResult(Decision.DROP)
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)

    def get_description(self) -> str:
        return "DropsLaunchedSpans"


def test_a_sampled_out_dispatch_is_counted_and_its_rejection_opens_no_second_span(
    monkeypatch: pytest.MonkeyPatch, reported: list[Any]
) -> None:
    sdk = _install(monkeypatch, sampler=DropsLaunchedSpans())
    backend = backend_of(Scripted)
    backend.dispatch(XOR, INPUTS).result()
    assert sdk.spans() == []
    assert sdk.value("vyre.dispatch.count", **LABELS, **{"vyre.status": "ok"}) == 1
    backend.executor.refuse = RuntimeError("queue full")
    with pytest.raises(RuntimeError):
        backend.dispatch(XOR, INPUTS)
    assert sdk.spans() == []
    assert sdk.value("vyre.dispatch.count", **LABELS, **{"vyre.status": "rejected"}) == 1
    assert reported == []


# record_prefetch ---------------------------------------------------------------------------


def test_record_prefetch_counts_hits_and_misses_by_backend_and_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sdk = _install(monkeypatch)
    assert telemetry.is_recording()
    telemetry.record_prefetch("tool", XOR, True)
    telemetry.record_prefetch("tool", XOR, True)
    telemetry.record_prefetch("tool", UNNAMED, False)
    tool = {"vyre.backend.id": "tool"}
    assert sdk.value("vyre.prefetch.hits", **tool, **{"vyre.program.op_id": "std.xor"}) == 2
    assert sdk.value("vyre.prefetch.misses", **tool, **{"vyre.program.op_id": "unnamed"}) == 1
    assert set(sdk.counts()) == {
        ("vyre.prefetch.hits", "std.xor", ""),
        ("vyre.prefetch.misses", "unnamed", ""),
    }


# Which providers count as an SDK --------------------------------------------------------------


def _flags() -> tuple[bool, bool] | None:
    started = telemetry.start_dispatch()
    return None if started is None else (started.traced, started.metered)


def test_what_is_installed_decides_what_a_dispatch_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sdk = _install(monkeypatch, traces=False, metrics=False)
    assert telemetry.is_recording() is False
    assert _flags() is None
    assert _flags() is None
    monkeypatch.setattr(trace_api, "_TRACER_PROVIDER", sdk.tracer_provider)
    assert telemetry.is_recording() is True
    assert _flags() == (True, False)
    assert _flags() == (True, False)
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", sdk.meter_provider)
    assert _flags() == (True, True)
    # an SDK provider cannot be uninstalled: the answer is kept
    monkeypatch.setattr(trace_api, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", None)
    assert _flags() == (True, True)


def test_a_meter_provider_alone_meters_and_a_tracer_provider_later_traces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sdk = _install(monkeypatch, traces=False, metrics=True)
    assert _flags() == (False, True)
    assert _flags() == (False, True)
    monkeypatch.setattr(trace_api, "_TRACER_PROVIDER", sdk.tracer_provider)
    assert _flags() == (True, True)


def test_one_object_that_provides_both_is_picked_up_for_traces_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _install(monkeypatch, traces=False, metrics=False)
    assert STATE.sdk_installed() == (False, False)  # loads the API
    both = SimpleNamespace()  # a provider of both kinds (neither of the API's stand-ins)
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", both)
    assert STATE.sdk_installed() == (False, True)
    monkeypatch.setattr(trace_api, "_TRACER_PROVIDER", both)
    assert STATE.sdk_installed() == (True, True)


def test_with_the_apis_globals_moved_the_public_getters_are_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An API version that keeps its providers elsewhere: ask get_*_provider()."""
    sdk = _install(monkeypatch, traces=False, metrics=False)
    assert telemetry.is_recording() is False  # loads the API
    tracer_now: list[Any] = [trace_api.ProxyTracerProvider()]
    meter_now: list[Any] = [metrics_internal._PROXY_METER_PROVIDER]
    monkeypatch.delattr(trace_api, "_TRACER_PROVIDER")
    monkeypatch.delattr(metrics_internal, "_METER_PROVIDER")
    monkeypatch.setattr(trace_api, "get_tracer_provider", lambda: tracer_now[0])
    monkeypatch.setattr(otel_metrics, "get_meter_provider", lambda: meter_now[0])
    assert STATE.sdk_installed() == (False, False)
    assert STATE.sdk_installed() == (False, False)
    meter_now[0] = sdk.meter_provider
    assert STATE.sdk_installed() == (False, True)
    tracer_now[0] = sdk.tracer_provider
    assert STATE.sdk_installed() == (True, True)


@pytest.mark.parametrize("moved", ["tracer", "meter"])
def test_with_one_global_moved_a_change_behind_its_getter_is_seen(
    monkeypatch: pytest.MonkeyPatch, moved: str
) -> None:
    sdk = _install(monkeypatch, traces=False, metrics=False)
    assert telemetry.is_recording() is False  # loads the API
    now: list[Any] = [None]
    if moved == "tracer":
        monkeypatch.delattr(trace_api, "_TRACER_PROVIDER")
        monkeypatch.setattr(
            trace_api, "get_tracer_provider", lambda: now[0] or trace_api.ProxyTracerProvider()
        )
        provider: Any = sdk.tracer_provider
        expected = (True, False)
    else:
        monkeypatch.delattr(metrics_internal, "_METER_PROVIDER")
        monkeypatch.setattr(
            otel_metrics,
            "get_meter_provider",
            lambda: now[0] or metrics_internal._PROXY_METER_PROVIDER,
        )
        provider = sdk.meter_provider
        expected = (False, True)
    assert STATE.sdk_installed() == (False, False)
    assert STATE.sdk_installed() == (False, False)
    now[0] = provider
    assert STATE.sdk_installed() == expected


def test_without_the_apis_proxy_meter_provider_the_api_still_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sdk = _install(monkeypatch)
    monkeypatch.delattr(metrics_internal, "_PROXY_METER_PROVIDER")
    assert telemetry.is_recording() is True
    backend_of(Scripted).dispatch(XOR, INPUTS).result()
    assert sdk.value("vyre.dispatch.count", **LABELS, **{"vyre.status": "ok"}) == 1


def test_dispatches_before_a_meter_provider_is_installed_are_not_counted_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sdk = _install(monkeypatch, metrics=False)
    backend = backend_of(Scripted)
    backend.dispatch(XOR, INPUTS).result()  # traced, not metered
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", sdk.meter_provider)
    metrics_internal._PROXY_METER_PROVIDER.on_set_meter_provider(sdk.meter_provider)
    backend.dispatch(XOR, INPUTS).result()
    assert len(sdk.spans()) == 2
    assert sdk.counts() == {
        ("vyre.dispatch.count", "std.xor", "ok"): 1,
        ("vyre.pipeline.cache.hits", "std.xor", ""): 1,
        ("vyre.bytes.in", "std.xor", ""): 512,
        ("vyre.bytes.out", "std.xor", ""): 256,
    }


def test_the_dispatch_span_is_the_callers_child(monkeypatch: pytest.MonkeyPatch) -> None:
    sdk = _install(monkeypatch)
    with sdk.tracer_provider.get_tracer("app").start_as_current_span("request") as request:
        backend_of(Scripted).dispatch(XOR, INPUTS).result()
    (span,) = sdk.spans()
    assert span.parent is not None
    assert span.parent.span_id == request.get_span_context().span_id


class DropsOnRequest(Sampler):
    """Drops a span whose attributes ask for it (``vyre.policy.sample: "no"``) from the start."""

    def should_sample(
        self,
        parent_context: Any,
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        links: Any = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        if attributes and attributes.get("vyre.policy.sample") == "no":
            return SamplingResult(Decision.DROP)
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)

    def get_description(self) -> str:
        return "DropsOnRequest"


def test_the_sampler_sees_the_dispatch_attributes_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    sdk = _install(monkeypatch, sampler=DropsOnRequest())
    backend = backend_of(Scripted)
    with dispatch_attributes({"vyre.policy.sample": "no"}):
        backend.dispatch(XOR, INPUTS).result()
    assert sdk.spans() == []
    with dispatch_attributes({"vyre.policy.sample": "yes"}):
        backend.dispatch(XOR, INPUTS).result()
    (span,) = sdk.spans()
    assert _attrs(span)["vyre.policy.sample"] == "yes"


def test_a_tracer_of_another_sdk_with_a_sampler_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tracer provider that is not the OpenTelemetry SDK's, the SDK's sampling not imported."""

    class OwnProvider:
        def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
            return SimpleNamespace(sampler="own")

    _install(monkeypatch, metrics=False)
    monkeypatch.setattr(trace_api, "_TRACER_PROVIDER", OwnProvider())
    monkeypatch.delitem(sys.modules, "opentelemetry.sdk.trace.sampling")
    started = telemetry.start_dispatch()
    assert started is not None and started.traced is True


def test_a_provider_named_in_the_environment_later_is_not_installed_by_vyre(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only the application's own get_*_provider() loads what OTEL_PYTHON_*_PROVIDER names."""
    _install(monkeypatch, traces=False, metrics=False)
    monkeypatch.setattr(trace_api, "_TRACER_PROVIDER_SET_ONCE", Once())
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER_SET_ONCE", Once())
    monkeypatch.setattr(trace_api, "_TRACER_PROVIDER", trace_api.NoOpTracerProvider())
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", NoOpMeterProvider())
    assert telemetry.is_recording() is False  # loads the API
    monkeypatch.setenv("OTEL_PYTHON_TRACER_PROVIDER", "sdk_tracer_provider")
    monkeypatch.setenv("OTEL_PYTHON_METER_PROVIDER", "sdk_meter_provider")
    monkeypatch.setattr(trace_api, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", None)
    assert STATE.sdk_installed() == (False, False)
    assert trace_api._TRACER_PROVIDER is None
    assert metrics_internal._METER_PROVIDER is None


def test_no_api_import_when_nobody_imported_the_api(monkeypatch: pytest.MonkeyPatch) -> None:
    _install(monkeypatch)
    assert telemetry.is_recording()  # the API loaded (afresh, for this test)
    api = STATE.api
    loads: list[int] = []

    def load(state: TelemetryState) -> Any:
        loads.append(1)
        state.api = api  # it was loaded for real already
        return api

    monkeypatch.setattr(TelemetryState, "load_api", load)
    monkeypatch.setattr(_otel_compat, "PROVIDERS_FROM_ENV", False)
    for present in ((), ("opentelemetry.trace",), ("opentelemetry.metrics",)):
        monkeypatch.setattr(STATE, "api", None)
        monkeypatch.setattr(STATE, "tracing", False)
        monkeypatch.setattr(STATE, "metering", False)
        monkeypatch.setattr(STATE, "seen", (_otel_compat.UNKNOWN, _otel_compat.UNKNOWN))
        with monkeypatch.context() as m:
            for name in ("opentelemetry.trace", "opentelemetry.metrics"):
                if name not in present:
                    m.delitem(sys.modules, name)
            loads.clear()
            recording = telemetry.is_recording()
            assert loads == ([1] if present else []), present
            if not present:
                assert recording is False and telemetry.start_dispatch() is None
                assert loads == []
                telemetry.DispatchTrace(False, False)
                assert loads == []
                telemetry.DispatchTrace(True, False)
                assert loads == [1]
                STATE.api = None
                telemetry.DispatchTrace(False, True)
                assert loads == [1, 1]
    monkeypatch.setattr(STATE, "api", None)
    monkeypatch.setattr(STATE, "tracing", False)
    monkeypatch.setattr(_otel_compat, "PROVIDERS_FROM_ENV", True)
    with monkeypatch.context() as m:
        m.delitem(sys.modules, "opentelemetry.trace")
        m.delitem(sys.modules, "opentelemetry.metrics")
        loads.clear()
        telemetry.is_recording()
        assert loads == [1]


def test_switched_off_nothing_is_recording(monkeypatch: pytest.MonkeyPatch) -> None:
    _install(monkeypatch)
    telemetry.set_enabled(False)
    assert telemetry.is_recording() is False
    assert telemetry.start_dispatch() is None


# DispatchTrace made by hand -----------------------------------------------------------------


def test_a_dispatch_trace_keeps_the_callers_context_only_when_traced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _install(monkeypatch)
    assert telemetry.DispatchTrace(True).metered is True
    ctx = otel_context.set_value("vyre.test", 1)
    assert telemetry.DispatchTrace(True, True, ctx).parent is ctx
    assert telemetry.DispatchTrace(False, True, ctx).parent is None
    token = otel_context.attach(ctx)
    try:
        assert telemetry.DispatchTrace(True).parent is ctx
    finally:
        otel_context.detach(token)


# Samplers ------------------------------------------------------------------------------


def test_always_off_makes_no_span_and_with_metrics_an_untraced_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sdk = _install(monkeypatch, sampler=ALWAYS_OFF, metrics=False)
    assert telemetry.start_dispatch() is None
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", sdk.meter_provider)
    started = telemetry.start_dispatch()
    assert started is not None
    assert started.traced is False and started.metered is True


def test_a_proxy_tracer_s_sdk_sampler_is_known_once_it_found_its_tracer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _install(monkeypatch, traces=False, metrics=False)
    assert telemetry.is_recording() is False  # vyre's tracer is the API's proxy
    dropping = TracerProvider(sampler=ALWAYS_OFF, shutdown_on_exit=False)
    monkeypatch.setattr(trace_api, "_TRACER_PROVIDER", dropping)
    backend_of(Scripted).dispatch(XOR, INPUTS).result()  # the proxy finds the SDK tracer
    assert telemetry.start_dispatch() is None


# Tracing detail ----------------------------------------------------------------------------


def test_set_trace_detail_normalises_and_refuses_with_a_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _isolate(monkeypatch)
    telemetry.set_trace_detail(" PHASES ")
    assert telemetry.trace_detail() == "phases"
    telemetry.set_trace_detail("   ")
    assert telemetry.trace_detail() == "span"
    with pytest.raises(InvalidProgram) as raised:
        telemetry.set_trace_detail(3)  # type: ignore[arg-type]
    assert str(raised.value) == (
        "the tracing detail is a str, got 3\nFix: pass detail='span' or detail='phases'"
    )
    with pytest.raises(InvalidProgram) as raised:
        telemetry.set_trace_detail("everything")
    assert str(raised.value) == (
        "unknown tracing detail 'everything'; choose one of span, phases\n"
        "Fix: set VYRE_TRACE_DETAIL (or pass detail=) to 'span' or 'phases'"
    )
    assert telemetry.trace_detail() == "span"


# The environment, read at import -------------------------------------------------------------


def _fresh_state(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, **env: str | None
) -> tuple[TelemetryState, list[logging.LogRecord]]:
    """A telemetry state made with ``env`` in the environment (as at import); its log records."""
    for key, value in env.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        state = TelemetryState()
    return state, list(caplog.records)


@pytest.mark.parametrize(
    ("value", "enabled"),
    [
        (None, True),
        ("", True),
        ("  ", True),
        ("on", True),
        (" Yes ", True),
        ("1", True),
        ("TRUE", True),
        ("off", False),
        (" OFF ", False),
        ("0", False),
        ("no", False),
        ("False", False),
    ],
)
def test_vyre_telemetry_values(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    value: str | None,
    enabled: bool,
) -> None:
    state, records = _fresh_state(monkeypatch, caplog, VYRE_TELEMETRY=value, VYRE_TRACE_DETAIL=None)
    assert state.enabled is enabled
    assert state.detail == "span"
    assert records == []


def test_an_unknown_vyre_telemetry_value_is_logged_and_keeps_it_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    state, records = _fresh_state(
        monkeypatch, caplog, VYRE_TELEMETRY=" Maybe ", VYRE_TRACE_DETAIL=None
    )
    assert state.enabled is True
    (record,) = records
    assert record.name == "vyre_async.telemetry"
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "VYRE_TELEMETRY='maybe' is neither on (1, on, true, yes) nor off (0, off, false, no); "
        "telemetry stays on.\nFix: set VYRE_TELEMETRY=off or on"
    )


def test_the_trace_detail_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    state, records = _fresh_state(
        monkeypatch, caplog, VYRE_TELEMETRY=None, VYRE_TRACE_DETAIL=" Phases "
    )
    assert state.detail == "phases" and records == []
    state, records = _fresh_state(monkeypatch, caplog, VYRE_TRACE_DETAIL="50% more")
    assert state.detail == "span"
    (record,) = records
    assert record.name == "vyre_async.telemetry"
    assert record.getMessage() == (
        "unknown tracing detail '50% more'; choose one of span, phases\n"
        "Fix: set VYRE_TRACE_DETAIL (or pass detail=) to 'span' or 'phases'"
    )


# Prometheus text --------------------------------------------------------------------------


def _data(*metrics: Any) -> Any:
    scope = SimpleNamespace(metrics=list(metrics))
    return SimpleNamespace(resource_metrics=[SimpleNamespace(scope_metrics=[scope])])


def _number(value: float, **attributes: Any) -> NumberDataPoint:
    return NumberDataPoint(attributes, 0, 1, value)


def _metric(name: str, data: Any, description: str = "") -> Metric:
    return Metric(name=name, description=description, unit="", data=data)


def _sum(*points: NumberDataPoint, monotonic: bool = True) -> Sum:
    return Sum(list(points), AggregationTemporality.CUMULATIVE, monotonic)


def _histogram(counts: Sequence[int], bounds: Sequence[float], **attributes: Any) -> Histogram:
    point = HistogramDataPoint(
        attributes, 0, 1, sum(counts), 1.5, list(counts), list(bounds), 0.0, 1.0
    )
    return Histogram([point], AggregationTemporality.CUMULATIVE)


@dataclass
class OtlpSum:  # another source's sum: not the SDK's class
    data_points: list[Any]
    is_monotonic: bool = True


@dataclass
class OtlpHistogram:
    data_points: list[Any] = field(default_factory=list)


@dataclass
class OtlpGauge:
    data_points: list[Any] = field(default_factory=list)


def test_prometheus_text_of_nothing_is_empty() -> None:
    assert prometheus_text(_data()) == ""
    assert prometheus_text(None) == ""


def test_metric_kinds_are_known_by_their_shape_not_only_their_class() -> None:
    text = prometheus_text(
        _data(
            _metric("jobs", OtlpSum([_number(3, queue="a")]), "Jobs done"),
            _metric("wait", OtlpHistogram([_histogram([1, 2], [0.5]).data_points[0]])),
            _metric("depth", OtlpGauge([_number(7)])),
        )
    )
    assert text.splitlines() == [
        "# HELP jobs_total Jobs done",
        "# TYPE jobs_total counter",
        'jobs_total{queue="a"} 3',
        "# HELP wait wait",
        "# TYPE wait histogram",
        'wait_bucket{le="0.5"} 1',
        'wait_bucket{le="+Inf"} 3',
        "wait_sum 1.5",
        "wait_count 3",
        "# HELP depth depth",
        "# TYPE depth gauge",
        "depth 7",
    ]


def test_an_empty_gauge_is_still_typed_a_gauge() -> None:
    text = prometheus_text(_data(_metric("depth", Gauge([]))))
    assert text == "# HELP depth depth\n# TYPE depth gauge\n"


def test_an_up_down_sum_named_total_does_not_take_the_shorter_name() -> None:
    text = prometheus_text(
        _data(
            _metric("jobs_total", _sum(_number(-2), monotonic=False)),
            _metric("jobs", Gauge([_number(5)])),
        )
    )
    assert text.splitlines() == [
        "# HELP jobs_total jobs_total",
        "# TYPE jobs_total gauge",
        "jobs_total -2",
        "# HELP jobs jobs",
        "# TYPE jobs gauge",
        "jobs 5",
    ]


def test_a_clash_names_exactly_the_names_taken() -> None:
    text = prometheus_text(
        _data(
            _metric("other", Gauge([_number(1)])),
            _metric("a", _sum(_number(1))),
            _metric("a", _sum(_number(2))),
        )
    )
    assert text.splitlines()[-1] == (
        "# a: a, a_total written for another metric already; this Sum is left out"
    )


def test_le_is_reserved_on_histograms_only_and_duplicates_skip_one_point() -> None:
    text = prometheus_text(
        _data(
            _metric("hits", _sum(_number(1, le="x"), _number(2, le="x"), _number(3, le="y"))),
        )
    )
    assert text.splitlines() == [
        "# HELP hits_total hits",
        "# TYPE hits_total counter",
        'hits_total{le="x"} 1',
        '# hits_total{le="x"}: a second point with these labels, left out',
        'hits_total{le="y"} 3',
    ]


def test_a_histogram_point_whose_counts_do_not_match_its_bounds_is_refused() -> None:
    with pytest.raises(ValueError):
        prometheus_text(_data(_metric("wait", _histogram([1, 2, 3], [0.5]))))


@pytest.fixture(autouse=True)
def _no_leak() -> Iterator[None]:
    """Every test leaves telemetry on with the span detail."""
    yield
    assert telemetry.is_enabled() and telemetry.trace_detail() == "span"


def test_a_rejection_that_telemetry_fails_to_record_is_reported_never_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Kills x_fail_before_launch__mutmut_10 (_report(None): reporting itself raised).
    bug = RuntimeError("telemetry's own bug")

    def broken(*_: Any) -> None:
        raise bug

    reported: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(_spans, "_record_rejection", broken)
    monkeypatch.setattr(threading, "excepthook", reported.append)
    started: Any = SimpleNamespace(record=None)
    _spans.fail_before_launch(started, InvalidProgram("bad"), "scripted", XOR)
    assert [(r.exc_type, r.exc_value) for r in reported] == [(RuntimeError, bug)]


@pytest.mark.parametrize("bad", ["off", 0, None])
def test_set_enabled_refuses_anything_but_a_bool_with_its_fix(bad: Any) -> None:
    # Kills x_set_enabled__mutmut_5, 6 (the Fix dropped or changed).
    with pytest.raises(InvalidProgram) as caught:
        telemetry.set_enabled(bad)
    assert str(caught.value) == (
        f"set_enabled takes True or False, got {bad!r}\n"
        "Fix: pass set_enabled(False) to turn telemetry off"
    )
    assert telemetry.is_enabled()
