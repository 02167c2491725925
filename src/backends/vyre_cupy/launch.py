"""One launch on CUDA: arguments, staging, the in-flight record, enqueueing and readback.

A plain dispatch (`enqueue_launch`) becomes, on one leased non-blocking stream
and without any host synchronisation::

    event  H2D (pinned staging -> arena)  memset (WRITE buffers)  event
           kernel x iterations  event  D2H (arena -> pinned readback)  event

and a `Flight` handed to the completion bridge, which copies the outputs out of
pinned memory and settles the dispatch when the last event fired.

Everything that depends only on the kernel and the plan's buffer counts — the
arena layout, the ``vy_lens`` bytes, which input goes to which parameter, the
kernel-argument offsets, where each output is read back, the span attributes
of the copy — is a `KernelLayout` built once (`template_for`) and kept on the
kernel; a warm dispatch only allocates, copies its inputs into pinned staging
and enqueues. Launches with resident inputs (`DeviceBuffer`) plan their own
layout and order themselves after the buffers' earlier work (stream waits on
events); launches without any never look at that machinery.

The helpers the batch modes (`vyre_cupy.batch`) share are public here:
`template_for`, `fill_staging`, `annotate_copy`, `record_phases`, `Flight`,
`timeout_error`. Layering: imports `vyre_cupy.context`, `kernel`, `layout`;
imported by `batch` and `backend`.
"""

from __future__ import annotations

import logging
import time
from asyncio import _get_running_loop
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vyre_async.abc import (
    ArmSummary,
    BindingPlan,
    CopyVerdict,
    Launch,
    ResidentBuffer,
    can_overlap_copy_with_kernel,
)
from vyre_async.abc import public_dir as _public_dir
from vyre_async.errors import DispatchTimeout
from vyre_async.ir.types import Access
from vyre_cupy.codegen import KernelParam
from vyre_cupy.context import DeviceContext
from vyre_cupy.kernel import CudaKernel, KernelLayout, OutputSlot
from vyre_cupy.layout import ALIGN, ArenaLayout, Slot, Source, plan_layout

__all__ = [
    "PRIVATE_ARENA",
    "DeviceBuffer",
    "Flight",
    "ResidentCopy",
    "annotate_copy",
    "copy_attributes",
    "enqueue_launch",
    "enqueue_readback",
    "copy_in",
    "fill_staging",
    "read_outputs",
    "record_phases",
    "template_for",
    "timeout_error",
]
__dir__ = _public_dir(__name__)

_log = logging.getLogger("vyre_async.cupy")
#: Launch templates kept per kernel (one per set of buffer counts; oldest dropped).
TEMPLATES_PER_KERNEL = 256
#: Reader events kept per resident buffer before finished ones are pruned.
_READERS_KEPT = 32

#: The copy-overlap verdict of an upload into a dispatch's own fresh arena: no
#: kernel can be reading or writing memory allocated for this dispatch alone.
PRIVATE_ARENA = can_overlap_copy_with_kernel("private_arena", ArmSummary())

_COPY_ATTRIBUTES: dict[tuple[CopyVerdict, str], dict[str, str]] = {}


def copy_attributes(verdict: CopyVerdict, target: str = "private_arena") -> Mapping[str, str]:
    """Return the span attributes of an upload's copy-overlap verdict (memoised).

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
    return attributes


def annotate_copy(launch: Launch, verdict: CopyVerdict, target: str = "private_arena") -> None:
    """Record the copy-overlap verdict of ``launch``'s upload on its span (`copy_attributes`)."""
    launch.completer.annotate_all(copy_attributes(verdict, target))


