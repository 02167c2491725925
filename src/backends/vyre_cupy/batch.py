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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from vyre_async.pipeline import Launch
from vyre_async.policies.arms import ArmSummary
from vyre_async.policies.overlap import CopyVerdict, can_overlap_copy_with_kernel
from vyre_async.resident import ResidentBuffer
from vyre_cupy.layout import ArenaLayout, Slot, Source, plan_layout

if TYPE_CHECKING:
    from vyre_cupy.backend import CudaKernel, CupyBackend

__all__ = ["batch_obstacle", "enqueue_persistent", "enqueue_replay", "persistent_blocks"]

#: Captured graphs kept per kernel (one per launch shape; least recently used dropped).
GRAPHS_PER_KERNEL = 8
#: Largest arena a captured graph keeps alive (bigger shapes replay no graph).
GRAPH_ARENA_LIMIT = 64 << 20
#: Largest device arena (all items) of one persistent launch; also far below the
#: copy pitch limit of ``memcpy2DAsync``.
PERSISTENT_ARENA_LIMIT = 1 << 30

#: The copy-overlap verdict of an upload into a dispatch's own fresh arena: no
#: kernel can be reading or writing memory allocated for this dispatch alone.
PRIVATE_ARENA = can_overlap_copy_with_kernel("private_arena", ArmSummary())
#: The verdict of an upload into a graph's arena while the previous replay's kernel,
#: which reads and writes that arena, may still run: serialize (kernel_reads_slot).
GRAPH_ARENA_BUSY = can_overlap_copy_with_kernel(
    "graph_arena", ArmSummary(reads={"graph_arena"}, writes={"graph_arena"})
)


def annotate_copy(launch: Launch, verdict: CopyVerdict, target: str = "private_arena") -> None:
    """Record the copy-overlap verdict of ``launch``'s upload on its span.

    ``vyre.policy.copy_overlap`` (``overlap``/``serialize``), its reason when
    serialised, the upload's target and its staging (always pinned memory).
    """
    attributes = _COPY_ATTRIBUTES.get((verdict, target))
    if attributes is None:
        attributes = {"vyre.policy.copy_overlap": verdict.kind}
        if verdict.reason is not None:
            attributes["vyre.policy.copy_overlap.reason"] = verdict.reason
        attributes["vyre.copy.target"] = target
        attributes["vyre.copy.staging"] = "pinned"
        _COPY_ATTRIBUTES[(verdict, target)] = attributes
    launch.completer.annotate_all(attributes)


_COPY_ATTRIBUTES: dict[tuple[CopyVerdict, str], dict[str, str]] = {}


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
    arena = host_layout(kernel, kernel_arguments(kernel.source.params, first)[0]).total_bytes
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


def fill_staging(
    host: np.ndarray, layout: ArenaLayout, counts: Sequence[int], items: Sequence[Any]
) -> None:
    """Write ``vy_lens`` and every host input of one launch into its staging bytes ``host``."""
    host[: 4 * len(counts)].view(np.uint32)[:] = counts
    for slot, item in zip(layout.slots, items, strict=True):
        if slot.source is Source.HOST and slot.nbytes:
            assert isinstance(item, np.ndarray) and slot.offset is not None
            view = host[slot.offset : slot.offset + slot.nbytes].view(item.dtype)
            np.copyto(view, item, casting="no")


def read_outputs(
    launch: Launch, params: Sequence[Any], slots: Sequence[Slot], readback: Any, base: int = 0
) -> list[np.ndarray]:
    """Copy ``launch``'s outputs out of pinned ``readback`` (its bytes start at ``base``)."""
    plan = launch.plan
    by_name = {p.name: slot for p, slot in zip(params, slots, strict=True)}
    counts = dict(zip((d.name for d in plan.program.buffers), plan.counts, strict=True))
    outputs = []
    for decl in plan.outputs:
        slot = by_name[decl.name]
        assert slot.readback is not None
        view = np.frombuffer(readback, decl.dtype.numpy, counts[decl.name], base + slot.readback)
        outputs.append(view.copy())
    return outputs


