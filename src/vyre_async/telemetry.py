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
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import opentelemetry.metrics._internal as _metrics_api
import opentelemetry.trace as _trace_api
from opentelemetry import metrics, trace
from opentelemetry.context import Context, get_current
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from vyre_async._version import __version__
from vyre_async.errors import DispatchTimeout
from vyre_async.ir.program import Program

if TYPE_CHECKING:
    from vyre_async.config import DispatchConfig
    from vyre_async.pending import DispatchRecord, PendingDispatch
    from vyre_async.plan import BindingPlan

__all__ = [
    "DispatchTrace",
    "PHASES",
    "SECONDS_BUCKETS",
    "is_enabled",
    "is_recording",
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
#: Histogram bucket bounds in seconds, 10 µs to 10 s (the SDK default suits milliseconds).
SECONDS_BUCKETS = (
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
    2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
_latency = _meter.create_histogram(
    "vyre.dispatch.duration",
    unit="s",
    description="dispatch() to result ready, host clock",
    explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
)
_device = _meter.create_histogram(
    "vyre.dispatch.device_time",
    unit="s",
    description="Execution time measured by the backend",
    explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
)


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


# The API's stand-ins until an application installs an SDK (set once, never unset).
_INERT_TRACER_PROVIDERS = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
_INERT_METER_PROVIDERS: tuple[type, ...] = (
    metrics.NoOpMeterProvider,
    type(getattr(_metrics_api, "_PROXY_METER_PROVIDER", metrics.NoOpMeterProvider())),
)
_tracing = False
_metering = False
_UNKNOWN = object()
#: The API's provider objects when `_sdk_installed` last looked.
_seen: tuple[object, object] = (_UNKNOWN, _UNKNOWN)


def _installed(module: Any, name: str, public: Callable[[], Any], inert: tuple[type, ...]) -> bool:
    # The API's global, read directly: the public getter also consults os.environ
    # on every call (~1 µs). Providers named by OTEL_PYTHON_*_PROVIDER were loaded
    # into it when this module called get_tracer/get_meter at import.
    provider = getattr(module, name, _UNKNOWN)
    if provider is _UNKNOWN:  # the API's internals moved: ask the public way
        provider = public()
    return provider is not None and not isinstance(provider, inert)


def is_recording() -> bool:
    """Return True when dispatches are traced or metered: enabled and an SDK installed."""
    return _enabled and any(_sdk_installed())


def _sdk_installed() -> tuple[bool, bool]:
    """Return whether an SDK tracer provider / meter provider is installed.

    Until one is, the API drops every span and measurement, so a dispatch skips
    all telemetry work (what keeps the no-SDK cost near zero). An SDK provider
    cannot be uninstalled, so a True answer is kept; until then the answer is
    recomputed only when the API's provider objects change.
    """
    global _tracing, _metering, _seen
    if _tracing and _metering:
        return True, True
    tracer_provider = getattr(_trace_api, "_TRACER_PROVIDER", _UNKNOWN)
    meter_provider = getattr(_metrics_api, "_METER_PROVIDER", _UNKNOWN)
    seen = _seen
    if (
        tracer_provider is seen[0]
        and meter_provider is seen[1]
        and tracer_provider is not _UNKNOWN
        and meter_provider is not _UNKNOWN
    ):
        return _tracing, _metering
    if not _tracing:
        _tracing = _installed(
            _trace_api, "_TRACER_PROVIDER", trace.get_tracer_provider, _INERT_TRACER_PROVIDERS
        )
    if not _metering:
        _metering = _installed(
            _metrics_api, "_METER_PROVIDER", metrics.get_meter_provider, _INERT_METER_PROVIDERS
        )
    _seen = (tracer_provider, meter_provider)
    return _tracing, _metering


class DispatchTrace:
    """Where and when a dispatch started: the caller's context and the start time.

    `start_dispatch` returns one instead of opening the SDK span at once. The
    span is created when its attributes are all known (at `attach`, or in
    `fail_before_launch`), in this captured context and with this start time,
    so the trace is the same as if it had been opened at ``dispatch()`` — but
    the SDK cleans and stores the attributes in one pass instead of three.
    ``traced`` is False when only metrics are recorded (no SDK tracer provider).
    """

    __slots__ = ("parent", "record", "start_ns", "traced")

    def __init__(self, traced: bool) -> None:
        self.traced = traced
        self.parent: Context | None = get_current() if traced else None
        self.start_ns = time.time_ns()
        #: The dispatch's record once `attach` ran (holds its span and claim).
        self.record: DispatchRecord | None = None


class _Facts:
    """What telemetry keeps of a dispatch for its metrics: labels and byte counts."""

    __slots__ = ("bytes_in", "bytes_out", "label_attrs", "labels")

    def __init__(self, labels: tuple[tuple[str, str], ...], bytes_in: int, bytes_out: int) -> None:
        self.labels = labels
        self.label_attrs = dict(labels)
        self.bytes_in = bytes_in
        self.bytes_out = bytes_out


def start_dispatch() -> DispatchTrace | None:
    """Note the start of a dispatch in the caller's current context.

    Returns None when nothing would be recorded: telemetry switched off, or no
    OpenTelemetry SDK installed for traces or metrics. The span itself opens in
    `attach` (or `fail_before_launch`), when its attributes are known.
    """
    if not _enabled:
        return None
    tracing, metering = _sdk_installed()
    if not (tracing or metering):
        return None
    return DispatchTrace(tracing)


def _program_attributes(backend_id: str, program: Any) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {"vyre.backend.id": backend_id}
    if isinstance(program, Program):  # anything else failed validation
        attributes["vyre.program.op_id"] = program.op_id
        fingerprint = program.memo.get("telemetry.fingerprint")
        if fingerprint is None:
            fingerprint = program.memo["telemetry.fingerprint"] = program.fingerprint().hex()
        attributes["vyre.program.fingerprint"] = fingerprint
    return attributes


def _open(started: DispatchTrace, attributes: dict[str, AttributeValue]) -> Span:
    return _tracer.start_span(
        SPAN_NAME,
        context=started.parent,
        attributes=attributes,
        start_time=started.start_ns,
        record_exception=False,
        set_status_on_exception=False,
    )


def fail_before_launch(
    started: DispatchTrace | None, error: BaseException, backend_id: str, program: Any
) -> None:
    """Record a dispatch that ``dispatch()`` itself rejected, before any launch."""
    if started is None:
        return
    record = started.record
    span = None
    if record is not None:
        with _claim_lock:
            if not record.claimed:
                return  # the dispatch already settled and was counted (its span ended)
            record.claimed = False
            span, record.span = record.span, None
    if started.traced:
        if span is None:  # raised before attach: open the span now
            span = _open(started, _program_attributes(backend_id, program))
        span.set_attribute("vyre.error.code", int(getattr(error, "code", 0)))
        if span.is_recording():
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.end()
    op_id = getattr(program, "op_id", "") or "unnamed"
    labels = (("vyre.backend.id", backend_id), ("vyre.program.op_id", op_id))
    _tallies.add("vyre.dispatch.count", (*labels, ("vyre.status", "rejected")))


#: Guards the once-only claim of a dispatch's outcome (finish, cancelled await, rejection).
_claim_lock = threading.Lock()


def attach(
    started: DispatchTrace | None,
    pending: PendingDispatch,
    plan: BindingPlan,
    config: DispatchConfig,
    backend_id: str,
) -> None:
    """Open the dispatch span with the launch's attributes; end it when the dispatch settles."""
    if started is None:
        return
    program = plan.program
    record = pending.record
    extra = record.attributes  # arm-scheduler / batch verdicts, known by now
    if started.traced:
        attributes = _program_attributes(backend_id, program)
        attributes["vyre.launch.grid"] = plan.geometry.grid
        attributes["vyre.launch.workgroup"] = plan.geometry.workgroup
        attributes["vyre.bytes.in"] = plan.bytes_in
        attributes["vyre.bytes.out"] = plan.bytes_out
        attributes["vyre.pipeline.cache_hit"] = record.cache_hit
        if config.label:
            attributes["vyre.label"] = config.label
        if config.profile:
            attributes["vyre.profile"] = config.profile
        if extra:
            attributes.update(extra)
            record.sent = dict(extra)
        record.span = _open(started, attributes)
    record.claimed = True  # claimed once: by finish, await-cancelled or fail_before_launch
    started.record = record
    record.trace = _Facts(_labels(backend_id, program), plan.bytes_in, plan.bytes_out)
    record.on_await_cancelled = _await_cancelled
    pending.add_done_callback(finish_dispatch)


def _claim(record: DispatchRecord) -> tuple[bool, Span | None]:
    with _claim_lock:
        if not record.claimed:
            return False, None
        record.claimed = False
        span, record.span = record.span, None
        return True, span


def _await_cancelled(pending: PendingDispatch) -> None:
    record = pending.record
    claimed, span = _claim(record)
    if not claimed:  # finish ran first
        return
    if span is not None:
        if span.is_recording():
            span.set_attribute("vyre.await.cancelled", True)
            span.set_status(
                Status(
                    StatusCode.ERROR, "await cancelled; the dispatch keeps running on the backend"
                )
            )
        span.end()
    _tallies.add("vyre.dispatch.count", (*record.trace.labels, ("vyre.status", "cancelled")))


def finish_dispatch(pending: PendingDispatch) -> None:
    """End the dispatch span with the outcome, timing, phases and backend attributes."""
    record = pending.record
    facts: _Facts = record.trace
    labels = facts.labels
    timing = pending.timing
    error = pending.exception()
    status = (
        "ok" if error is None else ("timeout" if isinstance(error, DispatchTimeout) else "error")
    )
    cache = "vyre.pipeline.cache.hits" if record.cache_hit else "vyre.pipeline.cache.misses"
    counts = [(cache, labels, 1)]
    claimed, span = _claim(record)
    if claimed:  # not counted as cancelled
        counts.append(("vyre.dispatch.count", (*labels, ("vyre.status", status)), 1))
        if span is not None:
            _end_span(span, pending, error)
    if error is None:
        counts += [
            ("vyre.bytes.in", labels, facts.bytes_in),
            ("vyre.bytes.out", labels, facts.bytes_out),
        ]
    _tallies.add_many(counts)
    if timing is not None and timing.wall_s is not None:
        _latency.record(timing.wall_s, facts.label_attrs)
    if timing is not None and timing.device_s is not None:
        _device.record(timing.device_s, facts.label_attrs)


def _end_span(span: Span, pending: PendingDispatch, error: BaseException | None) -> None:
    if span.is_recording():
        record = pending.record
        phases = record.phases
        if phases:
            parent = trace.set_span_in_context(span)
            for name, start_ns, end_ns in phases:
                child = _tracer.start_span(name, context=parent, start_time=start_ns)
                child.end(end_time=max(start_ns, end_ns))
        timing = pending.timing
        final: dict[str, AttributeValue] = {}
        later = record.attributes
        if later:  # set since attach (prefetch outcome, backend annotations)
            sent = record.sent or {}
            final = {k: v for k, v in later.items() if k not in sent or sent[k] != v}
        if timing is not None and timing.device_s is not None:
            final["vyre.device.time_s"] = timing.device_s
        if timing is not None and timing.queue_s is not None:
            final["vyre.queue.time_s"] = timing.queue_s
        if error is not None:
            final["vyre.error.code"] = int(getattr(error, "code", 0))
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        if final:
            span.set_attributes(final)
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
