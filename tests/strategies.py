"""Hypothesis strategies for random *valid* programs of the IR, and inputs for them.

`programs()` draws programs that are valid by construction, so property tests
(wire round trips, backend-vs-reference comparisons, validation) can use them
without filtering. "Valid" covers every rule of the IR specification:

- buffers: 1 to 5, unique names and unique bindings (drawn from 0..9; names
  from a fixed pool that includes non-ASCII names); the first buffer is an
  output (WRITE or READ_WRITE); WRITE and WORKGROUP buffers have
  ``1 <= count <= 16``; READ, UNIFORM and READ_WRITE buffers are runtime-sized
  (count 0) or have ``1 <= count <= 16``; workgroup memory is at most 320 bytes;
- workgroup: every axis ≥ 1 and at most 1024 lanes in all (multi-axis shapes
  unless ``multi_dim_workgroups=False``);
- scoping: every buffer and variable used is declared and visible; no `Let`
  (or loop variable) reuses a name visible at that point (a name may be reused
  once its scope has ended); loop variables are never assigned; every `Assign`
  matches the dtype its `Let` fixed;
- typing: strict, from the tables of `vyre_async.ir.ops` (same-dtype operands,
  U32 indices and loop bounds, BOOL or U32 conditions, F32 `Fma`, U32 atomic
  operands, ``expected`` exactly on ``cas``); stores write the buffer's dtype;
- memory: stores go to WRITE, READ_WRITE or WORKGROUP buffers; atomics only to
  READ_WRITE U32 or WORKGROUP U32 buffers;
- barriers: only in uniform control flow, meaning at top level, in `Block`s
  and in `Loop`s whose bounds are both literals (nested only in such
  contexts), and never after a `Return`; `Return` never appears inside a loop,
  ends the body it is in, and forbids barriers for the rest of the program;
- size: at most about ``max_nodes`` (default 60) statement and expression nodes,
  statement nesting ≤ ``max_stmt_depth`` (3), expression depth ≤
  ``max_expr_depth`` (5); every loop runs at most 4 iterations (literal bounds
  ``start`` in 0..2 and ``end`` in 0..4, or a divergent ``end`` written as
  ``min(expr, k)`` with ``k`` ≤ 4), so a program is cheap to interpret.

Every statement kind, every expression kind and every `BinOp`, `UnOp`,
`AtomicOp`, `BuiltinKind`, `DType` and `Access` is reachable; F32 constants
include NaN, ±inf, ±0.0, subnormals and the extremes of the format.

`small_inputs_for(program)` draws one numpy array per input buffer in
declaration order, of the buffer's numpy dtype and declared count (or a drawn
length 0..16 when runtime-sized).
"""

from __future__ import annotations

import functools
import struct
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

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
    Builtin,
    BuiltinKind,
    Cast,
    Const,
    DType,
    Expr,
    Fma,
    If,
    Let,
    Load,
    Loop,
    Program,
    Return,
    Select,
    Stmt,
    Store,
    Un,
    UnOp,
    Var,
)
from vyre_async.ir.ops import bin_result, un_result
from vyre_async.ir.walk import iter_exprs, iter_stmts

__all__ = [
    "F32_SPECIALS",
    "count_nodes",
    "f32_values",
    "programs",
    "small_inputs_for",
]


def _f32(bits: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


#: Interesting binary32 values: zeros, NaN, infinities, subnormals, extremes.
F32_SPECIALS: tuple[float, ...] = (
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    -0.5,
    1.5,
    2.5,
    float("nan"),
    float("inf"),
    float("-inf"),
    _f32(0x0000_0001),  # smallest subnormal
    _f32(0x8000_0001),  # smallest negative subnormal
    _f32(0x007F_FFFF),  # largest subnormal
    _f32(0x0080_0000),  # smallest normal
    _f32(0x7F7F_FFFF),  # largest finite
    _f32(0xFF7F_FFFF),  # most negative finite
    16777217.0,  # 2**24 + 1 (rounds)
    3.0e38,
)

_U32_SPECIALS = (0, 1, 2, 3, 5, 31, 32, 33, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFE, 0xFFFF_FFFF)
_I32_SPECIALS = (0, 1, -1, 2, -2, 7, -7, 31, 32, -(2**31), 2**31 - 1, -(2**31) + 1)

_BUFFER_NAMES = ("out", "src", "acc", "data", "shared", "tmp", "ψ", "x2")
_VAR_NAMES = ("v", "w", "t", "s", "i", "j", "k", "µ")
_WORKGROUPS_1D: tuple[int | tuple[int, ...], ...] = (1, 2, 3, 4, 8, 16, 32, 64, 256, 1024, (5,))
_WORKGROUPS_ND: tuple[int | tuple[int, ...], ...] = (
    (2, 2),
    (4, 2, 1),
    (2, 2, 2),
    (1, 1, 1),
    (3, 5),
    (8, 8, 16),
    (1, 4),
)


def f32_values() -> st.SearchStrategy[float]:
    """Return a strategy for binary32 values, specials (NaN, ±inf, ±0, subnormals) included."""
    return st.one_of(
        st.sampled_from(F32_SPECIALS),
        st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True),
    )


