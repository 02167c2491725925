"""Without CuPy, driver or device, acquiring ``cupy`` fails clearly and the reference takes over."""

from __future__ import annotations

import logging
import subprocess
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from vyre_async import UnsupportedFeature, acquire_backend, acquire_preferred_backend
from vyre_async import _registry as registry_module
from vyre_async._registry import registered_backends
from vyre_cupy.registration import REGISTRATION


@pytest.fixture
def cupy_registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Register the cupy backend in-process (as its entry point would) for one test."""
    monkeypatch.setitem(registry_module._local, "cupy", REGISTRATION)
    registry_module._forget_instances()
    yield
    registry_module._forget_instances()


class _CudaRuntimeError(RuntimeError):
    def __init__(self, status: int) -> None:
        super().__init__(f"cudaError {status}")
        self.status = status


def _fake_cupy(count: int | None = None, status: int | None = None) -> types.ModuleType:
    """A CuPy stand-in whose runtime reports ``count`` devices or raises ``status``."""

    def get_device_count() -> int:
        if status is not None:
            raise _CudaRuntimeError(status)
        assert count is not None
        return count

    cupy: Any = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDeviceCount=get_device_count)
    )
    cupy.__version__ = "0.0-fake"
    return cupy  # type: ignore[no-any-return]


def _acquire_error() -> UnsupportedFeature:
    with pytest.raises(UnsupportedFeature) as info:
        acquire_backend("cupy")
    return info.value


def test_registration_imports_no_cupy() -> None:
    code = (
        "import sys, vyre_cupy.registration, vyre_cupy\n"
        "from vyre_async import registered_backends\n"
        "registered_backends()\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('cupy', 'cupy_backends')]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_registration_record() -> None:
    assert REGISTRATION.id == "cupy"
    assert REGISTRATION.factory == "vyre_cupy.backend:create_backend"
    assert REGISTRATION.precedence == 10
    assert REGISTRATION.dispatches and not REGISTRATION.is_reference


def test_without_cupy_acquiring_names_the_cause(
    cupy_registered: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    error = _acquire_error()
    assert error.cause == "no-cupy"
    assert "CuPy is not installed" in str(error)
    assert str(error).rpartition("\n")[2].startswith("Fix: ")
    assert "vyre-async[cuda]" in str(error)


@pytest.mark.parametrize(
    ("fake", "cause", "words"),
    [
        (_fake_cupy(status=35), "old-driver", "too old"),
        (_fake_cupy(status=34), "no-driver", "driver"),
        (_fake_cupy(status=100), "no-device", "no CUDA device"),
        (_fake_cupy(count=0), "no-device", "0 device"),
    ],
    ids=["old-driver", "stub-driver", "no-device-error", "zero-devices"],
)
def test_driver_and_device_failures_name_the_cause(
    cupy_registered: None,
    monkeypatch: pytest.MonkeyPatch,
    fake: types.ModuleType,
    cause: str,
    words: str,
) -> None:
    monkeypatch.setitem(sys.modules, "cupy", fake)
    error = _acquire_error()
    assert error.cause == cause
    assert words in str(error)
    assert "Fix: " in str(error)
    # How to fix CUDA, not how to avoid it: running on the CPU is the caller's choice
    # (acquire_preferred_backend names allow_reference=True when it applies).
    assert "allow_reference" not in str(error)


def test_a_namespace_package_named_cupy_is_not_mistaken_for_cupy(
    cupy_registered: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))  # no cuda.runtime
    assert _acquire_error().cause == "no-cupy"


def test_preferred_backend_falls_back_to_the_reference_and_says_so(
    cupy_registered: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert "cupy" in [r.id for r in registered_backends()]
    with caplog.at_level(logging.WARNING, logger="vyre_async.registry"):
        backend = acquire_preferred_backend(allow_reference=True)
    assert backend.id == "reference"
    (warning,) = [r.getMessage() for r in caplog.records if "cupy" in r.getMessage()]
    assert "numpy reference backend 'reference'" in warning
    assert "Fix: install CuPy" in warning and "allow_reference" not in warning
    with pytest.raises(UnsupportedFeature) as info:
        acquire_preferred_backend()
    assert "cupy" in str(info.value) and "CuPy is not installed" in str(info.value)
    assert "allow_reference=True" in str(info.value).rpartition("Fix:")[2]
