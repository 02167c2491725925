"""Cache identity and the in-memory LRU: what mutation testing (issue 28) found untested.

The identity is persistent (it names disk cache files), so its exact bytes are
part of the contract: an entry written by an earlier release must be found
again unless `CACHE_KEY_VERSION` was bumped. The memory cache's contract is its
LRU order, its capacity and the counters `stats()` reports.
"""

from __future__ import annotations

import struct
from typing import Any

import blake3
import pytest

from vyre_async import DispatchConfig
from vyre_async._cache import (
    MISS_REASONS,
    MemoryPipelineCache,
    PipelineIdentity,
    classify_miss,
    pipeline_identity,
)
from vyre_async._cache import identity as identity_module
from vyre_async.errors import InvalidProgram
from vyre_async.programs import elementwise_xor

XOR = elementwise_xor(64)
BACKEND: dict[str, Any] = {
    "backend_id": "cupy",
    "backend_version": "0.2.0",
    "device_fingerprint": "NVIDIA H100 sm_90",
    "compiler": "nvrtc 13.0",
}


def _framed(*parts: bytes) -> bytes:
    """The identity's framing as documented: each part prefixed by its length (u32 LE)."""
    return b"".join(len(p).to_bytes(4, "little") + p for p in parts)


# The identity's bytes are stable across releases ----------------------------------

#: blake3 of the framed b"vyre-device-v1", backend id, version, fingerprint, compiler,
#: recorded when CACHE_KEY_VERSION was 1: a change here orphans every disk entry.
DEVICE_DIGESTS = [
    (BACKEND, "7abfca2e8d036709ba99536704be9da8c59b9bef577204f1e3cb850edc65fb0c"),
    (
        {"backend_id": "reference", "backend_version": "0.1.0"},
        "600b7722d30db29ea4ffebfa9632796a4055fa0ac838bdfba383c395cf59915c",
    ),
]


@pytest.mark.parametrize(("backend", "pinned"), DEVICE_DIGESTS, ids=["cupy", "defaults"])
def test_device_digests_are_the_ones_earlier_releases_wrote(
    backend: dict[str, Any], pinned: str
) -> None:
    identity = pipeline_identity(XOR, None, **backend)
    assert identity.device_digest.hex() == pinned
    fields = ("backend_id", "backend_version", "device_fingerprint", "compiler")
    spec = _framed(b"vyre-device-v1", *(str(backend.get(f, "")).encode() for f in fields))
    assert identity.device_digest == blake3.blake3(spec).digest()


def test_omitted_fingerprint_and_compiler_are_the_empty_strings() -> None:
    short = pipeline_identity(XOR, None, backend_id="reference", backend_version="0.1.0")
    explicit = pipeline_identity(
        XOR,
        None,
        backend_id="reference",
        backend_version="0.1.0",
        device_fingerprint="",
        compiler="",
    )
    assert short == explicit


@pytest.mark.parametrize(
    "config",
    [None, DispatchConfig(ulp_budget=2, workgroup_override=(64, 1, 1))],
    ids=["default", "ulp-and-workgroup"],
)
def test_the_identity_frames_the_key_version_and_the_three_components(
    config: DispatchConfig | None,
) -> None:
    identity = pipeline_identity(XOR, config, **BACKEND)
    spec = _framed(
        b"vyre-pipeline-v1",
        identity.program_digest,
        identity.policy_digest,
        identity.device_digest,
    )
    assert identity_module.CACHE_KEY_VERSION == 1
    assert identity.digest == blake3.blake3(spec).digest()
    assert identity.hex == identity.digest.hex() and len(identity.hex) == 64


def test_policy_digest_layout() -> None:
    ulp_and_wg = _framed(
        b"vyre-policy-v1", b"\1" + bytes([2]), b"\1" + struct.pack("<3I", 64, 1, 1)
    )
    none = _framed(b"vyre-policy-v1", b"\0", b"\0")
    config = DispatchConfig(ulp_budget=2, workgroup_override=(64, 1, 1))
    assert (
        pipeline_identity(XOR, config, **BACKEND).policy_digest
        == blake3.blake3(ulp_and_wg).digest()
    )
    assert pipeline_identity(XOR, None, **BACKEND).policy_digest == blake3.blake3(none).digest()


# classify_miss: "absent" when every component matches ------------------------------


