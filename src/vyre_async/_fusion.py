"""Fusion of a batch's independent dispatches into fewer launches: the driver's half.

`vyre_async.policies.pipeline_fusion.decide_fusion` decides from plain data
whether the planned launches of one ``dispatch_batch`` run fused and how they
group; `vyre_async.ir.fusion.fuse_programs` builds each group's program (each
workgroup range runs one member). This module joins them to a front end: it
describes the launches to the policy, records the verdict on every member's
span, plans and enqueues one launch per group, and settles every member's
dispatch with its own slice of the outputs. Members keep their own
`PendingDispatch`, span, timeout and outputs, byte for byte those of a
separate dispatch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, MutableSet, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from vyre_async._calibration import Calibration, calibration_for
from vyre_async._exports import public_dir as _public_dir
from vyre_async._pending import PendingDispatch, settle_hook
from vyre_async.errors import BackendError, InvalidArgument
from vyre_async.ir.fusion import FusedProgram, fuse_programs
from vyre_async.policies.pipeline_fusion import (
    FusionMember,
    FusionVerdict,
    decide_fusion,
    describe_member,
)

if TYPE_CHECKING:
    from vyre_async._config import DispatchConfig
    from vyre_async._execution import ExecutionDecision
    from vyre_async._executor import Executor, Launch
    from vyre_async._seams import BackendLike, PipelineLike
    from vyre_async.ir.program import Program

__all__ = [
    "FUSION_MODES",
    "FusionRequest",
    "enqueue_groups",
    "fuse_batch",
    "fusion_request",
    "group_verdict",
]
__dir__ = _public_dir(__name__)

FusionMode = Literal["auto", "force", "disable"]
#: What ``dispatch_batch(..., fusion=...)`` accepts.
FUSION_MODES: tuple[FusionMode, ...] = ("auto", "force", "disable")


class FrontEnd(Protocol):
    """The dispatch front end as fusion uses it (`vyre_async._frontend.DispatchFrontEnd`)."""

    executor: Executor
    lookup: Callable[[Program, DispatchConfig], tuple[Any, bool]]

    @property
    def fused_programs(self) -> MutableSet[Any]:
        """Member programs (tuples) whose fused program was compiled here."""

    def plan(
        self,
        pipeline: PipelineLike,
        inputs: Sequence[Any],
        config: DispatchConfig | None,
        program: Program | None = None,
    ) -> Launch: ...


@dataclass(frozen=True, slots=True)
class FusionRequest:
    """What a batch asks of fusion: the mode, and what the policy weighs.

    Attributes:
        mode: ``"auto"`` (the policy decides), ``"force"`` (fuse whenever it is
            legal) or ``"disable"`` (never).
        calibration: The backend's cached calibration, or None.
        max_storage_buffers: Storage bindings one launch may use (0: not reported).
        max_workgroup_bytes: Workgroup memory of one workgroup (0: not reported).
    """

    mode: FusionMode
    calibration: Calibration | None
    max_storage_buffers: int
    max_workgroup_bytes: int


def fusion_request(mode: object, backend: BackendLike) -> FusionRequest:
    """Check ``mode`` and return the request for a batch on ``backend``.

    ``"auto"`` reads the backend's cached calibration (`calibration_for`, never
    measured here).

    Raises:
        InvalidArgument: ``mode`` is not ``"auto"``, ``"force"`` or ``"disable"``.
    """
    if mode not in FUSION_MODES:
        raise InvalidArgument(
            f"fusion must be one of {', '.join(map(repr, FUSION_MODES))}, got {mode!r}",
            fix='pass fusion="auto" (the policy decides), "force" or "disable"',
        )
    calibration = calibration_for(backend) if mode == "auto" else None
    caps = backend.capabilities()
    return FusionRequest(
        mode,
        calibration,
        caps.max_storage_buffers,
        caps.max_workgroup_memory_bytes,
    )


def _early(n: int, request: FusionRequest) -> FusionVerdict | None:
    """The common answers, without describing any member: never, or not here."""
    if request.mode == "disable":
        return FusionVerdict.separate(n, "disabled")
    if request.mode == "auto":
        cal = request.calibration
        if cal is None or cal.fusion_gain_bps is None:
            return FusionVerdict.separate(n, "uncalibrated")
        if cal.fusion_gain_bps <= 0:
            return FusionVerdict.separate(n, "not_worth_it")
    return None


def _config_block(configs: Sequence[DispatchConfig]) -> str | None:
    """A reason the members' configs keep them separate, or None."""
    config = configs[0]
    if config.workgroup_override is not None:
        return "workgroup_override"
    if config.cooperative:
        return "cooperative"
    # A fused launch runs under one config: the members' must agree (labels aside).
    plain = dataclasses.replace(config, label=None)
    if any(c is not config and dataclasses.replace(c, label=None) != plain for c in configs):
        return "config_mismatch"
    return None


