"""Checks of numeric arguments: a bad value is `InvalidProgram` with a Fix, never a raw error.

Constructors and calls across the driver share these, so a count or a number
of seconds is refused the same way everywhere (``bool`` is not a number here,
and an int too large for a float is infinite, not an ``OverflowError``).
The policies package keeps its own checks, which raise the builtin errors its
pure functions document.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from vyre_async._exports import public_dir as _public_dir
from vyre_async.errors import InvalidProgram

__all__ = ["duration", "real_number", "to_seconds", "wait_seconds", "whole_number"]
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
        InvalidProgram: ``value`` is not an int (bools included) or out of range.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int | np.integer)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise InvalidProgram(
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
        InvalidProgram: ``timeout`` is neither a number of seconds nor None.
    """
    if timeout is None:
        return math.inf
    seconds = real_number(timeout)
    if math.isnan(seconds):
        raise InvalidProgram(
            f"a timeout must be a number of seconds or None, got {timeout!r}",
            fix=f"pass e.g. {example}",
        )
    return max(0.0, seconds)


def duration(name: str, value: object, *, example: str, positive: bool = False) -> float:
    """Return ``value`` as a finite number of seconds, ``>= 0`` (``> 0`` when ``positive``).

    Raises:
        InvalidProgram: ``value`` is not a number (bools and NaN included), is
            infinite, or is below the bound.
    """
    seconds = real_number(value)
    if not (math.isfinite(seconds) and (seconds > 0 if positive else seconds >= 0)):
        bound = "above 0" if positive else ">= 0"
        raise InvalidProgram(
            f"{name} must be a finite number of seconds {bound}, got {value!r}",
            fix=f"pass e.g. {example}",
        )
    return seconds
