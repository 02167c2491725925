"""What tracing and metrics add to a dispatch, beside what the OpenTelemetry SDK charges.

Prints one JSON object. Each SDK set-up runs in its own process (a tracer or
meter provider is global, installed once):

- ``no_sdk``: no OpenTelemetry SDK (the library default);
- ``tracer_noop``: an SDK tracer provider with a span processor that does nothing;
- ``tracer_batch``: an SDK tracer provider with a ``BatchSpanProcessor`` feeding an
  exporter that discards (the export work, without network noise);
- ``tracer_always_off``: an SDK tracer provider whose sampler drops every span;
- ``tracer_sampled``: ``ParentBased(TraceIdRatioBased(0.01))`` + the batch
  processor, the production set-up ``docs/tracing.md`` recommends, dispatches
  as roots (the ratio decides each);
- ``tracer_sampled_child``: the same, every dispatch under a request span that
  was not sampled (the 99 % case of a sampled service);
- ``meter``: an SDK meter provider (with an in-memory reader), no tracer provider;
- ``meter_tracer``: the meter provider and ``tracer_noop``'s tracer provider;
- ``tracer_noop_phases``: ``tracer_noop`` with ``VYRE_TRACE_DETAIL=phases`` (the
  phase child spans; reported, no goal).

The work is a warm 64-lane ``elementwise_xor`` on the reference backend,
``dispatch().result()`` (it runs inline, so nothing but the driver and the
engine is timed). Inside each process, rounds interleave, each sampling every
case ``--repeats`` times with one ``perf_counter`` pair per sample: the
dispatch with vyre's telemetry off (`set_enabled(False)`, the same as
``VYRE_TELEMETRY=off``) and on (the order alternating between rounds), and
the SDK's own floors in the same process: a bare span
(``tracer.start_span("x").end()``), a bare unsampled span (a tracer whose
sampler drops everything), the span vyre records for this dispatch made
directly (its launch attributes at start, its end-time attributes in one call:
what the SDK charges for the attributes themselves), the same span with its
launch attributes only (the contract's fixed keys known at launch, nothing at the
end: less than any conforming span costs), one histogram point with two labels and two points
without labels (the least the contract's two histograms can cost). Each floor
is also timed beside a dispatch (telemetry off, then the floor, minus the
dispatch alone): what the SDK call costs in place, after
the engine has run, which is well above its cost in a tight loop on this
machine. And vyre's own share: the dispatch with telemetry on and the SDK's
tracer and histograms replaced by stubs that do nothing (``vyre_own_us``).
Figures are medians over rounds of the per-round medians; a dispatch's
``added_us`` is the median over rounds of on minus off.

Goals (issue 15): ``tracer_noop`` adds <= 1.5x the bare span; ``tracer_always_off``
adds <= 3 us; ``no_sdk`` adds <= 1 us; ``meter`` adds <= 5 us.

    python benchmarks/telemetry.py [--rounds 15] [--repeats 1000]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

WORKER = r"""
import gc, json, statistics, sys, time
import numpy as np
mode, rounds, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tracing = mode.startswith("tracer") or mode == "meter_tracer"
metering = mode.startswith("meter")
if tracing or metering:
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    dropped = TracerProvider(sampler=ALWAYS_OFF).get_tracer("floor")
if tracing:
    sampler = {
        "tracer_always_off": ALWAYS_OFF,
        "tracer_sampled": ParentBased(TraceIdRatioBased(0.01)),
        "tracer_sampled_child": ParentBased(TraceIdRatioBased(0.01)),
    }.get(mode)
    provider = TracerProvider(sampler=sampler)
    batched = mode in ("tracer_batch", "tracer_sampled", "tracer_sampled_child")
    provider.add_span_processor(BatchSpanProcessor(Drop()) if batched else SpanProcessor())
    trace.set_tracer_provider(provider)
    floor_tracer = provider.get_tracer("floor")
    if mode == "tracer_sampled_child":  # every dispatch runs under a request not sampled
        from opentelemetry import context
        unsampled = trace.NonRecordingSpan(
            trace.SpanContext(0x1234, 0x5678, is_remote=False, trace_flags=trace.TraceFlags(0))
        )
        context.attach(trace.set_span_in_context(unsampled))
if metering:
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    metrics.set_meter_provider(meter_provider)
    floor_histogram = meter_provider.get_meter("floor").create_histogram("floor", unit="s")

from vyre_async import acquire_backend, telemetry
from vyre_async.programs import elementwise_xor
from vyre_async.telemetry._state import STATE

if tracing or metering:
    STATE.load_api()  # (a dispatch would load it on first look; the stubs need it now)

backend = acquire_backend("reference")
program = elementwise_xor(64)
inputs = [np.arange(64, dtype=np.uint32), np.ones(64, np.uint32)]

def dispatch():
    backend.dispatch(program, inputs).result()

