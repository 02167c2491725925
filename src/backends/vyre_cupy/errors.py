"""The one place where CUDA, CuPy and NVRTC exceptions become vyre-async errors.

Classification looks only at an exception's type name, its ``status`` code and
its text, so it works (and is tested) without CuPy installed. Every translated
error is raised ``from`` the original and carries the CUDA status, if any, as
``cuda_status``.

- out of memory (``cudaErrorMemoryAllocation``, CuPy's ``OutOfMemoryError``,
  pinned-memory failures) → `DeviceOutOfMemory`;
- "sticky" errors that poison the CUDA context (illegal address, launch
  failure, ECC, hardware exceptions, device unavailable) → `DeviceLost`;
- anything else raised by the runtime during a dispatch → `DispatchFailed`;
- failures while starting the backend → `UnsupportedFeature` naming the cause
  (no CuPy, no driver, no device).
"""

from __future__ import annotations

from vyre_async.abc import public_dir as _public_dir
from vyre_async.errors import (
    BackendError,
    DeviceLost,
    DeviceOutOfMemory,
    DispatchFailed,
    UnsupportedFeature,
)

__all__ = [
    "INSTALL_FIX",
    "OUT_OF_MEMORY",
    "STICKY",
    "cuda_status",
    "is_device_lost",
    "startup_failure",
    "translate",
]
__dir__ = _public_dir(__name__)

#: How to install CuPy for vyre-async. (How to run on the CPU instead is the
#: caller's to say: `acquire_preferred_backend` names ``allow_reference=True``.)
INSTALL_FIX = (
    "install CuPy for your CUDA version: pip install 'vyre-async[cuda]' (CUDA 13) or "
    "'vyre-async[cuda12]' (CUDA 12)"
)

#: cudaErrorMemoryAllocation (runtime) and CUDA_ERROR_OUT_OF_MEMORY (driver) share 2.
OUT_OF_MEMORY = frozenset({2})
#: Errors after which the CUDA context is unusable (runtime and driver share these numbers).
STICKY = frozenset(
    {
        46,  # devices unavailable (exclusive-process mode)
        214,  # uncorrectable ECC error
        215,  # NVLink uncorrectable
        700,  # illegal address
        702,  # launch timeout (watchdog)
        714,  # hardware stack error
        715,  # illegal instruction
        716,  # misaligned address
        717,  # invalid address space
        718,  # invalid PC
        719,  # launch failure
        720,  # cooperative launch too large
        999,  # unknown
    }
)
_NO_DEVICE = frozenset({100, 101})  # no device, invalid device
_BAD_DRIVER = frozenset({3, 34, 35, 803, 804})  # init error, stub library, too old, mismatch
_STARTUP_FIXES = {
    "no-cupy": INSTALL_FIX,
    "no-driver": "install or repair the NVIDIA driver (`nvidia-smi` must list the GPU)",
    "old-driver": "update the NVIDIA driver, or install the CuPy wheel built for the CUDA "
    "version your driver supports (vyre-async[cuda12] for CUDA 12 drivers)",
    "no-device": "check that a GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES)",
}


def cuda_status(exc: BaseException) -> int | None:
    """Return the CUDA status code an exception carries (CuPy's ``.status``), if any."""
    status = getattr(exc, "status", None)
    if isinstance(status, int) and not isinstance(status, bool):
        return status
    return None


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return cuda_status(exc) in OUT_OF_MEMORY and "CUDA" in type(exc).__name__


def is_device_lost(exc: BaseException) -> bool:
    """Return True when ``exc`` means the CUDA context is poisoned (a sticky error)."""
    if isinstance(exc, DeviceLost):
        return True
    return cuda_status(exc) in STICKY and "CUDA" in type(exc).__name__


def translate(exc: BaseException, *, during: str, device: str = "the GPU") -> BackendError:
    """Return the vyre-async error for ``exc``, raised while doing ``during``.

    `BackendError` instances pass through unchanged. The caller raises the result
    ``from exc`` (or hands it to ``DispatchCompleter.fail``).

    Args:
        exc: The foreign exception.
        during: What was being done, for the message ("uploading inputs").
        device: The device's name, for the message.
    """
    if isinstance(exc, BackendError):
        return exc
    status = cuda_status(exc)
    detail = f"{type(exc).__name__}: {exc}"
    if _is_oom(exc):
        error: BackendError = DeviceOutOfMemory(
            f"{device} ran out of memory while {during} ({detail})",
            fix="dispatch less data at once, free resident buffers, or lower the number of "
            "dispatches in flight",
            cuda_status=status,
        )
    elif is_device_lost(exc):
        error = DeviceLost(
            f"{device} failed while {during} and its CUDA context is no longer usable ({detail})",
            fix="restart the process (CUDA contexts cannot recover from this error); if it "
            "repeats, check the GPU with nvidia-smi and report the program's wire bytes",
            cuda_status=status,
        )
    else:
        error = DispatchFailed(
            f"CUDA error while {during} on {device} ({detail})",
            fix="check the launch limits of the device (grid, workgroup, memory); if the "
            "program is valid, report it with its wire bytes (program.to_wire())",
            cuda_status=status,
        )
    error.__cause__ = exc
    return error


def startup_failure(
    exc: BaseException | None, *, stage: str, detail: str = ""
) -> UnsupportedFeature:
    """Return the `UnsupportedFeature` explaining why the ``cupy`` backend cannot start.

    Args:
        exc: What went wrong (None when nothing was raised, e.g. zero devices).
        stage: ``"import"`` (importing CuPy) or ``"device"`` (probing the driver and devices).
        detail: Extra observed facts for the message (device counts, ordinals).

    Returns:
        The error; its ``cause`` attribute is one of ``no-cupy``, ``no-driver``,
        ``old-driver``, ``no-device``.
    """
    text = "" if exc is None else f"{type(exc).__name__}: {exc}"
    lowered = text.lower()
    status = None if exc is None else cuda_status(exc)
    if stage == "import":
        if isinstance(exc, ImportError) and "libcuda" in lowered:
            cause, what = "no-driver", "the CUDA driver library (libcuda) is missing"
        else:
            cause, what = "no-cupy", "CuPy is not installed or cannot be imported"
    elif status in _NO_DEVICE or (exc is None and "0 device" in detail):
        cause, what = "no-device", "no CUDA device is visible"
    elif status == 35 or "insufficient" in lowered or "too old" in lowered:
        cause, what = "old-driver", "the NVIDIA driver is too old for this CUDA runtime"
    elif status in _BAD_DRIVER or "driver" in lowered or "libcuda" in lowered:
        cause, what = "no-driver", "the CUDA driver is missing or not usable"
    elif exc is None:
        cause, what = "no-device", "no usable CUDA device"
    else:
        cause, what = "no-driver", "the CUDA runtime could not be initialised"
    facts = "; ".join(part for part in (detail, text) if part)
    error = UnsupportedFeature(
        f"the 'cupy' backend cannot start: {what}" + (f" ({facts})" if facts else ""),
        fix=_STARTUP_FIXES[cause],
        feature="cuda",
        cause=cause,
        backend_id="cupy",
    )
    if exc is not None:
        error.__cause__ = exc
    return error
