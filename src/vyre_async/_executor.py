"""`Executor`: what a backend implements, and the `Launch` records its ``enqueue`` receives.

`Launch` is one planned dispatch and `LaunchTemplate` what its launch shape
fixes for every dispatch of it; the dispatch front end (`vyre_async._frontend`)
builds both.

Backend authors import it from `vyre_async.abc`, with everything a hook
receives or returns; the engine modules import it from here, below them all.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from vyre_async._capabilities import BackendCapabilities
from vyre_async._config import DispatchConfig
from vyre_async._exports import public_dir as _public_dir
from vyre_async._pending import DispatchCompleter, PendingDispatch
from vyre_async._plan import BindingPlan
from vyre_async._resident import ResidentBuffer
from vyre_async.errors import UnsupportedFeature
from vyre_async.ir.ops import CORE_OPS, GRID_BARRIER_OP
from vyre_async.ir.program import Program
from vyre_async.ir.types import DType

if TYPE_CHECKING:
    from vyre_async._calibration import Calibration
    from vyre_async._execution import ExecutionDecision

__all__ = ["Executor", "Launch", "LaunchTemplate", "poll_until"]
__dir__ = _public_dir(__name__)

_DEFAULT_OPS = CORE_OPS - {GRID_BARRIER_OP}


class Launch:
    """Everything a backend's ``enqueue`` hook needs to run one dispatch (read-only).

    Attributes:
        pipeline: The compiled pipeline. Its ``program`` may differ from
            ``plan.program`` in buffer counts (one pipeline serves every size);
            use ``plan.program`` and ``plan.counts`` for sizes.
        plan: Binding plan: the dispatched program, geometry and every buffer's count.
        inputs: One item per input buffer: a private flat host array (the
            caller's own array, of any shape, for a backend whose
            ``copies_inputs`` is True), or a `ResidentBuffer` of this backend.
        config: The dispatch config.
        pending: The pending result handed to the caller.
        completer: Settles ``pending``; call exactly one of ``resolve``/``fail``.
        compile_s: Compile time this dispatch waited for.
        template: The `LaunchTemplate` of this launch shape.
        shape: What the executor's ``plan_shape`` hook returned for this launch
            shape (called once per shape; None by default).
        resident: True when any input is a `ResidentBuffer` (False: host arrays only).
    """

    __slots__ = (
        "compile_s",
        "completer",
        "config",
        "inputs",
        "pending",
        "pipeline",
        "plan",
        "resident",
        "shape",
        "template",
    )

    def __init__(
        self,
        pipeline: Any,
        plan: BindingPlan,
        inputs: tuple[np.ndarray | ResidentBuffer, ...],
        config: DispatchConfig,
        pending: PendingDispatch,
        completer: DispatchCompleter,
        compile_s: float,
        template: LaunchTemplate | None = None,
        resident: bool | None = None,
        shape: Any = None,
    ) -> None:
        self.pipeline = pipeline
        self.plan = plan
        self.inputs = inputs
        self.config = config
        self.pending = pending
        self.completer = completer
        self.compile_s = compile_s
        self.template = template
        self.shape = shape
        self.resident = (
            any(isinstance(item, ResidentBuffer) for item in inputs)
            if resident is None
            else resident
        )

    def __repr__(self) -> str:
        return f"<Launch {self.plan.program.op_id or 'program'} {self.plan.geometry}>"


class LaunchTemplate:
    """What one launch shape (program, config, input sizes) fixes for every dispatch of it.

    Attributes:
        program: The dispatched program.
        config: The dispatch config.
        plan: The binding plan.
        shape: ``(native, executor's plan_shape result)``: what the executor derived
            from this shape, for the pipeline artifact it was derived from (None
            until the first launch).
        telemetry: What `vyre_async.telemetry` derives from the shape (span
            attributes, metric labels), built on the first recorded dispatch.
    """

    __slots__ = ("config", "fingerprint", "plan", "program", "shape", "telemetry")

    def __init__(self, program: Program, config: DispatchConfig, plan: BindingPlan) -> None:
        self.program = program
        self.config = config
        self.plan = plan
        self.shape: tuple[Any, Any] | None = None
        self.telemetry: Any = None
        #: The shape fingerprint the prefetcher records (kept: built once per shape).
        self.fingerprint: tuple[bytes, tuple[int, int, int], tuple[int, int, int]] | None = None


def _anyio() -> Any:
    """anyio, imported by the first async helper that needs it (not with vyre-async)."""
    import anyio

    return anyio


async def poll_until(done: Callable[[], bool]) -> None:
    """Wait, without blocking the event loop, until ``done()`` is true.

    For executors whose work ends on other threads (``flush``; bound it with
    ``anyio.move_on_after`` in ``close``): polls with a backoff from 0.2 ms
    to 10 ms.
    """
    delay = 0.0002
    while not done():
        await _anyio().sleep(delay)
        delay = min(delay * 2, 0.01)


class Executor(abc.ABC):
    """What a backend implements: the target mechanics behind `vyre_async.VyreBackend`.

    Set ``id`` (a unique string) and implement `enqueue`; every other hook has
    a conservative default, documented on it. Hooks are called by the driver,
    never by users: it validates programs, checks and copies inputs, caches
    pipelines, plans launches, refuses work once the backend is closed and
    records telemetry before a hook sees anything.

    Threading: `enqueue` and `enqueue_batch` are called from whichever thread
    dispatches (often the event loop's): they must not block on the work.
    `build_pipeline` may run on the prefetcher's thread, concurrently with
    dispatches of other pipelines.
    """

    #: The backend's unique id (the registry's key, part of every cache identity).
    id: ClassVar[str]
    #: The executor's version: part of every cache identity, so compiled pipelines of
    #: another version are never reused.
    version: str = "unspecified"
    #: True when `enqueue` (and `enqueue_batch`) copy every host input into the
    #: executor's own memory before they return: ``launch.inputs`` then holds the
    #: caller's arrays themselves (checked for dtype and size, of any shape and
    #: strides; read them only inside those calls), so each input is copied once,
    #: straight into its final place. Default False: the driver hands private,
    #: flat copies that the executor may keep.
    copies_inputs: ClassVar[bool] = False

    # Identity and description ------------------------------------------------------
    def supported_ops(self) -> frozenset[str]:
        """Return the operations this backend executes, named as in `CORE_OPS`.

        Default: every one but the grid-wide barrier (``"stmt.grid_barrier"``), which
        an executor claims once it runs `vyre_async.ir.GridBarrier` programs, natively
        (``capabilities().grid_sync``) or as one launch per segment of
        `vyre_async.split_at_grid_barriers`. The driver refuses a program that uses
        an operation missing here with `UnsupportedFeature`.
        """
        return _DEFAULT_OPS

    def capabilities(self) -> BackendCapabilities:
        """Return what the backend supports natively. Default: nothing (every feature False).

        Read once per backend: the driver checks every launch against its limits
        (buffer sizes, workgroup and grid sizes) before `plan_shape` sees it.
        """
        return BackendCapabilities()

    def device_fingerprint(self) -> str:
        """Return a string that changes whenever compiled code stops being reusable.

        Part of the pipeline cache identity: device model and architecture, driver
        and runtime versions. Default: ``""`` (one host, nothing to distinguish).
        """
        return ""

    def compiler_fingerprint(self) -> str:
        """Return the compiler's name, version and fixed options. Default: ``""``."""
        return ""

    def compile_options(self, config: DispatchConfig) -> Mapping[str, object]:
        """Return options that change generated code for ``config``. Default: none."""
        return {}

    def calibrate(self) -> Calibration | None:
        """Measure the costs the launch policies need on this device, now.

        Return a `Calibration` (per-launch overhead, record/replay and persistent
        setup costs where the executor has those paths, transfer bandwidth,
        compile cost); `measure_host_costs` measures the part every backend has
        on a private probe backend. Users call
        ``vyre_async.calibration_for(backend, measure=True)``, which
        measures once per device and caches the record on disk. Default: None
        (nothing measured; policies that need costs choose plain launches).
        """
        return None

    # Pipelines ---------------------------------------------------------------------
    def build_pipeline(self, program: Program, config: DispatchConfig) -> Any:
        """Compile ``program`` into the executor's native artifact (``launch.pipeline.native``).

        Called once per cache identity (the driver shares one compile between
        racing callers and caches the result). Default: None (nothing to compile).

        Raises:
            KernelCompileFailed: the executor's compiler rejected the generated code.
        """
        return None

    def serialize_pipeline(self, native: Any) -> bytes | None:
        """Return bytes `load_pipeline` can rebuild ``native`` from. Default: None (memory only)."""
        return None

    def load_pipeline(self, payload: bytes, program: Program, config: DispatchConfig) -> Any:
        """Rebuild a native artifact from `serialize_pipeline` bytes (the disk cache).

        Raises:
            UnsupportedFeature: by default (the executor does not use the disk cache).
        """
        raise UnsupportedFeature(
            f"backend {self.id!r} cannot load pipelines from bytes",
            fix="disable the disk cache for this backend",
            feature="pipeline serialization",
        )

    # Dispatch ----------------------------------------------------------------------
    def plan_shape(self, native: Any, plan: BindingPlan, config: DispatchConfig) -> Any:
        """Return what this executor derives from one launch shape alone (``launch.shape``).

        Called once per launch shape — a pipeline's ``native`` artifact, the
        binding plan (program, geometry, every buffer's count) and the config —
        before its first dispatch; every later dispatch of that shape gets the
        same value in ``launch.shape``. Keep kernel arguments, an arena layout,
        a cost estimate here instead of recomputing them per dispatch. Raise
        here to refuse the shape (the dispatch raises; nothing is kept).
        Default: None.

        Raises:
            UnsupportedFeature: the shape exceeds a limit of the device.
            InvalidProgram: the shape cannot run on this executor.
        """
        return None

    @abc.abstractmethod
    def enqueue(self, launch: Launch) -> None:
        """Start one planned launch, without blocking on the work.

        Queue the work (worker pool, device stream) and later settle
        ``launch.completer`` exactly once — with the outputs (one array per
        output buffer, in order) or with an error — from any thread. Stop at a
        safe point once ``launch.completer.stop_requested`` is set (the result
        is no longer wanted). Raising here fails the dispatch before it starts
        (``backend.dispatch`` raises).
        """

    def enqueue_batch(self, launches: Sequence[Launch], decision: ExecutionDecision) -> None:
        """Start the planned launches of one ``CompiledPipeline.dispatch_batch`` call.

        ``decision`` is the execution-mode verdict for the batch. An executor
        with a native persistent kernel or graph replay runs ``launches`` that
        way when ``decision.mode.kind`` asks for it and the launches allow it.
        Whatever it runs, it records the mode on every launch (`annotate_mode`)
        before starting it, and settles every completer exactly once, as
        `enqueue`. Default: plain launches, one `enqueue` each.
        """
        from vyre_async._execution import annotate_mode  # (the policies load with a batch)

        annotate_mode(launches, decision, "plain")
        for launch in launches:
            self.enqueue(launch)

    # Resident buffers --------------------------------------------------------------
    def _no_resident(self, what: str) -> UnsupportedFeature:
        return UnsupportedFeature(
            f"backend {self.id!r} has no resident buffers ({what} is not supported)",
            fix="pass numpy arrays as dispatch inputs instead of resident buffers",
            feature="resident buffers",
        )

    def upload(self, data: np.ndarray | bytes, *, label: str | None = None) -> ResidentBuffer:
        """Copy ``data`` into a new resident buffer owned by this executor.

        Check the arguments with `upload_request`. Never called once the backend
        is closed.

        Raises:
            UnsupportedFeature: by default — never a silent host fallback.
        """
        raise self._no_resident("upload")

    def alloc(self, dtype: DType | str, count: int, *, label: str | None = None) -> ResidentBuffer:
        """Allocate a zero-filled resident buffer (arguments: `alloc_request`).

        Raises:
            UnsupportedFeature: by default.
        """
        raise self._no_resident("alloc")

    def download(self, buffer: ResidentBuffer) -> np.ndarray:
        """Copy a resident buffer back to a new host array, after earlier dispatches wrote it.

        Raises:
            UnsupportedFeature: by default.
        """
        raise self._no_resident("download")

    def free(self, buffer: ResidentBuffer) -> None:
        """Release a resident buffer (also called after close: releasing never fails for that).

        Raises:
            UnsupportedFeature: by default.
        """
        raise self._no_resident("free")

    # Lifecycle ---------------------------------------------------------------------
    async def open(self) -> None:
        """Open devices and warm up (``async with backend:``). Default: nothing to do."""
        return None

    async def flush(self) -> None:
        """Wait, without blocking the loop, until every submitted launch has settled.

        Default: nothing to wait for.
        """
        return None

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109 - the contract's bound
        """Stop work and release devices and threads; called once, by ``backend.aclose()``.

        The driver refuses new work before calling this. Stop what can be
        stopped at its next safe point, settle every launch not finished with
        `vyre_async.errors.BackendClosed`, wait at most ``timeout`` seconds for
        the rest (without blocking the loop) and never hang. Default: nothing
        to release.
        """
        return None

    def device_lost(self) -> bool:
        """Return True once the device is unusable. Default: False."""
        return False

    def try_recover(self) -> None:
        """Try to bring a lost device back.

        Raises:
            UnsupportedFeature: by default (device recovery not implemented).
        """
        raise UnsupportedFeature(
            f"backend {self.id!r} does not support device recovery",
            fix="acquire a new backend instance",
            feature="device recovery",
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} id={getattr(self, 'id', '?')!r} version={self.version!r}>"
