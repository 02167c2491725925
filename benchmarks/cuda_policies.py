"""GPU benchmark of the policies acting on the ``cupy`` backend; prints one JSON object.

The figures the policies issue asks for, each measured in this one run:

- **arm concurrency**: an arm graph of 4 independent arms of about 1 ms of
  device time each (one 64-lane workgroup spinning: one SM each), run on a
  backend with 4 streams versus the same graph on a backend with 1 stream.
  Concurrency factor = makespan on 1 stream / makespan on 4 streams (target
  at least 2.5x); also the sum of the arms' device times over the makespan.
- **copy/compute overlap**: a loop of ``upload(x_i)`` then a kernel reading the
  uploaded buffer, the kernel tuned to take about as long as one upload.
  Overlap fraction = (copies alone + kernels alone - pipelined loop) /
  min(copies alone, kernels alone) (target at least 0.7).
- **launch host cost**: per-kernel host cost of 100 repeats through
  ``pipeline.dispatch_batch`` as plain launches, CUDA graph replays and one
  persistent launch (every result checked; ratios to plain), the calibration
  and the policy's own verdict for that batch, next to bare CuPy launching a
  trivial kernel 100 times plainly and as one captured CUDA graph replayed.
- **first dispatch with and without prefetch**: a cycle of 3 programs on a
  pipeline cache of 2 (so every dispatch misses without prediction), each
  dispatch running about 0.3 s on the device; the time ``dispatch()`` takes to
  return after warm-up, with shape-prediction prefetch on and off.

Usage: ``python benchmarks/cuda_policies.py [--quick] [--output FILE]``. Exits
with status 2 and a message when no CUDA device is usable.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from vyre_async import ArmGraph, DispatchConfig
from vyre_async.ir import (
    Access,
    Assign,
    BufferDecl,
    DType,
    If,
    Let,
    Load,
    Loop,
    Program,
    Store,
    Var,
    gid,
    u32,
)

ARM_LANES = 64
PREFETCH_TAGS = (10, 11, 12)


def spin_arm(tag: int = 0) -> Program:
    """``acc = acc * 3 + i`` for ``i < spins[0]``, stored: one workgroup, as long as you like.

    A multiplicative recurrence: unlike ``acc += i`` the compiler cannot replace
    the loop by a closed form, so the device time grows with ``spins``.
    """
    return Program(
        [
            BufferDecl("spins", 0, Access.UNIFORM, DType.U32, 1),
            BufferDecl("out", 1, Access.WRITE, DType.U32, ARM_LANES),
        ],
        ARM_LANES,
        [
            Let("acc", u32(tag)),
            Loop(
                "i",
                u32(0),
                Load("spins", u32(0)),
                [Assign("acc", Var("acc") * u32(3) + Var("i"))],
            ),
            Store("out", gid(), Var("acc")),
        ],
        op_id=f"bench.spin{tag}",
    )


def consume() -> Program:
    """Read ``buf[gid]`` and churn on it ``spins[0]`` times; write only on an unlikely value."""
    return Program(
        [
            BufferDecl("buf", 0, Access.READ, DType.U32),
            BufferDecl("spins", 1, Access.UNIFORM, DType.U32, 1),
            BufferDecl("out", 2, Access.WRITE, DType.U32, 1),
        ],
        256,
        [
            Let("acc", Load("buf", gid())),
            Loop(
                "i",
                u32(0),
                Load("spins", u32(0)),
                [Assign("acc", Var("acc") * u32(3) + u32(1))],
            ),
            If(Var("acc").eq(u32(0x9E3779B9)), [Store("out", u32(0), Var("acc"))]),
        ],
        op_id="bench.consume",
    )


def benchmark_programs() -> list[Program]:
    """Every program this benchmark dispatches (the fake-device test builds them)."""
    from vyre_async._graph.schedule import _resident_variant

    arms = [spin_arm(tag) for tag in range(4)]
    cycle = [spin_arm(tag) for tag in PREFETCH_TAGS]
    return [*arms, *(_resident_variant(p) for p in arms), *cycle, consume()]


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def _spins(n: int) -> np.ndarray:
    return np.array([n], np.uint32)


def _device_time(backend: Any, program: Program, inputs: list[Any]) -> float:
    """Device time of one dispatch, from the backend's events."""
    pending = backend.dispatch(program, inputs)
    pending.result()
    timing = pending.timing
    assert timing is not None and timing.device_s is not None
    return float(timing.device_s)


