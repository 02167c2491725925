"""Every read of OpenTelemetry's internals, in one place.

vyre-async uses the public ``opentelemetry-api`` for everything it records. A
few questions the public API cannot answer cheaply on every dispatch are
answered here by reading the API's and the SDK's private names:

* is an SDK tracer / meter provider installed? (the API's ``_TRACER_PROVIDER``
  and ``metrics._internal._METER_PROVIDER`` globals: the public getters also
  read ``os.environ`` on every call; and the type of the API's proxy meter
  provider, ``_PROXY_METER_PROVIDER``);
* which sampler will decide vyre's spans? (the API proxy tracer's
  ``_real_tracer``, the SDK tracer's ``sampler``, and the SDK ``ParentBased``
  sampler's ``_remote_parent_not_sampled`` / ``_local_parent_not_sampled``).

Each read falls back to the public answer, or to "ask the SDK", when the name
is missing. `TESTED` names the releases these reads were checked against;
``tests/telemetry/test_otel_compat.py`` checks that every name read here
exists in the installed release and that the release is within `TESTED`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = [
    "PRIVATE_NAMES",
    "PROVIDERS_FROM_ENV",
    "TESTED",
    "UNKNOWN",
    "Api",
    "api_in_use",
    "drops_unsampled_parents",
    "drops_every_span",
    "load_api",
    "provider_installed",
    "sampler_of",
]

#: The ``opentelemetry-api`` / ``-sdk`` releases whose internals were checked: at
#: least the first, below the second (the pyproject's floor is the first).
TESTED = ((1, 25), (1, 46))

#: ``(module, name)`` of every private name read here.
PRIVATE_NAMES = (
    ("opentelemetry.trace", "_TRACER_PROVIDER"),
    ("opentelemetry.metrics._internal", "_METER_PROVIDER"),
    ("opentelemetry.metrics._internal", "_PROXY_METER_PROVIDER"),
    ("opentelemetry.trace", "ProxyTracer._real_tracer"),
    ("opentelemetry.sdk.trace", "Tracer.sampler"),
    ("opentelemetry.sdk.trace.sampling", "ParentBased._remote_parent_not_sampled"),
    ("opentelemetry.sdk.trace.sampling", "ParentBased._local_parent_not_sampled"),
)

#: Providers named in the environment are loaded by the API without the
#: application importing it: then the API is loaded when vyre-async is.
PROVIDERS_FROM_ENV = bool(
    os.environ.get("OTEL_PYTHON_TRACER_PROVIDER") or os.environ.get("OTEL_PYTHON_METER_PROVIDER")
)

#: What a read of a private name that is missing gives.
UNKNOWN = object()


def api_in_use() -> bool:
    """True once anything imported the API's trace or metrics module (or the env names one).

    Until then no SDK can be installed, so nothing of a dispatch can be recorded.
    """
    modules = sys.modules
    return (
        "opentelemetry.trace" in modules or "opentelemetry.metrics" in modules or PROVIDERS_FROM_ENV
    )


class Api:
    """The OpenTelemetry API modules and names telemetry uses, imported once (`load_api`).

    Attributes:
        trace: ``opentelemetry.trace``.
        metrics: ``opentelemetry.metrics``.
        get_current: ``opentelemetry.context.get_current``.
        Status: ``opentelemetry.trace.Status``.
        StatusCode: ``opentelemetry.trace.StatusCode``.
    """

    __slots__ = (
        "Status",
        "StatusCode",
        "_inert_meters",
        "_inert_tracers",
        "_metrics_internal",
        "get_current",
        "metrics",
        "trace",
    )

    def __init__(self) -> None:
        import opentelemetry.metrics as metrics_module
        import opentelemetry.metrics._internal as metrics_internal
        import opentelemetry.trace as trace_module
        from opentelemetry.context import get_current

        self.trace: Any = trace_module
        self.metrics: Any = metrics_module
        self._metrics_internal: Any = metrics_internal
        self.get_current: Callable[[], Any] = get_current
        self.Status: Any = trace_module.Status
        self.StatusCode: Any = trace_module.StatusCode
        # The API's stand-ins until an application installs an SDK (set once, never unset).
        self._inert_tracers: tuple[type, ...] = (
            trace_module.ProxyTracerProvider,
            trace_module.NoOpTracerProvider,
        )
        proxy = getattr(metrics_internal, "_PROXY_METER_PROVIDER", None)
        self._inert_meters: tuple[type, ...] = (metrics_module.NoOpMeterProvider,) + (
            (type(proxy),) if proxy is not None else ()
        )

    def providers(self) -> tuple[object, object]:
        """The installed tracer and meter provider objects, as the API holds them now."""
        return (
            getattr(self.trace, "_TRACER_PROVIDER", UNKNOWN),
            getattr(self._metrics_internal, "_METER_PROVIDER", UNKNOWN),
        )

    def tracing_installed(self) -> bool:
        """True when an SDK (not the API's stand-in) tracer provider is installed."""
        return provider_installed(
            self.trace, "_TRACER_PROVIDER", self.trace.get_tracer_provider, self._inert_tracers
        )

    def metering_installed(self) -> bool:
        """True when an SDK (not the API's stand-in) meter provider is installed."""
        return provider_installed(
            self._metrics_internal,
            "_METER_PROVIDER",
            self.metrics.get_meter_provider,
            self._inert_meters,
        )


def load_api() -> Api:
    """Import the OpenTelemetry API (`Api`)."""
    return Api()


def provider_installed(
    module: Any, name: str, public: Callable[[], Any], inert: tuple[type, ...]
) -> bool:
    """True when ``module.name`` (else ``public()``) is a provider that is not one of ``inert``."""
    # The API's global, read directly: the public getter also consults os.environ
    # on every call (~1 µs). Providers named by OTEL_PYTHON_*_PROVIDER were loaded
    # into it when telemetry made its tracer and meter.
    provider = getattr(module, name, UNKNOWN)
    if provider is UNKNOWN:  # the API's internals moved: ask the public way
        provider = public()
    return provider is not None and not isinstance(provider, inert)


def sampler_of(tracer: object) -> object | None:
    """The sampler of the SDK tracer behind ``tracer`` (None: not known yet).

    An SDK tracer keeps the sampler its provider had when the tracer was made.
    ``tracer`` is the API's proxy until an SDK is installed; the proxy finds the
    SDK tracer at its first span.
    """
    real = getattr(tracer, "_real_tracer", None) or tracer
    return getattr(real, "sampler", None)


def drops_every_span(sampler: object) -> bool:
    """True for exactly the SDK's ``ALWAYS_OFF`` (a ``StaticSampler`` that drops)."""
    sampling = sys.modules.get("opentelemetry.sdk.trace.sampling")
    if sampling is None:
        return False
    return type(sampler) is sampling.StaticSampler and (
        sampler.get_description() == "AlwaysOffSampler"  # type: ignore[attr-defined]
    )


def drops_unsampled_parents(sampler: object) -> bool:
    """True for the SDK's own ``ParentBased`` (not a subclass) that drops unsampled parents.

    Its delegates for not-sampled parents, remote and local, are ``ALWAYS_OFF``.
    """
    sampling = sys.modules.get("opentelemetry.sdk.trace.sampling")
    if sampling is None or type(sampler) is not getattr(sampling, "ParentBased", None):
        return False
    return all(
        drops_every_span(getattr(sampler, part, None))
        for part in ("_remote_parent_not_sampled", "_local_parent_not_sampled")
    )
