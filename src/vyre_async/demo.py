"""The main job (``vyre-async demo``, ``make demo``): concurrent tasks dispatching.

Picks the best backend of this machine (the numpy reference backend when no
GPU is usable, and says so), runs many concurrent tasks that dispatch the
standard programs, checks every output against its independent numpy oracle,
and prints a summary: dispatches, throughput, p50/p99 latency, cache hits.
"""

from __future__ import annotations

import statistics
import time

import anyio
import numpy as np

from vyre_async._backend import VyreBackend
from vyre_async._config import DispatchConfig
from vyre_async._exports import public_dir as _public_dir
from vyre_async._registry import acquire_backend, acquire_preferred_backend
from vyre_async.ir import split_at_grid_barriers, validate
from vyre_async.programs import Workload, standard_workloads

__all__ = ["run_demo"]
__dir__ = _public_dir(__name__)


def describe(workloads: list[Workload]) -> None:
    print("standard programs:")
    width = max((len(w.name) for w in workloads), default=0)
    for w in workloads:
        p = w.program
        problems = validate(p)
        status = "valid" if not problems else "INVALID"
        phases = 1 if problems else len(split_at_grid_barriers(p))
        buffers = ", ".join(f"{b.name}:{b.access.value}:{b.dtype.value}" for b in p.buffers)
        print(
            f"  {w.name:<{width}} {status}  fingerprint {p.fingerprint().hex()[:16]}  "
            f"{len(p.to_wire()):>5} wire bytes  {phases} phase{'s' * (phases != 1)}  "
            f"workgroup {p.workgroup_size}  [{buffers}]"
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


def run_demo(
    *, tasks: int = 64, per_task: int = 30, use_trio: bool = False, backend_id: str | None = None
) -> int:
    """Describe the standard programs, run the workload and print the summary; return 0 if exact."""
    workloads = standard_workloads()
    describe(workloads)
    if backend_id is None:
        backend = acquire_preferred_backend(allow_reference=True)
    else:
        backend = acquire_backend(backend_id)
    return anyio.run(
        run, backend, workloads, tasks, per_task, backend="trio" if use_trio else "asyncio"
    )
