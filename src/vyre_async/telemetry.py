"""Every dispatch is an OpenTelemetry span; every outcome a metric. API only.

The library uses ``opentelemetry-api`` alone: with no SDK configured, spans are
non-recording and metric calls are no-ops (well under a microsecond each). The
application chooses the SDK and exporters (see `vyre_async.tracing` and
``docs/tracing.md``).

Span ``vyre.dispatch`` starts in the caller's current context (so it nests under
the request span, across ``await``) and ends when the result is ready. Its
children — ``vyre.compile``, ``vyre.upload``, ``vyre.launch``, ``vyre.wait``,
``vyre.readback`` — are created from the intervals the driver and backend
record, where they apply. Metrics are labelled by backend id and op id, never
by fingerprint (bounded cardinality).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace
from opentelemetry.trace import Span, Status, StatusCode

from vyre_async._version import __version__
from vyre_async.errors import DispatchTimeout
from vyre_async.ir.program import Program

if TYPE_CHECKING:
    from vyre_async.pending import PendingDispatch
    from vyre_async.pipeline import Launch

__all__ = [
    "PHASES",
    "SPAN_NAME",
    "finish_dispatch",
    "prometheus_text",
    "record_prefetch",
    "start_dispatch",
]

SPAN_NAME = "vyre.dispatch"
#: Child spans a dispatch may have, in the order they usually happen.
PHASES = ("vyre.compile", "vyre.wait", "vyre.upload", "vyre.launch", "vyre.readback")

_tracer = trace.get_tracer("vyre_async", __version__)
_meter = metrics.get_meter("vyre_async", __version__)
_dispatches = _meter.create_counter(
    "vyre.dispatch.count", unit="{dispatch}", description="Dispatches by outcome"
)
_latency = _meter.create_histogram(
    "vyre.dispatch.duration", unit="s", description="dispatch() to result ready, host clock"
)
_device = _meter.create_histogram(
    "vyre.dispatch.device_time", unit="s", description="Execution time measured by the backend"
)
_cache_hits = _meter.create_counter("vyre.pipeline.cache.hits", unit="{lookup}")
_cache_misses = _meter.create_counter("vyre.pipeline.cache.misses", unit="{lookup}")
_prefetch_hits = _meter.create_counter("vyre.prefetch.hits", unit="{prediction}")
_prefetch_misses = _meter.create_counter("vyre.prefetch.misses", unit="{prediction}")
_bytes_in = _meter.create_counter("vyre.bytes.in", unit="By", description="Input bytes")
_bytes_out = _meter.create_counter("vyre.bytes.out", unit="By", description="Output bytes")


def _labels(backend_id: str, program: Program) -> dict[str, str]:
    return {"vyre.backend.id": backend_id, "vyre.program.op_id": program.op_id or "unnamed"}


def start_dispatch(backend_id: str, program: Program) -> Span:
    """Start the ``vyre.dispatch`` span in the caller's current context."""
    span = _tracer.start_span(SPAN_NAME, record_exception=False, set_status_on_exception=False)
    if span.is_recording():
        span.set_attribute("vyre.backend.id", backend_id)
        if isinstance(program, Program):  # anything else fails validation right after
            span.set_attribute("vyre.program.op_id", program.op_id)
            span.set_attribute("vyre.program.fingerprint", program.fingerprint().hex())
    return span


def fail_before_launch(span: Span, error: BaseException, backend_id: str, program: Any) -> None:
    """End ``span`` for an error raised by ``dispatch()`` itself, before any launch."""
    if span.is_recording():
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.set_attribute("vyre.error.code", int(getattr(error, "code", 0)))
    span.end()
    op_id = getattr(program, "op_id", "") or "unnamed"
    _dispatches.add(
        1, {"vyre.backend.id": backend_id, "vyre.program.op_id": op_id, "vyre.status": "rejected"}
    )


def attach(span: Span, launch: Launch, *, cache_hit: bool) -> None:
    """Record the launch's attributes on ``span`` and end it when the dispatch settles."""
    pending = launch.pending
    plan = launch.plan
    program = plan.program
    backend_id = launch.pipeline.backend.id
    labels = _labels(backend_id, program)
    (_cache_hits if cache_hit else _cache_misses).add(1, labels)
    if span.is_recording():
        span.set_attribute("vyre.launch.grid", list(plan.geometry.grid))
        span.set_attribute("vyre.launch.workgroup", list(plan.geometry.workgroup))
        span.set_attribute("vyre.bytes.in", plan.bytes_in)
        span.set_attribute("vyre.bytes.out", plan.bytes_out)
        span.set_attribute("vyre.pipeline.cache_hit", cache_hit)
        if launch.config.label:
            span.set_attribute("vyre.label", launch.config.label)
    context = pending.context
    context["span"] = span
    context["labels"] = labels
    context["bytes"] = (plan.bytes_in, plan.bytes_out)
    context["await_cancelled"] = _await_cancelled
    pending.add_done_callback(finish_dispatch)


