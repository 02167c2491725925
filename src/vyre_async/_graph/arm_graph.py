"""`ArmGraph`: declare resources and arms, then ``await graph.run(backend, outputs=[...])``."""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
from opentelemetry import trace

from vyre_async import telemetry
from vyre_async._arguments import dtype_argument, whole_number
from vyre_async._calibration import calibration_for
from vyre_async._config import DispatchConfig
from vyre_async._execution import choose_execution_mode
from vyre_async._exports import public_dir as _public_dir
from vyre_async._fusion import fusion_request
from vyre_async._graph.model import Arm, GraphResource, Residency, _atomic_targets, summarize_arm
from vyre_async._graph.report import ArmRun, GraphReport, GraphResult, layers_in_order
from vyre_async._graph.run import _Run, _settled_placement
from vyre_async._graph.schedule import _residency_attributes, _Schedule
from vyre_async._plan import normalize_input
from vyre_async._resident import ResidentBuffer
from vyre_async._version import __version__
from vyre_async.errors import (
    InvalidArgument,
    InvalidProgram,
)
from vyre_async.ir.limits import MAX_BUFFER_ELEMENTS
from vyre_async.ir.program import Program
from vyre_async.ir.types import Access, BufferDecl, DType
from vyre_async.ir.validate import validate_or_raise
from vyre_async.policies.arms import ArmPlan, ArmSummary
from vyre_async.policies.concurrency import decide_arm_concurrency
from vyre_async.policies.residency import decide_residency

if TYPE_CHECKING:
    from vyre_async._backend import VyreBackend

__all__ = ["ArmGraph"]
__dir__ = _public_dir(__name__)

_tracer = trace.get_tracer("vyre_async", __version__)


