"""`fuse_programs`: every member of a fused program computes, byte for byte, what it
computes launched alone (the reference engine runs both), and what cannot fuse is refused."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.strategies import programs, small_inputs_for
from vyre_async import DispatchConfig, InvalidProgram
from vyre_async._plan import plan_dispatch
from vyre_async._shadow import compare_outputs
from vyre_async.ir import (
    Access,
    Barrier,
    BufferDecl,
    BufLen,
    DType,
    GridBarrier,
    If,
    Let,
    Load,
    Program,
    Return,
    Store,
    Var,
    gid,
    lid,
    nwg,
    u32,
    validate,
    wgid,
)
from vyre_async.ir.fusion import TABLE, fuse_programs
from vyre_async.programs import elementwise_xor, saxpy, sum_reduction
from vyre_reference import reference_backend

BACKEND = reference_backend(prefetch=False)
Grid = tuple[int, int, int]


def _alone(program: Program, inputs: Sequence[np.ndarray], grid: Grid) -> list[np.ndarray]:
    return BACKEND.dispatch_sync(program, list(inputs), DispatchConfig(grid_override=grid))


def _grid(program: Program, inputs: Sequence[np.ndarray], grid: Grid | None = None) -> Grid:
    return plan_dispatch(program, [a.size for a in inputs], grid_override=grid).geometry.grid


def _check(members: Sequence[tuple[Program, list[np.ndarray], Grid | None]]) -> None:
    programs_ = [p for p, _, _ in members]
    grids = [_grid(p, ins, g) for p, ins, g in members]
    fused = fuse_programs(programs_)
    assert validate(fused.program) == []
    outputs = BACKEND.dispatch_sync(
        fused.program,
        fused.fused_inputs([ins for _, ins, _ in members], grids),
        DispatchConfig(grid_override=fused.grid(grids)),
    )
    for (program, inputs, _), grid, own in zip(
        members, grids, fused.split_outputs(outputs), strict=True
    ):
        alone = _alone(program, inputs, grid)
        assert compare_outputs("fused", program, inputs, own, alone) is None


def _u32(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 2**32, n, dtype=np.uint32)


def _f32(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32)


def geometry(workgroup: tuple[int, int, int]) -> Program:
    """Every builtin on every axis, written where each lane's own gid puts it."""
    flat = gid(0) + gid(1) * u32(64) + gid(2) * u32(64 * 64)
    values = [
        wgid(0),
        wgid(1),
        wgid(2),
        nwg(0),
        nwg(1),
        nwg(2),
        lid(0),
        lid(1),
        lid(2),
        gid(0),
        gid(1),
        gid(2),
    ]
    return Program(
        [BufferDecl("out", 0, Access.WRITE, DType.U32, 12 * 4096)],
        workgroup,
        [Let("at", flat * u32(12))]
        + [Store("out", Var("at") + u32(k), value) for k, value in enumerate(values)],
        op_id="test.geometry",
    )


def guarded(n: int) -> Program:
    """Lanes past ``n`` return; the rest store ``x[i] * 3 + BufLen(x)``."""
    i = Var("i")
    return Program(
        [
            BufferDecl("x", 0, Access.READ, DType.U32),
            BufferDecl("out", 1, Access.WRITE, DType.U32, n),
        ],
        64,
        [
            Let("i", gid()),
            If(i.ge(u32(n)), [Return()]),
            Store("out", i, Load("x", i) * u32(3) + BufLen("x")),
        ],
        op_id="test.guarded",
    )


def shared_rotate(n: int) -> Program:
    """Each workgroup rotates its lanes' values through workgroup memory (a Barrier)."""
    return Program(
        [
            BufferDecl("x", 0, Access.READ_WRITE, DType.U32),
            BufferDecl("s", 1, Access.WORKGROUP, DType.U32, 64),
        ],
        64,
        [
            Store("s", lid(), Load("x", gid())),
            Barrier(),
            Store("x", gid(), Load("s", (lid() + u32(1)) % u32(64)) + u32(n)),
        ],
        op_id="test.rotate",
    )


@pytest.mark.parametrize("count", [1, 2, 5, 16])
def test_a_batch_of_one_program_fuses_into_its_members(count: int) -> None:
    rng = np.random.default_rng(count)
    program = elementwise_xor(300)
    _check([(program, [_u32(rng, 300), _u32(rng, 300)], None) for _ in range(count)])


