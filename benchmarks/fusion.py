"""Fusion of tiny independent dispatches, and the grid-barrier programs, measured; prints JSON.

Two parts, each measured against its peer in the same run, interleaved round by
round (the machine is shared and noisy; figures are medians):

1. **fusion**: a ``dispatch_batch`` of N tiny independent dispatches (N = 4, 16,
   64; each item a 256-element u32 xor on its own inputs) run **fused** (one
   launch in which each workgroup range runs one member: ``fusion="force"``)
   against the same batch run **separately** (``fusion="disable"``: one launch
   per item, the executor's batch path), on the reference backend and on every
   other backend that starts here (``wgpu`` on lavapipe in CI: a CPU figure,
   labelled with its adapter). Time per batch from the call to the last result;
   the fused pipeline is compiled before timing (the policy counts that compile
   separately). Every member's outputs are checked against the separate run.
   Also recorded: what the policy decides on its own (``fusion="auto"``) with the
   backend's calibration.
2. **graph layers**: an `ArmGraph` whose one layer holds N independent arms of
   N *different* programs (u32 xors of 256 + 4i elements; each arm its own
   resources) run with ``fusion="force"`` against ``fusion="disable"``
   (``residency="host"``, which every backend has), on the same backends; time
   per ``graph.run``; outputs checked against the separate run.
3. **grid programs**: ``array_sum(n)`` against ``np.sum`` and
   ``exclusive_scan(n)`` against ``np.cumsum`` on the reference backend for n =
   10**4, 10**5, 10**6 (one dispatch each, awaited; outputs checked against the
   oracles of `vyre_async.programs`).

Usage: ``python benchmarks/fusion.py [--quick] [--rounds R] [--output FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import anyio
import numpy as np

from vyre_async import ArmGraph, GraphResult, VyreBackend, acquire_backend, calibration_for
from vyre_async.abc import measure_fusion_gain
from vyre_async.errors import BackendError
from vyre_async.ir import GridBarrier, Program
from vyre_async.programs import (
    array_sum,
    array_sum_oracle,
    elementwise_xor,
    exclusive_scan,
    exclusive_scan_oracle,
)

SIZES = (4, 16, 64)
GRID_SIZES = (10_000, 100_000, 1_000_000)
XOR_N = 256


def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e3, 4)


def _interleave(
    cases: dict[str, Callable[[], object]], rounds: int, warmup: int = 2
) -> dict[str, list[float]]:
    """Run every case once per round, in rotating order; return each case's times (s)."""
    for _ in range(warmup):
        for run in cases.values():
            run()
    times: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            cases[name]()
            times[name].append(time.perf_counter() - start)
    return times


def _backends() -> list[tuple[VyreBackend, str]]:
    found = [(acquire_backend("reference"), "numpy reference (CPU)")]
    try:
        wgpu = acquire_backend("wgpu")
    except BackendError as exc:
        print(f"# wgpu not measured: {str(exc).splitlines()[0]}")
    else:
        found.append((wgpu, wgpu.capabilities().device_name or "wgpu"))
    return found


def bench_fusion(backend: VyreBackend, device: str, rounds: int) -> dict[str, Any]:
    program = elementwise_xor(XOR_N)
    pipeline = backend.compile(program)
    rng = np.random.default_rng(7)
    calibration = calibration_for(backend, measure=True)
    out: dict[str, Any] = {
        "backend": backend.id,
        "device": device,
        "calibration": {
            "launch_ns": calibration.launch_ns if calibration else None,
            "compile_ns": calibration.compile_ns if calibration else None,
            "fusion_gain_bps": calibration.fusion_gain_bps if calibration else None,
        },
        # Measured here whether or not the backend has a calibration record.
        "measure_fusion_gain_bps": measure_fusion_gain(backend),
        "members": {},
    }
    for n in SIZES:
        batch = [
            [
                rng.integers(0, 2**32, XOR_N, dtype=np.uint32),
                rng.integers(0, 2**32, XOR_N, dtype=np.uint32),
            ]
            for _ in range(n)
        ]

        def run(fusion: str, batch: list[list[np.ndarray]] = batch) -> list[list[np.ndarray]]:
            pendings = pipeline.dispatch_batch(batch, fusion=fusion)
            return [p.result() for p in pendings]

        separate = run("disable")
        fused = run("force")
        for got, want in zip(fused, separate, strict=True):
            for a, b in zip(got, want, strict=True):
                if not np.array_equal(a, b):
                    raise SystemExit(f"{backend.id}: fused outputs differ from separate ones")
        auto = pipeline.dispatch_batch(batch, fusion="auto")
        for p in auto:
            p.result()
        verdict = auto[0].record.attributes or {}
        forced = pipeline.dispatch_batch(batch, fusion="force")
        for p in forced:
            p.result()
        fused_launches = (forced[0].record.attributes or {}).get("vyre.policy.fusion.launches")
        times = _interleave(
            {"fused": lambda: run("force"), "separate": lambda: run("disable")}, rounds
        )
        fused_ms, separate_ms = _median_ms(times["fused"]), _median_ms(times["separate"])
        out["members"][str(n)] = {
            "fused_ms": fused_ms,
            "separate_ms": separate_ms,
            "fused_per_member_us": round(fused_ms * 1e3 / n, 1),
            "separate_per_member_us": round(separate_ms * 1e3 / n, 1),
            "fused_launches": fused_launches,
            "speedup": round(separate_ms / fused_ms, 2),
            "auto_verdict": {
                k: v for k, v in verdict.items() if str(k).startswith("vyre.policy.fusion")
            },
        }
    return out


