"""Input validation shared by the policy functions: exact, non-negative integers."""

from __future__ import annotations

import operator

__all__ = ["non_negative_int"]


def non_negative_int(name: str, value: object) -> int:
    """Return ``value`` as a Python int after checking it is a non-negative integer.

    Policies compute in exact integer nanoseconds and bytes, so floats are refused
    rather than silently truncated; numpy integers are accepted.

    Args:
        name: The parameter name, for the error message.
        value: The value to check.

    Returns:
        The value as a plain ``int``.

    Raises:
        TypeError: ``value`` is not an integer (bools and floats included).
        ValueError: ``value`` is negative.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got the bool {value!r}\nFix: pass an int")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{name} must be an integer, got {type(value).__name__} {value!r}\n"
            f"Fix: pass whole nanoseconds/bytes as an int, e.g. round({name})"
        ) from None
    if number < 0:
        raise ValueError(f"{name} must be >= 0, got {number}\nFix: pass a non-negative {name}")
    return int(number)
