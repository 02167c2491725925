"""One vyre.dispatch span per dispatch, parented under the caller's span, with typed attributes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import StatusCode

from tests.driver.fakes import DelayBackend
from tests.helpers import backend_of
from vyre_async import (
    BackendClosed,
    DispatchConfig,
    DispatchTimeout,
    InvalidProgram,
    Launch,
    Program,
    UnsupportedFeature,
    VyreBackend,
    telemetry,
)
from vyre_async.programs import elementwise_xor
from vyre_async.telemetry import SECONDS_BUCKETS, _spans, dispatch_attributes, prometheus_text
from vyre_async.telemetry._state import STATE, TelemetryState
from vyre_reference import ReferenceExecutor, reference_backend

pytestmark = pytest.mark.anyio
tracer = trace.get_tracer("tests")
XOR = elementwise_xor(64)
INPUTS = [np.zeros(64, np.uint32), np.ones(64, np.uint32)]


@pytest.fixture
def backend() -> Iterator[VyreBackend]:
    b = backend_of(DelayBackend, delay=0.0005)
    yield b
    b.executor.stop()


def _dispatch_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == "vyre.dispatch"]


async def test_1000_concurrent_dispatches_give_1000_correctly_parented_spans(
    spans: InMemorySpanExporter, backend: VyreBackend
) -> None:
    parents: dict[int, int] = {}

    async def request(i: int) -> None:
        with tracer.start_as_current_span(f"request-{i}") as req:
            await anyio.lowlevel.checkpoint()  # the context must survive suspension
            await backend.dispatch(XOR, INPUTS)
            parents[i] = req.get_span_context().span_id

    async with anyio.create_task_group() as tg:
        for i in range(1000):
            tg.start_soon(request, i)
    finished = spans.get_finished_spans()
    dispatch = [s for s in finished if s.name == "vyre.dispatch"]
    requests = {s.name: s for s in finished if s.name.startswith("request-")}
    assert len(dispatch) == 1000
    by_parent = {s.parent.span_id: s for s in dispatch if s.parent is not None}
    assert len(by_parent) == 1000
    for i in range(1000):
        req = requests[f"request-{i}"]
        child = by_parent[parents[i]]
        assert child.context.trace_id == req.context.trace_id


async def test_attributes_are_present_and_typed(
    spans: InMemorySpanExporter, backend: VyreBackend
) -> None:
    await backend.dispatch(XOR, INPUTS, DispatchConfig(label="typed", profile="soak"))
    (span,) = _dispatch_spans(spans)
    a = span.attributes or {}
    assert a["vyre.backend.id"] == "delay-test"
    assert a["vyre.program.fingerprint"] == XOR.fingerprint().hex()
    assert a["vyre.program.op_id"] == "std.xor"
    assert tuple(a["vyre.launch.grid"]) == (1, 1, 1)  # type: ignore[arg-type]
    assert tuple(a["vyre.launch.workgroup"]) == (64, 1, 1)  # type: ignore[arg-type]
    assert a["vyre.bytes.in"] == 512 and a["vyre.bytes.out"] == 256
    assert isinstance(a["vyre.pipeline.cache_hit"], bool)
    assert a["vyre.device.time_s"] == pytest.approx(0.0005)
    assert a["vyre.stream"] == 1
    assert a["vyre.label"] == "typed"
    assert a["vyre.profile"] == "soak"
    assert span.status.status_code is StatusCode.UNSET


@pytest.fixture
def phases_detail() -> Iterator[None]:
    telemetry.set_trace_detail("phases")
    try:
        yield
    finally:
        telemetry.set_trace_detail("span")


async def test_by_default_a_dispatch_is_one_span_with_its_phase_durations(
    spans: InMemorySpanExporter,
) -> None:
    assert telemetry.trace_detail() == "span"
    backend = backend_of(DelayBackend, delay=0.002)
    try:
        await backend.dispatch(XOR, INPUTS)  # first dispatch compiles
    finally:
        await backend.aclose()
    (span,) = spans.get_finished_spans()  # no child spans
    assert span.name == "vyre.dispatch"
    a = span.attributes
    assert a is not None
    phases = {k: v for k, v in a.items() if k.startswith("vyre.phase.")}
    assert set(phases) == {"vyre.phase.compile_s", "vyre.phase.wait_s", "vyre.phase.launch_s"}
    assert all(isinstance(v, float) and v >= 0.0 for v in phases.values())
    assert phases["vyre.phase.launch_s"] >= 0.0015  # the backend's 2 ms launch
    assert span.start_time is not None and span.end_time is not None
    total = sum(phases.values())  # type: ignore[arg-type]
    assert total <= (span.end_time - span.start_time) / 1e9


async def test_with_the_phases_detail_phases_are_also_child_spans(
    spans: InMemorySpanExporter, phases_detail: None
) -> None:
    backend = backend_of(DelayBackend, delay=0.002)
    try:
        await backend.dispatch(XOR, INPUTS)  # first dispatch compiles
    finally:
        await backend.aclose()
    finished = spans.get_finished_spans()
    (parent,) = [s for s in finished if s.name == "vyre.dispatch"]
    children = {
        s.name: s for s in finished if s.parent and s.parent.span_id == parent.context.span_id
    }
    assert set(children) == {"vyre.compile", "vyre.wait", "vyre.launch"}
    launch = children["vyre.launch"]
    assert launch.end_time is not None and launch.start_time is not None
    assert launch.end_time - launch.start_time >= 1_500_000
    assert parent.start_time is not None and parent.end_time is not None
    assert parent.start_time <= children["vyre.compile"].start_time  # type: ignore[operator]
    assert children["vyre.launch"].end_time <= parent.end_time  # type: ignore[operator]
    # The same durations as the attributes the single span carries.
    a = parent.attributes
    assert a is not None
    for name, child in children.items():
        seconds = (child.end_time - child.start_time) / 1e9  # type: ignore[operator]
        assert a[telemetry.PHASE_ATTRIBUTES[name]] == pytest.approx(seconds, abs=1e-9)


def test_an_unknown_trace_detail_is_refused_with_a_fix() -> None:
    with pytest.raises(InvalidProgram) as caught:
        telemetry.set_trace_detail("everything")
    assert "span" in str(caught.value) and "phases" in str(caught.value)
    assert str(caught.value).rpartition("\n")[2].startswith("Fix: ")
    assert telemetry.trace_detail() == "span"  # unchanged


def test_an_unknown_trace_detail_in_the_environment_is_reported_and_keeps_the_default() -> None:
    # Logged, not warned: the import must not fail over a variable, even under -W error.
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", "import vyre_async.telemetry"],
        env={**os.environ, "VYRE_TRACE_DETAIL": "everything"},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "unknown tracing detail 'everything'" in out.stderr and "Fix: " in out.stderr
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import warnings, vyre_async.telemetry as t; print(t.trace_detail())",
        ],
        env={**os.environ, "VYRE_TRACE_DETAIL": "everything"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "span" and "Fix: " in out.stderr
    out = subprocess.run(
        [sys.executable, "-c", "import vyre_async.telemetry as t; print(t.trace_detail())"],
        env={**os.environ, "VYRE_TRACE_DETAIL": " Phases "},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "phases"


async def test_errors_before_launch_end_the_span_with_error(
    spans: InMemorySpanExporter, backend: VyreBackend
) -> None:
    with pytest.raises(InvalidProgram):
        backend.dispatch(XOR, INPUTS[:1])
    (span,) = _dispatch_spans(spans)
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})["vyre.error.code"] == 1006
    assert [e.name for e in span.events] == ["exception"]


async def test_timeout_sets_error_status(spans: InMemorySpanExporter) -> None:
    backend = backend_of(DelayBackend, delay=0.2)
    try:
        with pytest.raises(DispatchTimeout):
            await backend.dispatch(XOR, INPUTS, DispatchConfig(timeout=0.02))
    finally:
        await backend.aclose()
    (span,) = _dispatch_spans(spans)
    assert span.status.status_code is StatusCode.ERROR
    assert "DispatchTimeout" in (span.status.description or "")
    assert (span.attributes or {})["vyre.error.code"] == 1009


async def test_cancelled_await_ends_the_span_clearly(spans: InMemorySpanExporter) -> None:
    backend = backend_of(DelayBackend, delay=0.1)
    try:
        with anyio.move_on_after(0.01):
            await backend.dispatch(XOR, INPUTS)
        (span,) = _dispatch_spans(spans)
        assert span.status.status_code is StatusCode.ERROR
        assert "await cancelled" in (span.status.description or "")
        assert (span.attributes or {})["vyre.await.cancelled"] is True
        await anyio.sleep(0.15)  # the work finishes; no second span end, no crash
        assert len(_dispatch_spans(spans)) == 1
    finally:
        await backend.aclose()


async def test_metrics_and_prometheus_text(
    spans: InMemorySpanExporter, reader: InMemoryMetricReader, backend: VyreBackend
) -> None:
    def delay_buckets() -> list[int]:
        """This backend's duration histogram, bucket counts (other tests add to it too)."""
        counts = [0] * (len(SECONDS_BUCKETS) + 1)
        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name != "vyre.dispatch.duration":
                        continue
                    for point in m.data.data_points:
                        if point.attributes.get("vyre.backend.id") == "delay-test":
                            counts = [
                                c + n for c, n in zip(counts, point.bucket_counts, strict=True)
                            ]
        return counts

    before = delay_buckets()
    for _ in range(3):
        await backend.dispatch(XOR, INPUTS)
    added = [after - was for after, was in zip(delay_buckets(), before, strict=True)]
    uppers = (*SECONDS_BUCKETS, float("inf"))
    used = [u for u, c in zip(uppers, added, strict=True) if c]
    # dispatches of >= 0.5 ms land in a sub-millisecond-scale bucket
    assert sum(added) == 3 and 5e-4 <= used[0] <= 2.5e-3, used
    data = reader.get_metrics_data()
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert {
        "vyre.dispatch.count",
        "vyre.dispatch.duration",
        "vyre.dispatch.device_time",
        "vyre.pipeline.cache.hits",
        "vyre.bytes.in",
        "vyre.bytes.out",
    } <= names
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for point in m.data.data_points:
                    assert "vyre.program.fingerprint" not in point.attributes
                if m.name == "vyre.dispatch.duration":  # seconds buckets, not the ms default
                    for point in m.data.data_points:
                        assert isinstance(point, HistogramDataPoint)
                        assert tuple(point.explicit_bounds) == SECONDS_BUCKETS
    text = prometheus_text(data)
    assert "# TYPE vyre_dispatch_count_total counter" in text
    assert (
        'vyre_dispatch_count_total{vyre_backend_id="delay-test",vyre_program_op_id="std.xor",vyre_status="ok"}'
        in text
    )
    assert "# TYPE vyre_dispatch_duration histogram" in text
    assert 'le="+Inf"' in text and "vyre_dispatch_duration_count{" in text


