"""Programs with grid-wide barriers on CUDA: one cooperative launch, or one launch per segment.

A `vyre_async.ir.GridBarrier` program compiles (`CupyExecutor.build_pipeline`)
into a `GridKernel`: one ordinary kernel per segment of
`vyre_async.split_at_grid_barriers`, and, on a device with cooperative launch,
the whole program as ONE kernel whose grid barriers are
``cooperative_groups::this_grid().sync()``. Each launch shape is decided ONCE,
when the driver plans it (`plan_grid`, from ``plan_shape``):

- **cooperative** when the device has cooperative launch and the whole grid is
  co-resident (`co_resident`: at most the occupancy API's blocks per SM times
  the SMs): one launch with ``enable_cooperative_groups=True``;
- **split** otherwise: every segment's kernel, launched back to back on the
  dispatch's own stream over the same device buffers. Stream order is the fence
  between segments (no host synchronisation), and each launch starts with zeroed
  shared memory, as the IR says workgroup memory is after a grid barrier.

Either way a dispatch is the launch path of `vyre_cupy.launch` unchanged — one
upload, one memset, the launch(es), one readback, one settled dispatch —
because the shape's `GridShape.kernel` is a `CudaKernel` whose ``function``
(`SegmentRun`) makes those launches. `DispatchConfig(cooperative=True)` means
"one launch": a shape that cannot be one fails with
`CooperativeResidencyExceeded` (or `UnsupportedFeature` when the cooperative
kernel could not be built).

The span of each dispatch carries ``vyre.grid_sync`` (``cooperative`` or
``split``, with ``vyre.grid_sync.reason`` when split) and ``vyre.segments``;
a traced split dispatch also records one ``vyre.segment`` phase per segment
launch, from CUDA events recorded between the launches on its stream
(`SegmentPhases`), anchored where its ``vyre.launch`` phase starts. A
cooperative launch has no per-segment times (nothing is recorded per segment).

Layering: imports `vyre_cupy.context`, `kernel` and `launch`; imported by
`vyre_cupy.backend` only.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Sequence
from typing import Any, cast

from vyre_async.abc import BindingPlan, DispatchCompleter, DispatchConfig, Launch
from vyre_async.abc import public_dir as _public_dir
from vyre_async.errors import CooperativeResidencyExceeded, UnsupportedFeature
from vyre_cupy.context import DeviceContext
from vyre_cupy.kernel import CudaKernel, GridKernel, GridShape
from vyre_cupy.launch import enqueue_launch, template_for

__all__ = [
    "SegmentPhases",
    "SegmentRun",
    "choose_mode",
    "co_resident",
    "enqueue_grid",
    "plan_grid",
    "refusal",
]
__dir__ = _public_dir(__name__)

_log = logging.getLogger("vyre_async.cupy")


def co_resident(blocks: int, blocks_per_sm: int, sm_count: int) -> bool:
    """True when a grid of ``blocks`` workgroups can all be resident on the device at once.

    A cooperative launch runs only then (CUDA refuses a larger one with
    ``cudaErrorCooperativeLaunchTooLarge``): at most ``blocks_per_sm`` (the
    occupancy API's answer for the kernel and its workgroup) on each of the
    ``sm_count`` multiprocessors.
    """
    return blocks_per_sm >= 1 and sm_count >= 1 and 0 <= blocks <= blocks_per_sm * sm_count


def choose_mode(
    *,
    segments: int,
    blocks: int,
    reason: str,
    blocks_per_sm: int | None,
    sm_count: int,
) -> tuple[bool, str]:
    """Decide how one launch shape runs: ``(True, "")`` cooperative, or ``(False, reason)`` split.

    Args:
        segments: Segments of the program (one needs no grid synchronisation).
        blocks: Workgroups in the grid.
        reason: `GridKernel.reason`: ``""`` when there is a cooperative kernel.
        blocks_per_sm: The occupancy of the cooperative kernel for the shape's
            workgroup; None when it could not be asked.
        sm_count: The device's multiprocessors.

    Returns:
        Whether to launch cooperatively, and else why not (a span reason):
        ``one_segment``, the kernel's ``reason``, ``occupancy_unknown`` or
        ``not_co_resident``.
    """
    if segments <= 1:
        return False, "one_segment"
    if reason:
        return False, reason
    if blocks_per_sm is None:
        return False, "occupancy_unknown"
    if not co_resident(blocks, blocks_per_sm, sm_count):
        return False, "not_co_resident"
    return True, ""


def refusal(
    why: str,
    *,
    grid: tuple[int, int, int],
    workgroup: tuple[int, int, int],
    blocks_per_sm: int | None,
    sm_count: int,
    note: str = "",
    device: str = "the GPU",
) -> CooperativeResidencyExceeded | UnsupportedFeature:
    """The error of a ``DispatchConfig(cooperative=True)`` shape that cannot run as one launch."""
    blocks = grid[0] * grid[1] * grid[2]
    split = (
        "or drop DispatchConfig(cooperative=True): the backend then runs the program as one "
        "launch per grid-barrier segment, back to back on one stream"
    )
    if why == "not_co_resident":
        most = (blocks_per_sm or 0) * sm_count
        return CooperativeResidencyExceeded(
            f"cooperative=True needs all {blocks} workgroups of grid {grid} resident at once, "
            f"but {device} holds at most {most} workgroups of {workgroup} lanes of this "
            f"program's kernel ({blocks_per_sm} per multiprocessor x {sm_count}), so it cannot "
            "run as one cooperative launch",
            fix=f"dispatch a smaller grid (at most {most} workgroups: fewer elements per "
            f"dispatch, or a grid_override), {split}",
        )
    if why == "occupancy_unknown":
        cause = "the CUDA occupancy API could not be asked how many workgroups fit at once"
    elif why == "cooperative_kernel_failed":
        cause = f"its cooperative kernel did not compile ({note})"
    else:
        cause = note or "the device has no cooperative launch"
    return UnsupportedFeature(
        f"cooperative=True cannot run this grid-barrier program as one launch: {cause}",
        fix=f"check the CUDA headers NVRTC is given (CUDA_PATH) for cooperative_groups.h, {split}",
        feature="grid_sync",
    )


class SegmentRun:
    """The launches of a grid-barrier dispatch: `GridShape.kernel`'s ``function``.

    Called like a CuPy kernel function, ``run(grid, workgroup, args, stream=s)``
    (once per ``DispatchConfig.iterations``), it enqueues on ``s``: the
    cooperative kernel as one cooperative launch, or every segment's kernel in
    order. Given an ``events`` list (a traced dispatch), it records a CUDA event
    before the first launch and after each, for `SegmentPhases`.
    """

    __slots__ = ("cooperative", "ctx", "events", "functions")

    def __init__(
        self,
        ctx: DeviceContext,
        functions: tuple[Any, ...],
        *,
        cooperative: bool,
        events: list[Any] | None = None,
    ) -> None:
        self.ctx = ctx
        self.functions = functions
        self.cooperative = cooperative
        self.events = events

    def __call__(
        self, grid: tuple[int, int, int], block: tuple[int, int, int], args: Any, *, stream: Any
    ) -> None:
        functions = self.functions
        if self.cooperative:
            functions[0](grid, block, args, stream=stream, enable_cooperative_groups=True)
            return
        events = self.events
        if events is None:
            for function in functions:
                function(grid, block, args, stream=stream)
            return
        if not events:
            events += self.ctx.events(1)
            events[0].record(stream)
        for function in functions:
            function(grid, block, args, stream=stream)
            (done,) = self.ctx.events(1)
            done.record(stream)
            events.append(done)


class SegmentPhases:
    """A traced split dispatch's completer: records its ``vyre.segment`` phases, then settles.

    Stands in for the dispatch's `DispatchCompleter` on the launch path (every
    other call goes to it unchanged). When the flight records the dispatch's
    ``vyre.launch`` phase (its kernel time, from the launch's own events,
    anchored at its measured completion), that start is kept; on ``resolve``
    each segment launch becomes one ``vyre.segment`` phase from there, by the
    device time between the events `SegmentRun` recorded around it. Nothing
    is recorded when the dispatch records no phases.
    """

    __slots__ = ("ctx", "events", "inner", "started")

    def __init__(self, ctx: DeviceContext, inner: DispatchCompleter, events: list[Any]) -> None:
        self.ctx = ctx
        self.inner = inner
        self.events = events
        self.started: int | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def record_phase(self, name: str, start_ns: int, end_ns: int) -> None:
        """Record a phase on the dispatch; keep where its ``vyre.launch`` phase starts."""
        if name == "vyre.launch":
            self.started = start_ns
        self.inner.record_phase(name, start_ns, end_ns)

    def resolve(
        self,
        outputs: Sequence[Any],
        *,
        device_s: float | None = None,
        compile_s: float | None = None,
    ) -> bool:
        """Record the segments' phases, then settle the dispatch with ``outputs``."""
        self.record_segments()
        return self.inner.resolve(outputs, device_s=device_s, compile_s=compile_s)

    def record_segments(self) -> None:
        """One ``vyre.segment`` phase per segment launch, in order (once)."""
        events, started = self.events, self.started
        if started is None or len(events) < 2:
            return
        self.events = []
        ctx, first = self.ctx, events[0]
        at = [started + round(ctx.elapsed_ns(first, event)) for event in events]
        for start, end in itertools.pairwise(at):
            self.inner.record_phase("vyre.segment", start, end)
        ctx.recycle(events)


