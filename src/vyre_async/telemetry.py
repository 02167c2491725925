"""Every dispatch is an OpenTelemetry span; every outcome a metric. API only.

The library uses ``opentelemetry-api`` alone: with no SDK configured, spans are
non-recording and metric calls are no-ops, and a dispatch skips this module
after one check. The application chooses the SDK and exporters (see
`vyre_async.tracing` and ``docs/tracing.md``).

By default a dispatch is ONE span, ``vyre.dispatch``: opened in the caller's
context with the time of ``dispatch()`` and every attribute known at launch
(built once per launch shape), and ended when the result is ready with the
phase durations (``vyre.phase.compile_s``, ``wait_s``, ``upload_s``,
``launch_s``, ``readback_s``), the device and queue times and what the backend
annotated since, in one call. With the tracing detail ``"phases"``
(``VYRE_TRACE_DETAIL=phases``, `set_trace_detail`, or
``configure_tracing(detail="phases")``) the phases are also child spans
``vyre.compile``, ``vyre.wait``, ``vyre.upload``, ``vyre.launch``,
``vyre.readback``. A span the sampler drops costs at most the SDK's unsampled
span: no attributes are built, no phases recorded, no end-time calls; one the
installed sampler is known to drop (`_sampler_drops`) is not made at all.
Metrics are labelled by backend id and op id, never by fingerprint (bounded
cardinality); counts and bytes are tallied in-process and read by observable
counters at collection, the two histograms get one point each per dispatch with
attribute sets built once per launch shape.

``opentelemetry-api`` itself is imported on first need, not with vyre-async: an
SDK can only be installed by code that imports ``opentelemetry`` first, so until
``opentelemetry.trace`` or ``opentelemetry.metrics`` is in ``sys.modules`` (or
``OTEL_PYTHON_TRACER_PROVIDER``/``OTEL_PYTHON_METER_PROVIDER`` names a provider)
no dispatch can be recorded, and a process that never traces never pays the
import for its dispatches (`_load_api`). The arm graph (`vyre_async.graph`) and
the ``ray`` backend still import the API when they load.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from vyre_async._exports import public_dir as _public_dir
from vyre_async._version import __version__
from vyre_async.errors import DispatchTimeout, InvalidArgument, InvalidProgram
from vyre_async.ir.program import Program

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.trace import Span
    from opentelemetry.util.types import AttributeValue

    from vyre_async._pending import DispatchRecord, PendingDispatch

__all__ = [
    "DispatchAttribute",
    "current_dispatch_attributes",
    "dispatch_attributes",
    "DispatchTrace",
    "PHASES",
    "PHASE_ATTRIBUTES",
    "SECONDS_BUCKETS",
    "SWITCH_OFF",
    "SWITCH_ON",
    "TRACE_DETAILS",
    "is_enabled",
    "is_recording",
    "set_enabled",
    "set_trace_detail",
    "SPAN_NAME",
    "finish_dispatch",
    "prometheus_text",
    "record_prefetch",
    "start_dispatch",
    "trace_detail",
]
__dir__ = _public_dir(__name__)

# Attributes for the dispatches issued in a context (arm scheduler, batches) ------
# Code that dispatches on a user's behalf knows *why* a dispatch runs the way it
# does (its layer, the policy verdict) before the executor is called, while the
# ``vyre.dispatch`` span may already have ended when ``dispatch()`` returns (a CPU
# backend can run tiny work inline). So the reasons travel in a context variable
# (it follows the task, on asyncio and trio alike): every dispatch issued inside
# ``with dispatch_attributes({...}):`` starts with them, and they land on its
# span when it ends, next to what the executor adds through
# ``DispatchCompleter.annotate``.

#: A value of a dispatch attribute.
DispatchAttribute = str | bool | int | float

_current: ContextVar[Mapping[str, DispatchAttribute] | None] = ContextVar(
    "vyre_async_dispatch_attributes", default=None
)


@contextmanager
def dispatch_attributes(attributes: Mapping[str, DispatchAttribute]) -> Iterator[None]:
    """Add ``attributes`` to the span of every dispatch issued inside the block.

    Blocks nest: inner attributes are merged over outer ones.

    Args:
        attributes: ``vyre.*`` keys with str, bool, int or float values.

    Raises:
        ValueError: a key does not start with ``vyre.`` or a value has another type.
    """
    for key, value in attributes.items():
        if not isinstance(key, str) or not key.startswith("vyre."):
            raise ValueError(
                f"span attribute key {key!r} must start with 'vyre.'\n"
                "Fix: name driver attributes vyre.<area>.<name>"
            )
        if not isinstance(value, str | bool | int | float):
            raise ValueError(
                f"span attribute {key!r} has a {type(value).__name__} value\n"
                "Fix: pass a str, bool, int or float"
            )
    outer = _current.get()
    token = _current.set({**outer, **attributes} if outer else dict(attributes))
    try:
        yield
    finally:
        _current.reset(token)


def current_dispatch_attributes() -> Mapping[str, DispatchAttribute] | None:
    """Return the attributes set by the innermost `dispatch_attributes` block, or None."""
    return _current.get()


SPAN_NAME = "vyre.dispatch"
#: Phases of a dispatch, in the order they usually happen (child span names with the
#: ``"phases"`` detail).
PHASES = ("vyre.compile", "vyre.wait", "vyre.upload", "vyre.launch", "vyre.readback")
#: The span attribute that carries each phase's duration in seconds.
PHASE_ATTRIBUTES = {name: f"vyre.phase.{name.removeprefix('vyre.')}_s" for name in PHASES}
#: Tracing details: ``"span"`` (one span per dispatch, phases as attributes; the
#: default) and ``"phases"`` (the phases also as child spans).
TRACE_DETAILS = ("span", "phases")

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
        from opentelemetry.metrics import Observation

        def callback(_options: CallbackOptions) -> Iterable[Observation]:
            with self._lock:
                items = list(self._sums[name].items())
            return [Observation(value, dict(key)) for key, value in items]

        return callback


_tallies = _Tallies()
#: Histogram bucket bounds in seconds, 10 µs to 10 s (the SDK default suits milliseconds).
SECONDS_BUCKETS = (
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
    2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

# The OpenTelemetry API and vyre's tracer, meter and instruments: None until
# `_load_api` (see the module docstring).
trace: Any = None
metrics: Any = None
_trace_api: Any = None
_metrics_api: Any = None
get_current: Any = None
Status: Any = None
StatusCode: Any = None
_tracer: Any = None
_meter: Any = None
_latency: Any = None
_device: Any = None
_INERT_TRACER_PROVIDERS: tuple[type, ...] = ()
_INERT_METER_PROVIDERS: tuple[type, ...] = ()
_api_loaded = False
_api_lock = threading.Lock()
#: Providers named in the environment are loaded by the API without the
#: application importing it: then the API is loaded at import, as it always was.
_PROVIDERS_FROM_ENV = bool(
    os.environ.get("OTEL_PYTHON_TRACER_PROVIDER") or os.environ.get("OTEL_PYTHON_METER_PROVIDER")
)


def _api_in_use() -> bool:
    """True once anything imported the API's trace or metrics module (or the env names one)."""
    modules = sys.modules
    return (
        "opentelemetry.trace" in modules
        or "opentelemetry.metrics" in modules
        or _PROVIDERS_FROM_ENV
    )


