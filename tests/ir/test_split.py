"""`split_at_grid_barriers`: its segments, and that running them in order on shared
buffers computes what the whole program computes (the reference runs it natively)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.strategies import programs, small_inputs_for
from vyre_async import DispatchConfig, InvalidProgram, split_at_grid_barriers
from vyre_async._plan import plan_dispatch
from vyre_async._shadow import compare_outputs
from vyre_async.ir import (
    Access,
    BufferDecl,
    DType,
    GridBarrier,
    Let,
    Load,
    Program,
    Return,
    Store,
    Var,
    gid,
    u32,
)
from vyre_async.ir.walk import iter_stmts
from vyre_async.programs import standard_workloads
from vyre_async.testing.corpus import cases
from vyre_reference import reference_backend

BACKEND = reference_backend(prefetch=False)
X = BufferDecl("x", 0, Access.READ_WRITE, DType.U32)


def _store(k: int) -> list[Any]:
    return [Let("i", gid()), Store("x", Var("i"), Load("x", Var("i")) + u32(k))]


def test_a_program_without_grid_barriers_is_its_own_only_segment() -> None:
    program = Program([X], 8, _store(1))
    assert split_at_grid_barriers(program) == (program,)
    assert split_at_grid_barriers(program)[0] is program


def test_segments_keep_buffers_workgroup_and_op_id_and_drop_empty_phases() -> None:
    program = Program(
        [X],
        (4, 2),
        [GridBarrier(), *_store(1), GridBarrier(), GridBarrier(), *_store(2), GridBarrier()],
        op_id="test.phases",
    )
    segments = split_at_grid_barriers(program)
    assert [s.body for s in segments] == [tuple(_store(1)), tuple(_store(2))]
    for segment in segments:
        assert (segment.buffers, segment.workgroup_size, segment.op_id) == (
            program.buffers,
            (4, 2, 1),
            "test.phases",
        )
        assert not any(isinstance(s, GridBarrier) for s in segment.body)
    assert split_at_grid_barriers(program) == segments  # memoised, and the same again


def test_a_program_of_barriers_only_is_one_empty_segment() -> None:
    (only,) = split_at_grid_barriers(Program([X], 8, [GridBarrier(), GridBarrier()]))
    assert only.body == ()


def test_an_invalid_program_is_refused_not_split() -> None:
    with pytest.raises(InvalidProgram, match="V036"):
        split_at_grid_barriers(Program([X], 8, [Return(), GridBarrier()]))


# Differential: segments run in order on shared buffers == the program ------------------


def _chained(program: Program, inputs: Sequence[np.ndarray], grid: tuple[int, int, int]) -> list:
    """Run the segments one after another, every output buffer carried to the next one."""
    carried = tuple(
        BufferDecl(d.name, d.binding, Access.READ_WRITE, d.dtype, d.count)
        if d.access is Access.WRITE
        else d
        for d in program.buffers
    )
    given = dict(zip((d.name for d in program.inputs), inputs, strict=True))
    state = {
        d.name: np.array(given[d.name], copy=True)
        if d.name in given
        else np.zeros(d.count, d.dtype.numpy)
        for d in program.buffers
        if d.access is not Access.WORKGROUP
    }
    config = DispatchConfig(grid_override=grid)
    for segment in split_at_grid_barriers(program):
        step = Program(carried, segment.workgroup_size, segment.body, segment.op_id)
        outputs = BACKEND.dispatch_sync(step, [state[d.name] for d in step.inputs], config)
        state.update(zip((d.name for d in step.outputs), outputs, strict=True))
    return [state[d.name] for d in program.outputs]


def _check(program: Program, inputs: Sequence[np.ndarray], grid: Any = None) -> None:
    plan = plan_dispatch(program, [np.asarray(a).size for a in inputs], grid_override=grid)
    whole = BACKEND.dispatch_sync(
        program, list(inputs), DispatchConfig(grid_override=plan.geometry.grid)
    )
    split = _chained(program, inputs, plan.geometry.grid)
    assert compare_outputs("split", program, inputs, split, whole) is None


GRID_CASES = [c for c in cases() if any(isinstance(s, GridBarrier) for s in c.program.body)]


@pytest.mark.parametrize("case", GRID_CASES, ids=[c.name for c in GRID_CASES])
def test_the_corpus_grid_programs_split_into_what_they_compute(case: Any) -> None:
    assert len(GRID_CASES) >= 6
    _check(case.program, case.inputs, case.grid)


def test_the_standard_grid_programs_split_into_what_they_compute() -> None:
    grid_workloads = [w for w in standard_workloads() if len(split_at_grid_barriers(w.program)) > 1]
    assert {w.name for w in grid_workloads} == {"array_sum", "exclusive_scan"}
    for workload in grid_workloads:
        _check(workload.program, workload.inputs(seed=5), workload.grid)


@st.composite
def _phased(draw: st.DrawFn) -> tuple[Program, list[np.ndarray]]:
    """A random program's body run two or three times, with grid barriers between."""
    base = draw(
        programs(max_nodes=30, multi_dim_workgroups=False).filter(
            lambda p: not any(isinstance(s, Return) for s in iter_stmts(p.body))
        )
    )
    phases = draw(st.integers(2, 3))
    body: list[Any] = []
    for k in range(phases):
        body += [GridBarrier()] * (k > 0) + list(base.body)
    program = Program(base.buffers, base.workgroup_size, body, base.op_id)
    return program, draw(small_inputs_for(program, max_len=12))


@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(_phased())
def test_random_phased_programs_split_into_what_they_compute(
    drawn: tuple[Program, list[np.ndarray]],
) -> None:
    program, inputs = drawn
    _check(program, inputs)
