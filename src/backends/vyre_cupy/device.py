"""Finding the CUDA device: import CuPy lazily, probe driver and device, report capabilities.

`probe` is the only function here that imports CuPy; it runs when the backend
is created (acquired), never when backends are listed. Everything derived from
the probe (`DeviceInfo`, `capabilities_of`, fingerprints) is plain data, so it
is tested without a GPU.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from vyre_async.abc import BackendCapabilities
from vyre_async.abc import public_dir as _public_dir
from vyre_async.ir.limits import MAX_WORKGROUP_BYTES, MAX_WORKGROUP_LANES
from vyre_cupy.errors import startup_failure

__all__ = [
    "DeviceInfo",
    "capabilities_of",
    "cuda_include_dir",
    "import_cupy",
    "nvrtc_module",
    "probe",
]
__dir__ = _public_dir(__name__)

#: Counts reach kernels as u32 words, so one buffer holds at most 2**32 - 1 elements.
_MAX_BUFFER_BYTES = 4 * (2**32 - 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceInfo:
    """What the probe learned about one CUDA device and its software stack.

    Attributes:
        ordinal: CUDA device index.
        name: Device name (``"NVIDIA H100 80GB HBM3"``).
        compute_capability: ``major * 10 + minor`` (90 for sm_90).
        total_memory: Device memory in bytes.
        attributes: CUDA device attributes by CuPy's names (``MaxThreadsPerBlock``...).
        driver_version: ``cudaDriverGetVersion`` (13000 for CUDA 13.0).
        runtime_version: ``cudaRuntimeGetVersion``.
        cupy_version: ``cupy.__version__``.
        nvrtc_version: NVRTC ``(major, minor)``.
        nvrtc_archs: Real architectures NVRTC can emit a cubin for (``(75, 80, 90, ...)``).
    """

    ordinal: int
    name: str
    compute_capability: int
    total_memory: int
    attributes: Mapping[str, int] = field(default_factory=dict)
    driver_version: int = 0
    runtime_version: int = 0
    cupy_version: str = ""
    nvrtc_version: tuple[int, int] = (0, 0)
    nvrtc_archs: tuple[int, ...] = ()

    def attribute(self, name: str, default: int) -> int:
        """Return the device attribute ``name``, or ``default`` when the runtime lacks it."""
        value = self.attributes.get(name)
        return int(value) if isinstance(value, int) and value > 0 else default

    @property
    def fingerprint(self) -> str:
        """The part of the pipeline cache identity that describes this device and stack."""
        return (
            f"{self.name}|sm_{self.compute_capability}|driver {self.driver_version}|"
            f"runtime {self.runtime_version}|cupy {self.cupy_version}"
        )


def capabilities_of(info: DeviceInfo) -> BackendCapabilities:
    """Return the honest capability record of the ``cupy`` backend on this device.

    Only what the backend really does natively is True: ``async_compute``
    (dispatches run concurrently on a pool of non-blocking streams) when the
    device runs kernels concurrently; ``persistent_threads`` (a batch of launches
    as one launch of the program's batch kernel) and ``graph_replay`` (CUDA
    graphs captured per launch shape), see `vyre_cupy.batch`; ``grid_sync`` when
    the device supports cooperative launches (``CooperativeLaunch``), which run
    a grid-barrier program as ONE kernel (`vyre_cupy.grid`). No subgroup ops or
    half precision: the backend has no native path for them. Limits are the
    device's, capped by the IR's own limits.
    """
    lanes = min(info.attribute("MaxThreadsPerBlock", 1024), MAX_WORKGROUP_LANES)
    shared = min(info.attribute("MaxSharedMemoryPerBlock", 48 * 1024), MAX_WORKGROUP_BYTES)
    return BackendCapabilities(
        async_compute=info.attribute("ConcurrentKernels", 0) > 0,
        max_workgroup_size=(
            min(info.attribute("MaxBlockDimX", 1024), lanes),
            min(info.attribute("MaxBlockDimY", 1024), lanes),
            min(info.attribute("MaxBlockDimZ", 64), lanes),
        ),
        max_workgroup_lanes=lanes,
        max_storage_buffer_bytes=min(info.total_memory, _MAX_BUFFER_BYTES),
        max_workgroup_memory_bytes=shared,
        subgroup_size=info.attribute("WarpSize", 32),
        device_name=info.name,
        persistent_threads=True,
        graph_replay=True,
        grid_sync=info.attribute("CooperativeLaunch", 0) > 0,
        ordered_resident_buffers=True,  # stream waits on each buffer's last events
    )


def import_cupy() -> ModuleType:
    """Import CuPy (the only import of it in this package, done lazily).

    Raises:
        UnsupportedFeature: CuPy is missing or broken (cause ``no-cupy``), or its
            import failed for lack of the CUDA driver library (cause ``no-driver``).
    """
    try:
        module = importlib.import_module("cupy")
        module.cuda.runtime  # noqa: B018 - a namespace package or stub has no cuda.runtime
    except Exception as exc:
        raise startup_failure(exc, stage="import") from exc
    return module


def probe(ordinal: int = 0) -> tuple[ModuleType, DeviceInfo]:
    """Import CuPy and describe CUDA device ``ordinal``.

    Returns:
        The ``cupy`` module and the device description.

    Raises:
        UnsupportedFeature: no CuPy, no usable driver, or no such device; the
            message names the cause and a fix.
    """
    cupy = import_cupy()
    runtime: Any = cupy.cuda.runtime
    try:
        count = int(runtime.getDeviceCount())
    except Exception as exc:
        raise startup_failure(exc, stage="device") from exc
    if count <= ordinal:
        raise startup_failure(
            None, stage="device", detail=f"{count} device(s) found, device {ordinal} requested"
        )
    try:
        props = runtime.getDeviceProperties(ordinal)
        raw_name = props.get("name", b"")
        name = raw_name.decode(errors="replace") if isinstance(raw_name, bytes) else str(raw_name)
        attributes = dict(cupy.cuda.Device(ordinal).attributes)
        nvrtc = nvrtc_module(cupy)
        nvrtc_version = tuple(int(v) for v in nvrtc.getVersion())
        try:
            archs = tuple(sorted(int(a) for a in nvrtc.getSupportedArchs()))
        except Exception:  # NVRTC older than 11.2 cannot list them
            archs = ()
        info = DeviceInfo(
            ordinal=ordinal,
            name=name,
            compute_capability=int(props.get("major", 0)) * 10 + int(props.get("minor", 0)),
            total_memory=int(props.get("totalGlobalMem", 0)),
            attributes={k: int(v) for k, v in attributes.items() if isinstance(v, int)},
            driver_version=int(runtime.driverGetVersion()),
            runtime_version=int(runtime.runtimeGetVersion()),
            cupy_version=str(cupy.__version__),
            nvrtc_version=(nvrtc_version[0], nvrtc_version[1]),
            nvrtc_archs=archs,
        )
    except Exception as exc:
        raise startup_failure(exc, stage="device", detail=f"probing device {ordinal}") from exc
    return cupy, info


def cuda_include_dir(cupy: Any) -> str | None:
    """Return a folder holding CUDA's ``cooperative_groups.h`` (NVRTC's ``-I``), or None.

    Looks in ``$CUDA_PATH``, ``$CUDA_HOME``, ``cupy.cuda.get_cuda_path()``, the
    NVIDIA header wheels (``nvidia/cuda_runtime``, ``nvidia/cu13``) and
    ``/usr/local/cuda``, in that order.
    """
    roots = [os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME")]
    with contextlib.suppress(Exception):  # (older CuPy, or no toolkit found)
        roots.append(cupy.cuda.get_cuda_path())
    folders = [os.path.join(root, "include") for root in roots if isinstance(root, str) and root]
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    for base in (spec.submodule_search_locations or ()) if spec is not None else ():
        folders += [os.path.join(base, name, "include") for name in ("cuda_runtime", "cu13")]
    folders.append("/usr/local/cuda/include")
    for folder in folders:
        if os.path.isfile(os.path.join(folder, "cooperative_groups.h")):
            return folder
    return None


def nvrtc_module(cupy: ModuleType) -> Any:
    """Return CuPy's NVRTC bindings (``createProgram``, ``compileProgram``, ``getCUBIN``...)."""
    try:
        return importlib.import_module("cupy_backends.cuda.libs.nvrtc")
    except ImportError:  # older CuPy releases
        return importlib.import_module("cupy.cuda.nvrtc")
