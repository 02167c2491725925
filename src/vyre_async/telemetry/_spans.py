"""The ``vyre.dispatch`` span of every dispatch: started, opened, ended, counted.

`start_dispatch` notes where and when a dispatch started (a `DispatchTrace`,
or None when nothing would be recorded); `attach` opens the span once the
launch's attributes are known and hooks the dispatch's record; the record's
``on_settled`` hook (`finish_dispatch`) ends the span and counts the outcome.
A dispatch rejected before its launch is recorded by `fail_before_launch`.
The trace is telemetry's own record of the dispatch (``pending.record.trace``):
the span, the once-only claim of its outcome, the launch shape's facts.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from vyre_async.errors import DispatchTimeout, InvalidProgram
from vyre_async.ir.program import Program
from vyre_async.telemetry import _otel_compat
from vyre_async.telemetry._metrics import Labels
from vyre_async.telemetry._state import STATE

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span
    from opentelemetry.util.types import AttributeValue

    from vyre_async._pending import DispatchRecord, PendingDispatch

__all__ = [
    "PHASES",
    "PHASE_ATTRIBUTES",
    "SPAN_NAME",
    "DispatchAttribute",
    "DispatchTrace",
    "attach",
    "current_dispatch_attributes",
    "dispatch_attributes",
    "fail_before_launch",
    "finish_dispatch",
    "is_recording",
    "record_prefetch",
    "start_dispatch",
]

SPAN_NAME = "vyre.dispatch"
#: Phases of a dispatch, in the order they usually happen (child span names with the
#: ``"phases"`` detail).
PHASES = (
    "vyre.compile",
    "vyre.wait",
    "vyre.upload",
    "vyre.launch",
    "vyre.readback",
    "vyre.segment",  # one per segment of a program split at its grid barriers
)
#: The span attribute that carries each phase's duration in seconds.
PHASE_ATTRIBUTES = {name: f"vyre.phase.{name.removeprefix('vyre.')}_s" for name in PHASES}


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


# Starting a dispatch -----------------------------------------------------------------
class DispatchTrace:
    """Telemetry's own record of one dispatch: where and when it started, its span.

    `start_dispatch` returns one instead of opening the SDK span at once. The
    span opens in `attach`, with the launch's attributes, in the captured
    context and with the start time, so the trace is the same as if it had
    been opened at ``dispatch()``. It is the dispatch record's ``trace``
    from then on.

    Attributes:
        traced: An SDK tracer provider is installed.
        metered: An SDK meter provider is installed.
        parent: The caller's context (None when not traced).
        start_ns: ``time.time_ns()`` at the start.
        record: The dispatch's `DispatchRecord`, once `attach` ran.
        span: The open ``vyre.dispatch`` span while one is recorded, else None.
        claimed: True while the outcome is still to be counted (once only).
        facts: The launch shape's facts (labels, byte counts) when metered, else None.
        sent: The attributes already given to the span when it opened, or None.
    """

    __slots__ = (
        "claimed",
        "facts",
        "metered",
        "parent",
        "record",
        "sent",
        "span",
        "start_ns",
        "traced",
    )

    def __init__(self, traced: bool, metered: bool = True, parent: Context | None = None) -> None:
        self.traced = traced
        self.metered = metered
        if (traced or metered) and STATE.api is None:
            STATE.load_api()  # (made by hand, before any dispatch looked for an SDK)
        if traced and parent is None:
            parent = STATE.api.get_current()  # type: ignore[union-attr]
        self.parent: Context | None = parent if traced else None
        self.start_ns = time.time_ns()
        self.record: DispatchRecord | None = None
        self.span: Span | None = None
        self.claimed = False
        self.facts: _ShapeFacts | None = None
        self.sent: Mapping[str, object] | None = None


def start_dispatch() -> DispatchTrace | None:
    """Note the start of a dispatch in the caller's current context.

    Returns None when nothing would be recorded: telemetry switched off, no
    OpenTelemetry SDK installed for traces or metrics, or no meter provider and
    a span the installed sampler is known to drop (`_sampler_drops`). The span
    itself opens in `attach` (or `fail_before_launch`), when its attributes are
    known.
    """
    state = STATE
    if not state.enabled:
        return None
    if state.api is None:
        # Nobody imported the API's trace or metrics module: no SDK can be installed
        # (`_otel_compat.api_in_use`, inlined: this runs on every dispatch).
        modules = sys.modules
        if (
            "opentelemetry.trace" not in modules
            and "opentelemetry.metrics" not in modules
            and not _otel_compat.PROVIDERS_FROM_ENV
        ):
            return None
    tracing, metering = state.sdk_installed()
    parent = None
    if tracing:
        parent = state.api.get_current()  # type: ignore[union-attr]
        if _sampler_drops(parent):
            tracing = False
    if not (tracing or metering):
        return None
    return DispatchTrace(tracing, metering, parent)


def is_recording() -> bool:
    """Return True when dispatches are traced or metered: enabled and an SDK installed."""
    return STATE.enabled and any(STATE.sdk_installed())


# What the installed sampler decides without being asked --------------------------
def _sampler_verdict() -> str:
    """Return ``"never"``, ``"parent"`` or ``"ask"`` for the sampler of vyre's tracer.

    ``"never"``: it is the SDK's ``ALWAYS_OFF``. ``"parent"``: it is the SDK's
    own ``ParentBased`` (not a subclass) whose delegates for not-sampled
    parents, remote and local, are ``ALWAYS_OFF``: a span under a parent that
    is not sampled is dropped. ``"ask"``: anything else, custom samplers and
    subclasses included (the SDK decides each span). Classified once per
    sampler; a sampler whose parts cannot be read is asked.
    """
    sampler = _otel_compat.sampler_of(STATE.tracer)
    known = STATE.verdict
    if sampler is known[0]:
        return known[1]
    verdict = "ask"
    if sampler is not None:
        if _otel_compat.drops_every_span(sampler):
            verdict = "never"
        elif _otel_compat.drops_unsampled_parents(sampler):
            verdict = "parent"
    STATE.verdict = (sampler, verdict)
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
    span = STATE.api.trace.get_current_span(parent).get_span_context()  # type: ignore[union-attr]
    return span.is_valid and not span.trace_flags.sampled


# Opening the span -----------------------------------------------------------------------
_Tally = tuple[str, Labels, int]


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
        self.labels = STATE.labels_of(backend_id, program.op_id or "unnamed")
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
        span: Span = STATE.tracer.start_span(
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


def attach(
    started: DispatchTrace | None,
    pending: PendingDispatch,
    template: Any,
    backend_id: str,
) -> None:
    """Open the dispatch span with the launch's attributes; end it when the dispatch settles.

    ``template`` is the launch shape's `vyre_async.abc.LaunchTemplate`; what
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
            started.sent = dict(extra)
        span = _open(started, attributes)
        if span is not None and span.is_recording():
            started.span = span
        elif not started.metered:
            return  # sampled out, no metrics: nothing else to do for this dispatch
    started.claimed = True  # claimed once: by finish, await-cancelled or fail_before_launch
    started.facts = facts if started.metered else None
    record.trace = started
    record.on_await_cancelled = _await_cancelled
    record.on_settled = finish_dispatch


