"""Telemetry overhead per dispatch on a 64-lane program; prints one JSON object.

Modes, each measured in its own process (a tracer provider is global), rounds
interleaved so machine noise hits every mode alike:

- ``disabled``: vyre telemetry switched off (``VYRE_TELEMETRY=off``) — the baseline;
- ``no_sdk``: telemetry on, no OpenTelemetry SDK configured (the library default);
- ``sdk_noop``: SDK tracer and meter providers, a span processor that drops spans;
- ``sdk_batch``: SDK with a ``BatchSpanProcessor`` feeding an exporter that
  discards (the export work without network noise).

Target (issue 5): under 10 % added latency for ``no_sdk`` and ``sdk_noop``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

WORKER = r"""
import json, os, statistics, sys, time
import numpy as np
mode, repeats = sys.argv[1], int(sys.argv[2])
if mode in ("sdk_noop", "sdk_batch"):
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    processor = SpanProcessor() if mode == "sdk_noop" else BatchSpanProcessor(Drop())
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider())
from vyre_async import acquire_backend
from vyre_async.programs import elementwise_xor

backend = acquire_backend("reference")
program = elementwise_xor(64)
inputs = [np.arange(64, dtype=np.uint32), np.ones(64, np.uint32)]
for _ in range(500):
    backend.dispatch(program, inputs).result()
samples = []
for _ in range(repeats):
    start = time.perf_counter()
    backend.dispatch(program, inputs).result()
    samples.append(time.perf_counter() - start)
print(json.dumps({"median_us": statistics.median(samples) * 1e6}))
"""

MODES = ("disabled", "no_sdk", "sdk_noop", "sdk_batch")


def measure(mode: str, repeats: int) -> float:
    env = dict(os.environ)
    env["VYRE_TELEMETRY"] = "off" if mode == "disabled" else "on"
    out = subprocess.run(
        [sys.executable, "-c", WORKER, mode, str(repeats)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(out.stdout)["median_us"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3000)
    args = parser.parse_args()
    results: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            results[mode].append(measure(mode, args.repeats))
    base = statistics.median(results["disabled"])
    system = f"{platform.system()} {platform.release()}"
    machine = f"{platform.machine()}, {system}, {os.cpu_count()} CPUs"
    report = {
        "benchmark": "telemetry_overhead",
        "program": "xor, 64 lanes, reference backend, dispatch().result()",
        "median_us": {m: round(statistics.median(v), 2) for m, v in results.items()},
        "added_pct_vs_disabled": {
            m: round(100 * (statistics.median(v) - base) / base, 1)
            for m, v in results.items()
            if m != "disabled"
        },
        "rounds": args.rounds,
        "repeats_per_round": args.repeats,
        "target_pct": {"no_sdk": 10, "sdk_noop": 10},
        "python": platform.python_version(),
        "machine": machine,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