def _load_api() -> None:
    """Import the OpenTelemetry API and make vyre's tracer, meter and instruments (once)."""
    global trace, metrics, _trace_api, _metrics_api, get_current, Status, StatusCode
    global _tracer, _meter, _latency, _device, _INERT_TRACER_PROVIDERS, _INERT_METER_PROVIDERS
    global _api_loaded
    with _api_lock:
        if _api_loaded:
            return
        import opentelemetry.metrics as metrics_module
        import opentelemetry.metrics._internal as metrics_internal
        import opentelemetry.trace as trace_module
        from opentelemetry.context import get_current as current

        tracer = trace_module.get_tracer("vyre_async", __version__)
        meter = metrics_module.get_meter("vyre_async", __version__)
        for name, (unit, description) in _COUNTERS.items():
            meter.create_observable_counter(
                name, callbacks=[_tallies.observe(name)], unit=unit, description=description
            )
        latency = meter.create_histogram(
            "vyre.dispatch.duration",
            unit="s",
            description="dispatch() to result ready, host clock",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )
        device = meter.create_histogram(
            "vyre.dispatch.device_time",
            unit="s",
            description="Execution time measured by the backend",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )
        # The API's stand-ins until an application installs an SDK (set once, never unset).
        _INERT_TRACER_PROVIDERS = (
            trace_module.ProxyTracerProvider,
            trace_module.NoOpTracerProvider,
        )
        _INERT_METER_PROVIDERS = (
            metrics_module.NoOpMeterProvider,
            type(
                getattr(
                    metrics_internal, "_PROXY_METER_PROVIDER", metrics_module.NoOpMeterProvider()
                )
            ),
        )
        trace, metrics = trace_module, metrics_module
        _trace_api, _metrics_api = trace_module, metrics_internal
        get_current = current
        Status, StatusCode = trace_module.Status, trace_module.StatusCode
        _tracer, _meter, _latency, _device = tracer, meter, latency, device
        _api_loaded = True


