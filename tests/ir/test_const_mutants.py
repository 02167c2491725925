"""Constants from every kind of number a frontend passes (triage of surviving mutants, issue 28).

`Const` (and `u32`/`i32`/`f32`) take Python and numpy numbers, 0-d arrays,
fractions and decimals, and refuse the rest with a message that shows the
value and a Fix. These tests pin which values are taken, what they become,
and each refusal's exact text, at the edges of each dtype's range.
"""

from __future__ import annotations

import decimal
import fractions
import numbers
from typing import Any

import numpy as np
import pytest

from vyre_async.errors import InvalidProgram
from vyre_async.ir import Const, DType

F32_FIX = "Fix: pass a float or an int, e.g. f32(1.5)"
BOOL_FIX = "Fix: pass True or False"
I32_FIX = "Fix: pass an integer that fits i32"
U32_RANGE = "0..4294967295"
U32_FIX = "Fix: pass an integer that fits u32 (use i32(...) for negative values)"
DTYPE_FIX = "Fix: use one of 'u32', 'i32', 'f32', 'bool'"
I32_RANGE = "-2147483648..2147483647"


@pytest.mark.parametrize(
    ("dtype", "value", "stored"),
    [
        ("f32", np.array(1.5, dtype=np.float32), 1.5),  # a 0-d array: its number
        ("f32", np.array(2, dtype=np.int64), 2.0),
        ("f32", np.float32(2.5), 2.5),
        ("f32", decimal.Decimal("0.5"), 0.5),
        ("f32", decimal.Decimal("0.1"), 0.10000000149011612),  # rounded to binary32
        ("f32", fractions.Fraction(1, 4), 0.25),
        ("f32", 10**30, 1.0000000150474662e30),
        ("f32", 10**39, float("inf")),  # beyond binary32 (but not float64): rounds to inf
        ("bool", np.bool_(True), True),
        ("bool", np.bool_(False), False),
        ("bool", 1, True),
        ("bool", 0, False),
        ("i32", -(2**31), -(2**31)),
        ("i32", 2**31 - 1, 2**31 - 1),
        ("u32", 2**32 - 1, 2**32 - 1),
        ("u32", np.uint8(3), 3),
    ],
    ids=repr,
)
def test_accepted_values_and_what_they_become(dtype: str, value: Any, stored: object) -> None:
    const = Const(dtype, value)
    assert const.value == stored
    assert type(const.value) is type(stored)


@pytest.mark.parametrize(
    ("dtype", "value", "message"),
    [
        ("f32", True, f"f32 constant needs a real number, got True\n{F32_FIX}"),
        ("f32", "1", f"f32 constant needs a real number, got '1'\n{F32_FIX}"),
        ("f32", np.array([1.0]), f"f32 constant needs a real number, got array([1.])\n{F32_FIX}"),
        (
            "f32",
            10**400,
            "f32 constant 1000000000000000000000000000000000000... is beyond the range of any "
            "float\nFix: pass a value within ±3.4e38, or float('inf') for infinity",
        ),
        ("bool", 2, f"bool constant needs True/False, got 2\n{BOOL_FIX}"),
        ("bool", 1.0, f"bool constant needs True/False, got 1.0\n{BOOL_FIX}"),
        (
            "bool",
            np.float64(1.0),
            f"bool constant needs True/False, got {np.float64(1.0)!r}\n{BOOL_FIX}",
        ),
        (
            "bool",
            np.array([True]),
            f"bool constant needs True/False, got array([ True])\n{BOOL_FIX}",
        ),
        ("u32", -1, f"u32 constant needs an integer in {U32_RANGE}, got -1\n{U32_FIX}"),
        ("u32", 2**32, f"u32 constant needs an integer in {U32_RANGE}, got 4294967296\n{U32_FIX}"),
        ("u32", True, f"u32 constant needs an integer in {U32_RANGE}, got True\n{U32_FIX}"),
        ("u32", 1.0, f"u32 constant needs an integer in {U32_RANGE}, got 1.0\n{U32_FIX}"),
        (
            "i32",
            -(2**31) - 1,
            f"i32 constant needs an integer in {I32_RANGE}, got -2147483649\n{I32_FIX}",
        ),
        ("i32", 2**31, f"i32 constant needs an integer in {I32_RANGE}, got 2147483648\n{I32_FIX}"),
        ("nope", 1, f"constant dtype 'nope' is not a DType\n{DTYPE_FIX}"),
    ],
    ids=lambda v: repr(v)[:30],
)
def test_refused_values_and_their_messages(dtype: str, value: Any, message: str) -> None:
    with pytest.raises(InvalidProgram) as info:
        Const(dtype, value)
    assert str(info.value) == message
    if type(value) is int and value == 10**400:  # float()'s OverflowError is not shown
        assert info.value.__suppress_context__


def test_bool_dtype_objects_and_names_are_the_same() -> None:
    assert Const(DType.BOOL, True) == Const("bool", 1)
    half: Any = np.float32(0.5)
    assert Const(DType.F32, half).bits == 0x3F00_0000


class _Overflowing:
    """A user's number type whose float() overflows (numbers.Real, registered)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __float__(self) -> float:
        raise OverflowError("too large")

    def __repr__(self) -> str:
        return self.text


numbers.Real.register(_Overflowing)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("H" * 40, "H" * 40),  # 40 characters: shown whole
        ("H" * 41, "H" * 37 + "..."),  # 41: cut to 37 and an ellipsis
        ("Big()", "Big()"),
    ],
)
def test_a_number_beyond_any_float_is_shown_whole_up_to_40_characters(
    text: str, shown: str
) -> None:
    value: Any = _Overflowing(text)
    with pytest.raises(InvalidProgram) as info:
        Const("f32", value)
    assert str(info.value).startswith(f"f32 constant {shown} is beyond the range of any float\n")


def test_a_numpy_object_that_is_not_a_number_is_refused_as_such() -> None:
    value: Any = np.add  # a numpy object without ndim
    with pytest.raises(InvalidProgram, match="f32 constant needs a real number, got <ufunc 'add'>"):
        Const("f32", value)


class _Numpy1Bool:
    """numpy 1.x's bool scalar, by its type's name and module (numpy 2 names it ``bool``)."""

    def __init__(self, flag: bool) -> None:
        self.flag = flag

    def __eq__(self, other: object) -> bool:
        return self.flag == other

    def __hash__(self) -> int:
        return hash(self.flag)

    def __bool__(self) -> bool:
        return self.flag


_Numpy1Bool.__name__ = "bool_"
_Numpy1Bool.__module__ = "numpy"


def test_numpy_1s_bool_scalar_is_a_bool() -> None:
    value: Any = _Numpy1Bool(True)
    assert Const("bool", value).value is True
