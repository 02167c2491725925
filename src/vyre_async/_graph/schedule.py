"""How an arm graph run is scheduled: the steps, their placement and their execution mode."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from vyre_async._config import DispatchConfig
from vyre_async._exports import public_dir as _public_dir
from vyre_async._graph.model import Arm, GraphResource
from vyre_async._pending import PendingDispatch
from vyre_async.ir.program import Program
from vyre_async.ir.types import Access, BufferDecl, DType
from vyre_async.policies.arms import ArmConflict, ArmPlan, plan_arms
from vyre_async.policies.residency import ResidencyVerdict
from vyre_async.telemetry import DispatchAttribute

if TYPE_CHECKING:
    pass

__all__ = []
__dir__ = _public_dir(__name__)


def _residency_attributes(verdict: ResidencyVerdict) -> dict[str, DispatchAttribute]:
    return {"vyre.policy.residency": verdict.kind, "vyre.policy.residency.reason": verdict.reason}


def _resident_variant(program: Program) -> Program:
    """``program`` with WRITE buffers made READ_WRITE, to run on fresh zeroed resident buffers.

    WRITE buffers start zero-filled and READ_WRITE ones from their input, so on a
    zeroed buffer the two are the same kernel; the outputs (WRITE and READ_WRITE,
    in declaration order) and the inferred grid are unchanged.
    """
    variant = program.memo.get("graph.resident_variant")
    if variant is None:
        if any(d.access is Access.WRITE for d in program.buffers):
            buffers = [
                BufferDecl(d.name, d.binding, Access.READ_WRITE, d.dtype, d.count)
                if d.access is Access.WRITE
                else d
                for d in program.buffers
            ]
            variant = Program(buffers, program.workgroup_size, program.body, op_id=program.op_id)
        else:
            variant = program
        program.memo["graph.resident_variant"] = variant
    assert isinstance(variant, Program)
    return variant


def _settled_at(pending: PendingDispatch) -> float:
    """When a dispatch's result was ready (``time.monotonic()`` clock)."""
    timing = pending.timing
    return pending.created + (0.0 if timing is None or timing.wall_s is None else timing.wall_s)


def _persistent_mode(arms: Sequence[Arm]) -> Literal["auto", "force", "disable"]:
    modes = {arm.config.persistent_thread for arm in arms if arm.config is not None}
    if "disable" in modes:
        return "disable"
    return "force" if "force" in modes else "auto"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Step:
    """One arm as every run of its graph dispatches it (built once per graph version)."""

    arm: Arm
    layer: int
    inputs: tuple[str, ...]  # the resource of each program input, in order
    outputs: tuple[str, ...]  # the resource of each program output, in order
    resident_program: Program  # WRITE buffers as READ_WRITE (`_resident_variant`)
    resident_inputs: tuple[str, ...]  # the resource of each resident_program input
    fresh: tuple[bool, ...]  # per input of resident_program: a WRITE buffer (fresh zeroed)
    attributes: Mapping[str, DispatchAttribute]  # span attributes that depend on the graph only
    waits: ArmConflict | None
    conflicts: tuple[ArmConflict, ...]
    layer_mates: tuple[int, ...]  # the other arms of its layer


@dataclass(frozen=True, slots=True, kw_only=True)
class _Schedule:
    """Everything about a graph version that runs do not change: plan, steps, uploads."""

    version: int
    label: str | None
    resources: Mapping[str, GraphResource]
    plan: ArmPlan
    steps: tuple[_Step, ...]
    uploads: tuple[str, ...]  # resources some arm reads before any arm WRITEs them
    writes_bool: bool  # an arm writes a BOOL resource (host joins)
    last_writer: Mapping[str, int]  # resource -> the last arm (submission order) writing it
    execution_config: DispatchConfig

    @staticmethod
    def build(
        label: str | None,
        version: int,
        arms: tuple[Arm, ...],
        resources: dict[str, GraphResource],
    ) -> _Schedule:
        plan = plan_arms([arm.summary for arm in arms])
        steps: list[_Step] = []
        first_use: dict[str, bool] = {}  # resource -> whether its first use reads it
        for arm in arms:
            layer = plan.layer_of[arm.index]
            bound = dict(arm.bindings)
            program = arm.program
            inputs = tuple(bound[d.name] for d in program.inputs)
            for decl in program.buffers:
                if decl.access is Access.WORKGROUP:
                    continue
                first_use.setdefault(bound[decl.name], decl.access is not Access.WRITE)
            variant = _resident_variant(program)
            fresh = tuple(program.buffer(d.name).access is Access.WRITE for d in variant.inputs)
            waits = plan.waits_for(arm.index)
            attributes: dict[str, DispatchAttribute] = {
                "vyre.arm.index": arm.index,
                "vyre.arm.label": arm.label,
                "vyre.policy.arm.layer": layer,
                "vyre.policy.arm.concurrent": len(plan.layers[layer]) > 1,
            }
            if label:
                attributes["vyre.graph.label"] = label
            if waits is not None:
                attributes["vyre.policy.arm.reason"] = waits.reason
                attributes["vyre.policy.arm.after"] = waits.earlier
            steps.append(
                _Step(
                    arm=arm,
                    layer=layer,
                    inputs=inputs,
                    outputs=tuple(bound[d.name] for d in program.outputs),
                    resident_program=variant,
                    resident_inputs=tuple(bound[d.name] for d in variant.inputs),
                    fresh=fresh,
                    attributes=attributes,
                    waits=waits,
                    conflicts=tuple(c for c in plan.conflicts if c.later == arm.index),
                    layer_mates=tuple(i for i in plan.layers[layer] if i != arm.index),
                )
            )
        return _Schedule(
            version=version,
            label=label,
            resources=resources,
            plan=plan,
            steps=tuple(steps),
            uploads=tuple(sorted(name for name, reads in first_use.items() if reads)),
            writes_bool=any(
                decl.access.is_output and decl.dtype is DType.BOOL
                for arm in arms
                for decl in arm.program.buffers
            ),
            execution_config=DispatchConfig(persistent_thread=_persistent_mode(arms)),
            last_writer={resource: step.arm.index for step in steps for resource in step.outputs},
        )
