"""What the snapshot leaves out of the shipped corpus (issue 28, triage of ``testing/corpus.py``).

``tests/test_corpus_snapshot.py`` pins every case field by field, except the
expected F32 outputs of the case with a ULP budget (the transcendentals, whose
last bits may differ between C libraries) and `Case.config()`, which is not a
field. mutmut's run on the corpus left mutants there: ``log(0)`` made NaN or
+inf, ``rsqrt(±0)`` made NaN, ``rsqrt`` turned into ``sqrt`` or doubled,
``sin``, ``cos``, ``tanh`` or ``log`` made all NaN, and configs without the
case's label or ULP budget (or with a budget of 0 instead of the default).
A backend author judged by these expected outputs would be told a correct
engine is wrong. So the expected transcendental outputs are checked here
against numpy's float64 functions rounded to binary32, within the case's own
budget (NaN and infinities exactly, zeros with their sign), and the configs
against the case's settings. The mutants whose corpus is byte for byte the
original are listed with their reasons in
``scripts/mutation_equivalent/testing.toml``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from vyre_async.ir import If, Store, Un
from vyre_async.testing.corpus import MAX_F32, Case, cases, exact_r32


@pytest.fixture
def corpus() -> list[Case]:
    """The corpus, built anew for each test (16 ms).

    Not shared by the module: mutmut runs, for a mutant, only the tests that
    reached the mutated function in its clean run, and a module-scoped fixture
    reaches the corpus's builders from the first test alone.
    """
    return cases()


@pytest.fixture
def budgeted(corpus: list[Case]) -> Case:
    """The one case with a ULP budget: the transcendentals."""
    (case,) = [case for case in corpus if case.ulp_budget > 0]
    return case


#: numpy's float64 functions, computed independently of the corpus's Python oracle.
REFERENCE: dict[str, Callable[[np.ndarray[Any, Any]], np.ndarray[Any, Any]]] = {
    "exp": np.exp,
    "log": np.log,
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
}


def _ops(case: Case) -> list[str]:
    """The unary op each output of an elementwise case stores, in output order."""
    guard = case.program.body[1]
    assert isinstance(guard, If)
    ops: list[str] = []
    for store in guard.then:
        assert isinstance(store, Store) and isinstance(store.value, Un)
        ops.append(store.value.op)
    return ops


def _ordered(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Binary32 values as ordered integers: adjacent floats differ by 1."""
    signed = values.astype(np.float32).view(np.uint32).astype(np.int64)
    return np.where(signed >= 2**31, 2**31 - signed, signed)


def test_one_case_has_a_budget_and_it_covers_every_transcendental(budgeted: Case) -> None:
    assert budgeted.name == "f32_transcendentals"
    assert budgeted.ulp_budget == 2
    assert _ops(budgeted) == ["exp", "log", "sin", "cos", "tanh", "rsqrt"]


def test_budgeted_expected_outputs_are_the_functions_within_the_budget(budgeted: Case) -> None:
    case = budgeted
    (x,) = case.inputs
    assert x.dtype == np.float32
    for op, want in zip(_ops(case), case.expected, strict=True):
        with np.errstate(all="ignore"):
            ref = REFERENCE[op](x.astype(np.float64)).astype(np.float32)
        assert want.dtype == np.float32 and want.shape == x.shape, op
        nan = np.isnan(ref)
        assert np.array_equal(np.isnan(want), nan), (op, x[np.isnan(want) != nan].tolist())
        exact = ~nan & (np.isinf(ref) | (ref == 0))
        assert np.array_equal(want[exact].view(np.uint32), ref[exact].view(np.uint32)), (
            op,
            x[exact].tolist(),
            want[exact].tolist(),
            ref[exact].tolist(),
        )
        far = ~nan & (np.abs(_ordered(want) - _ordered(ref)) > case.ulp_budget)
        assert not far.any(), (op, x[far].tolist(), want[far].tolist(), ref[far].tolist())


INF = math.inf
NAN = math.nan


@pytest.mark.parametrize(
    ("op", "x", "want"),
    [
        ("log", 0.0, -INF),
        ("log", -0.0, -INF),
        ("log", -1.0, NAN),
        ("log", -INF, NAN),
        ("log", INF, INF),
        ("log", 1.0, 0.0),
        ("rsqrt", 0.0, INF),
        ("rsqrt", -0.0, -INF),
        ("rsqrt", -1.0, NAN),
        ("rsqrt", INF, 0.0),
        ("rsqrt", 1.0, 1.0),
        ("exp", -INF, 0.0),
        ("exp", 89.0, INF),
        ("exp", 0.0, 1.0),
        ("sin", INF, NAN),
        ("sin", -0.0, -0.0),
        ("cos", -INF, NAN),
        ("cos", 0.0, 1.0),
        ("tanh", INF, 1.0),
        ("tanh", -INF, -1.0),
        ("tanh", -0.0, -0.0),
    ],
)
def test_transcendental_special_values_are_exact(
    budgeted: Case, op: str, x: float, want: float
) -> None:
    case = budgeted
    (inputs,) = case.inputs
    lane = int(np.flatnonzero(inputs.view(np.uint32) == np.float32(x).view(np.uint32))[0])
    got = float(case.expected[_ops(case).index(op)][lane])
    if math.isnan(want):
        assert math.isnan(got)
    else:
        assert (got, math.copysign(1.0, got)) == (want, math.copysign(1.0, want))


def test_config_carries_the_case_settings(corpus: list[Case]) -> None:
    for case in corpus:
        config = case.config()
        assert config.label == case.name
        assert config.grid_override == case.grid, case.name
        assert config.fixpoint_iterations == case.fixpoint_iterations, case.name
        # No budget: the default (None), not a budget of 0.
        assert config.ulp_budget == (case.ulp_budget if case.ulp_budget else None), case.name


def test_the_budgeted_case_dispatches_with_its_budget(budgeted: Case) -> None:
    assert budgeted.config().ulp_budget == 2


def test_exact_rounding_overflows_to_infinity_from_the_tie_above_max_f32() -> None:
    # The corpus's fma lanes reach these only through _array's float32 cast, which
    # makes inf of a too-large finite float64 too (with a warning): so checked here.
    tie = Fraction(2**128 - 2**103)  # MAX_F32 plus half its last place: to even, up
    assert exact_r32(tie) == INF and exact_r32(-tie) == -INF
    assert exact_r32(Fraction(2**129 - 2**105)) == INF  # MAX_F32 + MAX_F32
    assert exact_r32(tie - 1) == MAX_F32  # below the tie: down