class ArmGraph:
    """A graph of arms over named resources; submit it with ``await graph.run(backend)``.

    Args:
        label: A name for reports and the ``vyre.graph`` span.

    Raises:
        InvalidArgument: ``label`` is neither a str nor None.

    Example:
        >>> graph = ArmGraph(label="demo")
        >>> graph.resource("x", "u32", 64, initial=np.arange(64, dtype=np.uint32))
        >>> graph.resource("y", "u32", 64)
        >>> graph.arm(xor_program, {"a": "x", "b": "x", "out": "y"})
        >>> result = await graph.run(backend, outputs=["y"])
    """

    def __init__(self, *, label: str | None = None) -> None:
        if label is not None and not isinstance(label, str):
            raise InvalidArgument(f"graph label must be a str, got {label!r}", fix="pass a str")
        self.label = label
        self._resources: dict[str, GraphResource] = {}
        self._arms: list[Arm] = []
        self._version = 0
        self._lock = threading.Lock()
        self._submissions: weakref.WeakKeyDictionary[VyreBackend, tuple[int, int]] = (
            weakref.WeakKeyDictionary()
        )
        self._cached: _Schedule | None = None
        # Per backend: (graph version, each arm's last measured execution time in ns)
        self._costs: weakref.WeakKeyDictionary[VyreBackend, tuple[int, tuple[int | None, ...]]] = (
            weakref.WeakKeyDictionary()
        )

    # Building ------------------------------------------------------------------------
    def resource(
        self,
        name: str,
        dtype: DType | str,
        count: int,
        initial: np.ndarray | bytes | None = None,
    ) -> str:
        """Declare a named graph resource and return its name.

        Args:
            name: Unique resource name.
            dtype: Element type (`DType` or ``"u32"``, ``"i32"``, ``"f32"``, ``"bool"``).
            count: Element count (1 to 2**32 - 1: buffers are indexed with u32).
            initial: Initial contents (``count`` elements of the dtype; copied), or
                None for zeros.

        Raises:
            InvalidArgument: a duplicate or empty name, an unknown dtype, or a
                bad count.
            InvalidProgram: initial contents of the wrong size or dtype.
        """
        if not isinstance(name, str) or not name:
            raise InvalidArgument(
                f"resource name must be a non-empty str, got {name!r}", fix="name it"
            )
        if name in self._resources:
            raise InvalidArgument(
                f"resource {name!r} is declared twice", fix="give every resource its own name"
            )
        kind = dtype_argument(f"resource {name!r} dtype", dtype)
        count = whole_number(
            f"resource {name!r} count",
            count,
            minimum=1,
            maximum=MAX_BUFFER_ELEMENTS,
            example=f'graph.resource({name!r}, "u32", 1024) (split larger data)',
        )
        data = None
        if initial is not None:
            data = normalize_input(BufferDecl(name, 0, Access.READ, kind, count), initial)
            data.setflags(write=False)
        with self._lock:
            self._resources[name] = GraphResource(name=name, dtype=kind, count=count, initial=data)
            self._version += 1
        return name

    def arm(
        self,
        program: Program,
        bindings: Mapping[str, str],
        *,
        config: DispatchConfig | None = None,
        label: str | None = None,
    ) -> int:
        """Add an arm: ``program`` with each of its buffers bound to a resource.

        Every input and output buffer must be bound (workgroup buffers are not);
        a buffer with a static count must match its resource's count. A resource
        bound to a buffer the arm writes may not be bound to any other buffer of
        the same arm (that would alias inside one kernel).

        Args:
            program: A valid program.
            bindings: Buffer name → resource name.
            config: Its dispatch config (None: the default).
            label: A name for reports and spans (default ``op_id`` or ``arm<i>``).

        Returns:
            The arm's index (its submission order).

        Raises:
            InvalidProgram: ``program`` is not a valid `Program`, or a binding
                is missing, names no buffer of the program, is of another dtype
                or count, or aliases a written resource.
            InvalidArgument: ``bindings`` is not a str-to-str mapping, a binding
                names an undeclared resource, or ``label`` or ``config`` is of
                the wrong type.
        """
        if not isinstance(program, Program):
            raise InvalidProgram(
                f"an arm needs a Program, got {type(program).__name__}",
                fix="build the kernel with vyre_async.ir.Program(...)",
            )
        validate_or_raise(program)
        if not isinstance(bindings, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in bindings.items()
        ):
            raise InvalidArgument(
                f"bindings must map buffer names to resource names (str to str), got {bindings!r}",
                fix='pass e.g. {"a": "x", "out": "y"}',
            )
        if label is not None and not isinstance(label, str):
            raise InvalidArgument(
                f"an arm's label is a str or None, got {label!r}", fix='pass e.g. label="scale"'
            )
        if config is not None and not isinstance(config, DispatchConfig):
            raise InvalidArgument(
                f"config must be a DispatchConfig, got {type(config).__name__}",
                fix="pass DispatchConfig(...) or None",
            )
        with self._lock:
            resources = dict(self._resources)
            index = len(self._arms)
        decls = {d.name: d for d in program.buffers if d.access is not Access.WORKGROUP}
        for buffer, resource in bindings.items():
            if buffer not in decls:
                raise InvalidProgram(
                    f"arm {index} binds {buffer!r}, but its program has no such input or "
                    f"output buffer (it has {sorted(decls)})",
                    fix="bind the program's buffer names",
                )
            if resource not in resources:
                raise InvalidArgument(
                    f"arm {index} binds {buffer!r} to undeclared resource {resource!r}",
                    fix=f"declare it first: graph.resource({resource!r}, dtype, count)",
                )
        missing = [name for name in decls if name not in bindings]
        if missing:
            raise InvalidProgram(
                f"arm {index} leaves buffers {missing} unbound",
                fix="bind every input and output buffer to a graph resource",
            )
        for buffer, decl in decls.items():
            res = resources[bindings[buffer]]
            if decl.dtype is not res.dtype:
                raise InvalidProgram(
                    f"arm {index}: buffer {buffer!r} is {decl.dtype.value} but resource "
                    f"{res.name!r} is {res.dtype.value}",
                    fix="bind a resource of the buffer's dtype",
                )
            if decl.count and decl.count != res.count:
                raise InvalidProgram(
                    f"arm {index}: buffer {buffer!r} declares count={decl.count} but resource "
                    f"{res.name!r} has {res.count} elements",
                    fix="bind a resource of the buffer's size (or declare the buffer with count=0)",
                )
        atomics = _atomic_targets(program)
        for buffer, decl in decls.items():
            if decl.access.is_output or buffer in atomics:
                resource = bindings[buffer]
                others = [b for b in decls if b != buffer and bindings[b] == resource]
                if others:
                    raise InvalidProgram(
                        f"arm {index}: resource {resource!r} is written through {buffer!r} and "
                        f"also bound to {others}",
                        fix="bind a written resource to one buffer of the arm only",
                    )
        ordered = tuple((name, bindings[name]) for name in decls)
        record = Arm(
            index=index,
            label=label or program.op_id or f"arm{index}",
            program=program,
            bindings=ordered,
            config=config,
            summary=summarize_arm(program, dict(ordered)),
        )
        with self._lock:
            if len(self._arms) != index or self._resources.keys() != resources.keys():
                raise RuntimeError("ArmGraph was modified concurrently while adding an arm")
            self._arms.append(record)
            self._version += 1
        return index

    # Inspection ----------------------------------------------------------------------
    @property
    def resources(self) -> Mapping[str, GraphResource]:
        """The declared resources, by name, in declaration order."""
        return dict(self._resources)

    @property
    def arms(self) -> tuple[Arm, ...]:
        """The arms, in submission order."""
        return tuple(self._arms)

    def summaries(self) -> list[ArmSummary]:
        """Return every arm's read/write summary, in submission order."""
        return [arm.summary for arm in self._arms]

    def plan(self) -> ArmPlan:
        """Return the layering of the arms (no backend needed)."""
        return self._schedule().plan

    def __repr__(self) -> str:
        name = f" {self.label!r}" if self.label else ""
        return f"<ArmGraph{name} {len(self._resources)} resources, {len(self._arms)} arms>"

    # Running ---------------------------------------------------------------------------
    def _schedule(self) -> _Schedule:
        """Return what every run of the current graph needs (built once per graph version)."""
        with self._lock:
            schedule = self._cached
            if schedule is None or schedule.version != self._version:
                schedule = self._cached = _Schedule.build(
                    self.label, self._version, tuple(self._arms), dict(self._resources)
                )
            return schedule

    def _costs_on(self, backend: VyreBackend, schedule: _Schedule) -> tuple[int | None, ...]:
        """Each arm's last measured execution time on ``backend`` (ns; None: never measured)."""
        with self._lock:
            version, costs = self._costs.get(backend, (-1, ()))
        return costs if version == schedule.version else (None,) * len(schedule.steps)

    def _record_costs(
        self, backend: VyreBackend, schedule: _Schedule, runs: Sequence[ArmRun]
    ) -> None:
        previous = self._costs_on(backend, schedule)
        costs = tuple(
            round(run.device_s * 1e9)
            if run.device_s is not None and math.isfinite(run.device_s) and run.device_s >= 0
            else old  # (a backend's NaN or negative time keeps what was known)
            for run, old in zip(runs, previous, strict=True)
        )
        with self._lock:
            self._costs[backend] = (schedule.version, costs)

    async def run(
        self,
        backend: VyreBackend,
        outputs: Iterable[str] | None = None,
        *,
        values: Mapping[str, np.ndarray | bytes] | None = None,
        residency: Residency = "auto",
        fusion: str = "auto",
    ) -> GraphResult:
        """Run every arm on ``backend``, layer by layer, and return the requested resources.

        Each layer of more than one arm runs concurrently or in order, as
        `vyre_async.policies.decide_arm_concurrency` decides from the backend's
        calibration (``concurrent_overlap_bps``) and the arms' estimated times (their
        last measured times on this backend, else the calibrated launch cost).
        With ``residency="auto"``, `vyre_async.policies.decide_residency` decides
        from the calibrated ``resident_gain_bps`` whether the resources are
        resident buffers or host arrays.

        Args:
            backend: Where the arms run.
            outputs: Resource names to return (default: every resource).
            values: Contents replacing some resources' initial contents for this run.
            residency: ``"auto"`` (resident buffers when the backend has them and
                its calibration does not measure them slower than host arrays),
                ``"resident"`` (required) or ``"host"``.
            fusion: For each layer of more than one arm: ``"auto"`` (the fusion
                policy, ``docs/policies.md``, decides from the backend's calibration
                whether its arms run as fused launches, each workgroup range running
                one arm), ``"force"`` (fused whenever legal) or ``"disable"``. Every
                such arm's span records the verdict (``vyre.policy.fusion``,
                ``...reason``); a fused layer's arms are submitted together.

        Returns:
            The outputs and a `GraphReport`.

        Raises:
            InvalidArgument: ``backend``, ``outputs``, ``values``,
                ``residency`` or ``fusion`` is of the wrong type or value, or an
                output or value names no resource.
            InvalidProgram: a value of the wrong size or dtype, or an arm's
                dispatch was rejected.
            UnsupportedFeature: ``residency="resident"`` on a backend without
                resident buffers, or an arm needs a feature the backend lacks.
            BackendError: an arm failed (the error names the arm in a note). With
                host joins the other arms of its layer are awaited before it is
                raised and later layers never start; with device joins every arm
                already submitted is awaited first (the first failure in
                submission order is raised); an arm of a layer run in order is
                awaited before the next arm is dispatched, so none is dispatched
                after it fails.
        """
        if not isinstance(residency, str) or residency not in ("auto", "resident", "host"):
            raise InvalidArgument(
                f"residency must be 'auto', 'resident' or 'host', got {residency!r}",
                fix='pass residency="auto"',
            )
        from vyre_async._backend import VyreBackend as _Backend

        if not isinstance(backend, _Backend):
            raise InvalidArgument(
                f"ArmGraph.run needs a backend, got a {type(backend).__name__}",
                fix='pass a backend, e.g. await graph.run(acquire_backend("reference"))',
            )
        fusion_wanted = fusion_request(fusion, backend)
        if outputs is not None:
            given: object = outputs
            names = (
                None
                if isinstance(given, str | bytes) or not isinstance(given, Iterable)
                else list(given)
            )
            if names is None or not all(isinstance(name, str) for name in names):
                raise InvalidArgument(
                    f"outputs must be resource names (a list of str) or None, got {outputs!r}",
                    fix='pass e.g. outputs=["y"]',
                )
            outputs = names
        if values is not None and (
            not isinstance(values, Mapping) or not all(isinstance(k, str) for k in values)
        ):
            raise InvalidArgument(
                f"values must map resource names to arrays, got {values!r}",
                fix='pass e.g. values={"x": np.arange(8, dtype=np.uint32)}',
            )
        schedule = self._schedule()
        with self._lock:
            seen_version, count = self._submissions.get(backend, (schedule.version, 0))
            submission = (count if seen_version == schedule.version else 0) + 1
            self._submissions[backend] = (schedule.version, submission)
        resources = schedule.resources
        wanted = list(resources) if outputs is None else list(outputs)
        for name in wanted:
            if name not in resources:
                raise InvalidArgument(
                    f"output {name!r} is not a resource of this graph",
                    fix=f"ask for declared resources: {sorted(resources)}",
                )
        # Initial contents are read-only private arrays: dispatch() and upload() copy
        # them, and arm outputs replace (never modify) the state's arrays.
        state: dict[str, np.ndarray | ResidentBuffer] = {
            name: res.contents() if res.initial is None else res.initial
            for name, res in resources.items()
        }
        for name, value in (values or {}).items():
            res = resources.get(name)
            if res is None:
                raise InvalidArgument(
                    f"value for {name!r}, which is not a resource of this graph",
                    fix=f"pass values for declared resources: {sorted(resources)}",
                )
            state[name] = normalize_input(
                BufferDecl(name, 0, Access.READ, res.dtype, res.count), value
            )
        plan = schedule.plan
        decision = choose_execution_mode(
            backend,
            batch_size=len(schedule.steps),
            repeats=submission,
            config=schedule.execution_config,
        )
        calibration = calibration_for(backend)
        overlap = None if calibration is None else calibration.concurrent_overlap_bps
        gain = None if calibration is None else calibration.resident_gain_bps
        fallback = 1 if calibration is None else max(calibration.launch_ns, 1)
        work = [fallback if cost is None else cost for cost in self._costs_on(backend, schedule)]
        concurrency = tuple(
            decide_arm_concurrency([work[i] for i in layer], overlap) for layer in plan.layers
        )
        placement = decide_residency(gain, requested=residency, work_ns=sum(work))
        runner = _Run(
            schedule=schedule,
            backend=backend,
            decision=decision,
            concurrency=concurrency,
            state=state,
            resident=placement.resident,
            required=residency == "resident",
            fusion=fusion_wanted,
        )
        in_order = layers_in_order(plan.layers, concurrency)  # before any layer fused
        started = time.perf_counter()
        if not telemetry.is_enabled():
            layer_wall = await runner.execute()
        else:
            span = _tracer.start_span(
                "vyre.graph",
                attributes={
                    "vyre.backend.id": backend.id,
                    "vyre.graph.arms": len(schedule.steps),
                    "vyre.graph.layers": len(plan.layers),
                    "vyre.graph.joins": plan.joins,
                    "vyre.graph.submission": submission,
                    "vyre.graph.layers_in_order": in_order,
                    **({"vyre.graph.label": self.label} if self.label else {}),
                    **decision.span_attributes(),
                    **_residency_attributes(placement),
                },
            )
            with trace.use_span(span, end_on_exit=True):
                layer_wall = await runner.execute()
                placement = _settled_placement(placement, runner, gain, residency, sum(work))
                span.set_attributes(_residency_attributes(placement))
                span.set_attribute("vyre.graph.residency", runner.residency)
                span.set_attribute("vyre.graph.joins_on", runner.joins_on)
                # A fused layer's arms were submitted together: not a layer run in order.
                span.set_attribute(
                    "vyre.graph.layers_in_order",
                    layers_in_order(plan.layers, concurrency, runner.fusion_verdicts),
                )
                if runner.host_join_reason:
                    span.set_attribute("vyre.graph.host_join_reason", runner.host_join_reason)
        wall = time.perf_counter() - started
        placement = _settled_placement(placement, runner, gain, residency, sum(work))
        try:
            out = {name: runner.take(name) for name in wanted}
        finally:
            runner.release()
        self._record_costs(backend, schedule, runner.arm_runs)
        report = GraphReport(
            label=self.label,
            backend_id=backend.id,
            layers=plan.layers,
            joins=plan.joins,
            arms=tuple(runner.arm_runs),
            residency=runner.residency,
            submission=submission,
            execution=decision,
            wall_s=wall,
            layer_wall_s=tuple(layer_wall),
            joins_on=runner.joins_on,
            host_join_reason=runner.host_join_reason,
            concurrency=concurrency,
            concurrent_overlap_bps=overlap,
            residency_verdict=placement,
            resident_gain_bps=gain,
            fusion=tuple(runner.fusion_verdicts),
            fusion_fallback=tuple(runner.fusion_fallbacks),
        )
        return GraphResult(outputs=out, report=report)
