"""Arm graphs: several programs sharing named buffers, submitted with one ``await``.

Declare graph resources (named, typed buffers) and arms (programs whose buffers
are bound to resources), then ``result = await graph.run(backend, outputs=[...])``:

1. each arm's read/write summary is derived from its binding plan (READ and
   UNIFORM buffers read their resource, WRITE buffers write it, READ_WRITE
   buffers do both, atomic targets count as both);
2. the arms are layered by arm independence (`vyre_async.policies.plan_arms`):
   every layer holds mutually independent arms, every conflict crosses layers;
3. with every resource resident (the default where the backend has resident
   buffers), every arm is submitted at once and the backend orders the arms on
   their shared buffers (stream events on CUDA, worker waits on the reference
   backend): layers are joined on the device, never by a host sync. WRITE
   buffers get fresh zero-filled resident buffers and run as READ_WRITE (the
   same kernel), so outputs stay resident. Otherwise each layer's arms are
   dispatched together, the layer is awaited, each arm's outputs become the
   contents of the resources they are bound to, and the next layer starts
   (``GraphReport.joins_on`` says which, ``host_join_reason`` why);
4. the requested resources come back with a `GraphReport`: layers, which arms
   ran concurrently, the reason every serialised arm waited, streams, timing
   and the execution-mode verdict of the submission.

The result equals running the arms one by one in submission order.

Resources are graph-owned. With resident resources, those that arms read are
uploaded once per run and passed as resident buffers. ``residency="resident"``
requires them, ``"host"`` never uploads, and ``"auto"`` (the default) asks the
residency policy (`vyre_async.policies.decide_residency`): resident unless the
backend's calibration measured resident buffers slower than host arrays
(`Calibration.resident_gain_bps`; the reference backend's "resident" buffers
are host arrays the engine copies, so there they cost time). A backend without
resident buffers raises `UnsupportedFeature` on ``upload`` and ``"auto"`` then
keeps the resources as host arrays owned by the graph (reported as
``residency="host"``, reason ``no_resident_buffers``). That is not a silent
fallback of a user's buffer: graph resources never belonged to the device.
BOOL resources always stay host arrays (``upload`` of a ``uint32`` array would
type them U32). The ``vyre.graph`` span carries the verdict
(``vyre.policy.residency`` and ``.reason``), as does `GraphReport`.

Every arm's ``vyre.dispatch`` span (a child of one ``vyre.graph`` span) carries
``vyre.policy.arm.layer``, ``vyre.arm.index``, ``vyre.arm.label`` and, for an
arm that had to wait, ``vyre.policy.arm.reason`` (``write_write``,
``read_after_write`` or ``write_after_read``) and ``vyre.policy.arm.after`` (the
arm it waited for), plus the ``vyre.policy.execution_mode`` verdict.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import anyio
import numpy as np
from opentelemetry import trace

from vyre_async import telemetry
from vyre_async._exports import public_dir as _public_dir
from vyre_async._version import __version__
from vyre_async.annotations import AttributeValue, dispatch_attributes
from vyre_async.arguments import dtype_argument, whole_number
from vyre_async.calibration import calibration_for
from vyre_async.config import DispatchConfig
from vyre_async.errors import (
    BackendError,
    InvalidArgument,
    InvalidProgram,
    UnsupportedFeature,
    host_out_of_memory,
)
from vyre_async.execution import ExecutionDecision, choose_execution_mode
from vyre_async.ir.expr import Atomic
from vyre_async.ir.limits import MAX_BUFFER_ELEMENTS
from vyre_async.ir.program import Program
from vyre_async.ir.types import Access, BufferDecl, DType
from vyre_async.ir.validate import validate_or_raise
from vyre_async.ir.walk import iter_exprs
from vyre_async.pending import PendingDispatch
from vyre_async.plan import normalize_input
from vyre_async.policies.arms import ArmConflict, ArmPlan, ArmSummary, plan_arms
from vyre_async.policies.concurrency import ArmConcurrencyVerdict, decide_arm_concurrency
from vyre_async.policies.residency import ResidencyVerdict, decide_residency
from vyre_async.resident import ResidentBuffer

if TYPE_CHECKING:
    from vyre_async.backend import VyreBackend

__all__ = [
    "Arm",
    "ArmGraph",
    "ArmRun",
    "GraphReport",
    "GraphResource",
    "GraphResult",
    "Residency",
    "summarize_arm",
]
__dir__ = _public_dir(__name__)

Residency = Literal["auto", "resident", "host"]
_tracer = trace.get_tracer("vyre_async", __version__)


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphResource:
    """One named buffer of an arm graph.

    Attributes:
        name: The resource name arms bind to.
        dtype: Element type.
        count: Element count.
        initial: Initial contents (a read-only private copy), or None for zeros.
    """

    name: str
    dtype: DType
    count: int
    initial: np.ndarray | None

    def contents(self) -> np.ndarray:
        """Return a new array with the initial contents.

        Raises:
            DeviceOutOfMemory: the host could not hold it.
        """
        try:
            if self.initial is None:
                return np.zeros(self.count, self.dtype.numpy)
            return self.initial.copy()
        except MemoryError as exc:
            raise host_out_of_memory(4 * self.count, f"creating resource {self.name!r}") from exc


@dataclass(frozen=True, slots=True, kw_only=True)
class Arm:
    """One program of an arm graph, with its buffers bound to graph resources.

    Attributes:
        index: Submission order (0-based).
        label: A name for reports and spans.
        program: The program.
        bindings: ``(buffer name, resource name)`` pairs, in the program's buffer order.
        config: The dispatch config, or None for the default.
        summary: The resources it reads and writes.
    """

    index: int
    label: str
    program: Program
    bindings: tuple[tuple[str, str], ...]
    config: DispatchConfig | None
    summary: ArmSummary

    def resource_of(self, buffer: str) -> str:
        """Return the resource bound to ``buffer``.

        Raises:
            KeyError: the buffer is not bound.
        """
        for name, resource in self.bindings:
            if name == buffer:
                return resource
        raise KeyError(buffer)


@dataclass(frozen=True, slots=True, kw_only=True)
class ArmRun:
    """How one arm ran in a graph submission.

    Attributes:
        index: The arm's index.
        label: The arm's label.
        layer: The layer it ran in.
        concurrent_with: The other arms of its layer (in flight at the same time).
        waits_for: The arm whose conflict placed it in its layer (None in layer 0).
        reason: That conflict's reason (``write_write``, ``read_after_write`` or
            ``write_after_read``), None in layer 0.
        conflicts: Every conflict with an earlier arm.
        stream: The stream the backend reported (``vyre.stream``), if any.
        wall_s: From its ``dispatch()`` to its completion, host clock.
        device_s: Execution time the backend measured.
        cache_hit: Whether its pipeline was cached.
    """

    index: int
    label: str
    layer: int
    concurrent_with: tuple[int, ...]
    waits_for: int | None
    reason: str | None
    conflicts: tuple[ArmConflict, ...]
    stream: int | str | None
    wall_s: float | None
    device_s: float | None
    cache_hit: bool | None


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphReport:
    """What happened in one graph submission.

    Attributes:
        label: The graph's label.
        backend_id: The backend it ran on.
        layers: Arm indices per layer, in submission order.
        joins: Joins between layers (``len(layers) - 1``).
        arms: One `ArmRun` per arm, by index.
        residency: ``"resident"`` (resources passed as resident buffers) or ``"host"``.
        submission: How many times this graph (unchanged) was submitted to this
            backend, this run included (the repeat count of the execution mode).
        execution: The execution-mode decision for the submission.
        wall_s: The whole run, host clock.
        layer_wall_s: With host joins, each layer from its first dispatch to its
            last completion; with device joins, from the previous layer's last
            completion (or the run's start) to this layer's last completion.
        joins_on: ``"device"`` when every arm was submitted at once and the
            backend ordered the arms on their shared resident buffers (events on
            CUDA, waits inside worker threads on the reference backend), or
            ``"host"`` when each layer was awaited before the next was dispatched.
        host_join_reason: Why the joins were on the host (None with device joins):
            ``"host_residency"`` (resources were host arrays),
            ``"unordered_resident_buffers"`` (the backend does not promise
            `BackendCapabilities.ordered_resident_buffers`) or
            ``"bool_resource_written"`` (an arm writes a BOOL resource, which
            stays a host array).
        concurrency: Per layer, the `ArmConcurrencyVerdict`: whether its arms
            ran concurrently or in order (each finished before the next was
            dispatched), and why (``single_arm`` for a layer of one arm).
        concurrent_overlap_bps: The backend's calibrated arm overlap the verdicts used
            (`Calibration.concurrent_overlap_bps`), None when not calibrated.
        residency_verdict: The `ResidencyVerdict` that chose ``residency``:
            ``requested``, ``no_resident_buffers``, ``uncalibrated``,
            ``resident_slower``, ``low_gain`` or ``resident_pays``, with the
            estimated savings of resident buffers.
        resident_gain_bps: The backend's calibrated resident gain the verdict
            used (`Calibration.resident_gain_bps`), None when not calibrated.
    """

    label: str | None
    backend_id: str
    layers: tuple[tuple[int, ...], ...]
    joins: int
    arms: tuple[ArmRun, ...]
    residency: Literal["resident", "host"]
    submission: int
    execution: ExecutionDecision
    wall_s: float
    layer_wall_s: tuple[float, ...]
    joins_on: Literal["device", "host"] = "host"
    host_join_reason: str | None = None
    concurrency: tuple[ArmConcurrencyVerdict, ...] = ()
    concurrent_overlap_bps: int | None = None
    residency_verdict: ResidencyVerdict | None = None
    resident_gain_bps: int | None = None

    @property
    def residency_reason(self) -> str | None:
        """Why the resources were ``residency``: the verdict's reason (None without one)."""
        return None if self.residency_verdict is None else self.residency_verdict.reason

    def describe(self) -> str:
        """Return a human-readable, multi-line account of the run."""
        lines = [
            f"graph {self.label or '(unlabelled)'} on {self.backend_id}: {len(self.arms)} arms, "
            f"{len(self.layers)} layers, {self.joins} joins on the {self.joins_on}"
            + (f" ({self.host_join_reason})" if self.host_join_reason else "")
            + f", resources {self.residency}"
            + (f" ({self.residency_reason})" if self.residency_reason else "")
            + f", {self.wall_s * 1e3:.2f} ms",
            f"execution mode: {self.execution.mode.kind}"
            + (f" ({self.execution.mode.reason})" if self.execution.mode.reason else ""),
            "arm overlap: "
            + (
                "not calibrated"
                if self.concurrent_overlap_bps is None
                else f"{self.concurrent_overlap_bps / 100:+.0f} % (calibrated)"
            ),
            "resident gain: "
            + (
                "not calibrated"
                if self.resident_gain_bps is None
                else f"{self.resident_gain_bps / 100:+.0f} % (calibrated)"
            )
            + (
                f", est. {self.residency_verdict.savings_ns / 1e6:+.2f} ms if resident"
                if self.residency_verdict is not None and self.residency_verdict.savings_ns
                else ""
            ),
        ]
        for number, layer in enumerate(self.layers):
            names = ", ".join(self.arms[i].label for i in layer)
            how = ""
            if len(layer) > 1:
                how = " — concurrent" if len(layer) > 1 else ""
                if number < len(self.concurrency):
                    verdict = self.concurrency[number]
                    how = f" — {verdict.kind.replace('_', ' ')} ({verdict.reason}"
                    if verdict.savings_ns:
                        how += f", est. {verdict.savings_ns / 1e6:+.2f} ms if concurrent"
                    how += ")"
            lines.append(f"layer {number} ({self.layer_wall_s[number] * 1e3:.2f} ms): {names}{how}")
            for i in layer:
                arm = self.arms[i]
                where = "" if arm.stream is None else f" stream {arm.stream}"
                wall = "" if arm.wall_s is None else f" {arm.wall_s * 1e3:.2f} ms"
                why = (
                    ""
                    if arm.waits_for is None
                    else f" after {self.arms[arm.waits_for].label} ({arm.reason})"
                )
                lines.append(f"  {arm.label}:{where}{wall}{why}")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphResult:
    """The outputs and report of one graph submission.

    Attributes:
        outputs: The requested resources' final contents (new arrays).
        report: How the run went.
    """

    outputs: dict[str, np.ndarray]
    report: GraphReport


def _atomic_targets(program: Program) -> frozenset[str]:
    cached = program.memo.get("graph.atomic_targets")
    if cached is None:
        cached = frozenset(e.buffer for e in iter_exprs(program.body) if isinstance(e, Atomic))
        program.memo["graph.atomic_targets"] = cached
    return frozenset(cached)


def summarize_arm(program: Program, bindings: Mapping[str, str]) -> ArmSummary:
    """Return the resources an arm reads and writes, from its binding plan.

    READ and UNIFORM buffers read their resource, WRITE buffers write it,
    READ_WRITE buffers do both, and atomic targets count as both.

    Args:
        program: The arm's program.
        bindings: Buffer name → resource name, for every bound buffer.

    Returns:
        The summary over resource names.
    """
    atomics = _atomic_targets(program)
    reads: set[str] = set()
    writes: set[str] = set()
    for decl in program.buffers:
        resource = bindings.get(decl.name)
        if resource is None:
            continue
        if decl.access.is_input or decl.name in atomics:
            reads.add(resource)
        if decl.access.is_output or decl.name in atomics:
            writes.add(resource)
    return ArmSummary(frozenset(reads), frozenset(writes))


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

        Returns:
            The outputs and a `GraphReport`.

        Raises:
            InvalidArgument: ``backend``, ``outputs``, ``values`` or
                ``residency`` is of the wrong type, or an output or value names
                no resource.
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
        from vyre_async.backend import VyreBackend as _Backend

        if not isinstance(backend, _Backend):
            raise InvalidArgument(
                f"ArmGraph.run needs a backend, got a {type(backend).__name__}",
                fix='pass a backend, e.g. await graph.run(acquire_backend("reference"))',
            )
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
        )
        in_order = sum(1 for v in concurrency if v.reason != "single_arm" and not v.concurrent)
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
        )
        return GraphResult(outputs=out, report=report)


