"""The dispatch front end: one submit path from a call to the executor's ``enqueue``.

Every dispatch enters here: ``backend.dispatch`` (`DispatchFrontEnd.dispatch`,
which finds or compiles the pipeline through the store), ``pipeline.dispatch``
(`DispatchFrontEnd.dispatch_pipeline`) and ``pipeline.dispatch_batch``
(`DispatchFrontEnd.dispatch_batch`). Each call becomes one `DispatchCall`
record; its trace is started and, when the call fails before its launch,
reported here and nowhere else. The work splits in two:

* what depends only on the pipeline, the config and the input sizes — the
  config checks, the declared-size checks, the binding plan, the output-size
  limit, the workgroup and grid limits, the executor's ``plan_shape`` — is done
  once per launch shape and kept in a `LaunchTemplate` (a small LRU per front
  end, keyed by the program and config objects and the input sizes, looked up
  once per dispatch);
* what depends on this call — copying each host input once, the
  `PendingDispatch`, the `Launch` record, the telemetry span, the prefetcher's
  bookkeeping — is all a warm dispatch pays.

Then the executor's ``enqueue`` hook starts the work. The front end reaches
the executor only through its hooks (`vyre_async.abc.Executor`), and holds the
backend's open/closed state.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from vyre_async import telemetry
from vyre_async._cache.identity import policy_digest
from vyre_async._capabilities import BackendCapabilities
from vyre_async._config import MAX_OUTPUT_BYTES_ENV, DispatchConfig, default_max_output_bytes
from vyre_async._executor import Launch, LaunchTemplate
from vyre_async._exports import public_dir as _public_dir
from vyre_async._pending import PendingDispatch
from vyre_async._plan import (
    LaunchGeometry,
    check_buffer_bytes,
    check_input_count,
    normalize_input,
    plan_dispatch,
)
from vyre_async._resident import ResidentBuffer
from vyre_async._seams import PipelineLike
from vyre_async.errors import (
    BackendClosed,
    DeviceOutOfMemory,
    InvalidArgument,
    InvalidProgram,
    UnsupportedFeature,
    host_out_of_memory,
)
from vyre_async.ir.program import Program
from vyre_async.telemetry import _spans

if TYPE_CHECKING:
    from vyre_async._execution import ExecutionDecision
    from vyre_async._executor import Executor
    from vyre_async._fusion import FusionRequest
    from vyre_async.policies.pipeline_fusion import FusionVerdict

__all__ = [
    "DEFAULT_CONFIG",
    "DispatchCall",
    "DispatchFrontEnd",
    "InputLike",
    "Launch",
    "LaunchTemplate",
    "as_config",
    "check_output_bytes",
]
__dir__ = _public_dir(__name__)

InputLike = np.ndarray | bytes | bytearray | memoryview | ResidentBuffer

#: Launch shapes one front end remembers (least recently used dropped first).
TEMPLATE_CAPACITY = 256
#: The config of a ``dispatch`` given none.
DEFAULT_CONFIG = DispatchConfig()


def check_output_bytes(total: int, cfg: DispatchConfig, what: str) -> None:
    """Refuse ``total`` output bytes over the config's limit, or the host's when it sets none.

    Raises:
        InvalidProgram: over ``cfg.max_output_bytes``.
        DeviceOutOfMemory: over `default_max_output_bytes` (no limit in ``cfg``).
    """
    limit = cfg.max_output_bytes
    if limit is not None:
        if total > limit:
            raise InvalidProgram(
                f"{what} would take {total} bytes, over max_output_bytes={limit}",
                fix="raise DispatchConfig.max_output_bytes or dispatch less data",
            )
        return
    host = default_max_output_bytes()
    if total > host:
        raise DeviceOutOfMemory(
            f"{what} would take {total} bytes, over this host's limit of {host} bytes for "
            f"the outputs of one dispatch or batch (half its memory, or {MAX_OUTPUT_BYTES_ENV})",
            fix=f"dispatch less data, or set DispatchConfig(max_output_bytes=...) or "
            f"{MAX_OUTPUT_BYTES_ENV} if the host can hold it",
        )


class PrefetchHook(Protocol):
    """The prefetcher as the front end calls it (`vyre_async._prefetch.Prefetcher`)."""

    def observe(
        self,
        pipeline: Any,
        geometry: LaunchGeometry,
        cache_hit: bool,
        pending: PendingDispatch,
        fingerprint: Any = None,
        recording: bool | None = None,
    ) -> Any: ...

    def schedule(self, job: Any) -> None: ...


def as_config(config: object, default: DispatchConfig) -> DispatchConfig:
    """Return ``config`` (``default`` for None), refusing anything that is not a config.

    Raises:
        InvalidArgument: ``config`` is neither None nor a `DispatchConfig`.
    """
    if config is None:
        return default
    if isinstance(config, DispatchConfig):
        return config
    raise InvalidArgument(
        f"config must be a DispatchConfig or None, got a {type(config).__name__}",
        fix="pass DispatchConfig(...), e.g. DispatchConfig(timeout=1.0)",
    )


class DispatchCall:
    """One call of ``dispatch`` as the front end plans it (built once per call).

    Attributes:
        program: The program dispatched (it may differ from ``pipeline.program``
            in buffer counts only).
        inputs: The caller's inputs, as given.
        called: ``time.monotonic()`` when the call began (the timeout counts from it).
        trace: The call's `telemetry.DispatchTrace` (started here), or None when
            nothing records it.
        pipeline: The compiled pipeline (set once it is known).
        config: The config given (None: the pipeline's).
        cache_hit: False when this call waited for a compile.
        compile_s: Seconds this call waited for its pipeline (validation, lookup,
            compile), from the start of the call; 0.0 on a cache hit.
        compile_phase: ``(start_ns, end_ns)`` of that wait on the trace's clock
            (from the span's start), or None.
    """

    __slots__ = (
        "cache_hit",
        "called",
        "compile_phase",
        "compile_s",
        "config",
        "inputs",
        "pipeline",
        "program",
        "trace",
    )

    def __init__(self, program: Program, inputs: Sequence[InputLike], *, traced: bool) -> None:
        self.program = program
        self.inputs = inputs
        self.called = time.monotonic()  # the timeout counts from here, compilation included
        # The only place a dispatch trace starts (`DispatchFrontEnd._fail` reports it).
        self.trace = telemetry.start_dispatch() if traced else None
        self.pipeline: Any = None
        self.config: DispatchConfig | None = None
        self.cache_hit = True
        self.compile_s = 0.0
        self.compile_phase: tuple[int, int] | None = None


class DispatchFrontEnd:
    """The front half of every dispatch of one backend (created by `VyreBackend`).

    Args:
        executor: The executor whose ``enqueue`` hook starts the work.
        prefetcher: The shape-prediction prefetcher, or None.
        lookup: Returns ``(pipeline, cache_hit)`` for a program and config: the
            pipeline store's ``lookup`` (set by `VyreBackend` once it made the store).

    Attributes:
        closed: True once the backend was closed: every dispatch is refused.
    """

    def __init__(
        self,
        executor: Executor,
        prefetcher: PrefetchHook | None,
        lookup: Callable[[Program, DispatchConfig], tuple[Any, bool]] | None = None,
    ) -> None:
        self.executor = executor
        self.prefetcher = prefetcher
        self.lookup: Callable[[Program, DispatchConfig], tuple[Any, bool]] = lookup or _no_store
        self.closed = False
        self._copies = bool(executor.copies_inputs)
        self._by_id: OrderedDict[
            tuple[int, int, int, tuple[int, ...]],
            tuple[Program, DispatchConfig, Any, LaunchTemplate],
        ] = OrderedDict()
        self._by_value: OrderedDict[
            tuple[Program, DispatchConfig, bytes, tuple[int, ...]], LaunchTemplate
        ] = OrderedDict()
        self._caps: BackendCapabilities | None = None
        self._limit: int | None = None
        self._specs: dict[int, tuple[Program, tuple[tuple[Any, np.dtype[Any], int], ...]]] = {}
        #: Member programs whose fused program this backend has compiled (`vyre_async._fusion`).
        self.fused_programs = _BoundedSet(TEMPLATE_CAPACITY)

    def capabilities(self) -> BackendCapabilities:
        """Return the executor's capabilities, read once (the checks use its limits)."""
        if self._caps is None:
            self._caps = self.executor.capabilities()
        return self._caps

    def check_open(self) -> None:
        """Raise `BackendClosed` once the backend was closed.

        Raises:
            BackendClosed: the backend was closed.
        """
        if self.closed:
            backend_id = self.executor.id
            raise BackendClosed(
                f"backend {backend_id!r} was closed; it runs nothing more", backend_id=backend_id
            )

    def _input_specs(self, program: Program) -> tuple[tuple[Any, np.dtype[Any], int], ...]:
        """Return ``(decl, numpy dtype, declared count)`` per input buffer of ``program``."""
        known = self._specs.get(id(program))
        if known is not None and known[0] is program:
            return known[1]
        specs = tuple((decl, decl.dtype.numpy, decl.count) for decl in program.inputs)
        if len(self._specs) >= TEMPLATE_CAPACITY:
            self._specs.clear()
        self._specs[id(program)] = (program, specs)  # holds the program: its id stays its own
        return specs

    # The dispatch path -------------------------------------------------------------
    # Every dispatch enters through `dispatch`, `dispatch_pipeline` or `dispatch_batch`.
    # Each call's `DispatchCall` starts its trace and, when the call raises before its
    # launch, `_fail` reports it: nowhere else starts or fails a dispatch trace.
    def dispatch(
        self, program: Program, inputs: Sequence[InputLike], config: DispatchConfig | None
    ) -> PendingDispatch:
        """Find or compile ``program``'s pipeline, plan the launch and enqueue it.

        What ``backend.dispatch`` does (the timeout counts from here,
        compilation included).

        Raises:
            InvalidProgram: an invalid program, or inputs that do not fit it.
            InvalidArgument: ``config`` is not a `DispatchConfig`.
            UnsupportedFeature: the program or config needs what the backend lacks.
            KernelCompileFailed: the backend's compiler rejected the program.
            BackendClosed: the backend was closed.
        """
        call = DispatchCall(program, inputs, traced=True)
        try:
            if self.closed:
                self.check_open()
            if config is None:
                cfg = DEFAULT_CONFIG
            elif type(config) is DispatchConfig:
                cfg = config
            else:
                cfg = as_config(config, DEFAULT_CONFIG)
            call.config = cfg
            pipeline, hit = self.lookup(program, cfg)
            call.pipeline = pipeline
            if not hit:  # it waited for a compile since the call began (no clock read on a hit)
                call.cache_hit = False
                call.compile_s = time.monotonic() - call.called
                if call.trace is not None:  # the phase: from the span's start to now
                    call.compile_phase = (call.trace.start_ns, time.time_ns())
            launch, job = self._plan(call)
            self.executor.enqueue(launch)
        except BaseException as exc:
            self._fail(call, exc)
            raise
        if job is not None:  # (only with a prefetcher)
            self._schedule(job)
        return launch.pending

    def dispatch_pipeline(
        self, pipeline: PipelineLike, inputs: Sequence[InputLike], config: DispatchConfig | None
    ) -> PendingDispatch:
        """Plan one dispatch of a compiled ``pipeline`` and enqueue it (``pipeline.dispatch``).

        Raises:
            InvalidProgram: wrong inputs, or ``config`` needs different code.
            UnsupportedFeature: the config asks for something the backend lacks.
            BackendClosed: the backend was closed.
        """
        call = DispatchCall(pipeline.program, inputs, traced=True)
        call.pipeline = pipeline
        call.config = config
        try:
            launch, job = self._plan(call)
            self.executor.enqueue(launch)
        except BaseException as exc:
            self._fail(call, exc)
            raise
        if job is not None:  # (only with a prefetcher)
            self._schedule(job)
        return launch.pending

    def dispatch_batch(
        self,
        pipeline: PipelineLike,
        batch: Sequence[Sequence[InputLike]],
        config: DispatchConfig | None,
        decision: ExecutionDecision,
        fusion: FusionRequest | None = None,
    ) -> list[PendingDispatch]:
        """Plan every item of ``batch``, then hand them to the executor's ``enqueue_batch``.

        Every item is checked and planned before any starts: a bad one raises
        with nothing launched, and each planned one is failed with that error.
        Every span gets ``decision``'s attributes. With ``fusion``, the fusion
        policy then decides whether the items run as one fused launch instead
        (`vyre_async._fusion.fuse_batch`; every span gets its verdict).

        Raises:
            InvalidProgram: an item does not fit the program, or the batch's
                outputs together are over the limit.
            UnsupportedFeature: the config asks for something the backend lacks.
            BackendClosed: the backend was closed.
        """
        calls: list[DispatchCall] = []
        planned: list[tuple[Launch, Any]] = []
        with telemetry.dispatch_attributes(decision.span_attributes()):
            try:
                for inputs in batch:
                    call = DispatchCall(pipeline.program, inputs, traced=True)
                    call.pipeline = pipeline
                    call.config = config
                    calls.append(call)
                    planned.append(self._plan(call))
                # Each dispatch's outputs fit (checked when planned); the batch's together too.
                check_output_bytes(
                    sum(launch.plan.bytes_out for launch, _ in planned),
                    config or pipeline.config,
                    f"the outputs of this batch of {len(planned)} dispatches",
                )
            except BaseException as exc:
                self._reject(calls, planned, exc)  # planned, never launched
                raise
        launches = [launch for launch, _ in planned]
        try:
            fused = False
            if fusion is not None and len(launches) > 1:
                from vyre_async._fusion import fuse_batch  # (with the first fused batch)

                fused = fuse_batch(self, launches, fusion, decision)
            if not fused:
                self.executor.enqueue_batch(launches, decision)
        except BaseException as exc:  # e.g. a shut-down backend: nobody gets these results
            self._reject(calls, planned, exc)
            raise
        for _, job in planned:
            if job is not None:
                self._schedule(job)  # deduplicated by the prefetcher
        return [launch.pending for launch in launches]

    def dispatch_group(
        self,
        items: Sequence[tuple[Program, Sequence[InputLike], DispatchConfig, Any]],
        verdict: FusionVerdict,
    ) -> tuple[list[PendingDispatch], list[str]]:
        """Dispatch different programs together, fused as ``verdict`` groups them.

        What an arm graph's fused layer does (`vyre_async._fusion.group_verdict`
        decides first). ``items`` are ``(program, inputs, config, attributes)``;
        each call's span gets its ``attributes`` (a mapping) and the verdict's.
        Every item is found or compiled and planned before any starts, so a bad
        one raises with nothing launched. Each group of the verdict runs as one
        fused launch (members alone, or of a group that cannot be built, as
        their own launches); every item keeps its own `PendingDispatch`. Once
        planned nothing raises: a launch that cannot be enqueued fails the
        members not enqueued yet through their pendings (`_fusion.enqueue_groups`).

        Returns:
            Every item's pending result, in order, and the error type of each
            group that ran alone because its fused program could not be built.

        Raises:
            InvalidProgram: an item's program or inputs are invalid.
            UnsupportedFeature: an item needs what the backend lacks.
            KernelCompileFailed: the backend's compiler rejected a program.
            BackendClosed: the backend was closed.
        """
        from vyre_async._fusion import enqueue_groups

        if self.closed:
            self.check_open()
        calls: list[DispatchCall] = []
        planned: list[tuple[Launch, Any]] = []
        try:
            for program, inputs, config, attributes in items:
                with telemetry.dispatch_attributes(attributes):  # read when planned
                    call = DispatchCall(program, inputs, traced=True)
                    calls.append(call)
                    call.config = config
                    pipeline, hit = self.lookup(program, config)
                    call.pipeline = pipeline
                    if not hit:  # as in `dispatch`
                        call.cache_hit = False
                        call.compile_s = time.monotonic() - call.called
                        if call.trace is not None:
                            call.compile_phase = (call.trace.start_ns, time.time_ns())
                    planned.append(self._plan(call))
        except BaseException as exc:
            self._reject(calls, planned, exc)  # planned, never launched
            raise
        launches = [launch for launch, _ in planned]
        fallbacks = enqueue_groups(self, launches, verdict, None)
        for _, job in planned:
            if job is not None:
                self._schedule(job)
        return [launch.pending for launch in launches], fallbacks

    def plan(
        self,
        pipeline: PipelineLike,
        inputs: Sequence[InputLike],
        config: DispatchConfig | None,
        program: Program | None = None,
    ) -> Launch:
        """Check and plan one dispatch of ``pipeline`` without a trace; enqueue nothing.

        For tools and tests that hand a `Launch` to an executor themselves, and
        for fused launches. ``program`` is the program dispatched (default: the
        pipeline's). A pipeline found by `lookup` serves every program of its
        fingerprint, which leaves buffer counts out, so pass the program itself
        when its counts may differ from the pipeline's.

        Raises:
            InvalidProgram: wrong inputs, or ``config`` needs different code.
            UnsupportedFeature: the config asks for something the backend lacks.
            BackendClosed: the backend was closed.
        """
        call = DispatchCall(pipeline.program if program is None else program, inputs, traced=False)
        call.pipeline = pipeline
        call.config = config
        return self._plan(call)[0]

    def _schedule(self, job: Any) -> None:
        """Start a predicted compile on the prefetcher's thread (after the enqueue)."""
        prefetcher = self.prefetcher
        if prefetcher is not None:
            prefetcher.schedule(job)

    def _fail(self, call: DispatchCall, exc: BaseException) -> None:
        """Report a call that raised before its launch (its span ends with ``exc``)."""
        _spans.fail_before_launch(call.trace, exc, self.executor.id, call.program)

    def _reject(
        self,
        calls: Sequence[DispatchCall],
        planned: Sequence[tuple[Launch, Any]],
        exc: BaseException,
    ) -> None:
        """Fail every call of a batch that raised: none of them runs."""
        for call in calls:
            self._fail(call, exc)
        for launch, _ in planned:
            launch.completer.fail(exc)  # no-op for one already settled

    def _plan(self, call: DispatchCall) -> tuple[Launch, Any]:
        """Check and plan ``call``: its `Launch` and the prefetcher's job (or None)."""
        if self.closed:
            self.check_open()
        executor = self.executor
        pipeline = call.pipeline
        config = call.config
        if config is None:
            cfg = pipeline.config
        elif type(config) is DispatchConfig:
            cfg = config
        else:
            cfg = as_config(config, pipeline.config)
        program = call.program
        inputs = call.inputs
        known = self._specs.get(id(program))  # (`_input_specs`, its hit inlined)
        specs = known[1] if known is not None and known[0] is program else None
        if specs is None:
            specs = self._input_specs(program)
        if (type(inputs) is not list and type(inputs) is not tuple) or len(inputs) != len(specs):
            check_input_count(program, inputs)
        limit = self._limit
        if limit is None:
            limit = self._limit = self.capabilities().max_storage_buffer_bytes
        prepared: list[np.ndarray | ResidentBuffer] = []
        sizes: list[int] = []
        resident = False
        copies = self._copies
        for (decl, want, count), value in zip(specs, inputs, strict=False):  # (counted)
            if type(value) is np.ndarray and value.dtype is want:
                size = value.size
                if (not count or size == count) and (not limit or 4 * size <= limit):
                    # The common case: one copy — here, flat, or by the backend
                    # straight into its own memory.
                    if copies:
                        prepared.append(value)
                    else:
                        try:
                            prepared.append(value.flatten())
                        except MemoryError as exc:
                            raise host_out_of_memory(
                                4 * size, f"copying the input for buffer {decl.name!r}"
                            ) from exc
                    sizes.append(size)
                    continue
            item = _prepare_input(decl, value, limit, executor)
            if isinstance(item, ResidentBuffer):
                resident = True
                sizes.append(item.count)
            else:
                sizes.append(item.size)
            prepared.append(item)
        identity = pipeline.identity
        key = (id(program), id(cfg), id(identity), tuple(sizes))  # this launch shape
        by_id = self._by_id
        seen = by_id.get(key)  # the one template lookup of this dispatch
        if seen is not None and seen[0] is program and seen[1] is cfg and seen[2] is identity:
            template = seen[3]
            by_id.move_to_end(key)  # least recently used is dropped first
        else:
            template = self._template_miss(pipeline, program, cfg, key)
        native = pipeline.native
        shape = template.shape
        if shape is None or shape[0] is not native:  # once per shape (and compiled artifact)
            shape = template.shape = (native, executor.plan_shape(native, template.plan, cfg))
        pending, completer = PendingDispatch.create(
            timeout=cfg.timeout, label=cfg.label, created=call.called
        )
        record = pending.record
        record.cache_hit = call.cache_hit
        extra = telemetry.current_dispatch_attributes()  # arm scheduler / batch verdicts
        if extra is not None:
            record.attributes = dict(extra)
        plan = template.plan
        launch = Launch(
            pipeline,
            plan,
            tuple(prepared),
            cfg,
            pending,
            completer,
            call.compile_s,
            template,
            resident,
            shape[1],
        )
        trace = call.trace
        if trace is not None:
            _spans.attach(trace, pending, template, executor.id)
            if call.compile_phase is not None and trace.span is not None:  # phases of spans
                completer.record_phase("vyre.compile", *call.compile_phase)
        prefetcher = self.prefetcher
        if prefetcher is None or cfg.speculation == "disable":
            return launch, None
        # Shape prediction: score and record before the enqueue (the span may end
        # inside it); the caller starts a predicted compile after it.
        fingerprint = template.fingerprint
        if fingerprint is None or fingerprint[0] is not pipeline.identity.digest:
            geometry = plan.geometry
            fingerprint = (pipeline.identity.digest, geometry.grid, geometry.workgroup)
            template.fingerprint = fingerprint
        # Scored predictions go on a recorded span and into the metrics, if either is kept.
        recording = trace is not None and (trace.span is not None or trace.metered)
        return launch, prefetcher.observe(
            pipeline, plan.geometry, call.cache_hit, pending, fingerprint, recording
        )

    def _template_miss(
        self,
        pipeline: PipelineLike,
        program: Program,
        config: DispatchConfig,
        key: tuple[int, int, int, tuple[int, ...]],
    ) -> LaunchTemplate:
        """Return the `LaunchTemplate` of a shape the id-keyed LRU lacks (``_plan`` looked).

        Equal objects (another program or config object of the same value) share
        one template; a new shape is checked and planned here, once.

        Raises:
            InvalidProgram: the config needs different code than ``pipeline``, a
                declared buffer or the outputs are too large, or the plan fails.
            UnsupportedFeature: the config forces a feature the backend lacks.
        """
        identity = pipeline.identity  # the policy check is against this pipeline's config
        sizes = key[3]
        by_value = self._by_value
        value_key = (program, config, identity.digest, sizes)  # equal objects
        found = by_value.get(value_key)
        if found is not None:
            by_value.move_to_end(value_key)
        else:
            found = self._new_template(pipeline, program, config, sizes)
            by_value[value_key] = found
            if len(by_value) > TEMPLATE_CAPACITY:
                by_value.popitem(last=False)
        by_id = self._by_id
        by_id[key] = (program, config, identity, found)  # holds them: ids stay theirs
        if len(by_id) > TEMPLATE_CAPACITY:
            by_id.popitem(last=False)
        return found

    def _new_template(
        self,
        pipeline: PipelineLike,
        program: Program,
        config: DispatchConfig,
        sizes: tuple[int, ...],
    ) -> LaunchTemplate:
        compiled_for = pipeline.config
        if config is not compiled_for and policy_digest(config) != policy_digest(compiled_for):
            raise InvalidProgram(
                "this pipeline was compiled for another ulp_budget/workgroup_override",
                fix="compile a pipeline for this config: backend.compile(program, config)",
            )
        forced = config.speculation == "force" or config.persistent_thread == "force"
        if forced or config.cooperative:
            self._check_forced(config)
        caps = self.capabilities()
        limit = caps.max_storage_buffer_bytes
        if limit:
            for decl in program.buffers:
                check_buffer_bytes(4 * decl.count, limit, f"buffer {decl.name!r} as declared")
        plan = plan_dispatch(
            program,
            sizes,
            grid_override=config.grid_override,
            workgroup_override=config.workgroup_override,
        )
        if config.workgroup_override is not None:
            self._check_workgroup(plan.geometry.workgroup, caps)
        grid_limit = caps.max_grid_size
        if grid_limit is not None:
            self._check_grid(plan.geometry.grid, grid_limit)
        check_output_bytes(plan.bytes_out, config, "the outputs")
        return LaunchTemplate(program, config, plan)

    def _check_workgroup(self, workgroup: tuple[int, int, int], caps: BackendCapabilities) -> None:
        """Refuse a workgroup over the backend's reported limits (not reported: IR limits only)."""
        per_axis, lanes = caps.max_workgroup_size, caps.max_workgroup_lanes
        if lanes <= 1:  # the conservative default record: nothing reported
            return
        total = workgroup[0] * workgroup[1] * workgroup[2]
        if total > lanes or any(w > m for w, m in zip(workgroup, per_axis, strict=True)):
            raise UnsupportedFeature(
                f"workgroup_override {workgroup} exceeds backend {self.executor.id!r}'s limits "
                f"(at most {per_axis} per axis, {lanes} lanes)",
                fix="choose a workgroup within backend.capabilities().max_workgroup_size",
                feature="workgroup size",
            )

    def _check_grid(self, grid: tuple[int, int, int], limit: tuple[int, int, int]) -> None:
        """Refuse a grid wider than the executor's reported workgroups per axis."""
        if grid[0] > limit[0] or grid[1] > limit[1] or grid[2] > limit[2]:
            raise UnsupportedFeature(
                f"grid {grid} exceeds backend {self.executor.id!r}'s limit of {limit} "
                "workgroups per axis",
                fix="use larger workgroups (DispatchConfig(workgroup_override=...)) or split the "
                "dispatch into several smaller ones",
                feature="grid size",
            )

    def _check_forced(self, config: DispatchConfig) -> None:
        """Refuse what a config forces and this backend lacks (called only when one is forced)."""
        backend_id = self.executor.id
        if config.speculation == "force" and self.prefetcher is None:
            raise UnsupportedFeature(
                f"backend {backend_id!r} was built with prefetch=False, so it cannot honour "
                'DispatchConfig(speculation="force")',
                fix='use speculation="auto", or build the backend with prefetch=True',
                feature="speculation",
            )
        caps = self.capabilities()
        if config.cooperative and not caps.grid_sync:
            raise UnsupportedFeature(
                f"backend {backend_id!r} cannot run cooperative (grid-sync) launches",
                fix="set DispatchConfig(cooperative=False) or use a backend with grid_sync",
                feature="grid_sync",
            )
        if config.persistent_thread == "force" and not caps.persistent_threads:
            raise UnsupportedFeature(
                f"backend {backend_id!r} has no persistent-thread execution",
                fix='use DispatchConfig(persistent_thread="auto")',
                feature="persistent_threads",
            )


class _BoundedSet(set[Any]):
    """A set that forgets everything once it would hold more than ``capacity`` items."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def add(self, item: Any) -> None:
        if len(self) >= self.capacity:
            self.clear()
        super().add(item)


def _no_store(program: Program, config: DispatchConfig) -> tuple[Any, bool]:
    raise RuntimeError("this front end has no pipeline store: dispatch its pipelines instead")


def _prepare_input(
    decl: Any, value: object, limit: int, executor: Executor
) -> np.ndarray | ResidentBuffer:
    """Check one input (and copy a host one); ``limit``: largest buffer in bytes, 0 = none."""
    if isinstance(value, ResidentBuffer):
        value.native(executor)  # ownership (this instance) and liveness
        if value.dtype is not decl.dtype:
            raise InvalidProgram(
                f"resident buffer #{value.id} holds {value.dtype.value}; buffer "
                f"{decl.name!r} is {decl.dtype.value}",
                fix="upload the data with the buffer's dtype",
            )
        if decl.count and value.count != decl.count:
            raise InvalidProgram(
                f"resident buffer #{value.id} has {value.count} elements; buffer "
                f"{decl.name!r} declares count={decl.count}",
                fix=f"pass a buffer of exactly {decl.count} elements",
            )
        return value
    if limit:  # checked before anything is copied: a huge (broadcast) input fails fast
        if isinstance(value, np.ndarray):
            nbytes = 4 * value.size
        elif isinstance(value, bytes | bytearray | memoryview):
            nbytes = memoryview(value).nbytes
        else:
            nbytes = 0  # normalize_input says what is wrong with it
        if nbytes > limit:
            check_buffer_bytes(nbytes, limit, f"the input for buffer {decl.name!r}")
    return normalize_input(decl, value)
