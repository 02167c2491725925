"""`CupyBackend`: the CUDA driver on CuPy (id ``"cupy"``).

A dispatch becomes, on one leased non-blocking stream and without any host
synchronisation: one host-to-device copy of the pinned staging buffer (buffer
lengths + inputs), one memset of the WRITE buffers, the kernel launch(es)
between two timing events, one device-to-host copy of the outputs into pinned
memory, and a completion event. The completion bridge
(`vyre_cupy.completion`) notices the event from its single thread, copies the
outputs out, and settles the `PendingDispatch`.

CuPy is imported only when a backend is created (`create_backend`), never when
backends are listed; a machine without CuPy, driver or device gets an
`UnsupportedFeature` naming the cause.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import warnings
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import anyio
import numpy as np

from vyre_async import __version__
from vyre_async.backend import VyreBackend, poll_until
from vyre_async.cache.disk import DiskPipelineCache
from vyre_async.calibration import Calibration, measure_batch_costs, measure_host_costs
from vyre_async.capabilities import BackendCapabilities
from vyre_async.config import DispatchConfig
from vyre_async.errors import (
    BackendClosed,
    BackendError,
    DeviceLost,
    DispatchFailed,
    DispatchTimeout,
    InvalidProgram,
    UnsupportedFeature,
)
from vyre_async.execution import ExecutionDecision, annotate_mode
from vyre_async.ir.program import Program
from vyre_async.ir.types import Access, DType
from vyre_async.pending import PendingDispatch
from vyre_async.pipeline import Launch
from vyre_async.resident import ResidentBuffer, alloc_request, check_buffer, upload_request
from vyre_cupy.batch import (
    PRIVATE_ARENA,
    CapturedGraph,
    Flight,
    annotate_copy,
    batch_obstacle,
    enqueue_persistent,
    enqueue_replay,
    fill_staging,
    kernel_arguments,
)
from vyre_cupy.codegen import CODEGEN_VERSION, KernelSource, generate
from vyre_cupy.compile import (
    NVRTC_OPTIONS,
    CompiledKernel,
    choose_target,
    compile_kernel,
    decode_kernel,
    encode_kernel,
    load_function,
)
from vyre_cupy.completion import CompletionBridge
from vyre_cupy.device import DeviceInfo, capabilities_of, nvrtc_module, probe
from vyre_cupy.errors import is_device_lost, translate
from vyre_cupy.layout import ArenaLayout, Source, plan_layout
from vyre_cupy.prelude import PRELUDE_DIGEST
from vyre_cupy.streams import DEFAULT_STREAMS, StreamPool

__all__ = ["CudaKernel", "CupyBackend", "create_backend"]

_log = logging.getLogger("vyre_async.cupy")
_READERS_KEPT = 32


@dataclass(frozen=True, slots=True)
class CudaKernel:
    """The native artifact of a `CompiledPipeline` on this backend.

    Attributes:
        source: The generated CUDA C and its launch ABI.
        compiled: The NVRTC output (what the disk cache stores).
        function: The loaded, launchable CuPy kernel function.
        batch: The batch (persistent) kernel of the same module, or None when the
            program has barriers or shared memory (``source.batch_entry`` is None).
        graphs: Captured CUDA graphs of this kernel, by launch shape (command reuse).
    """

    source: KernelSource
    compiled: CompiledKernel
    function: Any
    batch: Any = None
    graphs: OrderedDict[Any, CapturedGraph] = field(default_factory=OrderedDict, compare=False)


@dataclass(eq=False)
class _DeviceBuffer:
    """Device memory behind a `ResidentBuffer`, with its stream-ordering events."""

    memory: Any
    ptr: int
    nbytes: int
    last_write: Any = None  # event after the last write (upload, memset, dispatch)
    readers: list[Any] = field(default_factory=list)  # events of dispatches reading it


def create_backend(
    *,
    device: int = 0,
    streams: int = DEFAULT_STREAMS,
    disk_cache: DiskPipelineCache | str | None = "default",
    **kwargs: Any,
) -> CupyBackend:
    """Build the ``cupy`` backend (the registry's factory).

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
    """
    cache = DiskPipelineCache() if disk_cache == "default" else disk_cache
    if isinstance(cache, str):
        raise InvalidProgram(
            f"disk_cache must be 'default', a DiskPipelineCache or None, got {cache!r}",
            fix="pass disk_cache=DiskPipelineCache(path) for another directory",
        )
    return CupyBackend(device=device, streams=streams, disk_cache=cache, **kwargs)


class CupyBackend(VyreBackend):
    """Dispatch programs as CUDA kernels compiled with NVRTC, through CuPy.

    Args:
        device: CUDA device ordinal.
        streams: Size of the non-blocking stream pool dispatches share.
        **kwargs: Passed to `VyreBackend` (``pipeline_cache_capacity``, ``disk_cache``).

    Raises:
        UnsupportedFeature: no CuPy, no usable CUDA driver, or no such device.
    """

    id = "cupy"
    version = __version__

    def __init__(self, *, device: int = 0, streams: int = DEFAULT_STREAMS, **kwargs: Any) -> None:
        cupy, info = probe(device)  # first: a machine without CUDA fails before any set-up
        super().__init__(**kwargs)
        self._cupy: ModuleType = cupy
        self._rt: Any = cupy.cuda.runtime
        self.info: DeviceInfo = info
        self._nvrtc = nvrtc_module(cupy)
        self._target = choose_target(info.compute_capability, info.nvrtc_archs)
        self._caps = capabilities_of(info)
        self._grid_limit = (
            info.attribute("MaxGridDimX", 2**31 - 1),
            info.attribute("MaxGridDimY", 65535),
            info.attribute("MaxGridDimZ", 65535),
        )
        self._streams = StreamPool(streams, self._make_stream)
        self._bridge = CompletionBridge(on_start=self._use_device)
        self._events: deque[Any] = deque()
        self._lock = threading.Lock()
        self._resident: dict[int, ResidentBuffer] = {}
        self._lost: DeviceLost | None = None
        self._closed = False

    # Description ----------------------------------------------------------------
    def capabilities(self) -> BackendCapabilities:
        """Report the device's limits and native features (`vyre_cupy.device.capabilities_of`).

        ``async_compute`` (concurrent streams), ``persistent_threads`` (the batch
        kernel) and ``graph_replay`` (CUDA graphs) are claimed; nothing is emulated.
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
        `vyre_async.calibration.measure_host_costs` (compile cost, pinned copy
        bandwidth), then `vyre_async.calibration.measure_batch_costs` on
        ``elementwise_xor(1024)``: ``launch_ns`` per launch of a plain batch,
        ``record_ns`` (capture and instantiation of its graph), ``replay_ns`` per
        replayed launch, and the persistent batch's fixed (``persistent_setup_ns``)
        and per-item (``persistent_item_ns``) host cost. Use
        `vyre_async.calibration.calibration_for(backend, measure=True)` (or
        ``vyre-async info --calibrate cupy``) to measure once and cache the record.
        If the batch modes fail to run, the record keeps the other figures and
        leaves theirs None (a warning is logged).
        """
        from vyre_async.programs import elementwise_xor

        probe = CupyBackend(device=self.info.ordinal, streams=2, prefetch=False)
        xor = elementwise_xor(1024)
        try:
            record = measure_host_costs(
                self,
                probe,
                compile_once=lambda _: probe.build_pipeline(xor, DispatchConfig()),  # NVRTC
                copy_bytes=16 << 20,
                settle=lambda: probe._bridge.wait_idle(timeout=60),
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
            return dataclasses.replace(record, **costs)  # type: ignore[arg-type]
        finally:
            probe._close_now()

    def _close_now(self) -> None:
        """Finish submitted work and release streams and threads, from plain code."""
        self._closed = True
        if self.prefetcher is not None:
            self.prefetcher.close()
        self._bridge.wait_idle(timeout=60)
        self._bridge.close()
        self._streams.close()
        self._events.clear()

    def device_lost(self) -> bool:
        """True once a sticky CUDA error poisoned the context (every dispatch then fails)."""
        return self._lost is not None

    @property
    def in_flight(self) -> int:
        """Dispatches (and resident-buffer copies) the device has not finished yet."""
        return self._bridge.in_flight

    # Pipelines --------------------------------------------------------------------
    def build_pipeline(self, program: Program, config: DispatchConfig) -> CudaKernel:
        """Generate CUDA C, compile it with NVRTC and load it.

        Raises:
            KernelCompileFailed: NVRTC rejected the generated source.
            DeviceOutOfMemory, DeviceLost, DispatchFailed: loading the module failed.
        """
        source = generate(program)
        compiled = compile_kernel(source, nvrtc=self._nvrtc, target=self._target)
        if compiled.log:
            _log.debug("NVRTC log for %s:\n%s", program.op_id or "program", compiled.log)
        return CudaKernel(source, compiled, *self._load(compiled, source))

    def serialize_pipeline(self, native: Any) -> bytes | None:
        """Return the cubin/PTX record the disk cache stores."""
        if isinstance(native, CudaKernel):
            return encode_kernel(native.compiled)
        return None

    def load_pipeline(self, payload: bytes, program: Program, config: DispatchConfig) -> Any:
        """Load a kernel compiled by an earlier process (no NVRTC); rebuild it if unusable."""
        source = generate(program)
        try:
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

    def _load(self, compiled: CompiledKernel, source: KernelSource) -> tuple[Any, Any]:
        self._use_device()
        try:
            return load_function(compiled, batch_entry=source.batch_entry)
        except Exception as exc:
            error = translate(exc, during="loading the compiled kernel", device=self.info.name)
            self._note(exc, error)
            raise error from exc

    # Dispatch ---------------------------------------------------------------------
    def enqueue(self, launch: Launch) -> PendingDispatch:
        """Enqueue upload → launch → readback on a pooled stream; return at once.

        Raises:
            BackendClosed: the backend was closed.
            DeviceLost: an earlier sticky CUDA error made the device unusable.
            UnsupportedFeature: the grid or workgroup exceeds the device's limits.
        """
        self._check_open()
        completer = launch.completer
        if completer.stop_requested.is_set():
            completer.fail(_timeout(launch))
            return launch.pending
        self._check_geometry(launch)
        native = launch.pipeline.native
        if not isinstance(native, CudaKernel):
            raise InvalidProgram(
                f"pipeline {launch.pipeline!r} was not compiled by the cupy backend",
                fix="compile pipelines with the backend that dispatches them",
            )
        try:
            self._submit(launch, native)
        except BackendError as exc:
            completer.fail(exc)
        except Exception as exc:
            error = translate(exc, during="enqueueing the dispatch", device=self.info.name)
            self._note(exc, error)
            completer.fail(error)
        return launch.pending

    def enqueue_batch(self, launches: Sequence[Launch], decision: ExecutionDecision) -> None:
        """Run one `dispatch_batch` call as the policy chose: persistent, graph replay or plain.

        A persistent batch is ONE launch of the program's batch kernel over every
        item; command reuse replays a CUDA graph captured once per launch shape
        (`vyre_cupy.batch`). Launches that cannot run that way (resident inputs,
        mixed shapes, a kernel with barriers, ``iterations > 1`` for persistent)
        run as plain launches, with the reason on their spans
        (``vyre.batch.mode.reason``).

        Raises:
            BackendClosed: the backend was closed.
            DeviceLost: an earlier sticky CUDA error made the device unusable.
            UnsupportedFeature: the grid or workgroup exceeds the device's limits.
        """
        mode = decision.mode.kind
        native = launches[0].pipeline.native if launches else None
        reason = None
        if mode != "plain" and isinstance(native, CudaKernel):  # else enqueue says why not
            self._check_open()
            reason = batch_obstacle(launches, mode, native)
        if mode == "plain" or reason is not None or not isinstance(native, CudaKernel):
            annotate_mode(launches, decision, "plain", reason)
            for launch in launches:
                self.enqueue(launch)
            return
        self._check_geometry(launches[0])
        annotate_mode(launches, decision, mode)
        live = []
        for launch in launches:
            if launch.completer.stop_requested.is_set():
                launch.completer.fail(_timeout(launch))
            else:
                live.append(launch)
        if not live:
            return
        try:
            if mode == "persistent":
                enqueue_persistent(self, live, native)
            else:
                enqueue_replay(self, live, native)
        except Exception as exc:
            error = (
                exc
                if isinstance(exc, BackendError)
                else translate(exc, during=f"enqueueing a {mode} batch", device=self.info.name)
            )
            if not isinstance(exc, BackendError):
                self._note(exc, error)
            for launch in live:
                launch.completer.fail(error)

    def _submit(self, launch: Launch, kernel: CudaKernel) -> None:
        params = kernel.source.params
        counts, items = kernel_arguments(params, launch)
        layout = plan_layout(
            [p.decl.access for p in params], counts, _resident_sources(params, items)
        )
        cp = self._cupy
        self._use_device()
        index, stream = self._streams.lease()
        try:
            with stream:  # the memory pool ties the arena to this stream
                arena = cp.cuda.alloc(layout.total_bytes)
            staging = cp.cuda.alloc_pinned_memory(max(layout.upload_bytes, 4))
            readback = cp.cuda.alloc_pinned_memory(max(layout.readback_bytes, 4))
            host = np.frombuffer(staging, np.uint8, layout.upload_bytes)
            fill_staging(host, layout, counts, items)
            events = [self._event() for _ in range(4)]
            # One dispatch's operations are contiguous on its stream, and reach the
            # bridge in stream order.
            with self._streams.ordering(index):
                launch.completer.mark_started()
                launch.completer.annotate("vyre.stream", index)
                annotate_copy(launch, PRIVATE_ARENA)
                residents = self._enqueue(
                    launch, kernel, layout, items, stream, int(arena.ptr), staging, readback, events
                )
                flight = Flight(
                    backend=self,
                    launches=(launch,),
                    params=params,
                    stream=index,
                    layout=layout,
                    keep=(arena, staging, stream, residents),
                    readback=readback,
                    events=events,
                    keep_done=bool(residents),  # events[3] orders the resident buffers
                )
                self._bridge.submit(flight, queue=index)
        except BaseException:
            self._streams.release(index)
            raise

    def _enqueue(
        self,
        launch: Launch,
        kernel: CudaKernel,
        layout: ArenaLayout,
        items: list[Any],
        stream: Any,
        base: int,
        staging: Any,
        readback: Any,
        events: list[Any],
    ) -> list[tuple[_DeviceBuffer, bool]]:
        """Enqueue upload, launch(es) and readback on ``stream``; never synchronises."""
        rt, sp = self._rt, stream.ptr
        events[0].record(stream)
        rt.memcpyAsync(base, staging.ptr, layout.upload_bytes, rt.memcpyHostToDevice, sp)
        residents = self._order_residents(items, layout, stream)
        for slot, item in zip(layout.slots, items, strict=True):
            if slot.source is Source.DEVICE:
                assert isinstance(item, ResidentBuffer) and slot.offset is not None
                source = item.native(self)
                rt.memcpyAsync(
                    base + slot.offset, source.ptr, slot.nbytes, rt.memcpyDeviceToDevice, sp
                )
        if layout.zero_bytes:
            rt.memsetAsync(base + layout.zero_offset, 0, layout.zero_bytes, sp)
        events[1].record(stream)
        args = [
            np.uint64(_pointer(slot, item, base, self))
            for slot, item in zip(layout.slots, items, strict=True)
        ]
        args.append(np.uint64(base))
        geometry = launch.plan.geometry
        if geometry.lanes:
            for _ in range(launch.config.iterations):
                kernel.function(geometry.grid, geometry.workgroup, tuple(args), stream=stream)
        events[2].record(stream)
        for slot, item in zip(layout.slots, items, strict=True):
            if slot.source is Source.DEVICE and _writes(slot, item):
                assert isinstance(item, ResidentBuffer) and slot.offset is not None
                target = item.native(self)
                rt.memcpyAsync(
                    target.ptr, base + slot.offset, slot.nbytes, rt.memcpyDeviceToDevice, sp
                )
        if layout.download_bytes:
            rt.memcpyAsync(
                readback.ptr,
                base + layout.download_offset,
                layout.download_bytes,
                rt.memcpyDeviceToHost,
                sp,
            )
        for slot, item in zip(layout.slots, items, strict=True):
            if slot.source is Source.DIRECT and slot.readback is not None and slot.nbytes:
                assert isinstance(item, ResidentBuffer)
                rt.memcpyAsync(
                    readback.ptr + slot.readback,
                    item.native(self).ptr,
                    slot.nbytes,
                    rt.memcpyDeviceToHost,
                    sp,
                )
        events[3].record(stream)
        self._after_residents(residents, events[3])
        return residents

    def _check_geometry(self, launch: Launch) -> None:
        geometry = launch.plan.geometry
        caps = self._caps
        if any(g > limit for g, limit in zip(geometry.grid, self._grid_limit, strict=True)):
            raise UnsupportedFeature(
                f"grid {geometry.grid} exceeds the device's limit {self._grid_limit}",
                fix="use larger workgroups or split the dispatch into several smaller ones",
                feature="grid size",
            )
        if any(
            w > limit for w, limit in zip(geometry.workgroup, caps.max_workgroup_size, strict=True)
        ):
            raise UnsupportedFeature(
                f"workgroup {geometry.workgroup} exceeds the device's limit "
                f"{caps.max_workgroup_size}",
                fix="choose a workgroup shape within the device's limits",
                feature="workgroup size",
            )

    def _order_residents(
        self, items: list[Any], layout: ArenaLayout, stream: Any
    ) -> list[tuple[_DeviceBuffer, bool]]:
        """Make ``stream`` wait for earlier work on the resident buffers this dispatch uses."""
        uses: dict[int, tuple[_DeviceBuffer, bool]] = {}
        for slot, item in zip(layout.slots, items, strict=True):
            if isinstance(item, ResidentBuffer):
                buf = item.native(self)
                written = _writes(slot, item)
                previous = uses.get(id(buf))
                uses[id(buf)] = (buf, written or (previous is not None and previous[1]))
        with self._lock:
            for buf, written in uses.values():
                if buf.last_write is not None:
                    stream.wait_event(buf.last_write)
                if written:
                    for event in buf.readers:
                        stream.wait_event(event)
        return list(uses.values())

    def _after_residents(self, uses: list[tuple[_DeviceBuffer, bool]], done: Any) -> None:
        with self._lock:
            for buf, written in uses:
                if written:
                    buf.last_write, buf.readers = done, []
                else:
                    if len(buf.readers) >= _READERS_KEPT:
                        buf.readers = [e for e in buf.readers if not e.done]
                    buf.readers.append(done)

    # Helpers ------------------------------------------------------------------------
    def _make_stream(self) -> Any:
        self._use_device()
        return self._cupy.cuda.Stream(non_blocking=True)

    def _use_device(self) -> None:
        if self._rt.getDevice() != self.info.ordinal:
            self._rt.setDevice(self.info.ordinal)

    def _event(self) -> Any:
        try:
            return self._events.popleft()
        except IndexError:
            return self._cupy.cuda.Event()

    def _recycle(self, events: list[Any]) -> None:
        if len(self._events) < 1024:
            self._events.extend(events)

    def _note(self, exc: BaseException, error: BackendError) -> None:
        """Remember a sticky CUDA error: the device is lost for every later dispatch."""
        if is_device_lost(exc) and isinstance(error, DeviceLost) and self._lost is None:
            self._lost = error
            _log.error("CUDA device %s is lost: %s", self.info.name, error)

    def _check_open(self) -> None:
        self.check_open()
        if self._lost is not None:
            raise DeviceLost(
                f"the CUDA device is lost after an earlier error: {self._lost.message}",
                fix="restart the process; CUDA cannot recover a context after a sticky error",
            )

    # Resident buffers -------------------------------------------------------------
    def upload(self, data: np.ndarray | bytes, *, label: str | None = None) -> ResidentBuffer:
        """Copy ``data`` to a new device buffer (asynchronously; later dispatches are ordered).

        Raises:
            InvalidProgram: unsupported dtype or type, bytes not made of 4-byte
                words, or data over the device's largest buffer.
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
            InvalidProgram: an unknown dtype, a count that is not an int >= 0, or a
                buffer over the device's largest buffer.
            DeviceOutOfMemory: the device has no room for it.
            BackendClosed: the backend was closed.
        """
        self._check_open()
        limit = self._caps.max_storage_buffer_bytes
        kind, elements = alloc_request(dtype, count, max_bytes=limit)
        return self._resident_op(kind, elements, label, None)

    def _resident_op(
        self, dtype: DType, count: int, label: str | None, array: np.ndarray | None
    ) -> ResidentBuffer:
        cp, rt = self._cupy, self._rt
        nbytes = 4 * count
        self._use_device()
        index, stream = self._streams.lease()
        try:
            with stream:
                memory = cp.cuda.alloc(max(nbytes, 4))
            buf = _DeviceBuffer(memory, int(memory.ptr), nbytes)
            keep: tuple[Any, ...] = (memory,)
            staging = None
            if array is not None and nbytes:
                staging = cp.cuda.alloc_pinned_memory(nbytes)
                np.copyto(np.frombuffer(staging, array.dtype, count), array)
                keep += (staging,)
            done = self._event()
            with self._streams.ordering(index):
                if staging is not None:
                    rt.memcpyAsync(buf.ptr, staging.ptr, nbytes, rt.memcpyHostToDevice, stream.ptr)
                elif nbytes:
                    rt.memsetAsync(buf.ptr, 0, nbytes, stream.ptr)
                done.record(stream)
                buf.last_write = done
                self._bridge.submit(_Copy(self, index, done, keep), queue=index)
        except BaseException as exc:
            self._streams.release(index)
            if isinstance(exc, Exception):
                error = translate(exc, during="creating a resident buffer", device=self.info.name)
                self._note(exc, error)
                raise error from exc
            raise
        resident = ResidentBuffer(owner=self, dtype=dtype, count=count, native=buf, label=label)
        self._resident[resident.id] = resident
        return resident

    def download(self, buffer: ResidentBuffer) -> np.ndarray:
        """Copy a resident buffer back to a new host array (blocks until earlier writes finish).

        Raises:
            InvalidProgram: the buffer belongs to another backend instance or was freed.
            BackendClosed: the backend was closed.
        """
        self._check_open()
        buf: _DeviceBuffer = check_buffer(buffer, "download").native(self)
        cp, rt = self._cupy, self._rt
        self._use_device()
        index, stream = self._streams.lease()
        try:
            pinned = cp.cuda.alloc_pinned_memory(max(buf.nbytes, 4))
            done = self._event()
            with self._streams.ordering(index):
                with self._lock:
                    if buf.last_write is not None:
                        stream.wait_event(buf.last_write)
                if buf.nbytes:
                    rt.memcpyAsync(
                        pinned.ptr, buf.ptr, buf.nbytes, rt.memcpyDeviceToHost, stream.ptr
                    )
                done.record(stream)
            done.synchronize()
            out = np.frombuffer(pinned, buffer.dtype.numpy, buffer.count).copy()
            self._recycle([done])
            return out
        except Exception as exc:
            error = translate(exc, during="downloading a resident buffer", device=self.info.name)
            self._note(exc, error)
            raise error from exc
        finally:
            self._streams.release(index)

    def free(self, buffer: ResidentBuffer) -> None:
        """Release a resident buffer; in-flight work using it keeps it alive until it ends.

        Raises:
            InvalidProgram: the buffer belongs to another backend instance or was
                already freed (freeing after close is allowed).
        """
        check_buffer(buffer, "free").native(self)
        buffer._release()
        self._resident.pop(buffer.id, None)

    @property
    def resident_count(self) -> int:
        """Number of live resident buffers."""
        return len(self._resident)

    # Lifecycle --------------------------------------------------------------------
    async def flush(self) -> None:
        """Wait, without blocking the event loop, until the device finished all submitted work."""
        await poll_until(lambda: not self._bridge.in_flight)

    async def shutdown(self) -> None:
        """Refuse new work, let submitted work finish (bounded), then release the device side.

        A running GPU kernel cannot be stopped: `shutdown` waits for submitted
        work at most ``close_timeout`` seconds (without blocking the event loop).
        Work still running after that has its dispatches failed with
        `BackendClosed`; its device memory stays referenced by the completion
        thread (a daemon, which never keeps the process alive) until it ends.
        """
        self._closed = True
        if self.prefetcher is not None:
            self.prefetcher.close()
        deadline = anyio.current_time() + self.close_timeout
        with anyio.move_on_after(self.close_timeout):
            await poll_until(lambda: not self._bridge.in_flight)
        # A dispatch racing the close (past its open check on another thread) may still
        # submit: the join is bounded by what is left of close_timeout, then abandoned.
        self._bridge.close(timeout=max(0.0, deadline - anyio.current_time()))
        if self._bridge.in_flight:
            stuck = self._bridge.abandon(
                BackendClosed(
                    f"the cupy backend was closed while a dispatch still ran on the GPU after "
                    f"{self.close_timeout} s; its result was discarded",
                    fix="await the dispatches you need (or backend.flush()) before closing, "
                    "or raise close_timeout",
                )
            )
            _log.warning(
                "cupy backend closed with %d unfinished GPU operation(s) after %.1f s; "
                "their dispatches failed with BackendClosed",
                stuck,
                self.close_timeout,
            )
        self._streams.close()
        self._events.clear()


class _Copy:
    """A resident-buffer upload or memset, watched so its staging and stream lease are released."""

    __slots__ = ("backend", "done", "keep", "stream")

    def __init__(self, backend: CupyBackend, stream: int, done: Any, keep: tuple[Any, ...]) -> None:
        self.backend = backend
        self.stream = stream
        self.done = done
        self.keep = keep

    def ready(self) -> bool:
        """Return True once the copy finished."""
        return bool(self.done.done)

    def abandon(self, error: BaseException) -> None:
        """The backend closed before the copy ended: nothing waits on it."""

    def finish(self, error: BaseException | None) -> None:
        """Release the staging memory and the stream lease; log a device error."""
        self.backend._streams.release(self.stream)
        self.keep = ()
        if error is not None:
            failure = translate(error, during="copying a resident buffer", device="the GPU")
            self.backend._note(error, failure)
            _log.error("resident buffer copy failed: %s", failure)


def _resident_sources(params: Any, items: list[Any]) -> list[Source | None]:
    """DIRECT for resident inputs, DEVICE for READ_WRITE ones also passed in another slot."""
    if not any(isinstance(item, ResidentBuffer) for item in items):
        return [None] * len(items)
    seen = Counter(item.id for item in items if isinstance(item, ResidentBuffer))
    out: list[Source | None] = []
    for param, item in zip(params, items, strict=True):
        if not isinstance(item, ResidentBuffer):
            out.append(None)
        elif param.decl.access is Access.READ_WRITE and seen[item.id] > 1:
            out.append(Source.DEVICE)
        else:
            out.append(Source.DIRECT)
    return out


def _writes(slot: Any, item: Any) -> bool:
    return isinstance(item, ResidentBuffer) and slot.readback is not None


def _pointer(slot: Any, item: Any, base: int, backend: CupyBackend) -> int:
    if slot.source is Source.DIRECT:
        return int(item.native(backend).ptr)
    return base + int(slot.offset)


def _timeout(launch: Launch, *, started: bool = False) -> DispatchTimeout:
    name = launch.config.label or launch.plan.program.op_id or ""
    what = (
        "ended after its timeout of {} s; its result was discarded"
        if started
        else "was not started: past its timeout of {} s"
    )
    return DispatchTimeout(
        f"dispatch {name} " + what.format(launch.config.timeout),
        fix="raise DispatchConfig.timeout or split the work into smaller dispatches",
    )