def _residency_attributes(verdict: ResidencyVerdict) -> dict[str, AttributeValue]:
    return {"vyre.policy.residency": verdict.kind, "vyre.policy.residency.reason": verdict.reason}


def _settled_placement(
    verdict: ResidencyVerdict, runner: _Run, gain: int | None, requested: Residency, work_ns: int
) -> ResidencyVerdict:
    """``verdict``, or the host verdict when the run found the backend without resident buffers."""
    if verdict.resident and not runner.resident:
        return decide_residency(gain, requested=requested, resident_buffers=False, work_ns=work_ns)
    return verdict


def _resident_variant(program: Program) -> Program:
    """``program`` with WRITE buffers made READ_WRITE, to run on fresh zeroed resident buffers.

    WRITE buffers start zero-filled and READ_WRITE ones from their input, so on a
    zeroed buffer the two are the same kernel; the outputs (WRITE and READ_WRITE,
    in declaration order) and the inferred grid are unchanged.
    """
    variant = program.memo.get("graph.resident_variant")
    if variant is None:
        if any(d.access is Access.WRITE for d in program.buffers):
            buffers = [
                BufferDecl(d.name, d.binding, Access.READ_WRITE, d.dtype, d.count)
                if d.access is Access.WRITE
                else d
                for d in program.buffers
            ]
            variant = Program(buffers, program.workgroup_size, program.body, op_id=program.op_id)
        else:
            variant = program
        program.memo["graph.resident_variant"] = variant
    assert isinstance(variant, Program)
    return variant


