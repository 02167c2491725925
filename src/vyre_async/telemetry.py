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

import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import INVALID_SPAN_CONTEXT, NonRecordingSpan, Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from vyre_async._version import __version__
from vyre_async.errors import DispatchTimeout
from vyre_async.ir.program import Program

if TYPE_CHECKING:
    from vyre_async.pending import PendingDispatch
    from vyre_async.pipeline import Launch

__all__ = [
    "PHASES",
    "is_enabled",
    "set_enabled",
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


_COUNTERS = {
    "vyre.dispatch.count": ("{dispatch}", "Dispatches by outcome (vyre.status)"),
    "vyre.pipeline.cache.hits": ("{lookup}", "Pipeline cache hits"),
    "vyre.pipeline.cache.misses": ("{lookup}", "Pipeline cache misses"),
    "vyre.prefetch.hits": ("{prediction}", "Predicted dispatches whose pipeline was ready"),
    "vyre.prefetch.misses": ("{prediction}", "Predictions that missed or were not ready"),
    "vyre.bytes.in": ("By", "Input bytes of successful dispatches"),
    "vyre.bytes.out": ("By", "Output bytes of successful dispatches"),
}


class _Tallies:
    """Monotonic sums kept in-process and read by observable counters at collection time.

    Counting is a dict increment under an uncontended lock (well under a
    microsecond), instead of a synchronous SDK instrument call per counter.
    Series keys are tuples of ``(attribute, value)`` pairs built once per dispatch.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: dict[str, dict[tuple[tuple[str, str], ...], int]] = {
            name: {} for name in _COUNTERS
        }

    def add(self, name: str, key: tuple[tuple[str, str], ...], amount: int = 1) -> None:
        series = self._sums[name]
        with self._lock:
            series[key] = series.get(key, 0) + amount

    def add_many(self, entries: Iterable[tuple[str, tuple[tuple[str, str], ...], int]]) -> None:
        with self._lock:
            for name, key, amount in entries:
                series = self._sums[name]
                series[key] = series.get(key, 0) + amount

    def observe(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(_options: CallbackOptions) -> Iterable[Observation]:
            with self._lock:
                items = list(self._sums[name].items())
            return [Observation(value, dict(key)) for key, value in items]

        return callback


_tallies = _Tallies()
for _name, (_unit, _description) in _COUNTERS.items():
    _meter.create_observable_counter(
        _name, callbacks=[_tallies.observe(_name)], unit=_unit, description=_description
    )
_latency = _meter.create_histogram(
    "vyre.dispatch.duration", unit="s", description="dispatch() to result ready, host clock"
)
_device = _meter.create_histogram(
    "vyre.dispatch.device_time", unit="s", description="Execution time measured by the backend"
)


#: Returned by `start_dispatch` while telemetry is off; nothing is recorded for it.
_DISABLED: Span = NonRecordingSpan(INVALID_SPAN_CONTEXT)
_enabled = os.environ.get("VYRE_TELEMETRY", "on").strip().lower() not in ("0", "off", "false", "no")


def set_enabled(enabled: bool) -> None:
    """Turn vyre-async's spans and metrics on or off for this process.

    Off, dispatches create no span and record no metric at all (the starting
    value comes from ``VYRE_TELEMETRY=off``). With no SDK configured the cost is
    already tiny; this switch exists to measure that cost and for hot loops.
    """
    global _enabled
    _enabled = bool(enabled)


def is_enabled() -> bool:
    """Return True when dispatches are traced and metered."""
    return _enabled


def _labels(backend_id: str, program: Program) -> tuple[tuple[str, str], ...]:
    return (("vyre.backend.id", backend_id), ("vyre.program.op_id", program.op_id or "unnamed"))


def start_dispatch(backend_id: str, program: Program) -> Span:
    """Start the ``vyre.dispatch`` span in the caller's current context."""
    if not _enabled:
        return _DISABLED
    span = _tracer.start_span(SPAN_NAME, record_exception=False, set_status_on_exception=False)
    if span.is_recording():
        attributes: dict[str, AttributeValue] = {"vyre.backend.id": backend_id}
        if isinstance(program, Program):  # anything else fails validation right after
            attributes["vyre.program.op_id"] = program.op_id
            attributes["vyre.program.fingerprint"] = program.fingerprint().hex()
        span.set_attributes(attributes)
    return span


def fail_before_launch(span: Span, error: BaseException, backend_id: str, program: Any) -> None:
    """End ``span`` for an error raised by ``dispatch()`` itself, before any launch."""
    if span is _DISABLED:
        return
    if span.is_recording():
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.set_attribute("vyre.error.code", int(getattr(error, "code", 0)))
    span.end()
    op_id = getattr(program, "op_id", "") or "unnamed"
    labels = (("vyre.backend.id", backend_id), ("vyre.program.op_id", op_id))
    _tallies.add("vyre.dispatch.count", (*labels, ("vyre.status", "rejected")))


def attach(span: Span, launch: Launch, *, cache_hit: bool) -> None:
    """Record the launch's attributes on ``span`` and end it when the dispatch settles."""
    if span is _DISABLED:
        return
    pending = launch.pending
    plan = launch.plan
    program = plan.program
    labels = _labels(launch.pipeline.backend.id, program)
    if span.is_recording():
        attributes: dict[str, AttributeValue] = {
            "vyre.launch.grid": list(plan.geometry.grid),
            "vyre.launch.workgroup": list(plan.geometry.workgroup),
            "vyre.bytes.in": plan.bytes_in,
            "vyre.bytes.out": plan.bytes_out,
            "vyre.pipeline.cache_hit": cache_hit,
        }
        if launch.config.label:
            attributes["vyre.label"] = launch.config.label
        span.set_attributes(attributes)
    context = pending.context
    context["span"] = span
    context["labels"] = labels
    context["label_attrs"] = dict(labels)
    context["bytes"] = (plan.bytes_in, plan.bytes_out)
    context["await_cancelled"] = _await_cancelled
    pending.add_done_callback(finish_dispatch)


def _await_cancelled(pending: PendingDispatch) -> None:
    span: Span | None = pending.context.pop("span", None)  # atomic claim: end it once
    if span is None:
        return
    if span.is_recording():
        span.set_attribute("vyre.await.cancelled", True)
        span.set_status(
            Status(StatusCode.ERROR, "await cancelled; the dispatch keeps running on the backend")
        )
    span.end()
    _tallies.add("vyre.dispatch.count", (*pending.context["labels"], ("vyre.status", "cancelled")))


def finish_dispatch(pending: PendingDispatch) -> None:
    """End the dispatch span with the outcome, timing, phases and backend attributes."""
    context = pending.context
    labels: tuple[tuple[str, str], ...] = context["labels"]
    timing = pending.timing
    error = pending._error
    status = (
        "ok" if error is None else ("timeout" if isinstance(error, DispatchTimeout) else "error")
    )
    cache = "vyre.pipeline.cache.hits" if context["cache_hit"] else "vyre.pipeline.cache.misses"
    counts = [(cache, labels, 1)]
    span: Span | None = context.pop("span", None)  # atomic claim: end it once
    if span is not None:
        counts.append(("vyre.dispatch.count", (*labels, ("vyre.status", status)), 1))
        _end_span(span, pending, error)
    if error is None:
        bytes_in, bytes_out = context["bytes"]
        counts += [("vyre.bytes.in", labels, bytes_in), ("vyre.bytes.out", labels, bytes_out)]
    _tallies.add_many(counts)
    if timing is not None and timing.wall_s is not None:
        _latency.record(timing.wall_s, context["label_attrs"])
    if timing is not None and timing.device_s is not None:
        _device.record(timing.device_s, context["label_attrs"])


def _end_span(span: Span, pending: PendingDispatch, error: BaseException | None) -> None:
    if span.is_recording():
        parent = trace.set_span_in_context(span)
        for name, start_ns, end_ns in pending.context.get("phases", ()):
            child = _tracer.start_span(name, context=parent, start_time=start_ns)
            child.end(end_time=max(start_ns, end_ns))
        timing = pending.timing
        final: dict[str, AttributeValue] = dict(pending.context.get("attributes", {}))
        if timing is not None and timing.device_s is not None:
            final["vyre.device.time_s"] = timing.device_s
        if timing is not None and timing.queue_s is not None:
            final["vyre.queue.time_s"] = timing.queue_s
        span.set_attributes(final)
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            span.set_attribute("vyre.error.code", int(getattr(error, "code", 0)))
    span.end()


def record_prefetch(backend_id: str, program: Program, hit: bool) -> None:
    """Count one shape-prediction outcome for ``program``."""
    _tallies.add(
        "vyre.prefetch.hits" if hit else "vyre.prefetch.misses", _labels(backend_id, program)
    )


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