if _PROVIDERS_FROM_ENV:
    _load_api()


#: The values of ``VYRE_TELEMETRY`` (case-insensitive) that turn telemetry on, and off.
SWITCH_ON = ("1", "on", "true", "yes")
SWITCH_OFF = ("0", "off", "false", "no")


def _switch_from_environment() -> bool:
    raw = os.environ.get("VYRE_TELEMETRY", "on").strip().lower() or "on"
    if raw in SWITCH_ON:
        return True
    if raw in SWITCH_OFF:
        return False
    _bad_setting(
        f"VYRE_TELEMETRY={raw!r} is neither on ({', '.join(SWITCH_ON)}) nor off "
        f"({', '.join(SWITCH_OFF)}); telemetry stays on.\nFix: set VYRE_TELEMETRY=off or on"
    )
    return True


def _bad_setting(message: str) -> None:
    """Report a bad environment variable read at import, which then keeps its default.

    Logged, not warned: an application's import must never fail over a variable,
    and a warning would under ``-W error``.
    """
    import logging

    logging.getLogger("vyre_async.telemetry").warning("%s", message)


_enabled = _switch_from_environment()


def set_enabled(enabled: bool) -> None:
    """Turn vyre-async's spans and metrics on or off for this process.

    Off, dispatches create no span and record no metric at all (the starting
    value comes from ``VYRE_TELEMETRY``: ``off``, ``0``, ``false`` or ``no``
    turn it off; ``on``, ``1``, ``true``, ``yes`` or unset keep it on; anything
    else warns and keeps it on). With no SDK configured the cost is already
    tiny; this switch exists to measure that cost and for hot loops.

    Raises:
        InvalidArgument: ``enabled`` is not a bool (``"off"`` would read as True).
    """
    global _enabled
    if not isinstance(enabled, bool):
        raise InvalidArgument(
            f"set_enabled takes True or False, got {enabled!r}",
            fix="pass set_enabled(False) to turn telemetry off",
        )
    _enabled = enabled


def is_enabled() -> bool:
    """Return True when dispatches are traced and metered."""
    return _enabled


#: Metric labels per (backend id, op id), built once each (op ids are few by design).
_LABELS: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {}


def _labels(backend_id: str, program: Program) -> tuple[tuple[str, str], ...]:
    op_id = program.op_id or "unnamed"
    labels = _LABELS.get((backend_id, op_id))
    if labels is None:
        if len(_LABELS) >= 4096:  # a program per request, say: do not grow without end
            _LABELS.clear()
        labels = _LABELS[backend_id, op_id] = (
            ("vyre.backend.id", backend_id),
            ("vyre.program.op_id", op_id),
        )
    return labels


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
    if not _api_loaded:
        if not _api_in_use():  # nobody imported the API: no SDK can be installed
            return False, False
        _load_api()
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


