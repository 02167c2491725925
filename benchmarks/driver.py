"""Driver overhead on the reference backend; prints one JSON object.

Measures, in one run:
- warm ``await backend.dispatch`` round trip of a 64-lane xor (median, p90);
- the same work calling the engine directly (precompiled plan, no driver), and
  the driver's overhead over it;
- sustained throughput with 1, 8 and 64 concurrent tasks.

Targets (issue 4): round-trip median under 150 us; at least 6000 dispatches/s
with 64 tasks.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from typing import Any

import anyio
import numpy as np

from vyre_async import acquire_backend
from vyre_async._plan import normalize_inputs, plan_dispatch
from vyre_async.programs import elementwise_xor
from vyre_reference.compile import compile_program
from vyre_reference.engine import run_plan


def _stats(samples: list[float]) -> dict[str, float]:
    us = sorted(s * 1e6 for s in samples)
    return {
        "median_us": round(statistics.median(us), 2),
        "p90_us": round(us[int(0.9 * (len(us) - 1))], 2),
        "min_us": round(us[0], 2),
    }


async def round_trips(backend: Any, program: Any, inputs: list[np.ndarray], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await backend.dispatch(program, inputs)
        samples.append(time.perf_counter() - start)
    return samples


def direct_engine(program: Any, inputs: list[np.ndarray], n: int) -> list[float]:
    compiled = compile_program(program)
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        arrays = normalize_inputs(program, inputs)
        plan = plan_dispatch(program, [a.size for a in arrays])
        run_plan(plan, arrays, compiled=compiled)
        samples.append(time.perf_counter() - start)
    return samples


async def throughput(
    backend: Any, program: Any, inputs: list[np.ndarray], tasks: int, seconds: float
) -> float:
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await backend.dispatch(program, inputs)
            done += 1

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(tasks):
            tg.start_soon(worker)
    return done / (time.perf_counter() - start)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    backend = acquire_backend("reference")
    program = elementwise_xor(64)
    rng = np.random.default_rng(0)
    inputs = [rng.integers(0, 2**32, 64, dtype=np.uint32) for _ in range(2)]
    await round_trips(backend, program, inputs, 200)  # warm caches
    driver: list[float] = []
    engine: list[float] = []
    for _ in range(args.rounds):  # interleave the two so machine noise hits both alike
        driver += await round_trips(backend, program, inputs, args.repeats)
        engine += direct_engine(program, inputs, args.repeats)
    rates = {
        str(tasks): round(await throughput(backend, program, inputs, tasks, args.seconds))
        for tasks in (1, 8, 64)
    }
    d, e = _stats(driver), _stats(engine)
    return {
        "benchmark": "driver",
        "backend": backend.id,
        "program": "xor, 64 lanes",
        "round_trip": d,
        "engine_direct": e,
        "overhead_us": round(d["median_us"] - e["median_us"], 2),
        "overhead_ratio": round(d["median_us"] / e["median_us"], 2),
        "throughput_per_s": rates,
        "targets": {"round_trip_median_us": 150, "throughput_64_tasks_per_s": 6000},
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": f"{platform.machine()}, {platform.system()} {platform.release()}",
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=2.0)
    print(json.dumps(anyio.run(main, parser.parse_args())))
