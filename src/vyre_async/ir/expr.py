"""Expressions of the Program IR, their shorthands and operator sugar.

Every expression is an immutable, hashable, slotted dataclass. Python numbers
used where an expression is expected are lifted to constants: ``bool`` → BOOL,
``int`` → U32 (I32 when negative), ``float`` → F32. Use `i32`, `u32` or `f32`
to choose the type explicitly.

Operators build IR nodes: ``+ - * / % & | ^ << >>``, unary ``-`` and ``~``.
Comparisons are methods (``a.lt(b)``, ``a.eq(b)``) because ``==`` keeps its
structural meaning: two expressions are equal when they are the same tree.
"""

from __future__ import annotations

import math
import numbers
import struct
import sys
from dataclasses import dataclass
from typing import TypeAlias

from vyre_async._exports import public_dir as _public_dir
from vyre_async.errors import InvalidProgram
from vyre_async.ir.ops import AtomicOp, BinOp, BuiltinKind, UnOp
from vyre_async.ir.types import BufferDecl, DType, _enum

__all__ = [
    "Atomic",
    "Bin",
    "BufLen",
    "Builtin",
    "Cast",
    "Const",
    "Expr",
    "ExprLike",
    "Fma",
    "Load",
    "Select",
    "Un",
    "Var",
    "f32",
    "gid",
    "i32",
    "lid",
    "lift",
    "nwg",
    "u32",
    "wgid",
]
__dir__ = _public_dir(__name__)

_CANONICAL_NAN_BITS = 0x7FC0_0000


class Expr:
    """Base class of every expression node (operator sugar lives here)."""

    __slots__ = ()

    # Arithmetic and bitwise sugar -------------------------------------------------
    def __add__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.ADD, self, other)

    def __radd__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.ADD, other, self)

    def __sub__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.SUB, self, other)

    def __rsub__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.SUB, other, self)

    def __mul__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.MUL, self, other)

    def __rmul__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.MUL, other, self)

    def __truediv__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.DIV, self, other)

    def __rtruediv__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.DIV, other, self)

    def __floordiv__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.DIV, self, other)

    def __rfloordiv__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.DIV, other, self)

    def __mod__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.MOD, self, other)

    def __rmod__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.MOD, other, self)

    def __and__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.AND, self, other)

    def __rand__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.AND, other, self)

    def __or__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.OR, self, other)

    def __ror__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.OR, other, self)

    def __xor__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.XOR, self, other)

    def __rxor__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.XOR, other, self)

    def __lshift__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.SHL, self, other)

    def __rlshift__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.SHL, other, self)

    def __rshift__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.SHR, self, other)

    def __rrshift__(self, other: ExprLike) -> Bin:
        return Bin(BinOp.SHR, other, self)

    def __neg__(self) -> Un:
        return Un(UnOp.NEG, self)

    def __invert__(self) -> Un:
        return Un(UnOp.NOT, self)

    # Named sugar ------------------------------------------------------------------
    def eq(self, other: ExprLike) -> Bin:
        """Return ``self == other`` as a BOOL expression."""
        return Bin(BinOp.EQ, self, other)

    def ne(self, other: ExprLike) -> Bin:
        """Return ``self != other`` as a BOOL expression."""
        return Bin(BinOp.NE, self, other)

    def lt(self, other: ExprLike) -> Bin:
        """Return ``self < other`` as a BOOL expression."""
        return Bin(BinOp.LT, self, other)

    def le(self, other: ExprLike) -> Bin:
        """Return ``self <= other`` as a BOOL expression."""
        return Bin(BinOp.LE, self, other)

    def gt(self, other: ExprLike) -> Bin:
        """Return ``self > other`` as a BOOL expression."""
        return Bin(BinOp.GT, self, other)

    def ge(self, other: ExprLike) -> Bin:
        """Return ``self >= other`` as a BOOL expression."""
        return Bin(BinOp.GE, self, other)

    def min(self, other: ExprLike) -> Bin:
        """Return ``min(self, other)``."""
        return Bin(BinOp.MIN, self, other)

    def max(self, other: ExprLike) -> Bin:
        """Return ``max(self, other)``."""
        return Bin(BinOp.MAX, self, other)

    def land(self, other: ExprLike) -> Bin:
        """Return logical ``self and other`` on BOOL operands."""
        return Bin(BinOp.LAND, self, other)

    def lor(self, other: ExprLike) -> Bin:
        """Return logical ``self or other`` on BOOL operands."""
        return Bin(BinOp.LOR, self, other)

    def cast(self, dtype: DType | str) -> Cast:
        """Return this value converted to ``dtype``."""
        return Cast(dtype, self)


