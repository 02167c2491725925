"""One small program per operator x dtype (and per cast), run on every pair of edge values.

Each program computes ``out[i] = op(a[i], b[i])`` (or ``op(a[i])``,
``cast(a[i])``, ``fma(a[i], b[i], c[i])``) over the cross product of the
dtype's edge values — zeros, ±1, extremes, INT_MIN/-1, shift counts of 31/32/33,
NaN, ±inf, ±0.0, subnormals, halfway cases — so every prelude helper and
every operator mapping of the code generator is exercised against the numpy
reference on exactly the inputs where C and the IR disagree by default.

Those operands come from buffers, so the compiler sees them only at run time.
The ``*.const-rhs`` cases give ``shl``/``shr`` (and ``div``/``mod``) on U32
and I32 their right operand as a literal ``Const`` in the IR instead — shift
counts of 32, 33, 0xFFFFFFFF, -1, INT_MIN... — one store per constant, so the
generated C has ``vy_shl_u32(t, 0x00000020u)`` where a constant-folding
compiler could go its own way.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from vyre_async.ir import (
    Access,
    Bin,
    BinOp,
    BufferDecl,
    BufLen,
    Cast,
    Const,
    DType,
    Expr,
    Fma,
    If,
    Let,
    Load,
    Program,
    Store,
    Un,
    UnOp,
    Var,
    gid,
)
from vyre_async.ir.ops import bin_result, un_result

__all__ = ["CONST_RHS", "OpCase", "op_cases"]


def _f32(bits: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


_EDGE: dict[DType, list[Any]] = {
    DType.U32: [
        0,
        1,
        2,
        3,
        5,
        7,
        31,
        32,
        33,
        255,
        0x7FFF_FFFF,
        0x8000_0000,
        0xFFFF_FFFE,
        0xFFFF_FFFF,
    ],
    DType.I32: [0, 1, -1, 2, -2, 7, -7, 31, 32, 33, -33, 2**31 - 1, -(2**31), -(2**31) + 1],
    DType.F32: [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -0.5,
        1.5,
        2.5,
        -2.5,
        3.0,
        float("nan"),
        float("inf"),
        float("-inf"),
        _f32(0x0000_0001),
        _f32(0x8000_0001),
        _f32(0x007F_FFFF),
        _f32(0x0080_0000),
        _f32(0x7F7F_FFFF),
        _f32(0xFF7F_FFFF),
        16777217.0,
        2147483520.0,
        2147483648.0,
        -2147483904.0,
        4294967040.0,
        4294967296.0,
        -0.7,
        100.25,
    ],
    DType.BOOL: [0, 1, 5],  # a BOOL word other than 0/1 loads as true
}


#: Literal right operands of the ``*.const-rhs`` cases, per operator and dtype.
_COUNTS_U32 = [0, 1, 31, 32, 33, 63, 64, 0x8000_0000, 0xFFFF_FFE0, 0xFFFF_FFFF]
_COUNTS_I32 = [0, 1, 31, 32, 33, -1, -31, -32, -33, 2**31 - 1, -(2**31)]
CONST_RHS: dict[tuple[BinOp, DType], list[int]] = {
    (BinOp.SHL, DType.U32): _COUNTS_U32,
    (BinOp.SHR, DType.U32): _COUNTS_U32,
    (BinOp.SHL, DType.I32): _COUNTS_I32,
    (BinOp.SHR, DType.I32): _COUNTS_I32,
    (BinOp.DIV, DType.U32): [0, 1, 7, 0xFFFF_FFFF],
    (BinOp.MOD, DType.U32): [0, 1, 7, 0xFFFF_FFFF],
    (BinOp.DIV, DType.I32): [0, 1, -1, 7, -7, -(2**31)],
    (BinOp.MOD, DType.I32): [0, 1, -1, 7, -7, -(2**31)],
}


@dataclass(frozen=True)
class OpCase:
    """A program and its inputs (one array per input buffer)."""

    name: str
    program: Program
    inputs: tuple[np.ndarray[Any, Any], ...]


def _program(name: str, operands: list[DType], result: DType, build: Any) -> Program:
    decls = [BufferDecl(f"in{k}", k, Access.READ, dt) for k, dt in enumerate(operands)]
    decls.append(BufferDecl("out", len(operands), Access.WRITE, result, 1))  # resized per call
    i = Var("i")
    loads: list[Expr] = [Load(f"in{k}", i) for k in range(len(operands))]
    body = [Let("i", gid()), If(i.lt(BufLen("in0")), [Store("out", i, build(loads))])]
    return Program(decls, 64, body, op_id=f"optable.{name}")


def _columns(dtypes: list[DType]) -> tuple[np.ndarray[Any, Any], ...]:
    rows = list(itertools.product(*(_EDGE[dt] for dt in dtypes)))
    return tuple(
        np.array([r[k] for r in rows], dtype=np.float64 if dt is DType.F32 else np.int64).astype(
            dt.numpy
        )
        for k, dt in enumerate(dtypes)
    )


def _sized(program: Program, n: int) -> Program:
    """Return ``program`` with its output sized to ``n`` elements."""
    decls = [
        BufferDecl(d.name, d.binding, d.access, d.dtype, n) if d.access is Access.WRITE else d
        for d in program.buffers
    ]
    return Program(decls, program.workgroup_size, program.body, op_id=program.op_id)


def _const_rhs(op: BinOp, dtype: DType, constants: list[int]) -> OpCase:
    """``out[i * k + j] = op(in0[i], constants[j])``: the right operand a literal in the IR."""
    name = f"{op.value}.{dtype.value}.const-rhs"
    (values,) = _columns([dtype])
    k = len(constants)
    i = Var("i")
    stores = [
        Store("out", i * k + j, Bin(op, Load("in0", i), Const(dtype, c)))
        for j, c in enumerate(constants)
    ]
    program = Program(
        [
            BufferDecl("in0", 0, Access.READ, dtype),
            BufferDecl("out", 1, Access.WRITE, dtype, values.size * k),
        ],
        64,
        [Let("i", gid()), If(i.lt(BufLen("in0")), stores)],
        op_id=f"optable.{name}",
    )
    return OpCase(name, program, (values,))


def op_cases() -> list[OpCase]:
    """Return every operator x dtype, unary op x dtype, cast pair and Fma as a case.

    Then the ``*.const-rhs`` cases (see `CONST_RHS`).
    """
    out: list[OpCase] = []

    def add(name: str, operands: list[DType], result: DType, build: Any) -> None:
        inputs = _columns(operands)
        program = _sized(_program(name, operands, result, build), inputs[0].size)
        out.append(OpCase(name, program, inputs))

    for op in BinOp:
        for dt in DType:
            result = bin_result(op, dt)
            if result is not None:
                add(
                    f"{op.value}.{dt.value}", [dt, dt], result, lambda x, op=op: Bin(op, x[0], x[1])
                )
    for unary in UnOp:
        for dt in DType:
            result = un_result(unary, dt)
            if result is not None:
                add(f"{unary.value}.{dt.value}", [dt], result, lambda x, u=unary: Un(u, x[0]))
    for source in DType:
        for target in DType:
            if source is not target:
                add(
                    f"cast.{source.value}.{target.value}",
                    [source],
                    target,
                    lambda x, target=target: Cast(target, x[0]),
                )
    add("fma.f32", [DType.F32] * 3, DType.F32, lambda x: Fma(x[0], x[1], x[2]))
    out += [_const_rhs(binary, dt, values) for (binary, dt), values in CONST_RHS.items()]
    return out
