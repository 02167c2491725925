"""`DeviceContext`: the one object that owns a backend's CUDA device state.

It holds the CuPy module and runtime, the device description, the stream pool
(`vyre_cupy.streams`), the completion bridge (`vyre_cupy.completion`), the
recycled CUDA events, allocation of device arenas and pinned staging (CuPy's
pools), the lock that guards resident-buffer events and captured graphs, and
whether the device is lost. CUDA and CuPy exceptions become vyre-async errors in
exactly one way, `DeviceContext.translate`, reached through the context manager
`DeviceContext.errors`::

    with context.errors("compiling the kernel"):
        ...  # a CuPy/CUDA exception leaves as DeviceOutOfMemory, DeviceLost or
             # DispatchFailed (vyre_cupy.errors.translate), raised from it; a
             # sticky error marks the device lost for every later dispatch

or, on the dispatch path, which settles a dispatch with the error rather than
raising it (and pays for no ``with`` per dispatch), through
`DeviceContext.failure` in an ``except Exception`` clause.

Layering: this module imports `vyre_cupy.device`, `errors`, `streams` and
`completion` only; `vyre_cupy.launch`, `batch` and `backend` build on it.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections import deque
from types import ModuleType, TracebackType
from typing import Any, Literal

from vyre_async.abc import public_dir as _public_dir
from vyre_async.errors import BackendError, DeviceLost
from vyre_cupy.completion import CompletionBridge
from vyre_cupy.device import DeviceInfo
from vyre_cupy.errors import is_device_lost, translate
from vyre_cupy.streams import StreamPool

__all__ = ["DeviceContext", "ErrorScope"]
__dir__ = _public_dir(__name__)

_log = logging.getLogger("vyre_async.cupy")
#: Recycled CUDA events kept at most.
_EVENTS_KEPT = 1024


class ErrorScope:
    """The context manager `DeviceContext.errors` returns (one per activity, reused).

    On an `Exception` that is not already a `BackendError`, raise its
    translation (`vyre_cupy.errors.translate`) ``from`` it, and mark the device
    lost when it was a sticky CUDA error. A `BackendError` passes through
    unchanged; a `BaseException` that is not an `Exception` (cancellation,
    interrupts) too.
    """

    __slots__ = ("context", "doing")

    def __init__(self, context: DeviceContext, doing: str) -> None:
        self.context = context
        self.doing = doing

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, BackendError):
            return False
        raise self.context.translate(exc, self.doing) from exc


class DeviceContext:
    """One CUDA device as a backend uses it (see the module docstring).

    Args:
        cupy: The imported ``cupy`` module (`vyre_cupy.device.probe`).
        info: What the probe learned about the device.
        streams: Size of the non-blocking stream pool.

    Attributes:
        cupy: The ``cupy`` module.
        runtime: ``cupy.cuda.runtime``.
        info: The device description.
        streams: The stream pool every dispatch leases from.
        bridge: The completion bridge (its thread makes this device current first).
        lock: Guards resident buffers' ordering events and kernels' captured graphs.
        grid_limit: The device's largest grid, per axis.
        lost: The `DeviceLost` error of the sticky CUDA error that poisoned the
            context, or None while the device is usable.
    """

    def __init__(self, cupy: ModuleType, info: DeviceInfo, *, streams: int) -> None:
        self.cupy = cupy
        self.runtime: Any = cupy.cuda.runtime
        self.info = info
        self.grid_limit = (
            info.attribute("MaxGridDimX", 2**31 - 1),
            info.attribute("MaxGridDimY", 65535),
            info.attribute("MaxGridDimZ", 65535),
        )
        self.streams = StreamPool(streams, self._make_stream)
        self.bridge = CompletionBridge(on_start=self.use_device)
        self.lock = threading.Lock()
        self.lost: DeviceLost | None = None
        self._events: deque[Any] = deque()
        self._elapsed_ms = cupy.cuda.get_elapsed_time
        self._scopes: dict[str, ErrorScope] = {}

    # Errors --------------------------------------------------------------------------
    def errors(self, doing: str) -> ErrorScope:
        """Return the context manager that maps CuPy/CUDA exceptions raised while ``doing``.

        ``doing`` completes "... while {doing}" in the message ("launching the
        kernel"). See `ErrorScope`.
        """
        scope = self._scopes.get(doing)
        if scope is None:
            scope = self._scopes[doing] = ErrorScope(self, doing)
        return scope

    def translate(self, exc: BaseException, doing: str) -> BackendError:
        """Return the vyre-async error for ``exc`` and mark the device lost if it is sticky.

        For callers that hand the error on rather than raise it (`ErrorScope`
        is the usual way in).
        """
        error = translate(exc, during=doing, device=self.info.name)
        if is_device_lost(exc) and isinstance(error, DeviceLost) and self.lost is None:
            self.lost = error
            _log.error("CUDA device %s is lost: %s", self.info.name, error)
        return error

    def failure(self, exc: Exception, doing: str) -> BackendError:
        """Return the error a dispatch fails with for ``exc``, raised while ``doing``.

        ``exc`` itself when it is a `BackendError`; else its translation, with
        ``exc`` as its cause (what `ErrorScope` raises). For the dispatch path,
        which settles dispatches with the error instead of raising it.
        """
        if isinstance(exc, BackendError):
            return exc
        error = self.translate(exc, doing)
        error.__cause__ = exc
        return error

    def check_usable(self) -> None:
        """Raise `DeviceLost` once a sticky CUDA error poisoned the context."""
        if self.lost is not None:
            raise DeviceLost(
                f"the CUDA device is lost after an earlier error: {self.lost.message}",
                fix="restart the process; CUDA cannot recover a context after a sticky error",
            )

    # Device, memory, events ----------------------------------------------------------
    def use_device(self) -> None:
        """Make this device current on the calling thread."""
        runtime = self.runtime
        if runtime.getDevice() != self.info.ordinal:
            runtime.setDevice(self.info.ordinal)

    def alloc(self, nbytes: int, stream: Any) -> Any:
        """Allocate ``nbytes`` of device memory tied to ``stream`` (CuPy's memory pool)."""
        with stream:
            return self.cupy.cuda.alloc(nbytes)

    def pinned(self, nbytes: int) -> Any:
        """Allocate pinned host memory for staging or readback (CuPy's pinned pool)."""
        return self.cupy.cuda.alloc_pinned_memory(nbytes)

    def events(self, n: int) -> list[Any]:
        """Return ``n`` CUDA events, recycled ones first (safe from any thread)."""
        pool = self._events
        out = []
        for _ in range(n):  # each pop on its own: another thread may take some meanwhile
            try:
                out.append(pool.popleft())
            except IndexError:
                out.append(self.cupy.cuda.Event())
        return out

    def recycle(self, events: list[Any]) -> None:
        """Keep finished events for later dispatches (never one another operation waits on)."""
        if len(self._events) < _EVENTS_KEPT:
            self._events.extend(events)

    def blocks_per_sm(self, function: Any, lanes: int) -> int:
        """Blocks of ``lanes`` threads of loaded ``function`` one SM runs at once.

        ``cuOccupancyMaxActiveBlocksPerMultiprocessor`` through CuPy's driver
        bindings (``cupy.cuda.driver``), on ``function.ptr``; the kernels' shared
        memory is static, so no dynamic shared memory is asked for.
        """
        driver = getattr(self.cupy.cuda, "driver", None)
        if driver is None:  # (CuPy keeps the bindings in cupy_backends)
            driver = importlib.import_module("cupy_backends.cuda.api.driver")
        return int(driver.occupancyMaxActiveBlocksPerMultiprocessor(function.ptr, lanes, 0))

    def elapsed_ns(self, start: Any, end: Any) -> float:
        """Nanoseconds between two completed events (``cudaEventElapsedTime``)."""
        return float(self._elapsed_ms(start, end)) * 1e6

    def close_streams(self) -> None:
        """Drop the streams and recycled events (once nothing is in flight)."""
        self.streams.close()
        self._events.clear()

    def _make_stream(self) -> Any:
        self.use_device()
        return self.cupy.cuda.Stream(non_blocking=True)