ExprLike: TypeAlias = "Expr | int | float | bool"


def lift(value: ExprLike) -> Expr:
    """Return ``value`` as an expression, lifting Python numbers to `Const`.

    Raises:
        InvalidProgram: ``value`` is neither an expression nor a number.
    """
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        return Const(DType.BOOL, value)
    if isinstance(value, int):
        return Const(DType.I32 if value < 0 else DType.U32, value)
    if isinstance(value, float):
        return Const(DType.F32, value)
    raise InvalidProgram(
        f"expected an expression or a number, got {type(value).__name__}: {value!r}",
        fix="build the value with u32(...), i32(...), f32(...), Var(...) or Load(...)",
    )


def _buffer_name(buffer: object) -> str:
    if isinstance(buffer, BufferDecl):
        return buffer.name
    if isinstance(buffer, str):
        return buffer
    raise InvalidProgram(
        f"a buffer is referenced by its name (str) or BufferDecl, got {buffer!r}",
        fix="pass the buffer's name",
    )


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


def f32_bits(value: float) -> int:
    """Return the binary32 bit pattern of ``value`` (rounded to nearest even; NaN canonical)."""
    if math.isnan(value):
        return _CANONICAL_NAN_BITS
    try:
        return int(struct.unpack("<I", struct.pack("<f", value))[0])
    except OverflowError:
        return 0x7F80_0000 if value > 0 else 0xFF80_0000


def f32_from_bits(bits: int) -> float:
    """Return the Python float holding the binary32 value with bit pattern ``bits``."""
    return float(struct.unpack("<f", struct.pack("<I", bits & 0xFFFF_FFFF))[0])


@dataclass(frozen=True, slots=True, eq=False, init=False)
class Const(Expr):
    """A literal. F32 values are rounded to binary32 on construction; NaN is canonical.

    Two constants are equal when they have the same dtype and bit pattern, so
    ``-0.0`` and ``+0.0`` differ and every NaN equals every other NaN.
    """

    dtype: DType
    value: int | float | bool

    def __init__(self, dtype: DType | str, value: int | float | bool) -> None:
        dtype = _enum(DType, dtype, "constant dtype")
        _set(self, "dtype", dtype)
        if dtype is DType.F32:
            # Any real number but a bool (ints, floats, numpy scalars, fractions); never
            # a string: one rule for f32(...) and Const(DType.F32, ...), as for u32/i32.
            given: object = value  # (typed loosely: callers pass numpy scalars and worse)
            if type(given).__module__ == "numpy" and getattr(given, "ndim", None) == 0:
                given = given.item()  # type: ignore[attr-defined]  # a 0-d array: its number
            # A Decimal exists only once its module is loaded: looked up, not imported
            # (importing decimal would add 2 ms to `import vyre_async`).
            decimal = sys.modules.get("decimal")
            if decimal is not None and isinstance(given, decimal.Decimal) and given.is_finite():
                given = float(given)
            if isinstance(given, bool) or not isinstance(given, numbers.Real):
                raise InvalidProgram(
                    f"f32 constant needs a real number, got {value!r}",
                    fix="pass a float or an int, e.g. f32(1.5)",
                )
            try:
                as_float = float(given)
            except OverflowError:
                shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:37]}..."
                raise InvalidProgram(
                    f"f32 constant {shown} is beyond the range of any float",
                    fix="pass a value within ±3.4e38, or float('inf') for infinity",
                ) from None
            _set(self, "value", f32_from_bits(f32_bits(as_float)))
        elif dtype is DType.BOOL:
            # True/False (a numpy bool too) or the ints 0/1; never a float or an array.
            flag: object = value
            numpy_bool = type(flag).__module__ == "numpy" and type(flag).__name__ in (
                "bool",
                "bool_",
            )
            if not (isinstance(flag, numbers.Integral) or numpy_bool) or flag not in (0, 1):
                raise InvalidProgram(
                    f"bool constant needs True/False, got {value!r}", fix="pass True or False"
                )
            _set(self, "value", bool(flag))
        else:
            lo, hi = (0, 0xFFFF_FFFF) if dtype is DType.U32 else (-(2**31), 2**31 - 1)
            # An int or a numpy integer (numbers.Integral), never a bool, in range.
            whole: object = value
            if (
                isinstance(whole, bool)
                or not isinstance(whole, numbers.Integral)  # (a numpy bool is not one)
                or not lo <= int(whole) <= hi
            ):
                raise InvalidProgram(
                    f"{dtype.value} constant needs an integer in {lo}..{hi}, got {value!r}",
                    fix=f"pass an integer that fits {dtype.value}"
                    + (" (use i32(...) for negative values)" if dtype is DType.U32 else ""),
                )
            _set(self, "value", int(value))

    @property
    def bits(self) -> int:
        """The 32-bit word this constant stores (two's complement, binary32, 0/1)."""
        if self.dtype is DType.F32:
            return f32_bits(float(self.value))
        return int(self.value) & 0xFFFF_FFFF

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Const):
            return NotImplemented
        return self.dtype is other.dtype and self.bits == other.bits

    def __hash__(self) -> int:
        return hash((Const, self.dtype, self.bits))

    def __repr__(self) -> str:
        if self.dtype is DType.F32:
            v = float(self.value)
            text = repr(v) if math.isfinite(v) else f"float({str(v)!r})"
            return f"f32({text})"
        if self.dtype is DType.BOOL:
            return f"Const(DType.BOOL, {self.value})"
        return f"{self.dtype.value}({self.value})"


