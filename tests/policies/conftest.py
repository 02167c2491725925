"""Keep calibration records of these tests out of the user's cache directory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VYRE_CACHE_DIR", str(tmp_path_factory.mktemp("vyre-cache")))
        yield
