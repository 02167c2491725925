"""A bounded pool of non-blocking CUDA streams shared by every dispatch of a backend.

Each dispatch leases the least busy stream (ties broken round-robin) for its
whole upload → launch → readback sequence and returns it when it completes.
Independent dispatches therefore overlap on separate streams, while a long
kernel holds only the stream it runs on. Streams are created lazily by the
``make`` callable (``cupy.cuda.Stream(non_blocking=True)``), so the pool itself
is plain Python and tested without a GPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from vyre_async.abc import public_dir as _public_dir

__all__ = ["DEFAULT_STREAMS", "StreamPool"]
__dir__ = _public_dir(__name__)

#: Streams per backend unless configured otherwise.
DEFAULT_STREAMS = 8


class StreamPool:
    """At most ``size`` streams, leased to dispatches by least outstanding work.

    Args:
        size: Number of streams (at least 1).
        make: Creates one stream; called at most ``size`` times, on first use.
    """

    def __init__(self, size: int, make: Callable[[], Any]) -> None:
        if size < 1:
            raise ValueError(f"a stream pool needs at least 1 stream, got {size}")
        self.size = size
        self._make = make
        self._streams: list[Any] = [None] * size
        self._busy = [0] * size
        self._cursor = 0
        self._lock = threading.Lock()
        self._ordering = [threading.Lock() for _ in range(size)]

    def lease(self) -> tuple[int, Any]:
        """Return ``(index, stream)`` of the least busy stream and count one more user of it."""
        with self._lock:
            busy, index = self._busy, self._cursor
            if busy[index]:  # else the cursor's stream is idle: the least busy, first in order
                order = [(index + k) % self.size for k in range(self.size)]
                index = min(order, key=busy.__getitem__)
            self._cursor = (index + 1) % self.size
            self._busy[index] += 1
            stream = self._streams[index]
            if stream is None:
                try:
                    stream = self._streams[index] = self._make()
                except BaseException:
                    self._busy[index] -= 1
                    raise
            return index, stream

    def ordering(self, index: int) -> threading.Lock:
        """Return the lock that keeps one dispatch's operations contiguous on stream ``index``.

        Hold it while enqueueing a dispatch's operations and handing its completion
        to the bridge, so the bridge sees a stream's dispatches in the stream's order.
        """
        return self._ordering[index]

    def release(self, index: int) -> None:
        """Count one user of stream ``index`` less (its dispatch completed)."""
        with self._lock:
            if self._busy[index] <= 0:
                raise RuntimeError(f"stream {index} released more often than leased")
            self._busy[index] -= 1

    def busy(self) -> tuple[int, ...]:
        """Outstanding dispatches per stream."""
        with self._lock:
            return tuple(self._busy)

    def created(self) -> int:
        """Number of streams created so far."""
        with self._lock:
            return sum(s is not None for s in self._streams)

    def close(self) -> None:
        """Drop every stream (call once nothing is in flight)."""
        with self._lock:
            self._streams = [None] * self.size
