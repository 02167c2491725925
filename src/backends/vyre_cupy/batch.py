"""Batches of same-shape launches on CUDA: one persistent kernel, or a CUDA graph replayed.

`CupyBackend.enqueue_batch` runs a `dispatch_batch` call in the mode the
execution policy chose, when the launches allow it (`batch_obstacle`):

- **persistent**: every item's arena sits ``stride`` bytes apart in ONE device
  allocation; one 2-D copy uploads every item's staging, one launch of the
  program's batch kernel (``<entry>_batch``, see `vyre_cupy.codegen`) runs all
  (item, workgroup) tasks on at most a device-full of blocks, one 2-D copy
  reads every item's outputs back, and one completion settles every dispatch.
- **command reuse**: the memset and kernel launch(es) of one launch shape are
  captured once into a CUDA graph over a fixed device arena (cached on the
  kernel, by shape); each item then costs an upload into that arena, one
  ``graph.launch`` and a readback. Replays of one graph are chained on device
  events (each waits for the previous item's readback), never on the host.

Both need host inputs only (a resident buffer ties items together) and one
launch shape (counts, grid, workgroup); persistent also needs a batch kernel
(no barriers, no shared memory), ``iterations == 1`` and at most
`PERSISTENT_ARENA_LIMIT` bytes of arenas in all; a graph keeps at most
`GRAPH_ARENA_LIMIT` bytes of arena alive (8 shapes per kernel).

Layering: built on the public functions of `vyre_cupy.launch` (templates,
staging, flights, phases) and `vyre_cupy.context` (streams, events, memory,
error mapping); imported by `vyre_cupy.backend` only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from vyre_async.abc import ArmSummary, Launch, ResidentBuffer, can_overlap_copy_with_kernel
from vyre_async.abc import public_dir as _public_dir
from vyre_async.errors import BackendError
from vyre_cupy.context import DeviceContext
from vyre_cupy.kernel import CapturedGraph, CudaKernel
from vyre_cupy.launch import (
    PRIVATE_ARENA,
    Flight,
    annotate_copy,
    enqueue_readback,
    fill_staging,
    template_for,
)

__all__ = [
    "GRAPHS_PER_KERNEL",
    "GRAPH_ARENA_BUSY",
    "GRAPH_ARENA_LIMIT",
    "PERSISTENT_ARENA_LIMIT",
    "batch_obstacle",
    "enqueue_persistent",
    "enqueue_replay",
    "graph_for",
    "persistent_blocks",
]
__dir__ = _public_dir(__name__)

#: Captured graphs kept per kernel (one per launch shape; least recently used dropped).
GRAPHS_PER_KERNEL = 8
#: Largest arena a captured graph keeps alive (bigger shapes replay no graph).
GRAPH_ARENA_LIMIT = 64 << 20
#: Largest device arena (all items) of one persistent launch; also far below the
#: copy pitch limit of ``memcpy2DAsync``.
PERSISTENT_ARENA_LIMIT = 1 << 30

#: The verdict of an upload into a graph's arena while the previous replay's kernel,
#: which reads and writes that arena, may still run: serialize (kernel_reads_slot).
GRAPH_ARENA_BUSY = can_overlap_copy_with_kernel(
    "graph_arena", ArmSummary(reads={"graph_arena"}, writes={"graph_arena"})
)


def batch_obstacle(launches: Sequence[Launch], mode: str, kernel: CudaKernel) -> str | None:
    """Return why ``launches`` cannot run in ``mode`` (a span reason), or None if they can."""
    if not launches:
        return "empty_batch"
    first = launches[0]
    if any(isinstance(item, ResidentBuffer) for launch in launches for item in launch.inputs):
        return "resident_inputs"
    shape = (first.plan.counts, first.plan.geometry, first.config.iterations)
    for launch in launches[1:]:
        if (launch.plan.counts, launch.plan.geometry, launch.config.iterations) != shape:
            return "mixed_shapes"
    if not first.plan.geometry.lanes:
        return "empty_launch"
    arena = template_for(kernel, first.plan).layout.total_bytes
    if mode == "persistent":
        if kernel.batch is None:
            return "kernel_uses_barriers"
        if first.config.iterations != 1:
            return "iterations"
        if arena * len(launches) > PERSISTENT_ARENA_LIMIT:
            return "batch_too_large"
    elif arena > GRAPH_ARENA_LIMIT:
        return "arena_too_large"
    return None


def persistent_blocks(tasks: int, workgroup: tuple[int, int, int], sm_count: int) -> int:
    """Blocks of a persistent launch: every task, or what the device holds at once if fewer.

    A device holds about ``2048 // lanes`` blocks per SM (at most 32), so a batch
    with more tasks than ``sm_count`` times that loops over them in place.
    """
    lanes = max(1, workgroup[0] * workgroup[1] * workgroup[2])
    per_sm = max(1, min(32, 2048 // lanes))
    return max(1, min(tasks, sm_count * per_sm))


# Persistent kernel ---------------------------------------------------------------------
def enqueue_persistent(ctx: DeviceContext, launches: Sequence[Launch], kernel: CudaKernel) -> None:
    """Run ``launches`` (checked by `batch_obstacle`) as ONE launch of the batch kernel.

    Exceptions propagate as raised (the caller maps them, `DeviceContext.errors`).
    """
    rt = ctx.runtime
    first = launches[0]
    template = template_for(kernel, first.plan)
    layout = template.layout
    size, stride = len(launches), layout.total_bytes  # a multiple of 256
    ctx.use_device()
    index, stream = ctx.streams.lease()
    try:
        arena = ctx.alloc(size * stride, stream)
        staging = ctx.pinned(max(size * layout.upload_bytes, 4))
        readback = ctx.pinned(max(size * layout.download_bytes, 4))
        host = np.frombuffer(staging, np.uint8, size * layout.upload_bytes)
        for b, launch in enumerate(launches):
            at = b * layout.upload_bytes
            fill_staging(host[at : at + layout.upload_bytes], template, launch.inputs)
        base = int(arena.ptr)
        geometry = first.plan.geometry
        tasks = size * geometry.grid[0] * geometry.grid[1] * geometry.grid[2]
        blocks = persistent_blocks(
            tasks, geometry.workgroup, ctx.info.attribute("MultiProcessorCount", 1)
        )
        args: list[object] = [np.uint64(base + offset) for offset in template.arg_offsets]
        args += [
            np.uint64(base),
            np.uint32(size),
            np.uint64(stride),
            *(np.uint32(g) for g in geometry.grid),
        ]
        events = ctx.events(4)
        sp = stream.ptr
        with ctx.streams.ordering(index):
            for launch in launches:
                launch.completer.mark_started()
                launch.completer.annotate("vyre.stream", index)
                annotate_copy(launch, PRIVATE_ARENA)
            events[0].record(stream)
            if layout.zero_bytes:  # no 2-D memset in CuPy: zero every arena, then upload
                rt.memsetAsync(base, 0, size * stride, sp)
            rt.memcpy2DAsync(
                base,
                stride,
                staging.ptr,
                layout.upload_bytes,
                layout.upload_bytes,
                size,
                rt.memcpyHostToDevice,
                sp,
            )
            events[1].record(stream)
            kernel.batch((blocks, 1, 1), geometry.workgroup, tuple(args), stream=stream)
            events[2].record(stream)
            if layout.download_bytes:
                rt.memcpy2DAsync(
                    readback.ptr,
                    layout.download_bytes,
                    base + layout.download_offset,
                    stride,
                    layout.download_bytes,
                    size,
                    rt.memcpyDeviceToHost,
                    sp,
                )
            events[3].record(stream)
            flight = Flight(
                ctx,
                launches,
                template.outputs,
                stream=index,
                keep=(arena, staging, stream),
                readback=readback,
                stride=layout.readback_bytes,
                events=events,
            )
            ctx.bridge.submit(flight, queue=index)
    except BaseException:
        ctx.streams.release(index)
        raise


# CUDA graph replay ---------------------------------------------------------------------
def graph_for(ctx: DeviceContext, kernel: CudaKernel, launch: Launch) -> CapturedGraph:
    """Return the captured graph of ``launch``'s shape, capturing it on first use."""
    plan = launch.plan
    key = (plan.counts, plan.geometry.grid, plan.geometry.workgroup, launch.config.iterations)
    graphs = kernel.graphs
    with ctx.lock:
        found = graphs.get(key)
        if found is not None:
            graphs.move_to_end(key)
            return found
    captured = _capture(ctx, kernel, launch)
    with ctx.lock:
        found = graphs.setdefault(key, captured)  # a racing capture of the same shape wins
        graphs.move_to_end(key)
        while len(graphs) > GRAPHS_PER_KERNEL:
            graphs.popitem(last=False)  # in-flight replays keep their arena alive
    return found


