"""Shape prediction: guess the next dispatch's shape from the recent history.

A *shape fingerprint* is any hashable value identifying what a dispatch needs
compiled and how it launches (the driver uses the pipeline cache identity plus
the launch geometry). `ShapeHistory` keeps the last few and predicts the next
by repetition or by the shortest cycle consistent with the window, partial
cycles included. `RollingHitRate` scores predictions over a sliding window.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

from vyre_async._exports import public_dir as _public_dir

__all__ = [
    "HIT_RATE_WINDOW",
    "SHAPE_HISTORY_CAPACITY",
    "RollingHitRate",
    "ShapeHistory",
]
__dir__ = _public_dir(__name__)

#: Fingerprints a `ShapeHistory` keeps by default.
SHAPE_HISTORY_CAPACITY = 16
#: Outcomes a `RollingHitRate` keeps by default.
HIT_RATE_WINDOW = 64

F = TypeVar("F", bound=Hashable)


def _capacity(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}\nFix: pass e.g. {name}=16")
    return value


class ShapeHistory(Generic[F]):
    """The last ``capacity`` shape fingerprints and the payloads needed to compile them.

    Not thread-safe: callers serialise access (the driver's prefetcher holds a lock).

    Args:
        capacity: Fingerprints kept; the oldest is dropped beyond it (default 16).

    Raises:
        ValueError: ``capacity`` is not an int >= 1.
    """

    __slots__ = ("_payloads", "_ring", "capacity")

    def __init__(self, capacity: int = SHAPE_HISTORY_CAPACITY) -> None:
        self.capacity = _capacity("capacity", capacity)
        self._ring: deque[F] = deque(maxlen=self.capacity)
        self._payloads: dict[F, Any] = {}

    def record(self, fp: F, payload: Any = None) -> None:
        """Append ``fp``, dropping the oldest entry when full.

        Args:
            fp: The fingerprint of the dispatch just enqueued.
            payload: What is needed to compile this shape (the driver stores the
                program and config). ``None`` keeps a payload recorded earlier.
                Payloads are kept only while their fingerprint is in the window:
                one that left it and comes back without a payload has none.
        """
        ring = self._ring
        if payload is None:
            if fp not in ring:  # back after leaving the window: its old payload left with it
                self._payloads.pop(fp, None)
            ring.append(fp)
            return
        ring.append(fp)
        payloads = self._payloads
        payloads[fp] = payload
        if len(payloads) > 2 * self.capacity:  # bound the memory of payloads out of the window
            kept = set(ring)
            self._payloads = {k: v for k, v in payloads.items() if k in kept}

    def push(self, fp: F, payload: Any = None) -> F | None:
        """`record` ``fp`` and return `predict_next` in one call (the driver's hot path).

        Equivalent to ``record(fp, payload); return predict_next()``, with a short
        cut for a repeat of the latest entry.
        """
        ring = self._ring
        # A repeat of the latest predicts itself, except at capacity 1 (one entry: no pattern).
        repeat = bool(ring) and ring[-1] == fp and self.capacity > 1
        if payload is None and repeat:
            ring.append(fp)
            return fp
        self.record(fp, payload)
        return fp if repeat else self.predict_next()

    def repeat(self, fp: F, times: int) -> None:
        """Append ``fp`` ``times`` times (as many `push` calls of a repeat of the latest).

        Keeps any payload recorded with ``fp``; at most ``capacity`` appends matter.
        """
        self._ring.extend(itertools.repeat(fp, min(times, self.capacity)))

    def predict_next(self) -> F | None:
        """Return the predicted next fingerprint, or None without a pattern.

        With ``n`` entries ``h[0..n)``: fewer than 2 → None; the last two equal →
        the last again; else the smallest cycle length ``c`` in ``2..n-1`` with
        ``h[i] == h[i-c]`` for every ``i`` in ``[c, n)`` predicts ``h[n-c]``
        (partial cycles count: A,B,C,A,B → C); otherwise None.
        """
        ring = self._ring
        n = len(ring)
        if n < 2:
            return None
        last = ring[-1]
        if last == ring[-2]:
            return last
        h = list(ring)
        for c in range(2, n):
            if h[c:] == h[: n - c]:
                return h[n - c]
        return None

    def latest(self) -> F | None:
        """Return the most recent fingerprint, or None when empty."""
        return self._ring[-1] if self._ring else None

    def payload_for(self, fp: F) -> Any:
        """Return the payload recorded with ``fp`` while it is in the window, else None."""
        payload = self._payloads.get(fp)
        return payload if payload is not None and fp in self._ring else None

    @property
    def entries(self) -> tuple[F, ...]:
        """The retained fingerprints, oldest first."""
        return tuple(self._ring)

    def clear(self) -> None:
        """Forget every entry and payload."""
        self._ring.clear()
        self._payloads.clear()

    def __len__(self) -> int:
        return len(self._ring)

    def __contains__(self, fp: object) -> bool:
        return fp in self._ring

    def __repr__(self) -> str:
        return f"<ShapeHistory {len(self._ring)}/{self.capacity}>"


class RollingHitRate:
    """The hit rate of the last ``window`` predictions.

    Not thread-safe: callers serialise access.

    Args:
        window: Outcomes kept (default 64).

    Raises:
        ValueError: ``window`` is not an int >= 1.
    """

    __slots__ = ("_hits", "_outcomes", "window")

    def __init__(self, window: int = HIT_RATE_WINDOW) -> None:
        self.window = _capacity("window", window)
        self._outcomes: deque[bool] = deque(maxlen=self.window)
        self._hits = 0

    def record(self, hit: bool) -> float:
        """Add one outcome, forgetting the oldest beyond the window; return the new rate."""
        outcomes = self._outcomes
        if len(outcomes) == self.window and outcomes[0]:
            self._hits -= 1
        hit = bool(hit)
        outcomes.append(hit)
        if hit:
            self._hits += 1
        return self._hits / len(outcomes)

    @property
    def hits(self) -> int:
        """Hits in the window."""
        return self._hits

    @property
    def total(self) -> int:
        """Outcomes in the window."""
        return len(self._outcomes)

    @property
    def rate(self) -> float | None:
        """Hits over outcomes in the window, or None before the first outcome."""
        total = len(self._outcomes)
        return None if total == 0 else self._hits / total

    @property
    def bps(self) -> int | None:
        """The rate in basis points (floor of hits·10 000 / outcomes), or None when empty."""
        total = len(self._outcomes)
        return None if total == 0 else self._hits * 10_000 // total

    def clear(self) -> None:
        """Forget every outcome."""
        self._outcomes.clear()
        self._hits = 0

    def __len__(self) -> int:
        return len(self._outcomes)

    def __repr__(self) -> str:
        return f"<RollingHitRate {self._hits}/{len(self._outcomes)} (window {self.window})>"