def record_phases(backend: CupyBackend, launches: Sequence[Launch], events: Sequence[Any]) -> float:
    """Record upload/launch/readback spans from device event times on each launch; return kernel s.

    The times are the whole batch's (one span per phase and dispatch, shared).
    """
    elapsed = backend._cupy.cuda.get_elapsed_time
    upload, kernel, readback = (float(elapsed(events[i], events[i + 1])) * 1e6 for i in range(3))
    end = time.time_ns()
    t2 = end - int(readback)
    t1 = t2 - int(kernel)
    t0 = t1 - int(upload)
    for launch in launches:
        completer = launch.completer
        completer.record_phase("vyre.upload", t0, t1)
        completer.record_phase("vyre.launch", t1, t2)
        completer.record_phase("vyre.readback", t2, end)
    return kernel / 1e9


def kernel_arguments(params: Sequence[Any], launch: Launch) -> tuple[list[int], list[Any]]:
    """Return each kernel parameter's element count and input (None for WRITE buffers)."""
    plan = launch.plan
    counts = dict(zip((d.name for d in plan.program.buffers), plan.counts, strict=True))
    given = dict(zip((d.name for d in plan.inputs), launch.inputs, strict=True))
    return [counts[p.name] for p in params], [given.get(p.name) for p in params]


def host_layout(kernel: CudaKernel, counts: Sequence[int]) -> ArenaLayout:
    """The arena layout of one launch whose inputs all come from the host (memoised)."""
    params = kernel.source.params
    return plan_layout([p.decl.access for p in params], counts, [None] * len(params))


# Persistent kernel ---------------------------------------------------------------------
def enqueue_persistent(
    backend: CupyBackend, launches: Sequence[Launch], kernel: CudaKernel
) -> None:
    """Run ``launches`` (checked by `batch_obstacle`) as ONE launch of the batch kernel."""
    cp, rt = backend._cupy, backend._rt
    first = launches[0]
    params = kernel.source.params
    counts = kernel_arguments(params, first)[0]
    layout = host_layout(kernel, counts)
    size, stride = len(launches), layout.total_bytes  # a multiple of 256
    backend._use_device()
    index, stream = backend._streams.lease()
    try:
        with stream:
            arena = cp.cuda.alloc(size * stride)
        staging = cp.cuda.alloc_pinned_memory(max(size * layout.upload_bytes, 4))
        readback = cp.cuda.alloc_pinned_memory(max(size * layout.download_bytes, 4))
        host = np.frombuffer(staging, np.uint8, size * layout.upload_bytes)
        for b, launch in enumerate(launches):
            items = kernel_arguments(params, launch)[1]
            at = b * layout.upload_bytes
            fill_staging(host[at : at + layout.upload_bytes], layout, counts, items)
        base = int(arena.ptr)
        geometry = first.plan.geometry
        tasks = size * geometry.grid[0] * geometry.grid[1] * geometry.grid[2]
        blocks = persistent_blocks(
            tasks, geometry.workgroup, backend.info.attribute("MultiProcessorCount", 1)
        )
        args: list[Any] = [np.uint64(base + int(slot.offset or 0)) for slot in layout.slots]
        args += [
            np.uint64(base),
            np.uint32(size),
            np.uint64(stride),
            *(np.uint32(g) for g in geometry.grid),
        ]
        events = [backend._event() for _ in range(4)]
        sp = stream.ptr
        with backend._streams.ordering(index):
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
                backend=backend,
                launches=launches,
                params=params,
                stream=index,
                layout=layout,
                keep=(arena, staging, stream),
                readback=readback,
                events=events,
            )
            backend._bridge.submit(flight, queue=index)
    except BaseException:
        backend._streams.release(index)
        raise


