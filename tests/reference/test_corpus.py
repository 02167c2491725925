"""The reference engine against the conformance corpus, plus its error paths."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

import vyre_reference
from tests.conformance.corpus import SEMANTIC_RULES, Case, cases
from vyre_async._plan import normalize_inputs, plan_dispatch
from vyre_async.errors import InvalidProgram
from vyre_async.ir import (
    Access,
    Assign,
    BufferDecl,
    DType,
    If,
    Let,
    Load,
    Loop,
    Program,
    Store,
    Var,
    gid,
    u32,
)
from vyre_reference import Cancelled, compile_program, execute, run_plan

CASES = cases()


def assert_outputs_match(case: Case, outputs: list[np.ndarray[Any, Any]]) -> None:
    """Assert byte equality (NaN by position; ``ulp_budget`` ULP on F32 when set)."""
    assert len(outputs) == len(case.expected), case.name
    for k, (got, want) in enumerate(zip(outputs, case.expected, strict=True)):
        where = f"{case.name}: output {k}"
        assert got.dtype == want.dtype, where
        assert got.shape == want.shape, where
        got_w = got.view(np.uint32)
        want_w = want.view(np.uint32)
        if got.dtype != np.float32:
            bad = np.flatnonzero(got_w != want_w)
        else:
            got_nan, want_nan = np.isnan(got), np.isnan(want)
            if case.ulp_budget:
                # Ordered integer key of binary32 values: adjacent floats differ by 1.
                def key(w: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
                    signed = w.astype(np.int64)
                    return np.where(signed >= 2**31, 2**31 - signed, signed)

                far = np.abs(key(got_w) - key(want_w)) > case.ulp_budget
            else:
                far = got_w != want_w
            bad = np.flatnonzero((got_nan != want_nan) | (~want_nan & far))
        assert bad.size == 0, (
            f"{where} differs at {bad[:8].tolist()}: got {got[bad[:8]].tolist()}, "
            f"want {want[bad[:8]].tolist()}"
        )


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case: Case) -> None:
    run = lambda: execute(  # noqa: E731
        case.program,
        list(case.inputs),
        grid_override=case.grid,
        fixpoint_iterations=case.fixpoint_iterations,
    )
    if case.error is not None:
        with pytest.raises(case.error) as info:
            run()
        assert "Fix:" in str(info.value)
        return
    assert_outputs_match(case, run())


def test_every_semantic_rule_is_named_by_a_case() -> None:
    named = {rule for case in CASES for rule in case.rules}
    assert named <= set(SEMANTIC_RULES), named - set(SEMANTIC_RULES)
    assert set(SEMANTIC_RULES) <= named, set(SEMANTIC_RULES) - named


def test_case_names_are_unique_and_programs_valid() -> None:
    from vyre_async.ir.validate import validate

    assert len({c.name for c in CASES}) == len(CASES)
    for case in CASES:
        assert validate(case.program) == [], case.name


def test_every_standard_workload_is_in_the_corpus() -> None:
    from vyre_async.programs import standard_workloads

    names = {c.name for c in CASES}
    assert {f"standard_{w.name}" for w in standard_workloads()} <= names


def test_inputs_are_not_modified() -> None:
    case = next(c for c in CASES if c.name == "fixpoint_carries_buffers")
    before = [a.copy() for a in case.inputs]
    execute(case.program, list(case.inputs), fixpoint_iterations=3)
    for a, b in zip(case.inputs, before, strict=True):
        assert np.array_equal(a, b)


# -- error paths --------------------------------------------------------------------------


def _copy_program(count: int = 0) -> Program:
    i = Var("i")
    return Program(
        [
            BufferDecl("a", 0, Access.READ, DType.U32, count),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 4),
        ],
        4,
        [Let("i", gid()), If(i.lt(4), [Store("out", i, Load("a", i))])],
    )


def _raises_with_fix(fn: Any) -> InvalidProgram:
    with pytest.raises(InvalidProgram) as info:
        fn()
    assert "Fix:" in str(info.value)
    return info.value


def test_wrong_input_count_is_invalid() -> None:
    program = _copy_program()
    _raises_with_fix(lambda: execute(program, []))
    _raises_with_fix(lambda: execute(program, [np.zeros(4, np.uint32)] * 2))


def test_wrong_input_size_is_invalid() -> None:
    _raises_with_fix(lambda: execute(_copy_program(4), [np.zeros(3, np.uint32)]))


def test_wrong_input_dtype_is_invalid() -> None:
    _raises_with_fix(lambda: execute(_copy_program(), [np.zeros(4, np.float32)]))


def test_multi_dimensional_workgroup_needs_a_grid() -> None:
    program = Program(
        [BufferDecl("out", 0, Access.WRITE, DType.U32, 4)], (2, 2), [Store("out", gid(), 1)]
    )
    _raises_with_fix(lambda: execute(program, []))
    assert execute(program, [], grid_override=(1, 1, 1))[0].tolist() == [1, 1, 0, 0]


def test_invalid_program_is_rejected_before_running() -> None:
    program = Program([BufferDecl("out", 0, Access.READ, DType.U32)], 4, [Store("out", gid(), 1)])
    _raises_with_fix(lambda: execute(program, [np.zeros(4, np.uint32)]))


def test_fixpoint_iterations_must_be_positive() -> None:
    _raises_with_fix(
        lambda: execute(_copy_program(), [np.zeros(4, np.uint32)], fixpoint_iterations=0)
    )


def test_run_plan_checks_arrays_against_the_plan() -> None:
    program = _copy_program()
    arrays = normalize_inputs(program, [np.arange(4, dtype=np.uint32)])
    plan = plan_dispatch(program, [4])
    assert run_plan(plan, arrays)[0].tolist() == [0, 1, 2, 3]
    _raises_with_fix(lambda: run_plan(plan, [np.arange(5, dtype=np.uint32)]))
    _raises_with_fix(lambda: run_plan(plan, []))


def test_zero_lane_launch_returns_initialised_outputs() -> None:
    program = Program(
        [
            BufferDecl("rw", 0, Access.READ_WRITE, DType.F32),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 2),
        ],
        4,
        [Store("rw", gid(), 1.0), Store("out", gid(), 7)],
    )
    rw = np.array([2.5, -0.0], np.float32)
    got = execute(program, [rw], grid_override=(0, 1, 1))
    assert got[0].view(np.uint32).tolist() == rw.view(np.uint32).tolist()
    assert got[1].tolist() == [0, 0]
    assert execute(program, [np.zeros(0, np.float32)])[1].tolist() == [7, 7]


def test_fixpoint_iterations_carry_buffers_over() -> None:
    program = Program(
        [BufferDecl("out", 0, Access.WRITE, DType.U32, 4)],
        4,
        [Store("out", gid(), Load("out", gid()) * u32(2) + u32(1))],
    )
    assert execute(program, [], fixpoint_iterations=4)[0].tolist() == [15] * 4


def _endless() -> Program:
    return Program(
        [BufferDecl("out", 0, Access.WRITE, DType.U32, 4)],
        4,
        [
            Let("acc", u32(0)),
            Loop("t", u32(0), u32(0xFFFF_FFFF), [Assign("acc", Var("acc") + Var("t"))]),
            Store("out", gid(), Var("acc")),
        ],
    )


def test_cancel_stops_a_long_loop_promptly() -> None:
    cancel = threading.Event()
    timer = threading.Timer(0.05, cancel.set)
    timer.start()
    start = time.perf_counter()
    try:
        with pytest.raises(Cancelled):
            execute(_endless(), [], cancel=cancel)
    finally:
        timer.cancel()
    assert time.perf_counter() - start < 2.0


def test_cancel_before_start_raises_at_once() -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        execute(_endless(), [], cancel=cancel)


def test_compiled_programs_are_cached() -> None:
    program = _copy_program()
    first = compile_program(program)
    hits = vyre_reference.cache_info()["hits"]
    again = compile_program(Program(program.buffers, program.workgroup_size, program.body))
    assert again is first
    assert vyre_reference.cache_info()["hits"] == hits + 1


def test_public_api_is_exactly_all() -> None:
    import inspect

    for name in vyre_reference.__all__:  # the package loads its names lazily (PEP 562)
        getattr(vyre_reference, name)
    public = {
        name
        for name, value in vars(vyre_reference).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert public == set(vyre_reference.__all__)
    assert issubclass(Cancelled, Exception)


def test_variables_do_not_alias_buffers() -> None:
    # A uniform Select hands back its arm: a view of a writable buffer must be copied.
    from vyre_async.ir import Select

    g = gid()
    program = Program(
        [BufferDecl("rw", 0, Access.READ_WRITE, DType.U32, 4)],
        4,
        [
            Let("a", Load("rw", g)),
            Let("b", Select(True, Load("rw", g), u32(0))),
            Store("rw", g, u32(9)),
            Store("rw", g, Var("a") * u32(10) + Var("b")),
        ],
    )
    got = execute(program, [np.array([1, 2, 3, 4], np.uint32)])[0]
    assert got.tolist() == [11, 22, 33, 44]