def _settled_at(pending: PendingDispatch) -> float:
    """When a dispatch's result was ready (``time.monotonic()`` clock)."""
    timing = pending.timing
    return pending.created + (0.0 if timing is None or timing.wall_s is None else timing.wall_s)


def _persistent_mode(arms: Sequence[Arm]) -> Literal["auto", "force", "disable"]:
    modes = {arm.config.persistent_thread for arm in arms if arm.config is not None}
    if "disable" in modes:
        return "disable"
    return "force" if "force" in modes else "auto"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Step:
    """One arm as every run of its graph dispatches it (built once per graph version)."""

    arm: Arm
    layer: int
    inputs: tuple[str, ...]  # the resource of each program input, in order
    outputs: tuple[str, ...]  # the resource of each program output, in order
    resident_program: Program  # WRITE buffers as READ_WRITE (`_resident_variant`)
    resident_inputs: tuple[str, ...]  # the resource of each resident_program input
    fresh: tuple[bool, ...]  # per input of resident_program: a WRITE buffer (fresh zeroed)
    attributes: Mapping[str, AttributeValue]  # span attributes that depend on the graph only
    waits: ArmConflict | None
    conflicts: tuple[ArmConflict, ...]
    layer_mates: tuple[int, ...]  # the other arms of its layer


