"""What the reference engine's public helpers tell a user, found by mutation testing (issue 28).

`run_plan` is public and takes already-normalised arrays: a wrong one is
refused with a message that says what it got. `cache_info()` reports the
compile cache's size as well as its hits and misses.
"""

from __future__ import annotations

import numpy as np
import pytest

import vyre_reference
from vyre_async import InvalidProgram
from vyre_async.plan import BindingPlan, plan_dispatch
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
    assert "Fix: normalise inputs with vyre_async.plan.normalize_inputs" in message


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