def timeout_error(launch: Launch, *, started: bool = False) -> DispatchTimeout:
    """The `DispatchTimeout` of a dispatch stopped (not started, or its result discarded).

    Past its deadline it says so; before it, its stop was asked through
    ``PendingDispatch.stop_requested``.
    """
    name = launch.config.label or launch.plan.program.op_id
    called = f"dispatch {name}" if name else "a dispatch"
    timeout = launch.config.timeout
    if timeout is None or time.monotonic() - launch.pending.created < timeout:
        return DispatchTimeout(
            f"{called} was stopped: its stop was requested"
            + ("; its result was discarded" if started else ""),
            fix="its PendingDispatch.stop_requested was set before it finished; dispatch it "
            "again if you need its outputs",
            timeout=timeout,
        )
    what = (
        f"ended after its timeout of {timeout} s; its result was discarded"
        if started
        else f"was not started: past its timeout of {timeout} s"
    )
    return DispatchTimeout(
        f"{called} {what}",
        fix="raise DispatchConfig.timeout or split the work into smaller dispatches",
        timeout=timeout,
    )


# Templates ------------------------------------------------------------------------------
def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _output_slots(
    plan: BindingPlan, params: Sequence[KernelParam], slots: Sequence[Slot]
) -> tuple[OutputSlot, ...]:
    by_name = {p.name: slot for p, slot in zip(params, slots, strict=True)}
    counts = dict(zip((d.name for d in plan.program.buffers), plan.counts, strict=True))
    outputs = []
    for decl in plan.outputs:
        readback = by_name[decl.name].readback
        assert readback is not None
        outputs.append(OutputSlot(np.dtype(decl.dtype.numpy), counts[decl.name], readback))
    return tuple(outputs)


def _pinned_sizes(layout: ArenaLayout) -> tuple[int, int]:
    """Offset of the readback region in a launch's one pinned buffer, and its size."""
    readback_at = _align(layout.upload_bytes)
    return readback_at, readback_at + max(layout.readback_bytes, 4)


def template_for(kernel: CudaKernel, plan: BindingPlan) -> KernelLayout:
    """Return the `KernelLayout` of ``plan``'s buffer counts on ``kernel`` (built once).

    Every plan dispatched on one kernel names the kernel's parameters (the
    pipeline's program has the same buffers; only their counts differ), so the
    counts are the whole key.
    """
    found = kernel.templates.get(plan.counts)
    if found is not None:
        return found
    params = kernel.source.params
    count_of = dict(zip((d.name for d in plan.program.buffers), plan.counts, strict=True))
    input_at = {d.name: i for i, d in enumerate(plan.inputs)}
    counts = tuple(count_of[p.name] for p in params)
    inputs = tuple(input_at.get(p.name) for p in params)
    layout = plan_layout([p.decl.access for p in params], counts, [None] * len(params))
    uploads = []
    dtypes = []
    for param, slot, at in zip(params, layout.slots, inputs, strict=True):
        if slot.source is Source.HOST and slot.nbytes:
            assert at is not None and slot.offset is not None
            uploads.append((at, slot.offset, slot.nbytes))
            dtypes.append(param.decl.dtype.numpy)
    readback_at, pinned_bytes = _pinned_sizes(layout)
    template = KernelLayout(
        counts=counts,
        lens=np.array(counts, dtype=np.uint32).tobytes(),
        inputs=inputs,
        layout=layout,
        uploads=tuple(uploads),
        arg_offsets=tuple(int(slot.offset or 0) for slot in layout.slots),
        outputs=_output_slots(plan, params, layout.slots),
        readback_at=readback_at,
        pinned_bytes=pinned_bytes,
        copy_attributes=copy_attributes(PRIVATE_ARENA),
        dtypes=tuple(dtypes),
    )
    templates = kernel.templates
    if len(templates) >= TEMPLATES_PER_KERNEL:
        templates.pop(next(iter(templates)), None)
    templates[plan.counts] = template
    return template


#: Seconds an awaiting loop polls a plain launch's completion event between its turns
#: before the completion thread takes over (`DispatchCompleter.poll_with`); 0 leaves
#: every launch to the completion thread.
POLL_BUDGET_S = 200e-6
#: Hybrid polling (`Flight.poll`): a poll that finds the launch still running keeps
#: querying in a tight loop when the previous launch of its shape ended within this
#: many seconds of the same point after its enqueue...
SPIN_MARGIN_S = 3e-6
#: ... for at most this long per poll (the loop's other tasks wait meanwhile, as they
#: would for a few loop turns).
SPIN_MAX_S = 10e-6


