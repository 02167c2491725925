"""A bounded, thread-safe LRU of compiled pipelines with hit/miss accounting."""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

from vyre_async._exports import public_dir as _public_dir
from vyre_async.arguments import whole_number
from vyre_async.cache.identity import PipelineIdentity, classify_miss

__all__ = ["CacheStats", "MemoryPipelineCache"]
__dir__ = _public_dir(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheStats:
    """A snapshot of a cache's counters."""

    entries: int
    capacity: int
    hits: int
    misses: int
    evictions: int
    miss_reasons: dict[str, int]

    @property
    def hit_rate(self) -> float | None:
        """Hits over lookups, or None before the first lookup."""
        total = self.hits + self.misses
        return None if total == 0 else self.hits / total


class MemoryPipelineCache(Generic[T]):
    """Least-recently-used map from `PipelineIdentity` to compiled pipelines.

    Args:
        capacity: Most entries kept; the least recently used is evicted beyond it.
    """

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = whole_number("capacity", capacity, minimum=1, example="capacity=256")
        self._entries: OrderedDict[bytes, tuple[PipelineIdentity, T]] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._reasons: Counter[str] = Counter()
        self.last_miss_reason: str | None = None

    def get(self, identity: PipelineIdentity) -> T | None:
        """Return the cached pipeline (and mark it recently used), or None on a miss."""
        with self._lock:
            entry = self._entries.get(identity.digest)
            if entry is not None:
                self._entries.move_to_end(identity.digest)
                self._hits += 1
                return entry[1]
            reason = classify_miss(identity, (i for i, _ in self._entries.values()))
            self._misses += 1
            self._reasons[reason] += 1
            self.last_miss_reason = reason
            return None

    def peek(self, identity: PipelineIdentity) -> T | None:
        """Return the cached pipeline without counting a lookup or touching recency."""
        with self._lock:
            entry = self._entries.get(identity.digest)
            return None if entry is None else entry[1]

    def put(self, identity: PipelineIdentity, pipeline: T) -> None:
        """Insert or refresh an entry, evicting the least recently used beyond capacity."""
        with self._lock:
            self._entries[identity.digest] = (identity, pipeline)
            self._entries.move_to_end(identity.digest)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
                self._evictions += 1

    def identities(self) -> list[PipelineIdentity]:
        """The identities of the entries held now, least recently used first."""
        with self._lock:
            return [identity for identity, _ in self._entries.values()]

    def clear(self) -> None:
        """Drop every entry (counters are kept)."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> CacheStats:
        """Return a snapshot of the counters."""
        with self._lock:
            return CacheStats(
                entries=len(self._entries),
                capacity=self.capacity,
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                miss_reasons=dict(self._reasons),
            )
