"""CUDA/CuPy/NVRTC exceptions become vyre-async errors in one place, with a Fix."""

from __future__ import annotations

import pickle

import pytest

from vyre_async.errors import (
    BackendError,
    DeviceLost,
    DeviceOutOfMemory,
    DispatchFailed,
    InvalidProgram,
    UnsupportedFeature,
)
from vyre_cupy.errors import cuda_status, is_device_lost, startup_failure, translate


class CUDARuntimeError(RuntimeError):
    """Stands in for cupy_backends.cuda.api.runtime.CUDARuntimeError (same name, .status)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"cudaError {status}")
        self.status = status


class CUDADriverError(RuntimeError):
    def __init__(self, status: int) -> None:
        super().__init__(f"CUDA_ERROR {status}")
        self.status = status


class OutOfMemoryError(MemoryError):
    """Stands in for cupy.cuda.memory.OutOfMemoryError."""


class NVRTCError(RuntimeError):
    def __init__(self, status: int) -> None:
        super().__init__(f"NVRTC_ERROR {status}")
        self.status = status


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (CUDARuntimeError(2), DeviceOutOfMemory),
        (CUDADriverError(2), DeviceOutOfMemory),
        (OutOfMemoryError("out of memory allocating 1 GiB"), DeviceOutOfMemory),
        (CUDARuntimeError(700), DeviceLost),
        (CUDADriverError(719), DeviceLost),
        (CUDARuntimeError(214), DeviceLost),
        (CUDARuntimeError(9), DispatchFailed),  # invalid configuration
        (CUDADriverError(1), DispatchFailed),  # invalid value
        (NVRTCError(2), DispatchFailed),  # not a CUDA status: never "lost"
        (ValueError("boom"), DispatchFailed),
    ],
)
def test_translate(exc: BaseException, kind: type[BackendError]) -> None:
    error = translate(exc, during="launching", device="Test GPU")
    assert type(error) is kind
    assert error.__cause__ is exc
    assert "launching" in str(error) and "Test GPU" in str(error)
    assert str(error).rpartition("\n")[2].startswith("Fix: ")
    assert error.cuda_status == cuda_status(exc)
    assert isinstance(pickle.loads(pickle.dumps(error)), kind)


def test_backend_errors_pass_through() -> None:
    original = InvalidProgram("bad", fix="fix it")
    assert translate(original, during="x") is original


def test_sticky_errors_mean_device_lost() -> None:
    assert is_device_lost(CUDARuntimeError(700))
    assert not is_device_lost(CUDARuntimeError(9))
    assert not is_device_lost(NVRTCError(700))
    assert cuda_status(ValueError()) is None
    assert cuda_status(type("E", (Exception,), {"status": True})()) is None


@pytest.mark.parametrize(
    ("exc", "stage", "detail", "cause"),
    [
        (ImportError("No module named 'cupy'"), "import", "", "no-cupy"),
        (ImportError("libcuda.so.1: cannot open shared object file"), "import", "", "no-driver"),
        (CUDARuntimeError(35), "device", "", "old-driver"),
        (CUDARuntimeError(34), "device", "", "no-driver"),
        (CUDARuntimeError(3), "device", "", "no-driver"),
        (CUDARuntimeError(100), "device", "", "no-device"),
        (None, "device", "0 device(s) found, device 0 requested", "no-device"),
        (RuntimeError("CUDA driver version is insufficient"), "device", "", "old-driver"),
    ],
)
def test_startup_failures_name_the_cause(
    exc: BaseException | None, stage: str, detail: str, cause: str
) -> None:
    error = startup_failure(exc, stage=stage, detail=detail)
    assert isinstance(error, UnsupportedFeature)
    assert error.cause == cause and error.backend_id == "cupy"
    assert "the 'cupy' backend cannot start" in str(error)
    assert str(error).rpartition("\n")[2].startswith("Fix: ")
    assert error.__cause__ is exc
