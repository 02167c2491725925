"""Property test: random valid programs agree with a slow per-lane interpreter.

Two program sources: `tests.strategies.programs` (arbitrary valid programs:
every node kind, special F32 values) and `lane_programs` (kernel-shaped
programs that reach the engine's structured paths). Each runs on a few
workgroups of a few lanes on both the engine and `slow_interpreter`; the
engine may only raise documented errors (InvalidProgram, exactly when the
interpreter does) and otherwise must produce the same bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reference.lane_programs import lane_inputs, lane_programs
from tests.reference.slow_interpreter import run_slow
from tests.strategies import programs, small_inputs_for
from vyre_async.errors import InvalidProgram
from vyre_async.ir import Program, Un
from vyre_async.ir.ops import TRANSCENDENTAL
from vyre_async.ir.validate import validate
from vyre_async.ir.walk import iter_exprs
from vyre_reference import execute

_SETTINGS = settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_SMALL_GRIDS = ((1, 1, 1), (2, 1, 1), (3, 1, 1), (2, 2, 1), (1, 2, 2))


def _ulp_key(words: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    signed = words.astype(np.int64)
    return np.where(signed >= 2**31, 2**31 - signed, signed)


def _assert_same(program: Program, got: list[np.ndarray[Any, Any]], want: list[Any]) -> None:
    budget = (
        2
        if any(isinstance(e, Un) and e.op in TRANSCENDENTAL for e in iter_exprs(program.body))
        else 0
    )
    assert len(got) == len(want)
    for decl, g, w in zip(program.outputs, got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, decl.name
        gw, ww = g.view(np.uint32), w.view(np.uint32)
        if g.dtype == np.float32:
            gn, wn = np.isnan(g), np.isnan(w)
            far = np.abs(_ulp_key(gw) - _ulp_key(ww)) > budget
            bad = (gn != wn) | (~wn & far)
        else:
            bad = gw != ww
        assert not bad.any(), f"{decl.name}: engine {g.tolist()} != interpreter {w.tolist()}"


def _compare(program: Program, inputs: list[Any], grid: tuple[int, int, int] | None) -> None:
    try:
        want = run_slow(program, inputs, grid_override=grid)
    except InvalidProgram:
        try:
            execute(program, inputs, grid_override=grid)
        except InvalidProgram as exc:
            assert "Fix:" in str(exc)
            return
        raise AssertionError("the engine accepted a launch the interpreter rejected") from None
    _assert_same(program, execute(program, inputs, grid_override=grid), want)


@_SETTINGS
@given(st.data())
def test_random_programs_match_the_slow_interpreter(data: st.DataObject) -> None:
    program = data.draw(programs(max_nodes=40), label="program")
    inputs = data.draw(small_inputs_for(program), label="inputs")
    lanes = program.lanes_per_workgroup
    if lanes <= 16:
        grid = data.draw(st.sampled_from((None, *_SMALL_GRIDS)), label="grid")
    else:
        grid = (1, 1, 1) if lanes > 64 else data.draw(st.sampled_from(_SMALL_GRIDS[:2]))
    _compare(program, inputs, grid)


@_SETTINGS
@given(st.data())
def test_kernel_shaped_programs_match_the_slow_interpreter(data: st.DataObject) -> None:
    program, grid = data.draw(lane_programs(), label="program")
    if validate(program):  # rare: a barrier after a return in a nested block
        return
    inputs = data.draw(lane_inputs(program), label="inputs")
    _compare(program, inputs, grid)
