"""One OpenTelemetry SDK for the tests that read spans or metrics: in-memory, installed once.

A tracer or meter provider can be installed once per process, so every test
module that needs one imports these fixtures (``tests/telemetry/conftest.py``,
``tests/policies/test_prefetch.py``); once installed, it stays for the session.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_EXPORTER = InMemorySpanExporter()
_READER = InMemoryMetricReader()


@functools.cache
def install() -> tuple[InMemorySpanExporter, InMemoryMetricReader]:
    """Install the in-memory SDK as the global tracer and meter providers (once)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[_READER]))
    return _EXPORTER, _READER


@pytest.fixture(scope="session")
def _sdk() -> tuple[InMemorySpanExporter, InMemoryMetricReader]:
    return install()


@pytest.fixture
def spans(
    _sdk: tuple[InMemorySpanExporter, InMemoryMetricReader],
) -> Iterator[InMemorySpanExporter]:
    _sdk[0].clear()
    yield _sdk[0]
    _sdk[0].clear()


@pytest.fixture
def reader(_sdk: tuple[InMemorySpanExporter, InMemoryMetricReader]) -> InMemoryMetricReader:
    return _sdk[1]