def _u32_values() -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from(_U32_SPECIALS), st.integers(0, 0xFFFF_FFFF))


def _i32_values() -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from(_I32_SPECIALS), st.integers(-(2**31), 2**31 - 1))


# (op, operand dtype) pairs per result dtype, from the typing tables (the single source).
_BIN_CHOICES: dict[DType, tuple[tuple[BinOp, DType], ...]] = {
    result: tuple(
        (op, operand) for op in BinOp for operand in DType if bin_result(op, operand) is result
    )
    for result in DType
}
_UN_CHOICES: dict[DType, tuple[tuple[UnOp, DType], ...]] = {
    result: tuple(
        (op, operand) for op in UnOp for operand in DType if un_result(op, operand) is result
    )
    for result in DType
}
_ATOMIC_TARGET = (Access.READ_WRITE, Access.WORKGROUP)
_STORE_TARGET = (Access.WRITE, Access.READ_WRITE, Access.WORKGROUP)


class _Scopes:
    """Visible variables: a stack of frames mapping name → (dtype, is_loop_variable)."""

    def __init__(self) -> None:
        self.frames: list[dict[str, tuple[DType, bool]]] = [{}]

    def visible(self) -> dict[str, tuple[DType, bool]]:
        out: dict[str, tuple[DType, bool]] = {}
        for frame in self.frames:
            out.update(frame)
        return out