async def test_telemetry_can_be_switched_off(
    spans: InMemorySpanExporter, reader: InMemoryMetricReader, backend: VyreBackend
) -> None:
    from vyre_async import telemetry

    telemetry.set_enabled(False)
    try:
        assert not telemetry.is_enabled()
        await backend.dispatch(XOR, INPUTS)
        with pytest.raises(InvalidProgram):
            backend.dispatch(XOR, INPUTS[:1])
    finally:
        telemetry.set_enabled(True)
    assert _dispatch_spans(spans) == []
    assert telemetry.is_enabled()
    await backend.dispatch(XOR, INPUTS)
    assert len(_dispatch_spans(spans)) == 1


def test_dispatch_attributes_block_lands_on_the_spans_inside_it(
    spans: InMemorySpanExporter,
) -> None:
    backend = reference_backend()  # 64-lane xor runs inline: its span ends inside dispatch()
    with dispatch_attributes({"vyre.policy.demo": "yes"}):
        inside = backend.dispatch(XOR, INPUTS)
    outside = backend.dispatch(XOR, INPUTS)
    assert inside.done() and outside.done()
    first, second = _dispatch_spans(spans)
    assert first.attributes is not None and second.attributes is not None
    assert first.attributes["vyre.policy.demo"] == "yes"
    assert "vyre.policy.demo" not in second.attributes


