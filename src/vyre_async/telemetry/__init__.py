"""Every dispatch is an OpenTelemetry span; every outcome a metric. API only.

The library uses ``opentelemetry-api`` alone: with no SDK configured, spans are
non-recording and metric calls are no-ops, and a dispatch skips telemetry
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
installed sampler is known to drop is not made at all. Metrics are labelled by
backend id and op id, never by fingerprint (bounded cardinality); counts and
bytes are tallied in-process and read by observable counters at collection,
the two histograms get one point each per dispatch with attribute sets built
once per launch shape.

``opentelemetry-api`` itself is imported on first need, not with vyre-async: an
SDK can only be installed by code that imports ``opentelemetry`` first, so until
``opentelemetry.trace`` or ``opentelemetry.metrics`` is in ``sys.modules`` (or
``OTEL_PYTHON_TRACER_PROVIDER``/``OTEL_PYTHON_METER_PROVIDER`` names a provider)
no dispatch can be recorded, and a process that never traces never pays the
import for its dispatches. The arm graph (`vyre_async.ArmGraph`) and the ``ray``
backend still import the API when they load.

The package's parts: ``_spans`` (the dispatch span, start to end, and the
attributes of a context), ``_metrics`` (counters, histograms, the in-process
sums), ``_prometheus`` (`prometheus_text`), ``_state`` (the switches and all
process-wide state, in one resettable object) and ``_otel_compat`` (every read
of OpenTelemetry's internals, checked against the releases it names).
"""

from vyre_async.telemetry._metrics import SECONDS_BUCKETS
from vyre_async.telemetry._prometheus import prometheus_text
from vyre_async.telemetry._spans import (
    PHASE_ATTRIBUTES,
    PHASES,
    SPAN_NAME,
    DispatchAttribute,
    DispatchTrace,
    current_dispatch_attributes,
    dispatch_attributes,
    finish_dispatch,
    is_recording,
    record_prefetch,
    start_dispatch,
)
from vyre_async.telemetry._state import (
    SWITCH_OFF,
    SWITCH_ON,
    TRACE_DETAILS,
    is_enabled,
    set_enabled,
    set_trace_detail,
    trace_detail,
)

__all__ = [
    "PHASES",
    "PHASE_ATTRIBUTES",
    "SECONDS_BUCKETS",
    "SPAN_NAME",
    "SWITCH_OFF",
    "SWITCH_ON",
    "TRACE_DETAILS",
    "DispatchAttribute",
    "DispatchTrace",
    "current_dispatch_attributes",
    "dispatch_attributes",
    "finish_dispatch",
    "is_enabled",
    "is_recording",
    "prometheus_text",
    "record_prefetch",
    "set_enabled",
    "set_trace_detail",
    "start_dispatch",
    "trace_detail",
]
