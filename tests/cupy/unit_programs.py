"""Hand-written programs for codegen unit tests, built into the operator-table emulator binary.

``unit_cases()`` are deterministic programs compared with the reference
(hostile names, SSA evaluation of both `Select` arms and both ``land``
operands, loop bounds evaluated once, out-of-bounds atomics...).
``race_probes()`` are programs the emulator's race detector must judge
(racy or race-free); their outputs are not compared.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.cupy.op_table import OpCase
from vyre_async.ir import (
    Access,
    Assign,
    Atomic,
    Barrier,
    Bin,
    BufferDecl,
    DType,
    If,
    Let,
    Load,
    Loop,
    Program,
    Return,
    Select,
    Store,
    Var,
    gid,
    lid,
    u32,
)

__all__ = ["HOSTILE_NAMES", "hostile_program", "race_probes", "unit_cases"]

#: Names that must never reach the generated source verbatim.
HOSTILE_NAMES = (
    'x*/ system("rm -rf /"); /*',
    "__global__",
    "ψ\u200bunicode",
    "line\\\nbreak",
    "#define int float",
    "vy_lens",
    "b0",
)


def hostile_program(names: tuple[str, ...] = HOSTILE_NAMES, op_id: str | None = None) -> Program:
    """Return a program whose buffer, variable and op-id names are ``names`` (default: hostile)."""
    out, src, shared, v1, v2, loop, last = names
    return Program(
        [
            BufferDecl(src, 0, Access.READ, DType.U32),
            BufferDecl(out, 1, Access.WRITE, DType.U32, 8),
            BufferDecl(shared, 2, Access.WORKGROUP, DType.U32, 8),
            BufferDecl(last, 3, Access.WRITE, DType.U32, 8),
        ],
        8,
        [
            Let(v1, Load(src, gid())),
            Store(shared, lid(), Var(v1) * u32(3)),
            Barrier(),
            Let(v2, u32(0)),
            Loop(loop, u32(0), u32(3), [Assign(v2, Var(v2) + Var(loop))]),
            Store(out, gid(), Load(shared, (lid() + u32(1)) % u32(8)) + Var(v2)),
            Store(last, gid(), u32(7)),
        ],
        op_id='evil */ #include "x" /* \n op' if op_id is None else op_id,
    )


def _u32s(*values: int) -> np.ndarray[Any, Any]:
    return np.array(values, dtype=np.uint32)


def unit_cases() -> list[OpCase]:
    """Return the deterministic unit programs with their inputs."""
    g = gid()
    out: list[OpCase] = [OpCase("hostile-names", hostile_program(), (_u32s(*range(8)),))]
    # Both Select arms and both land operands run, atomics included (one counter per lane).
    acc = BufferDecl("acc", 0, Access.READ_WRITE, DType.U32, 32)
    seen = BufferDecl("seen", 1, Access.WRITE, DType.U32, 8)
    slot = g * u32(4)
    ssa = Program(
        [acc, seen],
        8,
        [
            Let(
                "s",
                Select(
                    (g & u32(1)).eq(u32(0)),
                    Atomic("add", "acc", slot, u32(1)),
                    Atomic("add", "acc", slot + u32(1), u32(10)),
                ),
            ),
            Let(
                "both",
                Bin(
                    "land",
                    Atomic("add", "acc", slot + u32(2), u32(100)).ne(u32(0)),
                    Atomic("or", "acc", slot + u32(3), u32(0x40)).ne(u32(0)),
                ),
            ),
            Store("seen", g, Var("s") + Select(Var("both"), u32(1000), u32(2000))),
        ],
        op_id="unit.ssa",
    )
    out.append(OpCase("ssa-both-arms", ssa, (np.arange(32, dtype=np.uint32),)))
    # Loop bounds are evaluated once, even when the body changes the variables they read.
    bounds = Program(
        [BufferDecl("out", 0, Access.WRITE, DType.U32, 4)],
        4,
        [
            Let("lo", g),
            Let("hi", g + u32(5)),
            Let("n", u32(0)),
            Loop(
                "i",
                Var("lo"),
                Var("hi"),
                [Assign("lo", u32(0)), Assign("hi", u32(0)), Assign("n", Var("n") + Var("i"))],
            ),
            Store("out", g, Var("n")),
        ],
        op_id="unit.bounds",
    )
    out.append(OpCase("loop-bounds-once", bounds, ()))
    # Out-of-bounds atomics return 0 and write nothing, on storage and workgroup memory.
    oob = Program(
        [
            BufferDecl("cell", 0, Access.READ_WRITE, DType.U32, 2),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 8),
            BufferDecl("sh", 2, Access.WORKGROUP, DType.U32, 2),
            BufferDecl("after", 3, Access.WRITE, DType.U32, 8),
        ],
        4,
        [
            Let("a", Atomic("exchange", "cell", g + u32(2), u32(9))),
            Let("b", Atomic("cas", "sh", lid() + u32(2), u32(9), expected=u32(0))),
            Store("out", g, Var("a") + Var("b") + u32(1)),
            If(g.eq(u32(0)), [Return()]),
            Store("after", g, u32(5)),
        ],
        op_id="unit.oob_atomics",
    )
    out.append(OpCase("oob-atomics", oob, (_u32s(3, 4),)))
    out.append(OpCase("early-return", early_return(), ()))
    return out


def early_return() -> Program:
    """Barrier-free early returns, one from inside a loop: it has a batch kernel (``goto``).

    Lane ``i``: returns at once when ``i % 3 == 0``; otherwise stores ``k + 1`` into
    ``out[i]`` for ``k = 0, 1, ...``, returning at ``k == 2`` when ``i`` is even, and
    reaches ``tail[i] = 7`` only when odd.
    """
    g = gid()
    return Program(
        [
            BufferDecl("out", 0, Access.WRITE, DType.U32, 64),
            BufferDecl("tail", 1, Access.WRITE, DType.U32, 64),
        ],
        4,
        [
            If((g % u32(3)).eq(u32(0)), [Return()]),
            Loop(
                "k",
                u32(0),
                u32(4),
                [
                    If(Var("k").eq(u32(2)).land((g & u32(1)).eq(u32(0))), [Return()]),
                    Store("out", g, Var("k") + u32(1)),
                ],
            ),
            Store("tail", g, u32(7)),
        ],
        op_id="unit.early_return",
    )


def race_probes() -> list[tuple[str, Program, bool]]:
    """Return ``(name, program, racy)``: whether the emulator must flag a race."""
    g = gid()
    write = BufferDecl("out", 0, Access.WRITE, DType.U32, 8)
    rw = BufferDecl("rw", 0, Access.READ_WRITE, DType.U32, 8)
    sh = BufferDecl("sh", 1, Access.WORKGROUP, DType.U32, 4)
    return [
        ("same-word-store", Program([write], 4, [Store("out", u32(0), g)]), True),
        ("own-word-store", Program([write], 4, [Store("out", g, g)]), False),
        (
            "neighbour-read-without-barrier",
            Program([rw], 4, [Store("rw", g, Load("rw", (g + u32(1)) % u32(8)))]),
            True,
        ),
        (
            "shared-exchange-with-barrier",
            Program(
                [write, sh],
                4,
                [
                    Store("sh", lid(), g),
                    Barrier(),
                    Store("out", g, Load("sh", (lid() + u32(1)) % u32(4))),
                ],
            ),
            False,
        ),
        (
            "shared-exchange-without-barrier",
            Program(
                [write, sh],
                4,
                [Store("sh", lid(), g), Store("out", g, Load("sh", (lid() + u32(1)) % u32(4)))],
            ),
            True,
        ),
        (
            "atomic-contention",
            Program(
                [BufferDecl("c", 0, Access.READ_WRITE, DType.U32, 1)],
                4,
                [Let("o", Atomic("add", "c", u32(0), u32(1)))],
            ),
            True,
        ),
        (
            "cross-workgroup-read",
            Program(
                [rw],
                2,
                [
                    If(g.eq(u32(0)), [Store("rw", u32(7), u32(1))]),
                    If(g.eq(u32(2)), [Store("rw", u32(6), Load("rw", u32(7)))]),
                ],
            ),
            True,
        ),
        (
            "same-workgroup-read-after-barrier",
            Program(
                [rw],
                2,
                [
                    If(g.eq(u32(0)), [Store("rw", u32(7), u32(1))]),
                    Barrier(),
                    If(g.eq(u32(1)), [Store("rw", u32(6), Load("rw", u32(7)))]),
                ],
            ),
            False,
        ),
    ]
