"""vyre-async: an async-first GPU compute driver for Python.

Build a `Program`, then ``outputs = await backend.dispatch(program, inputs)``.
"""

from vyre_async._backend import CORE_OPS, VyreBackend
from vyre_async._cache import PipelineIdentity
from vyre_async._capabilities import BackendCapabilities
from vyre_async._config import DispatchConfig
from vyre_async._lazy import lazy_exports as _lazy_exports
from vyre_async._pending import (
    DispatchCompleter,
    DispatchTiming,
    PendingDispatch,
    ResultAlreadyTaken,
    wait_for_callbacks,
)
from vyre_async._pipeline import CompiledPipeline, Launch, compile
from vyre_async._registry import (
    BackendRegistration,
    acquire_backend,
    acquire_preferred_backend,
    probe_backend,
    register_backend,
    registered_backends,
)
from vyre_async._resident import ResidentBuffer
from vyre_async._store import CacheStats, MemoryPipelineCache
from vyre_async._version import __version__
from vyre_async.errors import (
    BackendClosed,
    BackendError,
    BackendNotFound,
    CooperativeResidencyExceeded,
    DeviceLost,
    DeviceOutOfMemory,
    DispatchFailed,
    DispatchTimeout,
    ErrorCode,
    InvalidArgument,
    InvalidProgram,
    KernelCompileFailed,
    PoisonedLock,
    Unknown,
    UnknownError,
    UnsupportedFeature,
)
from vyre_async.ir import Access, BufferDecl, DType, GridBarrier, Program, split_at_grid_barriers

__all__ = [
    "Access",
    "Arm",
    "ArmGraph",
    "ArmRun",
    "BackendCapabilities",
    "BackendClosed",
    "BackendError",
    "BackendNotFound",
    "BackendRegistration",
    "BufferDecl",
    "CORE_OPS",
    "CacheStats",
    "Calibration",
    "CalibrationStore",
    "CompiledPipeline",
    "ConformanceCase",
    "CooperativeResidencyExceeded",
    "DType",
    "DeviceLost",
    "DeviceOutOfMemory",
    "DiskCacheInfo",
    "DiskPipelineCache",
    "DispatchCompleter",
    "DispatchConfig",
    "DispatchFailed",
    "DispatchTimeout",
    "DispatchTiming",
    "Divergence",
    "ErrorCode",
    "GraphReport",
    "GraphResource",
    "GraphResult",
    "GridBarrier",
    "InvalidArgument",
    "InvalidProgram",
    "KernelCompileFailed",
    "Launch",
    "MemoryPipelineCache",
    "PendingDispatch",
    "PipelineCacheWarning",
    "PipelineIdentity",
    "PoisonedLock",
    "Program",
    "Residency",
    "ResidentBuffer",
    "ResultAlreadyTaken",
    "ShadowBackend",
    "Unknown",
    "UnknownError",
    "UnsupportedFeature",
    "VyreBackend",
    "__version__",
    "acquire_backend",
    "acquire_preferred_backend",
    "assert_conformance",
    "calibration_for",
    "compile",
    "default_cache_root",
    "format_calibration",
    "probe_backend",
    "register_backend",
    "registered_backends",
    "split_at_grid_barriers",
    "wait_for_callbacks",
]
# Conformance checking, arm graphs, calibration and the disk cache load on first use
# (PEP 562), not with every `import vyre_async`.
__getattr__, __dir__ = _lazy_exports(
    __name__,
    dict.fromkeys(
        ("ConformanceCase", "Divergence", "ShadowBackend", "assert_conformance"), "_shadow"
    )
    | dict.fromkeys(
        ("Arm", "ArmGraph", "ArmRun", "GraphReport", "GraphResource", "GraphResult", "Residency"),
        "_graph",
    )
    | dict.fromkeys(
        ("Calibration", "CalibrationStore", "calibration_for", "format_calibration"),
        "_calibration",
    )
    | dict.fromkeys(
        ("DiskCacheInfo", "DiskPipelineCache", "PipelineCacheWarning", "default_cache_root"),
        "_cache",
    ),
    __all__,
    # (imported with the package before they were deferred: still an attribute)
    submodules=("policies",),
)
