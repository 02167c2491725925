"""Shared pytest configuration: async tests run on asyncio and on trio; caches stay private."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session", autouse=True)
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Point the pipeline and calibration caches at a fresh folder for the whole run.

    Without it, backends built with their default disk cache (registry, contract
    tests, the CLI) read and wrote the user's ``~/.cache/vyre-async``: kernels a
    test compiled leaked into real use, and kernels from an older checkout could
    be loaded by a test.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VYRE_CACHE_DIR", str(tmp_path_factory.mktemp("vyre-cache")))
        yield