def _capture(ctx: DeviceContext, kernel: CudaKernel, launch: Launch) -> CapturedGraph:
    rt = ctx.runtime
    template = template_for(kernel, launch.plan)
    layout = template.layout
    geometry = launch.plan.geometry
    started = time.perf_counter_ns()
    ctx.use_device()
    index, stream = ctx.streams.lease()
    try:
        arena = ctx.alloc(layout.total_bytes, stream)  # capture forbids allocation: before it
        base = int(arena.ptr)
        args = (*(np.uint64(base + offset) for offset in template.arg_offsets), np.uint64(base))
        with ctx.streams.ordering(index):
            stream.begin_capture()
            try:
                if layout.zero_bytes:
                    rt.memsetAsync(base + layout.zero_offset, 0, layout.zero_bytes, stream.ptr)
                for _ in range(launch.config.iterations):
                    kernel.function(geometry.grid, geometry.workgroup, args, stream=stream)
            finally:
                graph = stream.end_capture()
    finally:
        ctx.streams.release(index)
    return CapturedGraph(
        graph=graph, arena=arena, layout=layout, record_ns=time.perf_counter_ns() - started
    )


def enqueue_replay(ctx: DeviceContext, launches: Sequence[Launch], kernel: CudaKernel) -> None:
    """Run ``launches`` (checked by `batch_obstacle`) as replays of one captured graph.

    A failure part-way fails that launch and every later one (their pending
    results carry the error); earlier ones run on. Exceptions before the first
    replay propagate as raised (the caller maps them).
    """
    rt = ctx.runtime
    captured = graph_for(ctx, kernel, launches[0])
    template = template_for(kernel, launches[0].plan)
    layout = captured.layout
    base = int(captured.arena.ptr)
    errors = ctx.errors("replaying a CUDA graph")
    for at, launch in enumerate(launches):
        try:
            with errors:
                pinned = ctx.pinned(template.pinned_bytes)  # staging, then readback
                fill_staging(
                    np.frombuffer(pinned, np.uint8, layout.upload_bytes), template, launch.inputs
                )
                events = ctx.events(4)
                index, stream = ctx.streams.lease()
        except BackendError as error:
            _fail_rest(launches[at:], error)
            return
        try:
            with errors:
                sp = stream.ptr
                with ctx.streams.ordering(index), captured.lock:
                    launch.completer.mark_started()
                    launch.completer.annotate("vyre.stream", index)
                    if captured.last_done is None:
                        annotate_copy(launch, PRIVATE_ARENA, "graph_arena")
                    else:  # the previous replay's kernel may still use the arena
                        annotate_copy(launch, GRAPH_ARENA_BUSY, "graph_arena")
                        stream.wait_event(captured.last_done)
                    events[0].record(stream)
                    rt.memcpyAsync(base, pinned.ptr, layout.upload_bytes, rt.memcpyHostToDevice, sp)
                    events[1].record(stream)
                    captured.graph.launch(stream)
                    events[2].record(stream)
                    enqueue_readback(rt, layout, pinned, template.readback_at, base, sp)
                    events[3].record(stream)
                    captured.last_done = events[3]
                    flight = Flight(
                        ctx,
                        (launch,),
                        template.outputs,
                        stream=index,
                        keep=(captured.arena, pinned, stream),
                        readback=pinned,
                        readback_at=template.readback_at,
                        events=events,
                        keep_done=True,  # events[3] is the graph's last_done
                    )
                    ctx.bridge.submit(flight, queue=index)
        except BaseException as exc:
            ctx.streams.release(index)
            _forget(ctx, kernel, captured)  # its arena may hold an unfinished upload
            _fail_rest(launches[at:], exc)
            if not isinstance(exc, Exception):
                raise
            return


def _forget(ctx: DeviceContext, kernel: CudaKernel, captured: CapturedGraph) -> None:
    """Drop ``captured`` from the kernel's graphs: no later replay may reuse its arena."""
    with ctx.lock:
        for key, graph in list(kernel.graphs.items()):
            if graph is captured:
                del kernel.graphs[key]


def _fail_rest(launches: Sequence[Launch], error: BaseException) -> None:
    for launch in launches:
        launch.completer.fail(error)
