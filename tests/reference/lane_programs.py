"""Random valid programs shaped like real kernels, to reach every execution path of the engine.

`tests.strategies.programs` draws arbitrary valid programs; this strategy
draws the index and condition *patterns* kernels use — ``gid``, ``lid``,
``wgid·L + lid``, ``lid < k``, ``gid % m == 0``, data-dependent conditions,
per-lane loop bounds, returns under branches, workgroup memory with
barriers, colliding atomics with and without their old values — on grids of
a few workgroups of up to 32 lanes, so that the engine's structured paths
(axis cuts, compaction, masks, strided views, column atomics, segmented
scans) all run and are compared with the slow interpreter.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from vyre_async.ir import (
    Access,
    Assign,
    Atomic,
    AtomicOp,
    Barrier,
    Bin,
    BinOp,
    Block,
    BufferDecl,
    BufLen,
    Cast,
    DType,
    Expr,
    If,
    Let,
    Load,
    Loop,
    Program,
    Return,
    Select,
    Stmt,
    Store,
    Var,
    f32,
    gid,
    lid,
    nwg,
    u32,
    wgid,
)

__all__ = ["lane_programs", "lane_inputs"]

_WORKGROUPS = ((4, 1, 1), (8, 1, 1), (16, 1, 1), (32, 1, 1), (4, 2, 1), (2, 2, 2), (3, 1, 1))
_GRIDS = ((1, 1, 1), (2, 1, 1), (3, 1, 1), (4, 1, 1), (2, 2, 1))


class _Draw:
    def __init__(self, draw: st.DrawFn, lanes_per_wg: int, multi: bool) -> None:
        self.draw = draw
        self.nl = lanes_per_wg
        self.multi = multi
        self.counter = 0
        self.returned = False
        self.budget = 40
        self.loop_vars: set[str] = set()

    def name(self) -> str:
        self.counter += 1
        return f"v{self.counter}"

    def k(self, hi: int = 40) -> Expr:
        return u32(self.draw(st.integers(0, hi)))

    def index(self, scope: list[str]) -> Expr:
        nl = u32(self.nl)
        choices: list[Expr] = [
            gid(),
            lid(),
            wgid(),
            gid() * u32(2) + u32(1),
            wgid() * nl + lid(),
            lid() + self.k(8),
            self.k(40),
            Load("inp", gid()) % (self.k(7) + u32(1)),
            gid() - self.k(3),
            nwg() - wgid(),
            wgid() * u32(self.draw(st.integers(1, 40))) + lid() * u32(2),
            u32(self.nl - 1) - lid(),
        ]
        if self.multi:
            choices += [lid(1) * u32(4) + lid(0), gid(1), wgid(1) * u32(3) + lid(2)]
        choices += [Var(v) for v in scope]
        return self.draw(st.sampled_from(choices))

    def cond(self, scope: list[str]) -> Expr:
        x = self.index(scope)
        kind = self.draw(st.integers(0, 6))
        if kind == 0:
            return x.lt(self.k())
        if kind == 1:
            return x.ge(self.k())
        if kind == 2:
            return (x % u32(self.draw(st.integers(2, 5)))).eq(u32(0))
        if kind == 3:
            return Load("inp", x).gt(self.k(10))
        if kind == 4:
            return lid().lt(self.k(self.nl))
        if kind == 5:
            return wgid().eq(self.k(3))
        return x & u32(1)  # a U32 condition

    def value(self, scope: list[str]) -> Expr:
        kind = self.draw(st.integers(0, 5))
        if kind == 0:
            return self.index(scope)
        if kind == 1:
            return Load("inp", self.index(scope))
        if kind == 2:
            return Load("sh", self.index(scope)) + self.k()
        if kind == 3:
            return Select(self.cond(scope), self.index(scope), Load("acc", self.index(scope)))
        if kind == 4:
            return self.atomic(scope)
        return Cast(DType.U32, Load("fin", self.index(scope)) * f32(2.5))

    def atomic(self, scope: list[str]) -> Atomic:
        op = self.draw(st.sampled_from(AtomicOp))
        target = self.draw(st.sampled_from(("acc", "sh")))
        index = self.index(scope) if self.draw(st.booleans()) else self.k(9)
        value = self.index(scope) if self.draw(st.booleans()) else self.k(5)
        expected = None
        if op is AtomicOp.CAS:
            expected = self.draw(st.sampled_from((u32(0), self.k(5), Load("acc", index))))
        return Atomic(op, target, index, value, expected)

    def body(self, scope: list[str], depth: int, top: bool) -> list[Stmt]:
        out: list[Stmt] = []
        local = list(scope)
        for _ in range(self.draw(st.integers(1, 5 if top else 3))):
            if self.budget <= 0:
                break
            self.budget -= 1
            stmt = self.stmt(local, depth, top)
            out.append(stmt)
            if isinstance(stmt, Let) and not stmt.name.startswith("unused"):
                local.append(stmt.name)
            if isinstance(stmt, Return):
                break
        return out

    def stmt(self, scope: list[str], depth: int, top: bool) -> Stmt:
        kinds = ["let", "store", "store", "fstore", "atomic", "shstore"]
        assignable = [v for v in scope if v not in self.loop_vars]
        if assignable:
            kinds.append("assign")
        if depth < 3:
            kinds += ["if", "if", "loop", "block"]
        if top and not self.returned:
            kinds += ["barrier", "barrier"]
        if not top:
            kinds.append("return")
        kind = self.draw(st.sampled_from(kinds))
        if kind == "let":
            return Let(self.name(), self.value(scope))
        if kind == "assign":
            return Assign(self.draw(st.sampled_from(assignable)), self.value(scope))
        if kind == "store":
            return Store("out", self.index(scope), self.value(scope))
        if kind == "fstore":
            v = Cast(DType.F32, self.value(scope)) * Load("fin", self.index(scope))
            return Store("fout", self.index(scope), v)
        if kind == "shstore":
            return Store("sh", self.index(scope), self.value(scope))
        if kind == "atomic":
            if self.draw(st.booleans()):
                return Let(f"unused{self.name()}", self.atomic(scope))
            return Store("out", self.index(scope), self.atomic(scope))
        if kind == "if":
            cond = self.cond(scope)
            then = self.body(scope, depth + 1, False)
            orelse = self.body(scope, depth + 1, False) if self.draw(st.booleans()) else []
            return If(cond, then, orelse)
        if kind == "loop":
            var = self.name()
            self.loop_vars.add(var)
            shape = self.draw(st.integers(0, 3))
            if shape == 0:
                start, end = self.k(2), self.k(4)
            elif shape == 1:
                start, end = u32(0), Bin(BinOp.MIN, lid(), u32(3))
            elif shape == 2:
                start, end = lid() % u32(3), u32(3)
            else:
                start, end = u32(0), Load("inp", gid()) % u32(4)
            body = self.body([*scope, var], depth + 1, top and shape == 0)
            return Loop(var, start, end, body)
        if kind == "block":
            return Block(self.body(scope, depth + 1, top))
        if kind == "barrier":
            return Barrier()
        self.returned = True
        return Return()


@st.composite
def lane_programs(draw: st.DrawFn) -> tuple[Program, tuple[int, int, int]]:
    """Draw a kernel-shaped valid-by-construction program and the grid to launch it on.

    Returns:
        ``(program, grid)``. Programs the validator rejects (rare: a barrier
        after a divergent return through a nested block) are filtered by the test.
    """
    workgroup = draw(st.sampled_from(_WORKGROUPS))
    grid = draw(st.sampled_from(_GRIDS))
    nl = workgroup[0] * workgroup[1] * workgroup[2]
    lanes = nl * grid[0] * grid[1] * grid[2]
    buffers = [
        BufferDecl("inp", 0, Access.READ, DType.U32),
        BufferDecl("fin", 1, Access.READ, DType.F32),
        BufferDecl("out", 2, Access.WRITE, DType.U32, draw(st.integers(1, lanes + 4))),
        BufferDecl("acc", 3, Access.READ_WRITE, DType.U32, draw(st.integers(1, 10))),
        BufferDecl("fout", 4, Access.WRITE, DType.F32, draw(st.integers(1, lanes + 2))),
        BufferDecl("sh", 5, Access.WORKGROUP, DType.U32, draw(st.integers(1, nl + 3))),
    ]
    maker = _Draw(draw, nl, workgroup[1] * workgroup[2] > 1)
    body = maker.body([], 0, True)
    body.append(Store("out", u32(0), BufLen("inp")))
    return Program(buffers, workgroup, body, op_id="test.lanes"), grid


@st.composite
def lane_inputs(draw: st.DrawFn, program: Program) -> list[np.ndarray[Any, Any]]:
    """Draw inputs for a `lane_programs` program: small words, so data indices hit."""
    lanes = 4 * 32 * 2
    n = draw(st.integers(0, lanes))
    inp = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    fin = draw(st.lists(st.floats(-8, 8, width=32, allow_nan=False), min_size=0, max_size=lanes))
    acc_count = program.buffer("acc").count
    acc = draw(st.lists(st.integers(0, 12), min_size=acc_count, max_size=acc_count))
    return [
        np.array(inp, dtype=np.uint32),
        np.array(fin, dtype=np.float32),
        np.array(acc, dtype=np.uint32),
    ]
