"""Span attributes for the dispatches issued in a context (arm scheduler, batches).

Code that dispatches on a user's behalf — the arm scheduler, a batch — knows
*why* a dispatch runs the way it does (its layer, the policy verdict) before the
backend is called, while the ``vyre.dispatch`` span may already have ended when
``dispatch()`` returns (a CPU backend can run tiny work inline). So the reasons
travel in a context variable: every dispatch issued inside
``with dispatch_attributes({...}):`` starts with those attributes, and they land
on its span when it ends, next to the ones the backend adds through
``DispatchCompleter.annotate``.

Context variables follow the task (asyncio and trio alike), so concurrent tasks
never see each other's attributes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

from vyre_async._exports import public_dir as _public_dir

__all__ = ["AttributeValue", "current_dispatch_attributes", "dispatch_attributes"]
__dir__ = _public_dir(__name__)

AttributeValue = str | bool | int | float

_current: ContextVar[Mapping[str, AttributeValue] | None] = ContextVar(
    "vyre_async_dispatch_attributes", default=None
)


@contextmanager
def dispatch_attributes(attributes: Mapping[str, AttributeValue]) -> Iterator[None]:
    """Add ``attributes`` to the span of every dispatch issued inside the block.

    Blocks nest: inner attributes are merged over outer ones.

    Args:
        attributes: ``vyre.*`` keys with str, bool, int or float values.

    Raises:
        ValueError: a key does not start with ``vyre.`` or a value has another type.
    """
    for key, value in attributes.items():
        if not isinstance(key, str) or not key.startswith("vyre."):
            raise ValueError(
                f"span attribute key {key!r} must start with 'vyre.'\n"
                "Fix: name driver attributes vyre.<area>.<name>"
            )
        if not isinstance(value, str | bool | int | float):
            raise ValueError(
                f"span attribute {key!r} has a {type(value).__name__} value\n"
                "Fix: pass a str, bool, int or float"
            )
    outer = _current.get()
    token = _current.set({**outer, **attributes} if outer else dict(attributes))
    try:
        yield
    finally:
        _current.reset(token)


def current_dispatch_attributes() -> Mapping[str, AttributeValue] | None:
    """Return the attributes set by the innermost `dispatch_attributes` block, or None."""
    return _current.get()