def plan_grid(
    ctx: DeviceContext, kernel: GridKernel, plan: BindingPlan, config: DispatchConfig
) -> GridShape:
    """Decide, once per launch shape, how a grid-barrier program runs (``plan_shape``).

    Asks the occupancy API (once per workgroup size) how many workgroups of the
    cooperative kernel one SM holds; a shape whose grid fits on every SM at once
    runs cooperatively, any other splits (`choose_mode`).

    Raises:
        CooperativeResidencyExceeded: ``config.cooperative`` and the grid is not
            co-resident.
        UnsupportedFeature: ``config.cooperative`` and there is no cooperative
            kernel (it failed to compile) or its occupancy is unknown.
    """
    geometry = plan.geometry
    grid, workgroup = geometry.grid, geometry.workgroup
    lanes = workgroup[0] * workgroup[1] * workgroup[2]
    blocks = grid[0] * grid[1] * grid[2]
    sm_count = ctx.info.attribute("MultiProcessorCount", 0)
    segments = kernel.segments
    per_sm: int | None = 0
    if kernel.cooperative is not None and len(segments) > 1:
        if lanes in kernel.occupancy:
            per_sm = kernel.occupancy[lanes]
        else:
            ctx.use_device()
            try:
                per_sm = ctx.blocks_per_sm(kernel.cooperative.function, lanes)
            except Exception:  # an older CuPy, a driver without the API: split instead
                _log.warning(
                    "cannot ask the CUDA occupancy of a cooperative kernel; its grid-barrier "
                    "program runs split at its barriers",
                    exc_info=True,
                )
                per_sm = None
            kernel.occupancy[lanes] = per_sm
    cooperative, reason = choose_mode(
        segments=len(segments),
        blocks=blocks,
        reason=kernel.reason,
        blocks_per_sm=per_sm,
        sm_count=sm_count,
    )
    if config.cooperative and not cooperative and len(segments) > 1:
        raise refusal(
            reason,
            grid=grid,
            workgroup=workgroup,
            blocks_per_sm=per_sm,
            sm_count=sm_count,
            note=kernel.note,
            device=ctx.info.name,
        )
    first = segments[0]
    if cooperative:
        assert kernel.cooperative is not None
        functions: tuple[Any, ...] = (kernel.cooperative.function,)
    else:
        functions = tuple(segment.function for segment in segments)
    attributes: dict[str, str | int] = {
        "vyre.grid_sync": "cooperative" if cooperative else "split",
        "vyre.segments": len(segments),
    }
    if reason:
        attributes["vyre.grid_sync.reason"] = reason
    run = SegmentRun(ctx, functions, cooperative=cooperative)
    return GridShape(
        layout=template_for(first, plan),
        cooperative=cooperative,
        kernel=CudaKernel(first.source, first.compiled, run, templates=first.templates),
        functions=functions,
        segments=len(segments),
        blocks=blocks,
        resident=(per_sm or 0) * sm_count,
        attributes=attributes,
    )


def enqueue_grid(ctx: DeviceContext, owner: object, launch: Launch, shape: GridShape) -> None:
    """Enqueue a grid-barrier dispatch as its shape decided (`vyre_cupy.launch.enqueue_launch`).

    Host or resident inputs alike: one upload, the cooperative launch or the
    segments' launches on the dispatch's stream, one readback, one completion.
    Exceptions propagate as raised (the caller maps them, `DeviceContext.failure`).
    """
    completer = launch.completer
    completer.annotate_all(shape.attributes)
    if shape.cooperative or not completer.wants_phases:
        enqueue_launch(ctx, owner, launch, shape.kernel, shape.layout)
        return
    events: list[Any] = []
    run = SegmentRun(ctx, shape.functions, cooperative=False, events=events)
    phases = cast(DispatchCompleter, SegmentPhases(ctx, completer, events))
    traced = Launch(
        launch.pipeline,
        launch.plan,
        launch.inputs,
        launch.config,
        launch.pending,
        phases,
        launch.compile_s,
        launch.template,
        launch.resident,
        launch.shape,
    )
    kernel = dataclasses.replace(shape.kernel, function=run)
    enqueue_launch(ctx, owner, traced, kernel, shape.layout)
