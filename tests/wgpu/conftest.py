"""The wgpu backend's tests run on a real WebGPU adapter: lavapipe (Mesa's CPU Vulkan
driver) in CI, which `make test` installs where it can. Without wgpu-py or an adapter
every test here is skipped, with the reason and what to install, unless
``VYRE_REQUIRE_WGPU=1`` (CI sets it: there a missing adapter fails the run)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import AsyncIterator, Iterator

import pytest

from vyre_async import VyreBackend


def _missing(reason: str) -> None:
    if os.environ.get("VYRE_REQUIRE_WGPU") == "1":
        pytest.fail(f"VYRE_REQUIRE_WGPU=1 and {reason}")
    pytest.skip(reason)


def adapter_or_skip() -> dict[str, str]:
    """The adapter `vyre_wgpu` would pick here, or skip the test with what is missing."""
    if importlib.util.find_spec("wgpu") is None:
        _missing("wgpu-py is not installed: pip install 'vyre-async[wgpu]'")
    from vyre_async.errors import UnsupportedFeature
    from vyre_wgpu import probe

    try:
        return probe()
    except UnsupportedFeature as exc:
        _missing(
            "no Vulkan adapter: install mesa-vulkan-drivers and libvulkan1 (make test does, "
            f"as root): {exc}"
        )
        raise


@pytest.fixture(scope="module")
def wgpu_adapter() -> dict[str, str]:
    return adapter_or_skip()


@pytest.fixture
async def wgpu_backend(wgpu_adapter: dict[str, str]) -> AsyncIterator[VyreBackend]:
    """A private wgpu backend (not the registry's shared one), closed after the test."""
    from vyre_wgpu import create_backend

    backend = create_backend(prefetch=False)
    try:
        yield backend
    finally:
        await backend.aclose()


@pytest.fixture
def shared_wgpu(wgpu_adapter: dict[str, str]) -> Iterator[VyreBackend]:
    """The registry's ``wgpu`` backend (synchronous tests that only compile or plan)."""
    from vyre_async import acquire_backend

    yield acquire_backend("wgpu")