class StubSpan:
    # Stands in for the SDK span: costs a Python call, records nothing.
    def __init__(self, recording):
        self.recording = recording
    def is_recording(self):
        return self.recording
    def set_attributes(self, attributes):
        pass
    def set_attribute(self, key, value):
        pass
    def end(self, end_time=None):
        pass

class StubTracer:
    def __init__(self, recording):
        self.span = StubSpan(recording)
    @property
    def sampler(self):  # the SDK tracer's: the same sampled-out short cut as unstubbed
        tracer = real[0]
        return getattr(getattr(tracer, "_real_tracer", None) or tracer, "sampler", None)
    def start_span(self, name, context=None, attributes=None, start_time=None, **_):
        return self.span

class StubHistogram:
    def record(self, value, attributes=None):
        pass

real = (STATE.tracer, STATE.latency, STATE.device)
stubs = (StubTracer(mode != "tracer_always_off"), StubHistogram(), StubHistogram())

def stubbed():
    STATE.tracer, STATE.latency, STATE.device = stubs
    try:
        dispatch()
    finally:
        STATE.tracer, STATE.latency, STATE.device = real

cases = {}  # the SDK's own floors, timed alone
beside = {}  # the same, each made beside a dispatch with vyre's telemetry off
if tracing:
    # The span vyre records for this dispatch, made directly: the same launch
    # attributes (docs/tracing.md), then the end-time ones in one call.
    start_attributes = {
        "vyre.backend.id": "reference", "vyre.program.op_id": program.op_id,
        "vyre.program.fingerprint": program.fingerprint().hex(),
        "vyre.launch.grid": (1, 1, 1), "vyre.launch.workgroup": (64, 1, 1),
        "vyre.bytes.in": 512, "vyre.bytes.out": 256, "vyre.pipeline.cache_hit": True,
    }
    end_attributes = {
        "vyre.device.time_s": 1e-5, "vyre.queue.time_s": 1e-6, "vyre.phase.launch_s": 1e-5,
        "vyre.prefetch.hit": True, "vyre.prefetch.hit_rate": 1.0,
    }
    def same_span():
        span = floor_tracer.start_span("vyre.dispatch", attributes=start_attributes)
        span.set_attributes(end_attributes)
        span.end()
    cases["bare_span"] = lambda: floor_tracer.start_span("x").end()
    # The launch attributes alone (the contract's fixed keys known at launch),
    # nothing at the end: the least a span carrying them can cost the SDK.
    cases["sdk_span_with_launch_attributes"] = lambda: floor_tracer.start_span(
        "vyre.dispatch", attributes=start_attributes
    ).end()
    cases["bare_unsampled_span"] = lambda: dropped.start_span("x").end()
    cases["sdk_span_with_vyres_attributes"] = same_span
elif metering:
    cases["bare_unsampled_span"] = lambda: dropped.start_span("x").end()
if metering:
    labels = {"vyre.backend.id": "reference", "vyre.program.op_id": "std.xor"}
    cases["histogram_point"] = lambda: floor_histogram.record(1e-5, labels)
    def two_points():
        floor_histogram.record(1e-5, labels)
        floor_histogram.record(1e-5, labels)
    def two_unlabelled_points():  # the least two histogram points can cost the SDK
        floor_histogram.record(1e-5)
        floor_histogram.record(1e-5)
    cases["two_unlabelled_histogram_points"] = two_unlabelled_points
for name, fn in list(cases.items()):
    if name not in ("histogram_point", "two_unlabelled_histogram_points"):
        beside[name] = (lambda fn=fn: (dispatch(), fn()))
if metering:
    beside["two_histogram_points"] = lambda: (dispatch(), two_points())
    beside["two_unlabelled_histogram_points"] = lambda: (dispatch(), two_unlabelled_points())

def sample(fn, n):
    samples = []
    clock = time.perf_counter
    for _ in range(n):
        start = clock()
        fn()
        samples.append(clock() - start)
    return statistics.median(samples) * 1e6, statistics.fmean(samples) * 1e6

for enabled in (False, True):  # warm: compile, caches, the launch shape's telemetry
    telemetry.set_enabled(enabled)
    for _ in range(500):
        dispatch()
off, on, own = [], [], []
floors = {name: [] for name in cases}
floors_beside = {name: [] for name in beside}
stub = tracing or metering
for r in range(rounds):
    for enabled in ((False, True) if r % 2 == 0 else (True, False)):
        telemetry.set_enabled(enabled)
        (on if enabled else off).append(sample(dispatch, repeats))
    telemetry.set_enabled(True)
    if stub:
        own.append(sample(stubbed, repeats)[0] - off[-1][0])
    telemetry.set_enabled(False)
    for name, fn in beside.items():
        floors_beside[name].append(sample(fn, repeats)[0] - off[-1][0])
    for name, fn in cases.items():
        floors[name].append(sample(fn, repeats)[0])