def test_members_of_different_programs_and_sizes_each_compute_their_own() -> None:
    rng = np.random.default_rng(1)
    sums = sum_reduction(3000, workgroup=64, items_per_lane=2)
    _check(
        [
            (saxpy(500, workgroup=64), [_f32(rng, 500), _f32(rng, 500), _f32(rng, 1)], None),
            (sums, [_f32(rng, 3000)], (24, 1, 1)),
            (guarded(100), [_u32(rng, 100)], (3, 1, 1)),
            (shared_rotate(7), [_u32(rng, 256)], None),
            (elementwise_xor(70, workgroup=64), [_u32(rng, 70), _u32(rng, 70)], None),
            (shared_rotate(9), [_u32(rng, 128)], None),
            (guarded(5), [_u32(rng, 40)], (2, 1, 1)),
        ]
    )


def test_every_builtin_is_the_members_own_on_every_axis() -> None:
    program = geometry((4, 2, 2))
    _check([(program, [], (3, 2, 2)), (program, [], (1, 1, 1)), (program, [], (2, 3, 1))])


def test_workgroup_memory_is_shared_between_members_not_added_up() -> None:
    fused = fuse_programs([shared_rotate(1)] * 12)
    assert len(fused.program.workgroup_buffers) == 1
    assert fused.program.buffer(TABLE).count == 4 * 12


def test_fusing_is_cached_and_deterministic() -> None:
    members = [elementwise_xor(64), saxpy(64, workgroup=64)]
    first = fuse_programs(members)
    assert fuse_programs(tuple(members)) is first
    again = fuse_programs([elementwise_xor(64), saxpy(64, workgroup=64)])
    assert again.program == first.program  # equal members: an equal program, one pipeline


def test_members_with_barriers_run_before_those_that_return() -> None:
    fused = fuse_programs([guarded(10), shared_rotate(1)])
    assert validate(fused.program) == []  # else V028: a Barrier after a divergent Return
    with pytest.raises(InvalidProgram, match="both a Barrier and a Return"):
        both = Program(
            guarded(10).buffers,
            64,
            [Barrier(), *guarded(10).body],
        )
        fuse_programs([both, both])


@pytest.mark.parametrize(
    ("members", "words"),
    [
        ([], "at least one"),
        ([elementwise_xor(8), saxpy(8)], "workgroup shapes differ"),
        (
            [Program([BufferDecl("o", 0, Access.WRITE, DType.U32, 1)], 64, [GridBarrier()])],
            "GridBarrier",
        ),
        ([Program([], 64, [Store("missing", u32(0), u32(1))])], "V009"),
    ],
)
def test_what_cannot_fuse_is_refused_with_a_fix(members: list[Program], words: str) -> None:
    with pytest.raises(InvalidProgram, match=words) as info:
        fuse_programs(members)
    assert "Fix:" in str(info.value)


def test_inputs_and_grids_are_checked_against_the_members() -> None:
    fused = fuse_programs([elementwise_xor(8), elementwise_xor(8)])
    with pytest.raises(InvalidProgram, match="2 members, 1 grids"):
        fused.grid([(1, 1, 1)])
    with pytest.raises(InvalidProgram, match="member 1 takes 2 inputs, got 1"):
        fused.fused_inputs([[1, 2], [1]], [(1, 1, 1)] * 2)
    table = fused.table([(2, 1, 1), (3, 2, 1)])
    assert table.tolist() == [0, 2, 1, 1, 2, 3, 2, 1]
    assert fused.grid([(2, 1, 1), (3, 2, 1)]) == (8, 1, 1)


def _same_workgroup(draw: Callable[..., Any]) -> list[tuple[Program, list[np.ndarray]]]:
    first = draw(programs(max_nodes=30, multi_dim_workgroups=False))
    out = [(first, draw(small_inputs_for(first, max_len=12)))]
    for _ in range(draw(st.integers(1, 2))):
        other = draw(
            programs(max_nodes=30, multi_dim_workgroups=False).filter(
                lambda p: p.workgroup_size == first.workgroup_size
            )
        )
        out.append((other, draw(small_inputs_for(other, max_len=12))))
    return out


@settings(
    max_examples=20,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(st.data())
def test_random_members_fused_compute_what_they_compute_alone(data: st.DataObject) -> None:
    members = _same_workgroup(data.draw)
    try:
        fuse_programs([p for p, _ in members])
    except InvalidProgram as exc:  # only the documented refusal may happen
        assert "both a Barrier and a Return" in str(exc)
        return
    _check([(p, ins, None) for p, ins in members])