class _ProgramBuilder:
    """Draws one program; all state of the draw lives here."""

    def __init__(
        self,
        draw: st.DrawFn,
        buffers: list[BufferDecl],
        *,
        max_nodes: int,
        max_stmt_depth: int,
        max_expr_depth: int,
    ) -> None:
        self.draw = draw
        self.budget = max_nodes
        self.max_stmt_depth = max_stmt_depth
        self.max_expr_depth = max_expr_depth
        self.buffers = buffers
        self.loadable = {dt: [b for b in buffers if b.dtype is dt] for dt in DType}
        self.writable = [b for b in buffers if b.access in _STORE_TARGET]
        self.atomic_targets = [
            b for b in buffers if b.dtype is DType.U32 and b.access in _ATOMIC_TARGET
        ]
        self.returned = False
        self.fresh = 0
        self.scopes = _Scopes()

    # Names ---------------------------------------------------------------------------
    def new_name(self) -> str:
        visible = self.scopes.visible()
        free = [n for n in _VAR_NAMES if n not in visible]
        if free and self.draw(st.integers(0, 3)) > 0:
            return self.draw(st.sampled_from(free))
        self.fresh += 1
        return f"v{self.fresh}"

    # Statements ----------------------------------------------------------------------
    def body(
        self,
        depth: int,
        *,
        uniform: bool,
        in_loop: bool,
        extra: dict[str, DType] | None = None,
        size: tuple[int, int] = (0, 4),
    ) -> tuple[Stmt, ...]:
        frame: dict[str, tuple[DType, bool]] = {}
        if extra:
            frame.update({name: (dtype, True) for name, dtype in extra.items()})
        self.scopes.frames.append(frame)
        try:
            out: list[Stmt] = []
            for _ in range(self.draw(st.integers(*size))):
                if self.budget <= 0:
                    break
                stmt = self.stmt(depth, uniform=uniform, in_loop=in_loop)
                out.append(stmt)
                if isinstance(stmt, Return):
                    break
            return tuple(out)
        finally:
            self.scopes.frames.pop()

    def stmt(self, depth: int, *, uniform: bool, in_loop: bool) -> Stmt:
        self.budget -= 1
        visible = self.scopes.visible()
        mutable = [(n, dt) for n, (dt, is_loop) in visible.items() if not is_loop]
        kinds = ["let", "let", "let"]
        if self.writable:
            kinds += ["store", "store", "store"]
        if mutable:
            kinds += ["assign", "assign"]
        if depth < self.max_stmt_depth and self.budget >= 4:
            kinds += ["if", "if", "loop", "loop", "block"]
        if uniform and not self.returned:
            kinds.append("barrier")
        if not in_loop:
            kinds.append("return")
        kind = self.draw(st.sampled_from(kinds))
        if kind == "let":
            dtype = self.draw(st.sampled_from(DType))
            value = self.expr(dtype, 1)
            name = self.new_name()
            self.scopes.frames[-1][name] = (dtype, False)
            return Let(name, value)
        if kind == "assign":
            name, dtype = self.draw(st.sampled_from(mutable))
            return Assign(name, self.expr(dtype, 1))
        if kind == "store":
            decl = self.draw(st.sampled_from(self.writable))
            index = self.index(1)
            return Store(decl.name, index, self.expr(decl.dtype, 1))
        if kind == "if":
            cond = self.expr(self.draw(st.sampled_from((DType.BOOL, DType.U32))), 1)
            then = self.body(depth + 1, uniform=False, in_loop=in_loop)
            orelse = self.body(depth + 1, uniform=False, in_loop=in_loop)
            return If(cond, then, orelse)
        if kind == "loop":
            return self.loop(depth, uniform=uniform)
        if kind == "block":
            return Block(self.body(depth + 1, uniform=uniform, in_loop=in_loop))
        if kind == "barrier":
            return Barrier()
        self.returned = True
        return Return()

    def loop(self, depth: int, *, uniform: bool) -> Loop:
        literal = self.draw(st.booleans())
        if literal:
            self.budget -= 2
            start: Expr = Const(DType.U32, self.draw(st.integers(0, 2)))
            end: Expr = Const(DType.U32, self.draw(st.integers(0, 4)))
        else:
            # Any start; end = min(expr, k) with k <= 4 keeps the trip count <= 4.
            start = self.expr(DType.U32, 1)
            self.budget -= 2
            limit = Const(DType.U32, self.draw(st.integers(0, 4)))
            end = Bin(BinOp.MIN, self.expr(DType.U32, 2), limit)
        var = self.new_name()
        body = self.body(
            depth + 1, uniform=uniform and literal, in_loop=True, extra={var: DType.U32}
        )
        return Loop(var, start, end, body)

    # Expressions ---------------------------------------------------------------------
    def index(self, depth: int) -> Expr:
        choice = self.draw(st.integers(0, 4))
        if choice == 0:
            self.budget -= 1
            return Builtin(BuiltinKind.GID, 0)
        if choice == 1:
            self.budget -= 1
            return Builtin(BuiltinKind.LID, 0)
        if choice == 2:
            self.budget -= 1
            return Const(DType.U32, self.draw(st.integers(0, 17)))
        return self.expr(DType.U32, depth)

    def const(self, dtype: DType) -> Const:
        if dtype is DType.F32:
            return Const(dtype, self.draw(f32_values()))
        if dtype is DType.U32:
            return Const(dtype, self.draw(_u32_values()))
        if dtype is DType.I32:
            return Const(dtype, self.draw(_i32_values()))
        return Const(dtype, self.draw(st.booleans()))

    def expr(self, dtype: DType, depth: int) -> Expr:
        self.budget -= 1
        variables = [n for n, (dt, _) in self.scopes.visible().items() if dt is dtype]
        kinds = ["const", "const"]
        if variables:
            kinds += ["var", "var"]
        if dtype is DType.U32:
            kinds += ["buflen", "builtin"]
        if depth < self.max_expr_depth and self.budget > 0:
            kinds += ["bin", "bin", "bin", "un", "select", "cast"]
            if self.loadable[dtype]:
                kinds += ["load", "load"]
            if dtype is DType.F32:
                kinds.append("fma")
            if dtype is DType.U32 and self.atomic_targets:
                kinds.append("atomic")
        kind = self.draw(st.sampled_from(kinds))
        sub = depth + 1
        if kind == "const":
            return self.const(dtype)
        if kind == "var":
            return Var(self.draw(st.sampled_from(variables)))
        if kind == "buflen":
            return BufLen(self.draw(st.sampled_from(self.buffers)).name)
        if kind == "builtin":
            kind_ = self.draw(st.sampled_from(BuiltinKind))
            return Builtin(kind_, self.draw(st.integers(0, 2)))
        if kind == "load":
            decl = self.draw(st.sampled_from(self.loadable[dtype]))
            return Load(decl.name, self.index(sub))
        if kind == "bin":
            bin_op, operand = self.draw(st.sampled_from(_BIN_CHOICES[dtype]))
            return Bin(bin_op, self.expr(operand, sub), self.expr(operand, sub))
        if kind == "un":
            un_op, operand = self.draw(st.sampled_from(_UN_CHOICES[dtype]))
            return Un(un_op, self.expr(operand, sub))
        if kind == "select":
            cond = self.expr(self.draw(st.sampled_from((DType.BOOL, DType.U32))), sub)
            return Select(cond, self.expr(dtype, sub), self.expr(dtype, sub))
        if kind == "cast":
            return Cast(dtype, self.expr(self.draw(st.sampled_from(DType)), sub))
        if kind == "fma":
            return Fma(
                self.expr(DType.F32, sub), self.expr(DType.F32, sub), self.expr(DType.F32, sub)
            )
        decl = self.draw(st.sampled_from(self.atomic_targets))
        op = self.draw(st.sampled_from(AtomicOp))
        index = self.index(sub)
        value = self.expr(DType.U32, sub)
        expected = self.expr(DType.U32, sub) if op is AtomicOp.CAS else None
        return Atomic(op, decl.name, index, value, expected)