def _in_asyncio_loop() -> bool:
    """True when called inside a running asyncio loop (its tasks poll; trio's do not)."""
    # asyncio's own non-raising form of get_running_loop (in asyncio.__all__): the
    # raising one costs an exception on every dispatch made outside a loop.
    return _get_running_loop() is not None


# Staging and readback ---------------------------------------------------------------------
def fill_staging(host: np.ndarray, template: KernelLayout, inputs: Sequence[Any]) -> None:
    """Write ``vy_lens`` and every host input of one launch into its staging bytes ``host``."""
    lens = template.lens
    host[: len(lens)] = np.frombuffer(lens, np.uint8)
    for at, offset, nbytes in template.uploads:
        item = inputs[at]
        copy_in(host[offset : offset + nbytes].view(item.dtype), item)


def copy_in(dest: np.ndarray, item: np.ndarray) -> None:
    """Copy a host input into its flat staging view ``dest``, once.

    ``item`` is the caller's own array (the backend copies inputs itself): any
    shape or strides, of the buffer's dtype.
    """
    np.copyto(dest if item.ndim == 1 else dest.reshape(item.shape), item, casting="no")


def read_outputs(outputs: Sequence[OutputSlot], readback: Any, base: int) -> list[np.ndarray]:
    """Copy each output out of pinned ``readback`` (this launch's region starts at ``base``)."""
    return [
        np.frombuffer(readback, out.dtype, out.count, base + out.readback).copy() for out in outputs
    ]


def record_phases(ctx: DeviceContext, launches: Sequence[Launch], events: Sequence[Any]) -> float:
    """Record upload/launch/readback spans from device event times on each launch; return kernel s.

    The times are the whole flight's (one span per phase and dispatch, shared).
    """
    upload = ctx.elapsed_ns(events[0], events[1])
    kernel = ctx.elapsed_ns(events[1], events[2])
    readback = ctx.elapsed_ns(events[2], events[3])
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


