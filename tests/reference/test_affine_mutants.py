"""Lane-affine values whose terms grow past 2**40 (found by mutation testing).

The engine keeps ``gid``, ``lid``, ``wgid`` and what ``+ - *`` make of them as
``c + Σ wg[k]·wgid(k) + Σ lid[k]·lid(k)`` with exact Python integers, and
reduces every term modulo 2**32 once one of them reaches 2**40. Products of
large constants get there in a step or two; each program here stores such a
value on a 4 x 4 grid of 16-lane workgroups, and the words must match the slow
interpreter and the value computed in Python modulo 2**32:

- a product with a constant term and terms on both workgroup axes and the
  local axis (every term is reduced, and each must stay the right one);
- a product that only the workgroup term, or only the local term, pushes past
  2**40 (the constant and the other terms stay small);
- a lane-independent value grown past 2**40 and then added to a lane id (only
  the constant term is large).

A last program does the same on a 2 x 2 x 2 grid of 2 x 2 x 2 workgroups, where
every workgroup and local axis has its own term (the third axes and the local
second axis are reduced too, each into its own place).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.reference.slow_interpreter import run_slow
from vyre_async.ir import Access, BufferDecl, DType, Expr, Program, Store, gid, lid, u32, wgid
from vyre_reference import execute

K = 0x9E3779B9  # an odd constant: K·K and K·K·K are far past 2**40
GRID = (4, 4, 1)
WORKGROUP = (16, 1, 1)
N = 256  # lanes

Lane = tuple[int, int, int]  # (wgid(0), wgid(1), lid(0)) of a lane


def _lanes() -> list[Lane]:
    """Every lane, in the order of the output words (gid(0) + 64·gid(1))."""
    return [(w0, w1, l0) for w1 in range(4) for w0 in range(4) for l0 in range(16)]


CASES: dict[str, tuple[Expr, Callable[[Lane], int]]] = {
    "every term large": (
        (wgid(0) + wgid(1) * u32(3) + lid(0) + u32(7)) * u32(K) * u32(K),
        lambda v: (v[0] + 3 * v[1] + v[2] + 7) * K * K,
    ),
    "gid times K times K": (
        (gid(0) + u32(7)) * u32(K) * u32(K),
        lambda v: (16 * v[0] + v[2] + 7) * K * K,
    ),
    "only the workgroup term large": (
        wgid(0) * u32(K) * u32(K) * u32(K) + lid(0),
        lambda v: v[0] * K**3 + v[2],
    ),
    "only the local term large": (
        lid(0) * u32(K) * u32(K) * u32(K) + wgid(0),
        lambda v: v[2] * K**3 + v[0],
    ),
    "only the constant large": (
        (gid(0) - gid(0) + u32(3)) * u32(K) * u32(K) * u32(K) + gid(0),
        lambda v: 3 * K**3 + 16 * v[0] + v[2],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_lane_value_past_2_to_the_40_is_stored_modulo_2_to_the_32(case: str) -> None:
    value, value_at = CASES[case]
    program = Program(
        [BufferDecl("out", 0, Access.WRITE, DType.U32, N)],
        WORKGROUP,
        [Store("out", gid(0) + gid(1) * u32(64), value)],
    )
    got = execute(program, [], grid_override=GRID)[0].tolist()
    want = run_slow(program, [], grid_override=GRID)[0].tolist()
    assert got == want
    assert got == [value_at(v) % (1 << 32) for v in _lanes()]


def test_a_lane_value_past_2_to_the_40_on_every_axis_is_stored_modulo_2_to_the_32() -> None:
    # distinct odd weights, so a term moved to another axis changes the words
    weights = (1, 3, 5, 7, 11, 13)
    ids = (wgid(0), wgid(1), wgid(2), lid(0), lid(1), lid(2))
    value: Expr = u32(17)
    for weight, lane_id in zip(weights, ids, strict=True):
        value = value + lane_id * u32(weight)
    program = Program(
        [BufferDecl("out", 0, Access.WRITE, DType.U32, 64)],
        (2, 2, 2),
        [Store("out", gid(0) + gid(1) * u32(4) + gid(2) * u32(16), value * u32(K) * u32(K))],
    )
    got = execute(program, [], grid_override=(2, 2, 2))[0].tolist()
    assert got == run_slow(program, [], grid_override=(2, 2, 2))[0].tolist()
    want = [0] * 64
    for g0 in range(4):
        for g1 in range(4):
            for g2 in range(4):
                coords = (g0 // 2, g1 // 2, g2 // 2, g0 % 2, g1 % 2, g2 % 2)
                total = 17 + sum(w * c for w, c in zip(weights, coords, strict=True))
                want[g0 + 4 * g1 + 16 * g2] = total * K * K % (1 << 32)
    assert got == want
