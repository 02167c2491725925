"""GPU benchmark of the ``cupy`` backend against bare CuPy; prints one JSON object.

Measures, in one run, each figure next to its peer measured the same way:

- **round trip**: warm ``await backend.dispatch`` of a 1024-element u32 xor
  (median, p90) vs the same generated kernel as a bare ``cupy.RawKernel``:
  launch + ``stream.synchronize()`` on resident device arrays, and the full
  bare round trip (``cupy.asarray`` inputs, launch, ``.get()``). Target: at
  most 1.5x the bare launch + sync. Also vs what async users write today
  without vyre: the same bare round trip with the wait as
  ``await asyncio.to_thread(stream.synchronize)`` (target: at least 2x faster).
- **throughput**: 64 concurrent tasks dispatching a 65536-element xor (768 KiB
  moved per dispatch: bound by the host link) and a 1024-element one (the
  dispatch rate), each vs one thread doing the same bare-CuPy round trips back
  to back.
- **compile**: a cold NVRTC compile vs a disk-cache hit, each in a fresh
  process whose CUDA context exists before the clock starts, vs CuPy's
  ``RawModule`` cold compile and its own cache hit.
- **saxpy 2^24**: device time of the generated kernel (CUDA events) and the
  round trip, vs CuPy's ``a * x + y`` on device arrays (events) and its
  round trip with transfers.

Usage: ``python benchmarks/cuda_backend.py [--quick] [--output FILE]``. Exits with
status 2 and a message when no CUDA device is usable (every GPU figure then
stays "not yet verified on a GPU").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import UTC, datetime
from typing import Any

import anyio
import numpy as np

from vyre_async.programs import elementwise_xor, saxpy


def _stats(samples: list[float]) -> dict[str, float]:
    us = sorted(s * 1e6 for s in samples)
    return {
        "median_us": round(statistics.median(us), 2),
        "p90_us": round(us[int(0.9 * (len(us) - 1))], 2),
        "min_us": round(us[0], 2),
        "samples": len(us),
    }


def _probe() -> str | None:
    try:
        import cupy
    except Exception as exc:
        return f"CuPy is not importable ({type(exc).__name__}: {exc})"
    try:
        if int(cupy.cuda.runtime.getDeviceCount()) < 1:
            return "no CUDA device is visible"
    except Exception as exc:
        return f"no usable CUDA driver ({type(exc).__name__}: {exc})"
    return None


def device_report() -> dict[str, Any]:
    """Return device name, driver, CUDA runtime and CuPy versions."""
    import cupy

    rt = cupy.cuda.runtime
    props = rt.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return {
        "device": name,
        "compute_capability": f"{props['major']}.{props['minor']}",
        "driver_version": rt.driverGetVersion(),
        "runtime_version": rt.runtimeGetVersion(),
        "cupy_version": cupy.__version__,
        "numpy_version": np.__version__,
        "python": platform.python_version(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _bare_kernel(program: Any) -> Any:
    """The backend's generated kernel for ``program`` as a bare ``cupy.RawKernel``."""
    import cupy

    from vyre_cupy.codegen import generate
    from vyre_cupy.compile import NVRTC_OPTIONS

    return cupy.RawKernel(generate(program).source, "vyre_main", options=NVRTC_OPTIONS)


