"""`CupyExecutor`: the CUDA driver on CuPy (id ``"cupy"``) — the executor hooks, wired together.

A dispatch becomes, on one leased non-blocking stream and without any host
synchronisation: one host-to-device copy of the pinned staging buffer (buffer
lengths + inputs), one memset of the WRITE buffers, the kernel launch(es)
between two timing events, one device-to-host copy of the outputs into pinned
memory, and a completion event. The completion bridge
(`vyre_cupy.completion`) notices the event from its single thread, copies the
outputs out, and settles the `PendingDispatch`.

The package, bottom to top (each module imports only those below it):

- `vyre_cupy.errors`, `layout`, `streams`, `completion`, `prelude` → `codegen`
  → `compile`, `device`: leaves (no CuPy at import time);
- `vyre_cupy.kernel`: `CudaKernel` and its per-shape records (`KernelLayout`,
  `CapturedGraph`), plain data;
- `vyre_cupy.context`: `DeviceContext` — CuPy handles, device, stream pool,
  events, memory, completion bridge, and the one error-mapping context manager;
- `vyre_cupy.launch`: one launch — templates, staging, flights, readback,
  resident-buffer ordering;
- `vyre_cupy.batch`: persistent kernel and graph replay, on top of `launch`;
- `vyre_cupy.grid`: programs with grid barriers (one cooperative launch, or
  one launch per segment), on top of `launch`;
- this module: the `vyre_async.abc.Executor` hooks, and `create_backend`
  (``VyreBackend(CupyExecutor(...))``); nothing imports it but the package's
  lazy exports and the registry (``vyre_cupy.backend:create_backend``).

CuPy is imported only when a backend is created (`create_backend`), never when
backends are listed; a machine without CuPy, driver or device gets an
`UnsupportedFeature` naming the cause.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Sequence
from typing import Any

import anyio
import numpy as np

from vyre_async.abc import (
    CORE_OPS,
    DRIVER_VERSION,
    BackendCapabilities,
    BindingPlan,
    Calibration,
    DiskPipelineCache,
    DispatchConfig,
    ExecutionDecision,
    Executor,
    Launch,
    ResidentBuffer,
    VyreBackend,
    alloc_request,
    annotate_mode,
    check_buffer,
    elementwise_xor,
    measure_arm_overlap,
    measure_batch_costs,
    measure_host_costs,
    measure_resident_gain,
    poll_until,
    upload_request,
    whole_number,
)
from vyre_async.abc import public_dir as _public_dir
from vyre_async.errors import (
    BackendClosed,
    BackendError,
    DispatchFailed,
    InvalidArgument,
    InvalidProgram,
    KernelCompileFailed,
    UnsupportedFeature,
)
from vyre_async.ir.program import Program
from vyre_async.ir.split import split_at_grid_barriers
from vyre_async.ir.types import DType
from vyre_cupy.batch import batch_obstacle, enqueue_persistent, enqueue_replay
from vyre_cupy.codegen import CODEGEN_VERSION, KernelSource, generate, has_grid_barrier
from vyre_cupy.compile import (
    NVRTC_OPTIONS,
    CompiledKernel,
    choose_target,
    compile_kernel,
    cooperative_options,
    decode_grid,
    decode_kernel,
    encode_grid,
    encode_kernel,
    load_function,
)
from vyre_cupy.context import DeviceContext
from vyre_cupy.device import (
    DeviceInfo,
    capabilities_of,
    cuda_include_dir,
    nvrtc_module,
    probe,
)
from vyre_cupy.grid import enqueue_grid, plan_grid
from vyre_cupy.kernel import CudaKernel, GridKernel, GridShape, KernelLayout
from vyre_cupy.launch import (
    DeviceBuffer,
    ResidentCopy,
    enqueue_launch,
    note_reader,
    template_for,
    timeout_error,
)
from vyre_cupy.prelude import PRELUDE_DIGEST
from vyre_cupy.streams import DEFAULT_STREAMS

__all__ = ["CudaKernel", "CupyExecutor", "create_backend"]
__dir__ = _public_dir(__name__)

_log = logging.getLogger("vyre_async.cupy")


def create_backend(
    *,
    device: int = 0,
    streams: int = DEFAULT_STREAMS,
    disk_cache: DiskPipelineCache | str | None = "default",
    **kwargs: Any,
) -> VyreBackend:
    """Build the ``cupy`` backend: ``VyreBackend(CupyExecutor(...), ...)`` (the registry's factory).

    Args:
        device: CUDA device ordinal.
        streams: Size of the non-blocking stream pool.
        disk_cache: Where compiled kernels persist across processes: ``"default"``
            (the default, a `DiskPipelineCache` under ``$VYRE_CACHE_DIR`` or the
            platform's user cache directory), a cache, or None for memory only.
        **kwargs: Passed to `VyreBackend` (``pipeline_cache_capacity``, ``prefetch``).

    Raises:
        UnsupportedFeature: no CuPy, no usable CUDA driver, or no device; the
            message names the cause and how to fix it.
        InvalidArgument: ``disk_cache`` is another str, or an argument is out of range.
    """
    cache = DiskPipelineCache() if disk_cache == "default" else disk_cache
    if isinstance(cache, str):
        raise InvalidArgument(
            f"disk_cache must be 'default', a DiskPipelineCache or None, got {cache!r}",
            fix="pass disk_cache=DiskPipelineCache(path) for another directory",
        )
    return VyreBackend(CupyExecutor(device=device, streams=streams), disk_cache=cache, **kwargs)


class CupyExecutor(Executor):
    """Dispatch programs as CUDA kernels compiled with NVRTC, through CuPy.

    Args:
        device: CUDA device ordinal.
        streams: Size of the non-blocking stream pool dispatches share.

    Attributes:
        info: What the probe learned about the device.
        device_context: The device's streams, events, memory, completion bridge
            and error mapping (`vyre_cupy.context.DeviceContext`).

    Raises:
        UnsupportedFeature: no CuPy, no usable CUDA driver, or no such device.
        InvalidArgument: ``device`` or ``streams`` is not a whole number in range.
    """

    id = "cupy"
    version = DRIVER_VERSION
    #: Host inputs go straight from the caller's arrays into pinned staging, in
    #: ``enqueue`` (and ``enqueue_batch``): one copy each.
    copies_inputs = True

    def __init__(self, *, device: int = 0, streams: int = DEFAULT_STREAMS) -> None:
        device = whole_number("device", device, example="device=0")
        streams = whole_number("streams", streams, minimum=1, example=f"streams={DEFAULT_STREAMS}")
        cupy, info = probe(device)  # first: a machine without CUDA fails before any set-up
        self.info: DeviceInfo = info
        self.device_context = DeviceContext(cupy, info, streams=streams)
        self._nvrtc = nvrtc_module(cupy)
        self._target = choose_target(info.compute_capability, info.nvrtc_archs)
        # (the driver refuses a grid over the device's limit before plan_shape sees it)
        self._caps = dataclasses.replace(
            capabilities_of(info), max_grid_size=self.device_context.grid_limit
        )
        self._resident: dict[int, ResidentBuffer] = {}
        self._closed = False  # set by close(): every later operation raises BackendClosed
        self._cooperative_options: tuple[str, ...] | None = None  # NVRTC's -I, found once

    # Description ----------------------------------------------------------------
    def supported_ops(self) -> frozenset[str]:
        """Every operation of `CORE_OPS`, grid-wide barriers included (`vyre_cupy.grid`)."""
        return CORE_OPS

    def capabilities(self) -> BackendCapabilities:
        """Report the device's limits and native features (`vyre_cupy.device.capabilities_of`).

        ``async_compute`` (concurrent streams), ``persistent_threads`` (the batch
        kernel), ``graph_replay`` (CUDA graphs) and, on a device with cooperative
        launch, ``grid_sync`` (a grid-barrier program as one cooperative launch)
        are claimed; nothing is emulated.
        """
        return self._caps

    def device_fingerprint(self) -> str:
        """Device name and architecture, driver, CUDA runtime and CuPy versions."""
        return self.info.fingerprint

    def compiler_fingerprint(self) -> str:
        """NVRTC version, the exact options and target, the code generator and prelude.

        The prelude is named by the digest of its text, so editing it can never
        load kernels compiled with the old one; a change to the code generator
        itself needs a `CODEGEN_VERSION` bump.
        """
        major, minor = self.info.nvrtc_version
        return (
            f"nvrtc {major}.{minor}; {' '.join(NVRTC_OPTIONS)} -arch={self._target}; "
            f"vyre_cupy codegen {CODEGEN_VERSION}; prelude {PRELUDE_DIGEST}"
        )

    def calibrate(self) -> Calibration:
        """Measure launch, graph replay and persistent-batch costs, NVRTC and copies (host clocks).

        Runs on a private probe backend on the same device (its own streams and
        completion thread, no prefetching), in a few seconds:
        `vyre_async.abc.measure_host_costs` (compile cost, pinned copy
        bandwidth), then `vyre_async.abc.measure_batch_costs` on
        ``elementwise_xor(1024)``: ``launch_ns`` per launch of a plain batch,
        ``record_ns`` (capture and instantiation of its graph), ``replay_ns`` per
        replayed launch, and the persistent batch's fixed (``persistent_setup_ns``)
        and per-item (``persistent_item_ns``) host cost; then how much two
        concurrent dispatches overlap (`vyre_async.abc.measure_arm_overlap`,
        ``concurrent_overlap_bps``) and what resident buffers save
        (`vyre_async.abc.measure_resident_gain`, ``resident_gain_bps``). Use
        `vyre_async.calibration_for(backend, measure=True)` (or
        ``vyre-async info --calibrate cupy``) to measure once and cache the record.
        If the batch modes fail to run, the record keeps the other figures and
        leaves theirs None (a warning is logged).
        """
        executor = CupyExecutor(device=self.info.ordinal, streams=2)
        probe = VyreBackend(executor, prefetch=False)
        bridge = executor.device_context.bridge
        xor = elementwise_xor(1024)
        try:
            record = measure_host_costs(
                self,
                probe,
                compile_once=lambda _: executor.build_pipeline(xor, DispatchConfig()),  # NVRTC
                copy_bytes=16 << 20,
                settle=lambda: bridge.wait_idle(timeout=60),
            )
            pipeline = probe.compile(xor)
            kernel = pipeline.native

            def record_ns() -> int | None:
                graphs = list(kernel.graphs.values())
                return graphs[-1].record_ns if graphs else None

            inputs = [np.arange(1024, dtype=np.uint32), np.ones(1024, np.uint32)]
            try:
                costs = measure_batch_costs(pipeline, inputs, record_ns=record_ns)
            except Exception:  # keep what was measured; the batch modes stay uncalibrated
                _log.warning("calibrating the CUDA batch modes failed", exc_info=True)
                return record
            measured: dict[str, Any] = {
                **costs,  # arm concurrency and resident buffers, on the probe's own streams
                "concurrent_overlap_bps": measure_arm_overlap(probe),
                "resident_gain_bps": measure_resident_gain(probe),
            }
            return dataclasses.replace(record, **measured)
        finally:
            executor._close_now()

    def _close_now(self) -> None:
        """Finish submitted work and release streams and threads, from plain code.

        Waits 60 s at most for submitted work. Work still running then is left to
        the completion thread (a daemon, which ends with it) and so are the
        streams it runs on: they are released only once nothing is in flight.
        """
        self._closed = True
        bridge = self.device_context.bridge
        bridge.wait_idle(timeout=60)
        bridge.close(timeout=10)
        if not bridge.running:
            self.device_context.close_streams()

    def device_lost(self) -> bool:
        """True once a sticky CUDA error poisoned the context (every dispatch then fails)."""
        return self.device_context.lost is not None

    @property
    def in_flight(self) -> int:
        """Dispatches (and resident-buffer copies) the device has not finished yet."""
        return self.device_context.bridge.in_flight

    # Pipelines --------------------------------------------------------------------
    def build_pipeline(self, program: Program, config: DispatchConfig) -> CudaKernel | GridKernel:
        """Generate CUDA C, compile it with NVRTC and load it.

        A program with grid barriers becomes a `GridKernel`: one kernel per
        segment, and on a device with cooperative launch the cooperative kernel
        too (a cooperative kernel NVRTC rejects is logged, and the program runs
        split).

        Raises:
            KernelCompileFailed: NVRTC rejected the generated source.
            DeviceOutOfMemory, DeviceLost, DispatchFailed: loading the module failed.
        """
        if has_grid_barrier(program):
            return self._build_grid(program)
        return self._build(generate(program), program)

    def _build(
        self, source: KernelSource, program: Program, options: tuple[str, ...] = ()
    ) -> CudaKernel:
        compiled = compile_kernel(source, nvrtc=self._nvrtc, target=self._target, options=options)
        if compiled.log:
            _log.debug("NVRTC log for %s:\n%s", program.op_id or "program", compiled.log)
        return CudaKernel(source, compiled, *self._load(compiled, source))

    def _build_grid(self, program: Program) -> GridKernel:
        segments = tuple(
            self._build(generate(segment, batch=False), segment)
            for segment in split_at_grid_barriers(program)
        )
        if len(segments) == 1:  # nothing to synchronise: one launch either way
            return GridKernel(segments)
        if not self._caps.grid_sync:
            return GridKernel(
                segments,
                reason="no_cooperative_launch",
                note=f"{self.info.name} has no cooperative launch",
            )
        try:
            cooperative = self._build(
                generate(program, batch=False), program, self._cooperative_nvrtc_options()
            )
        except KernelCompileFailed as exc:
            first = exc.message.splitlines()[1:2] or [exc.message]
            _log.warning(
                "NVRTC rejected the cooperative kernel of %s; it runs split at its grid "
                "barriers: %s",
                program.op_id or "a grid-barrier program",
                exc.message,
            )
            return GridKernel(
                segments, reason="cooperative_kernel_failed", note=first[0].strip()[:200]
            )
        return GridKernel(segments, cooperative)

    def _cooperative_nvrtc_options(self) -> tuple[str, ...]:
        found = self._cooperative_options
        if found is None:
            found = cooperative_options(cuda_include_dir(self.device_context.cupy))
            self._cooperative_options = found
        return found

    def serialize_pipeline(self, native: Any) -> bytes | None:
        """Return the cubin/PTX record the disk cache stores (every kernel of a grid program)."""
        if isinstance(native, CudaKernel):
            return encode_kernel(native.compiled)
        if isinstance(native, GridKernel):
            cooperative = native.cooperative
            return encode_grid(
                [segment.compiled for segment in native.segments],
                None if cooperative is None else cooperative.compiled,
                native.reason,
                native.note,
            )
        return None

    def load_pipeline(self, payload: bytes, program: Program, config: DispatchConfig) -> Any:
        """Load a kernel compiled by an earlier process (no NVRTC); rebuild it if unusable."""
        try:
            if has_grid_barrier(program):
                return self._load_grid(payload, program)
            source = generate(program)
            compiled = decode_kernel(payload)
            if compiled.entry != source.entry or compiled.params != len(source.params):
                raise ValueError("the cached kernel's ABI does not match the program")
            return CudaKernel(source, compiled, *self._load(compiled, source))
        except (ValueError, DispatchFailed) as exc:
            warnings.warn(
                f"vyre_cupy: ignoring an unusable cached kernel ({exc}); recompiling",
                RuntimeWarning,
                stacklevel=2,
            )
            return self.build_pipeline(program, config)

    def _load_grid(self, payload: bytes, program: Program) -> GridKernel:
        compiled, cooperative, reason, note = decode_grid(payload)
        segments = split_at_grid_barriers(program)
        if len(compiled) != len(segments):
            raise ValueError("the cached kernels do not match the program's segments")
        kernels = []
        for segment, record in zip(segments, compiled, strict=True):
            source = generate(segment, batch=False)
            kernels.append(self._loaded(record, source))
        if len(kernels) == 1:
            return GridKernel(tuple(kernels))
        if not self._caps.grid_sync:
            return GridKernel(
                tuple(kernels),
                reason="no_cooperative_launch",
                note=f"{self.info.name} has no cooperative launch",
            )
        if cooperative is None:
            if reason != "cooperative_kernel_failed":
                raise ValueError("the cached pipeline has no cooperative kernel")
            return GridKernel(tuple(kernels), reason=reason, note=note)
        source = generate(program, batch=False)
        return GridKernel(tuple(kernels), self._loaded(cooperative, source))

    def _loaded(self, compiled: CompiledKernel, source: KernelSource) -> CudaKernel:
        if compiled.entry != source.entry or compiled.params != len(source.params):
            raise ValueError("the cached kernel's ABI does not match the program")
        return CudaKernel(source, compiled, *self._load(compiled, source))

    def _load(self, compiled: CompiledKernel, source: KernelSource) -> tuple[Any, Any]:
        ctx = self.device_context
        ctx.use_device()
        with ctx.errors("loading the compiled kernel"):
            return load_function(compiled, batch_entry=source.batch_entry)

    # Dispatch ---------------------------------------------------------------------
    def plan_shape(
        self, native: Any, plan: BindingPlan, config: DispatchConfig
    ) -> KernelLayout | GridShape:
        """Check the workgroup against the device and lay out the kernel's arguments, once.

        For a grid-barrier program, also decide how the shape runs: one
        cooperative launch when the device holds its whole grid at once, else
        one launch per segment (`vyre_cupy.grid.plan_grid`).

        Raises:
            InvalidProgram: the pipeline was not compiled by a cupy executor.
            UnsupportedFeature: the workgroup exceeds the device's limits.
            CooperativeResidencyExceeded: ``config.cooperative`` and the grid of a
                grid-barrier program cannot be resident at once.
        """
        if isinstance(native, GridKernel):
            self._check_workgroup(plan.geometry.workgroup)
            return plan_grid(self.device_context, native, plan, config)
        if not isinstance(native, CudaKernel):
            raise InvalidProgram(
                "the pipeline was not compiled by the cupy backend",
                fix="compile pipelines with the backend that dispatches them",
            )
        self._check_workgroup(plan.geometry.workgroup)
        return template_for(native, plan)

    def enqueue(self, launch: Launch) -> None:
        """Enqueue upload → launch → readback on a pooled stream; return at once.

        Raises:
            BackendClosed: the backend was closed.
            DeviceLost: an earlier sticky CUDA error made the device unusable.
        """
        ctx = self.device_context
        if self._closed or ctx.lost is not None:
            self._check_open()
        completer = launch.completer
        if completer.should_stop():
            completer.fail(timeout_error(launch))
            return
        native = launch.pipeline.native
        layout = launch.shape
        if layout.__class__ is not KernelLayout:  # a GridShape, or None (a launch built by hand)
            if layout is None:
                layout = self.plan_shape(native, launch.plan, launch.config)
            if isinstance(layout, GridShape):
                try:
                    enqueue_grid(ctx, self, launch, layout)
                except Exception as exc:
                    completer.fail(ctx.failure(exc, "enqueueing the dispatch"))
                return
        try:
            enqueue_launch(ctx, self, launch, native, layout)
        except Exception as exc:
            completer.fail(ctx.failure(exc, "enqueueing the dispatch"))

    def enqueue_batch(self, launches: Sequence[Launch], decision: ExecutionDecision) -> None:
        """Run one `dispatch_batch` call as the policy chose: persistent, graph replay or plain.

        A persistent batch is ONE launch of the program's batch kernel over every
        item; command reuse replays a CUDA graph captured once per launch shape
        (`vyre_cupy.batch`). Launches that cannot run that way (resident inputs,
        mixed shapes, a kernel with barriers, ``iterations > 1`` for persistent)
        run as plain launches, with the reason on their spans
        (``vyre.batch.mode.reason``); so do grid-barrier programs (``grid_barrier``).

        Raises:
            BackendClosed: the backend was closed.
            DeviceLost: an earlier sticky CUDA error made the device unusable.
        """
        mode = decision.mode.kind
        native = launches[0].pipeline.native if launches else None
        reason = None
        if mode != "plain" and isinstance(native, CudaKernel):  # else enqueue says why not
            self._check_open()
            reason = batch_obstacle(launches, mode, native)
        elif mode != "plain" and isinstance(native, GridKernel):
            reason = "grid_barrier"  # each item runs its own launches (vyre_cupy.grid)
        if mode == "plain" or reason is not None or not isinstance(native, CudaKernel):
            annotate_mode(launches, decision, "plain", reason)
            for launch in launches:
                self.enqueue(launch)
            return
        annotate_mode(launches, decision, mode)
        live = []
        for launch in launches:
            if launch.completer.should_stop():
                launch.completer.fail(timeout_error(launch))
            else:
                live.append(launch)
        if not live:
            return
        ctx = self.device_context
        try:
            with ctx.errors(f"enqueueing a {mode} batch"):
                if mode == "persistent":
                    enqueue_persistent(ctx, live, native)
                else:
                    enqueue_replay(ctx, live, native)
        except BackendError as error:
            for launch in live:
                launch.completer.fail(error)

    def _check_workgroup(self, workgroup: tuple[int, int, int]) -> None:
        wx, wy, wz = most = self._caps.max_workgroup_size
        if workgroup[0] > wx or workgroup[1] > wy or workgroup[2] > wz:
            raise UnsupportedFeature(
                f"workgroup {workgroup} exceeds the device's limit {most}",
                fix="choose a workgroup shape within the device's limits",
                feature="workgroup size",
            )

    def _check_open(self) -> None:
        if self._closed:
            raise BackendClosed(
                f"backend {self.id!r} was closed; it runs nothing more", backend_id=self.id
            )
        self.device_context.check_usable()

    # Resident buffers -------------------------------------------------------------
    def upload(self, data: np.ndarray | bytes, *, label: str | None = None) -> ResidentBuffer:
        """Copy ``data`` to a new device buffer (asynchronously; later dispatches are ordered).

        Raises:
            InvalidProgram: unsupported dtype or type, bytes not made of 4-byte
                words, or data over the device's largest buffer.
            InvalidArgument: ``label`` is not a str or None.
            DeviceOutOfMemory: the device (or the host, for the copy) has no room for it.
            BackendClosed: the backend was closed.
        """
        self._check_open()
        limit = self._caps.max_storage_buffer_bytes
        # No private copy here: _resident_op copies the data into pinned staging once.
        dtype, array = upload_request(data, label=label, max_bytes=limit, copy=False)
        return self._resident_op(dtype, array.size, label, array)

    def alloc(self, dtype: DType | str, count: int, *, label: str | None = None) -> ResidentBuffer:
        """Allocate a zero-filled device buffer of ``count`` elements.

        Raises:
            InvalidArgument: an unknown dtype, a count that is not an int >= 0, or
                a label that is not a str.
            InvalidProgram: a buffer over the device's largest buffer.
            DeviceOutOfMemory: the device has no room for it.
            BackendClosed: the backend was closed.
        """
        self._check_open()
        limit = self._caps.max_storage_buffer_bytes
        kind, elements = alloc_request(dtype, count, max_bytes=limit, label=label)
        return self._resident_op(kind, elements, label, None)

    def _resident_op(
        self, dtype: DType, count: int, label: str | None, array: np.ndarray | None
    ) -> ResidentBuffer:
        ctx = self.device_context
        rt = ctx.runtime
        nbytes = 4 * count
        ctx.use_device()
        index, stream = ctx.streams.lease()
        try:
            with ctx.errors("creating a resident buffer"):
                memory = ctx.alloc(max(nbytes, 4), stream)
                buf = DeviceBuffer(memory, int(memory.ptr), nbytes)
                keep: tuple[Any, ...] = (memory,)
                staging = None
                if array is not None and nbytes:
                    staging = ctx.pinned(nbytes)
                    np.copyto(np.frombuffer(staging, array.dtype, count), array)
                    keep += (staging,)
                (done,) = ctx.events(1)
                with ctx.streams.ordering(index):
                    if staging is not None:
                        rt.memcpyAsync(
                            buf.ptr, staging.ptr, nbytes, rt.memcpyHostToDevice, stream.ptr
                        )
                    elif nbytes:
                        rt.memsetAsync(buf.ptr, 0, nbytes, stream.ptr)
                    done.record(stream)
                    buf.last_write = done
                    ctx.bridge.submit(ResidentCopy(ctx, index, done, keep), queue=index)
        except BaseException:
            ctx.streams.release(index)
            raise
        resident = ResidentBuffer(owner=self, dtype=dtype, count=count, native=buf, label=label)
        self._resident[resident.id] = resident
        return resident

    def download(self, buffer: ResidentBuffer) -> np.ndarray:
        """Copy a resident buffer back to a new host array (blocks until earlier writes finish).

        Raises:
            InvalidProgram: the buffer belongs to another backend instance or was freed.
            InvalidArgument: ``buffer`` is not a `ResidentBuffer`.
            BackendClosed: the backend was closed.
        """
        self._check_open()
        buf: DeviceBuffer = check_buffer(buffer, "download").native(self)
        ctx = self.device_context
        rt = ctx.runtime
        ctx.use_device()
        index, stream = ctx.streams.lease()
        try:
            with ctx.errors("downloading a resident buffer"):
                pinned = ctx.pinned(max(buf.nbytes, 4))
                (done,) = ctx.events(1)
                with ctx.streams.ordering(index), ctx.lock:
                    # A reader: later writers wait for this copy (`_order_residents`).
                    if buf.last_write is not None:
                        stream.wait_event(buf.last_write)
                    if buf.nbytes:
                        rt.memcpyAsync(
                            pinned.ptr, buf.ptr, buf.nbytes, rt.memcpyDeviceToHost, stream.ptr
                        )
                    done.record(stream)
                    note_reader(buf, done)  # (an ordering event now: never recycled)
                done.synchronize()
                return np.frombuffer(pinned, buffer.dtype.numpy, buffer.count).copy()
        finally:
            ctx.streams.release(index)

    def free(self, buffer: ResidentBuffer) -> None:
        """Release a resident buffer; in-flight work using it keeps it alive until it ends.

        Raises:
            InvalidProgram: the buffer belongs to another backend instance or was
                already freed (freeing after close is allowed).
            InvalidArgument: ``buffer`` is not a `ResidentBuffer`.
        """
        check_buffer(buffer, "free").native(self)
        # The core has no public way for the owning backend to release a handle yet.
        buffer.release(self)
        self._resident.pop(buffer.id, None)

    @property
    def resident_count(self) -> int:
        """Number of live resident buffers."""
        return len(self._resident)

    # Lifecycle --------------------------------------------------------------------
    async def flush(self) -> None:
        """Wait, without blocking the event loop, until the device finished all submitted work."""
        bridge = self.device_context.bridge
        await poll_until(lambda: not bridge.in_flight)

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109 - the contract's bound
        """Refuse new work, let submitted work finish (bounded), then release the device side.

        A running GPU kernel cannot be stopped: closing waits for submitted
        work at most ``timeout`` seconds (without blocking the event loop).
        Work still running after that has its dispatches failed with
        `BackendClosed`; its device memory stays referenced by the completion
        thread (a daemon, which never keeps the process alive) until it ends.
        """
        self._closed = True
        bridge = self.device_context.bridge
        deadline = anyio.current_time() + timeout
        with anyio.move_on_after(timeout):
            await poll_until(lambda: not bridge.in_flight)
        # A dispatch racing the close (past its open check on another thread) may still
        # submit: the join is bounded by what is left of close_timeout, then abandoned.
        bridge.close(timeout=max(0.0, deadline - anyio.current_time()))
        if bridge.in_flight:
            stuck = bridge.abandon(
                BackendClosed(
                    f"the cupy backend was closed while a dispatch still ran on the GPU after "
                    f"{timeout} s; its result was discarded",
                    fix="await the dispatches you need (or backend.flush()) before closing, "
                    "or raise close_timeout",
                )
            )
            _log.warning(
                "cupy backend closed with %d unfinished GPU operation(s) after %.1f s; "
                "their dispatches failed with BackendClosed",
                stuck,
                timeout,
            )
        self.device_context.close_streams()
