"""The pipeline store: cache identities, the memory LRU and the disk cache, compile once.

One `PipelineStore` per backend instance. `PipelineStore.lookup` is what a
dispatch pays when the pipeline is warm: a memoised identity (keyed by the
program object and the config's policy digest) and one LRU lookup. On a miss,
`PipelineStore.compile_once` loads the disk cache entry or calls the backend's
``build_pipeline`` hook, and makes sure two callers (a dispatch racing the
prefetcher, two tasks) share one compile instead of compiling twice.

`MemoryPipelineCache` is the store's in-memory LRU (``backend.pipelines``),
with its `CacheStats` (``backend.cache_stats()``).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from vyre_async._arguments import whole_number
from vyre_async._cache.identity import (
    PipelineIdentity,
    classify_miss,
    pipeline_identity,
    policy_digest,
)
from vyre_async._config import DispatchConfig
from vyre_async._exports import public_dir as _public_dir
from vyre_async._frontend import DispatchFrontEnd
from vyre_async._pipeline import CompiledPipeline
from vyre_async._seams import BackendLike
from vyre_async.errors import BackendError, InvalidProgram, KernelCompileFailed, UnsupportedFeature
from vyre_async.ir.ops import GRID_BARRIER_OP
from vyre_async.ir.program import Program
from vyre_async.ir.validate import validate_or_raise
from vyre_async.ir.walk import ops_used

if TYPE_CHECKING:
    from vyre_async._executor import Executor

if TYPE_CHECKING:
    from concurrent.futures import Future

    from vyre_async._cache.disk import DiskPipelineCache

__all__ = ["CacheStats", "MemoryPipelineCache", "PipelineStore"]
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


class PipelineStore:
    """Compiled pipelines of one backend: identity memo, memory LRU, disk cache, compile-once.

    Args:
        executor: The executor whose hooks build, serialise and load pipelines.
        front: The backend's dispatch front end (the pipelines dispatch through it).
        capacity: Entries of the in-memory LRU (the identity memo keeps 4x as many).
        disk_cache: Where serialised pipelines persist across processes, or None.

    Attributes:
        memory: The in-memory LRU (``backend.pipelines``).
        disk_cache: The disk cache, or None.
    """

    def __init__(
        self,
        executor: Executor,
        front: DispatchFrontEnd,
        capacity: int,
        disk_cache: DiskPipelineCache | None,
        owner: BackendLike,
    ) -> None:
        self.executor = executor
        #: The backend its pipelines report as theirs (``pipeline.backend``).
        self.owner = owner
        self.front = front
        self.memory: MemoryPipelineCache[CompiledPipeline] = MemoryPipelineCache(capacity)
        self.disk_cache = disk_cache
        self._identities: OrderedDict[
            tuple[Program, bytes, tuple[tuple[str, str], ...]], PipelineIdentity
        ] = OrderedDict()
        self._identity_lock = threading.Lock()
        self._device_key: str | None = None
        # (id(program), id(config)) -> the objects and their identity, validated and
        # checked for operations: a warm lookup of the same objects skips all of it.
        self._hot: dict[tuple[int, int], tuple[Program, DispatchConfig, PipelineIdentity]] = {}
        # Compiles in progress by identity digest: a second caller waits for the first.
        self._compiling: dict[bytes, Future[CompiledPipeline]] = {}
        self._compiling_lock = threading.Lock()

    def identity(self, program: Program, config: DispatchConfig) -> PipelineIdentity:
        """Return the cache identity of ``program`` under ``config`` (memoised)."""
        backend = self.executor
        options = backend.compile_options(config)
        # Keyed by everything the identity hashes that a config can change: the policy
        # fields and the backend's compile options for it.
        memo_key = (
            program,
            policy_digest(config),
            tuple(sorted((str(k), repr(v)) for k, v in options.items())),
        )
        with self._identity_lock:
            identity = self._identities.get(memo_key)
            if identity is not None:
                self._identities.move_to_end(memo_key)
                return identity
        if self._device_key is None:
            self._device_key = backend.device_fingerprint()
        identity = pipeline_identity(
            program,
            config,
            backend_id=backend.id,
            backend_version=backend.version,
            device_fingerprint=self._device_key,
            compiler=backend.compiler_fingerprint(),
            compile_options=options,
        )
        with self._identity_lock:
            self._identities[memo_key] = identity
            while len(self._identities) > 4 * self.memory.capacity:
                self._identities.popitem(last=False)
        return identity

    def lookup(self, program: Program, config: DispatchConfig) -> tuple[CompiledPipeline, bool]:
        """Return ``(pipeline, cache_hit)`` for ``program``: validated, cached or compiled.

        Raises:
            InvalidProgram: ``program`` is not a valid `Program`.
            UnsupportedFeature: it uses an operation the backend lacks.
            KernelCompileFailed: the backend's compiler rejected it.
        """
        backend = self.executor
        hot = self._hot.get((id(program), id(config)))
        if hot is not None and hot[0] is program and hot[1] is config:
            cached = self.memory.get(hot[2])  # checked before: only the cache to ask
            if cached is not None:
                return cached, True
        if not isinstance(program, Program):
            raise InvalidProgram(
                f"dispatch expects a Program, got {type(program).__name__}",
                fix="build the kernel with vyre_async.ir.Program(...)",
            )
        validate_or_raise(program)
        missing = ops_used(program) - backend.supported_ops()
        if missing:
            raise _missing_ops(backend.id, missing)
        identity = self.identity(program, config)
        hot_key = (id(program), id(config))
        if len(self._hot) >= 4 * self.memory.capacity:
            self._hot.clear()
        self._hot[hot_key] = (program, config, identity)  # holds them: ids stay theirs
        cached = self.memory.get(identity)
        if cached is not None:
            return cached, True
        return self.compile_once(program, config, identity), False

    def peek(self, identity: PipelineIdentity) -> CompiledPipeline | None:
        """Return the cached pipeline of ``identity`` without counting a lookup."""
        return self.memory.peek(identity)

    def compile_once(
        self, program: Program, config: DispatchConfig, identity: PipelineIdentity
    ) -> CompiledPipeline:
        """Load or build ``identity`` and cache it; concurrent callers share one compile."""
        digest = identity.digest
        with self._compiling_lock:
            ready = self.memory.peek(identity)
            if ready is not None:  # finished while this caller was looking
                return ready
            running = self._compiling.get(digest)
            if running is None:
                from concurrent.futures import Future  # (on a compile, not at import)

                mine: Future[CompiledPipeline] = Future()
                self._compiling[digest] = mine
        if running is not None:
            return running.result()  # the first caller's pipeline, or its error
        try:
            pipeline = self._load_or_build(program, config, identity)
            self.memory.put(identity, pipeline)
        except BaseException as exc:
            mine.set_exception(exc)
            raise
        else:
            mine.set_result(pipeline)
            return pipeline
        finally:
            with self._compiling_lock:
                del self._compiling[digest]

    def _load_or_build(
        self, program: Program, config: DispatchConfig, identity: PipelineIdentity
    ) -> CompiledPipeline:
        backend = self.executor

        def make(native: Any, compile_s: float, source: str) -> CompiledPipeline:
            return CompiledPipeline(
                backend=self.owner,
                front=self.front,
                program=program,
                config=config,
                identity=identity,
                native=native,
                compile_s=compile_s,
                source=source,
            )

        if self.disk_cache is not None:
            payload = self.disk_cache.get(identity.hex)
            if payload is not None:
                try:
                    return make(backend.load_pipeline(payload, program, config), 0.0, "disk")
                except Exception as exc:  # a bad entry is a miss, then overwritten
                    from vyre_async._cache.disk import PipelineCacheWarning

                    warnings.warn(
                        f"pipeline cache entry {identity.hex} could not be loaded by backend "
                        f"{backend.id!r} ({type(exc).__name__}: {exc}); recompiling",
                        PipelineCacheWarning,
                        stacklevel=2,
                    )
        start = time.perf_counter()
        try:
            native = backend.build_pipeline(program, config)
        except BackendError:
            raise
        except Exception as exc:
            raise KernelCompileFailed(
                f"backend {backend.id!r} failed to compile {program.op_id or 'a program'}: "
                f"{type(exc).__name__}: {exc}",
                fix="report this with the program's wire bytes (program.to_wire())",
            ) from exc
        compile_s = time.perf_counter() - start
        if self.disk_cache is not None:
            payload = backend.serialize_pipeline(native)
            if payload is not None:
                # The put may evict by recency: the pipelines this process serves from
                # memory are in use, though their disk entries were last read long ago.
                self.disk_cache.touch(i.hex for i in self.memory.identities())
                self.disk_cache.put(identity.hex, payload)
        return make(native, compile_s, "compiled")


def _missing_ops(backend_id: str, missing: frozenset[str]) -> UnsupportedFeature:
    """The error for a program using operations the backend does not implement."""
    if missing == {GRID_BARRIER_OP}:
        fix = (
            "use a backend that runs grid barriers (reference, cupy, wgpu), or dispatch "
            "the programs of vyre_async.split_at_grid_barriers(program) one after another"
        )
    else:
        fix = "rewrite the program without these operations or use another backend"
    return UnsupportedFeature(
        f"backend {backend_id!r} does not implement {', '.join(sorted(missing))}",
        fix=fix,
        feature=sorted(missing),
    )
