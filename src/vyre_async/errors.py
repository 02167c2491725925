"""The one error hierarchy of vyre-async: `BackendError` and one subclass per `ErrorCode`.

Every message reads "what happened, with the observed values" followed by
``Fix: <one action>``. Context travels in attributes, and every exception
pickles, so errors can cross process boundaries (worker processes, a future
distributed backend) unchanged.
"""

from __future__ import annotations

import math
from enum import IntEnum
from typing import Any

from vyre_async._exports import public_dir as _public_dir

__all__ = [
    "BackendClosed",
    "BackendError",
    "BackendNotFound",
    "CooperativeResidencyExceeded",
    "DeviceLost",
    "DeviceOutOfMemory",
    "DispatchFailed",
    "DispatchTimeout",
    "ErrorCode",
    "InvalidArgument",
    "InvalidProgram",
    "KernelCompileFailed",
    "PoisonedLock",
    "Unknown",
    "UnknownError",
    "UnsupportedFeature",
    "error_for_code",
    "host_out_of_memory",
]
__dir__ = _public_dir(__name__)


class ErrorCode(IntEnum):
    """Stable numeric error codes. Append-only: a code is never renumbered or reused.

    Members carry the contract's names (``ErrorCode.InvalidProgram``); the
    UPPER_CASE spellings are aliases of the same members.
    """

    DeviceOutOfMemory = 1001
    UnsupportedFeature = 1002
    PoisonedLock = 1003
    KernelCompileFailed = 1004
    DispatchFailed = 1005
    InvalidProgram = 1006
    CooperativeResidencyExceeded = 1007
    DeviceLost = 1008
    DispatchTimeout = 1009
    BackendNotFound = 1010
    BackendClosed = 1011
    Unknown = 1999

    DEVICE_OUT_OF_MEMORY = 1001
    UNSUPPORTED_FEATURE = 1002
    POISONED_LOCK = 1003
    KERNEL_COMPILE_FAILED = 1004
    DISPATCH_FAILED = 1005
    INVALID_PROGRAM = 1006
    COOPERATIVE_RESIDENCY_EXCEEDED = 1007
    DEVICE_LOST = 1008
    DISPATCH_TIMEOUT = 1009
    BACKEND_NOT_FOUND = 1010
    BACKEND_CLOSED = 1011
    UNKNOWN = 1999


class BackendError(Exception):
    """Base of every error vyre-async raises across the driver contract.

    Args:
        message: What happened, with the observed values.
        fix: One action the user can take. Appended as ``Fix: ...`` unless the
            message already ends with a ``Fix:`` line.
        **context: Extra attributes (for example ``diagnostics`` or ``backend_id``)
            stored on the exception for programmatic handling.
    """

    code: ErrorCode = ErrorCode.UNKNOWN
    default_fix: str = "report this with the full traceback to the vyre-async maintainers"

    def __init__(self, message: str, *, fix: str | None = None, **context: Any) -> None:
        text = message.rstrip()
        if not text.rpartition("\n")[2].startswith("Fix:"):
            text = f"{text}\nFix: {fix or self.default_fix}"
        super().__init__(text)
        self.message = text
        self.context: dict[str, Any] = dict(context)
        for key, value in context.items():
            setattr(self, key, value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.context))

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[BackendError], message: str, context: dict[str, Any]) -> BackendError:
    return cls(message, **context)


class DeviceOutOfMemory(BackendError, MemoryError):
    """The device could not allocate the memory a dispatch needs."""

    code = ErrorCode.DEVICE_OUT_OF_MEMORY
    default_fix = "free resident buffers or dispatch smaller inputs"


class UnsupportedFeature(BackendError):
    """The backend does not implement a requested feature (never silently emulated)."""

    code = ErrorCode.UNSUPPORTED_FEATURE
    default_fix = "check backend.capabilities() before using the feature, or pick another backend"


class PoisonedLock(BackendError):
    """An internal lock was left inconsistent by a failure in another task.

    Reserved for backends that guard shared state with locks a failure can
    leave half-updated; the built-in backends never raise it.
    """

    code = ErrorCode.POISONED_LOCK
    default_fix = "shut the backend down and acquire it again"


class KernelCompileFailed(BackendError):
    """The backend's compiler rejected the code generated for a program."""

    code = ErrorCode.KERNEL_COMPILE_FAILED
    default_fix = "report the program's wire bytes; the generated source location is attached"


