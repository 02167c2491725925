"""vyre-async: an async-first GPU compute driver for Python.

Build a `Program`, validate it, and ``await backend.dispatch(program, inputs)``.
"""

from vyre_async._version import __version__
from vyre_async.errors import (
    BackendError,
    BackendNotFound,
    CooperativeResidencyExceeded,
    DeviceLost,
    DeviceOutOfMemory,
    DispatchFailed,
    DispatchTimeout,
    ErrorCode,
    InvalidProgram,
    KernelCompileFailed,
    PoisonedLock,
    Unknown,
    UnknownError,
    UnsupportedFeature,
)
from vyre_async.ir import (
    Access,
    BufferDecl,
    DType,
    Program,
)

__all__ = [
    "Access",
    "BackendError",
    "BackendNotFound",
    "BufferDecl",
    "CooperativeResidencyExceeded",
    "DType",
    "DeviceLost",
    "DeviceOutOfMemory",
    "DispatchFailed",
    "DispatchTimeout",
    "ErrorCode",
    "InvalidProgram",
    "KernelCompileFailed",
    "PoisonedLock",
    "Program",
    "Unknown",
    "UnknownError",
    "UnsupportedFeature",
    "__version__",
]
