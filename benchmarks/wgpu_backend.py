"""The ``wgpu`` backend against bare wgpu-py on the same adapter; prints one JSON object.

Every figure here is a **lavapipe (Mesa's CPU Vulkan driver) figure, not a GPU
figure**: the adapter is printed in the report (``adapter``: device,
backend_type, adapter_type). The peer is bare wgpu-py as a competent user
writes it, in the same process, on its own device of the same adapter:
buffers, pipeline and bind group made once and reused; each round trip writes
the inputs with ``queue.write_buffer``, clears the output buffer, runs one
compute pass, copies the outputs into one ``MAP_READ`` buffer, submits, then
``map_sync``, reads and unmaps. The peer runs **the very WGSL the backend
runs** (`vyre_wgpu.codegen.generate` with the executor's loop-guard setting,
bound as the executor binds it: storage buffers at bindings ``0..k-1``, then
the ``vy_info`` uniform block, then ``vy_status``/``vy_state`` where the shader
has them); for the xor that is the same source as ``generate(program,
loop_guard=False)`` (checked). Outputs of both are checked equal.

Measured, in one run, each case interleaved with its peer in rounds (the
machine is shared and noisy; figures are medians of the per-round figures):

1. **round trip**: warm ``await backend.dispatch`` of a 64-element u32 xor
   (median, p90) vs the bare synchronous round trip. Goal: at most 1.2x bare.
   Also ``pipeline.dispatch`` (no pipeline lookup) and, as the floor of any
   design that keeps the loop free, the bare round trip on a worker thread
   handing its result back with ``call_soon_threadsafe``.
2. **throughput**: 64 asyncio tasks each awaiting N dispatches of the same xor
   (each task its own inputs), dispatches per second, vs bare doing as many
   round trips back to back in one thread. Goal: at least 0.9x bare.
3. **batch**: a 16-dispatch ``dispatch_batch`` (one command buffer, one
   submit) vs 16 awaited dispatches one after another, vs 16 issued at once,
   vs bare 16 submits, vs bare one submit of 16 passes; time per dispatch.
4. **compile**: in this process (Mesa's shader cache in a fresh directory):
   a program never seen (an xor with a new constant) ``backend.compile`` plus
   its first dispatch (lavapipe compiles the LLVM code at the first dispatch)
   vs bare wgpu-py (module, pipeline, buffers, first round trip) on another
   new constant; memory-cache hits; a disk-cache hit in a fresh backend on the
   same ``DiskPipelineCache`` directory. In fresh processes (the device made
   before the clock starts; ``MESA_SHADER_CACHE_DIR`` is read when the device
   is created): vyre disk cache cold/warm x Mesa cache cold/warm, and bare
   with Mesa cold/warm, for the xor and (not with ``--quick``) for ``std.matmul``
   (a bigger shader).
5. **loop responsiveness**: a 1 ms asyncio ticker (``await asyncio.sleep(0.001)``
   in a loop) while a ~50 ms ``spin`` dispatch runs (``out[l] = sum(range(n))``
   per lane, n a runtime input; lanes picked here so one dispatch takes
   ~50 ms): ticks seen / (duration / 1 ms), vs the same bare dispatch called on
   the event loop thread (which blocks it), vs the same bare dispatch through
   ``asyncio.to_thread`` (what a loop-friendly bare user writes), vs the ticker
   on an idle loop (the ceiling: a 1 ms sleep lasts a little longer than 1 ms).
   Goal: >= 0.8.

Also recorded (``diagnostics``): where the executor's time goes (its device
thread's `_run_job` per dispatch, buffer sets made by `_bind`), and what the
lavapipe loop guard costs (the spin kernel with and without it, bare).

Usage: ``python benchmarks/wgpu_backend.py [--quick] [--output FILE]``. Exits with status
2 and a message when wgpu-py or a Vulkan adapter is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from vyre_async import DiskPipelineCache, DispatchConfig, __version__
from vyre_async.ir import (
    Access,
    Assign,
    BufferDecl,
    BufLen,
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
from vyre_async.programs import elementwise_xor, standard_workloads

N = 64
#: Spin iterations per lane: under the executor's slice budget on lavapipe (8 066
#: loop-bound tests per lane per launch), so a spin dispatch is one launch.
SPIN_N = 8_000
SPIN_TARGET_S = 0.050
TICK_S = 0.001


# Programs -----------------------------------------------------------------------------


def xor_const(n: int, k: int) -> Program:
    """``out[i] = a[i] ^ b[i] ^ k``: a program never seen before for each new ``k``."""
    i = Var("i")
    return Program(
        [
            BufferDecl("a", 0, Access.READ, DType.U32),
            BufferDecl("b", 1, Access.READ, DType.U32),
            BufferDecl("out", 2, Access.WRITE, DType.U32, n),
        ],
        64,
        [
            Let("i", gid()),
            If(
                i.lt(BufLen("out")),
                [Store("out", i, Load("a", i) ^ Load("b", i) ^ u32(k))],
            ),
        ],
        op_id="bench.xor_const",
    )


def spin(lanes: int, workgroup: int = 8) -> Program:
    """``out[l] = sum(range(n[l]))`` per lane (``_spin`` of tests/wgpu, wider workgroups)."""
    return Program(
        [
            BufferDecl("n", 0, Access.READ, DType.U32, lanes),
            BufferDecl("out", 1, Access.WRITE, DType.U32, lanes),
        ],
        workgroup,
        [
            Let("acc", u32(0)),
            Loop("i", u32(0), Load("n", gid(0)), [Assign("acc", Var("acc") + Var("i"))]),
            Store("out", gid(0), Var("acc")),
        ],
        op_id="bench.spin",
    )


def matmul_workload() -> tuple[Program, list[np.ndarray], tuple[int, int, int]]:
    work = next(w for w in standard_workloads() if w.name == "matmul")
    assert work.grid is not None
    grid = (int(work.grid[0]), int(work.grid[1]), int(work.grid[2]))
    return work.program, work.make_inputs(np.random.default_rng(0)), grid


# Bare wgpu-py -------------------------------------------------------------------------


def shader_of(program: Program, *, guarded: bool, slice_budget: int) -> Any:
    from vyre_wgpu.codegen import generate

    return generate(program, loop_guard=guarded, slice_budget=slice_budget)


class Bare:
    """One program on bare wgpu-py: everything made once, one round trip per `run`.

    Binds ``shader`` as the executor does (`WgpuExecutor._compile`, ``plan_shape``,
    ``_bind``): storage buffers at ``0..k-1``, ``vy_info`` (element counts, then
    the ``base`` and ``grid`` vec4s), then ``vy_status`` and ``vy_state`` when the
    shader declares them. ``copies`` buffer sets are made, for `run_many`.
    """

    def __init__(
        self,
        device: Any,
        program: Program,
        shader: Any,
        inputs: Sequence[np.ndarray],
        *,
        grid: tuple[int, int, int] | None = None,
        copies: int = 1,
    ) -> None:
        import wgpu

        self.wgpu = wgpu
        self.device = device
        self.queue = device.queue
        usage = wgpu.BufferUsage
        storage = usage.STORAGE | usage.COPY_DST | usage.COPY_SRC
        module = device.create_shader_module(code=shader.source)
        entries = []
        for binding in shader.bindings:
            kind = (
                wgpu.BufferBindingType.read_only_storage
                if binding.decl.access in (Access.READ, Access.UNIFORM)
                else wgpu.BufferBindingType.storage
            )
            entries.append(
                {
                    "binding": binding.index,
                    "visibility": wgpu.ShaderStage.COMPUTE,
                    "buffer": {"type": kind},
                }
            )
        extra = [
            (shader.info_binding, wgpu.BufferBindingType.uniform),
            (shader.status_binding, wgpu.BufferBindingType.storage),
            (shader.state_binding, wgpu.BufferBindingType.storage),
        ]
        for index, kind in extra:
            if index is not None:
                entries.append(
                    {
                        "binding": index,
                        "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": kind},
                    }
                )
        group_layout = device.create_bind_group_layout(entries=entries)
        layout = device.create_pipeline_layout(bind_group_layouts=[group_layout])
        wx, wy, wz = program.workgroup_size
        self.pipeline = device.create_compute_pipeline(
            layout=layout,
            compute={
                "module": module,
                "entry_point": "vyre_main",
                "constants": {"vy_wx": wx, "vy_wy": wy, "vy_wz": wz},
            },
        )
        # Element counts as the plan makes them: inputs by their size, outputs declared.
        counts: dict[str, int] = {}
        given = iter(inputs)
        for decl in program.buffers:
            if decl.access is Access.WORKGROUP:
                continue
            counts[decl.name] = len(next(given)) if decl.access.is_input else int(decl.count or 0)
        if grid is None:
            n = max(counts[d.name] for d in program.buffers if d.access.is_output)
            grid = (math.ceil(n / wx), 1, 1)
        self.grid = grid
        lens = [counts[b.name] for b in shader.bindings]
        words = np.zeros(shader.info_words, np.uint32)
        words[: len(lens)] = lens
        words[shader.info_words - 4 : shader.info_words - 1] = grid
        info = device.create_buffer_with_data(data=words.tobytes(), usage=usage.UNIFORM)
        self.input_slots = [b.index for b in shader.bindings if b.decl.access.is_input]
        self.clear_slots = [b.index for b in shader.bindings if b.decl.access is Access.WRITE]
        self.outputs = [
            (b.index, 4 * counts[b.name], b.decl.dtype.numpy)
            for b in shader.bindings
            if b.decl.access.is_output
        ]
        self.readback_bytes = sum(nbytes for _, nbytes, _ in self.outputs)
        self.sets = []
        for _ in range(copies):
            buffers = [device.create_buffer(size=max(4, 4 * n), usage=storage) for n in lens]
            group_entries = [
                {"binding": b.index, "resource": {"buffer": buffers[b.index]}}
                for b in shader.bindings
            ]
            group_entries.append({"binding": shader.info_binding, "resource": {"buffer": info}})
            self.status = None
            if shader.status_binding is not None:
                self.status = device.create_buffer(size=4, usage=storage)
                group_entries.append(
                    {"binding": shader.status_binding, "resource": {"buffer": self.status}}
                )
            if shader.state_binding is not None:  # 16 bytes: the executor's unsliced first try
                state = device.create_buffer(size=16, usage=storage)
                group_entries.append(
                    {"binding": shader.state_binding, "resource": {"buffer": state}}
                )
            group = device.create_bind_group(layout=group_layout, entries=group_entries)
            readback = device.create_buffer(
                size=self.readback_bytes, usage=usage.MAP_READ | usage.COPY_DST
            )
            self.sets.append((buffers, group, readback, self.status))

    def _record(self, encoder: Any, which: int, inputs: Sequence[np.ndarray]) -> None:
        buffers, group, readback, status = self.sets[which]
        for slot, data in zip(self.input_slots, inputs, strict=True):
            self.queue.write_buffer(buffers[slot], 0, data)
        for slot in self.clear_slots:
            encoder.clear_buffer(buffers[slot])
        if status is not None:
            encoder.clear_buffer(status)
        compute = encoder.begin_compute_pass()
        compute.set_pipeline(self.pipeline)
        compute.set_bind_group(0, group)
        compute.dispatch_workgroups(*self.grid)
        compute.end()
        offset = 0
        for slot, nbytes, _ in self.outputs:
            encoder.copy_buffer_to_buffer(buffers[slot], 0, readback, offset, nbytes)
            offset += nbytes

    def _collect(self, which: int) -> list[np.ndarray]:
        readback = self.sets[which][2]
        readback.map_sync(self.wgpu.MapMode.READ)
        raw = np.frombuffer(readback.read_mapped(copy=True), np.uint8)
        readback.unmap()
        out, offset = [], 0
        for _, nbytes, dtype in self.outputs:
            out.append(raw[offset : offset + nbytes].view(dtype))
            offset += nbytes
        return out

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One round trip: write, clear, one pass, copy out, submit, map, read, unmap."""
        encoder = self.device.create_command_encoder()
        self._record(encoder, 0, inputs)
        self.queue.submit([encoder.finish()])
        return self._collect(0)

    def run_many(self, batch: Sequence[Sequence[np.ndarray]]) -> list[list[np.ndarray]]:
        """``len(batch)`` launches in one command buffer and one submit (needs as many copies)."""
        encoder = self.device.create_command_encoder()
        for which, inputs in enumerate(batch):
            self._record(encoder, which, inputs)
        self.queue.submit([encoder.finish()])
        return [self._collect(which) for which in range(len(batch))]