@st.composite
def _buffer_tables(draw: st.DrawFn) -> list[BufferDecl]:
    n = draw(st.integers(1, 5))
    names = draw(st.lists(st.sampled_from(_BUFFER_NAMES), min_size=n, max_size=n, unique=True))
    bindings = draw(st.lists(st.integers(0, 9), min_size=n, max_size=n, unique=True))
    out: list[BufferDecl] = []
    for i, (name, binding) in enumerate(zip(names, bindings, strict=True)):
        outputs = (Access.WRITE, Access.READ_WRITE)
        access = draw(st.sampled_from(outputs if i == 0 else tuple(Access)))
        dtype = draw(st.sampled_from(DType))
        if access in (Access.WRITE, Access.WORKGROUP):
            count = draw(st.integers(1, 16))
        else:
            count = draw(st.one_of(st.just(0), st.integers(1, 16)))
        out.append(BufferDecl(name, binding, access, dtype, count))
    return out


@st.composite
def programs(
    draw: st.DrawFn,
    *,
    max_nodes: int = 60,
    max_stmt_depth: int = 3,
    max_expr_depth: int = 5,
    multi_dim_workgroups: bool = True,
) -> Program:
    """Draw a random valid `Program` (see the module docstring for what "valid" covers).

    Args:
        draw: Supplied by Hypothesis.
        max_nodes: Rough bound on statement + expression nodes (a few more may
            be needed to close open expressions).
        max_stmt_depth: Deepest If/Loop/Block nesting.
        max_expr_depth: Deepest expression tree.
        multi_dim_workgroups: Also draw 2- and 3-axis workgroup shapes (those
            need ``DispatchConfig.grid_override`` to dispatch).

    Returns:
        A strategy of programs.
    """
    buffers = draw(_buffer_tables())
    shapes = _WORKGROUPS_1D + (_WORKGROUPS_ND if multi_dim_workgroups else ())
    workgroup = draw(st.sampled_from(shapes))
    builder = _ProgramBuilder(
        draw,
        buffers,
        max_nodes=draw(st.integers(min(12, max_nodes), max_nodes)),
        max_stmt_depth=max_stmt_depth,
        max_expr_depth=max_expr_depth,
    )
    body = builder.body(0, uniform=True, in_loop=False, size=(1, 8))
    op_id = draw(st.sampled_from(("", "test.op", "vyre.ψ")))
    shuffled = draw(st.permutations(buffers))
    return Program(shuffled, workgroup, body, op_id)


def count_nodes(program: Program) -> int:
    """Return the number of statement and expression nodes of ``program``."""
    return sum(1 for _ in iter_stmts(program.body)) + sum(1 for _ in iter_exprs(program.body))


_INPUT_ELEMENTS: dict[DType, st.SearchStrategy[Any]] = {
    DType.U32: _u32_values(),
    DType.I32: _i32_values(),
    DType.F32: f32_values(),
    DType.BOOL: st.sampled_from((0, 1)),
}


def _array(dtype: DType, length: int) -> st.SearchStrategy[np.ndarray[Any, Any]]:
    return hnp.arrays(dtype.numpy, length, elements=_INPUT_ELEMENTS[dtype])


def small_inputs_for(
    program: Program, *, max_len: int = 16
) -> st.SearchStrategy[list[np.ndarray[Any, Any]]]:
    """Return a strategy for the inputs of ``program``: one array per input buffer.

    Inputs are the READ, UNIFORM and READ_WRITE buffers in declaration order.
    Each array has the buffer's numpy dtype (BOOL → ``uint32`` holding 0/1) and
    its declared count, or a drawn length ``0..max_len`` when runtime-sized.

    Args:
        program: The program the inputs are for.
        max_len: Longest runtime-sized input.

    Returns:
        A strategy of lists of numpy arrays.
    """
    parts: list[st.SearchStrategy[np.ndarray[Any, Any]]] = []
    for decl in program.inputs:
        lengths = st.just(decl.count) if decl.count else st.integers(0, max_len)
        parts.append(lengths.flatmap(functools.partial(_array, decl.dtype)))
    return st.tuples(*parts).map(list)