def test_a_miss_with_every_component_cached_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    old = pipeline_identity(XOR, None, **BACKEND)
    monkeypatch.setattr(identity_module, "CACHE_KEY_VERSION", identity_module.CACHE_KEY_VERSION + 1)
    new = pipeline_identity(XOR, None, **BACKEND)
    assert new.digest != old.digest
    assert classify_miss(new, [old]) == "absent" == MISS_REASONS[-1]

    cache: MemoryPipelineCache[str] = MemoryPipelineCache()
    cache.put(old, "compiled under the old key version")
    assert cache.get(new) is None
    assert cache.last_miss_reason == "absent"
    assert cache.stats().miss_reasons == {"absent": 1}


# MemoryPipelineCache --------------------------------------------------------------


def _identities(n: int) -> list[PipelineIdentity]:
    return [pipeline_identity(XOR, None, backend_id="b", backend_version=str(i)) for i in range(n)]


def test_default_capacity_is_256_entries() -> None:
    cache: MemoryPipelineCache[int] = MemoryPipelineCache()
    ids = _identities(257)
    for i, identity in enumerate(ids[:256]):
        cache.put(identity, i)
    stats = cache.stats()
    assert (cache.capacity, stats.capacity, stats.entries, stats.evictions) == (256, 256, 256, 0)
    cache.put(ids[256], 256)
    stats = cache.stats()
    assert (stats.entries, stats.evictions) == (256, 1)
    assert cache.peek(ids[0]) is None and cache.peek(ids[1]) == 1


@pytest.mark.parametrize(
    ("capacity", "error"),
    [
        (-1, "capacity must be an int >= 1, got -1"),
        (0, "capacity must be an int >= 1, got 0"),
        (1, None),
        (2, None),
        (True, "capacity must be an int >= 1, got True"),
        (1.0, "capacity must be an int >= 1, got 1.0"),
    ],
)
def test_capacity_is_a_whole_number_of_at_least_one(capacity: object, error: str | None) -> None:
    if error is not None:
        with pytest.raises(InvalidProgram) as raised:
            MemoryPipelineCache(capacity)  # type: ignore[arg-type]
        assert str(raised.value) == f"{error}\nFix: pass e.g. capacity=256"
        return
    cache: MemoryPipelineCache[int] = MemoryPipelineCache(capacity)  # type: ignore[arg-type]
    ids = _identities(capacity + 1)  # type: ignore[operator]
    for i, identity in enumerate(ids):
        cache.put(identity, i)
    assert cache.identities() == ids[1:]  # one over capacity: the first is evicted
    assert cache.stats().capacity == capacity and cache.stats().evictions == 1


@pytest.mark.parametrize("capacity", [1, 2, 3])
def test_eviction_drops_the_least_recently_used(capacity: int) -> None:
    cache: MemoryPipelineCache[int] = MemoryPipelineCache(capacity)
    ids = _identities(capacity + 1)
    for i, identity in enumerate(ids[:capacity]):
        cache.put(identity, i)
    assert cache.get(ids[0]) == 0  # the oldest becomes the most recent
    cache.put(ids[capacity], capacity)
    expected = [*ids[2:capacity], ids[0], ids[capacity]] if capacity > 1 else [ids[1]]
    assert cache.identities() == expected
    assert cache.peek(ids[capacity]) == capacity  # the entry just put is never the one evicted
    assert cache.stats().evictions == 1


def test_peek_neither_counts_nor_refreshes() -> None:
    cache: MemoryPipelineCache[str] = MemoryPipelineCache(2)
    a, b, c = _identities(3)
    cache.put(a, "a")
    cache.put(b, "b")
    assert cache.peek(a) == "a" and cache.peek(b) == "b" and cache.peek(c) is None
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.miss_reasons) == (0, 0, {})
    assert cache.last_miss_reason is None
    cache.put(c, "c")  # a was peeked, not used: it is still the least recently used
    assert cache.identities() == [b, c]


def test_counters_accumulate_per_lookup_and_per_reason() -> None:
    cache: MemoryPipelineCache[str] = MemoryPipelineCache(4)
    assert cache.last_miss_reason is None and cache.stats().hit_rate is None
    base = pipeline_identity(XOR, None, **BACKEND)
    other_device = pipeline_identity(XOR, None, **{**BACKEND, "device_fingerprint": "H200"})
    assert cache.get(base) is None and cache.get(base) is None
    cache.put(other_device, "x")
    for _ in range(3):
        assert cache.get(base) is None
    assert cache.get(other_device) == "x" and cache.get(other_device) == "x"
    stats = cache.stats()
    assert (stats.hits, stats.misses) == (2, 5)
    assert stats.miss_reasons == {"empty": 2, "device_changed": 3}
    assert cache.last_miss_reason == "device_changed"
    assert stats.hit_rate == pytest.approx(2 / 7)