@dataclass(frozen=True, slots=True, kw_only=True)
class _Schedule:
    """Everything about a graph version that runs do not change: plan, steps, uploads."""

    version: int
    label: str | None
    resources: Mapping[str, GraphResource]
    plan: ArmPlan
    steps: tuple[_Step, ...]
    uploads: tuple[str, ...]  # resources some arm reads before any arm WRITEs them
    writes_bool: bool  # an arm writes a BOOL resource (host joins)
    last_writer: Mapping[str, int]  # resource -> the last arm (submission order) writing it
    execution_config: DispatchConfig

    @staticmethod
    def build(
        label: str | None,
        version: int,
        arms: tuple[Arm, ...],
        resources: dict[str, GraphResource],
    ) -> _Schedule:
        plan = plan_arms([arm.summary for arm in arms])
        steps: list[_Step] = []
        first_use: dict[str, bool] = {}  # resource -> whether its first use reads it
        for arm in arms:
            layer = plan.layer_of[arm.index]
            bound = dict(arm.bindings)
            program = arm.program
            inputs = tuple(bound[d.name] for d in program.inputs)
            for decl in program.buffers:
                if decl.access is Access.WORKGROUP:
                    continue
                first_use.setdefault(bound[decl.name], decl.access is not Access.WRITE)
            variant = _resident_variant(program)
            fresh = tuple(program.buffer(d.name).access is Access.WRITE for d in variant.inputs)
            waits = plan.waits_for(arm.index)
            attributes: dict[str, AttributeValue] = {
                "vyre.arm.index": arm.index,
                "vyre.arm.label": arm.label,
                "vyre.policy.arm.layer": layer,
                "vyre.policy.arm.concurrent": len(plan.layers[layer]) > 1,
            }
            if label:
                attributes["vyre.graph.label"] = label
            if waits is not None:
                attributes["vyre.policy.arm.reason"] = waits.reason
                attributes["vyre.policy.arm.after"] = waits.earlier
            steps.append(
                _Step(
                    arm=arm,
                    layer=layer,
                    inputs=inputs,
                    outputs=tuple(bound[d.name] for d in program.outputs),
                    resident_program=variant,
                    resident_inputs=tuple(bound[d.name] for d in variant.inputs),
                    fresh=fresh,
                    attributes=attributes,
                    waits=waits,
                    conflicts=tuple(c for c in plan.conflicts if c.later == arm.index),
                    layer_mates=tuple(i for i in plan.layers[layer] if i != arm.index),
                )
            )
        return _Schedule(
            version=version,
            label=label,
            resources=resources,
            plan=plan,
            steps=tuple(steps),
            uploads=tuple(sorted(name for name, reads in first_use.items() if reads)),
            writes_bool=any(
                decl.access.is_output and decl.dtype is DType.BOOL
                for arm in arms
                for decl in arm.program.buffers
            ),
            execution_config=DispatchConfig(persistent_thread=_persistent_mode(arms)),
            last_writer={resource: step.arm.index for step in steps for resource in step.outputs},
        )


