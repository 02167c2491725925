"""Small programs for the scheduler and prefetch tests."""

from __future__ import annotations

from collections.abc import Callable

from vyre_async.ir import (
    Access,
    Atomic,
    BufferDecl,
    BufLen,
    DType,
    Expr,
    If,
    Let,
    Load,
    Program,
    Store,
    Var,
    gid,
    u32,
)

BINOPS: dict[str, Callable[[Expr, Expr], Expr]] = {
    "xor": lambda x, y: x ^ y,
    "or": lambda x, y: x | y,
    "and": lambda x, y: x & y,
    "add": lambda x, y: x + y,
    "mul3": lambda x, y: x * u32(3) + y,
}


def binop(name: str, n: int, *, workgroup: int = 64) -> Program:
    """``out[i] = op(a[i], b[i])`` over ``n`` u32 elements."""
    i = Var("i")
    return Program(
        [
            BufferDecl("a", 0, Access.READ, DType.U32),
            BufferDecl("b", 1, Access.READ, DType.U32),
            BufferDecl("out", 2, Access.WRITE, DType.U32, n),
        ],
        workgroup,
        [
            Let("i", gid()),
            If(i.lt(BufLen("out")), [Store("out", i, BINOPS[name](Load("a", i), Load("b", i)))]),
        ],
        op_id=f"test.{name}",
    )


def accumulate(*, workgroup: int = 64) -> Program:
    """``x[i] = x[i] * 3 + y[i]`` in place (READ_WRITE x, READ y)."""
    i = Var("i")
    return Program(
        [
            BufferDecl("x", 0, Access.READ_WRITE, DType.U32),
            BufferDecl("y", 1, Access.READ, DType.U32),
        ],
        workgroup,
        [
            Let("i", gid()),
            If(
                i.lt(BufLen("x")),
                [Store("x", i, Load("x", i) * u32(3) + Load("y", i))],
            ),
        ],
        op_id="test.accumulate",
    )


def rotate(n: int, *, workgroup: int = 64) -> Program:
    """``out[i] = a[(i + 1) % n]``: a cross-lane read, so ordering bugs show."""
    i = Var("i")
    return Program(
        [
            BufferDecl("a", 0, Access.READ, DType.U32),
            BufferDecl("out", 1, Access.WRITE, DType.U32, n),
        ],
        workgroup,
        [
            Let("i", gid()),
            If(i.lt(BufLen("out")), [Store("out", i, Load("a", (i + u32(1)) % BufLen("a")))]),
        ],
        op_id="test.rotate",
    )


def atomic_sum(*, workgroup: int = 64) -> Program:
    """``total[0] += sum(a)`` with storage atomics (READ_WRITE total of 1 element)."""
    i = Var("i")
    return Program(
        [
            BufferDecl("a", 0, Access.READ, DType.U32),
            BufferDecl("total", 1, Access.READ_WRITE, DType.U32, 1),
        ],
        workgroup,
        [
            Let("i", gid()),
            If(i.lt(BufLen("a")), [Let("old", Atomic("add", "total", u32(0), Load("a", i)))]),
        ],
        op_id="test.atomic_sum",
    )