class Flight:
    """Work enqueued on one stream — one dispatch, or a persistent batch — watched to completion.

    The completion bridge calls `ready` (``cudaEventQuery`` on ``events[3]``) and
    then `finish` once, in stream order.

    Attributes:
        launches: The dispatches it settles (item ``b``'s outputs start at
            ``b * layout.readback_bytes`` in ``readback``).
        keep: Device arena, staging, stream and resident buffers: alive until done.
        keep_done: ``events[3]`` is also an ordering event (a resident buffer's
            last write or a graph's last replay): never recycle it.
    """

    __slots__ = (
        "backend",
        "events",
        "keep",
        "keep_done",
        "launches",
        "layout",
        "params",
        "readback",
        "stream",
    )

    def __init__(
        self,
        *,
        backend: CupyBackend,
        launches: Sequence[Launch],
        params: Sequence[Any],
        stream: int,
        layout: ArenaLayout,
        keep: tuple[Any, ...],
        readback: Any,
        events: list[Any],
        keep_done: bool = False,
    ) -> None:
        self.backend = backend
        self.launches = launches
        self.params = params
        self.stream = stream
        self.layout = layout
        self.keep = keep
        self.keep_done = keep_done
        self.readback = readback
        self.events = events

    def ready(self) -> bool:
        """Return True once the completion event fired (``cudaEventQuery``)."""
        return bool(self.events[3].done)

    def abandon(self, error: BaseException) -> None:
        """Fail every dispatch of the flight with ``error`` (the backend closed before it ended)."""
        for launch in self.launches:
            launch.completer.fail(error)

    def finish(self, error: BaseException | None) -> None:
        """Copy each dispatch's outputs out and settle it (or fail them); release resources."""
        from vyre_cupy.backend import _timeout
        from vyre_cupy.errors import translate

        backend = self.backend
        try:
            if error is not None:
                raise error
            stopped = [launch.completer.stop_requested.is_set() for launch in self.launches]
            live = [launch for launch, stop in zip(self.launches, stopped, strict=True) if not stop]
            device_s = 0.0
            if live:
                device_s = record_phases(backend, live, self.events) / len(self.launches)
            for b, (launch, stop) in enumerate(zip(self.launches, stopped, strict=True)):
                if stop:  # timed out: nobody takes the result
                    launch.completer.fail(_timeout(launch, started=True))
                    continue
                base = b * self.layout.readback_bytes
                outputs = read_outputs(launch, self.params, self.layout.slots, self.readback, base)
                launch.completer.resolve(outputs, device_s=device_s, compile_s=launch.compile_s)
        except Exception as exc:
            failure = translate(exc, during="running the kernel", device=backend.info.name)
            backend._note(exc, failure)
            for launch in self.launches:
                launch.completer.fail(failure)
        else:
            backend._recycle(self.events[:3] if self.keep_done else self.events)
        finally:
            backend._streams.release(self.stream)
            self.keep = ()
            self.readback = None


# CUDA graph replay ---------------------------------------------------------------------
@dataclass(eq=False)
class CapturedGraph:
    """One launch shape captured as a CUDA graph (memset + kernel launches) on a fixed arena.

    Attributes:
        graph: CuPy's executable graph (``stream.end_capture()``).
        arena: The device arena every replay uses.
        layout: The arena's layout.
        record_ns: Host nanoseconds the capture and instantiation took.
        last_done: Event after the newest replay's readback (the next replay waits on it).
        lock: Held while one replay is enqueued (keeps ``last_done`` a recorded event).
    """

    graph: Any
    arena: Any
    layout: ArenaLayout
    record_ns: int
    last_done: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)


def graph_for(backend: CupyBackend, kernel: CudaKernel, launch: Launch) -> CapturedGraph:
    """Return the captured graph of ``launch``'s shape, capturing it on first use."""
    plan = launch.plan
    key = (plan.counts, plan.geometry.grid, plan.geometry.workgroup, launch.config.iterations)
    graphs = kernel.graphs
    with backend._lock:
        found = graphs.get(key)
        if found is not None:
            graphs.move_to_end(key)
            return found
    captured = _capture(backend, kernel, launch)
    with backend._lock:
        found = graphs.setdefault(key, captured)  # a racing capture of the same shape wins
        graphs.move_to_end(key)
        while len(graphs) > GRAPHS_PER_KERNEL:
            graphs.popitem(last=False)  # in-flight replays keep their arena alive
    return found


