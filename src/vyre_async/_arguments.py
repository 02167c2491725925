"""Checks of arguments: a bad value is `InvalidArgument` with a Fix, never a raw error.

Constructors and calls across the driver share these, so a count, a number of
seconds or a dtype name is refused the same way everywhere (``bool`` is not a
number here, and an int too large for a float is infinite, not an
``OverflowError``).
The policies package keeps its own checks, which raise the builtin errors its
pure functions document.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from vyre_async._exports import public_dir as _public_dir
from vyre_async.errors import InvalidArgument, InvalidProgram
from vyre_async.ir.types import DType, as_dtype

__all__ = [
    "dtype_argument",
    "duration",
    "real_number",
    "to_seconds",
    "wait_seconds",
    "whole_number",
]
__dir__ = _public_dir(__name__)


def whole_number(
    name: str, value: object, *, example: str, minimum: int = 0, maximum: int | None = None
) -> int:
    """Return ``value`` as an int in ``minimum..maximum``.

    Args:
        name: How the message names the argument (``"max_workers"``).
        value: What the caller passed.
        example: A valid call or value for the Fix (``"max_workers=2"``).
        minimum: Smallest value accepted.
        maximum: Largest value accepted, or None for no limit.

    Raises:
        InvalidArgument: ``value`` is not an int (bools included) or out of range.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int | np.integer)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise InvalidArgument(
            f"{name} must be an int {bound}, got {value!r}", fix=f"pass e.g. {example}"
        )
    return int(value)


def to_seconds(value: numbers.Real | int | float) -> float:
    """Return a number of seconds as a float; a number too large for a float is ``±inf``."""
    try:
        return float(value)
    except OverflowError:  # e.g. 10**400
        return math.inf if value > 0 else -math.inf  # type: ignore[operator]


def real_number(value: object) -> float:
    """Return ``value`` as a float if it is a real number, else NaN.

    Any real number but a bool: ints of any size (beyond a float: ``±inf``),
    numpy scalars, fractions. The one rule for seconds, rates and precedences.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return math.nan
    return to_seconds(value)


def wait_seconds(timeout: object, *, example: str) -> float:
    """Return a wait's ``timeout`` as seconds: ``inf`` for None, any size, at least 0.

    Raises:
        InvalidArgument: ``timeout`` is neither a number of seconds nor None.
    """
    if timeout is None:
        return math.inf
    seconds = real_number(timeout)
    if math.isnan(seconds):
        raise InvalidArgument(
            f"a timeout must be a number of seconds or None, got {timeout!r}",
            fix=f"pass e.g. {example}",
        )
    return max(0.0, seconds)


def duration(name: str, value: object, *, example: str, positive: bool = False) -> float:
    """Return ``value`` as a finite number of seconds, ``>= 0`` (``> 0`` when ``positive``).

    Raises:
        InvalidArgument: ``value`` is not a number (bools and NaN included), is
            infinite, or is below the bound.
    """
    seconds = real_number(value)
    if not (math.isfinite(seconds) and (seconds > 0 if positive else seconds >= 0)):
        bound = "above 0" if positive else ">= 0"
        raise InvalidArgument(
            f"{name} must be a finite number of seconds {bound}, got {value!r}",
            fix=f"pass e.g. {example}",
        )
    return seconds


def dtype_argument(name: str, value: object) -> DType:
    """Return ``value`` (a `DType` or its name, ``"u32"``) as a `DType`.

    `as_dtype` for an argument (``alloc``'s dtype, a graph resource's), not a
    program's buffer: a name that is no dtype is the caller's argument error.

    Raises:
        InvalidArgument: ``value`` names no dtype; the message lists the choices.
    """
    try:
        return as_dtype(value, name)
    except InvalidProgram as exc:
        raise InvalidArgument(exc.message) from None