class _Run:
    """The state of one graph submission (private to `ArmGraph.run`)."""

    def __init__(
        self,
        *,
        schedule: _Schedule,
        backend: VyreBackend,
        decision: ExecutionDecision,
        concurrency: tuple[ArmConcurrencyVerdict, ...],
        state: dict[str, np.ndarray | ResidentBuffer],
        resident: bool,
        required: bool,
    ) -> None:
        self.schedule = schedule
        self.graph_label = schedule.label
        self.backend = backend
        self.steps = schedule.steps
        self.resources = schedule.resources
        self.plan = schedule.plan
        self.decision = decision
        self.concurrency = concurrency
        self.state = state
        self.resident = resident
        self.required = required
        self.owned: list[ResidentBuffer] = []
        self.arm_runs: list[ArmRun] = []
        self.in_flight: list[PendingDispatch] = []
        self.host_join_reason: str | None = None
        # Final contents already on the host: the outputs of each resource's last
        # writer (new arrays the run owns), returned by `take` without a copy.
        self.final: dict[str, np.ndarray] = {}
        mode = decision.span_attributes()
        # Per layer: the span attributes every arm of it adds to its graph-only ones.
        self.layer_attributes: list[dict[str, AttributeValue]] = [
            {
                **mode,
                "vyre.policy.arm_concurrency": verdict.kind,
                "vyre.policy.arm_concurrency.reason": verdict.reason,
            }
            for verdict in concurrency
        ]

    @property
    def residency(self) -> Literal["resident", "host"]:
        return "resident" if self.resident else "host"

    @property
    def joins_on(self) -> Literal["device", "host"]:
        return "host" if self.host_join_reason else "device"

    async def execute(self) -> list[float]:
        """Run every layer; return each layer's wall time."""
        self.host_join_reason = self._choose_joins()
        try:
            if self.host_join_reason is None:
                return await self._execute_device_joins()
            return await self._execute_host_joins()
        except BaseException:
            await self._settle_in_flight()
            self.release()
            raise

    def _choose_joins(self) -> str | None:
        """Return why the joins must be on the host, or None for device joins.

        Device joins need resident resources on a backend that orders them: this
        uploads every resource an arm reads before any arm writes it (a backend
        without resident buffers says so here, and the run falls back to host arrays).
        """
        if not self.resident:
            return "host_residency"
        if not self.backend.capabilities().ordered_resident_buffers:
            return "unordered_resident_buffers"
        if self.schedule.writes_bool:
            return "bool_resource_written"
        for resource in self.schedule.uploads:  # WRITE-first ones get fresh zeroed buffers
            self._input(resource)
        return None if self.residency == "resident" else "host_residency"

    async def _execute_device_joins(self) -> list[float]:
        """Submit the arms layer by layer; the backend orders them on their resident buffers.

        A concurrent layer's arms (and a single arm) are submitted without
        waiting; each arm of a layer run in order is awaited before the next
        dispatch, so the layer has finished when the next layer is submitted.
        """
        started = time.monotonic()
        launched: list[tuple[int, PendingDispatch]] = []
        for number, layer in enumerate(self.plan.layers):
            attributes = self.layer_attributes[number]
            in_order = len(layer) > 1 and not self.concurrency[number].concurrent
            for i in layer:
                pending = self._launch_resident(self.steps[i], attributes)
                launched.append((i, pending))
                if in_order:  # it finishes before the next dispatch
                    (outputs,) = await self._await_layer((i,), [pending])
                    self._keep_final(self.steps[i], outputs)
        waiting = [(i, p) for i, p in launched if p in self.in_flight]
        results = await self._await_layer(tuple(i for i, _ in waiting), [p for _, p in waiting])
        for (i, _), outputs in zip(waiting, results, strict=True):
            self._keep_final(self.steps[i], outputs)
        runs = {i: self._arm_run(self.steps[i], pending) for i, pending in launched}
        self.arm_runs = [runs[i] for i in range(len(self.steps))]
        settled = {i: _settled_at(pending) for i, pending in launched}
        walls: list[float] = []
        previous = started
        for layer in self.plan.layers:
            end = max([previous, *(settled[i] for i in layer)])
            walls.append(end - previous)
            previous = end
        return walls

    async def _execute_host_joins(self) -> list[float]:
        """Dispatch a layer (together, or arm by arm), await it, store its outputs, go on."""
        walls: list[float] = []
        runs: dict[int, ArmRun] = {}
        for number, layer in enumerate(self.plan.layers):
            attributes = self.layer_attributes[number]
            started = time.perf_counter()
            groups = [layer] if self.concurrency[number].concurrent else [(i,) for i in layer]
            for group in groups:
                pendings = [self._launch(self.steps[i], attributes) for i in group]
                results = await self._await_layer(group, pendings)
                for i, pending, outputs in zip(group, pendings, results, strict=True):
                    self._store(self.steps[i], outputs)
                    runs[i] = self._arm_run(self.steps[i], pending)
            walls.append(time.perf_counter() - started)
        self.arm_runs = [runs[i] for i in range(len(self.steps))]
        return walls

    def _launch_resident(
        self, step: _Step, attributes: Mapping[str, AttributeValue]
    ) -> PendingDispatch:
        """Dispatch an arm with every buffer resident: WRITE buffers get fresh zeroed ones."""
        inputs: list[np.ndarray | ResidentBuffer] = []
        for resource, fresh in zip(step.resident_inputs, step.fresh, strict=True):
            if fresh:
                res = self.resources[resource]
                handle = self.backend.alloc(
                    res.dtype, res.count, label=f"{self.graph_label or 'graph'}:{resource}"
                )
                self.owned.append(handle)  # the replaced buffer is freed at the end
                self.state[resource] = handle
                inputs.append(handle)
            else:
                inputs.append(self._input(resource))
        return self._dispatch(step, attributes, step.resident_program, inputs)

    def _input(self, resource: str) -> np.ndarray | ResidentBuffer:
        value = self.state[resource]
        if (
            not self.resident
            or isinstance(value, ResidentBuffer)
            or self.resources[resource].dtype is DType.BOOL
        ):
            return value
        try:
            handle = self.backend.upload(value, label=f"{self.graph_label or 'graph'}:{resource}")
        except UnsupportedFeature:
            if self.required:
                raise
            self.resident = False  # graph-owned host arrays from here on (documented)
            return value
        self.owned.append(handle)
        self.state[resource] = handle
        return handle

    def _launch(self, step: _Step, attributes: Mapping[str, AttributeValue]) -> PendingDispatch:
        inputs = [self._input(resource) for resource in step.inputs]
        return self._dispatch(step, attributes, step.arm.program, inputs)

    def _dispatch(
        self,
        step: _Step,
        attributes: Mapping[str, AttributeValue],
        program: Program,
        inputs: list[np.ndarray | ResidentBuffer],
    ) -> PendingDispatch:
        with dispatch_attributes({**step.attributes, **attributes}):
            pending = self.backend.dispatch(program, inputs, step.arm.config)
        self.in_flight.append(pending)
        return pending

    async def _await_layer(
        self, layer: tuple[int, ...], pendings: list[PendingDispatch]
    ) -> list[list[np.ndarray]]:
        """Await ``pendings`` (the arms ``layer``); raise the first failure, named."""
        results: list[list[np.ndarray]] = []
        failure: tuple[int, Exception] | None = None
        for i, pending in zip(layer, pendings, strict=True):
            try:
                outputs = await pending
            except Exception as exc:  # the arm failed (a cancelled await propagates)
                outputs = []
                if failure is None:
                    failure = (i, exc)
            # Only a settled arm leaves in_flight: after a cancelled await it is still
            # running, and _settle_in_flight must wait for it before buffers are freed.
            self.in_flight.remove(pending)
            results.append(outputs)
        if failure is not None:
            index, error = failure
            arm = self.steps[index].arm
            error.add_note(
                f"in arm {arm.label!r} (index {index}, layer {self.plan.layer_of[index]}) of "
                f"graph {self.graph_label or '(unlabelled)'}"
            )
            raise error
        return results

    def _store(self, step: _Step, outputs: list[np.ndarray]) -> None:
        for resource, output in zip(step.outputs, outputs, strict=True):
            old = self.state[resource]
            self.state[resource] = output
            if isinstance(old, ResidentBuffer):
                self._free(old)
        self._keep_final(step, outputs)

    def _keep_final(self, step: _Step, outputs: list[np.ndarray]) -> None:
        """Keep the host outputs of ``step`` for the resources it writes last."""
        for resource, output in zip(step.outputs, outputs, strict=True):
            if self.schedule.last_writer[resource] == step.arm.index:
                self.final[resource] = output

    def _arm_run(self, step: _Step, pending: PendingDispatch) -> ArmRun:
        arm = step.arm
        attributes = pending.record.attributes or {}
        stream = attributes.get("vyre.stream")
        timing = pending.timing
        waits = step.waits
        cache_hit = pending.record.cache_hit
        return ArmRun(
            index=arm.index,
            label=arm.label,
            layer=step.layer,
            concurrent_with=step.layer_mates if self.concurrency[step.layer].concurrent else (),
            waits_for=None if waits is None else waits.earlier,
            reason=None if waits is None else waits.reason,
            conflicts=step.conflicts,
            stream=stream if isinstance(stream, int | str) else None,
            wall_s=None if timing is None else timing.wall_s,
            device_s=None if timing is None else timing.device_s,
            cache_hit=cache_hit if isinstance(cache_hit, bool) else None,
        )

    async def _settle_in_flight(self) -> None:
        """Wait (shielded from cancellation) for arms still running, discarding results.

        No resident buffer is released under a running arm.
        """
        with anyio.CancelScope(shield=True):
            for pending in list(self.in_flight):
                with contextlib.suppress(Exception):
                    await pending
            self.in_flight.clear()

    def take(self, resource: str) -> np.ndarray:
        """Return a new array with the resource's final contents."""
        final = self.final.pop(resource, None)
        if final is not None:  # the last writer's outputs: already a new host array
            return final
        value = self.state[resource]
        if isinstance(value, ResidentBuffer):
            return self.backend.download(value)
        return np.array(value, copy=True)

    def _free(self, handle: ResidentBuffer) -> None:
        if handle in self.owned:
            self.owned.remove(handle)
        with contextlib.suppress(BackendError):
            self.backend.free(handle)

    def release(self) -> None:
        """Free every resident buffer the run still owns (never raises)."""
        owned, self.owned = self.owned, []
        for handle in owned:
            with contextlib.suppress(BackendError):
                self.backend.free(handle)