@dataclass(frozen=True, slots=True, init=False)
class Var(Expr):
    """The current value of a variable introduced by `Let` or `Loop`."""

    name: str

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidProgram(
                f"variable name must be a non-empty str, got {name!r}",
                fix="name variables with non-empty strings",
            )
        _set(self, "name", name)

    def __repr__(self) -> str:
        return f"Var({self.name!r})"


@dataclass(frozen=True, slots=True, init=False)
class Load(Expr):
    """Element ``index`` (U32) of ``buffer``; an out-of-bounds load yields 0."""

    buffer: str
    index: Expr

    def __init__(self, buffer: str | BufferDecl, index: ExprLike) -> None:
        _set(self, "buffer", _buffer_name(buffer))
        _set(self, "index", lift(index))

    def __repr__(self) -> str:
        return f"Load({self.buffer!r}, {self.index!r})"


@dataclass(frozen=True, slots=True, init=False)
class BufLen(Expr):
    """Element count of ``buffer`` (U32; the dispatch-time count for runtime-sized buffers)."""

    buffer: str

    def __init__(self, buffer: str | BufferDecl) -> None:
        _set(self, "buffer", _buffer_name(buffer))

    def __repr__(self) -> str:
        return f"BufLen({self.buffer!r})"


@dataclass(frozen=True, slots=True, init=False)
class Builtin(Expr):
    """A launch-geometry value (U32) on ``axis`` 0, 1 or 2: see `BuiltinKind`."""

    kind: BuiltinKind
    axis: int = 0

    def __init__(self, kind: BuiltinKind | str, axis: int = 0) -> None:
        _set(self, "kind", _enum(BuiltinKind, kind, "builtin kind"))
        if isinstance(axis, bool) or axis not in (0, 1, 2):
            raise InvalidProgram(
                f"builtin axis must be 0, 1 or 2, got {axis!r}", fix="use axis 0, 1 or 2"
            )
        _set(self, "axis", int(axis))

    def __repr__(self) -> str:
        return f"{self.kind.value}({self.axis})"


@dataclass(frozen=True, slots=True, init=False)
class Bin(Expr):
    """Binary operation ``op(a, b)``; both operands have the same dtype."""

    op: BinOp
    a: Expr
    b: Expr

    def __init__(self, op: BinOp | str, a: ExprLike, b: ExprLike) -> None:
        _set(self, "op", _enum(BinOp, op, "binary operator"))
        _set(self, "a", lift(a))
        _set(self, "b", lift(b))

    def __repr__(self) -> str:
        return f"Bin({self.op.value!r}, {self.a!r}, {self.b!r})"