class DispatchFailed(BackendError):
    """Execution of a launched dispatch failed on the device or worker."""

    code = ErrorCode.DISPATCH_FAILED
    default_fix = "inspect the chained cause; retry after checking inputs and device health"


class InvalidProgram(BackendError, ValueError):
    """A program, its inputs or its wire bytes break the IR or dispatch rules.

    ``diagnostics`` (a tuple of `Diagnostic`) is attached when raised by validation.
    """

    code = ErrorCode.INVALID_PROGRAM
    default_fix = "correct the program or inputs as the message describes"


class InvalidArgument(InvalidProgram):
    """An argument that is not a program is out of range or of the wrong type.

    A setting, a size, a backend, a callback: neither a program nor the inputs
    it is dispatched with (those stay plain `InvalidProgram`). Code 1006 like
    its base, so every ``except InvalidProgram`` and every handler keyed on the
    code still catches it, while ``except InvalidArgument`` catches the misuse
    of an argument alone.
    """

    default_fix = "pass a value of the type and range the message names"


class CooperativeResidencyExceeded(BackendError):
    """A cooperative (grid-sync) launch needs more resident workgroups than the device holds.

    Raised only by backends with ``grid_sync`` (cupy, when a cooperative launch's
    grid cannot all be resident on the device at once); backends without
    ``grid_sync`` reject ``DispatchConfig(cooperative=True)`` with
    `UnsupportedFeature`.
    """

    code = ErrorCode.COOPERATIVE_RESIDENCY_EXCEEDED
    default_fix = "lower the grid size or the per-workgroup resources of the program"


class DeviceLost(BackendError):
    """The device stopped responding or was reset; in-flight work is lost."""

    code = ErrorCode.DEVICE_LOST
    default_fix = (
        "close the backend and create a new one (after a CUDA sticky error, restart the process)"
    )


class DispatchTimeout(BackendError, TimeoutError):
    """A dispatch exceeded `DispatchConfig.timeout`, counted from ``dispatch()``."""

    code = ErrorCode.DISPATCH_TIMEOUT
    default_fix = "raise DispatchConfig.timeout or split the work into smaller dispatches"


class BackendNotFound(BackendError, LookupError):
    """No backend with the requested id is installed; the message lists the installed ones."""

    code = ErrorCode.BACKEND_NOT_FOUND
    default_fix = "install the package that provides the backend, or use one of the listed ids"


class BackendClosed(BackendError):
    """An operation was asked of a backend that was closed (`VyreBackend.aclose`)."""

    code = ErrorCode.BACKEND_CLOSED
    default_fix = (
        "acquire a fresh backend: vyre_async.acquire_backend(id) builds a new one after "
        "close, or construct a new instance"
    )


class UnknownError(BackendError):
    """An error that fits no other code (code ``Unknown``, 1999)."""

    code = ErrorCode.UNKNOWN


Unknown = UnknownError


_BY_CODE: dict[ErrorCode, type[BackendError]] = {
    cls.code: cls
    for cls in (
        DeviceOutOfMemory,
        UnsupportedFeature,
        PoisonedLock,
        KernelCompileFailed,
        DispatchFailed,
        InvalidProgram,
        CooperativeResidencyExceeded,
        DeviceLost,
        DispatchTimeout,
        BackendNotFound,
        BackendClosed,
        UnknownError,
    )
}


def error_for_code(code: ErrorCode | int) -> type[BackendError]:
    """Return the exception class for a numeric error code.

    Raises:
        ValueError: ``code`` is not a known `ErrorCode`.
    """
    return _BY_CODE[ErrorCode(code)]


def host_out_of_memory(nbytes: float, doing: str) -> DeviceOutOfMemory:
    """Return the error for host memory running out while ``doing`` (about ``nbytes`` needed).

    Backends raise it ``from`` the `MemoryError` they caught: the reference
    backend's "device" is host memory, and every backend stages inputs there.
    """
    size = f"about {nbytes / 2**30:.2f} GiB" if math.isfinite(nbytes) else "more memory"
    return DeviceOutOfMemory(
        f"the host ran out of memory {doing} ({size} needed)",
        fix="dispatch smaller inputs, free resident buffers, or free host memory",
        nbytes=nbytes,
    )
