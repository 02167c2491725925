"""`vyre_async.telemetry._otel_compat` reads OpenTelemetry internals that exist here.

Every private name it reads must exist in the installed API and SDK, and the
installed release must be one the module says it was checked against: a newer
release that moved a name fails here, not silently in production (where the
compat reads fall back to the slower public answers).
"""

from __future__ import annotations

import importlib
from importlib.metadata import version

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased

from vyre_async.telemetry import _otel_compat


def _release(distribution: str) -> tuple[int, int]:
    major, minor = version(distribution).split(".")[:2]
    return int(major), int(minor)


@pytest.mark.parametrize("distribution", ["opentelemetry-api", "opentelemetry-sdk"])
def test_the_installed_release_is_one_the_compat_reads_were_checked_against(
    distribution: str,
) -> None:
    low, high = _otel_compat.TESTED
    assert low <= _release(distribution) < high, (
        f"{distribution} {version(distribution)} is outside {low}..{high}: check every name of "
        "_otel_compat.PRIVATE_NAMES against it, then widen TESTED"
    )


@pytest.mark.parametrize(("module", "name"), _otel_compat.PRIVATE_NAMES)
def test_every_private_name_read_exists(module: str, name: str) -> None:
    owner: object = importlib.import_module(module)
    owner_name, _, attribute = name.rpartition(".")
    if owner_name:  # an attribute of instances of a class of the module
        cls = getattr(owner, owner_name)
        instance = {
            "ProxyTracer": lambda: cls("vyre", None),
            "Tracer": lambda: TracerProvider().get_tracer("vyre"),
            "ParentBased": lambda: cls(ALWAYS_ON),
        }[owner_name]()
        assert hasattr(instance, attribute), f"{module}.{owner_name} lost {attribute}"
    else:
        assert hasattr(owner, attribute), f"{module} lost {attribute}"


def test_the_sampler_reads_classify_the_sdk_samplers() -> None:
    assert _otel_compat.drops_every_span(ALWAYS_OFF)
    assert not _otel_compat.drops_every_span(ALWAYS_ON)
    assert _otel_compat.drops_unsampled_parents(ParentBased(ALWAYS_ON))
    assert not _otel_compat.drops_unsampled_parents(ALWAYS_OFF)

    class Custom(ParentBased):  # a subclass may decide otherwise: asked, not classified
        pass

    assert not _otel_compat.drops_unsampled_parents(Custom(ALWAYS_ON))
    tracer = TracerProvider(sampler=ALWAYS_OFF).get_tracer("vyre")
    assert _otel_compat.sampler_of(tracer) is ALWAYS_OFF
    assert _otel_compat.sampler_of(object()) is None


def test_a_provider_is_installed_unless_it_is_a_stand_in() -> None:
    api = _otel_compat.load_api()

    class Holder:
        _TRACER_PROVIDER: object = None

    holder = Holder()
    inert = (api.trace.NoOpTracerProvider,)
    assert not _otel_compat.provider_installed(holder, "_TRACER_PROVIDER", TracerProvider, inert)
    holder._TRACER_PROVIDER = api.trace.NoOpTracerProvider()
    assert not _otel_compat.provider_installed(holder, "_TRACER_PROVIDER", TracerProvider, inert)
    holder._TRACER_PROVIDER = TracerProvider()
    assert _otel_compat.provider_installed(holder, "_TRACER_PROVIDER", TracerProvider, inert)
    # The name gone (a release that moved it): the public getter answers.
    assert _otel_compat.provider_installed(object(), "_TRACER_PROVIDER", TracerProvider, inert)
    assert not _otel_compat.provider_installed(
        object(), "_TRACER_PROVIDER", api.trace.NoOpTracerProvider, inert
    )
