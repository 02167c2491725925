"""Binding plans: input checking, counts and grid inference (backend-neutral)."""

from __future__ import annotations

import numpy as np
import pytest

from vyre_async import InvalidProgram
from vyre_async._plan import infer_grid, normalize_inputs, plan_dispatch
from vyre_async.ir import Access, Atomic, BufferDecl, DType, Let, Program, gid
from vyre_async.programs import elementwise_xor, histogram, prefix_scan, tiled_matmul


def test_inputs_are_private_flat_copies() -> None:
    p = elementwise_xor(4)
    a = np.arange(4, dtype=np.uint32).reshape(2, 2)
    b = np.arange(4, dtype=np.uint32).tobytes()
    arrays = normalize_inputs(p, [a, b])
    a[0, 0] = 99
    assert arrays[0].tolist() == [0, 1, 2, 3]
    assert arrays[1].tolist() == [0, 1, 2, 3]
    assert not np.shares_memory(arrays[0], a)


def test_bool_buffers_take_bool_or_uint32() -> None:
    p = Program([BufferDecl("m", 0, Access.READ, DType.BOOL)], 1, [])
    assert normalize_inputs(p, [np.array([True, False])])[0].dtype == np.uint32
    assert normalize_inputs(p, [np.array([1, 0], np.uint32)])[0].tolist() == [1, 0]


@pytest.mark.parametrize(
    ("inputs", "needle"),
    [
        ([np.zeros(4, np.uint32)], "takes 2 input"),
        ([np.zeros(4, np.uint32)] * 3, "takes 2 input"),
        ([np.zeros(4, np.int32), np.zeros(4, np.uint32)], "has dtype int32"),
        ([np.zeros(4, np.uint32), b"abc"], "not a multiple of 4"),
        ([np.zeros(4, np.uint32), [1, 2]], "is a list"),
    ],
)
def test_bad_inputs_raise_with_fix(inputs: list[object], needle: str) -> None:
    with pytest.raises(InvalidProgram, match="Fix:") as info:
        normalize_inputs(elementwise_xor(4), inputs)  # type: ignore[arg-type]
    assert needle in str(info.value)


def test_single_array_instead_of_list_is_explained() -> None:
    with pytest.raises(InvalidProgram, match="wrap it in a list"):
        normalize_inputs(elementwise_xor(4), np.zeros(4, np.uint32))  # type: ignore[arg-type]


def test_static_count_must_match() -> None:
    p = tiled_matmul(2, 2, 2)
    with pytest.raises(InvalidProgram, match="declares count=4"):
        normalize_inputs(
            p, [np.zeros(3, np.float32), np.zeros(4, np.float32), np.zeros(3, np.uint32)]
        )


def test_grid_from_largest_output() -> None:
    plan = plan_dispatch(elementwise_xor(1000), [1000, 1000])
    assert plan.geometry.grid == (16, 1, 1)
    assert plan.geometry.lanes == 1024
    assert plan.count_of("out") == 1000
    assert plan.bytes_in == 8000 and plan.bytes_out == 4000


def test_grid_counts_inputs_when_program_uses_workgroup_memory_or_atomics() -> None:
    assert plan_dispatch(histogram(), [5000, 256]).geometry.grid == (20, 1, 1)
    assert plan_dispatch(prefix_scan(1000), [1000]).geometry.grid == (1, 1, 1)
    atomic_only = Program(
        [BufferDecl("h", 0, Access.READ_WRITE, DType.U32)],
        8,
        [Let("o", Atomic("add", "h", gid(), 1))],
    )
    assert plan_dispatch(atomic_only, [20]).geometry.grid == (3, 1, 1)


def test_no_outputs_means_zero_lanes() -> None:
    p = Program([BufferDecl("a", 0, Access.READ, DType.U32)], 4, [])
    assert plan_dispatch(p, [10]).geometry.lanes == 0


def test_multidimensional_workgroup_needs_grid_override() -> None:
    p = tiled_matmul(4, 4, 4)
    with pytest.raises(InvalidProgram, match="grid_override"):
        plan_dispatch(p, [16, 16, 3])
    assert plan_dispatch(p, [16, 16, 3], grid_override=(1, 1)).geometry.grid == (1, 1, 1)


def test_overrides() -> None:
    p = elementwise_xor(64)
    plan = plan_dispatch(p, [64, 64], workgroup_override=32)
    assert plan.geometry.workgroup == (32, 1, 1) and plan.geometry.grid == (2, 1, 1)
    assert plan_dispatch(p, [64, 64], grid_override=7).geometry.grid == (7, 1, 1)
    for bad in [(-1,), (1, 2, 3, 4), (1.5,)]:
        with pytest.raises(InvalidProgram, match="Fix:"):
            plan_dispatch(p, [64, 64], grid_override=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidProgram, match="takes 2 input"):
        plan_dispatch(p, [64])


def test_infer_grid_directly() -> None:
    p = elementwise_xor(10)
    assert infer_grid(p, (10, 10, 10), workgroup=(4, 1, 1)) == (3, 1, 1)