report = {
    "off_us": statistics.median(m for m, _ in off),
    "on_us": statistics.median(m for m, _ in on),
    "added_us": statistics.median(b[0] - a[0] for a, b in zip(off, on)),
    "added_mean_us": statistics.median(b[1] - a[1] for a, b in zip(off, on)),
    "floors_us": {name: statistics.median(v) for name, v in floors.items()},
    "floors_beside_a_dispatch_us": {k: statistics.median(v) for k, v in floors_beside.items()},
    "trace_detail": telemetry.trace_detail(),
}
if stub:
    report["vyre_own_us"] = statistics.median(own)
if metering:  # the metrics were recorded (a check, not a figure)
    data = reader.get_metrics_data()
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    report["metrics_seen"] = sorted(n for n in names if n.startswith("vyre."))
print(json.dumps(report))
"""

MODES = (
    "no_sdk",
    "tracer_noop",
    "tracer_batch",
    "tracer_always_off",
    "tracer_sampled",
    "tracer_sampled_child",
    "meter",
    "meter_tracer",
    "tracer_noop_phases",
)
#: Goals of issue 15: added µs, or a multiple of the bare span (``"x"``).
GOALS = {
    "no_sdk": (1.0, "us"),
    "tracer_noop": (1.5, "x bare_span"),
    "tracer_always_off": (3.0, "us"),
    "meter": (5.0, "us"),
}


def measure(mode: str, rounds: int, repeats: int) -> dict[str, object]:
    worker_mode = "tracer_noop" if mode == "tracer_noop_phases" else mode
    detail = "phases" if mode == "tracer_noop_phases" else "span"
    out = subprocess.run(
        [sys.executable, "-c", WORKER, worker_mode, str(rounds), str(repeats)],
        env={**os.environ, "VYRE_TELEMETRY": "on", "VYRE_TRACE_DETAIL": detail},
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"mode {mode} failed:\n{out.stderr}")
    result: dict[str, object] = json.loads(out.stdout)
    return result


def _summary(mode: str, raw: dict[str, object]) -> dict[str, object]:
    floors = {k: round(float(v), 2) for k, v in raw["floors_us"].items()}  # type: ignore[attr-defined]
    beside = {
        k: round(float(v), 2)
        for k, v in raw["floors_beside_a_dispatch_us"].items()  # type: ignore[attr-defined]
    }
    added = float(raw["added_us"])  # type: ignore[arg-type]
    out: dict[str, object] = {
        "off_us": round(float(raw["off_us"]), 2),  # type: ignore[arg-type]
        "on_us": round(float(raw["on_us"]), 2),  # type: ignore[arg-type]
        "added_us": round(added, 2),
        "added_mean_us": round(float(raw["added_mean_us"]), 2),  # type: ignore[arg-type]
        "floors_us": floors,
        "floors_beside_a_dispatch_us": beside,
        "trace_detail": raw["trace_detail"],
    }
    if "vyre_own_us" in raw:
        out["vyre_own_us"] = round(float(raw["vyre_own_us"]), 2)  # type: ignore[arg-type]
    if "bare_span" in floors:
        out["added_over_bare_span"] = round(added / floors["bare_span"], 2)
        out["added_over_bare_span_beside"] = round(added / beside["bare_span"], 2)
        same = floors["sdk_span_with_vyres_attributes"]
        out["sdk_span_with_vyres_attributes_over_bare_span"] = round(same / floors["bare_span"], 2)
        launch = floors["sdk_span_with_launch_attributes"]
        out["sdk_span_with_launch_attributes_over_bare_span"] = round(
            launch / floors["bare_span"], 2
        )
        out["sdk_span_with_launch_attributes_over_bare_span_beside"] = round(
            beside["sdk_span_with_launch_attributes"] / beside["bare_span"], 2
        )
    if "metrics_seen" in raw:
        out["metrics_seen"] = raw["metrics_seen"]
    goal = GOALS.get(mode)
    if goal is not None:
        limit, unit = goal
        value = added / floors["bare_span"] if unit.startswith("x") else added
        out["goal"] = f"<= {limit} {unit}"
        out["goal_met"] = value <= limit
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per mode")
    parser.add_argument("--repeats", type=int, default=1000, help="samples per case per round")
    parser.add_argument("--modes", nargs="*", choices=MODES, default=list(MODES))
    args = parser.parse_args()
    results = {m: _summary(m, measure(m, args.rounds, args.repeats)) for m in args.modes}
    import numpy
    import opentelemetry.sdk.version as sdk_version

    report = {
        "benchmark": "telemetry_overhead",
        "program": "xor, 64 lanes, reference backend, dispatch().result(), warm",
        "baseline": "the same process with vyre telemetry off, rounds interleaved",
        "modes": results,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "opentelemetry_sdk": sdk_version.__version__,
        "machine": f"{platform.machine()}, {platform.system()} {platform.release()}, "
        f"{os.cpu_count()} CPUs",
        "date": datetime.date.today().isoformat(),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
