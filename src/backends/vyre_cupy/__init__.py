"""The CUDA backend on CuPy (id ``"cupy"``): Program → CUDA C → NVRTC → non-blocking streams.

Importing this package never imports CuPy or touches a device: CuPy is
imported when a backend is created (`create_backend`, or
``vyre_async.acquire_backend("cupy")``). See ``docs/cuda.md``.
"""

from vyre_cupy.backend import CudaKernel, CupyBackend, create_backend
from vyre_cupy.codegen import CODEGEN_VERSION, KernelParam, KernelSource, generate, sanitize
from vyre_cupy.compile import NVRTC_OPTIONS, CompiledKernel
from vyre_cupy.completion import CompletionBridge
from vyre_cupy.device import DeviceInfo, capabilities_of

__all__ = [
    "CODEGEN_VERSION",
    "NVRTC_OPTIONS",
    "CompiledKernel",
    "CompletionBridge",
    "CudaKernel",
    "CupyBackend",
    "DeviceInfo",
    "KernelParam",
    "KernelSource",
    "capabilities_of",
    "create_backend",
    "generate",
    "sanitize",
]