def bench_graph_layer(backend: VyreBackend, rounds: int) -> dict[str, Any]:
    rng = np.random.default_rng(11)
    out: dict[str, Any] = {"backend": backend.id, "arms": {}}
    for n in SIZES:
        graph = ArmGraph(label=f"bench-fusion-{n}")
        for i in range(n):
            size = XOR_N + 4 * i
            for name in ("a", "b"):
                graph.resource(
                    f"{name}{i}", "u32", size, initial=rng.integers(0, 2**32, size, np.uint32)
                )
            graph.resource(f"out{i}", "u32", size)
            graph.arm(elementwise_xor(size), {"a": f"a{i}", "b": f"b{i}", "out": f"out{i}"})

        def run(fusion: str, graph: ArmGraph = graph) -> GraphResult:
            async def go() -> GraphResult:
                return await graph.run(backend, residency="host", fusion=fusion)

            return anyio.run(go)

        separate, fused = run("disable"), run("force")
        for name, value in separate.outputs.items():
            if not np.array_equal(fused.outputs[name], value):
                raise SystemExit(
                    f"{backend.id}: a fused graph layer of {n} differs from separate arms in {name}"
                )
        verdict = fused.report.fusion[0]
        times = _interleave(
            {"fused": lambda run=run: run("force"), "separate": lambda run=run: run("disable")},
            rounds,
        )
        fused_ms, separate_ms = _median_ms(times["fused"]), _median_ms(times["separate"])
        out["arms"][str(n)] = {
            "fused_ms": fused_ms,
            "separate_ms": separate_ms,
            "fused_launches": None if verdict is None else verdict.launches,
            "speedup": round(separate_ms / fused_ms, 2),
        }
    return out


def _phases(program: Program) -> int:
    return 1 + sum(isinstance(s, GridBarrier) for s in program.body)


def _grid_case(
    backend: VyreBackend, n: int, rng: np.random.Generator, rounds: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    x = rng.standard_normal(n).astype(np.float32)
    u = rng.integers(0, 2**32, n, dtype=np.uint32)
    total_p, scan_p = array_sum(n), exclusive_scan(n)
    got = backend.dispatch_sync(total_p, [x])
    want = array_sum_oracle(x)
    if not all(
        np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(got, want, strict=True)
    ):
        raise SystemExit("array_sum differs from its oracle")
    if not np.array_equal(backend.dispatch_sync(scan_p, [u])[0], exclusive_scan_oracle(u)[0]):
        raise SystemExit("exclusive_scan differs from its oracle")
    times = _interleave(
        {
            "array_sum": lambda: backend.dispatch_sync(total_p, [x]),
            "np.sum": lambda: np.sum(x),
            "exclusive_scan": lambda: backend.dispatch_sync(scan_p, [u]),
            "np.cumsum": lambda: np.cumsum(u, dtype=np.uint32),
        },
        rounds,
    )

    def row(program: Program, ours: str, peer: str) -> dict[str, Any]:
        return {
            "phases": _phases(program),
            "vyre_ms": _median_ms(times[ours]),
            "numpy_ms": _median_ms(times[peer]),
            "ratio": round(statistics.median(times[ours]) / statistics.median(times[peer]), 1),
        }

    return row(total_p, "array_sum", "np.sum"), row(scan_p, "exclusive_scan", "np.cumsum")


def bench_grid_programs(rounds: int) -> dict[str, Any]:
    backend = acquire_backend("reference")
    rng = np.random.default_rng(11)
    out: dict[str, Any] = {"backend": "reference", "sum": {}, "scan": {}}
    for n in GRID_SIZES:
        out["sum"][str(n)], out["scan"][str(n)] = _grid_case(backend, n, rng, rounds)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21, help="interleaved rounds per case")
    parser.add_argument("--quick", action="store_true", help="5 rounds (smoke run)")
    parser.add_argument("--output", help="also write the JSON here")
    args = parser.parse_args(argv)
    rounds = 5 if args.quick else max(1, args.rounds)
    backends = _backends()
    report: dict[str, Any] = {
        "benchmark": "fusion of tiny dispatches, and the grid-barrier programs",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
        },
        "rounds": rounds,
        "fusion": [bench_fusion(b, device, rounds) for b, device in backends],
        "graph_layers": [bench_graph_layer(b, rounds) for b, _ in backends],
        "grid_programs": bench_grid_programs(rounds),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