def _decide(
    front: FrontEnd,
    members: Sequence[FusionMember],
    programs: tuple[Program, ...],
    request: FusionRequest,
    blocked: str | None,
) -> FusionVerdict:
    cal = request.calibration
    compiled = programs in front.fused_programs
    return decide_fusion(
        members,
        launch_ns=None if cal is None else cal.launch_ns,
        compile_ns=0 if compiled else (None if cal is None else cal.compile_ns),
        fusion_gain_bps=None if cal is None else cal.fusion_gain_bps,
        max_storage_buffers=request.max_storage_buffers,
        max_workgroup_bytes=request.max_workgroup_bytes,
        mode=request.mode,
        blocked=blocked,
    )


def _verdict(front: FrontEnd, launches: Sequence[Launch], request: FusionRequest) -> FusionVerdict:
    early = _early(len(launches), request)
    if early is not None:
        return early
    blocked = None
    if any(launch.resident for launch in launches):
        blocked = "resident_inputs"  # one pipeline's items may share a resident buffer
    else:
        blocked = _config_block([launches[0].config])
    members = [
        describe_member(launch.plan.program, launch.plan.geometry.workgroups) for launch in launches
    ]
    programs = tuple(launch.plan.program for launch in launches)
    return _decide(front, members, programs, request, blocked)


def group_verdict(
    front: FrontEnd,
    programs: Sequence[Program],
    configs: Sequence[DispatchConfig],
    reads: Sequence[frozenset[str]],
    writes: Sequence[frozenset[str]],
    request: FusionRequest,
) -> FusionVerdict:
    """The fusion verdict for dispatching different ``programs`` together (an arm graph's layer).

    Decided before anything is planned, so a separate verdict changes nothing
    about how the members run. ``reads`` and ``writes`` name what each member
    touches (the graph's resources; resident buffers included, since every
    member's identities are exact); members' grids are not known yet and do not
    enter the verdict.
    """
    n = len(programs)
    early = _early(n, request)
    if early is not None:
        return early
    members = [
        describe_member(program, 0, reads=r, writes=w)
        for program, r, w in zip(programs, reads, writes, strict=True)
    ]
    return _decide(front, members, tuple(programs), request, _config_block(configs))


def fuse_batch(
    front: FrontEnd,
    launches: Sequence[Launch],
    request: FusionRequest,
    decision: ExecutionDecision,
) -> bool:
    """Decide fusion for a planned batch; when fused, enqueue its launches.

    Every member's span gets the verdict's attributes (which members were fused
    and why, or why not). Returns True when the batch was enqueued here: one
    launch per group of the verdict, members alone in their group through the
    executor's ``enqueue_batch``. Returns False when the caller enqueues the
    batch as usual (the verdict is to keep them separate). A group whose fused
    program cannot be built runs its members separately, each span naming the
    error in ``vyre.policy.fusion.fallback``: never worse than separate launches.

    Raises:
        BackendError: a launch could not be enqueued (the backend was closed).
    """
    verdict = _verdict(front, launches, request)
    if verdict.kind != "fuse":
        attributes = verdict.span_attributes()
        for launch in launches:
            launch.completer.annotate_all(attributes)
        return False
    enqueue_groups(front, launches, verdict, decision)
    return True