class Flight:
    """Work enqueued on one stream — one dispatch, or a batch — watched to completion.

    The completion bridge calls `ready` (``cudaEventQuery`` on ``events[3]``) and
    then `finish` once, in stream order.

    Attributes:
        launches: The dispatches it settles (item ``b``'s outputs start at
            ``readback_at + b * stride`` in ``readback``).
        outputs: Where each output sits in an item's readback region.
        keep: Device arena, staging, stream and resident buffers: alive until done.
        keep_done: ``events[3]`` is also an ordering event (a resident buffer's
            last write or a graph's last replay): never recycle it.
        staging: ``(template, staging)`` of a plain launch whose staging the shape
            keeps for its next launch once this one finished (with its events).
        results: A plain launch's typed readback views (`Staging.results`), copied
            out when it finishes; None to read ``outputs`` out of ``readback``.
        ends: For hybrid polling (`poll`), the launch shape's `KernelLayout.ends`;
            None when nobody polls the flight, or it is not a plain launch.
        launched: ``time.perf_counter()`` when it was enqueued (with ``ends``).
        waited: Seconds after ``launched`` of the newest poll that found it running.
    """

    __slots__ = (
        "ctx",
        "ends",
        "events",
        "keep",
        "keep_done",
        "launched",
        "launches",
        "outputs",
        "readback",
        "readback_at",
        "results",
        "staging",
        "stream",
        "stride",
        "waited",
    )

    def __init__(
        self,
        ctx: DeviceContext,
        launches: Sequence[Launch],
        outputs: Sequence[OutputSlot],
        *,
        stream: int,
        keep: tuple[Any, ...],
        readback: Any,
        events: list[Any],
        readback_at: int = 0,
        stride: int = 0,
        keep_done: bool = False,
        staging: tuple[KernelLayout, Staging] | None = None,
        results: tuple[np.ndarray, ...] | None = None,
        ends: list[float] | None = None,
    ) -> None:
        self.ctx = ctx
        self.ends = ends
        self.launched = time.perf_counter() if ends is not None else 0.0
        self.waited = 0.0
        self.staging = staging
        self.results = results
        self.launches = launches
        self.outputs = outputs
        self.stream = stream
        self.keep = keep
        self.readback = readback
        self.readback_at = readback_at
        self.stride = stride
        self.events = events
        self.keep_done = keep_done

    def ready(self) -> bool:
        """Return True once the completion event fired (``cudaEventQuery``)."""
        return bool(self.events[3].done)

    def poll(self) -> bool:
        """Finish the flight on the calling thread if it is done (an awaiting loop's poll).

        True when this call finished it; the completion bridge decides, under its
        lock, who finishes a flight (exactly once). Usually one ``cudaEventQuery``
        and no lock. Hybrid polling, for a flight with ``ends`` (its launch
        shape's `KernelLayout.ends`): when the previous polled launch of the
        shape ended about now (within `SPIN_MARGIN_S` of the same point after its
        enqueue) and nothing else is in flight, a "not yet" is followed by queries
        in a tight loop for up to `SPIN_MAX_S`, so the end is seen within a query
        rather than a loop turn; each end seen updates ``ends``.
        """
        event = self.events[3]
        try:
            if not event.done:
                if self.ends is None or not self._spin(event):
                    return False
            elif self.ends is not None:
                self._learn(time.perf_counter())
        except Exception:  # the bridge's poll asks again, and settles the flight with it
            return self.ctx.bridge.poll(self, queue=self.stream)
        return self.ctx.bridge.poll(self, queue=self.stream, ready=True)

    def _spin(self, event: Any) -> bool:
        """After a "not yet": query ``event`` in a tight loop if it should fire within µs."""
        launched = self.launched
        now = time.perf_counter()
        self.waited = since = now - launched
        lo, hi = self.ends or (0.0, 0.0)
        if (
            hi == 0.0
            or since < lo - SPIN_MARGIN_S
            or since > hi + SPIN_MARGIN_S
            or self.ctx.bridge.in_flight > 1  # others' work: the loop has better to do
        ):
            return False
        stop = min(now + SPIN_MAX_S, launched + hi + SPIN_MARGIN_S)
        while now < stop:
            if event.done:
                self._learn(time.perf_counter())
                return True
            now = time.perf_counter()
            self.waited = now - launched
        return False

    def _learn(self, seen: float) -> None:
        """Keep when this launch ended, as seen from the host, for the shape's next launch."""
        ends = self.ends
        if ends is not None:
            ends[0], ends[1] = self.waited, seen - self.launched

    def abandon(self, error: BaseException) -> None:
        """Fail every dispatch of the flight with ``error`` (the backend closed before it ended)."""
        for launch in self.launches:
            launch.completer.fail(error)

    def finish(self, error: BaseException | None) -> None:
        """Copy each dispatch's outputs out and settle it (or fail them); release resources."""
        ctx = self.ctx
        # The stream's work is over: its lease ends before anyone is woken (a caller
        # that resumes finds the stream free); the readback bytes are the flight's own.
        ctx.streams.release(self.stream)
        try:
            if error is not None:
                raise error
            self._settle()
        except Exception as exc:
            failure = ctx.failure(exc, "running the kernel")
            for launch in self.launches:
                launch.completer.fail(failure)
        else:
            kept = self.staging
            if kept is not None and len(kept[0].spare) < SPARE_PER_SHAPE:
                kept[0].spare.append(kept[1])  # outputs copied out: reusable, events and all
            else:
                ctx.recycle(self.events[:3] if self.keep_done else self.events)
        finally:
            self.keep = ()
            self.readback = None
            self.staging = None
            self.results = None

    def _settle(self) -> None:
        launches = self.launches
        if len(launches) == 1:  # a plain launch: the common case, without the lists
            launch = launches[0]
            completer = launch.completer  # (past its deadline, resolve fails it as timed out)
            if completer.wants_phases:
                device_s = record_phases(self.ctx, launches, self.events)
            else:
                events = self.events
                device_s = self.ctx.elapsed_ns(events[1], events[2]) / 1e9
            results = self.results
            if results is not None:  # the staging's readback views
                if len(results) == 1:
                    outputs = [results[0].copy()]
                else:
                    outputs = [view.copy() for view in results]
            else:
                outputs = read_outputs(self.outputs, self.readback, self.readback_at)
            completer.resolve(outputs, device_s=device_s, compile_s=launch.compile_s)
            return
        stopped = [launch.completer.should_stop() for launch in launches]
        device_s = 0.0
        if not all(stopped):
            live = [launch for launch, stop in zip(launches, stopped, strict=True) if not stop]
            traced = [launch for launch in live if launch.completer.wants_phases]
            if traced:  # phases only for dispatches a span shows them on
                device_s = record_phases(self.ctx, traced, self.events) / len(launches)
            else:
                events = self.events
                device_s = self.ctx.elapsed_ns(events[1], events[2]) / 1e9 / len(launches)
        at = self.readback_at
        for launch, stop in zip(launches, stopped, strict=True):
            if stop:  # timed out: nobody takes the result
                launch.completer.fail(timeout_error(launch, started=True))
            else:
                outputs = read_outputs(self.outputs, self.readback, at)
                launch.completer.resolve(outputs, device_s=device_s, compile_s=launch.compile_s)
            at += self.stride