async def test_an_error_after_the_span_opened_ends_that_one_span(
    spans: InMemorySpanExporter,
) -> None:
    """enqueue refusing the launch (after attach opened the span) ends that one span."""

    class Refusing(ReferenceExecutor):
        def enqueue(self, launch: Launch) -> None:
            raise UnsupportedFeature("this device refuses every launch", fix="test double")

    backend = backend_of(Refusing)
    with pytest.raises(UnsupportedFeature, match="refuses"):
        backend.dispatch(XOR, INPUTS)
    (span,) = _dispatch_spans(spans)
    assert span.end_time is not None and span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert tuple(span.attributes["vyre.launch.grid"]) == (1, 1, 1)  # type: ignore[arg-type]
    assert span.attributes["vyre.error.code"] == int(UnsupportedFeature.code)
    assert [e.name for e in span.events] == ["exception"]
    await anyio.lowlevel.checkpoint()


async def test_a_dispatch_on_a_closed_backend_is_an_error_span(
    spans: InMemorySpanExporter,
) -> None:
    backend = reference_backend()
    await backend.aclose()
    with pytest.raises(BackendClosed):
        backend.dispatch(XOR, INPUTS)
    (span,) = _dispatch_spans(spans)
    assert span.end_time is not None and span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert span.attributes["vyre.error.code"] == int(BackendClosed.code)


