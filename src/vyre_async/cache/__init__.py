"""Pipeline caches: identity, the in-memory LRU and the on-disk store."""

from vyre_async.cache.disk import (
    DiskCacheInfo,
    DiskPipelineCache,
    PipelineCacheWarning,
    default_cache_root,
)
from vyre_async.cache.identity import (
    CACHE_KEY_VERSION,
    MISS_REASONS,
    PipelineIdentity,
    classify_miss,
    pipeline_identity,
    policy_digest,
)
from vyre_async.cache.memory import CacheStats, MemoryPipelineCache

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