# Rejected before launch -------------------------------------------------------------------
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
            if not started.claimed:
                return  # settled and counted already, or nothing of it is recorded
            started.claimed = False
            span, started.span = started.span, None
            # Counted here as rejected: its settling (never launched) counts nothing more,
            # even when it already holds this trace (it reads the facts after its claim).
            started.facts = None
            record.on_settled = None
            record.on_await_cancelled = None
            record.trace = None
    try:
        if started.traced:
            if span is None and record is None:  # raised before attach: open the span now
                span = _open(started, _program_attributes(backend_id, program))
            if span is not None and span.is_recording():
                api: Any = STATE.api
                span.set_attribute("vyre.error.code", int(getattr(error, "code", 0)))
                span.record_exception(error)
                span.set_status(
                    api.Status(api.StatusCode.ERROR, f"{type(error).__name__}: {error}")
                )
                span.end()
    finally:  # (counted even when a span processor raised)
        if started.metered:
            op_id = getattr(program, "op_id", "") or "unnamed"
            labels = (("vyre.backend.id", backend_id), ("vyre.program.op_id", op_id))
            STATE.tallies.add("vyre.dispatch.count", (*labels, ("vyre.status", "rejected")))


# Settled --------------------------------------------------------------------------------
#: Guards the once-only claim of a dispatch's outcome (finish, cancelled await, rejection).
_claim_lock = threading.Lock()


