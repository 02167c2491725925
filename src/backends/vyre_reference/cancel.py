"""Cancellation of a running launch."""

from __future__ import annotations

__all__ = ["Cancelled"]


class Cancelled(Exception):
    """The cancel event of a dispatch was set; the engine stopped at a safe point.

    The engine checks the event before every statement, every loop iteration
    and every round of a colliding compare-and-swap. The driver maps this to
    `DispatchTimeout`.
    """
