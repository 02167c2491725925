"""One vyre.dispatch span per dispatch, parented under the caller's span, with typed attributes."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tests.driver.fakes import DelayBackend
from vyre_async import (
    BackendClosed,
    DispatchConfig,
    DispatchTimeout,
    InvalidProgram,
    Launch,
    PendingDispatch,
    UnsupportedFeature,
)
from vyre_async.annotations import dispatch_attributes
from vyre_async.programs import elementwise_xor
from vyre_async.telemetry import SECONDS_BUCKETS, prometheus_text
from vyre_reference import ReferenceBackend

pytestmark = pytest.mark.anyio
tracer = trace.get_tracer("tests")
XOR = elementwise_xor(64)
INPUTS = [np.zeros(64, np.uint32), np.ones(64, np.uint32)]


@pytest.fixture
def backend() -> Iterator[DelayBackend]:
    b = DelayBackend(delay=0.0005)
    yield b
    b.close()


def _dispatch_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == "vyre.dispatch"]


async def test_1000_concurrent_dispatches_give_1000_correctly_parented_spans(
    spans: InMemorySpanExporter, backend: DelayBackend
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
    spans: InMemorySpanExporter, backend: DelayBackend
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


async def test_phases_become_child_spans(spans: InMemorySpanExporter) -> None:
    backend = DelayBackend(delay=0.002)
    try:
        await backend.dispatch(XOR, INPUTS)  # first dispatch compiles
    finally:
        backend.close()
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


async def test_errors_before_launch_end_the_span_with_error(
    spans: InMemorySpanExporter, backend: DelayBackend
) -> None:
    with pytest.raises(InvalidProgram):
        backend.dispatch(XOR, INPUTS[:1])
    (span,) = _dispatch_spans(spans)
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})["vyre.error.code"] == 1006
    assert [e.name for e in span.events] == ["exception"]


async def test_timeout_sets_error_status(spans: InMemorySpanExporter) -> None:
    backend = DelayBackend(delay=0.2)
    try:
        with pytest.raises(DispatchTimeout):
            await backend.dispatch(XOR, INPUTS, DispatchConfig(timeout=0.02))
    finally:
        backend.close()
    (span,) = _dispatch_spans(spans)
    assert span.status.status_code is StatusCode.ERROR
    assert "DispatchTimeout" in (span.status.description or "")
    assert (span.attributes or {})["vyre.error.code"] == 1009


async def test_cancelled_await_ends_the_span_clearly(spans: InMemorySpanExporter) -> None:
    backend = DelayBackend(delay=0.1)
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
        backend.close()


async def test_metrics_and_prometheus_text(
    spans: InMemorySpanExporter, reader: InMemoryMetricReader, backend: DelayBackend
) -> None:
    for _ in range(3):
        await backend.dispatch(XOR, INPUTS)
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
                        if point.attributes.get("vyre.backend.id") != "delay-test":
                            continue  # other tests' backends (metrics are per process)
                        uppers = (*point.explicit_bounds, float("inf"))
                        used = [u for u, c in zip(uppers, point.bucket_counts, strict=True) if c]
                        # dispatches of >= 0.5 ms land in a sub-millisecond-scale bucket
                        # (other tests' slow and timed-out dispatches fill later ones)
                        assert used and 5e-4 <= used[0] <= 2.5e-3, used
    text = prometheus_text(data)
    assert "# TYPE vyre_dispatch_count_total counter" in text
    assert (
        'vyre_dispatch_count_total{vyre_backend_id="delay-test",vyre_program_op_id="std.xor",vyre_status="ok"}'
        in text
    )
    assert "# TYPE vyre_dispatch_duration histogram" in text
    assert 'le="+Inf"' in text and "vyre_dispatch_duration_count{" in text


async def test_telemetry_can_be_switched_off(
    spans: InMemorySpanExporter, reader: InMemoryMetricReader, backend: DelayBackend
) -> None:
    from vyre_async import telemetry

    before = reader.get_metrics_data()
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
    assert before is not None


def test_dispatch_attributes_block_lands_on_the_spans_inside_it(
    spans: InMemorySpanExporter,
) -> None:
    backend = ReferenceBackend()  # 64-lane xor runs inline: its span ends inside dispatch()
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

    class Refusing(ReferenceBackend):
        def enqueue(self, launch: Launch) -> PendingDispatch:
            raise UnsupportedFeature("this device refuses every launch", fix="test double")

    backend = Refusing()
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
    backend = ReferenceBackend()
    await backend.aclose()
    with pytest.raises(BackendClosed):
        backend.dispatch(XOR, INPUTS)
    (span,) = _dispatch_spans(spans)
    assert span.end_time is not None and span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert span.attributes["vyre.error.code"] == int(BackendClosed.code)
