"""With no OpenTelemetry SDK installed, a dispatch does no telemetry work at all.

The API drops spans and measurements until an application installs an SDK, so
the driver skips building them (the no-SDK overhead target rests on this). Once
an SDK is installed — tracing, metrics or both — dispatches record from then on.
Each scenario runs in a subprocess: SDK providers are global and set once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

PRELUDE = textwrap.dedent(
    """
    import numpy as np
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from vyre_async import telemetry
    from vyre_async.programs import elementwise_xor
    from vyre_reference import reference_backend

    backend = reference_backend()
    XOR = elementwise_xor(64)
    INPUTS = [np.zeros(64, np.uint32), np.ones(64, np.uint32)]

    def dispatch():
        pending = backend.dispatch(XOR, INPUTS)
        assert pending.result()[0].tolist() == [1] * 64
        return pending

    def dispatch_counts(reader):
        data = reader.get_metrics_data()
        total = 0
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == "vyre.dispatch.count":
                        total += sum(p.value for p in metric.data.data_points)
        return total
    """
)


def _run(body: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
        env={**os.environ, "VYRE_TELEMETRY": "on"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr


def test_no_sdk_means_no_telemetry_work_then_an_sdk_turns_spans_on() -> None:
    _run(
        """
        assert telemetry.is_enabled() and not telemetry.is_recording()
        assert telemetry.start_dispatch() is None
        before = dispatch()
        assert before.record.trace is None

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        assert telemetry.is_recording()
        dispatch()
        names = [s.name for s in exporter.get_finished_spans()]
        assert names.count("vyre.dispatch") == 1, names
        telemetry.set_enabled(False)
        assert not telemetry.is_recording()
        dispatch()
        assert [s.name for s in exporter.get_finished_spans()].count("vyre.dispatch") == 1
        """
    )


def test_metrics_only_sdk_counts_dispatches_without_spans() -> None:
    _run(
        """
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        assert telemetry.is_recording()
        started = telemetry.start_dispatch()
        assert started is not None and not started.traced
        pending = dispatch()
        dispatch()
        assert pending.record.trace is not None and pending.record.trace.span is None
        assert dispatch_counts(reader) == 2
        """
    )


def test_a_provider_named_in_the_environment_counts_as_installed() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from vyre_async import telemetry; assert telemetry.is_recording()",
        ],
        env={
            **os.environ,
            "VYRE_TELEMETRY": "on",
            "OTEL_PYTHON_TRACER_PROVIDER": "sdk_tracer_provider",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr


def test_a_dispatch_trace_made_by_hand_loads_what_it_will_use() -> None:
    # A DispatchTrace built before any dispatch looked for an SDK: traced needs the
    # caller's context, metered the instruments; neither needs nothing loaded.
    code = textwrap.dedent(
        """
        import sys
        from vyre_async import telemetry
        quiet = telemetry.DispatchTrace(False, metered=False)
        from vyre_async.telemetry._state import STATE
        print(quiet.parent, STATE.api is not None)
        metered = telemetry.DispatchTrace(False)
        print(metered.parent, STATE.api is not None, STATE.latency is not None)
        traced = telemetry.DispatchTrace(True, metered=False)
        print(traced.parent is not None)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:3] == ["None False", "None True True", "True"]


_REJECTED_UNDER_A_BROKEN_PROCESSOR = """
import threading
import numpy as np
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from vyre_async import InvalidProgram, acquire_backend
from vyre_async.programs import elementwise_xor

class Raises(SpanProcessor):
    def on_start(self, span, parent_context=None):
        raise RuntimeError("on_start bug")
    def on_end(self, span):
        raise RuntimeError("on_end bug")

reported = []
threading.excepthook = lambda args: reported.append(str(args.exc_value))
provider = TracerProvider()
provider.add_span_processor(Raises())
trace.set_tracer_provider(provider)
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
backend = acquire_backend("reference")
try:
    backend.dispatch(elementwise_xor(64), [np.zeros(64, np.uint32)])  # one input short
except InvalidProgram as exc:
    caller_error = type(exc).__name__
data = reader.get_metrics_data()  # (None when nothing was recorded at all)
rejected = sum(
    point.value
    for rm in (data.resource_metrics if data is not None else ())
    for sm in rm.scope_metrics
    for metric in sm.metrics if metric.name == "vyre.dispatch.count"
    for point in metric.data.data_points
    if dict(point.attributes).get("vyre.status") == "rejected"
)
print(caller_error, rejected, sorted(set(reported)))
"""


def test_a_rejected_dispatch_is_counted_even_when_a_span_processor_raises() -> None:
    # The processor's fault is reported; the caller gets its own error; the
    # rejection still counts in the metrics.
    done = subprocess.run(
        [sys.executable, "-c", _REJECTED_UNDER_A_BROKEN_PROCESSOR],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "InvalidProgram 1 ['on_start bug']"