def enqueue_readback(
    rt: Any, layout: ArenaLayout, pinned: Any, readback_at: int, base: int, sp: int
) -> None:
    """Enqueue the copy of a launch's outputs from its arena (at ``base``) into ``pinned``."""
    if layout.download_bytes:
        rt.memcpyAsync(
            pinned.ptr + readback_at,
            base + layout.download_offset,
            layout.download_bytes,
            rt.memcpyDeviceToHost,
            sp,
        )


# Staging kept per launch shape -----------------------------------------------------------
#: A shape whose arena is at most this many bytes keeps its finished launches' arena
#: and pinned staging for the next launch (a few per shape), with the kernel
#: arguments, the ``vy_lens`` bytes and the input views already in place.
SPARE_ARENA_BYTES = 64 << 10
#: Finished stagings kept per launch shape.
SPARE_PER_SHAPE = 2


class Staging:
    """One launch's device arena, pinned staging/readback buffer and events, ready to fill.

    Kept per launch shape between launches (`staging_for`), with everything a
    launch would otherwise build: the typed views of the inputs and outputs in
    the pinned buffer, the kernel arguments and the four events.

    Attributes:
        arena: The device arena.
        pinned: The pinned buffer (staging, then readback).
        views: Per entry of the template's ``uploads``, the typed staging view.
        results: Per output of the template, its typed readback view.
        args: The kernel arguments (pointers into ``arena``, then its base).
        base: The arena's device address.
        events: The launch's four events (upload start, kernel start and end,
            readback end); they stay with the staging while it is kept.
        spare: True when the launch shape reuses it after the launch finishes.
    """

    __slots__ = ("arena", "args", "base", "events", "pinned", "results", "spare", "views")

    def __init__(self, ctx: DeviceContext, template: KernelLayout, stream: Any) -> None:
        layout = template.layout
        self.arena = ctx.alloc(layout.total_bytes, stream)  # the pool ties it to this stream
        self.pinned = pinned = ctx.pinned(template.pinned_bytes)  # staging, then readback
        host = np.frombuffer(pinned, np.uint8, layout.upload_bytes)
        lens = template.lens
        host[: len(lens)] = np.frombuffer(lens, np.uint8)
        self.views = tuple(
            host[offset : offset + nbytes].view(dtype)
            for (_, offset, nbytes), dtype in zip(template.uploads, template.dtypes, strict=True)
        )
        at = template.readback_at
        self.results = tuple(
            np.frombuffer(pinned, out.dtype, out.count, at + out.readback)
            for out in template.outputs
        )
        self.base = base = int(self.arena.ptr)
        self.args = (
            *[np.uint64(base + offset) for offset in template.arg_offsets],
            np.uint64(base),
        )
        self.events = ctx.events(4)
        self.spare = layout.total_bytes <= SPARE_ARENA_BYTES

    def fill(self, template: KernelLayout, inputs: Sequence[Any]) -> None:
        """Copy the launch's host inputs (any shape or strides) into the staging views."""
        for (at, _, _), view in zip(template.uploads, self.views, strict=True):
            item = inputs[at]
            if item.ndim == 1 and item.dtype is view.dtype:  # the usual case, no checks
                view[...] = item
            else:
                copy_in(view, item)