def _count(reader: InMemoryMetricReader, name: str, _field: str = "value", **labels: str) -> int:
    """The sum of ``name``'s points whose attributes include ``labels`` (0 if none).

    ``_field``: what to add of each point (``"count"`` for a histogram's points).
    """
    total = 0
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    for point in m.data.data_points:
                        if all(point.attributes.get(k) == v for k, v in labels.items()):
                            total += int(getattr(point, _field))
    return total


async def test_a_sampled_out_dispatch_builds_nothing_yet_is_counted(
    spans: InMemorySpanExporter, reader: InMemoryMetricReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A span the sampler drops: no attributes, no phases, no end-time work; metrics stay."""
    dropping = TracerProvider(sampler=ALWAYS_OFF).get_tracer("sampled-out")
    monkeypatch.setattr(STATE, "tracer", dropping)

    def never(*args: object) -> None:
        raise AssertionError("end-time attributes built for a span nobody records")

    monkeypatch.setattr(_spans, "_end_span", never)
    shapes: list[object] = []
    facts = _spans._ShapeFacts

    def counted(*args: Any) -> Any:
        shapes.append(args)
        return facts(*args)

    monkeypatch.setattr(_spans, "_ShapeFacts", counted)
    labels = {"vyre.backend.id": "reference", "vyre.program.op_id": "std.xor"}
    before = _count(reader, "vyre.dispatch.count", **labels, **{"vyre.status": "ok"})
    backend = reference_backend(inline_ns=0)  # worker threads: a wait phase, if it were kept
    try:
        for _ in range(20):  # the first compiles: a compile phase, if it were kept
            pending = backend.dispatch(XOR, INPUTS)
            await pending
            record = pending.record
            assert record.trace is not None and record.trace.span is None  # metered only
            assert record.phases is None
            assert not any(k.startswith("vyre.prefetch") for k in record.attributes or {})
    finally:
        await backend.aclose()
    assert spans.get_finished_spans() == ()
    assert len(shapes) == 1  # the launch attributes were built once, for the shape
    after = _count(reader, "vyre.dispatch.count", **labels, **{"vyre.status": "ok"})
    assert after - before == 20


async def test_a_sampled_out_dispatch_without_metrics_is_let_go_at_attach(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(STATE, "tracer", TracerProvider(sampler=ALWAYS_OFF).get_tracer("x"))
    monkeypatch.setattr(TelemetryState, "sdk_installed", lambda _: (True, False))  # tracer only
    backend = reference_backend()
    pending = backend.dispatch(XOR, INPUTS)
    await pending
    record = pending.record
    assert record.trace is None  # let go: no span, no claim
    assert record.on_await_cancelled is None  # no done-callback, no claim: nothing to end
    await backend.aclose()


@pytest.mark.parametrize("completion", ["inline", "worker thread"])
async def test_the_span_is_the_callers_child_wherever_the_dispatch_completes(
    spans: InMemorySpanExporter, completion: str
) -> None:
    backend = reference_backend() if completion == "inline" else reference_backend(inline_ns=0)
    try:
        with tracer.start_as_current_span("request") as request:
            pending = backend.dispatch(XOR, INPUTS)
            await pending
    finally:
        await backend.aclose()
    (span,) = _dispatch_spans(spans)
    assert span.parent is not None
    assert span.parent.span_id == request.get_span_context().span_id
    assert span.context.trace_id == request.get_span_context().trace_id
    if completion == "worker thread":
        assert "vyre.phase.wait_s" in (span.attributes or {})  # it did queue for a worker


async def test_a_failure_in_telemetry_is_reported_and_the_dispatch_still_settles(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    reported: list[BaseException | None] = []
    monkeypatch.setattr("threading.excepthook", lambda args: reported.append(args.exc_value))

    def broken(*args: object) -> None:
        raise RuntimeError("telemetry bug")

    monkeypatch.setattr(_spans, "_end_span", broken)
    backend = reference_backend()
    outputs = await backend.dispatch(XOR, INPUTS)
    assert outputs[0].tolist() == (INPUTS[0] ^ INPUTS[1]).tolist()
    assert [str(e) for e in reported] == ["telemetry bug"]
    await backend.aclose()


_UNSAMPLED_PARENT = trace.NonRecordingSpan(
    trace.SpanContext(
        trace_id=0x1234, span_id=0x5678, is_remote=False, trace_flags=trace.TraceFlags(0)
    )
)
_UNSAMPLED_REMOTE_PARENT = trace.NonRecordingSpan(
    trace.SpanContext(
        trace_id=0x1234, span_id=0x5678, is_remote=True, trace_flags=trace.TraceFlags(0)
    )
)
_SAMPLED_PARENT = trace.NonRecordingSpan(
    trace.SpanContext(
        trace_id=0x1234, span_id=0x5678, is_remote=False, trace_flags=trace.TraceFlags(1)
    )
)


class _NamedLikeAlwaysOff(Sampler):
    """A custom sampler whose description merely starts like ``ALWAYS_OFF``'s."""

    def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
        return SamplingResult(Decision.RECORD_AND_SAMPLE)

    def get_description(self) -> str:
        return "AlwaysOffSamplerUnlessDebug"


class _SamplesEverything(ParentBased):
    """A ParentBased subclass that overrides the decision but not the description."""

    def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
        return SamplingResult(Decision.RECORD_AND_SAMPLE)


_RATIO = ParentBased(TraceIdRatioBased(0.01))


@pytest.mark.parametrize(
    ("sampler", "parent", "made"),
    [
        (ALWAYS_OFF, None, False),
        (ALWAYS_OFF, _SAMPLED_PARENT, False),
        (_RATIO, _UNSAMPLED_PARENT, False),
        (_RATIO, _UNSAMPLED_REMOTE_PARENT, False),
        (_RATIO, _SAMPLED_PARENT, True),
        (_RATIO, None, True),  # a root: the ratio decides, span by span
        (
            ParentBased(ALWAYS_ON, local_parent_not_sampled=ALWAYS_ON),
            _UNSAMPLED_PARENT,
            True,
        ),
        (
            ParentBased(
                ParentBased(ALWAYS_ON),
                remote_parent_not_sampled=ALWAYS_ON,
                local_parent_not_sampled=ALWAYS_ON,
            ),
            _UNSAMPLED_PARENT,
            True,
        ),
        (_NamedLikeAlwaysOff(), None, True),
        (_SamplesEverything(ALWAYS_ON), _UNSAMPLED_PARENT, True),
        (TraceIdRatioBased(0.5), _UNSAMPLED_PARENT, True),
        (ALWAYS_ON, None, True),
        (None, _UNSAMPLED_PARENT, True),  # the SDK tracer is not known yet
    ],
    ids=[
        "always-off",
        "always-off-under-sampled",
        "parent-based-under-unsampled",
        "parent-based-under-unsampled-remote",
        "parent-based-under-sampled",
        "parent-based-root",
        "parent-based-that-samples-unsampled-parents",
        "parent-based-nested-in-the-root",
        "custom-named-like-always-off",
        "parent-based-subclass",
        "ratio-not-parent-based",
        "always-on",
        "not-known-yet",
    ],
)
def test_a_span_the_sampler_is_known_to_drop_is_not_made(
    monkeypatch: pytest.MonkeyPatch, sampler: Any, parent: Any, made: bool
) -> None:
    # vyre's tracer, as an SDK tracer carrying ``sampler`` (or the API's proxy before one)
    tracer = types.SimpleNamespace(
        _real_tracer=None, **({} if sampler is None else {"sampler": sampler})
    )
    monkeypatch.setattr(STATE, "tracer", tracer)
    monkeypatch.setattr(TelemetryState, "sdk_installed", lambda _: (True, False))  # tracer only
    if parent is None:
        started = telemetry.start_dispatch()
    else:
        with trace.use_span(parent):
            started = telemetry.start_dispatch()
    assert (started is not None) is made
    if started is not None:
        assert started.traced
        if sampler is not None and parent is not None:  # what the SDK itself decides
            decision = sampler.should_sample(
                trace.set_span_in_context(parent), 0x1234, "vyre.dispatch"
            ).decision
            assert decision.is_sampled()


def test_with_metrics_a_dropped_span_still_leaves_the_dispatch_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(STATE, "tracer", types.SimpleNamespace(sampler=ALWAYS_OFF))
    monkeypatch.setattr(TelemetryState, "sdk_installed", lambda _: (True, True))
    started = telemetry.start_dispatch()
    assert started is not None and not started.traced and started.metered


async def test_the_sampler_that_counts_is_the_tracers_own_not_the_providers(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SDK tracer keeps the sampler its provider had when it was made."""
    backend = reference_backend()
    await backend.dispatch(XOR, INPUTS)  # vyre's tracer is the SDK's from here on
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    monkeypatch.setattr(provider, "sampler", ALWAYS_OFF)  # the tracer still samples
    await backend.dispatch(XOR, INPUTS)
    assert len(_dispatch_spans(spans)) == 2
    await backend.aclose()


async def test_under_an_unsampled_request_no_sdk_span_is_made_and_metrics_count(
    spans: InMemorySpanExporter, reader: InMemoryMetricReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The in-memory SDK's default sampler follows the parent: an unsampled parent drops it."""
    opened: list[str] = []
    start_span = STATE.tracer.start_span

    def counted(name: str, *args: Any, **kwargs: Any) -> Any:
        opened.append(name)
        return start_span(name, *args, **kwargs)

    monkeypatch.setattr(STATE.tracer, "start_span", counted)
    labels = {"vyre.backend.id": "reference", "vyre.program.op_id": "std.xor"}
    before = _count(reader, "vyre.dispatch.count", **labels, **{"vyre.status": "ok"})
    backend = reference_backend()
    with trace.use_span(_UNSAMPLED_PARENT):
        for _ in range(5):
            await backend.dispatch(XOR, INPUTS)
    assert opened == [] and spans.get_finished_spans() == ()
    with tracer.start_as_current_span("sampled request"):
        await backend.dispatch(XOR, INPUTS)
    assert opened == ["vyre.dispatch"] and len(_dispatch_spans(spans)) == 1
    after = _count(reader, "vyre.dispatch.count", **labels, **{"vyre.status": "ok"})
    assert after - before == 6
    await backend.aclose()


def _points(reader: InMemoryMetricReader, name: str, **labels: str) -> int:
    """How many histogram points ``name`` holds for ``labels`` (0 if none)."""
    return _count(reader, name, "count", **labels)


def _statuses(reader: InMemoryMetricReader, op_id: str) -> dict[str, int]:
    labels = {"vyre.backend.id": "reference", "vyre.program.op_id": op_id}
    return {
        status: _count(reader, "vyre.dispatch.count", **labels, **{"vyre.status": status})
        for status in ("ok", "error", "rejected", "cancelled", "timeout")
    }


async def test_a_program_past_a_wire_limit_keeps_its_validation_error_and_is_counted(
    spans: InMemorySpanExporter, reader: InMemoryMetricReader
) -> None:
    program = elementwise_xor(64)
    long_name = Program(
        list(program.buffers), program.workgroup_size, list(program.body), op_id="x" * 300
    )
    before = _statuses(reader, "x" * 300)
    backend = reference_backend()
    with pytest.raises(InvalidProgram) as raised:
        backend.dispatch(long_name, INPUTS)
    assert "op_id" in str(raised.value) and "cannot encode" not in str(raised.value)
    after = _statuses(reader, "x" * 300)
    assert after["rejected"] - before["rejected"] == 1
    (span,) = _dispatch_spans(spans)
    assert span.status.status_code is StatusCode.ERROR
    assert "vyre.program.fingerprint" not in (span.attributes or {})
    await backend.aclose()


async def test_a_batch_refused_at_planning_counts_every_item_rejected_and_nothing_else(
    spans: InMemorySpanExporter, reader: InMemoryMetricReader
) -> None:
    program = elementwise_xor(64)
    backend = reference_backend()
    pipeline = backend.compile(program)
    await backend.dispatch(program, INPUTS)  # warm: counted once, as ok
    before = _statuses(reader, "std.xor")
    hits = _count(reader, "vyre.pipeline.cache.hits", **{"vyre.backend.id": "reference"})
    points = _points(reader, "vyre.dispatch.duration", **{"vyre.backend.id": "reference"})
    spans.clear()
    bad = [INPUTS[0]]  # the third item lacks its second input
    with pytest.raises(InvalidProgram):
        pipeline.dispatch_batch([INPUTS, INPUTS, bad])
    after = _statuses(reader, "std.xor")
    assert {k: after[k] - before[k] for k in after} == {
        "ok": 0,
        "error": 0,
        "rejected": 3,
        "cancelled": 0,
        "timeout": 0,
    }
    assert _count(reader, "vyre.pipeline.cache.hits", **{"vyre.backend.id": "reference"}) == hits
    assert _points(reader, "vyre.dispatch.duration", **{"vyre.backend.id": "reference"}) == points
    ended = _dispatch_spans(spans)
    assert len(ended) == 3
    assert all(s.status.status_code is StatusCode.ERROR for s in ended)
    await backend.aclose()


async def test_a_span_end_that_fails_still_leaves_the_dispatch_counted(
    spans: InMemorySpanExporter, reader: InMemoryMetricReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    reported: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: reported.append(args.exc_value))

    def broken(*args: object) -> None:
        raise RuntimeError("a span processor's bug")

    monkeypatch.setattr(_spans, "_end_span", broken)
    before = _statuses(reader, "std.xor")
    points = _points(reader, "vyre.dispatch.duration", **{"vyre.backend.id": "reference"})
    backend = reference_backend()
    await backend.dispatch(XOR, INPUTS)
    assert _statuses(reader, "std.xor")["ok"] - before["ok"] == 1
    assert _points(reader, "vyre.dispatch.duration", **{"vyre.backend.id": "reference"}) == (
        points + 1
    )
    assert [str(e) for e in reported] == ["a span processor's bug"]
    await backend.aclose()


def test_prometheus_text_stays_valid_for_other_instruments() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View

    reader = InMemoryMetricReader()
    provider = MeterProvider(
        metric_readers=[reader],
        views=[View(instrument_name="spread", aggregation=ExponentialBucketHistogramAggregation())],
    )
    meter = provider.get_meter("other")
    meter.create_counter("requests", description='line one\nline "two" \\ three').add(
        1, {"2xx.code": "ok", "naïve": "é"}
    )
    meter.create_histogram("spread").record(1.5)
    text = prometheus_text(reader.get_metrics_data())
    assert '# HELP requests_total line one\\nline "two" \\\\ three' in text
    assert 'requests_total{_2xx_code="ok",na_ve="é"} 1' in text
    assert "# spread: a ExponentialHistogram metric, which this exposition does not render" in text
    assert "spread{" not in text and "spread " not in text.replace("# spread", "")
    for line in text.splitlines():
        if not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            assert name.isascii() and not name[0].isdigit(), line
    provider.shutdown()


def test_an_empty_histogram_is_typed_a_histogram() -> None:
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Histogram,
        Metric,
        MetricsData,
        ResourceMetrics,
        ScopeMetrics,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    empty = Metric(
        name="waits",
        description="",
        unit="s",
        data=Histogram(data_points=[], aggregation_temporality=AggregationTemporality.CUMULATIVE),
    )
    data = MetricsData(
        resource_metrics=[
            ResourceMetrics(
                resource=Resource.create({}),
                scope_metrics=[
                    ScopeMetrics(scope=InstrumentationScope("x"), metrics=[empty], schema_url="")
                ],
                schema_url="",
            )
        ]
    )
    assert prometheus_text(data) == "# HELP waits waits\n# TYPE waits histogram\n"


async def test_a_batch_the_backend_refuses_counts_every_item_rejected(
    spans: InMemorySpanExporter, reader: InMemoryMetricReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    program = elementwise_xor(64)
    backend = reference_backend()
    pipeline = backend.compile(program)
    await backend.dispatch(program, INPUTS)  # warm
    before = _statuses(reader, "std.xor")
    spans.clear()

    def refuse(*args: Any) -> None:
        raise BackendClosed("closed meanwhile", fix="open a new backend")

    monkeypatch.setattr(backend.executor, "enqueue_batch", refuse)
    with pytest.raises(BackendClosed):
        pipeline.dispatch_batch([INPUTS, INPUTS])
    after = _statuses(reader, "std.xor")
    assert (after["rejected"] - before["rejected"], after["error"] - before["error"]) == (2, 0)
    assert len(_dispatch_spans(spans)) == 2
    await backend.aclose()
