"""Pipeline caches: identity and the on-disk store (the in-memory LRU is `vyre_async._store`'s)."""

from vyre_async._cache.identity import (
    CACHE_KEY_VERSION,
    MISS_REASONS,
    PipelineIdentity,
    classify_miss,
    pipeline_identity,
    policy_digest,
)
from vyre_async._lazy import lazy_exports as _lazy_exports

__all__ = [
    "CACHE_KEY_VERSION",
    "MISS_REASONS",
    "CacheStats",
    "DiskCacheInfo",
    "DiskPipelineCache",
    "MemoryPipelineCache",
    "PipelineCacheWarning",
    "PipelineIdentity",
    "classify_miss",
    "default_cache_root",
    "pipeline_identity",
    "policy_digest",
]
# The disk cache (and pathlib with it) loads on first use, not with `import vyre_async`.
__getattr__, __dir__ = _lazy_exports(
    __name__,
    dict.fromkeys(
        ("DiskCacheInfo", "DiskPipelineCache", "PipelineCacheWarning", "default_cache_root"), "disk"
    )
    # (the memory LRU is the pipeline store's: `vyre_async._store`)
    | dict.fromkeys(("CacheStats", "MemoryPipelineCache"), "vyre_async._store"),
    __all__,
    submodules=("files",),
)
