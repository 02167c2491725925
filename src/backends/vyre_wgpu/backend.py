"""The WebGPU executor: WGSL on Vulkan, Metal or D3D12 through wgpu-py.

One device per executor, and one **device thread** per device that does
everything that can block: writing inputs, submitting, and mapping the
read-back buffer. On lavapipe a submit waits for the previous submission and
a read map submits first, so any of them on the event loop could stall it for
the length of a kernel; here the loop only hands a job to the thread.

A dispatch takes a pooled buffer set of its launch shape: the inputs written
with ``queue.write_buffer``, WRITE buffers zero-filled with ``clear_buffer``,
one compute pass, one copy of every output into the submission's read-back
buffer. ``dispatch_batch`` records all its launches in one command buffer and
submits once, and so does the device thread for every dispatch queued while it
was busy (up to 64 launches or 64 MiB of outputs): one submit, one map. A
grid wider than the adapter's ``max-compute-workgroups-per-dimension`` runs
as several launches of one pass, each told its workgroup offset
(``vy_info.base``).

Lavapipe (Mesa's CPU Vulkan driver) ends every loop of an invocation after
65 535 iterations in all. On that adapter a program without barriers or
workgroup memory whose loops outlast that is rerun in resumable slices
(`vyre_wgpu.codegen.generate`, `_run_sliced`); other programs carry a loop
guard, and a dispatch whose loop was cut fails with `UnsupportedFeature`
instead of returning wrong outputs.

WebGPU has no grid-wide barrier. A program with `GridBarrier` statements runs
as its segments (`vyre_async.split_at_grid_barriers`): one shader and compute
pipeline per segment, all over one bind group layout, dispatched in order in one
compute pass of the dispatch's command buffer (WebGPU orders the dispatches of a
pass and makes one's storage writes visible to the next), on the same buffers,
with one read-back at the end.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import blake3
import numpy as np

from vyre_async.abc import (
    BackendCapabilities,
    BindingPlan,
    DispatchConfig,
    Executor,
    Launch,
    poll_until,
)
from vyre_async.abc import public_dir as _public_dir
from vyre_async.errors import (
    BackendClosed,
    BackendError,
    DeviceOutOfMemory,
    DispatchFailed,
    DispatchTimeout,
    KernelCompileFailed,
    UnsupportedFeature,
)
from vyre_async.ir.expr import Atomic, BufLen, Load
from vyre_async.ir.ops import CORE_OPS, GRID_BARRIER_OP
from vyre_async.ir.program import Program
from vyre_async.ir.split import split_at_grid_barriers
from vyre_async.ir.stmt import Store
from vyre_async.ir.types import Access, BufferDecl
from vyre_async.ir.walk import iter_exprs, iter_stmts, ops_used
from vyre_wgpu.codegen import (
    CODEGEN_VERSION,
    ENTRY,
    STATE_HEADER_WORDS,
    ShaderBinding,
    ShaderSource,
    generate,
)
from vyre_wgpu.prelude import PRELUDE_DIGEST

if TYPE_CHECKING:
    from vyre_async.abc import ExecutionDecision, VyreBackend

__all__ = [
    "ADAPTER_ENV",
    "LAVAPIPE_LOOP_CAP",
    "WgpuExecutor",
    "create_backend",
    "probe",
    "select_adapter",
]
__dir__ = _public_dir(__name__)

_log = logging.getLogger("vyre_async.wgpu")

#: blake3 of the code generator's source: a change to it is a new cache identity even
#: when nobody bumps `CODEGEN_VERSION` (the disk cache keeps generated WGSL).
_CODEGEN_DIGEST = blake3.blake3((Path(__file__).parent / "codegen.py").read_bytes()).hexdigest()[
    :16
]
#: The executor's version (part of every cache identity).
VERSION = "0.1.0"
#: Environment setting that picks the adapter: ``gpu`` (hardware only), ``cpu``
#: (a CPU adapter such as lavapipe only) or ``any`` (hardware first, then CPU).
ADAPTER_ENV = "VYRE_WGPU_ADAPTER"
#: Loop iterations lavapipe runs per invocation, all loops together, before it
#: silently ends them (Mesa's ``LP_MAX_TGSI_LOOP_ITERATIONS``).
LAVAPIPE_LOOP_CAP = 65_535
#: GPU APIs whose integer semantics the generated WGSL relies on. OpenGL/GLES
#: (wgpu's fallback) is left out: Mesa's GL gets integer remainders wrong.
_BACKENDS = ("Vulkan", "Metal", "D3D12")
_HARDWARE = ("DiscreteGPU", "IntegratedGPU", "VirtualGPU")
_DRIVER_FIX = (
    "install a Vulkan driver: your GPU vendor's, or Mesa's CPU driver lavapipe for tests "
    "(Debian/Ubuntu: apt-get install mesa-vulkan-drivers libvulkan1); on macOS and Windows "
    "wgpu uses Metal and D3D12"
)
_INSTALL_FIX = "pip install 'vyre-async[wgpu]' (wgpu-py, which bundles wgpu-native)"

#: Most launches the device thread records into one submission (a batch may bring more),
#: and the read-back bytes past which it stops adding queued ones.
_COALESCE = 64
_COALESCE_BYTES = 64 << 20
#: Idle buffer sets kept per launch shape: as many as one submission holds for a small
#: shape (up to `_SMALL_SET` bytes of buffers), a few for a large one.
_POOL = 64
_POOL_LARGE = 4
_SMALL_SET = 1 << 20
#: Limits requested from the adapter (its own maxima, not WebGPU's defaults).
_LIMITS = (
    "max-storage-buffer-binding-size",
    "max-buffer-size",
    "max-storage-buffers-per-shader-stage",
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
    "max-compute-workgroup-size-y",
    "max-compute-workgroup-size-z",
    "max-compute-workgroups-per-dimension",
    "max-bindings-per-bind-group",
)


def _import_wgpu() -> Any:
    try:
        import wgpu
    except ImportError as exc:
        raise UnsupportedFeature(
            f"the wgpu backend needs wgpu-py, which is not installed ({exc})",
            fix=_INSTALL_FIX,
            feature="wgpu",
        ) from exc
    return wgpu


def _adapter_choice(adapter: str | None) -> str:
    choice = (adapter or os.environ.get(ADAPTER_ENV) or "any").strip().lower()
    if choice not in ("gpu", "cpu", "any"):
        raise UnsupportedFeature(
            f"{ADAPTER_ENV}={choice!r} is not an adapter choice",
            fix=f"set {ADAPTER_ENV} to gpu, cpu or any (or leave it unset: any)",
            feature="wgpu adapter",
        )
    return choice


def select_adapter(adapter: str | None = None) -> Any:
    """Return the wgpu adapter this machine offers for compute, best first.

    Hardware adapters (discrete, then integrated) come before CPU ones; a CPU
    adapter is taken only when ``adapter`` (or `ADAPTER_ENV`) is ``cpu`` or
    ``any``. Only Vulkan, Metal and D3D12 adapters are considered.

    Raises:
        UnsupportedFeature: wgpu-py is missing, or no adapter qualifies (the Fix
            names the driver package).
    """
    wgpu = _import_wgpu()
    choice = _adapter_choice(adapter)
    _runtime_dir()
    try:
        found = list(wgpu.gpu.enumerate_adapters_sync())
    except Exception as exc:
        raise UnsupportedFeature(
            f"wgpu could not list adapters: {type(exc).__name__}: {exc}",
            fix=_DRIVER_FIX,
            feature="wgpu adapter",
        ) from exc
    seen = [
        f"{a.info.get('device', '?')} ({a.info.get('backend_type', '?')}, "
        f"{a.info.get('adapter_type', '?')})"
        for a in found
    ]
    usable = [a for a in found if a.info.get("backend_type") in _BACKENDS]
    hardware = [a for a in usable if a.info.get("adapter_type") in _HARDWARE]
    cpu = [a for a in usable if a.info.get("adapter_type") not in _HARDWARE]
    hardware.sort(key=lambda a: _HARDWARE.index(a.info.get("adapter_type")))
    ranked = {"gpu": hardware, "cpu": cpu, "any": hardware + cpu}[choice]
    if ranked:
        return ranked[0]
    what = {"gpu": "hardware GPU", "cpu": "CPU", "any": "Vulkan, Metal or D3D12"}[choice]
    fix = _DRIVER_FIX
    if choice == "gpu" and cpu:
        fix = f"set {ADAPTER_ENV}=cpu to run on the CPU adapter, or {_DRIVER_FIX}"
    raise UnsupportedFeature(
        f"no {what} adapter found (adapters seen: {', '.join(seen) or 'none'})",
        fix=fix,
        feature="wgpu adapter",
    )


def _runtime_dir() -> None:
    """Give Mesa's drivers a runtime and shader-cache directory when the user set none."""
    if not os.environ.get("XDG_RUNTIME_DIR"):
        import tempfile

        runtime = os.path.join(tempfile.gettempdir(), f"vyre-xdg-{os.getuid()}")
        os.makedirs(runtime, mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = runtime
    if not os.environ.get("MESA_SHADER_CACHE_DIR"):
        from vyre_async.abc import default_cache_root

        path = default_cache_root() / "mesa"
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:  # a read-only home: Mesa then keeps its own default
            return
        os.environ["MESA_SHADER_CACHE_DIR"] = str(path)


def probe() -> dict[str, str]:
    """Return the adapter `create_backend` would use, without creating a device.

    Raises:
        UnsupportedFeature: see `select_adapter`.
    """
    return dict(select_adapter().info)


def create_backend(*, adapter: str | None = None, **kwargs: Any) -> VyreBackend:
    """Build the ``wgpu`` backend: ``VyreBackend(WgpuExecutor(adapter=adapter), **kwargs)``.

    The registry's factory.

    Args:
        adapter: ``gpu``, ``cpu`` or ``any`` (default: `ADAPTER_ENV`, else ``any``).
        **kwargs: Passed to `VyreBackend`.

    Raises:
        UnsupportedFeature: no wgpu-py or no adapter (the Fix says what to install).
    """
    from vyre_async.abc import VyreBackend

    return VyreBackend(WgpuExecutor(adapter=adapter), **kwargs)


@dataclass(slots=True)
class _Native:
    """A compiled program: its shaders, modules and bind group layout; pipelines by workgroup.

    A program without grid barriers has one shader (``shaders == (shader,)``). One
    with grid barriers (``segmented``) has one shader per segment of
    `split_at_grid_barriers`, in order, all over one bind group layout: ``shader``
    then describes the bindings they share (the status and lane-state words when
    any segment uses them, the largest lane record) and holds every segment's WGSL.
    """

    shader: ShaderSource
    shaders: tuple[ShaderSource, ...]
    modules: tuple[Any, ...]
    group_layout: Any
    layout: Any
    segmented: bool = False
    #: One compute pipeline per shader, by workgroup size.
    pipelines: dict[tuple[int, int, int], tuple[Any, ...]] = field(default_factory=dict)


@dataclass(slots=True)
class _Shape:
    """What one launch shape fixes: pipeline, sizes, the info block, the read-back layout."""

    pipeline: Any
    sizes: tuple[int, ...]  # bytes of each storage binding (>= 4)
    #: A program with grid barriers: every segment's pipeline, in order (``pipeline``
    #: is the first); None for every other program (one pipeline).
    segments: tuple[Any, ...] | None
    #: One (workgroup offset, workgroup counts, info block) per launch of the grid: a
    #: grid wider than the adapter's workgroups per dimension runs as several launches.
    chunks: tuple[tuple[tuple[int, int, int], tuple[int, int, int], bytes], ...]
    outputs: tuple[tuple[int, int, int, Any], ...]  # (binding, offset, nbytes, dtype)
    readback_bytes: int
    status_offset: int | None
    #: (binding, input position) of every input written before a launch, and the
    #: bindings zero-filled before it (WRITE buffers start at zero).
    writes: tuple[tuple[int, int], ...] = ()
    clears: tuple[int, ...] = ()
    info_buffers: list[Any] | None = None
    #: Idle buffer sets of this shape, reused by later launches (at most ``pool_size``:
    #: `_POOL` sets of a small shape, `_POOL_LARGE` of one over `_SMALL_SET` bytes).
    pool: list[_Bound] = field(default_factory=list)
    pool_size: int = 4


@dataclass(slots=True)
class _Bound:
    """One launch's buffers, bind group and read-back buffer."""

    groups: list[Any]  # one bind group per chunk of the grid
    buffers: list[Any]
    status: Any
    state: Any
    #: Programs with grid barriers: the host-side interval (``time.time_ns()``) in which
    #: each segment's launches were recorded, in order, while spans want phases.
    phases: list[tuple[int, int]] | None = None


def _trimmed(segment: Program) -> Program:
    """``segment`` without the WORKGROUP buffers its body never names.

    They are not bindings (the storage bindings stay as they are), and each segment
    starts with zeroed workgroup memory, so one it does not touch is dead weight: its
    shader would zero-fill it, and a declared one keeps lavapipe's loops from being
    sliced (`vyre_wgpu.codegen.generate`).
    """
    shared = {decl.name for decl in segment.workgroup_buffers}
    if not shared:
        return segment
    named = {stmt.buffer for stmt in iter_stmts(segment.body) if isinstance(stmt, Store)}
    named.update(
        expr.buffer for expr in iter_exprs(segment.body) if isinstance(expr, Load | BufLen | Atomic)
    )
    if shared <= named:
        return segment
    kept = [d for d in segment.buffers if d.access is not Access.WORKGROUP or d.name in named]
    return Program(kept, segment.workgroup_size, segment.body, segment.op_id)


def _shared_interface(shaders: tuple[ShaderSource, ...]) -> ShaderSource:
    """What the segments of one program share: its bindings, and every segment's WGSL.

    The storage bindings and ``vy_info`` are the same in every segment (the same
    buffers); the status and lane-state words are bound when any segment uses them,
    and the lane record is the largest segment's.
    """
    first = shaders[0]
    count = len(shaders)
    return replace(
        first,
        source="".join(
            f"// ---- segment {i + 1} of {count} ----\n{shader.source}"
            for i, shader in enumerate(shaders)
        ),
        status_binding=next(
            (s.status_binding for s in shaders if s.status_binding is not None), None
        ),
        state_binding=next((s.state_binding for s in shaders if s.state_binding is not None), None),
        state_words=max(s.state_words for s in shaders),
        workgroup_bytes=max(s.workgroup_bytes for s in shaders),
        uses_barrier=any(s.uses_barrier for s in shaders),
    )


def _shader_record(shader: ShaderSource) -> dict[str, Any]:
    return {
        "source": shader.source,
        "bindings": [
            [
                b.index,
                b.name,
                b.decl.name,
                b.decl.binding,
                b.decl.access.value,
                b.decl.dtype.value,
                b.decl.count,
                b.atomic,
            ]
            for b in shader.bindings
        ],
        "info_binding": shader.info_binding,
        "info_words": shader.info_words,
        "status_binding": shader.status_binding,
        "state_binding": shader.state_binding,
        "state_words": shader.state_words,
        "workgroup_size": list(shader.workgroup_size),
        "workgroup_bytes": shader.workgroup_bytes,
        "uses_barrier": shader.uses_barrier,
    }


def _shader_from_record(record: dict[str, Any]) -> ShaderSource:
    bindings = tuple(
        ShaderBinding(
            index=index,
            name=name,
            decl=BufferDecl(decl_name, binding, access, dtype, count),
            atomic=atomic,
        )
        for index, name, decl_name, binding, access, dtype, count, atomic in record["bindings"]
    )
    return ShaderSource(
        source=record["source"],
        bindings=bindings,
        info_binding=record["info_binding"],
        info_words=record["info_words"],
        status_binding=record["status_binding"],
        state_binding=record["state_binding"],
        state_words=record["state_words"],
        workgroup_size=tuple(record["workgroup_size"]),
        workgroup_bytes=record["workgroup_bytes"],
        uses_barrier=record["uses_barrier"],
    )


def _status(raw: np.ndarray, offset: int) -> int:
    return int(raw[offset : offset + 4].view(np.uint32)[0])


def _outputs(raw: np.ndarray, shape: _Shape, shared: bool = False) -> list[np.ndarray]:
    """The launch's outputs: views of its read-back bytes, copied when other launches'
    outputs share them (so a kept result does not keep a whole submission's bytes alive)."""
    outputs = [raw[o : o + n].view(dtype) for _, o, n, dtype in shape.outputs]
    return [out.copy() for out in outputs] if shared else outputs


class WgpuExecutor(Executor):
    """Runs programs as WGSL compute shaders on one wgpu device.

    Args:
        adapter: ``gpu``, ``cpu`` or ``any`` (see `select_adapter`).
    """

    id = "wgpu"
    version = VERSION

    def __init__(self, *, adapter: str | None = None) -> None:
        self._wgpu = _import_wgpu()
        wgpu = self._wgpu
        self._adapter = select_adapter(adapter)
        info = dict(self._adapter.info)
        self.adapter_info = info
        self.cpu_adapter = info.get("adapter_type") not in _HARDWARE
        device = str(info.get("device", ""))
        self.loop_cap = LAVAPIPE_LOOP_CAP if "llvmpipe" in device else None
        #: Loop-bound tests per lane per slice: the cap shared by one SIMD vector of
        #: lanes ("llvmpipe (LLVM 15.0.6, 256 bits)": 8 lanes; 16 when not said), less
        #: a margin.
        bits = re.search(r"(\d+) bits", device)
        lanes = max(1, int(bits.group(1)) // 32) if bits else 16
        self.slice_budget = max(64, (LAVAPIPE_LOOP_CAP - 1_000) // lanes)
        limits = dict(self._adapter.limits)
        required = {k: limits[k] for k in _LIMITS if k in limits}
        try:
            self._device = self._adapter.request_device_sync(required_limits=required)
        except Exception as exc:
            raise UnsupportedFeature(
                f"wgpu could not open a device on {info.get('device')!r}: {exc}",
                fix=_DRIVER_FIX,
                feature="wgpu device",
            ) from exc
        self._limits = dict(self._device.limits)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._lost = False
        self._in_flight = 0
        self._count_lock = threading.Lock()
        #: The launches of the submission the device thread is running.
        self._running: list[Launch] = []
        #: Idle read-back buffers by size (the device thread's own).
        self._idle_readbacks: dict[int, list[Any]] = {}
        self._usage_storage = (
            wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        )
        self._usage_readback = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
        self._usage_uniform = wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST
        self._thread = threading.Thread(target=self._run, name="vyre-wgpu-device", daemon=True)
        self._thread.start()

    # Identity and description ------------------------------------------------------
    def supported_ops(self) -> frozenset[str]:
        """Every core operation, the grid-wide barrier included (run as one launch per segment)."""
        return CORE_OPS

    def capabilities(self) -> BackendCapabilities:
        lim = self._limits
        kind = "CPU adapter" if self.cpu_adapter else str(self.adapter_info.get("adapter_type"))
        return BackendCapabilities(
            async_compute=False,  # one queue: dispatches run one after another
            max_workgroup_size=(
                int(lim["max-compute-workgroup-size-x"]),
                int(lim["max-compute-workgroup-size-y"]),
                int(lim["max-compute-workgroup-size-z"]),
            ),
            max_workgroup_lanes=int(lim["max-compute-invocations-per-workgroup"]),
            max_storage_buffer_bytes=int(lim["max-storage-buffer-binding-size"]),
            max_workgroup_memory_bytes=int(lim["max-compute-workgroup-storage-size"]),
            # Every buffer is a storage binding, and vy_status and vy_state may take two.
            max_storage_buffers=max(1, int(lim["max-storage-buffers-per-shader-stage"]) - 2),
            # Wider grids run as several launches (plan_shape): no limit to report.
            max_grid_size=None,
            device_name=f"{self.adapter_info.get('device', '?')} "
            f"({self.adapter_info.get('backend_type', '?')}, {kind})",
            cpu_device=self.cpu_adapter,
        )

    def device_fingerprint(self) -> str:
        info = self.adapter_info
        return "|".join(
            str(info.get(k, ""))
            for k in ("vendor", "device", "description", "backend_type", "adapter_type")
        )

    def compiler_fingerprint(self) -> str:
        return (
            f"wgpu-py {self._wgpu.__version__}; codegen {CODEGEN_VERSION} {_CODEGEN_DIGEST}; "
            f"prelude {PRELUDE_DIGEST}; loop guard {self.loop_cap is not None}; "
            f"slice budget {self.slice_budget}"
        )

    # Pipelines ---------------------------------------------------------------------
    def build_pipeline(self, program: Program, config: DispatchConfig) -> _Native:
        """Generate and compile the WGSL of ``program``: one shader, or one per segment.

        A program with grid barriers gets one shader per segment of
        `split_at_grid_barriers` (each without the WORKGROUP buffers it never
        touches, which are zero at its start anyway), compiled over one bind group
        layout; the driver caches the result under ``program``'s own identity.
        """
        guard = self.loop_cap is not None
        if GRID_BARRIER_OP not in ops_used(program):
            shader = generate(program, loop_guard=guard, slice_budget=self.slice_budget)
            native = self._compile((shader,))
        else:
            native = self._compile(
                tuple(
                    generate(_trimmed(segment), loop_guard=guard, slice_budget=self.slice_budget)
                    for segment in split_at_grid_barriers(program)
                ),
                segmented=True,
            )
        self._pipelines(native, native.shader.workgroup_size)  # (lavapipe: LLVM at first launch)
        return native

    def _compile(self, shaders: tuple[ShaderSource, ...], *, segmented: bool = False) -> _Native:
        wgpu = self._wgpu
        device = self._device
        modules = []
        for shader in shaders:
            try:
                modules.append(device.create_shader_module(code=shader.source))
            except Exception as exc:
                raise KernelCompileFailed(
                    f"wgpu rejected the generated WGSL: {exc}",
                    fix="report the program's wire bytes to the vyre-async maintainers: "
                    "generated code must always compile",
                    source=shader.source,
                ) from exc
        shader = _shared_interface(shaders) if segmented else shaders[0]
        entries = []
        for binding in shader.bindings:
            kind = (
                wgpu.BufferBindingType.read_only_storage
                if binding.decl.access in (Access.READ, Access.UNIFORM)
                else wgpu.BufferBindingType.storage
            )
            entries.append(
                {
                    "binding": binding.index,
                    "visibility": wgpu.ShaderStage.COMPUTE,
                    "buffer": {"type": kind},
                }
            )
        entries.append(
            {
                "binding": shader.info_binding,
                "visibility": wgpu.ShaderStage.COMPUTE,
                "buffer": {"type": wgpu.BufferBindingType.uniform},
            }
        )
        for extra in (shader.status_binding, shader.state_binding):
            if extra is not None:
                entries.append(
                    {
                        "binding": extra,
                        "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": wgpu.BufferBindingType.storage},
                    }
                )
        # One layout for every segment: a segment that does not use the status or
        # lane-state word simply leaves that entry of the layout unused.
        group_layout = device.create_bind_group_layout(entries=entries)
        layout = device.create_pipeline_layout(bind_group_layouts=[group_layout])
        return _Native(
            shader=shader,
            shaders=shaders,
            modules=tuple(modules),
            group_layout=group_layout,
            layout=layout,
            segmented=segmented,
        )

    def _pipelines(self, native: _Native, workgroup: tuple[int, int, int]) -> tuple[Any, ...]:
        """The compute pipelines of ``native`` (one per shader) for one workgroup size.

        Drivers compile here or at the pipeline's first launch (lavapipe: LLVM at the
        first launch, so its cost shows in the first dispatch).
        """
        pipelines = native.pipelines.get(workgroup)
        if pipelines is None:
            constants = {"vy_wx": workgroup[0], "vy_wy": workgroup[1], "vy_wz": workgroup[2]}
            built = []
            for module in native.modules:
                try:
                    built.append(
                        self._device.create_compute_pipeline(
                            layout=native.layout,
                            compute={
                                "module": module,
                                "entry_point": ENTRY,
                                "constants": constants,
                            },
                        )
                    )
                except Exception as exc:
                    raise KernelCompileFailed(
                        f"wgpu could not build the compute pipeline for workgroup {workgroup}: "
                        f"{exc}",
                        fix="report the program's wire bytes to the vyre-async maintainers",
                    ) from exc
            pipelines = native.pipelines[workgroup] = tuple(built)
        return pipelines

    def serialize_pipeline(self, native: Any) -> bytes | None:
        """The WGSL and its reflection (bindings, blocks, sizes): all WebGPU lets one keep.

        A program with grid barriers keeps every segment's (``{"segments": [...]}``).
        The driver's compiled form is not reachable through WebGPU; Mesa keeps
        its own shader cache (``MESA_SHADER_CACHE_DIR``, under vyre's cache
        directory unless you set it).
        """
        record: dict[str, Any]
        if native.segmented:
            record = {"segments": [_shader_record(shader) for shader in native.shaders]}
        else:
            record = _shader_record(native.shader)
        return json.dumps(record, separators=(",", ":")).encode()

    def load_pipeline(self, payload: bytes, program: Program, config: DispatchConfig) -> _Native:
        """Rebuild a pipeline from `serialize_pipeline` bytes (the disk cache)."""
        record = json.loads(payload)
        if "segments" in record:
            native = self._compile(
                tuple(_shader_from_record(part) for part in record["segments"]), segmented=True
            )
        else:
            native = self._compile((_shader_from_record(record),))
        self._pipelines(native, native.shader.workgroup_size)
        return native

    # Dispatch ----------------------------------------------------------------------
    def plan_shape(self, native: Any, plan: BindingPlan, config: DispatchConfig) -> _Shape:
        shader: ShaderSource = native.shader
        pipelines = self._pipelines(native, plan.geometry.workgroup)
        counts = dict(zip((d.name for d in plan.program.buffers), plan.counts, strict=True))
        lens = [counts[b.name] for b in shader.bindings]
        words = np.zeros(shader.info_words, np.uint32)
        words[: len(lens)] = lens
        grid = plan.geometry.grid
        words[shader.info_words - 4 : shader.info_words - 1] = grid
        step = int(self._limits.get("max-compute-workgroups-per-dimension", 65_535))
        chunks = []
        for z in range(0, max(grid[2], 1), step):
            for y in range(0, max(grid[1], 1), step):
                for x in range(0, max(grid[0], 1), step):
                    base = (x, y, z)
                    counts3 = (
                        min(step, grid[0] - x),
                        min(step, grid[1] - y),
                        min(step, grid[2] - z),
                    )
                    words[shader.info_words - 8 : shader.info_words - 5] = base
                    chunks.append((base, counts3, words.tobytes()))
        sizes = tuple(max(4, 4 * n) for n in lens)
        outputs = []
        offset = 0
        by_name = {b.name: b for b in shader.bindings}
        for decl in plan.outputs:
            binding = by_name[decl.name]
            nbytes = 4 * counts[decl.name]
            outputs.append((binding.index, offset, nbytes, decl.dtype.numpy))
            offset += (nbytes + 3) // 4 * 4
        status_offset = None
        if shader.status_binding is not None:
            status_offset = offset
            offset += 4
        position = {decl.name: i for i, decl in enumerate(plan.inputs)}
        writes = tuple(
            (b.index, position[b.name])
            for b in shader.bindings
            if b.name in position and counts[b.name]
        )
        clears = tuple(
            b.index for b in shader.bindings if b.decl.access is Access.WRITE and counts[b.name]
        )
        return _Shape(
            pipeline=pipelines[0],
            segments=pipelines if native.segmented else None,
            sizes=sizes,
            chunks=tuple(chunks),
            outputs=tuple(outputs),
            readback_bytes=max(4, offset),
            status_offset=status_offset,
            writes=writes,
            clears=clears,
            pool_size=_POOL if sum(sizes) <= _SMALL_SET else _POOL_LARGE,
        )

    def enqueue(self, launch: Launch) -> None:
        self._submit([launch])

    def enqueue_batch(self, launches: Sequence[Launch], decision: ExecutionDecision) -> None:
        from vyre_async.abc import annotate_mode

        annotate_mode(launches, decision, "plain")
        self._submit(list(launches))

    def _submit(self, launches: list[Launch]) -> None:
        if self._closed:
            raise BackendClosed("the wgpu backend is closed", fix="acquire a new backend")
        with self._count_lock:
            self._in_flight += len(launches)
        self._queue.put(launches)

    # The device thread -------------------------------------------------------------
    def _run(self) -> None:
        """The device thread: one submission for everything queued when it looks."""
        while True:
            launches = self._queue.get()
            if launches is None:
                return
            ending = False
            nbytes = sum(launch.shape.readback_bytes for launch in launches)
            # Dispatches queued meanwhile join this submission, within a launch count and
            # a read-back size (one read-back buffer holds all their outputs).
            while len(launches) < _COALESCE and nbytes < _COALESCE_BYTES:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    ending = True
                    break
                launches = launches + more
                nbytes += sum(launch.shape.readback_bytes for launch in more)
            self._running = launches
            try:
                self._run_job(launches)
            except BaseException as exc:  # a bug here must not end the device thread
                for launch in launches:
                    launch.completer.fail(self._failure(exc))
            finally:
                self._running = []
                with self._count_lock:
                    self._in_flight -= len(launches)
            del launches  # keep no dispatch alive while idle
            more = None
            if ending:
                return

    def _run_job(self, launches: list[Launch]) -> None:
        live = [launch for launch in launches if self._still_wanted(launch)]
        if not live:
            return
        device = self._device
        write = device.queue.write_buffer
        encoder = device.create_command_encoder()
        sets = []
        bases = []
        total = 0
        for launch in live:
            launch.completer.mark_started()
            shape: _Shape = launch.shape
            bound = shape.pool.pop() if shape.pool else self._bind(launch)
            sets.append(bound)
            bases.append(total)
            total += shape.readback_bytes
            inputs = launch.inputs
            for index, position in shape.writes:
                write(bound.buffers[index], 0, inputs[position])
            for index in shape.clears:
                encoder.clear_buffer(bound.buffers[index])
            if bound.status is not None:
                encoder.clear_buffer(bound.status)
            self._encode(encoder, launch, bound, launch.config.iterations)
        # One read-back buffer, one map for the whole submission (wgpu-py submits before
        # every read map: a map per launch costs a submit per launch).
        readback = self._readback(total)
        for launch, bound, base in zip(live, sets, bases, strict=True):
            self._encode_readback(encoder, launch, bound, readback, base)
        start = time.perf_counter()
        device.queue.submit([encoder.finish()])
        readback.map_sync(self._wgpu.MapMode.READ, 0, total)
        raw_all = np.array(readback.read_mapped(0, total, copy=False), np.uint8)  # one copy
        readback.unmap()
        idle = self._idle_readbacks.setdefault(readback.size, [])
        if len(idle) < 2:
            idle.append(readback)
        else:
            readback.destroy()
        device_s = time.perf_counter() - start
        reruns: list[Launch] = []
        for launch, bound, base in zip(live, sets, bases, strict=True):
            shape = launch.shape
            raw = raw_all[base : base + shape.readback_bytes]
            if len(shape.pool) < shape.pool_size:
                shape.pool.append(bound)
            if shape.status_offset is not None and _status(raw, shape.status_offset):
                if launch.pipeline.native.shader.state_binding is None:
                    launch.completer.fail(_loop_cut(launch, self.loop_cap))
                else:  # long loops: run it again from the start, in slices (below)
                    reruns.append(launch)
                continue
            if shape.segments is not None:
                _record_segments(launch, bound.phases)
            launch.completer.resolve(_outputs(raw, shape, len(live) > 1), device_s=device_s)
        for launch in reruns:  # after every finished launch of the submission has settled
            try:
                self._run_sliced(launch)
            except Exception as exc:
                launch.completer.fail(self._failure(exc))

    def _readback(self, nbytes: int) -> Any:
        """An idle read-back buffer of at least ``nbytes`` (sizes are powers of two)."""
        size = max(256, 1 << (nbytes - 1).bit_length())
        idle = self._idle_readbacks.get(size)
        if idle:
            return idle.pop()
        return self._device.create_buffer(size=size, usage=self._usage_readback)

    def _still_wanted(self, launch: Launch) -> bool:
        """False (and the dispatch failed) once the backend closed or the result is unwanted."""
        if self._closed:
            launch.completer.fail(_closed_error())
            return False
        if launch.completer.should_stop():
            launch.completer.fail(_stopped(launch))
            return False
        return True

    def _run_sliced(self, launch: Launch) -> None:
        """Run a launch whose loops outlast one slice, slice after slice (codegen `generate`).

        Between slices the dispatch can be stopped (timeout, an unwanted result)
        or ended by closing the backend, like at the start of any dispatch. A
        grid-barrier program runs segment after segment, each in as many slices as
        its loops need (a segment that is not sliced runs once, its loop guard
        checked); its ``vyre.segment`` phases are then, per segment launch, the
        host-side interval from writing its first slice's words to reading its last
        slice's status back (so they include the device's run of it).
        """
        wgpu = self._wgpu
        device = self._device
        shape: _Shape = launch.shape
        shader = launch.pipeline.native.shader
        lanes = launch.plan.geometry.lanes
        state_bytes = 4 * (STATE_HEADER_WORDS + lanes * shader.state_words)
        limit = int(self._limits["max-storage-buffer-binding-size"])
        if state_bytes > limit:
            launch.completer.fail(
                UnsupportedFeature(
                    f"{_called(launch)} needs more loop iterations per lane than lavapipe runs "
                    f"in one go, and slicing it would need {state_bytes} bytes of lane state "
                    f"(this adapter binds at most {limit})",
                    fix="run it on a hardware adapter, or dispatch fewer lanes at once",
                    feature="long loops",
                )
            )
            return
        start = time.perf_counter()
        bound = self._bind(launch, state_bytes=state_bytes)
        status_back = device.create_buffer(size=4, usage=self._usage_readback)
        try:
            for index, position in shape.writes:
                device.queue.write_buffer(bound.buffers[index], 0, launch.inputs[position])
            zero = np.zeros(1, np.uint32)
            pipelines = shape.segments if shape.segments is not None else (shape.pipeline,)
            phases: list[tuple[int, int]] = []
            for _ in range(launch.config.iterations):
                for pipeline in pipelines:  # a grid-barrier program: segment after segment
                    started = time.time_ns()
                    slice_no = 0
                    while True:
                        if not self._still_wanted(launch):
                            return
                        device.queue.write_buffer(bound.state, 0, np.array([slice_no], np.uint32))
                        device.queue.write_buffer(bound.status, 0, zero)
                        encoder = device.create_command_encoder()
                        self._encode_pass(encoder, shape, bound, pipeline)
                        encoder.copy_buffer_to_buffer(bound.status, 0, status_back, 0, 4)
                        device.queue.submit([encoder.finish()])
                        status_back.map_sync(wgpu.MapMode.READ)
                        status_words = np.frombuffer(status_back.read_mapped(copy=True), np.uint32)
                        status = int(status_words[0])
                        status_back.unmap()
                        if status & 1:
                            launch.completer.fail(_loop_cut(launch, self.loop_cap))
                            return
                        if not status & 2:
                            break
                        slice_no += 1
                    phases.append((started, time.time_ns()))
            encoder = device.create_command_encoder()
            readback = device.create_buffer(size=shape.readback_bytes, usage=self._usage_readback)
            self._encode_readback(encoder, launch, bound, readback, 0)
            device.queue.submit([encoder.finish()])
            raw = self._read(readback)
        finally:  # the lane state can be large: never keep it
            for buffer in (*bound.buffers, bound.status, bound.state, status_back):
                buffer.destroy()
        if shape.segments is not None:
            launch.completer.annotate("vyre.segments", len(shape.segments))
            _record_segments(launch, phases if launch.completer.wants_phases else None, "ran")
        launch.completer.resolve(_outputs(raw, shape), device_s=time.perf_counter() - start)

    def _read(self, readback: Any) -> np.ndarray:
        readback.map_sync(self._wgpu.MapMode.READ)
        raw = np.array(readback.read_mapped(copy=False), np.uint8)
        readback.unmap()
        readback.destroy()
        return raw

    def _bind(self, launch: Launch, *, state_bytes: int = 16) -> _Bound:
        """A new buffer set for a launch of this shape (contents written per launch)."""
        device = self._device
        native: _Native = launch.pipeline.native
        shape: _Shape = launch.shape
        shader = native.shader
        if shape.info_buffers is None:
            shape.info_buffers = [
                device.create_buffer_with_data(data=info, usage=self._usage_uniform)
                for _, _, info in shape.chunks
            ]
        buffers = []
        entries = []
        for binding, size in zip(shader.bindings, shape.sizes, strict=True):
            buffer = device.create_buffer(size=size, usage=self._usage_storage)
            buffers.append(buffer)
            entries.append({"binding": binding.index, "resource": {"buffer": buffer}})
        info_entry = {"binding": shader.info_binding, "resource": {"buffer": None}}
        entries.append(info_entry)
        status = state = None
        if shader.status_binding is not None:
            status = device.create_buffer(size=4, usage=self._usage_storage)
            entries.append({"binding": shader.status_binding, "resource": {"buffer": status}})
        if shader.state_binding is not None:
            state = device.create_buffer(size=state_bytes, usage=self._usage_storage)
            entries.append({"binding": shader.state_binding, "resource": {"buffer": state}})
        groups = []
        for info_buffer in shape.info_buffers:
            info_entry["resource"] = {"buffer": info_buffer}
            groups.append(device.create_bind_group(layout=native.group_layout, entries=entries))
        return _Bound(groups=groups, buffers=buffers, status=status, state=state)

    def _encode(self, encoder: Any, launch: Launch, bound: _Bound, iterations: int) -> None:
        shape: _Shape = launch.shape
        if shape.segments is not None:
            self._encode_segments(encoder, launch, bound, iterations)
            return
        compute = encoder.begin_compute_pass()
        compute.set_pipeline(shape.pipeline)
        for _ in range(iterations):  # fixpoint iterations: the buffers carry over
            for group, (_, counts, _) in zip(bound.groups, shape.chunks, strict=True):
                compute.set_bind_group(0, group)
                compute.dispatch_workgroups(*counts)
        compute.end()

    def _encode_segments(
        self, encoder: Any, launch: Launch, bound: _Bound, iterations: int
    ) -> None:
        """Record a grid-barrier program: its segments' launches in order, in one pass.

        WebGPU orders the dispatches of a pass and makes the storage writes of one
        visible to the next: the boundary between two segments is the grid barrier.
        Each launch zero-fills its workgroup memory first (the shader does).

        While a span wants phases, ``bound.phases`` gets, per segment launch, the
        host-side interval (``time.time_ns()``) in which the device thread recorded
        it into the command buffer: the time spent recording, not the time the
        device ran it (WebGPU gives no per-dispatch device times without timestamp
        queries; all segments run after the one submit).
        """
        shape: _Shape = launch.shape
        segments = shape.segments or (shape.pipeline,)
        launch.completer.annotate("vyre.segments", len(segments))
        phases: list[tuple[int, int]] | None = [] if launch.completer.wants_phases else None
        bound.phases = phases
        compute = encoder.begin_compute_pass()
        for _ in range(iterations):  # fixpoint iterations: the whole program, each time
            for pipeline in segments:
                start = time.time_ns() if phases is not None else 0
                compute.set_pipeline(pipeline)
                for group, (_, counts, _) in zip(bound.groups, shape.chunks, strict=True):
                    compute.set_bind_group(0, group)
                    compute.dispatch_workgroups(*counts)
                if phases is not None:
                    phases.append((start, time.time_ns()))
        compute.end()

    def _encode_pass(self, encoder: Any, shape: _Shape, bound: _Bound, pipeline: Any) -> None:
        """One compute pass: ``pipeline`` over every chunk of the grid (sliced reruns)."""
        compute = encoder.begin_compute_pass()
        compute.set_pipeline(pipeline)
        for group, (_, counts, _) in zip(bound.groups, shape.chunks, strict=True):
            compute.set_bind_group(0, group)
            compute.dispatch_workgroups(*counts)
        compute.end()

    def _encode_readback(
        self, encoder: Any, launch: Launch, bound: _Bound, readback: Any, base: int
    ) -> None:
        shape: _Shape = launch.shape
        for index, offset, nbytes, _ in shape.outputs:
            if nbytes:
                encoder.copy_buffer_to_buffer(
                    bound.buffers[index], 0, readback, base + offset, nbytes
                )
        if bound.status is not None and shape.status_offset is not None:
            encoder.copy_buffer_to_buffer(bound.status, 0, readback, base + shape.status_offset, 4)

    def _failure(self, exc: BaseException) -> BackendError:
        if isinstance(exc, BackendError):
            return exc
        text = f"{type(exc).__name__}: {exc}"
        if "out of memory" in text.lower():
            return DeviceOutOfMemory(
                f"the wgpu device ran out of memory: {text}",
                fix="dispatch smaller inputs, or fewer at once",
            )
        return DispatchFailed(f"the wgpu dispatch failed: {text}")

    # Lifecycle ---------------------------------------------------------------------
    async def flush(self) -> None:
        await poll_until(lambda: self._in_flight == 0)

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109 - the contract's bound
        """Refuse new work, settle queued dispatches with `BackendClosed`, wait for the running one.

        The device thread fails every queued dispatch with `BackendClosed` (a long
        loop on lavapipe stops at its next slice). A submitted WebGPU command
        buffer cannot be stopped: closing waits for it at most ``timeout`` seconds
        (without blocking the event loop); past that its dispatches fail with
        `BackendClosed` and the device thread (a daemon) is left to finish it.
        """
        import anyio

        self._closed = True
        self._queue.put(None)
        with anyio.move_on_after(timeout):
            await poll_until(lambda: not self._thread.is_alive())
        left = list(self._running)
        while True:  # what the device thread will not reach, or reached after it ended
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            left.extend(item or ())
        for launch in left:
            launch.completer.fail(
                BackendClosed(
                    f"the wgpu backend was closed while {_called(launch)} still waited or ran "
                    f"after {timeout} s; its result was discarded",
                    fix="await the dispatches you need (or backend.flush()) before closing, "
                    "or raise close_timeout",
                )
            )
        if self._thread.is_alive():
            _log.warning("wgpu backend closed with a dispatch still running after %.1f s", timeout)

    def device_lost(self) -> bool:
        return self._lost


def _record_segments(
    launch: Launch, phases: list[tuple[int, int]] | None, measured: str = "recorded"
) -> None:
    """Record a grid-barrier dispatch's segments on its span as ``vyre.segment`` phases.

    Only intervals that time a segment's run are recorded: ``measured="ran"``, the
    host-side time from writing a segment's first slice to reading back its last
    slice's status (a sliced rerun: submit and device time included). WebGPU gives
    no per-dispatch device times without timestamp queries, so the segments of one
    submission (``measured="recorded"``: only the microseconds spent recording each
    into the command buffer are known) get no phases: a trace would read them as
    run times.
    """
    if not phases or measured != "ran":
        return
    completer = launch.completer
    for start, end in phases:
        completer.record_phase("vyre.segment", start, end)


def _closed_error() -> BackendClosed:
    return BackendClosed(
        "the wgpu backend was closed before this dispatch ran",
        fix="await the dispatches you need (or backend.flush()) before closing",
    )


def _called(launch: Launch) -> str:
    label = launch.config.label
    return f"dispatch {label!r}" if label else "the dispatch"


def _stopped(launch: Launch) -> DispatchTimeout:
    return DispatchTimeout(
        f"{_called(launch)} was stopped before it ran, or between two slices of its long "
        "loops: its timeout passed or its result was no longer wanted",
        fix="raise DispatchConfig(timeout=...) or dispatch fewer at once",
    )


def _loop_cut(launch: Launch, cap: int | None) -> UnsupportedFeature:
    return UnsupportedFeature(
        f"{_called(launch)} of {launch.plan.program.op_id or 'a program'} needs more loop "
        f"iterations per lane than this adapter runs: lavapipe ends the loops of an invocation "
        f"after {cap} iterations in all, so its outputs would be wrong and were discarded",
        fix="run it on a hardware adapter, or split the loop over more lanes or dispatches",
        feature="long loops",
    )
