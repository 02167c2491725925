"""The main job: many concurrent tasks dispatching the standard programs.

Run with ``make demo``. It picks the best backend of this machine (the numpy
reference backend when no GPU is usable, and says so), checks every output
against an independent numpy oracle, and prints a summary.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time

import anyio
import numpy as np

from vyre_async import DispatchConfig, acquire_preferred_backend
from vyre_async.backend import VyreBackend
from vyre_async.ir import validate
from vyre_async.programs import Workload, standard_workloads


def describe(workloads: list[Workload]) -> None:
    print("standard programs:")
    for w in workloads:
        p = w.program
        status = "valid" if not validate(p) else "INVALID"
        buffers = ", ".join(f"{b.name}:{b.access.value}:{b.dtype.value}" for b in p.buffers)
        print(
            f"  {w.name:<10} {status}  fingerprint {p.fingerprint().hex()[:16]}  "
            f"{len(p.to_wire()):>5} wire bytes  workgroup {p.workgroup_size}  [{buffers}]"
        )


async def run(backend: VyreBackend, workloads: list[Workload], tasks: int, per_task: int) -> int:
    cases = []
    for seed, w in enumerate(workloads):
        inputs = w.inputs(seed)
        cases.append(
            (w, inputs, w.expected(inputs), DispatchConfig(grid_override=w.grid, label=w.name))
        )
    latencies: list[float] = []
    mismatches: list[str] = []

    async def worker(index: int) -> None:
        for k in range(per_task):
            w, inputs, expected, config = cases[(index + k) % len(cases)]
            start = time.perf_counter()
            outputs = await backend.dispatch(w.program, inputs, config)
            latencies.append(time.perf_counter() - start)
            for got, want in zip(outputs, expected, strict=True):
                if got.tobytes() != np.asarray(want, dtype=got.dtype).tobytes():
                    mismatches.append(w.name)

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(tasks):
            tg.start_soon(worker, i)
    wall = time.perf_counter() - start
    stats = backend.cache_stats()
    ms = sorted(x * 1e3 for x in latencies)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    print(f"\nbackend: {backend.id} ({backend.capabilities().device_name or 'device'})")
    print(f"dispatches: {len(latencies)} from {tasks} concurrent tasks in {wall:.2f} s")
    print(f"throughput: {len(latencies) / wall:,.0f} dispatches/s")
    print(f"latency:    p50 {statistics.median(ms):.2f} ms   p99 {p99:.2f} ms")
    print(f"pipelines:  {stats.entries} compiled, cache hits {stats.hits}, misses {stats.misses}")
    print(f"outputs:    {len(latencies) - len(mismatches)} match the numpy oracles byte for byte")
    if mismatches:
        print(f"MISMATCHES: {sorted(set(mismatches))}")
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--per-task", type=int, default=30)
    parser.add_argument("--trio", action="store_true", help="run on trio instead of asyncio")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    workloads = standard_workloads()
    describe(workloads)
    backend = acquire_preferred_backend(allow_reference=True)
    return anyio.run(
        run,
        backend,
        workloads,
        args.tasks,
        args.per_task,
        backend="trio" if args.trio else "asyncio",
    )


if __name__ == "__main__":
    sys.exit(main())
