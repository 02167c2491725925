"""The CUDA backend on CuPy (id ``"cupy"``): Program → CUDA C → NVRTC → non-blocking streams.

Importing this package never imports CuPy or touches a device: CuPy is
imported when a backend is created (`create_backend`, or
``vyre_async.acquire_backend("cupy")``). See ``docs/cuda.md``.

The names below load on first access (PEP 562), so importing this package —
as listing backends does, to reach `vyre_cupy.registration` — imports none of
the backend, code generator or compiler either.
"""

# Private aliases only: the namespace holds nothing public but `__all__`'s names.
import typing as _typing

from vyre_async.abc import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
    from vyre_cupy.backend import CupyExecutor, create_backend
    from vyre_cupy.codegen import CODEGEN_VERSION, KernelParam, KernelSource, generate, sanitize
    from vyre_cupy.compile import NVRTC_OPTIONS, CompiledKernel
    from vyre_cupy.completion import CompletionBridge
    from vyre_cupy.device import DeviceInfo, capabilities_of
    from vyre_cupy.kernel import CudaKernel

__all__ = [
    "CODEGEN_VERSION",
    "NVRTC_OPTIONS",
    "CompiledKernel",
    "CompletionBridge",
    "CudaKernel",
    "CupyExecutor",
    "DeviceInfo",
    "KernelParam",
    "KernelSource",
    "capabilities_of",
    "create_backend",
    "generate",
    "sanitize",
]

# Public name -> the submodule that defines it.
_SOURCES = {
    "CODEGEN_VERSION": "codegen",
    "NVRTC_OPTIONS": "compile",
    "CompiledKernel": "compile",
    "CompletionBridge": "completion",
    "CudaKernel": "kernel",
    "CupyExecutor": "backend",
    "DeviceInfo": "device",
    "KernelParam": "codegen",
    "KernelSource": "codegen",
    "capabilities_of": "device",
    "create_backend": "backend",
    "generate": "codegen",
    "sanitize": "codegen",
}


__getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, __all__)
