"""Static dtype of an expression, for code generators and engines.

`validate` reports every typing problem as diagnostics; this module answers the
simpler question "what dtype does this (valid) expression have?".
"""

from __future__ import annotations

from collections.abc import Mapping

from vyre_async._exports import public_dir as _public_dir
from vyre_async.errors import InvalidProgram
from vyre_async.ir.expr import (
    Atomic,
    Bin,
    BufLen,
    Builtin,
    Cast,
    Const,
    Expr,
    Fma,
    Load,
    Select,
    Un,
    Var,
)
from vyre_async.ir.ops import bin_result, un_result
from vyre_async.ir.types import BufferDecl, DType

__all__ = ["expr_dtype"]
__dir__ = _public_dir(__name__)


def expr_dtype(
    expr: Expr, variables: Mapping[str, DType], buffers: Mapping[str, BufferDecl]
) -> DType:
    """Return the dtype of ``expr`` given the dtypes of visible variables and the buffers.

    Raises:
        InvalidProgram: the expression is ill-typed or names something unknown
            (run `validate` first for the full list of problems).
    """
    match expr:
        case Const(dtype=dtype):
            return dtype
        case Var(name=name):
            try:
                return variables[name]
            except KeyError:
                raise _bad(f"variable {name!r} is not declared") from None
        case Load(buffer=name):
            try:
                return buffers[name].dtype
            except KeyError:
                raise _bad(f"buffer {name!r} is not declared") from None
        case BufLen() | Builtin() | Atomic():
            return DType.U32
        case Bin(op=op, a=a, b=b):
            left = expr_dtype(a, variables, buffers)
            right = expr_dtype(b, variables, buffers)
            result = bin_result(op, left) if left is right else None
            if result is None:
                raise _bad(f"{op.value} is not defined on ({left.value}, {right.value})")
            return result
        case Un(op=op, a=a):
            operand = expr_dtype(a, variables, buffers)
            result = un_result(op, operand)
            if result is None:
                raise _bad(f"{op.value} is not defined on {operand.value}")
            return result
        case Select(if_true=t):
            return expr_dtype(t, variables, buffers)
        case Cast(dtype=dtype):
            return dtype
        case Fma():
            return DType.F32
    raise _bad(f"unknown expression node {expr!r}")


def _bad(message: str) -> InvalidProgram:
    return InvalidProgram(message, fix="run vyre_async.ir.validate(program) and fix what it lists")