def _detail_from(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(
            f"the tracing detail is a str, got {value!r}",
            fix="pass detail='span' or detail='phases'",
        )
    detail = value.strip().lower() or "span"
    if detail not in TRACE_DETAILS:
        raise InvalidArgument(
            f"unknown tracing detail {value!r}; choose one of {', '.join(TRACE_DETAILS)}",
            fix="set VYRE_TRACE_DETAIL (or pass detail=) to 'span' or 'phases'",
        )
    return detail


try:
    _detail = _detail_from(os.environ.get("VYRE_TRACE_DETAIL", ""))
except InvalidProgram as _exc:
    _bad_setting(str(_exc))
    _detail = "span"


def set_trace_detail(detail: str) -> None:
    """Choose how much of a dispatch a recorded trace shows, for this process.

    ``"span"`` (the default): one ``vyre.dispatch`` span per dispatch, its
    phases as ``vyre.phase.<name>_s`` attributes. ``"phases"``: the phases are
    also child spans (``vyre.compile``, ``vyre.wait``, ``vyre.upload``,
    ``vyre.launch``, ``vyre.readback``), for a close look in Jaeger; each
    costs the SDK a span. The starting value comes from ``VYRE_TRACE_DETAIL``.

    Raises:
        InvalidArgument: ``detail`` is not one of `TRACE_DETAILS`.
    """
    global _detail
    _detail = _detail_from(detail)


def trace_detail() -> str:
    """Return the tracing detail in force: ``"span"`` or ``"phases"``."""
    return _detail


class DispatchTrace:
    """Where and when a dispatch started: the caller's context and the start time.

    `start_dispatch` returns one instead of opening the SDK span at once. The
    span opens in `attach`, with the launch's attributes, in this captured
    context and with this start time, so the trace is the same as if it had
    been opened at ``dispatch()``. ``traced``: an SDK tracer provider is
    installed; ``metered``: an SDK meter provider is.
    """

    __slots__ = ("metered", "parent", "record", "start_ns", "traced")

    def __init__(self, traced: bool, metered: bool = True, parent: Context | None = None) -> None:
        self.traced = traced
        self.metered = metered
        if (traced or metered) and not _api_loaded:
            _load_api()  # (made by hand, before any dispatch looked for an SDK)
        if traced and parent is None:
            parent = get_current()
        #: The caller's context (None when not traced).
        self.parent: Context | None = parent if traced else None
        self.start_ns = time.time_ns()
        #: The dispatch's record once `attach` ran (holds its span and claim).
        self.record: DispatchRecord | None = None


_Tally = tuple[str, tuple[tuple[str, str], ...], int]


class _ShapeFacts:
    """What telemetry needs of one launch shape, built once (`LaunchTemplate.telemetry`).

    The span's launch attributes (one mapping per ``cache_hit`` value, never
    mutated: the SDK copies them), the metric labels as a tally key and as an
    attribute set, the byte counts, and the tally entries of a successful
    dispatch.
    """

    __slots__ = ("backend_id", "bytes_in", "bytes_out", "label_attrs", "labels", "ok", "span")

    def __init__(self, template: Any, backend_id: str) -> None:
        plan, config = template.plan, template.config
        program = plan.program
        self.backend_id = backend_id
        self.labels = _labels(backend_id, program)
        self.label_attrs: Mapping[str, str] = dict(self.labels)
        self.bytes_in = plan.bytes_in
        self.bytes_out = plan.bytes_out
        attributes = _program_attributes(backend_id, program)
        attributes["vyre.launch.grid"] = plan.geometry.grid
        attributes["vyre.launch.workgroup"] = plan.geometry.workgroup
        attributes["vyre.bytes.in"] = plan.bytes_in
        attributes["vyre.bytes.out"] = plan.bytes_out
        if config.label:
            attributes["vyre.label"] = config.label
        if config.profile:
            attributes["vyre.profile"] = config.profile
        #: Indexed by ``cache_hit``.
        self.span: tuple[Mapping[str, AttributeValue], ...] = tuple(
            {**attributes, "vyre.pipeline.cache_hit": hit} for hit in (False, True)
        )
        labels = self.labels
        done = (*labels, ("vyre.status", "ok"))
        #: The tallies of a successful, uncancelled dispatch, by ``(cache_hit, prefetch
        #: hit)`` (None: the prediction was not scored).
        self.ok: dict[tuple[bool, bool | None], tuple[_Tally, ...]] = {}
        for hit in (False, True):
            common: tuple[_Tally, ...] = (
                ("vyre.pipeline.cache.hits" if hit else "vyre.pipeline.cache.misses", labels, 1),
                ("vyre.dispatch.count", done, 1),
                ("vyre.bytes.in", labels, self.bytes_in),
                ("vyre.bytes.out", labels, self.bytes_out),
            )
            self.ok[hit, None] = common
            self.ok[hit, True] = (*common, ("vyre.prefetch.hits", labels, 1))
            self.ok[hit, False] = (*common, ("vyre.prefetch.misses", labels, 1))


def start_dispatch() -> DispatchTrace | None:
    """Note the start of a dispatch in the caller's current context.

    Returns None when nothing would be recorded: telemetry switched off, no
    OpenTelemetry SDK installed for traces or metrics, or no meter provider and
    a span the installed sampler is known to drop (`_sampler_drops`). The span
    itself opens in `attach` (or `fail_before_launch`), when its attributes are
    known.
    """
    if not _enabled:
        return None
    tracing, metering = _sdk_installed()
    parent = None
    if tracing:
        parent = get_current()
        if _sampler_drops(parent):
            tracing = False
    if not (tracing or metering):
        return None
    return DispatchTrace(tracing, metering, parent)


# What the installed sampler decides without being asked --------------------------
#: The sampler `_sampler_verdict` last classified, and its verdict.
_verdict: tuple[object, str] = (_UNKNOWN, "ask")


def _drops_every_span(sampler: object, sampling: Any) -> bool:
    """True for exactly the SDK's ``ALWAYS_OFF`` (a `StaticSampler` that drops)."""
    return type(sampler) is sampling.StaticSampler and (
        sampler.get_description() == "AlwaysOffSampler"  # type: ignore[attr-defined]
    )


def _sampler_verdict() -> str:
    """Return ``"never"``, ``"parent"`` or ``"ask"`` for the sampler of vyre's tracer.

    ``"never"``: it is the SDK's ``ALWAYS_OFF``. ``"parent"``: it is the SDK's
    own ``ParentBased`` (not a subclass) whose delegates for not-sampled
    parents, remote and local, are ``ALWAYS_OFF``: a span under a parent that
    is not sampled is dropped. ``"ask"``: anything else, custom samplers and
    subclasses included (the SDK decides each span). Classified once per
    sampler; a sampler whose parts cannot be read is asked.
    """
    global _verdict
    # The sampler of the SDK tracer vyre's spans come from (None: not known yet). An
    # SDK tracer keeps the sampler its provider had when the tracer was made, so it
    # is the tracer's own, not ``provider.sampler``. ``_tracer`` is the API's proxy
    # until an SDK is installed; the proxy finds the SDK tracer at its first span.
    real = getattr(_tracer, "_real_tracer", None) or _tracer
    sampler = getattr(real, "sampler", None)
    if sampler is _verdict[0]:
        return _verdict[1]
    verdict = "ask"
    sampling = sys.modules.get("opentelemetry.sdk.trace.sampling")
    if sampler is not None and sampling is not None:
        if _drops_every_span(sampler, sampling):
            verdict = "never"
        elif type(sampler) is getattr(sampling, "ParentBased", None) and all(
            _drops_every_span(getattr(sampler, part, None), sampling)
            for part in ("_remote_parent_not_sampled", "_local_parent_not_sampled")
        ):
            verdict = "parent"
    _verdict = (sampler, verdict)
    return verdict


def _sampler_drops(parent: Context | None = None) -> bool:
    """True when the installed sampler would drop a dispatch span started in ``parent``.

    ``parent``: the caller's context (None: the current one).

    The span is then not made at all (the SDK's own unsampled span costs more
    than the rest of a dropped dispatch's telemetry): the sampler drops every
    span, or it follows the parent and the caller's current span is a valid one
    that is not sampled — the decisions the SDK's own ``ALWAYS_OFF`` and
    ``ParentBased`` samplers make (`_sampler_verdict`). Any other sampler is
    asked by the SDK, span by span.
    """
    verdict = _sampler_verdict()
    if verdict == "ask":
        return False
    if verdict == "never":
        return True
    span = trace.get_current_span(parent).get_span_context()
    return span.is_valid and not span.trace_flags.sampled


def _program_attributes(backend_id: str, program: Any) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {"vyre.backend.id": backend_id}
    if isinstance(program, Program):  # anything else failed validation
        attributes["vyre.program.op_id"] = program.op_id
        fingerprint = program.memo.get("telemetry.fingerprint")
        if fingerprint is None:
            try:
                fingerprint = program.fingerprint().hex()
            except InvalidProgram:  # beyond a wire limit: the caller gets validation's report
                return attributes
            program.memo["telemetry.fingerprint"] = fingerprint
        attributes["vyre.program.fingerprint"] = fingerprint
    return attributes


def _open(started: DispatchTrace, attributes: Mapping[str, AttributeValue]) -> Span | None:
    """Open the dispatch span; None when a span processor's ``on_start`` (or the sampler)
    raised, which is reported: the dispatch then goes on untraced."""
    try:
        span: Span = _tracer.start_span(
            SPAN_NAME,
            context=started.parent,
            attributes=attributes,
            start_time=started.start_ns,
            record_exception=False,
            set_status_on_exception=False,
        )
    except Exception as exc:
        _report(exc)
        return None
    return span


def fail_before_launch(
    started: DispatchTrace | None, error: BaseException, backend_id: str, program: Any
) -> None:
    """Record a dispatch that ``dispatch()`` itself rejected, before any launch.

    Never raises: a telemetry failure is reported (`threading.excepthook`) and
    the caller's own error stays the one raised.
    """
    if started is None:
        return
    try:
        _record_rejection(started, error, backend_id, program)
    except Exception as exc:
        _report(exc)


def _report(exc: BaseException) -> None:
    """Report a bug of telemetry's own through `threading.excepthook`."""
    args = threading.ExceptHookArgs((type(exc), exc, exc.__traceback__, threading.current_thread()))
    threading.excepthook(args)


def _record_rejection(
    started: DispatchTrace, error: BaseException, backend_id: str, program: Any
) -> None:
    record = started.record
    span = None
    if record is not None:
        with _claim_lock:
            if not record.claimed:
                return  # settled and counted already, or nothing of it is recorded
            record.claimed = False
            span, record.span = record.span, None
            # Counted here as rejected: its settling (never launched) counts nothing more.
            record.on_settled = None
            record.on_await_cancelled = None
            record.trace = None
    try:
        if started.traced:
            if span is None and record is None:  # raised before attach: open the span now
                span = _open(started, _program_attributes(backend_id, program))
            if span is not None and span.is_recording():
                span.set_attribute("vyre.error.code", int(getattr(error, "code", 0)))
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
                span.end()
    finally:  # (counted even when a span processor raised)
        if started.metered:
            op_id = getattr(program, "op_id", "") or "unnamed"
            labels = (("vyre.backend.id", backend_id), ("vyre.program.op_id", op_id))
            _tallies.add("vyre.dispatch.count", (*labels, ("vyre.status", "rejected")))


#: Guards the once-only claim of a dispatch's outcome (finish, cancelled await, rejection).
_claim_lock = threading.Lock()


def attach(
    started: DispatchTrace | None,
    pending: PendingDispatch,
    template: Any,
    backend_id: str,
) -> None:
    """Open the dispatch span with the launch's attributes; end it when the dispatch settles.

    ``template`` is the launch shape's `vyre_async._frontend.LaunchTemplate`; what
    telemetry derives from it is kept on it (``template.telemetry``). A span the
    sampler drops is let go at once: the dispatch then records nothing more
    unless metrics are collected.
    """
    if started is None:
        return
    facts = template.telemetry
    if facts is None or facts.backend_id != backend_id:
        facts = template.telemetry = _ShapeFacts(template, backend_id)
    record = pending.record
    started.record = record
    if started.traced:
        attributes = facts.span[record.cache_hit]
        extra = record.attributes  # arm-scheduler / batch verdicts, known by now
        if extra:
            attributes = {**attributes, **extra}
            record.sent = dict(extra)
        span = _open(started, attributes)
        if span is not None and span.is_recording():
            record.span = span
        elif not started.metered:
            return  # sampled out, no metrics: nothing else to do for this dispatch
    record.claimed = True  # claimed once: by finish, await-cancelled or fail_before_launch
    record.trace = facts if started.metered else None
    record.on_await_cancelled = _await_cancelled
    record.on_settled = finish_dispatch


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
    try:
        if span is not None:
            span.set_attribute("vyre.await.cancelled", True)
            span.set_status(
                Status(
                    StatusCode.ERROR, "await cancelled; the dispatch keeps running on the backend"
                )
            )
            span.end()
    except Exception as exc:  # a span processor's bug: reported, never the awaiting task's
        _report(exc)
    finally:
        facts: _ShapeFacts | None = record.trace
        if facts is not None:
            _tallies.add("vyre.dispatch.count", (*facts.labels, ("vyre.status", "cancelled")))


def finish_dispatch(
    pending: PendingDispatch,
    wall_s: float | None = None,
    queue_s: float | None = None,
    device_s: float | None = None,
) -> None:
    """End the dispatch span with the outcome, timing and phases; count and time it.

    The dispatch record's ``on_settled`` hook: the settling code passes the
    times (those of `PendingDispatch.timing`). Called with the dispatch alone,
    it reads them from ``pending.timing``.
    """
    record = pending.record
    if wall_s is None:
        timing = pending.timing
        if timing is not None:
            wall_s, queue_s, device_s = timing.wall_s, timing.queue_s, timing.device_s
    error = pending.exception()
    claimed, span = _claim(record)
    try:
        if span is not None:
            _end_span(span, record, queue_s, device_s, error)
    finally:  # a span processor that raises must not cost the dispatch its metrics
        _count(record, claimed, error, wall_s, device_s)


def _count(
    record: DispatchRecord,
    claimed: bool,
    error: BaseException | None,
    wall_s: float | None,
    device_s: float | None,
) -> None:
    """Tally a settled dispatch's outcome and record its two histogram points."""
    facts: _ShapeFacts | None = record.trace
    if facts is None:  # no meter provider
        return
    labels = facts.labels
    prefetch = record.prefetch
    if error is None and claimed:
        _tallies.add_many(facts.ok[record.cache_hit, None if prefetch is None else prefetch[0]])
    else:
        cache = "vyre.pipeline.cache.hits" if record.cache_hit else "vyre.pipeline.cache.misses"
        counts = [(cache, labels, 1)]
        if prefetch is not None:
            counts.append(
                ("vyre.prefetch.hits" if prefetch[0] else "vyre.prefetch.misses", labels, 1)
            )
        if claimed:  # not counted as cancelled
            if error is None:
                status = "ok"
            else:
                status = "timeout" if isinstance(error, DispatchTimeout) else "error"
            counts.append(("vyre.dispatch.count", (*labels, ("vyre.status", status)), 1))
        if error is None:
            counts += [
                ("vyre.bytes.in", labels, facts.bytes_in),
                ("vyre.bytes.out", labels, facts.bytes_out),
            ]
        _tallies.add_many(counts)
    if wall_s is not None:
        _latency.record(wall_s, facts.label_attrs)
    if device_s is not None:
        _device.record(device_s, facts.label_attrs)


def _end_span(
    span: Span,
    record: DispatchRecord,
    queue_s: float | None,
    device_s: float | None,
    error: BaseException | None,
) -> None:
    """Set what became known since the span opened, in one call, and end it."""
    final: dict[str, AttributeValue] = {}
    phases = record.phases
    if phases:
        for name, start_ns, end_ns in phases:
            key = PHASE_ATTRIBUTES.get(name)
            if key is not None:
                seconds = max(0, end_ns - start_ns) / 1e9
                final[key] = final.get(key, 0.0) + seconds  # type: ignore[operator]
        if _detail == "phases":
            parent = trace.set_span_in_context(span)
            for name, start_ns, end_ns in phases:
                child = _tracer.start_span(name, context=parent, start_time=start_ns)
                child.end(end_time=max(start_ns, end_ns))
    prefetch = record.prefetch
    if prefetch is not None:
        final["vyre.prefetch.hit"], final["vyre.prefetch.hit_rate"] = prefetch
    later = record.attributes
    if later:  # set since attach (backend annotations)
        sent = record.sent
        if sent:
            for key, value in later.items():
                if key not in sent or sent[key] != value:
                    final[key] = value
        else:
            final.update(later)
    if device_s is not None:
        final["vyre.device.time_s"] = device_s
    if queue_s is not None:
        final["vyre.queue.time_s"] = queue_s
    if error is not None:
        final["vyre.error.code"] = int(getattr(error, "code", 0))
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
    if final:
        span.set_attributes(final)
    span.end()


def record_prefetch(backend_id: str, program: Program, hit: bool) -> None:
    """Count one shape-prediction outcome for ``program``.

    For tools that score predictions themselves; the driver's prefetcher keeps
    its outcome on the dispatch's record (``record.prefetch``), which is counted
    when the dispatch settles.
    """
    _tallies.add(
        "vyre.prefetch.hits" if hit else "vyre.prefetch.misses", _labels(backend_id, program)
    )


# Prometheus text exposition ------------------------------------------------------


def _prom_name(name: str) -> str:
    """A Prometheus metric or label name: ASCII letters, digits and ``_``, no leading digit."""
    cleaned = "".join(c if c.isascii() and c.isalnum() else "_" for c in name)
    return f"_{cleaned}" if cleaned[:1].isdigit() else cleaned


def _prom_labels(
    attributes: Mapping[str, Any],
    extra: Iterable[tuple[str, str]] = (),
    reserved: frozenset[str] = frozenset(),
) -> str:
    """``{name="value",...}``: attribute keys as label names, ``extra`` labels last.

    Keys that become one name (``a.b`` and ``a_b``) are one label whose values are
    joined by ``;`` in the order of the keys (OpenTelemetry's Prometheus
    compatibility rule). A name the format reserves (``__`` in front, or one of
    ``reserved``: ``le`` on a histogram's series) gets ``exported_`` in front, as
    Prometheus renames a scraped label that clashes with one it sets.
    """
    merged: dict[str, list[str]] = {}
    for key, value in sorted(attributes.items()):
        name = _prom_name(key)
        if name.startswith("__") or name in reserved:
            name = f"exported_{name}"
        merged.setdefault(name, []).append(str(value))
    items = [(k, ";".join(v)) for k, v in merged.items()] + list(extra)
    if not items:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in items) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _help(series: str, metric: Any) -> str:
    text = str(metric.description or metric.name)
    return f"# HELP {series} " + text.replace("\\", "\\\\").replace("\n", "\\n")