def round_trip(backend: Any, n: int) -> dict[str, Any]:
    """Warm round trip of a 1024-element xor: the backend vs bare CuPy."""
    import cupy

    size = 1024
    program = elementwise_xor(size)
    a = np.arange(size, dtype=np.uint32)
    b = np.full(size, 7, np.uint32)
    kernel = _bare_kernel(program)
    stream = cupy.cuda.Stream(non_blocking=True)
    lens = cupy.asarray(np.array([size, size, size], np.uint32))
    a_d, b_d, out_d = cupy.asarray(a), cupy.asarray(b), cupy.zeros(size, cupy.uint32)
    grid, block = ((size + 63) // 64, 1, 1), (64, 1, 1)

    async def ours() -> list[float]:
        samples = []
        for _ in range(100):
            await backend.dispatch(program, [a, b])
        for _ in range(n):
            start = time.perf_counter()
            await backend.dispatch(program, [a, b])
            samples.append(time.perf_counter() - start)
        return samples

    ours_async = anyio.run(ours)
    ours_sync = []
    for _ in range(n):
        start = time.perf_counter()
        backend.dispatch(program, [a, b]).result()
        ours_sync.append(time.perf_counter() - start)
    bare_launch, bare_trip = [], []
    for _ in range(100):
        kernel(grid, block, (a_d, b_d, out_d, lens), stream=stream)
    stream.synchronize()
    for _ in range(n):
        start = time.perf_counter()
        kernel(grid, block, (a_d, b_d, out_d, lens), stream=stream)
        stream.synchronize()
        bare_launch.append(time.perf_counter() - start)
    with stream:
        for _ in range(n):
            start = time.perf_counter()
            x, y = cupy.asarray(a), cupy.asarray(b)
            out = cupy.empty(size, cupy.uint32)
            kernel(grid, block, (x, y, out, lens), stream=stream)
            out.get(stream=stream)
            bare_trip.append(time.perf_counter() - start)

    async def to_thread_peer() -> list[float]:
        samples = []
        with stream:
            for i in range(n + 100):
                start = time.perf_counter()
                x, y = cupy.asarray(a), cupy.asarray(b)
                out = cupy.empty(size, cupy.uint32)
                kernel(grid, block, (x, y, out, lens), stream=stream)
                await asyncio.to_thread(stream.synchronize)
                out.get(stream=stream)
                if i >= 100:
                    samples.append(time.perf_counter() - start)
        return samples

    to_thread = asyncio.run(to_thread_peer())
    result = {
        "workload": "u32 xor, 1024 elements, workgroup 64",
        "backend_await": _stats(ours_async),
        "backend_result_sync": _stats(ours_sync),
        "peer_bare_rawkernel_launch_sync": _stats(bare_launch),
        "peer_bare_rawkernel_round_trip": _stats(bare_trip),
        "peer_round_trip_await_to_thread_synchronize": _stats(to_thread),
    }
    peer = result["peer_bare_rawkernel_round_trip"]["median_us"]
    result["ratio_await_vs_bare_round_trip"] = round(result["backend_await"]["median_us"] / peer, 3)
    result["ratio_await_vs_bare_launch_sync"] = round(
        result["backend_await"]["median_us"]
        / result["peer_bare_rawkernel_launch_sync"]["median_us"],
        3,
    )
    result["target_ratio"] = 1.5
    result["speedup_await_vs_to_thread_peer"] = round(
        result["peer_round_trip_await_to_thread_synchronize"]["median_us"]
        / result["backend_await"]["median_us"],
        3,
    )
    result["target_speedup_vs_to_thread_peer"] = 2.0
    return result


def throughput(backend: Any, seconds: float, size: int = 1 << 16) -> dict[str, Any]:
    """64 concurrent tasks vs a bare CuPy loop, round trips of a ``size``-element xor."""
    import cupy

    program = elementwise_xor(size)
    a = np.arange(size, dtype=np.uint32)
    b = np.full(size, 3, np.uint32)

    async def run() -> float:
        done = 0
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await backend.dispatch(program, [a, b])
                done += 1

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(64):
                tg.start_soon(worker)
        return done / (time.perf_counter() - start)

    anyio.run(run)  # warm: every stream's staging for this shape
    ours = anyio.run(run)
    kernel = _bare_kernel(program)
    lens = cupy.asarray(np.array([size, size, size], np.uint32))
    grid, block = ((size + 63) // 64, 1, 1), (64, 1, 1)
    done = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        x, y = cupy.asarray(a), cupy.asarray(b)
        out = cupy.empty(size, cupy.uint32)
        kernel(grid, block, (x, y, out, lens))
        out.get()
        done += 1
    peer = done / (time.perf_counter() - start)
    return {
        "workload": f"u32 xor, {size} elements per dispatch ({12 * size} bytes moved)",
        "backend_64_tasks_per_s": round(ours, 1),
        "peer_bare_cupy_loop_per_s": round(peer, 1),
        "ratio": round(ours / peer, 3),
    }


_COMPILE_CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    which, cache = sys.argv[1], sys.argv[2]
    os.environ["CUPY_CACHE_DIR"] = cache
    import cupy
    cupy.cuda.Device(0).use()
    cupy.cuda.runtime.free(0)  # the CUDA context exists before any timing starts
    if which == "vyre":
        from vyre_async import DiskPipelineCache
        from vyre_async.programs import standard_workloads
        from vyre_cupy import create_backend
        backend = create_backend(disk_cache=DiskPipelineCache(cache))
        program = next(w for w in standard_workloads() if w.name == "matmul").program
        start = time.perf_counter()
        pipeline = backend.compile(program)
        print(json.dumps({"seconds": time.perf_counter() - start, "source": pipeline.source}))
    else:
        from vyre_async.programs import standard_workloads
        from vyre_cupy.codegen import generate
        program = next(w for w in standard_workloads() if w.name == "matmul").program
        start = time.perf_counter()
        module = cupy.RawModule(code=generate(program).source, options=("--std=c++17",))
        module.get_function("vyre_main")
        print(json.dumps({"seconds": time.perf_counter() - start, "source": "cupy"}))
    """
)


def compile_times() -> dict[str, Any]:
    """Cold compile vs disk-cache hit, each in a fresh process, for vyre_cupy and CuPy."""

    def child(which: str, cache: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-c", _COMPILE_CHILD, which, cache],
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ),
        )
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))

    out: dict[str, Any] = {"workload": "std.matmul (tiled, shared memory, barriers)"}
    for which in ("vyre", "cupy"):
        with tempfile.TemporaryDirectory(prefix=f"{which}-cache-") as cache:
            cold = child(which, cache)
            warm = child(which, cache)
        out[which] = {
            "cold_compile_ms": round(cold["seconds"] * 1e3, 3),
            "disk_hit_ms": round(warm["seconds"] * 1e3, 3),
            "sources": [cold["source"], warm["source"]],
            "ratio_hit_over_cold": round(warm["seconds"] / cold["seconds"], 3),
        }
    out["target_ratio_hit_over_cold"] = 0.1
    return out


def saxpy_2_24(backend: Any, repeats: int) -> dict[str, Any]:
    """saxpy on 2^24 floats: device time and round trip vs CuPy ``a * x + y``."""
    import cupy

    n = 1 << 24
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    alpha = np.array([2.5], np.float32)
    program = saxpy(n)
    device, trips = [], []
    expected = alpha[0] * x + y
    for i in range(repeats + 2):
        start = time.perf_counter()
        pending = backend.dispatch(program, [x, y, alpha])
        out = pending.result()[0]
        if i >= 2:
            trips.append(time.perf_counter() - start)
            assert pending.timing is not None and pending.timing.device_s is not None
            device.append(pending.timing.device_s)
    assert out.tobytes() == expected.tobytes()
    x_d, y_d = cupy.asarray(x), cupy.asarray(y)
    a = np.float32(2.5)
    peer_device, peer_trip = [], []
    for i in range(repeats + 2):
        begin, end = cupy.cuda.Event(), cupy.cuda.Event()
        begin.record()
        z = a * x_d + y_d
        end.record()
        end.synchronize()
        if i >= 2:
            peer_device.append(cupy.cuda.get_elapsed_time(begin, end) / 1e3)
        del z
    for i in range(repeats + 2):
        start = time.perf_counter()
        (a * cupy.asarray(x) + cupy.asarray(y)).get()
        if i >= 2:
            peer_trip.append(time.perf_counter() - start)
    return {
        "workload": "saxpy, 2^24 f32 (128 MiB in: x and y; 64 MiB out)",
        "backend_kernel_device": _stats(device),
        "peer_cupy_a_x_plus_y_device": _stats(peer_device),
        "backend_round_trip": _stats(trips),
        "peer_cupy_round_trip_with_transfers": _stats(peer_trip),
        "ratio_device": round(statistics.median(device) / statistics.median(peer_device), 3),
        "ratio_round_trip": round(statistics.median(trips) / statistics.median(peer_trip), 3),
    }


def main(argv: list[str] | None = None) -> int:
    """Run every measurement and print (and optionally write) the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--output", help="also write the JSON report to this file")
    args = parser.parse_args(argv)
    reason = _probe()
    if reason is not None:
        print(
            f"benchmarks/cuda_backend.py: no GPU here ({reason}); every GPU figure stays "
            "'not yet verified on a GPU'",
            file=sys.stderr,
        )
        return 2
    from vyre_cupy import create_backend

    backend = create_backend(disk_cache=None)
    backend.dispatch_sync(elementwise_xor(8), [np.zeros(8, np.uint32)] * 2)  # warm up
    report: dict[str, Any] = {"benchmark": "cuda", **device_report()}
    report["round_trip"] = round_trip(backend, 300 if args.quick else 3000)
    report["throughput"] = throughput(backend, 1.0 if args.quick else 4.0)
    report["throughput_tiny"] = throughput(backend, 1.0 if args.quick else 3.0, size=1024)
    report["compile"] = compile_times()
    report["saxpy_2_24"] = saxpy_2_24(backend, 5 if args.quick else 20)
    streams = backend.executor.device_context.streams.size
    report["config"] = {"quick": args.quick, "streams": streams}
    anyio.run(backend.shutdown)
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
