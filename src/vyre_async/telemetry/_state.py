"""Telemetry's process-wide state, in one object: `STATE` (`TelemetryState.reset` for tests).

The switches (``VYRE_TELEMETRY``, ``VYRE_TRACE_DETAIL``, `set_enabled`,
`set_trace_detail`), what is known of the installed SDK, the in-process
counter sums and the metric labels all live on `STATE`. The OpenTelemetry
API, vyre's tracer, meter and instruments are made once per process
(`TelemetryState.load_api`) and survive a reset: an SDK, once installed,
cannot be uninstalled either.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from vyre_async._version import __version__
from vyre_async.errors import InvalidArgument, InvalidProgram
from vyre_async.telemetry import _otel_compat
from vyre_async.telemetry._metrics import Labels, Tallies, make_instruments

__all__ = [
    "STATE",
    "SWITCH_OFF",
    "SWITCH_ON",
    "TRACE_DETAILS",
    "TelemetryState",
    "is_enabled",
    "set_enabled",
    "set_trace_detail",
    "trace_detail",
]

#: The values of ``VYRE_TELEMETRY`` (case-insensitive) that turn telemetry on, and off.
SWITCH_ON = ("1", "on", "true", "yes")
SWITCH_OFF = ("0", "off", "false", "no")
#: Tracing details: ``"span"`` (one span per dispatch, phases as attributes; the
#: default) and ``"phases"`` (the phases also as child spans).
TRACE_DETAILS = ("span", "phases")


def _bad_setting(message: str) -> None:
    """Report a bad environment variable, which then keeps its default.

    Logged, not warned: an application's import must never fail over a variable,
    and a warning would under ``-W error``.
    """
    import logging  # (only then: importing vyre-async loads no logging)

    logging.getLogger("vyre_async.telemetry").warning("%s", message)


def switch_from(environ: Mapping[str, str]) -> bool:
    """The ``VYRE_TELEMETRY`` switch of ``environ`` (on when unset or not understood)."""
    raw = environ.get("VYRE_TELEMETRY", "on").strip().lower() or "on"
    if raw in SWITCH_ON:
        return True
    if raw in SWITCH_OFF:
        return False
    _bad_setting(
        f"VYRE_TELEMETRY={raw!r} is neither on ({', '.join(SWITCH_ON)}) nor off "
        f"({', '.join(SWITCH_OFF)}); telemetry stays on.\nFix: set VYRE_TELEMETRY=off or on"
    )
    return True


def detail_from(value: object) -> str:
    """Return the tracing detail ``value`` names.

    Raises:
        InvalidArgument: ``value`` is not one of `TRACE_DETAILS` (blank: ``"span"``).
    """
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


def _detail_of(environ: Mapping[str, str]) -> str:
    try:
        return detail_from(environ.get("VYRE_TRACE_DETAIL", ""))
    except InvalidProgram as exc:
        _bad_setting(str(exc))
        return "span"


class TelemetryState:
    """Everything telemetry keeps for this process (one instance: `STATE`).

    Attributes:
        enabled: Dispatches are traced and metered (`set_enabled`).
        detail: ``"span"`` or ``"phases"`` (`set_trace_detail`).
        tracing: An SDK tracer provider was seen installed (kept once True).
        metering: An SDK meter provider was seen installed (kept once True).
        seen: The API's provider objects when the SDK was last looked for.
        verdict: ``(sampler, verdict)``: the sampler last classified and what it drops.
        tallies: The counters' in-process sums.
        labels: Metric labels per (backend id, op id), built once each.
        api: The OpenTelemetry API (`_otel_compat.Api`), or None until loaded.
        tracer, meter, latency, device: vyre's tracer, meter and its two
            histograms, or None until the API is loaded.
    """

    __slots__ = (
        "_lock",
        "api",
        "detail",
        "device",
        "enabled",
        "labels",
        "latency",
        "meter",
        "metering",
        "seen",
        "tallies",
        "tracer",
        "tracing",
        "verdict",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.api: _otel_compat.Api | None = None
        self.tracer: Any = None
        self.meter: Any = None
        self.latency: Any = None
        self.device: Any = None
        self.reset()

    def reset(self, environ: Mapping[str, str] | None = None) -> None:
        """Start over: switches from ``environ`` (default: ``os.environ``), nothing counted.

        What an installed SDK was seen to be is forgotten too (it is looked for
        again at the next dispatch); the API and vyre's instruments are kept.
        """
        environ = os.environ if environ is None else environ
        self.enabled: bool = switch_from(environ)
        self.detail: str = _detail_of(environ)
        self.tracing = False
        self.metering = False
        self.seen: tuple[object, object] = (_otel_compat.UNKNOWN, _otel_compat.UNKNOWN)
        self.verdict: tuple[object, str] = (_otel_compat.UNKNOWN, "ask")
        self.tallies = Tallies()
        self.labels: dict[tuple[str, str], Labels] = {}

    def load_api(self) -> _otel_compat.Api:
        """Import the OpenTelemetry API and make vyre's tracer, meter and instruments (once)."""
        with self._lock:
            if self.api is not None:
                return self.api
            api = _otel_compat.load_api()
            self.tracer = api.trace.get_tracer("vyre_async", __version__)
            self.meter = api.metrics.get_meter("vyre_async", __version__)
            # (the counters read the tallies of the moment: a reset replaces them)
            self.latency, self.device = make_instruments(self.meter, lambda: self.tallies)
            self.api = api
            return api

    def sdk_installed(self) -> tuple[bool, bool]:
        """Return whether an SDK tracer provider / meter provider is installed.

        Until one is, the API drops every span and measurement, so a dispatch
        skips all telemetry work (what keeps the no-SDK cost near zero). An SDK
        provider cannot be uninstalled, so a True answer is kept; until then the
        answer is recomputed only when the API's provider objects change.
        """
        if self.tracing and self.metering:
            return True, True
        api = self.api
        if api is None:
            if not _otel_compat.api_in_use():  # nobody imported the API: no SDK yet
                return False, False
            api = self.load_api()
        providers = api.providers()
        seen = self.seen
        if (
            providers[0] is seen[0]
            and providers[1] is seen[1]
            and providers[0] is not _otel_compat.UNKNOWN
            and providers[1] is not _otel_compat.UNKNOWN
        ):
            return self.tracing, self.metering
        if not self.tracing:
            self.tracing = api.tracing_installed()
        if not self.metering:
            self.metering = api.metering_installed()
        self.seen = providers
        return self.tracing, self.metering

    def labels_of(self, backend_id: str, op_id: str) -> Labels:
        """Metric labels of ``(backend id, op id)`` (op ids are few by design)."""
        labels = self.labels.get((backend_id, op_id))
        if labels is None:
            if len(self.labels) >= 4096:  # a program per request, say: do not grow without end
                self.labels.clear()
            labels = self.labels[backend_id, op_id] = (
                ("vyre.backend.id", backend_id),
                ("vyre.program.op_id", op_id),
            )
        return labels


STATE = TelemetryState()
if _otel_compat.PROVIDERS_FROM_ENV:
    STATE.load_api()


def set_enabled(enabled: bool) -> None:
    """Turn vyre-async's spans and metrics on or off for this process.

    Off, dispatches create no span and record no metric at all (the starting
    value comes from ``VYRE_TELEMETRY``: ``off``, ``0``, ``false`` or ``no``
    turn it off; ``on``, ``1``, ``true``, ``yes`` or unset keep it on; anything
    else logs a warning and keeps it on). With no SDK configured the cost is
    already tiny; this switch exists to measure that cost and for hot loops.

    Raises:
        InvalidArgument: ``enabled`` is not a bool (``"off"`` would read as True).
    """
    if not isinstance(enabled, bool):
        raise InvalidArgument(
            f"set_enabled takes True or False, got {enabled!r}",
            fix="pass set_enabled(False) to turn telemetry off",
        )
    STATE.enabled = enabled


def is_enabled() -> bool:
    """Return True when dispatches are traced and metered."""
    return STATE.enabled


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
    STATE.detail = detail_from(detail)


def trace_detail() -> str:
    """Return the tracing detail in force: ``"span"`` or ``"phases"``."""
    return STATE.detail
