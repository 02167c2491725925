"""Benchmark the numpy reference engine against hand-written numpy doing the same work.

Each workload runs the engine (``vyre_reference.execute``, end to end: input
checks and copies, planning, execution) and a numpy *peer* alternately, one
pair per repeat, so both see the same machine state; the JSON reports the
median of each and the median of the per-repeat ratios.

    python benchmarks/reference.py [--repeats N] [--quick]

Targets (issue "Reference interpreter"): saxpy within 5x of ``a*x+y``,
histogram within 5x of ``np.bincount``, workgroup-memory sum within 20x of
``np.sum``, 256x256 tiled matmul under 2 s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

_ROOT = Path(__file__).resolve().parents[1]
for _path in (_ROOT / "src", _ROOT / "src" / "backends"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from vyre_async import programs  # noqa: E402
from vyre_reference import execute  # noqa: E402

N = 1 << 20
MATMUL = 256


def _time(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _interleave(
    engine: Callable[[], Any], peer: Callable[[], Any], repeats: int
) -> dict[str, float]:
    engine()  # warm up: compile, allocate
    peer()
    engine_s: list[float] = []
    peer_s: list[float] = []
    ratios: list[float] = []
    for _ in range(repeats):
        e = _time(engine)
        p = _time(peer)
        engine_s.append(e)
        peer_s.append(p)
        ratios.append(e / p)
    return {
        "engine_ms": round(statistics.median(engine_s) * 1e3, 3),
        "peer_ms": round(statistics.median(peer_s) * 1e3, 3),
        "median_ratio": round(statistics.median(ratios), 2),
    }


def _check(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], name: str) -> None:
    if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
        raise SystemExit(f"{name}: the engine's output differs from the oracle")


def bench_saxpy(rng: np.random.Generator, repeats: int) -> dict[str, Any]:
    """saxpy over 2**20 f32 versus ``a * x + y``."""
    workgroup = 1024
    program = programs.saxpy(N, workgroup=workgroup)
    x = rng.standard_normal(N).astype(np.float32)
    y = rng.standard_normal(N).astype(np.float32)
    alpha = np.array([1.5], np.float32)
    a = alpha[0]
    _check(execute(program, [x, y, alpha])[0], a * x + y, "saxpy")
    result = _interleave(lambda: execute(program, [x, y, alpha]), lambda: a * x + y, repeats)
    return {
        "params": {"n": N, "workgroup": workgroup},
        "peer": "a * x + y",
        "target_ratio": 5.0,
        **result,
        "met": result["median_ratio"] <= 5.0,
    }


def bench_histogram(rng: np.random.Generator, repeats: int) -> dict[str, Any]:
    """256-bin histogram of 2**20 u32 with atomics versus ``np.bincount``."""
    workgroup = 1024
    program = programs.histogram(bins=256, workgroup=workgroup)
    data = rng.integers(0, 2**32, size=N, dtype=np.uint32)
    hist = np.zeros(256, np.uint32)
    want = np.bincount(data % 256, minlength=256).astype(np.uint32)
    _check(execute(program, [data, hist])[0], want, "histogram")
    result = _interleave(
        lambda: execute(program, [data, hist]),
        lambda: np.bincount(data % 256, minlength=256),
        repeats,
    )
    return {
        "params": {"n": N, "bins": 256, "workgroup": workgroup},
        "peer": "np.bincount(x % 256, minlength=256)",
        "target_ratio": 5.0,
        **result,
        "met": result["median_ratio"] <= 5.0,
    }


def _tree_sums(x: np.ndarray[Any, Any], workgroup: int, items: int) -> np.ndarray[Any, Any]:
    """Per-workgroup sums in the kernel's order: items in order, then halving rounds."""
    lanes = x.reshape(-1, items, workgroup)
    acc = np.zeros((lanes.shape[0], workgroup), np.float32)
    for t in range(items):
        acc = acc + lanes[:, t, :]
    stride = workgroup // 2
    while stride:
        acc[:, :stride] = acc[:, :stride] + acc[:, stride : 2 * stride]
        stride //= 2
    return acc[:, 0].copy()


def bench_sum(rng: np.random.Generator, repeats: int) -> dict[str, Any]:
    """Sum of 2**20 f32 through workgroup memory versus ``np.sum``."""
    workgroup, items = 1024, 16
    program = programs.sum_reduction(N, workgroup=workgroup, items_per_lane=items)
    grid = (math.ceil(N / (workgroup * items)), 1, 1)
    x = rng.standard_normal(N).astype(np.float32)
    _check(execute(program, [x], grid_override=grid)[0], _tree_sums(x, workgroup, items), "sum")
    result = _interleave(
        lambda: execute(program, [x], grid_override=grid), lambda: np.sum(x), repeats
    )
    return {
        "params": {"n": N, "workgroup": workgroup, "items_per_lane": items, "grid": grid},
        "peer": "np.sum(x)",
        "target_ratio": 20.0,
        **result,
        "met": result["median_ratio"] <= 20.0,
    }


def bench_matmul(rng: np.random.Generator, repeats: int) -> dict[str, Any]:
    """Tiled 256x256x256 f32 matmul through workgroup memory (absolute time)."""
    tile = 16
    program = programs.tiled_matmul(MATMUL, MATMUL, MATMUL, tile=tile)
    a = rng.standard_normal(MATMUL * MATMUL).astype(np.float32)
    b = rng.standard_normal(MATMUL * MATMUL).astype(np.float32)
    dims = np.array([MATMUL] * 3, np.uint32)
    grid = (MATMUL // tile, MATMUL // tile, 1)
    am = a.reshape(MATMUL, MATMUL)
    bm = b.reshape(MATMUL, MATMUL)
    result = _interleave(
        lambda: execute(program, [a, b, dims], grid_override=grid),
        lambda: am @ bm,
        max(1, repeats // 4),
    )
    return {
        "params": {"m": MATMUL, "k": MATMUL, "n": MATMUL, "tile": tile, "grid": grid},
        "peer": "A @ B (BLAS; context only)",
        "target_seconds": 2.0,
        **result,
        "met": result["engine_ms"] < 2000.0,
    }


def main(argv: list[str] | None = None) -> int:
    """Run every benchmark and print one JSON document."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21, help="interleaved pairs per workload")
    parser.add_argument("--quick", action="store_true", help="5 repeats (smoke run)")
    args = parser.parse_args(argv)
    repeats = 5 if args.quick else max(1, args.repeats)
    rng = np.random.default_rng(2026)
    report = {
        "benchmark": "vyre_reference numpy engine vs hand-written numpy",
        "machine": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
        },
        "repeats": repeats,
        "saxpy": bench_saxpy(rng, repeats),
        "histogram": bench_histogram(rng, repeats),
        "sum": bench_sum(rng, repeats),
        "matmul": bench_matmul(rng, repeats),
    }
    report["all_met"] = all(
        report[k]["met"]  # type: ignore[index]
        for k in ("saxpy", "histogram", "sum", "matmul")
    )
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
