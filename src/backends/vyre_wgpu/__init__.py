"""The WebGPU backend (id ``"wgpu"``): Program → WGSL → wgpu-py on Vulkan, Metal or D3D12.

Importing this package never imports wgpu or touches a device: wgpu is
imported when a backend is created (`create_backend`, or
``vyre_async.acquire_backend("wgpu")``). See ``docs/wgpu.md``.
"""

# Private aliases only: the namespace holds nothing public but `__all__`'s names.
import typing as _typing

from vyre_async.abc import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
    from vyre_wgpu.backend import (
        ADAPTER_ENV,
        LAVAPIPE_LOOP_CAP,
        WgpuExecutor,
        create_backend,
        probe,
        select_adapter,
    )
    from vyre_wgpu.codegen import CODEGEN_VERSION, ShaderBinding, ShaderSource, generate, sanitize

__all__ = [
    "ADAPTER_ENV",
    "CODEGEN_VERSION",
    "LAVAPIPE_LOOP_CAP",
    "ShaderBinding",
    "ShaderSource",
    "WgpuExecutor",
    "create_backend",
    "generate",
    "probe",
    "sanitize",
    "select_adapter",
]

# Public name -> the submodule that defines it.
_SOURCES = {
    "ADAPTER_ENV": "backend",
    "CODEGEN_VERSION": "codegen",
    "LAVAPIPE_LOOP_CAP": "backend",
    "ShaderBinding": "codegen",
    "ShaderSource": "codegen",
    "WgpuExecutor": "backend",
    "create_backend": "backend",
    "generate": "codegen",
    "probe": "backend",
    "sanitize": "codegen",
    "select_adapter": "backend",
}


__getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, __all__)