def _stream_attributes(template: KernelLayout, index: int) -> Mapping[str, str | int]:
    """The copy attributes of ``template`` plus ``vyre.stream`` = ``index`` (built once each)."""
    known = template.stream_attributes
    while len(known) <= index:
        known.append({**template.copy_attributes, "vyre.stream": len(known)})
    return known[index]


def staging_for(ctx: DeviceContext, template: KernelLayout, stream: Any) -> Staging:
    """A kept staging of this launch shape, or a new one."""
    try:
        kept: Staging = template.spare.pop()  # finished: its launch's device work is over
        return kept
    except IndexError:
        return Staging(ctx, template, stream)


# Plain launches ---------------------------------------------------------------------------
def enqueue_launch(
    ctx: DeviceContext,
    owner: object,
    launch: Launch,
    kernel: CudaKernel,
    template: KernelLayout | None = None,
) -> None:
    """Enqueue ``launch``'s upload, kernel launch(es) and readback on a leased stream.

    Never synchronises; the `Flight` reaches the completion bridge in stream
    order. ``owner`` is the backend (resident buffers answer only to it);
    ``template`` is `template_for` the launch, when the caller kept it.
    Exceptions propagate as raised (the caller maps them, `DeviceContext.errors`).
    """
    if template is None:
        template = template_for(kernel, launch.plan)
    inputs = launch.inputs
    if launch.resident:
        _enqueue_with_residents(ctx, owner, launch, kernel, template)
        return
    layout = template.layout
    streams = ctx.streams
    ctx.use_device()
    index, stream = streams.lease()
    try:
        staging = staging_for(ctx, template, stream)
        staging.fill(template, inputs)  # each input copied once, into pinned memory
        pinned, base, args = staging.pinned, staging.base, staging.args
        events = staging.events
        rt, sp = ctx.runtime, stream.ptr
        completer = launch.completer
        # One dispatch's operations are contiguous on its stream, and reach the bridge
        # in stream order.
        with streams.ordering(index):
            completer.mark_started()
            completer.annotate_all(_stream_attributes(template, index))
            if completer.wants_phases:  # the upload's start only times its phase
                events[0].record(stream)
            rt.memcpyAsync(base, pinned.ptr, layout.upload_bytes, rt.memcpyHostToDevice, sp)
            if layout.zero_bytes:
                rt.memsetAsync(base + layout.zero_offset, 0, layout.zero_bytes, sp)
            events[1].record(stream)
            geometry = launch.plan.geometry
            if geometry.lanes:
                for _ in range(launch.config.iterations):
                    kernel.function(geometry.grid, geometry.workgroup, args, stream=stream)
            events[2].record(stream)
            enqueue_readback(rt, layout, pinned, template.readback_at, base, sp)
            events[3].record(stream)
            budget = POLL_BUDGET_S if _in_asyncio_loop() else 0.0
            flight = Flight(
                ctx,
                (launch,),
                template.outputs,
                stream=index,
                keep=(staging, stream),
                readback=pinned,
                readback_at=template.readback_at,
                events=events,
                staging=(template, staging) if staging.spare else None,
                results=staging.results,
                ends=template.ends if budget > 0 else None,
            )
            bridge = ctx.bridge
            if budget > 0:
                completer.poll_with(flight.poll, budget_s=budget, give_up=bridge.take_over)
            bridge.submit(flight, queue=index, quiet_s=budget)
    except BaseException:
        streams.release(index)
        raise


