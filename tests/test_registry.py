"""Registry listing over entry points: sorted, side-effect free, robust to broken plugins."""

from __future__ import annotations

import logging
from importlib.metadata import EntryPoint
from typing import Any

import pytest

from tests.helpers import backend_of
from vyre_async import _registry as registry
from vyre_async._registry import BackendRegistration, registered_backends

A = BackendRegistration(id="zeta", factory="json:loads", precedence=10)
B = BackendRegistration(id="alpha", factory="json:loads", precedence=10)
C = BackendRegistration(id="first", factory=lambda: 1, precedence=0, is_reference=True)


class _FakeEP:
    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self._value = value

    def load(self) -> Any:
        if isinstance(self._value, Exception):
            raise self._value
        return self._value


def _patch(monkeypatch: pytest.MonkeyPatch, eps: list[_FakeEP]) -> None:
    def fake(*, group: str) -> list[_FakeEP]:
        assert group == registry.ENTRY_POINT_GROUP
        return eps

    monkeypatch.setattr(registry, "entry_points", fake)


def test_sorted_by_precedence_then_id(monkeypatch: pytest.MonkeyPatch) -> None:
    _patch(monkeypatch, [_FakeEP("a", A), _FakeEP("b", B), _FakeEP("c", C)])
    assert [r.id for r in registered_backends()] == ["first", "alpha", "zeta"]


def test_broken_and_foreign_entries_are_skipped_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    eps = [
        _FakeEP("boom", ImportError("no module")),
        _FakeEP("odd", 42),
        _FakeEP("dup", A),
        _FakeEP("a", A),
    ]
    _patch(monkeypatch, eps)
    with caplog.at_level(logging.WARNING, logger="vyre_async.registry"):
        assert [r.id for r in registered_backends()] == ["zeta"]
    text = caplog.text
    assert "boom" in text and "odd" in text and "duplicate" in text


def test_factory_paths_load_lazily() -> None:
    import json

    assert A.load_factory() is json.loads
    assert C.load_factory()() == 1
    with pytest.raises(ValueError, match="module:callable"):
        BackendRegistration(id="x", factory="nocolon")
    with pytest.raises(ValueError, match="non-empty"):
        BackendRegistration(id="", factory="json:loads")
    with pytest.raises(TypeError, match="not callable"):
        BackendRegistration(id="x", factory="json:__doc__").load_factory()


def test_real_entry_point_group_is_queried() -> None:
    assert isinstance(registered_backends(), list)
    assert all(
        isinstance(ep, EntryPoint) for ep in registry.entry_points(group="vyre_async.backends")
    )


# Acquisition --------------------------------------------------------------------

from tests.driver.fakes import BytesBackend  # noqa: E402
from vyre_async import BackendNotFound, ErrorCode, InvalidProgram, UnsupportedFeature  # noqa: E402
from vyre_async._capabilities import BackendCapabilities  # noqa: E402
from vyre_async._registry import (  # noqa: E402
    acquire_backend,
    acquire_preferred_backend,
    probe_backend,
    register_backend,
)


class _Gpuish(BytesBackend):
    id = "gpuish"

    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities(
            async_compute=True, max_storage_buffer_bytes=1 << 30, max_workgroup_lanes=1024
        )


class _RefLike(BytesBackend):
    id = "ref-like"


def _broken() -> BytesBackend:
    raise RuntimeError("libcuda.so.1: cannot open shared object file")


def _refuses() -> BytesBackend:
    raise UnsupportedFeature("no CUDA device is visible", fix="check nvidia-smi")


@pytest.mark.usefixtures("isolated")
def test_acquire_builds_once_per_process() -> None:
    built: list[int] = []

    def factory() -> BytesBackend:
        built.append(1)
        return backend_of(BytesBackend)

    register_backend(BackendRegistration(id="bytes-test", factory=factory))
    first = acquire_backend("bytes-test")
    assert acquire_backend("bytes-test") is first
    assert built == [1]
    with pytest.raises(ValueError, match="already registered"):
        register_backend(BackendRegistration(id="bytes-test", factory=factory))


@pytest.mark.usefixtures("isolated")
@pytest.mark.anyio
async def test_acquire_after_close_builds_a_fresh_backend() -> None:
    """0.1.0 returned the closed instance forever, so its BackendClosed Fix did not work."""
    register_backend(BackendRegistration(id="bytes-test", factory=BytesBackend))
    first = acquire_backend("bytes-test")
    async with first:
        assert acquire_backend("bytes-test") is first
    assert first.closed
    second = acquire_backend("bytes-test")
    assert second is not first and not second.closed
    assert acquire_backend("bytes-test") is second
    await second.aclose()
    assert acquire_backend("bytes-test") is not second


@pytest.mark.usefixtures("isolated")
def test_unknown_id_lists_the_installed_ones() -> None:
    register_backend(BackendRegistration(id="bytes-test", factory=BytesBackend))
    with pytest.raises(BackendNotFound, match="Fix:") as info:
        acquire_backend("cuda9000")
    assert "installed: bytes-test" in str(info.value)
    assert isinstance(info.value, LookupError)
    assert info.value.code is ErrorCode.BackendNotFound