def _tune(measure: Any, target_s: float, start: int, limit: int = 1 << 30) -> int:
    """Scale a spin count until ``measure(spins)`` is within 25 % of ``target_s``.

    Raises:
        RuntimeError: it did not converge (the kernel's time does not follow the
            spin count): every figure built on it would be wrong.
    """
    spins = start
    for _ in range(8):
        took = max(measure(spins), 1e-7)
        if 0.8 * target_s <= took <= 1.25 * target_s:
            return spins
        spins = int(min(limit, max(1, spins * target_s / took)))
    raise RuntimeError(
        f"could not tune a kernel to {target_s * 1e3:.3f} ms: {spins} spins took "
        f"{took * 1e3:.3f} ms"
    )


def arm_concurrency(repeats: int) -> dict[str, Any]:
    """4 independent ~1 ms arms: 4 streams versus 1."""
    from vyre_cupy import create_backend

    one, four = create_backend(disk_cache=None, streams=1), create_backend(disk_cache=None)
    spins = _tune(lambda n: _device_time(four, spin_arm(), [_spins(n)]), 1e-3, 20_000)
    arm_s = _median([_device_time(four, spin_arm(), [_spins(spins)]) for _ in range(5)])

    def graph() -> ArmGraph:
        g = ArmGraph(label="four-arms")
        g.resource("spins", "u32", 1, initial=_spins(spins))
        for tag in range(4):
            g.resource(f"out{tag}", "u32", ARM_LANES)
            g.arm(spin_arm(tag), {"spins": "spins", "out": f"out{tag}"}, label=f"arm{tag}")
        return g

    results: dict[str, Any] = {}
    for name, backend in (("streams_1", one), ("streams_4", four)):
        g = graph()
        anyio.run(g.run, backend)  # compile and warm up
        walls, ratios, streams = [], [], set()
        for _ in range(repeats):
            report = anyio.run(g.run, backend).report
            assert report.joins_on == "device" and report.layers == ((0, 1, 2, 3),)
            device = sum(a.device_s or 0.0 for a in report.arms)
            walls.append(report.wall_s)
            ratios.append(device / report.wall_s)
            streams |= {a.stream for a in report.arms}
        results[name] = {
            "makespan_ms": round(_median(walls) * 1e3, 3),
            "sum_device_over_makespan": round(_median(ratios), 2),
            "streams_used": sorted(s for s in streams if s is not None),
        }
        anyio.run(backend.shutdown)
    factor = results["streams_1"]["makespan_ms"] / results["streams_4"]["makespan_ms"]
    return {
        "arm_device_ms": round(arm_s * 1e3, 3),
        "spins": spins,
        **results,
        "concurrency_factor": round(factor, 2),
        "target": 2.5,
        "met": factor >= 2.5,
    }