# Resident buffers -------------------------------------------------------------------------
@dataclass(eq=False)
class DeviceBuffer:
    """Device memory behind a `ResidentBuffer`, with its stream-ordering events.

    Attributes:
        memory: CuPy's allocation (keeps the memory alive).
        ptr: Its device address.
        nbytes: Its size.
        last_write: Event after the last write (upload, memset, dispatch), or None.
        readers: Events of dispatches reading it since that write.
    """

    memory: Any
    ptr: int
    nbytes: int
    last_write: Any = None
    readers: list[Any] = field(default_factory=list)


def resident_sources(params: Sequence[KernelParam], items: Sequence[Any]) -> list[Source | None]:
    """DIRECT for resident inputs, DEVICE for READ_WRITE ones also passed in another slot."""
    seen = Counter(item.id for item in items if isinstance(item, ResidentBuffer))
    out: list[Source | None] = []
    for param, item in zip(params, items, strict=True):
        if not isinstance(item, ResidentBuffer):
            out.append(None)
        elif param.decl.access is Access.READ_WRITE and seen[item.id] > 1:
            out.append(Source.DEVICE)
        else:
            out.append(Source.DIRECT)
    return out


def _writes(slot: Slot, item: Any) -> bool:
    return isinstance(item, ResidentBuffer) and slot.readback is not None


def _fill_with_residents(
    host: np.ndarray, layout: ArenaLayout, lens: bytes, items: Sequence[Any]
) -> None:
    host[: len(lens)] = np.frombuffer(lens, np.uint8)
    for slot, item in zip(layout.slots, items, strict=True):
        if slot.source is Source.HOST and slot.nbytes:
            assert isinstance(item, np.ndarray) and slot.offset is not None
            copy_in(host[slot.offset : slot.offset + slot.nbytes].view(item.dtype), item)


def _enqueue_with_residents(
    ctx: DeviceContext, owner: object, launch: Launch, kernel: CudaKernel, template: KernelLayout
) -> None:
    """`enqueue_launch` for a launch with resident inputs: own layout, device-side ordering."""
    params = kernel.source.params
    items: list[Any] = [None if at is None else launch.inputs[at] for at in template.inputs]
    layout = plan_layout(
        [p.decl.access for p in params], template.counts, resident_sources(params, items)
    )
    readback_at, pinned_bytes = _pinned_sizes(layout)
    outputs = _output_slots(launch.plan, params, layout.slots)
    ctx.use_device()
    index, stream = ctx.streams.lease()
    try:
        arena = ctx.alloc(layout.total_bytes, stream)
        pinned = ctx.pinned(pinned_bytes)
        _fill_with_residents(
            np.frombuffer(pinned, np.uint8, layout.upload_bytes), layout, template.lens, items
        )
        events = ctx.events(4)
        base = int(arena.ptr)
        rt, sp = ctx.runtime, stream.ptr
        with ctx.streams.ordering(index):
            launch.completer.mark_started()
            launch.completer.annotate("vyre.stream", index)
            launch.completer.annotate_all(template.copy_attributes)
            events[0].record(stream)
            rt.memcpyAsync(base, pinned.ptr, layout.upload_bytes, rt.memcpyHostToDevice, sp)
            residents = _order_residents(ctx, owner, items, layout, stream)
            for slot, item in zip(layout.slots, items, strict=True):
                if slot.source is Source.DEVICE:
                    assert isinstance(item, ResidentBuffer) and slot.offset is not None
                    source = item.native(owner)
                    rt.memcpyAsync(
                        base + slot.offset, source.ptr, slot.nbytes, rt.memcpyDeviceToDevice, sp
                    )
            if layout.zero_bytes:
                rt.memsetAsync(base + layout.zero_offset, 0, layout.zero_bytes, sp)
            events[1].record(stream)
            args = [
                np.uint64(
                    int(item.native(owner).ptr)
                    if slot.source is Source.DIRECT
                    else base + int(slot.offset or 0)
                )
                for slot, item in zip(layout.slots, items, strict=True)
            ]
            args.append(np.uint64(base))
            geometry = launch.plan.geometry
            if geometry.lanes:
                for _ in range(launch.config.iterations):
                    kernel.function(geometry.grid, geometry.workgroup, tuple(args), stream=stream)
            events[2].record(stream)
            for slot, item in zip(layout.slots, items, strict=True):
                if slot.source is Source.DEVICE and _writes(slot, item):
                    assert isinstance(item, ResidentBuffer) and slot.offset is not None
                    target = item.native(owner)
                    rt.memcpyAsync(
                        target.ptr, base + slot.offset, slot.nbytes, rt.memcpyDeviceToDevice, sp
                    )
            readback = pinned.ptr + readback_at
            if layout.download_bytes:
                rt.memcpyAsync(
                    readback,
                    base + layout.download_offset,
                    layout.download_bytes,
                    rt.memcpyDeviceToHost,
                    sp,
                )
            for slot, item in zip(layout.slots, items, strict=True):
                if slot.source is Source.DIRECT and slot.readback is not None and slot.nbytes:
                    assert isinstance(item, ResidentBuffer)
                    rt.memcpyAsync(
                        readback + slot.readback,
                        item.native(owner).ptr,
                        slot.nbytes,
                        rt.memcpyDeviceToHost,
                        sp,
                    )
            events[3].record(stream)
            _after_residents(ctx, residents, events[3])
            flight = Flight(
                ctx,
                (launch,),
                outputs,
                stream=index,
                keep=(arena, pinned, stream, residents),
                readback=pinned,
                readback_at=readback_at,
                events=events,
                keep_done=bool(residents),  # events[3] orders the resident buffers
            )
            ctx.bridge.submit(flight, queue=index)
    except BaseException:
        ctx.streams.release(index)
        raise


