"""`expr_dtype`, the static dtype of an expression, pinned per node kind (issue 28 triage).

The slow interpreter that the reference engine is checked against types its
values with it, so a wrong answer here would make the oracle agree with a
wrong engine. Each node kind's dtype, and each error with its exact text.
"""

from __future__ import annotations

import re

import pytest

from vyre_async.errors import InvalidProgram
from vyre_async.ir import (
    Access,
    Atomic,
    Bin,
    BufferDecl,
    BufLen,
    Cast,
    DType,
    Expr,
    Fma,
    Load,
    Select,
    Un,
    Var,
    f32,
    gid,
    i32,
    u32,
)
from vyre_async.ir.infer import expr_dtype

VARIABLES = {"i": DType.I32, "f": DType.F32, "b": DType.BOOL}
BUFFERS = {
    "x": BufferDecl("x", 0, Access.READ_WRITE, DType.F32),
    "n": BufferDecl("n", 1, Access.READ, DType.I32),
}
FIX = "Fix: run vyre_async.ir.validate(program) and fix what it lists"


@pytest.mark.parametrize(
    ("expr", "dtype"),
    [
        (u32(1), DType.U32),
        (i32(-1), DType.I32),
        (f32(0.5), DType.F32),
        (Var("i"), DType.I32),
        (Var("b"), DType.BOOL),
        (Load("x", u32(0)), DType.F32),
        (Load("n", u32(0)), DType.I32),
        (BufLen("x"), DType.U32),
        (gid(), DType.U32),
        (Atomic("add", "c", u32(0), u32(1)), DType.U32),
        (Bin("add", Var("i"), i32(2)), DType.I32),
        (Bin("mul", Var("f"), Load("x", u32(0))), DType.F32),
        (Bin("lt", Var("f"), f32(1.0)), DType.BOOL),
        (Bin("land", Var("b"), Var("b")), DType.BOOL),
        (Un("neg", Var("i")), DType.I32),
        (Un("sqrt", Var("f")), DType.F32),
        (Un("lnot", Var("b")), DType.BOOL),
        (Select(Var("b"), Var("i"), i32(0)), DType.I32),
        (Select(Var("b"), Var("f"), f32(0.0)), DType.F32),
        (Cast("u32", Var("f")), DType.U32),
        (Cast("f32", Var("i")), DType.F32),
        (Fma(Var("f"), Var("f"), Var("f")), DType.F32),
        # a buffer read under each kind that types its operands
        (Bin("add", Load("n", u32(0)), i32(1)), DType.I32),
        (Un("neg", Load("x", u32(0))), DType.F32),
        (Select(Var("b"), Load("n", u32(0)), i32(0)), DType.I32),
    ],
    ids=repr,
)
def test_each_node_kind_has_its_dtype(expr: Expr, dtype: DType) -> None:
    assert expr_dtype(expr, VARIABLES, BUFFERS) is dtype


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        (Var("nope"), "variable 'nope' is not declared"),
        (Load("nope", u32(0)), "buffer 'nope' is not declared"),
        (Bin("add", Var("i"), Var("f")), "add is not defined on (i32, f32)"),
        (Bin("add", Var("b"), Var("b")), "add is not defined on (bool, bool)"),
        (Bin("and", Var("f"), Var("nope")), "variable 'nope' is not declared"),
        (Un("not", Var("f")), "not is not defined on f32"),
        (Un("neg", Var("nope")), "variable 'nope' is not declared"),
        (Select(Var("b"), Var("nope"), i32(0)), "variable 'nope' is not declared"),
    ],
    ids=repr,
)
def test_each_error_names_what_is_wrong_with_the_fix(expr: Expr, message: str) -> None:
    with pytest.raises(InvalidProgram) as info:
        expr_dtype(expr, VARIABLES, BUFFERS)
    assert str(info.value) == f"{message}\n{FIX}"
    # no KeyError shown chained to it: the message is the whole story
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__


def test_an_unknown_node_is_refused() -> None:
    class Odd(Expr):
        def __repr__(self) -> str:
            return "Odd()"

    with pytest.raises(InvalidProgram, match=re.escape("unknown expression node Odd()")):
        expr_dtype(Odd(), VARIABLES, BUFFERS)