@dataclass(frozen=True, slots=True, init=False)
class Un(Expr):
    """Unary operation ``op(a)``."""

    op: UnOp
    a: Expr

    def __init__(self, op: UnOp | str, a: ExprLike) -> None:
        _set(self, "op", _enum(UnOp, op, "unary operator"))
        _set(self, "a", lift(a))

    def __repr__(self) -> str:
        return f"Un({self.op.value!r}, {self.a!r})"


@dataclass(frozen=True, slots=True, init=False)
class Select(Expr):
    """``if_true`` where ``cond`` (BOOL or U32, non-zero = true) holds, else ``if_false``.

    Both arms are evaluated (every operation is total).
    """

    cond: Expr
    if_true: Expr
    if_false: Expr

    def __init__(self, cond: ExprLike, if_true: ExprLike, if_false: ExprLike) -> None:
        _set(self, "cond", lift(cond))
        _set(self, "if_true", lift(if_true))
        _set(self, "if_false", lift(if_false))

    def __repr__(self) -> str:
        return f"Select({self.cond!r}, {self.if_true!r}, {self.if_false!r})"


@dataclass(frozen=True, slots=True, init=False)
class Cast(Expr):
    """``value`` converted to ``dtype`` (see the cast rules of the IR specification)."""

    dtype: DType
    value: Expr

    def __init__(self, dtype: DType | str, value: ExprLike) -> None:
        _set(self, "dtype", _enum(DType, dtype, "cast target dtype"))
        _set(self, "value", lift(value))

    def __repr__(self) -> str:
        return f"Cast(DType.{self.dtype.name}, {self.value!r})"


@dataclass(frozen=True, slots=True, init=False)
class Fma(Expr):
    """Fused multiply-add ``a * b + c`` on F32 with a single rounding."""

    a: Expr
    b: Expr
    c: Expr

    def __init__(self, a: ExprLike, b: ExprLike, c: ExprLike) -> None:
        _set(self, "a", lift(a))
        _set(self, "b", lift(b))
        _set(self, "c", lift(c))

    def __repr__(self) -> str:
        return f"Fma({self.a!r}, {self.b!r}, {self.c!r})"


@dataclass(frozen=True, slots=True, init=False)
class Atomic(Expr):
    """Atomic ``op`` on ``buffer[index]`` with ``value``; evaluates to the old word (U32).

    ``expected`` is required for ``cas`` (store ``value`` only if the old word
    equals ``expected``) and forbidden otherwise.
    """

    op: AtomicOp
    buffer: str
    index: Expr
    value: Expr
    expected: Expr | None = None

    def __init__(
        self,
        op: AtomicOp | str,
        buffer: str | BufferDecl,
        index: ExprLike,
        value: ExprLike,
        expected: ExprLike | None = None,
    ) -> None:
        _set(self, "op", _enum(AtomicOp, op, "atomic operator"))
        _set(self, "buffer", _buffer_name(buffer))
        _set(self, "index", lift(index))
        _set(self, "value", lift(value))
        _set(self, "expected", None if expected is None else lift(expected))

    def __repr__(self) -> str:
        tail = "" if self.expected is None else f", expected={self.expected!r}"
        return f"Atomic({self.op.value!r}, {self.buffer!r}, {self.index!r}, {self.value!r}{tail})"


# Shorthands ----------------------------------------------------------------------


def u32(value: int) -> Const:
    """Return a U32 constant (0 ≤ value < 2**32)."""
    return Const(DType.U32, value)


def i32(value: int) -> Const:
    """Return an I32 constant (-2**31 ≤ value < 2**31)."""
    return Const(DType.I32, value)


def f32(value: float) -> Const:
    """Return an F32 constant (rounded to binary32, nearest even) of a real number.

    Raises:
        InvalidProgram: ``value`` is not a real number (a string, None, a bool) or
            is beyond the range of a float.
    """
    return Const(DType.F32, value)


def gid(axis: int = 0) -> Builtin:
    """Return the global invocation id on ``axis``."""
    return Builtin(BuiltinKind.GID, axis)


def lid(axis: int = 0) -> Builtin:
    """Return the local invocation id within the workgroup on ``axis``."""
    return Builtin(BuiltinKind.LID, axis)


def wgid(axis: int = 0) -> Builtin:
    """Return the workgroup id on ``axis``."""
    return Builtin(BuiltinKind.WGID, axis)


def nwg(axis: int = 0) -> Builtin:
    """Return the number of workgroups in the grid on ``axis``."""
    return Builtin(BuiltinKind.NWG, axis)