# Helpers ------------------------------------------------------------------------------


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 2)


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def _p90(samples: Sequence[float]) -> float:
    ordered = sorted(samples)
    return ordered[int(0.9 * (len(ordered) - 1))]


def _rounds(
    rounds: int, cases: dict[str, Callable[[], Awaitable[Any]]]
) -> Callable[[], Awaitable[dict[str, list[Any]]]]:
    """Run every case once per round, the order rotated each round; results per case."""

    async def run() -> dict[str, list[Any]]:
        names = list(cases)
        results: dict[str, list[Any]] = {name: [] for name in names}
        for r in range(rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                results[name].append(await cases[name]())
        return results

    return run


def adapter_report(backend: Any) -> dict[str, Any]:
    import wgpu

    info = backend.executor.adapter_info
    return {
        "device": info.get("device"),
        "description": info.get("description"),
        "backend_type": info.get("backend_type"),
        "adapter_type": info.get("adapter_type"),
        "note": "lavapipe (CPU) figures, not GPU figures"
        if info.get("adapter_type") == "CPU"
        else "hardware adapter",
        "wgpu_py": wgpu.__version__,
    }


def _commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip() or None


def machine_report() -> dict[str, Any]:
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = []
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "vyre_async": __version__,
        "commit": _commit(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "load_average_at_start": load,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


# 1. Round trip ------------------------------------------------------------------------


async def round_trip(backend: Any, bare: Bare, rounds: int, samples: int) -> dict[str, Any]:
    program = elementwise_xor(N)
    rng = np.random.default_rng(1)
    a = rng.integers(0, 2**32, N, dtype=np.uint32)
    b = rng.integers(0, 2**32, N, dtype=np.uint32)
    pipeline = backend.compile(program)
    for _ in range(50):
        (out,) = await backend.dispatch(program, [a, b])
        bare.run([a, b])
    assert (out == a ^ b).all() and (bare.run([a, b])[0] == a ^ b).all()

    async def ours() -> list[float]:
        times = []
        for _ in range(samples):
            start = time.perf_counter()
            await backend.dispatch(program, [a, b])
            times.append(time.perf_counter() - start)
        return times

    async def ours_compiled() -> list[float]:
        times = []
        for _ in range(samples):
            start = time.perf_counter()
            await pipeline.dispatch([a, b])
            times.append(time.perf_counter() - start)
        return times

    async def peer() -> list[float]:
        times = []
        for _ in range(samples):
            start = time.perf_counter()
            bare.run([a, b])
            times.append(time.perf_counter() - start)
        return times

    # Not the goal's peer: the floor of any design that keeps the loop free, the same
    # bare round trip on a worker thread, its result handed back with call_soon_threadsafe.
    loop = asyncio.get_running_loop()
    jobs: queue.SimpleQueue[asyncio.Future[Any] | None] = queue.SimpleQueue()

    def serve() -> None:
        while (future := jobs.get()) is not None:
            loop.call_soon_threadsafe(future.set_result, bare.run([a, b]))

    worker = threading.Thread(target=serve, name="bare-worker", daemon=True)
    worker.start()

    async def peer_thread() -> list[float]:
        times = []
        for _ in range(samples):
            start = time.perf_counter()
            future = loop.create_future()
            jobs.put(future)
            await future
            times.append(time.perf_counter() - start)
        return times

    cases = {
        "backend_dispatch": ours,
        "compiled_dispatch": ours_compiled,
        "bare": peer,
        "bare_on_worker_thread": peer_thread,
    }
    got = await _rounds(rounds, cases)()
    jobs.put(None)
    worker.join()
    result: dict[str, Any] = {
        "workload": f"u32 xor, {N} elements, workgroup 64, warm",
        "rounds": rounds,
        "samples_per_round": samples,
    }
    for name, per_round in got.items():
        result[name] = {
            "median_us": _us(statistics.median(statistics.median(s) for s in per_round)),
            "p90_us": _us(statistics.median(_p90(s) for s in per_round)),
            "round_medians_us": [_us(statistics.median(s)) for s in per_round],
        }
    bare_median = result["bare"]["median_us"]
    result["ratio_median"] = round(result["backend_dispatch"]["median_us"] / bare_median, 3)
    result["ratio_p90"] = round(result["backend_dispatch"]["p90_us"] / result["bare"]["p90_us"], 3)
    result["ratio_compiled_median"] = round(
        result["compiled_dispatch"]["median_us"] / bare_median, 3
    )
    result["ratio_vs_bare_on_worker_thread"] = round(
        result["backend_dispatch"]["median_us"] / result["bare_on_worker_thread"]["median_us"], 3
    )
    result["goal_ratio_max"] = 1.2
    result["goal_met"] = result["ratio_median"] <= 1.2
    return result


# 2. Throughput ------------------------------------------------------------------------


async def throughput(backend: Any, bare: Bare, rounds: int, per_task: int) -> dict[str, Any]:
    program = elementwise_xor(N)
    tasks = 64
    rng = np.random.default_rng(2)
    inputs = [[rng.integers(0, 2**32, N, dtype=np.uint32) for _ in range(2)] for _ in range(tasks)]
    expected = [x ^ y for x, y in inputs]
    total = tasks * per_task
    wrong = 0

    async def ours() -> float:
        nonlocal wrong

        async def worker(k: int) -> None:
            nonlocal wrong
            for _ in range(per_task):
                (out,) = await backend.dispatch(program, inputs[k])
                wrong += not np.array_equal(out, expected[k])

        start = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(tasks)))
        return total / (time.perf_counter() - start)

    async def peer() -> float:
        nonlocal wrong
        start = time.perf_counter()
        for i in range(total):
            (out,) = bare.run(inputs[i % tasks])
            wrong += not np.array_equal(out, expected[i % tasks])
        return total / (time.perf_counter() - start)

    await ours()  # warm: buffer sets of this shape
    got = await _rounds(rounds, {"backend_64_tasks": ours, "bare_loop": peer})()
    assert wrong == 0, f"{wrong} wrong outputs"
    ours_rate = statistics.median(got["backend_64_tasks"])
    peer_rate = statistics.median(got["bare_loop"])
    return {
        "workload": f"u32 xor, {N} elements; {tasks} tasks x {per_task} awaited dispatches",
        "rounds": rounds,
        "backend_64_tasks_per_s": round(ours_rate, 1),
        "bare_loop_per_s": round(peer_rate, 1),
        "round_rates_backend": [round(x, 1) for x in got["backend_64_tasks"]],
        "round_rates_bare": [round(x, 1) for x in got["bare_loop"]],
        "ratio": round(ours_rate / peer_rate, 3),
        "goal_ratio_min": 0.9,
        "goal_met": ours_rate / peer_rate >= 0.9,
    }