def copy_overlap(iterations: int, elements: int) -> dict[str, Any]:
    """Pipelined upload + kernel loop versus copies alone and kernels alone."""
    import cupy

    from vyre_cupy import create_backend

    runtime = cupy.cuda.runtime
    backend = create_backend(disk_cache=None)
    n = max(256, elements // 256 * 256)
    data = [np.full(n, i, np.uint32) for i in range(iterations)]
    program = consume()
    grid = DispatchConfig(grid_override=(n // 256, 1, 1))
    resident = backend.upload(data[0])

    def copies() -> float:
        start = time.perf_counter()
        handles = [backend.upload(x) for x in data]
        runtime.deviceSynchronize()  # every copy finished (precise, no polling)
        took = time.perf_counter() - start
        for h in handles:
            backend.free(h)
        return took

    def one_upload() -> float:
        return copies() / iterations

    def kernel(spins: int) -> float:
        pending = backend.dispatch(program, [resident, _spins(spins)], grid)
        pending.result()
        assert pending.timing is not None and pending.timing.device_s is not None
        return float(pending.timing.device_s)

    copies()  # warm the pinned pool
    upload_s = _median([one_upload() for _ in range(3)])
    spins = _tune(kernel, upload_s, 64, limit=1 << 20)
    spin_in = _spins(spins)

    def kernels() -> float:
        start = time.perf_counter()
        pendings = [backend.dispatch(program, [resident, spin_in], grid) for _ in data]
        for p in pendings:
            p.result()
        return time.perf_counter() - start

    def pipelined() -> float:
        start = time.perf_counter()
        pendings, handles = [], []
        for x in data:
            handle = backend.upload(x)
            handles.append(handle)
            pendings.append(backend.dispatch(program, [handle, spin_in], grid))
        for p in pendings:
            p.result()
        took = time.perf_counter() - start
        for h in handles:
            backend.free(h)
        return took

    kernels()
    pipelined()
    rounds = [(copies(), kernels(), pipelined()) for _ in range(5)]
    c, k, p = (_median([r[i] for r in rounds]) for i in range(3))
    fraction = (c + k - p) / min(c, k)
    backend.free(resident)
    anyio.run(backend.shutdown)
    return {
        "iterations": iterations,
        "bytes_per_upload": 4 * n,
        "kernel_spins": spins,
        "copies_alone_ms": round(c * 1e3, 3),
        "kernels_alone_ms": round(k * 1e3, 3),
        "pipelined_ms": round(p * 1e3, 3),
        "overlap_fraction": round(fraction, 2),
        "target": 0.7,
        "met": fraction >= 0.7,
    }


def dispatch_batch_modes(repeats: int) -> dict[str, Any]:
    """Host cost per kernel of ``repeats`` launches through ``dispatch_batch`` in each mode.

    ``elementwise_xor(64)`` as plain launches, CUDA graph replays and one
    persistent launch (every result checked), plus the policy's own verdict
    for the batch from a fresh calibration.
    """
    import tempfile

    from vyre_async import CalibrationStore, calibration_for, compile
    from vyre_async._execution import choose_execution_mode
    from vyre_async.programs import elementwise_xor
    from vyre_cupy import create_backend

    backend = create_backend(disk_cache=None)
    pipeline = compile(backend, elementwise_xor(64))
    rng = np.random.default_rng(5)
    batch = [
        [rng.integers(0, 2**32, 64, dtype=np.uint32) for _ in range(2)] for _ in range(repeats)
    ]
    modes: dict[str, Any] = {}
    for mode in ("plain", "command_reuse", "persistent"):
        issue, total = [], []
        for _ in range(6):  # the first round warms up (and captures the graph)
            start = time.perf_counter()
            pendings = pipeline.dispatch_batch(batch, mode=mode)  # type: ignore[arg-type]
            issued = time.perf_counter() - start
            results = [p.result()[0] for p in pendings]
            total.append(time.perf_counter() - start)
            issue.append(issued / repeats)
            assert all(np.array_equal(r, a ^ b) for r, (a, b) in zip(results, batch, strict=True))
            ran = (pendings[0].record.attributes or {})["vyre.batch.mode"]
        modes[mode] = {
            "ran_as": ran,
            "host_us_per_kernel": round(_median(issue[1:]) * 1e6, 2),
            "batch_wall_ms": round(_median(total[1:]) * 1e3, 3),
        }
    with tempfile.TemporaryDirectory() as root:
        record = calibration_for(backend, measure=True, store=CalibrationStore(Path(root)))
    verdict = choose_execution_mode(
        backend, batch_size=repeats, repeats=repeats, calibration=record
    )
    anyio.run(backend.shutdown)
    plain_us = modes["plain"]["host_us_per_kernel"]
    return {
        "repeats": repeats,
        "vyre_dispatch_batch": modes,
        "vyre_replay_over_plain_host_cost": round(
            modes["command_reuse"]["host_us_per_kernel"] / plain_us, 3
        ),
        "vyre_persistent_over_plain_host_cost": round(
            modes["persistent"]["host_us_per_kernel"] / plain_us, 3
        ),
        "calibration": None if record is None else record.to_json(),
        "vyre_policy_verdict": verdict.span_attributes(),
    }


def launch_host_cost(repeats: int) -> dict[str, Any]:
    """`dispatch_batch_modes`, next to bare CuPy plain launches and one graph replay."""
    import cupy

    report = dispatch_batch_modes(repeats)
    kernel = cupy.RawKernel(
        'extern "C" __global__ void bump(unsigned* o) { o[threadIdx.x] += 1u; }', "bump"
    )
    out = cupy.zeros(64, cupy.uint32)
    stream = cupy.cuda.Stream(non_blocking=True)
    plain, replay, record = [], [], []
    with stream:
        kernel((1,), (64,), (out,))
        stream.synchronize()
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(repeats):
                kernel((1,), (64,), (out,))
            plain.append((time.perf_counter() - start) / repeats)
            stream.synchronize()
            start = time.perf_counter()
            stream.begin_capture()
            for _ in range(repeats):
                kernel((1,), (64,), (out,))
            graph = stream.end_capture()
            graph.upload(stream)
            record.append(time.perf_counter() - start)
            start = time.perf_counter()
            graph.launch(stream)
            replay.append((time.perf_counter() - start) / repeats)
            stream.synchronize()
    return {
        **report,
        "cupy_plain_us_per_kernel": round(_median(plain) * 1e6, 3),
        "cupy_graph_replay_us_per_kernel": round(_median(replay) * 1e6, 3),
        "cupy_graph_record_us": round(_median(record) * 1e6, 1),
    }


def prefetch_latency(rounds: int, device_s: float) -> dict[str, Any]:
    """dispatch() latency after warm-up on a 3-program cycle, prefetch on versus off."""
    from vyre_cupy import create_backend

    results: dict[str, Any] = {}
    programs = [spin_arm(tag) for tag in PREFETCH_TAGS]
    probe = create_backend(disk_cache=None)
    spins = _tune(lambda n: _device_time(probe, programs[0], [_spins(n)]), device_s, 1 << 20)
    anyio.run(probe.shutdown)
    spin_in = _spins(spins)
    for name, prefetch in (("prefetch_off", False), ("prefetch_on", True)):
        backend = create_backend(disk_cache=None, prefetch=prefetch, pipeline_cache_capacity=2)
        returns, compiles = [], []
        for k in range(4 + 3 * rounds):
            start = time.perf_counter()
            pending = backend.dispatch(programs[k % 3], [spin_in])
            returned = time.perf_counter() - start
            pending.result()
            if k >= 4:
                returns.append(returned)
                assert pending.timing is not None
                compiles.append(pending.timing.compile_s or 0.0)
        results[name] = {
            "dispatch_return_ms_median": round(_median(returns) * 1e3, 3),
            "dispatch_return_ms_max": round(max(returns) * 1e3, 3),
            "compile_waits": sum(c > 0 for c in compiles),
            "dispatches": len(returns),
        }
        if backend.prefetcher is not None:
            stats = backend.prefetcher.stats()
            results[name]["hit_rate"] = stats.hit_rate
        anyio.run(backend.shutdown)
    return {"device_s_per_dispatch": device_s, "spins": spins, **results}


def main(argv: list[str] | None = None) -> int:
    """Run every measurement and print (and optionally write) the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--output", help="also write the JSON report to this file")
    args = parser.parse_args(argv)
    spec = importlib.util.spec_from_file_location(
        "vyre_benchmark_cuda", Path(__file__).resolve().parent / "cuda_backend.py"
    )
    assert spec is not None and spec.loader is not None
    shared = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shared)  # its _probe and device_report
    _probe, device_report = shared._probe, shared.device_report

    reason = _probe()
    if reason is not None:
        print(
            f"benchmarks/cuda_policies.py: no GPU here ({reason}); every policy figure "
            "stays 'not yet verified on a GPU'",
            file=sys.stderr,
        )
        return 2
    report: dict[str, Any] = {"benchmark": "cuda_policies", **device_report()}
    report["arm_concurrency"] = arm_concurrency(5 if args.quick else 20)
    report["copy_overlap"] = copy_overlap(8 if args.quick else 16, 1 << 20)  # 4 MiB each
    report["launch_host_cost"] = launch_host_cost(100)
    report["prefetch"] = prefetch_latency(2 if args.quick else 4, 0.3)
    report["config"] = {"quick": args.quick}
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
