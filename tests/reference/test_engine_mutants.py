"""What the reference engine's public helpers tell a user, found by mutation testing (issue 28).

`run_plan` is public and takes already-normalised arrays: a wrong one is
refused with a message that says what it got. `cache_info()` reports the
compile cache's size as well as its hits and misses.
"""

from __future__ import annotations

import numpy as np
import pytest

import vyre_reference
from tests.cupy.device_programs import accumulate
from vyre_async import InvalidProgram
from vyre_async._plan import BindingPlan, plan_dispatch
from vyre_async.ir import Access, BufferDecl, DType, If, Load, Program, Store, gid, u32
from vyre_async.programs import elementwise_xor


def _plan() -> tuple[BindingPlan, int]:
    return plan_dispatch(elementwise_xor(4), (4, 4)), 4


@pytest.mark.parametrize(
    ("value", "described"),
    [
        ([1, 2, 3, 4], "got list"),
        (np.arange(4, dtype=np.int32), "got dtype int32, shape (4,)"),
        (np.zeros((2, 2), dtype=np.uint32), "got dtype uint32, shape (2, 2)"),
    ],
)
def test_run_plan_says_what_it_got_instead_of_a_flat_array(value: object, described: str) -> None:
    plan, n = _plan()
    good = np.arange(n, dtype=np.uint32)
    with pytest.raises(InvalidProgram) as info:
        vyre_reference.run_plan(plan, [value, good])  # type: ignore[list-item]
    message = str(info.value)
    assert "must be a flat uint32 array of 4 elements, " + described in message
    assert "Fix: normalise inputs with vyre_async.abc.normalize_inputs" in message


def test_cache_info_counts_the_programs_held() -> None:
    vyre_reference.cache_clear()
    assert vyre_reference.cache_info() == {"hits": 0, "misses": 0, "size": 0}
    first, second = elementwise_xor(4), elementwise_xor(4, workgroup=32)
    vyre_reference.compile_program(first)
    vyre_reference.compile_program(second)
    vyre_reference.compile_program(first)
    assert vyre_reference.cache_info() == {"hits": 1, "misses": 2, "size": 2}
    vyre_reference.cache_clear()
    assert vyre_reference.cache_info()["size"] == 0


def _accumulate() -> tuple[BindingPlan, list[np.ndarray]]:
    """``acc += x * 3`` (acc READ_WRITE) on 64 elements, with its input arrays."""
    program = accumulate()
    x = np.arange(64, dtype=np.uint32)
    acc = np.full(64, 5, dtype=np.uint32)
    return plan_dispatch(program, (64, 64)), [x, acc]


def test_run_plan_runs_one_launch_and_leaves_its_inputs_as_they_were() -> None:
    plan, arrays = _accumulate()
    before = [a.copy() for a in arrays]
    (acc,) = vyre_reference.run_plan(plan, arrays)
    assert acc.tolist() == [5 + 3 * i for i in range(64)]  # one launch by default
    assert [a.tolist() for a in arrays] == [b.tolist() for b in before]  # READ_WRITE copied
    (twice,) = vyre_reference.run_plan(plan, arrays, fixpoint_iterations=2)
    assert twice.tolist() == [5 + 6 * i for i in range(64)]


def test_run_plan_runs_its_own_program_whatever_compiled_program_it_is_given() -> None:
    plan, arrays = _accumulate()
    other = vyre_reference.compile_program(elementwise_xor(64))
    (acc,) = vyre_reference.run_plan(plan, arrays, compiled=other)
    assert acc.tolist() == [5 + 3 * i for i in range(64)]


@pytest.mark.parametrize(
    ("iterations", "said"),
    [
        (1.0, "fixpoint_iterations must be an int, got 1.0\nFix: pass a positive integer"),
        (True, "fixpoint_iterations must be an int, got True\nFix: pass a positive integer"),
        (
            0,
            "fixpoint_iterations must be at least 1, got 0\n"
            "Fix: pass fixpoint_iterations=1 for a single launch",
        ),
    ],
)
def test_run_plan_refuses_a_launch_count_that_is_not_a_positive_int(
    iterations: object, said: str
) -> None:
    plan, arrays = _accumulate()
    with pytest.raises(InvalidProgram) as info:
        vyre_reference.run_plan(plan, arrays, fixpoint_iterations=iterations)  # type: ignore[arg-type]
    assert str(info.value) == said


def test_run_plan_refuses_the_wrong_number_of_arrays_with_a_fix() -> None:
    plan, arrays = _accumulate()
    with pytest.raises(InvalidProgram) as info:
        vyre_reference.run_plan(plan, arrays[:1])
    assert str(info.value) == (
        "the plan takes 2 input array(s), got 1\n"
        "Fix: pass one array per READ, UNIFORM and READ_WRITE buffer, in binding order"
    )


def test_run_plan_writes_a_read_write_buffer_in_place_only_in_its_own_copy() -> None:
    # Half the lanes store: a write into the buffer's array itself, not a new array.
    program = Program(
        [BufferDecl("acc", 0, Access.READ_WRITE, DType.U32)],
        64,
        [If(gid().lt(u32(32)), [Store("acc", gid(), Load("acc", gid()) + u32(1))])],
    )
    acc = np.zeros(64, dtype=np.uint32)
    (out,) = vyre_reference.run_plan(plan_dispatch(program, (64,)), [acc])
    assert out.tolist() == [1] * 32 + [0] * 32
    assert not acc.any()


def test_the_compile_cache_counts_every_hit_and_drops_the_least_recently_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import vyre_reference.compile as compile_module

    monkeypatch.setattr(compile_module, "CACHE_SIZE", 2)
    vyre_reference.cache_clear()
    p1, p2, p3 = elementwise_xor(8), elementwise_xor(16), elementwise_xor(24)
    first = vyre_reference.compile_program(p1)
    assert first.program is p1  # what run_plan checks a kept compiled program against
    assert vyre_reference.compile_program(p1) is first
    assert vyre_reference.compile_program(p1) is first
    assert vyre_reference.cache_info() == {"hits": 2, "misses": 1, "size": 1}
    vyre_reference.compile_program(p2)
    vyre_reference.compile_program(p1)  # p1 used last: p2 is the least recently used
    vyre_reference.compile_program(p3)
    assert vyre_reference.cache_info() == {"hits": 3, "misses": 3, "size": 2}
    assert vyre_reference.compile_program(p1) is first  # kept
    vyre_reference.compile_program(p2)  # dropped: compiled again
    assert vyre_reference.cache_info() == {"hits": 4, "misses": 4, "size": 2}