def _capture(backend: CupyBackend, kernel: CudaKernel, launch: Launch) -> CapturedGraph:
    cp, rt = backend._cupy, backend._rt
    layout = host_layout(kernel, kernel_arguments(kernel.source.params, launch)[0])
    geometry = launch.plan.geometry
    started = time.perf_counter_ns()
    backend._use_device()
    index, stream = backend._streams.lease()
    try:
        with stream:
            arena = cp.cuda.alloc(layout.total_bytes)  # capture forbids allocation: before it
        base = int(arena.ptr)
        args = (
            *(np.uint64(base + int(slot.offset or 0)) for slot in layout.slots),
            np.uint64(base),
        )
        with backend._streams.ordering(index):
            stream.begin_capture()
            try:
                if layout.zero_bytes:
                    rt.memsetAsync(base + layout.zero_offset, 0, layout.zero_bytes, stream.ptr)
                for _ in range(launch.config.iterations):
                    kernel.function(geometry.grid, geometry.workgroup, args, stream=stream)
            finally:
                graph = stream.end_capture()
    finally:
        backend._streams.release(index)
    return CapturedGraph(
        graph=graph, arena=arena, layout=layout, record_ns=time.perf_counter_ns() - started
    )


def enqueue_replay(backend: CupyBackend, launches: Sequence[Launch], kernel: CudaKernel) -> None:
    """Run ``launches`` (checked by `batch_obstacle`) as replays of one captured graph.

    A failure part-way fails that launch and every later one (their pending
    results carry the error); earlier ones run on.
    """
    cp, rt = backend._cupy, backend._rt
    captured = graph_for(backend, kernel, launches[0])
    layout = captured.layout
    base = int(captured.arena.ptr)
    params = kernel.source.params
    for at, launch in enumerate(launches):
        try:
            counts, items = kernel_arguments(params, launch)
            staging = cp.cuda.alloc_pinned_memory(max(layout.upload_bytes, 4))
            readback = cp.cuda.alloc_pinned_memory(max(layout.readback_bytes, 4))
            host = np.frombuffer(staging, np.uint8, layout.upload_bytes)
            fill_staging(host, layout, counts, items)
            events = [backend._event() for _ in range(4)]
            index, stream = backend._streams.lease()
        except Exception as exc:
            _fail_rest(backend, launches[at:], exc)
            return
        try:
            sp = stream.ptr
            with backend._streams.ordering(index), captured.lock:
                launch.completer.mark_started()
                launch.completer.annotate("vyre.stream", index)
                if captured.last_done is None:
                    annotate_copy(launch, PRIVATE_ARENA, "graph_arena")
                else:  # the previous replay's kernel may still use the arena
                    annotate_copy(launch, GRAPH_ARENA_BUSY, "graph_arena")
                    stream.wait_event(captured.last_done)
                events[0].record(stream)
                rt.memcpyAsync(base, staging.ptr, layout.upload_bytes, rt.memcpyHostToDevice, sp)
                events[1].record(stream)
                captured.graph.launch(stream)
                events[2].record(stream)
                if layout.download_bytes:
                    rt.memcpyAsync(
                        readback.ptr,
                        base + layout.download_offset,
                        layout.download_bytes,
                        rt.memcpyDeviceToHost,
                        sp,
                    )
                events[3].record(stream)
                captured.last_done = events[3]
                flight = Flight(
                    backend=backend,
                    launches=(launch,),
                    params=params,
                    stream=index,
                    layout=layout,
                    keep=(captured.arena, staging, stream),
                    readback=readback,
                    events=events,
                    keep_done=True,  # events[3] is the graph's last_done
                )
                backend._bridge.submit(flight, queue=index)
        except BaseException as exc:
            backend._streams.release(index)
            _forget(backend, kernel, captured)  # its arena may hold an unfinished upload
            _fail_rest(backend, launches[at:], exc)
            if not isinstance(exc, Exception):
                raise
            return


def _forget(backend: CupyBackend, kernel: CudaKernel, captured: CapturedGraph) -> None:
    """Drop ``captured`` from the kernel's graphs: no later replay may reuse its arena."""
    with backend._lock:
        for key, graph in list(kernel.graphs.items()):
            if graph is captured:
                del kernel.graphs[key]


def _fail_rest(backend: CupyBackend, launches: Sequence[Launch], exc: BaseException) -> None:
    from vyre_async.errors import BackendError
    from vyre_cupy.errors import translate

    if isinstance(exc, BackendError):
        error: BaseException = exc
    elif isinstance(exc, Exception):
        error = translate(exc, during="replaying a CUDA graph", device=backend.info.name)
        backend._note(exc, error)
    else:
        error = exc
    for launch in launches:
        launch.completer.fail(error)
