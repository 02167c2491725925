"""The ``ray`` backend against its peers: bare Ray actor calls, and the local reference backend.

Prints one JSON object. Starts a local Ray cluster and a pool of ``--workers``
reference workers (timed: ``start_s``), and as many actors of the same kind,
options and placement that only hand back ``a ^ b`` (Ray's own floor for one
call of the same size), called in turn. Then, in ``--rounds`` interleaved rounds:

- **round trip**: sequential ``await backend.dispatch(...)`` of a warm
  ``elementwise_xor(--n)`` on the pool, against ``await echo.remote(a, b)``
  (bare Ray, the same arrays) and against the same dispatch on the local
  reference backend; p50 and p99 per round;
- **throughput**: ``--tasks`` tasks dispatching ``--per-task`` each, the same
  three ways, dispatches (or calls) per second;
- **large**: one dispatch of ``elementwise_xor`` over two ``--large-mib`` MiB
  inputs and an output of the same size, pool against local reference.

Every output is checked against numpy. Figures are medians over rounds. At the
end the cluster is shut down and every one of its processes still alive is
SIGKILLed by pid (`tests/ray_cluster.py`).

    python benchmarks/ray_pool.py [--rounds 5] [--workers 2] [--tasks 64] [--per-task 40]
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np

ROOT = Path(__file__).resolve().parents[1]


class Echo:
    """An async actor that hands its arguments back: a Ray call with no vyre in it."""

    async def echo(self, a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
        return [a ^ b]


def _percentile(samples: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples), q))


async def _round_trips(call: Any, count: int) -> tuple[float, float]:
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - start)
    return _percentile(samples, 50) * 1e3, _percentile(samples, 99) * 1e3


async def _throughput(call: Any, tasks: int, per_task: int) -> float:
    async def worker() -> None:
        for _ in range(per_task):
            await call()

    start = time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(tasks):
            group.start_soon(worker)
    return tasks * per_task / (time.perf_counter() - start)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from vyre_async import acquire_backend
    from vyre_async.programs import elementwise_xor
    from vyre_ray import local_backend

    start = time.perf_counter()
    pool = local_backend(workers=args.workers, inner="reference")
    start_s = time.perf_counter() - start
    local = acquire_backend("reference")
    echoes: list[Any] = [
        ray.remote(Echo)
        .options(num_cpus=0, max_concurrency=1000, scheduling_strategy="SPREAD")
        .remote()
        for _ in range(args.workers)
    ]
    turn = itertools.count()

    n = args.n
    program = elementwise_xor(n)
    a = np.arange(n, dtype=np.uint32)
    b = np.full(n, 0x5A5A5A5A, dtype=np.uint32)
    want = a ^ b

    async def on_pool() -> None:
        (out,) = await pool.dispatch(program, [a, b])
        assert np.array_equal(out, want)

    async def on_local() -> None:
        (out,) = await local.dispatch(program, [a, b])
        assert np.array_equal(out, want)

    async def on_ray() -> None:
        (out,) = await echoes[next(turn) % len(echoes)].echo.remote(a, b)
        assert np.array_equal(out, want)

    cases = {"vyre_ray": on_pool, "bare_ray": on_ray, "local_reference": on_local}
    for call in cases.values():  # warm: workers compile, Ray's paths, caches
        for _ in range(50):
            await call()

    big_n = args.large_mib * (1 << 20) // 4
    big = elementwise_xor(big_n)
    big_a = np.arange(big_n, dtype=np.uint32)
    big_b = np.full(big_n, 0xA5A5A5A5, dtype=np.uint32)
    big_want = big_a ^ big_b

    async def large(backend: Any) -> float:
        begin = time.perf_counter()
        (out,) = await backend.dispatch(big, [big_a, big_b])
        seconds = time.perf_counter() - begin
        assert np.array_equal(out, big_want)
        return seconds * 1e3

    await large(pool)  # warm: the workers compile the large program
    await large(local)

    p50: dict[str, list[float]] = {k: [] for k in cases}
    p99: dict[str, list[float]] = {k: [] for k in cases}
    rate: dict[str, list[float]] = {k: [] for k in cases}
    large_ms: dict[str, list[float]] = {"vyre_ray": [], "local_reference": []}
    for r in range(args.rounds):
        order = list(cases) if r % 2 == 0 else list(reversed(cases))
        for name in order:
            lo, hi = await _round_trips(cases[name], args.round_trips)
            p50[name].append(lo)
            p99[name].append(hi)
        for name in order:
            rate[name].append(await _throughput(cases[name], args.tasks, args.per_task))
        for name, backend in (("vyre_ray", pool), ("local_reference", local)):
            large_ms[name].append(await large(backend))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    await pool.aclose()
    await local.aclose()
    for echo in echoes:
        ray.kill(echo)

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 3)

    p50_ms = {k: median(v) for k, v in p50.items()}
    rates = {k: round(statistics.median(v)) for k, v in rate.items()}
    return {
        "start_s": round(start_s, 2),
        "round_trip_p50_ms": p50_ms,
        "round_trip_p99_ms": {k: median(v) for k, v in p99.items()},
        "dispatches_per_s": rates,
        "large_ms": {k: median(v) for k, v in large_ms.items()},
        "vyre_ray_over_bare_ray": {
            "round_trip_p50": round(p50_ms["vyre_ray"] / p50_ms["bare_ray"], 2),
            "throughput": round(rates["vyre_ray"] / rates["bare_ray"], 2),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--workers", type=int, default=2, help="workers in the pool")
    parser.add_argument("--n", type=int, default=64, help="elements of the small dispatch")
    parser.add_argument("--round-trips", type=int, default=300, help="sequential calls per round")
    parser.add_argument("--tasks", type=int, default=64, help="concurrent tasks")
    parser.add_argument("--per-task", type=int, default=40, help="calls per task per round")
    parser.add_argument("--large-mib", type=int, default=16, help="MiB per input of the large one")
    args = parser.parse_args()
    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    sys.path.insert(0, str(ROOT))  # tests/ray_cluster.py ends the cluster by pid
    from tests import ray_cluster

    try:
        results = anyio.run(run, args)
    finally:
        killed = ray_cluster.end_cluster()
    import ray

    report = {
        "benchmark": "ray_pool",
        "program": f"elementwise_xor, {args.n} u32 lanes; large: 2 x {args.large_mib} MiB in, "
        f"{args.large_mib} MiB out",
        "pool": f"{args.workers} local reference workers, one machine",
        "peers": f"bare_ray: {args.workers} async Ray actors returning a ^ b, called in turn, "
        "same arrays and actor options; local_reference: the reference backend in this process",
        **results,
        "rounds": args.rounds,
        "round_trips_per_round": args.round_trips,
        "tasks": args.tasks,
        "per_task": args.per_task,
        "killed_after_shutdown": len(killed),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "numpy": np.__version__,
        "machine": f"{platform.machine()}, {platform.system()} {platform.release()}, "
        f"{os.cpu_count()} CPUs",
        "date": datetime.date.today().isoformat(),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
