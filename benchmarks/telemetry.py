"""Telemetry overhead per dispatch on a 64-lane program; prints one JSON object.

Three SDK set-ups, each in its own process (a tracer provider is global):

- ``no_sdk``: no OpenTelemetry SDK configured (the library default);
- ``sdk_noop``: SDK tracer and meter providers, a span processor that drops spans;
- ``sdk_batch``: SDK with a ``BatchSpanProcessor`` feeding an exporter that
  discards (the export work without network noise);
- ``sdk_sampled``: as ``sdk_batch`` with a 1 % ``ParentBased(TraceIdRatioBased)``
  sampler, the set-up docs/tracing.md recommends for production.

Inside each process, rounds alternate vyre telemetry off (`set_enabled(False)`,
the same as ``VYRE_TELEMETRY=off``: the baseline) and on, so machine noise hits
both alike (the order alternates between rounds, so what one mode leaves behind
— garbage, a batch export — lands on both). The added latency is the median
over rounds of on/off - 1, of the per-dispatch medians (``added_pct``) and of
the per-dispatch means (``added_mean_pct``, which also catches periodic costs
such as batch exports and garbage collection). The SDK
processes also time what the SDK itself charges for one bare span
(``tracer.start_span("x").end()``), the floor under any traced dispatch.

Target (issue 5): under 10 % added latency for ``no_sdk`` and ``sdk_noop``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys

WORKER = r"""
import json, statistics, sys, time, timeit
import numpy as np
mode, rounds, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if mode != "no_sdk":
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    sampled = mode == "sdk_sampled"
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.01)) if sampled else None)
    processor = SpanProcessor() if mode == "sdk_noop" else BatchSpanProcessor(Drop())
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider())
from vyre_async import acquire_backend, telemetry
from vyre_async.programs import elementwise_xor

backend = acquire_backend("reference")
program = elementwise_xor(64)
inputs = [np.arange(64, dtype=np.uint32), np.ones(64, np.uint32)]

def measure():
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        backend.dispatch(program, inputs).result()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6, statistics.fmean(samples) * 1e6

for enabled in (False, True):
    telemetry.set_enabled(enabled)
    for _ in range(500):
        backend.dispatch(program, inputs).result()
off, on = [], []
for r in range(rounds):
    for enabled in ((False, True) if r % 2 == 0 else (True, False)):  # alternate the order
        telemetry.set_enabled(enabled)
        (on if enabled else off).append(measure())
report = {
    "off_us": statistics.median(m for m, _ in off),
    "on_us": statistics.median(m for m, _ in on),
    "added_us": statistics.median(b[0] - a[0] for a, b in zip(off, on)),
    "added_pct": 100 * statistics.median(b[0] / a[0] - 1 for a, b in zip(off, on)),
    "added_mean_us": statistics.median(b[1] - a[1] for a, b in zip(off, on)),
    "added_mean_pct": 100 * statistics.median(b[1] / a[1] - 1 for a, b in zip(off, on)),
}
if mode != "no_sdk":
    tracer = trace.get_tracer("benchmark")
    bare = timeit.repeat(lambda: tracer.start_span("x").end(), number=5000, repeat=5)
    report["bare_span_us"] = min(bare) / 5000 * 1e6
print(json.dumps(report))
"""

MODES = ("no_sdk", "sdk_noop", "sdk_batch", "sdk_sampled")


def measure(mode: str, rounds: int, repeats: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", WORKER, mode, str(rounds), str(repeats)],
        env={**os.environ, "VYRE_TELEMETRY": "on"},
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


def _floor(result: dict[str, float]) -> dict[str, float]:
    if "bare_span_us" not in result:
        return {}
    return {"bare_sdk_span_us": round(result["bare_span_us"], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=10, help="off/on round pairs per mode")
    parser.add_argument("--repeats", type=int, default=1000, help="dispatches per round")
    args = parser.parse_args()
    results = {mode: measure(mode, args.rounds, args.repeats) for mode in MODES}
    system = f"{platform.system()} {platform.release()}"
    report = {
        "benchmark": "telemetry_overhead",
        "program": "xor, 64 lanes, reference backend, dispatch().result()",
        "baseline": "the same process with vyre telemetry off, rounds interleaved",
        "modes": {
            mode: {
                "off_us": round(r["off_us"], 2),
                "on_us": round(r["on_us"], 2),
                "added_us": round(r["added_us"], 2),
                "added_pct": round(r["added_pct"], 1),
                "added_mean_us": round(r["added_mean_us"], 2),
                "added_mean_pct": round(r["added_mean_pct"], 1),
                **_floor(r),
            }
            for mode, r in results.items()
        },
        "target_pct": {"no_sdk": 10, "sdk_noop": 10},
        "rounds": args.rounds,
        "repeats_per_round": args.repeats,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {system}, {os.cpu_count()} CPUs",
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