# 3. Batch -----------------------------------------------------------------------------


async def batch(backend: Any, device: Any, rounds: int, repeats: int) -> dict[str, Any]:
    from vyre_wgpu.backend import LAVAPIPE_LOOP_CAP

    size = 16
    program = elementwise_xor(N)
    rng = np.random.default_rng(3)
    items = [[rng.integers(0, 2**32, N, dtype=np.uint32) for _ in range(2)] for _ in range(size)]
    expected = [x ^ y for x, y in items]
    pipeline = backend.compile(program)
    guarded = backend.executor.loop_cap == LAVAPIPE_LOOP_CAP
    shader = shader_of(program, guarded=guarded, slice_budget=backend.executor.slice_budget)
    bare = Bare(device, program, shader, items[0], copies=size)

    def check(outs: Sequence[Sequence[np.ndarray]]) -> None:
        assert all(np.array_equal(o[0], e) for o, e in zip(outs, expected, strict=True))

    async def ours_batch() -> float:
        start = time.perf_counter()
        for _ in range(repeats):
            outs = [await p for p in pipeline.dispatch_batch(items)]
        took = time.perf_counter() - start
        check(outs)
        return took / (repeats * size)

    async def ours_one_by_one() -> float:
        start = time.perf_counter()
        for _ in range(repeats):
            outs = [await pipeline.dispatch(item) for item in items]
        took = time.perf_counter() - start
        check(outs)
        return took / (repeats * size)

    async def ours_at_once() -> float:
        start = time.perf_counter()
        for _ in range(repeats):
            pending = [pipeline.dispatch(item) for item in items]
            outs = [await p for p in pending]
        took = time.perf_counter() - start
        check(outs)
        return took / (repeats * size)

    async def bare_submits() -> float:
        start = time.perf_counter()
        for _ in range(repeats):
            outs = [bare.run(item) for item in items]
        took = time.perf_counter() - start
        check(outs)
        return took / (repeats * size)

    async def bare_one_submit() -> float:
        start = time.perf_counter()
        for _ in range(repeats):
            outs = bare.run_many(items)
        took = time.perf_counter() - start
        check(outs)
        return took / (repeats * size)

    cases = {
        "backend_dispatch_batch": ours_batch,
        "backend_16_awaited_one_by_one": ours_one_by_one,
        "backend_16_issued_at_once": ours_at_once,
        "bare_16_submits": bare_submits,
        "bare_one_submit_16_passes": bare_one_submit,
    }
    for case in cases.values():  # warm
        await case()
    got = await _rounds(rounds, cases)()
    per = {name: statistics.median(v) for name, v in got.items()}
    result: dict[str, Any] = {
        "workload": f"{size} dispatches of a {N}-element u32 xor, per-dispatch time",
        "rounds": rounds,
        "batches_per_round": repeats,
    }
    for name, value in per.items():
        result[f"{name}_us_per_dispatch"] = _us(value)
    b = per["backend_dispatch_batch"]
    result["ratio_batch_vs_one_by_one"] = round(b / per["backend_16_awaited_one_by_one"], 3)
    result["ratio_batch_vs_bare_16_submits"] = round(b / per["bare_16_submits"], 3)
    result["ratio_batch_vs_bare_one_submit"] = round(b / per["bare_one_submit_16_passes"], 3)
    return result