@pytest.mark.usefixtures("isolated")
def test_factory_failures_become_unsupported_feature() -> None:
    register_backend(BackendRegistration(id="broken", factory=_broken))
    with pytest.raises(UnsupportedFeature, match="libcuda") as info:
        acquire_backend("broken")
    assert isinstance(info.value.__cause__, RuntimeError)
    register_backend(BackendRegistration(id="mismatch", factory=BytesBackend))
    with pytest.raises(UnsupportedFeature, match="another id"):
        acquire_backend("mismatch")


@pytest.mark.usefixtures("isolated")
def test_preferred_picks_the_most_capable_started_backend() -> None:
    register_backend(BackendRegistration(id="bytes-test", factory=BytesBackend, precedence=1))
    register_backend(BackendRegistration(id="gpuish", factory=_Gpuish, precedence=50))
    register_backend(BackendRegistration(id="broken", factory=_broken, precedence=0))
    register_backend(BackendRegistration(id="ref-like", factory=_RefLike, is_reference=True))
    assert acquire_preferred_backend().id == "gpuish"


class _CpuDevice(_Gpuish):
    """A backend with more features than ``gpuish`` whose device is a CPU (lavapipe-like)."""

    id = "softgpu"

    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities(
            async_compute=True,
            subgroup_ops=True,
            tensor_cores=True,
            max_workgroup_size=(1024, 1024, 64),
            max_workgroup_lanes=1024,
            max_storage_buffer_bytes=1 << 40,
            device_name="llvmpipe (Vulkan, CPU adapter)",
            cpu_device=True,
        )


@pytest.mark.usefixtures("isolated")
def test_preferred_never_picks_a_cpu_device() -> None:
    """A software GPU driver (lavapipe under wgpu) is never presented as the machine's GPU."""
    register_backend(BackendRegistration(id="softgpu", factory=_CpuDevice, precedence=0))
    register_backend(BackendRegistration(id="gpuish", factory=_Gpuish, precedence=50))
    assert acquire_backend("softgpu").capabilities().score() > _Gpuish().capabilities().score()
    assert acquire_preferred_backend().id == "gpuish"


@pytest.mark.usefixtures("isolated")
def test_a_cpu_device_alone_is_listed_and_still_acquired_by_id() -> None:
    register_backend(BackendRegistration(id="softgpu", factory=_CpuDevice))
    register_backend(BackendRegistration(id="ref-like", factory=_RefLike, is_reference=True))
    with pytest.raises(UnsupportedFeature) as info:
        acquire_preferred_backend()
    assert "softgpu: runs on a CPU device here (llvmpipe (Vulkan, CPU adapter))" in str(info.value)
    assert 'acquire_backend("softgpu") uses it when asked for by id' in str(info.value)
    assert acquire_preferred_backend(allow_reference=True).id == "ref-like"
    assert acquire_backend("softgpu").capabilities().cpu_device


@pytest.mark.usefixtures("isolated")
def test_preferred_without_a_usable_backend_lists_every_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    register_backend(BackendRegistration(id="broken", factory=_broken))
    register_backend(BackendRegistration(id="refuses", factory=_refuses))
    register_backend(BackendRegistration(id="ref-like", factory=_RefLike, is_reference=True))
    with pytest.raises(UnsupportedFeature, match="Fix:") as info:
        acquire_preferred_backend()
    text = str(info.value)
    assert "broken: " in text and "libcuda" in text
    assert "refuses: " in text and "no CUDA device" in text
    # The Fix points at the failures listed above (they are), or at allow_reference.
    assert text.endswith(
        "Fix: apply the Fix listed above for the GPU backend you want, or pass "
        "allow_reference=True to run on the numpy reference backend (CPU)"
    )
    with caplog.at_level(logging.WARNING, logger="vyre_async.registry"):
        backend = acquire_preferred_backend(allow_reference=True)
    assert backend.id == "ref-like"
    warning = caplog.text
    assert "dispatching on the CPU with the numpy reference backend 'ref-like'" in warning
    assert "refuses: no CUDA device" in warning and "Fix: check nvidia-smi" in warning
    # The caller passed allow_reference=True: nothing tells them to pass it.
    assert "allow_reference" not in warning
    assert "reference reference" not in warning


@pytest.mark.usefixtures("isolated")
def test_preferred_with_nothing_installed() -> None:
    with pytest.raises(UnsupportedFeature, match="no GPU dispatch backend is installed") as info:
        acquire_preferred_backend(allow_reference=True)
    # No failure is listed, so the Fix names what to install instead of pointing above.
    assert "listed above" not in str(info.value)
    assert "pip install 'vyre-async[cuda]'" in str(info.value)


def _never_built() -> None:
    raise AssertionError("a probe must not build the backend")


def test_probe_backend_verdicts() -> None:
    def refuses() -> None:
        raise UnsupportedFeature("no GPU here", fix="get one")

    verdict = probe_backend(BackendRegistration(id="x", factory=_never_built, probe=refuses))
    assert (verdict.usable, verdict.reason, verdict.fix) == (False, "no GPU here", "get one")
    ok = probe_backend(BackendRegistration(id="y", factory=_never_built))
    assert ok.usable and ok.reason is None
    with pytest.raises(InvalidProgram, match="probe"):
        BackendRegistration(id="z", factory=_never_built, probe="no colon")