def _claim(started: DispatchTrace | None) -> tuple[bool, Span | None]:
    if started is None:
        return False, None
    with _claim_lock:
        if not started.claimed:
            return False, None
        started.claimed = False
        span, started.span = started.span, None
        return True, span


def _await_cancelled(pending: PendingDispatch) -> None:
    started = pending.record.trace
    claimed, span = _claim(started)
    if not claimed:  # finish ran first
        return
    try:
        if span is not None:
            api: Any = STATE.api
            span.set_attribute("vyre.await.cancelled", True)
            span.set_status(
                api.Status(
                    api.StatusCode.ERROR,
                    "await cancelled; the dispatch keeps running on the backend",
                )
            )
            span.end()
    except Exception as exc:  # a span processor's bug: reported, never the awaiting task's
        _report(exc)
    finally:
        facts = started.facts
        if facts is not None:
            STATE.tallies.add("vyre.dispatch.count", (*facts.labels, ("vyre.status", "cancelled")))


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
    started = record.trace
    claimed, span = _claim(started)
    try:
        if span is not None:
            _end_span(span, record, started, queue_s, device_s, error)
    finally:  # a span processor that raises must not cost the dispatch its metrics
        if started is not None:
            _count(record, started, claimed, error, wall_s, device_s)


def _count(
    record: DispatchRecord,
    started: DispatchTrace,
    claimed: bool,
    error: BaseException | None,
    wall_s: float | None,
    device_s: float | None,
) -> None:
    """Tally a settled dispatch's outcome and record its two histogram points."""
    facts = started.facts
    if facts is None:  # no meter provider
        return
    labels = facts.labels
    prefetch = record.prefetch
    tallies = STATE.tallies
    if error is None and claimed:
        tallies.add_many(facts.ok[record.cache_hit, None if prefetch is None else prefetch[0]])
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
        tallies.add_many(counts)
    if wall_s is not None:
        STATE.latency.record(wall_s, facts.label_attrs)
    if device_s is not None:
        STATE.device.record(device_s, facts.label_attrs)


def _end_span(
    span: Span,
    record: DispatchRecord,
    started: DispatchTrace,
    queue_s: float | None,
    device_s: float | None,
    error: BaseException | None,
) -> None:
    """Set what became known since the span opened, in one call, and end it."""
    api: Any = STATE.api
    final: dict[str, AttributeValue] = {}
    phases = record.phases
    if phases:
        for name, start_ns, end_ns in phases:
            key = PHASE_ATTRIBUTES.get(name)
            if key is not None:
                seconds = max(0, end_ns - start_ns) / 1e9
                final[key] = final.get(key, 0.0) + seconds  # type: ignore[operator]
        if STATE.detail == "phases":
            parent = api.trace.set_span_in_context(span)
            for name, start_ns, end_ns in phases:
                child = STATE.tracer.start_span(name, context=parent, start_time=start_ns)
                child.end(end_time=max(start_ns, end_ns))
    prefetch = record.prefetch
    if prefetch is not None:
        final["vyre.prefetch.hit"], final["vyre.prefetch.hit_rate"] = prefetch
    later = record.attributes
    if later:  # set since attach (backend annotations)
        sent = started.sent
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
        span.set_status(api.Status(api.StatusCode.ERROR, f"{type(error).__name__}: {error}"))
    if final:
        span.set_attributes(final)
    span.end()


def record_prefetch(backend_id: str, program: Program, hit: bool) -> None:
    """Count one shape-prediction outcome for ``program``.

    For tools that score predictions themselves; the driver's prefetcher keeps
    its outcome on the dispatch's record (``record.prefetch``), which is counted
    when the dispatch settles.
    """
    STATE.tallies.add(
        "vyre.prefetch.hits" if hit else "vyre.prefetch.misses",
        STATE.labels_of(backend_id, program.op_id or "unnamed"),
    )