# 4. Compile ---------------------------------------------------------------------------


def _constant() -> int:
    return int.from_bytes(os.urandom(4), "little") | 1


async def compile_in_process(
    backend: Any, device: Any, repeats: int, hits: int, inputs: list[np.ndarray]
) -> dict[str, Any]:
    from vyre_wgpu import create_backend

    executor = backend.executor
    cold_compile, cold_first, bare_cold, bare_first = [], [], [], []
    last = 0
    for _ in range(repeats):
        last = _constant()
        program = xor_const(N, last)
        start = time.perf_counter()
        pipeline = backend.compile(program)
        mid = time.perf_counter()
        await pipeline.dispatch(inputs)
        end = time.perf_counter()
        cold_compile.append(mid - start)
        cold_first.append(end - mid)
        peer = xor_const(N, _constant())
        shader = shader_of(
            peer, guarded=executor.loop_cap is not None, slice_budget=executor.slice_budget
        )
        start = time.perf_counter()
        bare = Bare(device, peer, shader, inputs)
        mid = time.perf_counter()
        bare.run(inputs)
        end = time.perf_counter()
        bare_cold.append(mid - start)
        bare_first.append(end - mid)
    known = xor_const(N, last)
    same, equal, dispatch_after = [], [], []
    for _ in range(hits):
        start = time.perf_counter()
        pipeline = backend.compile(known)
        same.append(time.perf_counter() - start)
        twin = xor_const(N, last)  # an equal, new object
        start = time.perf_counter()
        pipeline = backend.compile(twin)
        mid = time.perf_counter()
        await pipeline.dispatch(inputs)
        equal.append(mid - start)
        dispatch_after.append(time.perf_counter() - mid)
    # The disk cache: a fresh backend (its own device) on the directory another filled.
    disk_compile, disk_first, disk_hits = [], [], 0
    with tempfile.TemporaryDirectory(prefix="vyre-wgpu-bench-disk-") as root:
        for _ in range(repeats):
            program = xor_const(N, _constant())
            first = create_backend(prefetch=False, disk_cache=DiskPipelineCache(root))
            await first.dispatch(program, inputs)
            await first.aclose()
            cache = DiskPipelineCache(root)
            second = create_backend(prefetch=False, disk_cache=cache)
            start = time.perf_counter()
            pipeline = second.compile(program)
            mid = time.perf_counter()
            await pipeline.dispatch(inputs)
            end = time.perf_counter()
            disk_hits += pipeline.source == "disk"
            disk_compile.append(mid - start)
            disk_first.append(end - mid)
            await second.aclose()
    med = statistics.median
    cold_total = med(a + b for a, b in zip(cold_compile, cold_first, strict=True))
    bare_total = med(a + b for a, b in zip(bare_cold, bare_first, strict=True))
    disk_total = med(a + b for a, b in zip(disk_compile, disk_first, strict=True))
    return {
        "workload": "u32 xor with a new constant each time (a shader never compiled before)",
        "repeats": repeats,
        "cold_compile_ms": _ms(med(cold_compile)),
        "cold_first_dispatch_ms": _ms(med(cold_first)),
        "cold_total_ms": _ms(cold_total),
        "bare_cold_module_pipeline_buffers_ms": _ms(med(bare_cold)),
        "bare_cold_first_round_trip_ms": _ms(med(bare_first)),
        "bare_cold_total_ms": _ms(bare_total),
        "ratio_cold_total_vs_bare": round(cold_total / bare_total, 3),
        "memory_hit_same_object_us": _us(med(same)),
        "memory_hit_equal_new_object_us": _us(med(equal)),
        "dispatch_after_memory_hit_us": _us(med(dispatch_after)),
        "disk_hit_fresh_backend_compile_ms": _ms(med(disk_compile)),
        "disk_hit_fresh_backend_first_dispatch_ms": _ms(med(disk_first)),
        "disk_hit_fresh_backend_total_ms": _ms(disk_total),
        "disk_hits": f"{disk_hits}/{repeats}",
        "disk_note": "same process: Mesa's shader cache already holds the shader (the first "
        "backend compiled it); see the fresh-process figures for Mesa cold vs warm",
    }


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run in a fresh process: make the device, then time compile and first dispatch.

    A different program (an xor with another constant) is compiled and dispatched
    first, so the figures are those of a new shader in a running process, not of
    the process's first use of wgpu and vyre (reported apart: ``first_use_s``).
    """
    os.environ["MESA_SHADER_CACHE_DIR"] = spec["mesa"]
    from vyre_wgpu import create_backend, select_adapter

    warm = xor_const(N, spec["constant"] ^ 0x5A5A5A5A)
    warm_inputs = [np.arange(N, dtype=np.uint32), np.full(N, 5, np.uint32)]
    if spec["workload"] == "matmul":
        program, inputs, grid = matmul_workload()
        config = DispatchConfig(grid_override=grid)
    else:
        program, inputs = xor_const(N, spec["constant"]), warm_inputs
        grid, config = None, None
    if spec["who"] == "vyre":
        backend = create_backend(prefetch=False, disk_cache=DiskPipelineCache(spec["vyre"]))
        begin = time.perf_counter()
        backend.dispatch(warm, warm_inputs).result()
        start = time.perf_counter()
        pipeline = backend.compile(program, config)
        mid = time.perf_counter()
        out = pipeline.dispatch(inputs).result()
        end = time.perf_counter()
        source = pipeline.source
    else:
        device = select_adapter().request_device_sync()
        shaders = [
            shader_of(p, guarded=spec["guarded"], slice_budget=spec["budget"])
            for p in (warm, program)
        ]
        begin = time.perf_counter()
        Bare(device, warm, shaders[0], warm_inputs).run(warm_inputs)
        start = time.perf_counter()
        bare = Bare(device, program, shaders[1], inputs, grid=grid)
        mid = time.perf_counter()
        out = bare.run(inputs)
        end = time.perf_counter()
        source = "bare"
    return {
        "first_use_s": start - begin,
        "compile_s": mid - start,
        "first_dispatch_s": end - mid,
        "source": source,
        "checksum": int(np.asarray(out[0]).view(np.uint32).sum(dtype=np.uint64)),
    }


def compile_fresh_processes(guarded: bool, budget: int, workloads: Sequence[str]) -> dict[str, Any]:
    """vyre disk cache cold/warm x Mesa cache cold/warm, and bare Mesa cold/warm."""

    def child(spec: dict[str, Any]) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(spec)],
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ),
        )
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))

    out: dict[str, Any] = {
        "method": "each case a fresh process; device created and another new shader "
        "compiled and dispatched before the clock (process_first_use_ms: that one); "
        "compile_ms = backend.compile, codegen included (bare: module, pipeline, buffers, "
        "bind group from the WGSL text), first_dispatch_ms = the first round trip "
        "(lavapipe compiles the LLVM code there)"
    }
    with tempfile.TemporaryDirectory(prefix="vyre-wgpu-bench-") as tmp:
        for workload in workloads:
            constant = _constant()

            def d(name: str, w: str = workload) -> str:
                return os.path.join(tmp, f"{w}-{name}")

            cases = {
                "vyre_disk_cold_mesa_cold": ("vyre", d("vyre-a"), d("mesa-a")),
                "vyre_disk_warm_mesa_cold": ("vyre", d("vyre-a"), d("mesa-b")),
                "vyre_disk_cold_mesa_warm": ("vyre", d("vyre-c"), d("mesa-a")),
                "vyre_disk_warm_mesa_warm": ("vyre", d("vyre-a"), d("mesa-a")),
                "bare_mesa_cold": ("bare", "", d("mesa-bare")),
                "bare_mesa_warm": ("bare", "", d("mesa-bare")),
            }
            results: dict[str, Any] = {}
            sums = set()
            for name, (who, vyre_dir, mesa) in cases.items():
                got = child(
                    {
                        "who": who,
                        "vyre": vyre_dir,
                        "mesa": mesa,
                        "workload": workload,
                        "constant": constant,
                        "guarded": guarded,
                        "budget": budget,
                    }
                )
                sums.add(got["checksum"])
                results[name] = {
                    "compile_ms": _ms(got["compile_s"]),
                    "first_dispatch_ms": _ms(got["first_dispatch_s"]),
                    "total_ms": _ms(got["compile_s"] + got["first_dispatch_s"]),
                    "process_first_use_ms": _ms(got["first_use_s"]),
                    "pipeline_source": got["source"],
                }
            assert len(sums) == 1, f"outputs differ between cases: {sums}"
            total = {k: v["total_ms"] for k, v in results.items()}
            results["ratio_vyre_cold_vs_bare_cold"] = round(
                total["vyre_disk_cold_mesa_cold"] / total["bare_mesa_cold"], 3
            )
            results["ratio_vyre_warm_vs_bare_warm"] = round(
                total["vyre_disk_warm_mesa_warm"] / total["bare_mesa_warm"], 3
            )
            out[workload] = results
    return out


# 5. Loop responsiveness ---------------------------------------------------------------


async def _ticks_during(work: Callable[[], Awaitable[Any]]) -> tuple[int, float]:
    stop = asyncio.Event()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            await asyncio.sleep(TICK_S)
            ticks += 1

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)  # the ticker is waiting on its first sleep
    start = time.perf_counter()
    await work()
    took = time.perf_counter() - start
    stop.set()
    await task
    return ticks, took


async def responsiveness(backend: Any, device: Any, rounds: int) -> dict[str, Any]:
    executor = backend.executor
    guarded = executor.loop_cap is not None

    async def time_ours(lanes: int) -> float:
        program = spin(lanes)
        n = np.full(lanes, SPIN_N, np.uint32)
        await backend.dispatch(program, [n])
        start = time.perf_counter()
        await backend.dispatch(program, [n])
        return time.perf_counter() - start

    lanes = 256
    for _ in range(2):  # twice: the time is not quite proportional to the lanes
        took = statistics.median([await time_ours(lanes) for _ in range(3)])
        lanes = max(8, round(lanes * SPIN_TARGET_S / took / 8) * 8)
    program = spin(lanes)
    n = np.full(lanes, SPIN_N, np.uint32)
    expected = sum(range(SPIN_N)) % 2**32
    shader = shader_of(program, guarded=guarded, slice_budget=executor.slice_budget)
    bare = Bare(device, program, shader, [n])
    plain = Bare(device, program, shader_of(program, guarded=False, slice_budget=1), [n])
    assert (bare.run([n])[0] == expected).all() and (plain.run([n])[0] == expected).all()

    async def ours() -> tuple[int, float]:
        async def work() -> None:
            (out,) = await backend.dispatch(program, [n])
            assert (out == expected).all()

        return await _ticks_during(work)

    async def peer() -> tuple[int, float]:
        async def work() -> None:  # bare wgpu-py on the loop thread: it blocks the loop
            bare.run([n])

        return await _ticks_during(work)

    async def threaded() -> tuple[int, float]:
        async def work() -> None:  # the same, on a worker thread: the loop stays free
            await asyncio.to_thread(bare.run, [n])

        return await _ticks_during(work)

    async def idle() -> tuple[int, float]:
        return await _ticks_during(lambda: asyncio.sleep(SPIN_TARGET_S))

    async def unguarded() -> tuple[int, float]:
        start = time.perf_counter()
        plain.run([n])
        return 0, time.perf_counter() - start

    got = await _rounds(
        rounds,
        {
            "backend": ours,
            "bare_on_loop": peer,
            "bare_to_thread": threaded,
            "idle": idle,
            "bare_unguarded": unguarded,
        },
    )()

    def fraction(runs: list[tuple[int, float]]) -> float:
        return sum(t for t, _ in runs) / (sum(d for _, d in runs) / TICK_S)

    res: dict[str, Any] = {
        "workload": f"spin: {lanes} lanes (workgroup 8) x {SPIN_N} loop iterations, "
        f"shader {'with' if guarded else 'without'} the lavapipe loop guard (as the executor "
        "runs it; the bare peer runs the same shader)",
        "rounds": rounds,
        "ticker": f"await asyncio.sleep({TICK_S}) in a loop; fraction = ticks / (duration / 1 ms)",
    }
    for name in ("backend", "bare_on_loop", "bare_to_thread", "idle"):
        res[f"{name}_fraction"] = round(fraction(got[name]), 3)
        res[f"{name}_dispatch_ms"] = _ms(statistics.median(d for _, d in got[name]))
        res[f"{name}_ticks"] = [t for t, _ in got[name]]
    res["bare_same_kernel_without_loop_guard_ms"] = _ms(
        statistics.median(d for _, d in got["bare_unguarded"])
    )
    res["backend_fraction_over_idle"] = round(res["backend_fraction"] / res["idle_fraction"], 3)
    res["goal_fraction_min"] = 0.8
    res["goal_met"] = res["backend_fraction"] >= 0.8
    return res


# Diagnostics --------------------------------------------------------------------------


async def diagnostics(backend: Any, bare: Bare, samples: int) -> dict[str, Any]:
    """Where the executor's time goes, per dispatch, on its device thread.

    One awaited dispatch at a time, split at `WgpuExecutor.enqueue`, the start of
    `WgpuExecutor._run_job` on the device thread and the completer's ``resolve``:
    the front end, the hop to the device thread, the job, the hop back to the task.

    `WgpuExecutor._run_job` in all; within it the read-back buffers' ``map_sync``
    (wgpu-py submits an empty command buffer first, then waits on its own poll
    thread) and `WgpuExecutor._bind` (a new buffer set when the shape's pool of
    idle sets is empty). Next to them, bare wgpu-py's round trip and its ``map_sync``
    timed the same way. A separate pass: the wrappers cost a little themselves.
    """
    import wgpu
    from vyre_async._pending import DispatchCompleter

    executor = backend.executor
    program = elementwise_xor(N)
    a = np.arange(N, dtype=np.uint32)
    spent = {"run_job": 0.0, "map_sync": 0.0, "bind": 0.0, "bare_map_sync": 0.0}
    counts = {"jobs": 0, "launches": 0, "binds": 0}
    run_job, bind = executor._run_job, executor._bind
    buffer_type = type(executor._device.create_buffer(size=4, usage=wgpu.BufferUsage.MAP_READ))
    map_sync = buffer_type.map_sync

    marks: dict[str, float] = {}

    def timed_run_job(launches: list[Any]) -> None:
        start = marks["run_job"] = time.perf_counter()
        try:
            run_job(launches)
        finally:
            spent["run_job"] += time.perf_counter() - start
            counts["jobs"] += 1
            counts["launches"] += len(launches)

    def timed_bind(launch: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return bind(launch, **kwargs)
        finally:
            spent["bind"] += time.perf_counter() - start
            counts["binds"] += 1

    def timed_map_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return map_sync(self, *args, **kwargs)
        finally:
            took = time.perf_counter() - start
            if threading.current_thread() is executor._thread:
                spent["map_sync"] += took
            elif threading.current_thread() is threading.main_thread():
                spent["bare_map_sync"] += took

    async def summary(seconds: float, dispatches: int) -> dict[str, Any]:
        await backend.flush()  # the last job's accounting is done
        launches = counts["launches"]
        return {
            "dispatches": dispatches,
            "wall_us_per_dispatch": _us(seconds / dispatches),
            "submissions": counts["jobs"],
            "mean_launches_per_submission": round(launches / counts["jobs"], 1),
            "run_job_us_per_dispatch": _us(spent["run_job"] / launches),
            "map_sync_us_per_dispatch": _us(spent["map_sync"] / launches),
            "bind_us_per_dispatch": _us(spent["bind"] / launches),
            "buffer_sets_made_by_bind": counts["binds"],
        }

    def reset() -> None:
        for key in spent:
            spent[key] = 0.0
        for key in counts:
            counts[key] = 0

    enqueue, resolve = executor.enqueue, DispatchCompleter.resolve

    def marked_enqueue(launch: Any) -> None:
        marks["enqueue"] = time.perf_counter()
        enqueue(launch)

    def marked_resolve(self: Any, *args: Any, **kwargs: Any) -> Any:
        marks["resolve"] = time.perf_counter()
        return resolve(self, *args, **kwargs)

    executor._run_job, executor._bind = timed_run_job, timed_bind
    executor.enqueue = marked_enqueue
    buffer_type.map_sync = timed_map_sync
    DispatchCompleter.resolve = marked_resolve  # type: ignore[method-assign]
    try:
        steps, bare_trips, ours_s = [], [], 0.0
        rounds = 5
        for _ in range(rounds):  # interleaved with bare: the machine is noisy
            for _ in range(samples // rounds):
                begin = time.perf_counter()
                await backend.dispatch(program, [a, a])
                end = time.perf_counter()
                ours_s += end - begin
                steps.append(
                    (
                        marks["enqueue"] - begin,
                        marks["run_job"] - marks["enqueue"],
                        marks["resolve"] - marks["run_job"],
                        end - marks["resolve"],
                        end - begin,
                    )
                )
            await backend.flush()
            for _ in range(samples // rounds):
                begin = time.perf_counter()
                bare.run([a, a])
                bare_trips.append(time.perf_counter() - begin)
        bare_map_s = spent["bare_map_sync"]
        single = await summary(ours_s, len(steps))
        names = (
            "front_end_to_enqueue",
            "enqueue_to_device_thread_run_job",
            "run_job_to_resolve",
            "resolve_to_task_resumed",
            "total",
        )
        single["timeline_median_us"] = {
            name: _us(statistics.median(step[i] for step in steps)) for i, name in enumerate(names)
        }
        bare_single = {
            "dispatches": len(bare_trips),
            "interleaved_with": "one_awaited_dispatch_at_a_time",
            "median_us": _us(statistics.median(bare_trips)),
            "wall_us_per_dispatch": _us(sum(bare_trips) / len(bare_trips)),
            "map_sync_us_per_dispatch": _us(bare_map_s / len(bare_trips)),
        }
        reset()

        async def worker() -> None:
            for _ in range(10):
                await backend.dispatch(program, [a, a])

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(64)))
        many = await summary(time.perf_counter() - start, 640)
        reset()
        pipeline = backend.compile(program)
        start = time.perf_counter()
        for _ in range(10):
            for pending in pipeline.dispatch_batch([[a, a]] * 16):
                await pending
        batched = await summary(time.perf_counter() - start, 160)
    finally:
        del executor._run_job, executor._bind, executor.enqueue
        buffer_type.map_sync = map_sync
        DispatchCompleter.resolve = resolve  # type: ignore[method-assign]
    return {
        "one_awaited_dispatch_at_a_time": single,
        "64_tasks_x_10_dispatches": many,
        "dispatch_batch_16_x_10": batched,
        "bare_round_trip": bare_single,
    }


# Main ---------------------------------------------------------------------------------


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    from vyre_wgpu import create_backend, select_adapter
    from vyre_wgpu.codegen import generate

    backend = create_backend(prefetch=False, disk_cache=None)
    executor = backend.executor
    device = select_adapter().request_device_sync()
    program = elementwise_xor(N)
    ours = generate(
        program, loop_guard=executor.loop_cap is not None, slice_budget=executor.slice_budget
    )
    plain = generate(program, loop_guard=False)
    a = np.arange(N, dtype=np.uint32)
    bare = Bare(device, program, plain, [a, a])
    quick = args.quick
    report: dict[str, Any] = {
        "benchmark": "wgpu",
        "adapter": adapter_report(backend),
        **machine_report(),
        "mesa_shader_cache_dir": os.environ.get("MESA_SHADER_CACHE_DIR"),
        "xor_shader_identical_to_loop_guard_false": ours.source == plain.source,
        "xor_shader_lines": plain.source.count("\n"),
    }
    started = time.perf_counter()
    report["round_trip"] = await round_trip(backend, bare, 5 if quick else 15, 80 if quick else 120)
    report["throughput"] = await throughput(backend, bare, 3 if quick else 7, 6 if quick else 8)
    report["batch"] = await batch(backend, device, 3 if quick else 7, 5 if quick else 10)
    report["compile"] = {
        "in_process": await compile_in_process(
            backend, device, 3 if quick else 5, 20 if quick else 100, [a, a]
        ),
        "fresh_processes": compile_fresh_processes(
            executor.loop_cap is not None,
            executor.slice_budget,
            ("xor_const",) if quick else ("xor_const", "matmul"),
        ),
    }
    report["responsiveness"] = await responsiveness(backend, device, 3 if quick else 5)
    report["diagnostics"] = await diagnostics(backend, bare, 100 if quick else 300)
    report["config"] = {"quick": quick, "seconds": round(time.perf_counter() - started, 1)}
    await backend.aclose()
    return report


def main(argv: list[str] | None = None) -> int:
    """Run every measurement and print (and optionally write) the JSON report."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (~half the time)")
    parser.add_argument("--output", help="also write the JSON report to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return 0
    # This run's own Mesa shader cache: cold at the start, whatever ran before (set
    # before any device exists: Mesa reads it when the device is created).
    with tempfile.TemporaryDirectory(prefix="vyre-wgpu-bench-mesa-") as mesa:
        os.environ["MESA_SHADER_CACHE_DIR"] = mesa
        try:
            import wgpu  # noqa: F401
            from vyre_wgpu import probe

            probe()
        except Exception as exc:
            print(f"benchmarks/wgpu_backend.py: no wgpu adapter here ({exc})", file=sys.stderr)
            return 2
        report = asyncio.run(run_all(args))
        report["mesa_shader_cache_dir"] = "a fresh temporary directory per run"
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
