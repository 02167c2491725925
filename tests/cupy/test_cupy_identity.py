"""The CUDA backend's cache identity follows its compiler: NVRTC version and target.

On the fake device (``fake_cupy.py``): a disk cache entry written by one NVRTC
version, or for one target architecture, must not be loaded by a backend whose
NVRTC or target differs (a cubin built by another compiler or for another
architecture is not the kernel this compiler would build).
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

from tests.cupy.fake_cupy import FakeDevice
from vyre_async import DiskPipelineCache
from vyre_async.programs import elementwise_xor
from vyre_cupy import create_backend

XOR = elementwise_xor(64)

# Each is one change to what the fake device's NVRTC reports.
NVRTC_CHANGES = {
    "nvrtc version": ("getVersion", lambda: (13, 1)),
    "target architecture": ("getSupportedArchs", lambda: (75, 80, 86, 89)),  # no sm_90
}


@pytest.mark.parametrize("change", list(NVRTC_CHANGES.values()), ids=list(NVRTC_CHANGES))
def test_an_entry_from_another_nvrtc_is_not_loaded(
    fake: FakeDevice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: tuple[str, object]
) -> None:
    cache = DiskPipelineCache(tmp_path)
    first = create_backend(disk_cache=cache)
    fresh = create_backend(disk_cache=DiskPipelineCache(tmp_path))
    try:
        first.compile(XOR)
        assert fresh.compile(XOR).source == "disk"  # same compiler: loaded
        compiles = fake.compiles
        monkeypatch.setattr(sys.modules["cupy_backends.cuda.libs.nvrtc"], *change)
        other = create_backend(disk_cache=DiskPipelineCache(tmp_path))
        try:
            assert other.compiler_fingerprint() != first.compiler_fingerprint()
            assert other.device_fingerprint() == first.device_fingerprint()
            assert other.pipeline_identity(XOR) != first.pipeline_identity(XOR)
            pipeline = other.compile(XOR)
            assert pipeline.source == "compiled" and fake.compiles == compiles + 1
            assert cache.info().entries == 2
        finally:
            anyio.run(other.shutdown)
    finally:
        anyio.run(first.shutdown)
        anyio.run(fresh.shutdown)


def test_the_prelude_text_is_part_of_the_compiler_fingerprint(
    fake: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fingerprint names the prelude by a digest of its text, and follows it.

    So an edited prelude is a cache miss even if nobody bumped PRELUDE_VERSION.
    """
    import blake3

    import vyre_cupy.backend
    from vyre_cupy.prelude import PRELUDE, PRELUDE_DIGEST

    assert blake3.blake3(PRELUDE.encode()).hexdigest()[:16] == PRELUDE_DIGEST
    backend = create_backend(disk_cache=None)
    try:
        assert f"prelude {PRELUDE_DIGEST}" in backend.compiler_fingerprint()
        before = backend.pipeline_identity(XOR)
        monkeypatch.setattr(vyre_cupy.backend, "PRELUDE_DIGEST", "0" * 16)  # another text
        edited = create_backend(disk_cache=None)
        try:
            assert edited.pipeline_identity(XOR) != before
        finally:
            anyio.run(edited.shutdown)
    finally:
        anyio.run(backend.shutdown)
