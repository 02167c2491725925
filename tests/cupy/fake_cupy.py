"""A fake CUDA device behind a fake ``cupy``: the backend's whole runtime path, without a GPU.

The fake implements exactly the slice of CuPy's API that `vyre_cupy` uses —
``cupy.cuda.runtime`` (device queries, ``memcpyAsync``, ``memcpy2DAsync``,
``memsetAsync``), stream capture into graphs (``begin_capture``/``end_capture``,
``Graph.launch``),
``Device.attributes``, ``Stream(non_blocking=True)`` with ``wait_event``,
``Event`` (``record``/``done``/``synchronize``), ``get_elapsed_time``,
``alloc``, ``alloc_pinned_memory``, ``cupy.cuda.function.Module`` and the NVRTC
bindings — with the semantics the backend relies on:

- "device" memory is host memory, so device pointers are real addresses;
- each stream is a worker thread running its queued operations in order, so
  copies, launches and event records really are asynchronous to the caller;
- kernels run in the CPU emulator built as a shared library
  (``emulation/library.inc``); "NVRTC" hands the generated source through, and
  ``Module.load`` finds the kernel compiled from that exact source in the library;
- cooperative launches (``function(..., enable_cooperative_groups=True)``) of
  kernels with grid-wide barriers run every lane of the grid as a thread
  (``vy_emu::launch_cooperative``); the device reports ``CooperativeLaunch``
  (``cooperative``), answers ``cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor``
  (``blocks_per_sm``), refuses a cooperative launch larger than that times its
  SMs (``cudaErrorCooperativeLaunchTooLarge``, as CUDA does) and counts each
  kind of launch (``cooperative_launches``);
- fault injection: out-of-memory past ``memory_limit``, and a sticky
  ``cudaErrorIllegalAddress`` for the next launch (``fail_next_launch``);
- undefined behaviour: the library runs under UBSan, built to report and go on
  (an abort would kill pytest) into one log file per test process; after every
  launch the device reads what the log gained and keeps it, described (UBSan's
  message, the prelude helper or kernel at that line, the launch), for
  `take_sanitizer_reports`, which ``conftest.py`` calls after each test phase
  to fail the test. UBSan reports each source location once per loaded
  library, and each device loads its own copy, so the first test of each
  module (each device) that reaches a given piece of UB fails with it.

What this does not prove: anything about real CUDA (timing, the driver, the
real CuPy signatures beyond those mirrored here). That is ``scripts/gpu-check``'s job.
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import os
import queue
import shutil
import tempfile
import threading
import time
import types
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.cupy.emulator import describe_ub
from vyre_async.ir import Program
from vyre_cupy.codegen import generate, sanitize

__all__ = [
    "CUDARuntimeError",
    "FakeDevice",
    "OutOfMemoryError",
    "fail_on_sanitizer_reports",
    "take_sanitizer_reports",
]

MEMCPY_H2D, MEMCPY_D2H, MEMCPY_D2D = 1, 2, 3
_IMAGE_TAG = b"FAKE-CUBIN\n"


class CUDARuntimeError(RuntimeError):
    """Same name and ``status`` attribute as CuPy's runtime error."""

    def __init__(self, status: int) -> None:
        super().__init__(f"cudaError {status}")
        self.status = status


class OutOfMemoryError(MemoryError):
    """Same name as ``cupy.cuda.memory.OutOfMemoryError``."""


class NVRTCError(RuntimeError):
    def __init__(self, status: int) -> None:
        super().__init__(f"NVRTC error {status}")
        self.status = status