def prometheus_text(metrics_data: Any) -> str:
    """Render OpenTelemetry SDK ``MetricsData`` in the Prometheus text exposition format.

    Pass what an SDK ``InMemoryMetricReader.get_metrics_data()`` (or any
    ``MetricReader``) returns. Sums become counters (``_total`` added unless the
    name ends in it) or gauges, gauges gauges, explicit-bucket histograms
    ``_bucket``/``_sum``/``_count`` series. Names become valid Prometheus names
    (other characters as ``_``, a leading digit prefixed with ``_``); label
    names that become equal are one label (values joined by ``;``), reserved ones
    get ``exported_`` in front (see `_prom_labels`). What the format cannot hold
    is named in a comment line and left out: a kind it has no plain form for (an
    exponential histogram), a metric whose names another metric already took
    (the same name in a second scope, a gauge named like a counter's series),
    a point whose labels equal an earlier point's.
    """
    lines: list[str] = []
    taken: set[str] = set()
    for resource_metrics in getattr(metrics_data, "resource_metrics", ()) or ():
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                lines += _prom_metric(metric, taken)
    return "\n".join(lines) + ("\n" if lines else "")


def _prom_metric(metric: Any, taken: set[str]) -> list[str]:
    """The lines of one metric; ``taken`` holds the names earlier metrics wrote (and grows)."""
    name = _prom_name(metric.name)
    data = metric.data
    kind = type(data).__name__  # the SDK's Sum, Gauge, Histogram, ExponentialHistogram
    points: Sequence[Any] = data.data_points
    if kind == "Sum" or hasattr(data, "is_monotonic"):
        counter = bool(data.is_monotonic)
        base = name.removesuffix("_total")
        series = f"{base}_total" if counter else name
        names = {base, series} if counter else {name}
        kind_name = "counter" if counter else "gauge"
    elif kind == "Histogram" or (points and hasattr(points[0], "explicit_bounds")):
        series, kind_name = name, "histogram"
        names = {name, f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    elif kind == "Gauge" or (points and hasattr(points[0], "value")):
        series, kind_name, names = name, "gauge", {name}
    else:
        return [f"# {name}: a {kind} metric, which this exposition does not render"]
    if names & taken:
        clash = ", ".join(sorted(names & taken))
        return [f"# {name}: {clash} written for another metric already; this {kind} is left out"]
    taken |= names
    out = [_help(series, metric), f"# TYPE {series} {kind_name}"]
    reserved = frozenset({"le"}) if kind_name == "histogram" else frozenset()
    written: set[str] = set()
    for p in points:
        labels = _prom_labels(p.attributes, reserved=reserved)
        if labels in written:
            out.append(f"# {series}{labels}: a second point with these labels, left out")
            continue
        written.add(labels)
        if kind_name != "histogram":
            out.append(f"{series}{labels} {p.value}")
            continue
        running = 0
        for bound, count in zip((*p.explicit_bounds, float("inf")), p.bucket_counts, strict=True):
            running += count
            le = "+Inf" if bound == float("inf") else repr(float(bound))
            bucket = _prom_labels(p.attributes, [("le", le)], reserved)
            out.append(f"{name}_bucket{bucket} {running}")
        out.append(f"{name}_sum{labels} {p.sum}")
        out.append(f"{name}_count{labels} {p.count}")
    return out