def _order_residents(
    ctx: DeviceContext, owner: object, items: list[Any], layout: ArenaLayout, stream: Any
) -> list[tuple[DeviceBuffer, bool]]:
    """Make ``stream`` wait for earlier work on the resident buffers this dispatch uses."""
    uses: dict[int, tuple[DeviceBuffer, bool]] = {}
    for slot, item in zip(layout.slots, items, strict=True):
        if isinstance(item, ResidentBuffer):
            buf = item.native(owner)
            written = _writes(slot, item)
            previous = uses.get(id(buf))
            uses[id(buf)] = (buf, written or (previous is not None and previous[1]))
    with ctx.lock:
        for buf, written in uses.values():
            if buf.last_write is not None:
                stream.wait_event(buf.last_write)
            if written:
                for event in buf.readers:
                    stream.wait_event(event)
    return list(uses.values())


def _after_residents(ctx: DeviceContext, uses: list[tuple[DeviceBuffer, bool]], done: Any) -> None:
    with ctx.lock:
        for buf, written in uses:
            if written:
                buf.last_write, buf.readers = done, []
            else:
                note_reader(buf, done)


def note_reader(buf: DeviceBuffer, done: Any) -> None:
    """Add ``done`` to ``buf``'s readers (under ``ctx.lock``): later writers wait for it."""
    if len(buf.readers) >= _READERS_KEPT:
        buf.readers = [e for e in buf.readers if not e.done]
    buf.readers.append(done)


class ResidentCopy:
    """A resident-buffer upload or memset, watched so its staging and stream lease are released."""

    __slots__ = ("ctx", "done", "keep", "stream")

    def __init__(self, ctx: DeviceContext, stream: int, done: Any, keep: tuple[Any, ...]) -> None:
        self.ctx = ctx
        self.stream = stream
        self.done = done
        self.keep = keep

    def ready(self) -> bool:
        """Return True once the copy finished."""
        return bool(self.done.done)

    def abandon(self, error: BaseException) -> None:
        """The backend closed before the copy ended: nothing waits on it."""

    def finish(self, error: BaseException | None) -> None:
        """Release the staging memory and the stream lease; log a device error."""
        self.ctx.streams.release(self.stream)
        self.keep = ()
        if error is not None:
            failure = self.ctx.translate(error, "copying a resident buffer")
            _log.error("resident buffer copy failed: %s", failure)