class _SanitizerLog:
    """UBSan's log in the test process (every fake device's library writes to it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        folder = tempfile.mkdtemp(prefix="vyre-ubsan-")
        atexit.register(shutil.rmtree, folder, True)
        self.prefix = os.path.join(folder, "report")  # UBSan appends ".<pid>"
        self.offset = 0
        self.started = False  # the path is set once: setting it again truncates the log
        self.copies = 0
        self.reports: list[str] = []

    def private_copy(self, library: Path) -> Path:
        """Return a new copy of ``library`` (a path no library was loaded from before).

        Named by process too: processes forked from one that imported this module
        (mutmut runs each mutant's tests so) share its folder and its count, and two
        of them copying over one path truncated the library the other had loaded
        (SIGBUS, SIGSEGV: half the CUDA host side's mutants crashed its runner).
        """
        with self.lock:
            self.copies += 1
            copy = Path(self.prefix).parent / f"lib{os.getpid()}-{self.copies}-{library.name}"
        shutil.copyfile(library, copy)
        return copy

    def attach(self, lib: ctypes.CDLL, library: Path) -> None:
        """Send the UBSan reports of ``lib`` (loaded once, from ``library``) to the log.

        A self-test report (``vy_emu_ubsan_selftest``) must arrive there.

        Raises:
            AssertionError: the library has no UBSan, or its self-test report did not
                reach the log (UBSAN_OPTIONS of the environment may name another log_path).
        """
        try:  # getattr: ``lib.__name`` would be name-mangled inside a class
            set_path = getattr(lib, "__sanitizer_set_report_path")
            selftest = lib.vy_emu_ubsan_selftest
        except AttributeError:
            raise AssertionError(f"{library} was built without UBSan") from None
        selftest.argtypes = [ctypes.c_uint, ctypes.c_uint]
        selftest.restype = ctypes.c_uint
        if "halt_on_error=1" in os.environ.get("UBSAN_OPTIONS", ""):
            raise AssertionError("UBSAN_OPTIONS has halt_on_error=1: UBSan would kill pytest")
        lib.vy_emu_ubsan_log(self.prefix.encode())  # the options of a runtime not started yet
        with self.lock:
            if not self.started:  # start the runtime, then point it at the log (for good)
                selftest(0, 32)
                set_path(self.prefix.encode())  # the next report truncates the log
                self.started, self.offset = True, 0
        selftest(1, 33)
        log = self.gained().splitlines(keepends=True)
        if not any("shift exponent 33 is too large" in line for line in log):
            raise AssertionError(
                f"UBSan's self-test report of {library} did not reach {self.prefix}.<pid> "
                f"(log: {log!r}); is log_path set in UBSAN_OPTIONS?"
            )
        others = "".join(line for line in log if "library.inc:" not in line)
        if others:  # a concurrent launch's report: keep it, unattributed
            with self.lock:
                self.reports += [f"{r} -- kernel unknown" for r in describe_ub(others, None)]

    def gained(self) -> str:
        """Return the whole lines the log gained since the last call.

        A line still being written (a concurrent launch's report) is left for
        the next call, so a report is never split between two launches.
        """
        path = f"{self.prefix}.{os.getpid()}"
        with self.lock:
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                return ""
            if size < self.offset:  # truncated (never expected): read it all again
                self.offset = 0
            if size == self.offset:
                return ""
            with open(path, "rb") as log:
                log.seek(self.offset)
                data = log.read(size - self.offset)
            data = data[: data.rfind(b"\n") + 1]  # whole lines only
            self.offset += len(data)
        return data.decode(errors="replace")


_UBSAN = _SanitizerLog()


def take_sanitizer_reports() -> list[str]:
    """Return (and forget) the undefined behaviour every fake device saw since the last call."""
    with _UBSAN.lock:
        reports, _UBSAN.reports = _UBSAN.reports, []
    return reports


def fail_on_sanitizer_reports() -> None:
    """Fail the running test phase with the reports `take_sanitizer_reports` returns, if any.

    Called by the hooks of ``tests/conftest.py`` after every setup, call and
    teardown: a report read after a launch fails the phase it arrived in.
    """
    import pytest

    reports = take_sanitizer_reports()
    if reports:
        pytest.fail(
            "undefined behaviour (UBSan) in kernels the fake CUDA device ran:\n"
            + "\n".join(reports),
            pytrace=False,
        )


class FakeDevice:
    """One emulated GPU and the fake CuPy modules that reach it.

    Args:
        library: The emulator shared library (``build_emulator(..., library=True)``).
        programs: The programs it holds, in kernel order.
    """

    def __init__(self, library: Path, programs: Sequence[Program]) -> None:
        # A private copy: UBSan reports each source location once per loaded library, so
        # each device (each test module) gets its own first report of any one piece of UB.
        private = _UBSAN.private_copy(library)
        self.lib = ctypes.CDLL(str(private))
        _UBSAN.attach(self.lib, private)
        self.unit = library.parent / "unit.cpp"  # the generated source, for UBSan's line numbers
        self.names = [sanitize(p.op_id) if p.op_id else "-" for p in programs]
        self.lib.vy_emu_launch.argtypes = [ctypes.c_uint] * 7 + [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_int,
        ]
        self.lib.vy_emu_launch.restype = ctypes.c_int
        self.lib.vy_emu_launch_batch.argtypes = [ctypes.c_uint] * 7 + [
            ctypes.POINTER(ctypes.c_void_p)
        ]
        self.lib.vy_emu_launch_batch.restype = ctypes.c_int
        self.kernels: dict[str, int] = {}
        for index, program in enumerate(programs):
            self.kernels.setdefault(generate(program).source, index)
            # (the backend compiles grid-barrier segments without their batch kernel)
            self.kernels.setdefault(generate(program, batch=False).source, index)
        #: ``CooperativeLaunch`` as the device reports it (read when a backend probes).
        self.cooperative = True
        #: Blocks of a kernel one SM holds (the occupancy API); None: ``2048 // lanes``
        #: (at most 32), about what a real SM holds of a small kernel.
        self.blocks_per_sm: int | None = None
        self.sm_count = 132
        self.cooperative_launches = 0
        #: Calls of the occupancy API (``cupy.cuda.driver``) by the backend.
        self.occupancy_calls = 0
        #: Every plain or cooperative launch, in order: ``(kernel index, grid, block,
        #: cooperative, stream)``.
        self.launch_log: list[tuple[int, tuple[int, ...], tuple[int, ...], bool, int]] = []
        self.launch_lock = threading.Lock()  # threaded kernels share static __shared__ arrays
        #: Seconds every plain kernel launch takes beyond the emulation: slept on the
        #: stream thread, or (``timed``) added to the device timeline.
        self.kernel_s = 0.0
        #: A device that needs no host thread, like a GPU: every stream operation
        #: runs at once on the enqueuing thread, and an event becomes done when the
        #: device timeline (``busy_until``, advanced by ``kernel_s`` per launch)
        #: reaches it. For timing completion without the GIL in the way.
        self.timed = False
        #: A device that does nothing: copies, memsets and kernels are dropped and
        #: every event is done once recorded. For measuring the host code that
        #: drives a device with almost nothing of the fake's own to subtract
        #: (results are garbage while it is set).
        self.null = False
        self.busy_until = 0.0
        #: When the newest recorded event fires (``timed``: its place on the timeline).
        self.last_ready_at = 0.0
        self.memory_limit = 1 << 31
        self.allocated = 0
        self.sticky: int | None = None
        self.fail_next_launch = False
        self.compiles = 0
        self.launches = 0
        self.batch_launches = 0
        self.captures = 0
        self.replays = 0
        self.streams: weakref.WeakValueDictionary[int, FakeStream] = weakref.WeakValueDictionary()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    # The fake modules ---------------------------------------------------------------
    def modules(self) -> dict[str, types.ModuleType]:
        """Return the ``sys.modules`` entries that make ``import cupy`` reach this device."""
        device = self

        runtime: Any = types.ModuleType("cupy_backends.cuda.api.runtime")
        runtime.CUDARuntimeError = CUDARuntimeError
        runtime.memcpyHostToDevice = MEMCPY_H2D
        runtime.memcpyDeviceToHost = MEMCPY_D2H
        runtime.memcpyDeviceToDevice = MEMCPY_D2D
        runtime.getDeviceCount = lambda: 1
        runtime.getDevice = lambda: 0
        runtime.setDevice = lambda ordinal: None
        runtime.driverGetVersion = lambda: 13000
        runtime.runtimeGetVersion = lambda: 13000
        runtime.getDeviceProperties = lambda ordinal: {
            "name": b"Emulated sm_90 (CPU)",
            "major": 9,
            "minor": 0,
            "totalGlobalMem": 1 << 34,
        }
        runtime.memcpyAsync = self._memcpy
        runtime.memsetAsync = self._memset
        runtime.memcpy2DAsync = self._memcpy2d
        runtime.deviceSynchronize = self._synchronize

        function: Any = types.ModuleType("cupy.cuda.function")
        function.Module = lambda: FakeModule(device)

        cuda: Any = types.ModuleType("cupy.cuda")
        cuda.runtime = runtime
        cuda.function = function
        cuda.Device = lambda ordinal=0: types.SimpleNamespace(
            id=ordinal,
            attributes={
                "CooperativeLaunch": int(device.cooperative),
                "MaxThreadsPerBlock": 1024,
                "MaxBlockDimX": 1024,
                "MaxBlockDimY": 1024,
                "MaxBlockDimZ": 64,
                "MaxGridDimX": 2**31 - 1,
                "MaxGridDimY": 65535,
                "MaxGridDimZ": 65535,
                "MaxSharedMemoryPerBlock": 49152,
                "WarpSize": 32,
                "ConcurrentKernels": 1,
                "MultiProcessorCount": device.sm_count,
            },
        )
        cuda.Stream = lambda non_blocking=False: FakeStream(device)
        cuda.Event = lambda block=False, disable_timing=False: FakeEvent(device)
        cuda.get_elapsed_time = lambda start, end: (end.stamp - start.stamp) * 1e3
        cuda.alloc = self._alloc
        cuda.alloc_pinned_memory = PinnedMemory

        driver: Any = types.ModuleType("cupy_backends.cuda.api.driver")
        driver.occupancyMaxActiveBlocksPerMultiprocessor = self.occupancy
        cuda.driver = driver

        cupy: Any = types.ModuleType("cupy")
        cupy.__version__ = "13.6.0+fake"
        cupy.cuda = cuda

        nvrtc: Any = types.ModuleType("cupy_backends.cuda.libs.nvrtc")
        nvrtc.NVRTCError = NVRTCError
        nvrtc.getVersion = lambda: (13, 0)
        nvrtc.getSupportedArchs = lambda: (75, 80, 86, 89, 90, 100, 120)
        sources: dict[int, str] = {}
        counter = itertools.count(1)

        def create_program(src: str, name: str, headers: Any, names: Any) -> int:
            handle = next(counter)
            sources[handle] = src
            return handle

        def compile_program(handle: int, options: Sequence[str]) -> None:
            device.compiles += 1
            assert "-ftz=false" in options and "--fmad=false" in options

        nvrtc.createProgram = create_program
        nvrtc.compileProgram = compile_program
        nvrtc.getProgramLog = lambda handle: ""
        nvrtc.getCUBIN = lambda handle: _IMAGE_TAG + sources[handle].encode()
        nvrtc.getPTX = lambda handle: _IMAGE_TAG + sources[handle].encode()
        nvrtc.destroyProgram = lambda handle: sources.pop(handle)

        packages = {
            name: types.ModuleType(name) for name in ("cupy_backends", "cupy_backends.cuda")
        }
        libs: Any = types.ModuleType("cupy_backends.cuda.libs")
        libs.nvrtc = nvrtc
        return {
            "cupy": cupy,
            "cupy.cuda": cuda,
            "cupy.cuda.function": function,
            "cupy.cuda.driver": driver,
            **packages,
            "cupy_backends.cuda.libs": libs,
            "cupy_backends.cuda.libs.nvrtc": nvrtc,
        }

    # Runtime calls --------------------------------------------------------------------
    def check(self) -> None:
        """Raise the sticky error, if the device has one (as every CUDA call then does)."""
        if self.sticky is not None:
            raise CUDARuntimeError(self.sticky)

    def _alloc(self, nbytes: int) -> DeviceMemory:
        self.check()
        with self._lock:
            if self.allocated + nbytes > self.memory_limit:
                raise OutOfMemoryError(f"out of memory allocating {nbytes} bytes")
            self.allocated += nbytes
        return DeviceMemory(self, nbytes)

    def occupancy(self, function: int, block_size: int, dynamic_shared: int) -> int:
        """``cuOccupancyMaxActiveBlocksPerMultiprocessor`` of a loaded function (by ``ptr``)."""
        self.check()
        assert isinstance(function, int) and function > 0, "a CUfunction handle"
        assert dynamic_shared == 0, "generated kernels use static shared memory only"
        self.occupancy_calls += 1
        return self.resident_per_sm(block_size)

    def resident_per_sm(self, block_size: int) -> int:
        """Blocks of ``block_size`` lanes one SM holds (what the occupancy API answers)."""
        if self.blocks_per_sm is not None:
            return self.blocks_per_sm
        return max(1, min(32, 2048 // max(1, block_size)))

    def _synchronize(self) -> None:
        """``cudaDeviceSynchronize``: wait until every stream ran what it was given."""
        for stream in list(self.streams.values()):
            marker = FakeEvent(self)
            marker.record(stream)
            marker.synchronize()

    def _stream(self, ptr: int) -> FakeStream:
        return self.streams[ptr]

    def _memcpy(self, dst: int, src: int, size: int, kind: int, stream: int) -> None:
        self.check()
        if self.null:
            return
        assert kind in (MEMCPY_H2D, MEMCPY_D2H, MEMCPY_D2D)
        self._stream(stream).enqueue(lambda: ctypes.memmove(dst, src, size))

    def _memcpy2d(
        self,
        dst: int,
        dpitch: int,
        src: int,
        spitch: int,
        width: int,
        height: int,
        kind: int,
        stream: int,
    ) -> None:
        self.check()
        assert kind in (MEMCPY_H2D, MEMCPY_D2H, MEMCPY_D2D)
        assert width <= dpitch and width <= spitch, "cudaErrorInvalidPitchValue"
        if self.null:
            return

        def copy() -> None:
            for row in range(height):
                ctypes.memmove(dst + row * dpitch, src + row * spitch, width)

        self._stream(stream).enqueue(copy)

    def _memset(self, ptr: int, value: int, size: int, stream: int) -> None:
        self.check()
        if self.null:
            return
        self._stream(stream).enqueue(lambda: ctypes.memset(ptr, value, size))

    def launch(
        self,
        index: int,
        threaded: bool,
        grid: Any,
        block: Any,
        args: Any,
        *,
        batch: bool = False,
        cooperative: bool = False,
    ) -> None:
        """Run kernel ``index`` (its batch kernel when ``batch``) now, on a stream thread."""
        if self.fail_next_launch:
            self.fail_next_launch = False
            self.sticky = 700  # cudaErrorIllegalAddress: the context is gone
            return
        if self.sticky is not None:
            return
        pointers = (ctypes.c_void_p * len(args))(*[int(a) for a in args])
        if batch:
            status = self.lib.vy_emu_launch_batch(index, *grid, *block, pointers)
            self.batch_launches += 1
        elif cooperative:  # every lane of the grid a thread (static shared arrays: the lock)
            with self.launch_lock:
                status = self.lib.vy_emu_launch(index, *grid, *block, pointers, 2)
        else:
            with self.launch_lock if threaded else _NO_LOCK:
                status = self.lib.vy_emu_launch(index, *grid, *block, pointers, int(not threaded))
        self._check_sanitizer(index, batch)
        assert status == 0
        self.launches += 1
        if self.timed:  # the kernel occupies the device timeline, no host thread
            self.busy_until = max(time.perf_counter(), self.busy_until) + self.kernel_s
        elif self.kernel_s:  # a kernel of known duration (the GIL is free meanwhile)
            time.sleep(self.kernel_s)

    def _check_sanitizer(self, index: int, batch: bool) -> None:
        """Keep, described, whatever UBSan reported while this (or a concurrent) launch ran."""
        gained = _UBSAN.gained()
        if not gained:
            return
        kernel = f"k{index}{'_batch' if batch else ''} (program {self.names[index]})"
        found = describe_ub(gained, self.unit)
        if not found:  # not UBSan's usual line: keep it whole (but not its SUMMARY lines)
            rest = [ln for ln in gained.splitlines() if ln.strip() and "SUMMARY:" not in ln]
            found = [f"UBSan: {chr(10).join(rest)[-2000:]}"] if rest else []
        with _UBSAN.lock:
            _UBSAN.reports += [f"{line} -- reported during a launch of {kernel}" for line in found]

    def new_stream_id(self) -> int:
        return next(self._ids)


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_LOCK = _NoLock()


class DeviceMemory:
    """A "device" allocation: host memory whose address is the device pointer."""

    def __init__(self, device: FakeDevice, nbytes: int) -> None:
        self.buffer = (ctypes.c_char * max(nbytes, 1))()
        self.ptr = ctypes.addressof(self.buffer)
        self.nbytes = nbytes

        def release(device: FakeDevice = device, nbytes: int = nbytes) -> None:
            with device._lock:
                device.allocated -= nbytes

        weakref.finalize(self, release)


class PinnedMemory(bytearray):
    """Pinned host memory: a buffer (numpy can view it) with a stable ``ptr``."""

    def __init__(self, nbytes: int) -> None:
        super().__init__(nbytes)
        self._view = (ctypes.c_char * max(nbytes, 1)).from_buffer(self) if nbytes else None
        self.ptr = ctypes.addressof(self._view) if self._view is not None else 0


class FakeStream:
    """A stream: one worker thread running queued operations in submission order."""

    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.ptr = device.new_stream_id()
        device.streams[self.ptr] = self
        self._queue: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self.captured: list[Callable[[], object]] | None = None
        thread = threading.Thread(
            target=_stream_main, args=(self._queue,), name=f"fake-stream-{self.ptr}", daemon=True
        )
        thread.start()
        weakref.finalize(self, self._queue.put, None)

    def enqueue(self, op: Callable[[], object]) -> None:
        if self.captured is not None:  # stream capture: record instead of running
            self.captured.append(op)
        elif self.device.timed:
            op()
        else:
            self._queue.put(op)

    def wait_event(self, event: FakeEvent) -> None:
        self.device.check()
        assert self.captured is None, "the fake does not capture event waits"
        generation = event.generation
        if self.device.timed:  # later work starts after the event on the timeline
            device = self.device
            device.busy_until = max(device.busy_until, event.ready_at)
            return
        self.enqueue(lambda: event.wait_for(generation))

    def begin_capture(self, mode: int | None = None) -> None:
        """Start recording this stream's operations into a graph (CuPy's relaxed mode)."""
        self.device.check()
        assert self.captured is None, "cudaErrorIllegalState: already capturing"
        self.captured = []
        self.device.captures += 1

    def end_capture(self) -> FakeGraph:
        """Stop recording; return the graph of the recorded operations."""
        assert self.captured is not None, "cudaErrorIllegalState: not capturing"
        ops, self.captured = self.captured, None
        return FakeGraph(self.device, ops)

    def __enter__(self) -> FakeStream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _stream_main(ops: queue.SimpleQueue[Callable[[], object] | None]) -> None:
    while True:
        op = ops.get()
        if op is None:
            return
        op()


class FakeGraph:
    """An executable graph: the captured operations, re-run in order on each ``launch``."""

    def __init__(self, device: FakeDevice, ops: list[Callable[[], object]]) -> None:
        self.device = device
        self.ops = ops

    def launch(self, stream: FakeStream | None = None) -> None:
        assert stream is not None, "the backend always names the stream"
        self.device.check()
        self.device.replays += 1
        for op in self.ops:
            stream.enqueue(op)


class FakeEvent:
    """A CUDA event: ``record`` captures the stream's work so far; ``done`` never blocks."""

    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.generation = 0
        self.completed = 0
        self.stamp = 0.0
        #: ``timed`` devices: when the device timeline reaches this event.
        self.ready_at = 0.0
        self._cond = threading.Condition()

    def record(self, stream: FakeStream) -> None:
        self.device.check()
        if self.device.null:  # done at once
            self.generation = self.completed = self.generation + 1
            return
        with self._cond:
            self.generation += 1
            generation = self.generation
        stream.enqueue(lambda: self._complete(generation))

    def _complete(self, generation: int) -> None:
        with self._cond:
            now = time.perf_counter()
            self.ready_at = max(now, self.device.busy_until) if self.device.timed else now
            self.stamp = self.device.last_ready_at = self.ready_at
            self.completed = max(self.completed, generation)
            self._cond.notify_all()

    def wait_for(self, generation: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.completed >= generation)

    @property
    def done(self) -> bool:
        """Like CuPy's ``Event.done`` (``cudaEventQuery``): never blocks, raises device errors."""
        device = self.device
        device.check()
        if device.null:
            return self.completed >= self.generation
        if device.timed:  # operations ran on the recording thread: nothing to lock
            return self.completed >= self.generation and time.perf_counter() >= self.ready_at
        with self._cond:
            done = self.completed >= self.generation
        if done and self.device.timed:
            done = time.perf_counter() >= self.ready_at
        if done:
            self.device.check()
        return done

    def synchronize(self) -> None:
        self.wait_for(self.generation)
        if self.device.timed:
            time.sleep(max(0.0, self.ready_at - time.perf_counter()))
        self.device.check()


class FakeModule:
    """``cupy.cuda.function.Module``: ``load`` finds the kernel built from the same source."""

    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.index: int | None = None
        self.threaded = False
        self.grid_sync = False

    def load(self, image: bytes) -> None:
        self.device.check()
        if not image.startswith(_IMAGE_TAG):
            raise CUDARuntimeError(200)  # invalid image
        source = image[len(_IMAGE_TAG) :].rstrip(b"\0").decode()
        if source not in self.device.kernels:
            raise CUDARuntimeError(200)
        self.index = self.device.kernels[source]
        self.threaded = "__syncthreads" in source
        self.grid_sync = "this_grid().sync()" in source

    def get_function(self, name: str) -> FakeFunction:
        assert self.index is not None and name in ("vyre_main", "vyre_main_batch")
        batch = name == "vyre_main_batch"
        return FakeFunction(
            self.device, self.index, self.threaded and not batch, batch, self.grid_sync
        )


class FakeFunction:
    """``cupy.cuda.function.Function``: ``ptr`` (the CUfunction) and a launch by call."""

    _handles = itertools.count(1)

    def __init__(
        self, device: FakeDevice, index: int, threaded: bool, batch: bool, grid_sync: bool
    ) -> None:
        self.device = device
        self.index = index
        self.threaded = threaded
        self.batch = batch
        self.grid_sync = grid_sync
        self.ptr = next(self._handles)

    def __call__(
        self,
        grid: tuple[int, ...],
        block: tuple[int, ...],
        args: Any,
        shared_mem: int = 0,
        stream: Any = None,
        enable_cooperative_groups: bool = False,
    ) -> None:
        device, index = self.device, self.index
        device.check()
        if device.null:
            return
        assert len(grid) == len(block) == 3 and all(g >= 1 for g in grid + block)
        assert shared_mem == 0 and stream is not None
        cooperative = bool(enable_cooperative_groups)
        # A grid barrier in a plain launch is undefined on a GPU: here it is a test failure.
        assert cooperative or not self.grid_sync, "a grid-sync kernel launched without cooperation"
        if cooperative:
            lanes = block[0] * block[1] * block[2]
            blocks = grid[0] * grid[1] * grid[2]
            if blocks > device.sm_count * device.resident_per_sm(lanes):
                raise CUDARuntimeError(720)  # cudaErrorCooperativeLaunchTooLarge
            device.cooperative_launches += 1
        device.launch_log.append((index, tuple(grid), tuple(block), cooperative, stream.ptr))
        values = tuple(args)
        threaded, batch = self.threaded, self.batch
        stream.enqueue(
            lambda: device.launch(
                index, threaded, grid, block, values, batch=batch, cooperative=cooperative
            )
        )
