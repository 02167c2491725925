"""Cancellation of a running launch."""

from __future__ import annotations

from vyre_async.abc import public_dir as _public_dir

__all__ = ["Cancelled"]
__dir__ = _public_dir(__name__)


class Cancelled(Exception):
    """The cancel event of a dispatch was set; the engine stopped at a safe point.

    The engine checks the event before every statement, every loop iteration
    and every round of a colliding compare-and-swap. The driver maps this to
    `DispatchTimeout`.
    """
