"""Run a program on numpy: every lane of the grid at once, statement by statement.

`execute` is the whole pipeline (check inputs, plan the launch, run);
`run_plan` runs a launch a caller has already planned with
`vyre_async.abc.plan_dispatch`. Both are synchronous and free of driver
policy: no threads, no timeouts (only a cooperative ``cancel`` event).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from vyre_async.abc import BindingPlan, HostInput, normalize_inputs, plan_dispatch
from vyre_async.abc import public_dir as _public_dir
from vyre_async.errors import InvalidArgument, InvalidProgram
from vyre_async.ir.program import Program
from vyre_async.ir.types import Access
from vyre_reference.compile import CompiledProgram, compile_program
from vyre_reference.frame import Env, Frame, run_body
from vyre_reference.lanes import GridLanes
from vyre_reference.memory import LaunchState

__all__ = ["execute", "run_plan"]
__dir__ = _public_dir(__name__)


def execute(
    program: Program,
    inputs: Sequence[HostInput],
    *,
    grid_override: int | Sequence[int] | None = None,
    workgroup_override: int | Sequence[int] | None = None,
    fixpoint_iterations: int = 1,
    cancel: threading.Event | None = None,
) -> list[npt.NDArray[Any]]:
    """Run ``program`` on ``inputs`` and return its outputs.

    Args:
        program: The program (validated on first use, then cached compiled).
        inputs: One numpy array or bytes-like object per READ, UNIFORM and
            READ_WRITE buffer, in binding order (see `vyre_async.abc.normalize_inputs`).
        grid_override: Workgroups per axis; inferred from the buffer sizes when None.
        workgroup_override: Replaces the program's workgroup shape.
        fixpoint_iterations: Number of back-to-back launches; buffers carry over.
        cancel: When set while running, the engine stops at the next statement.

    Returns:
        One array per WRITE and READ_WRITE buffer, in binding order (BOOL as uint32).

    Raises:
        InvalidProgram: the program is invalid, the inputs do not match it, or
            the grid cannot be inferred (multi-dimensional workgroup without
            ``grid_override``).
        Cancelled: ``cancel`` was set.
    """
    compile_program(program)
    arrays = normalize_inputs(program, inputs)
    plan = plan_dispatch(
        program,
        [a.size for a in arrays],
        grid_override=grid_override,
        workgroup_override=workgroup_override,
    )
    return run_plan(plan, arrays, fixpoint_iterations=fixpoint_iterations, cancel=cancel)


def run_plan(
    plan: BindingPlan,
    arrays: Sequence[npt.NDArray[Any]],
    *,
    compiled: CompiledProgram | None = None,
    fixpoint_iterations: int = 1,
    cancel: threading.Event | None = None,
) -> list[npt.NDArray[Any]]:
    """Run a planned launch on already-normalised input arrays.

    The inputs are not modified (READ_WRITE buffers start from copies).

    Args:
        plan: The binding plan (program, geometry, buffer counts).
        arrays: Flat arrays, one per input buffer in ``plan.inputs`` order, of
            the buffer's dtype and planned count.
        compiled: ``compile_program(plan.program)`` when the caller keeps it
            (skips the cache lookup); looked up when None.
        fixpoint_iterations: Number of back-to-back launches (at least 1); WRITE
            buffers are zeroed once, before the first.
        cancel: When set while running, the engine stops at the next statement.

    Returns:
        One array per output buffer, in ``plan.outputs`` order.

    Raises:
        InvalidProgram: the arrays do not match the plan.
        InvalidArgument: ``fixpoint_iterations`` is not an int >= 1.
        Cancelled: ``cancel`` was set.
    """
    program = plan.program
    if compiled is None or compiled.program is not program:
        compiled = compile_program(program)
    if isinstance(fixpoint_iterations, bool) or not isinstance(fixpoint_iterations, int):
        raise InvalidArgument(
            f"fixpoint_iterations must be an int, got {fixpoint_iterations!r}",
            fix="pass a positive integer",
        )
    if fixpoint_iterations < 1:
        raise InvalidArgument(
            f"fixpoint_iterations must be at least 1, got {fixpoint_iterations}",
            fix="pass fixpoint_iterations=1 for a single launch",
        )
    storage, lengths = _bind(plan, arrays)
    geometry = plan.geometry
    if geometry.lanes:
        workgroups = geometry.workgroups
        shared = [d for d in program.buffers if d.access is Access.WORKGROUP]
        with np.errstate(all="ignore"):
            for _ in range(fixpoint_iterations):
                # One dict for the whole dispatch: a store may replace a buffer's array.
                for decl in shared:
                    storage[decl.name] = np.zeros((workgroups, decl.count), dtype=decl.dtype.numpy)
                state = LaunchState(storage, lengths, geometry.grid, geometry.workgroup, cancel)
                root = GridLanes.root(geometry.grid, geometry.workgroup)
                run_body(Frame(root, None, Env(), state), compiled.body.stmts)
    return [storage[d.name] for d in plan.outputs]


def _bind(
    plan: BindingPlan, arrays: Sequence[npt.NDArray[Any]]
) -> tuple[dict[str, npt.NDArray[Any]], dict[str, np.uint32]]:
    """Return the storage arrays and `BufLen` values of a launch."""
    if len(arrays) != len(plan.inputs):
        raise InvalidProgram(
            f"the plan takes {len(plan.inputs)} input array(s), got {len(arrays)}",
            fix="pass one array per READ, UNIFORM and READ_WRITE buffer, in binding order",
        )
    given = dict(zip((d.name for d in plan.inputs), arrays, strict=True))
    storage: dict[str, npt.NDArray[Any]] = {}
    lengths: dict[str, np.uint32] = {}
    for decl, count in zip(plan.program.buffers, plan.counts, strict=True):
        lengths[decl.name] = np.uint32(count)
        if decl.access is Access.WORKGROUP:
            continue
        if decl.access is Access.WRITE:
            storage[decl.name] = np.zeros(count, dtype=decl.dtype.numpy)
            continue
        array = given[decl.name]
        if (
            not isinstance(array, np.ndarray)
            or array.ndim != 1
            or array.dtype != decl.dtype.numpy
            or array.size != count
        ):
            raise InvalidProgram(
                f"input for buffer {decl.name!r} must be a flat {decl.dtype.numpy} array of "
                f"{count} elements, got {_describe(array)}",
                fix="normalise inputs with vyre_async.abc.normalize_inputs before planning",
            )
        storage[decl.name] = array.copy() if decl.access is Access.READ_WRITE else array
    return storage, lengths


def _describe(value: object) -> str:
    if isinstance(value, np.ndarray):
        return f"dtype {value.dtype}, shape {value.shape}"
    return type(value).__name__