def _await_cancelled(pending: PendingDispatch) -> None:
    span: Span | None = pending.context.get("span")
    if span is None or pending.context.get("span_ended"):
        return
    pending.context["span_ended"] = True
    if span.is_recording():
        span.set_attribute("vyre.await.cancelled", True)
        span.set_status(
            Status(StatusCode.ERROR, "await cancelled; the dispatch keeps running on the backend")
        )
    span.end()
    _dispatches.add(1, {**pending.context["labels"], "vyre.status": "cancelled"})


def finish_dispatch(pending: PendingDispatch) -> None:
    """End the dispatch span with the outcome, timing, phases and backend attributes."""
    context = pending.context
    labels: dict[str, str] = context["labels"]
    timing = pending.timing
    error = pending._error
    status = (
        "ok" if error is None else ("timeout" if isinstance(error, DispatchTimeout) else "error")
    )
    if not context.get("span_ended"):
        context["span_ended"] = True
        _dispatches.add(1, {**labels, "vyre.status": status})
        _end_span(context["span"], pending, error)
    if timing is not None and timing.wall_s is not None:
        _latency.record(timing.wall_s, labels)
    if timing is not None and timing.device_s is not None:
        _device.record(timing.device_s, labels)
    if error is None:
        bytes_in, bytes_out = context["bytes"]
        _bytes_in.add(bytes_in, labels)
        _bytes_out.add(bytes_out, labels)


def _end_span(span: Span, pending: PendingDispatch, error: BaseException | None) -> None:
    if span.is_recording():
        parent = trace.set_span_in_context(span)
        for name, start_ns, end_ns in pending.context.get("phases", ()):
            child = _tracer.start_span(name, context=parent, start_time=start_ns)
            child.end(end_time=max(start_ns, end_ns))
        timing = pending.timing
        if timing is not None and timing.device_s is not None:
            span.set_attribute("vyre.device.time_s", timing.device_s)
        if timing is not None and timing.queue_s is not None:
            span.set_attribute("vyre.queue.time_s", timing.queue_s)
        for key, value in pending.context.get("attributes", {}).items():
            span.set_attribute(key, value)
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            span.set_attribute("vyre.error.code", int(getattr(error, "code", 0)))
    span.end()


def record_prefetch(backend_id: str, program: Program, hit: bool) -> None:
    """Count one shape-prediction outcome for ``program``."""
    (_prefetch_hits if hit else _prefetch_misses).add(1, _labels(backend_id, program))


# Prometheus text exposition ------------------------------------------------------


def _prom_name(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def _prom_labels(attributes: Mapping[str, Any], extra: Iterable[tuple[str, str]] = ()) -> str:
    items = [(_prom_name(k), str(v)) for k, v in sorted(attributes.items())] + list(extra)
    if not items:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in items) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def prometheus_text(metrics_data: Any) -> str:
    """Render OpenTelemetry SDK ``MetricsData`` in the Prometheus text exposition format.

    Pass what an SDK ``InMemoryMetricReader.get_metrics_data()`` (or any
    ``MetricReader``) returns. Sums become counters (``_total``) or gauges,
    histograms become ``_bucket``/``_sum``/``_count`` series.
    """
    lines: list[str] = []
    for resource_metrics in getattr(metrics_data, "resource_metrics", ()) or ():
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                lines += _prom_metric(metric)
    return "\n".join(lines) + ("\n" if lines else "")


def _prom_metric(metric: Any) -> list[str]:
    name = _prom_name(metric.name)
    data = metric.data
    points: Sequence[Any] = data.data_points
    out: list[str] = []
    if hasattr(data, "is_monotonic"):  # Sum
        counter = bool(data.is_monotonic)
        series = f"{name}_total" if counter else name
        out.append(f"# HELP {series} {metric.description or metric.name}")
        out.append(f"# TYPE {series} {'counter' if counter else 'gauge'}")
        for p in points:
            out.append(f"{series}{_prom_labels(p.attributes)} {p.value}")
    elif (
        hasattr(data, "aggregation_temporality") and points and hasattr(points[0], "bucket_counts")
    ):
        out.append(f"# HELP {name} {metric.description or metric.name}")
        out.append(f"# TYPE {name} histogram")
        for p in points:
            running = 0
            for bound, count in zip(
                (*p.explicit_bounds, float("inf")), p.bucket_counts, strict=True
            ):
                running += count
                le = "+Inf" if bound == float("inf") else repr(float(bound))
                out.append(f"{name}_bucket{_prom_labels(p.attributes, [('le', le)])} {running}")
            out.append(f"{name}_sum{_prom_labels(p.attributes)} {p.sum}")
            out.append(f"{name}_count{_prom_labels(p.attributes)} {p.count}")
    else:  # gauge
        out.append(f"# TYPE {name} gauge")
        for p in points:
            out.append(f"{name}{_prom_labels(p.attributes)} {p.value}")
    return out
