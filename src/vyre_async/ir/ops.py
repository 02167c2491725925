"""Operator enums of the Program IR and their typing rules.

Operators are string enums, so ``"add"`` and ``BinOp.ADD`` are interchangeable.
The typing tables here are the single source of truth used by the validator,
the reference engine and code generators.
"""

from __future__ import annotations

from enum import StrEnum

from vyre_async._exports import public_dir as _public_dir
from vyre_async.ir.types import DType

__all__ = [
    "CORE_OPS",
    "FLOAT_UNARY",
    "GRID_BARRIER_OP",
    "TRANSCENDENTAL",
    "AtomicOp",
    "BinOp",
    "BuiltinKind",
    "UnOp",
    "bin_operand_types",
    "bin_result",
    "un_operand_types",
    "un_result",
]
__dir__ = _public_dir(__name__)


class BinOp(StrEnum):
    """Binary operators. Operands always share one dtype (no implicit promotion)."""

    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MOD = "mod"
    MIN = "min"
    MAX = "max"
    AND = "and"
    OR = "or"
    XOR = "xor"
    SHL = "shl"
    SHR = "shr"
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    LAND = "land"
    LOR = "lor"
    MULHI = "mulhi"

    def __repr__(self) -> str:
        return repr(self.value)


class UnOp(StrEnum):
    """Unary operators."""

    NEG = "neg"
    NOT = "not"
    LNOT = "lnot"
    POPCOUNT = "popcount"
    CLZ = "clz"
    CTZ = "ctz"
    ABS = "abs"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    EXP = "exp"
    LOG = "log"
    SIN = "sin"
    COS = "cos"
    TANH = "tanh"
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"
    TRUNC = "trunc"

    def __repr__(self) -> str:
        return repr(self.value)


class AtomicOp(StrEnum):
    """Atomic read-modify-write operators on U32 words; each returns the old value."""

    ADD = "add"
    OR = "or"
    AND = "and"
    XOR = "xor"
    MIN = "min"
    MAX = "max"
    EXCHANGE = "exchange"
    CAS = "cas"

    def __repr__(self) -> str:
        return repr(self.value)


class BuiltinKind(StrEnum):
    """Launch-geometry builtins: global id, local id, workgroup id, number of workgroups."""

    GID = "gid"
    LID = "lid"
    WGID = "wgid"
    NWG = "nwg"

    def __repr__(self) -> str:
        return repr(self.value)


_INT = frozenset({DType.U32, DType.I32})
_NUM = frozenset({DType.U32, DType.I32, DType.F32})
_F32 = frozenset({DType.F32})
_BOOL = frozenset({DType.BOOL})

#: Transcendental ops: backends may differ by at most ``ulp_budget`` ULP on these.
TRANSCENDENTAL = frozenset({UnOp.EXP, UnOp.LOG, UnOp.SIN, UnOp.COS, UnOp.TANH, UnOp.RSQRT})
#: Unary ops defined on F32 only.
FLOAT_UNARY = frozenset(
    {
        UnOp.ABS,
        UnOp.SQRT,
        UnOp.RSQRT,
        UnOp.EXP,
        UnOp.LOG,
        UnOp.SIN,
        UnOp.COS,
        UnOp.TANH,
        UnOp.FLOOR,
        UnOp.CEIL,
        UnOp.ROUND,
        UnOp.TRUNC,
    }
)

# op -> (accepted operand dtypes, result dtype or None for "same as operand")
_BIN_RULES: dict[BinOp, tuple[frozenset[DType], DType | None]] = {
    BinOp.ADD: (_NUM, None),
    BinOp.SUB: (_NUM, None),
    BinOp.MUL: (_NUM, None),
    BinOp.DIV: (_NUM, None),
    BinOp.MOD: (_NUM, None),
    BinOp.MIN: (_NUM, None),
    BinOp.MAX: (_NUM, None),
    BinOp.AND: (_INT, None),
    BinOp.OR: (_INT, None),
    BinOp.XOR: (_INT, None),
    BinOp.SHL: (_INT, None),
    BinOp.SHR: (_INT, None),
    BinOp.EQ: (_NUM | _BOOL, DType.BOOL),
    BinOp.NE: (_NUM | _BOOL, DType.BOOL),
    BinOp.LT: (_NUM, DType.BOOL),
    BinOp.LE: (_NUM, DType.BOOL),
    BinOp.GT: (_NUM, DType.BOOL),
    BinOp.GE: (_NUM, DType.BOOL),
    BinOp.LAND: (_BOOL, DType.BOOL),
    BinOp.LOR: (_BOOL, DType.BOOL),
    BinOp.MULHI: (frozenset({DType.U32}), None),
}

_UN_RULES: dict[UnOp, tuple[frozenset[DType], DType | None]] = {
    UnOp.NEG: (_NUM, None),
    UnOp.NOT: (_INT, None),
    UnOp.LNOT: (_BOOL, DType.BOOL),
    UnOp.POPCOUNT: (_INT, None),
    UnOp.CLZ: (_INT, None),
    UnOp.CTZ: (_INT, None),
    **dict.fromkeys(FLOAT_UNARY, (_F32, None)),
}


def bin_operand_types(op: BinOp) -> frozenset[DType]:
    """Return the operand dtypes `op` accepts."""
    return _BIN_RULES[BinOp(op)][0]


def un_operand_types(op: UnOp) -> frozenset[DType]:
    """Return the operand dtypes `op` accepts."""
    return _UN_RULES[UnOp(op)][0]


def bin_result(op: BinOp | str, dtype: DType) -> DType | None:
    """Return the result dtype of ``op`` on two operands of ``dtype``, or None if undefined."""
    accepted, result = _BIN_RULES[BinOp(op)]
    if dtype not in accepted:
        return None
    return dtype if result is None else result


def un_result(op: UnOp | str, dtype: DType) -> DType | None:
    """Return the result dtype of ``op`` on an operand of ``dtype``, or None if undefined."""
    accepted, result = _UN_RULES[UnOp(op)]
    if dtype not in accepted:
        return None
    return dtype if result is None else result


#: The `CORE_OPS` name of the `GridBarrier` statement.
GRID_BARRIER_OP = "stmt.grid_barrier"

#: Every operation of the core IR, as ``"bin.<op>"``, ``"un.<op>"`` and ``"atomic.<op>"``,
#: and the grid-wide barrier as ``"stmt.grid_barrier"`` (`vyre_async.ir.walk.ops_used`
#: names a program's operations the same way). An executor claims the grid barrier
#: explicitly: `vyre_async.abc.Executor.supported_ops` leaves it out by default.
CORE_OPS: frozenset[str] = frozenset(
    [f"bin.{op.value}" for op in BinOp]
    + [f"un.{op.value}" for op in UnOp]
    + [f"atomic.{op.value}" for op in AtomicOp]
    + [GRID_BARRIER_OP]
)