def enqueue_groups(
    front: FrontEnd,
    launches: Sequence[Launch],
    verdict: FusionVerdict,
    decision: ExecutionDecision | None,
) -> list[str]:
    """Enqueue planned ``launches`` as ``verdict`` groups them; spans get its attributes.

    Each group of more than one member is one fused launch. A group whose
    fused program cannot be built runs its members alone, each span naming the
    error in ``vyre.policy.fusion.fallback``. With ``decision`` (a batch),
    members alone go to the executor's ``enqueue_batch`` together, and a launch
    that cannot be enqueued raises. Without it (an arm graph's layer), each is
    enqueued on its own, and a launch that cannot be enqueued fails the members
    not enqueued yet with its error instead of raising: those already enqueued
    run and settle as usual, so a caller that awaits every member never
    releases a buffer under a running launch.

    Returns:
        The error type of each group that ran alone because its fused program
        could not be built (empty when every group fused).

    Raises:
        BackendError: with ``decision``, a launch could not be enqueued (the
            backend was closed).
    """
    attributes = verdict.span_attributes()
    for launch in launches:
        launch.completer.annotate_all(attributes)
    fallbacks: list[str] = []
    enqueued: set[int] = set()
    try:
        alone: list[int] = []
        for group in verdict.groups:
            if len(group) > 1:
                error = _enqueue_group(front, [launches[i] for i in group])
                if error is None:
                    enqueued.update(group)
                    continue
                fallbacks.append(error)
            alone.extend(group)
        if decision is not None:
            if alone:
                front.executor.enqueue_batch([launches[i] for i in alone], decision)
        else:
            for i in alone:
                front.executor.enqueue(launches[i])
                enqueued.add(i)
    except Exception as exc:
        if decision is not None:
            raise
        for i, launch in enumerate(launches):
            if i not in enqueued:
                launch.completer.fail(exc)
    return fallbacks


def _enqueue_group(front: FrontEnd, members: Sequence[Launch]) -> str | None:
    """Plan and enqueue one fused launch for ``members``.

    Returns None, or the error type when the fused program cannot be built
    (nothing was enqueued then).

    Raises:
        BackendError: the fused launch could not be enqueued.
    """
    programs = tuple(launch.plan.program for launch in members)
    grids = [launch.plan.geometry.grid for launch in members]
    try:
        fused = fuse_programs(programs)
        first = members[0].config
        config = dataclasses.replace(
            first,
            grid_override=fused.grid(grids),
            label=f"fused x{len(members)}" if first.label is None else f"{first.label} (fused)",
            speculation="disable",
        )
        inputs = fused.fused_inputs([list(launch.inputs) for launch in members], grids)
        pipeline, _ = front.lookup(fused.program, config)
        # (the pipeline may be another fused program's of the same body, other counts)
        launch = front.plan(pipeline, inputs, config, fused.program)
    except BackendError as exc:
        for member in members:
            member.completer.annotate("vyre.policy.fusion.fallback", type(exc).__name__)
        return type(exc).__name__
    front.fused_programs.add(programs)
    settle_hook(launch.pending, _settle(fused, members))
    front.executor.enqueue(launch)
    return None


def _settle(fused: FusedProgram, members: Sequence[Launch]) -> Callable[[PendingDispatch], None]:
    def settle(pending: PendingDispatch) -> None:
        try:
            outputs = pending.result()
        except BaseException as exc:
            for member in members:
                member.completer.fail(exc)
            return
        timing = pending.timing
        device_s = None if timing is None else timing.device_s
        phases = pending.record.phases or ()
        for index, (member, own) in enumerate(
            zip(members, fused.split_outputs(outputs), strict=True)
        ):
            completer = member.completer
            completer.annotate("vyre.fusion.index", index)
            for name, start, end in phases:
                completer.record_phase(name, start, end)
            completer.resolve(own, device_s=device_s)

    return settle
