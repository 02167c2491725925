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

Resources are graph-owned. Where the backend has resident buffers, resources
that arms read are uploaded once per run and passed as resident buffers
(``residency="auto"`` or ``"resident"``); a backend without them raises
`UnsupportedFeature` on ``upload`` and ``"auto"`` then keeps the resources as
host arrays owned by the graph (reported as ``residency="host"``). That is not
a silent fallback of a user's buffer: graph resources never belonged to the
device. BOOL resources always stay host arrays (``upload`` of a ``uint32``
array would type them U32).

Every arm's ``vyre.dispatch`` span (a child of one ``vyre.graph`` span) carries
``vyre.policy.arm.layer``, ``vyre.arm.index``, ``vyre.arm.label`` and, for an
arm that had to wait, ``vyre.policy.arm.reason`` (``write_write``,
``read_after_write`` or ``write_after_read``) and ``vyre.policy.arm.after`` (the
arm it waited for), plus the ``vyre.policy.execution_mode`` verdict.
"""

from __future__ import annotations

import contextlib
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
from vyre_async._version import __version__
from vyre_async.annotations import AttributeValue, dispatch_attributes
from vyre_async.arguments import whole_number
from vyre_async.config import DispatchConfig
from vyre_async.errors import (
    BackendError,
    InvalidProgram,
    UnsupportedFeature,
    host_out_of_memory,
)
from vyre_async.execution import ExecutionDecision, choose_execution_mode
from vyre_async.ir.expr import Atomic
from vyre_async.ir.limits import MAX_BUFFER_ELEMENTS
from vyre_async.ir.program import Program
from vyre_async.ir.types import Access, BufferDecl, DType, as_dtype
from vyre_async.ir.validate import validate_or_raise
from vyre_async.ir.walk import iter_exprs
from vyre_async.pending import PendingDispatch
from vyre_async.plan import normalize_input
from vyre_async.policies.arms import ArmConflict, ArmPlan, ArmSummary, plan_arms
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

    def describe(self) -> str:
        """Return a human-readable, multi-line account of the run."""
        lines = [
            f"graph {self.label or '(unlabelled)'} on {self.backend_id}: {len(self.arms)} arms, "
            f"{len(self.layers)} layers, {self.joins} joins on the {self.joins_on}"
            + (f" ({self.host_join_reason})" if self.host_join_reason else "")
            + f", resources {self.residency}, {self.wall_s * 1e3:.2f} ms",
            f"execution mode: {self.execution.mode.kind}"
            + (f" ({self.execution.mode.reason})" if self.execution.mode.reason else ""),
        ]
        for number, layer in enumerate(self.layers):
            names = ", ".join(self.arms[i].label for i in layer)
            lines.append(
                f"layer {number} ({self.layer_wall_s[number] * 1e3:.2f} ms): {names}"
                + (" — concurrent" if len(layer) > 1 else "")
            )
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

    Example:
        >>> graph = ArmGraph(label="demo")
        >>> graph.resource("x", "u32", 64, initial=np.arange(64, dtype=np.uint32))
        >>> graph.resource("y", "u32", 64)
        >>> graph.arm(xor_program, {"a": "x", "b": "x", "out": "y"})
        >>> result = await graph.run(backend, outputs=["y"])
    """

    def __init__(self, *, label: str | None = None) -> None:
        if label is not None and not isinstance(label, str):
            raise InvalidProgram(f"graph label must be a str, got {label!r}", fix="pass a str")
        self.label = label
        self._resources: dict[str, GraphResource] = {}
        self._arms: list[Arm] = []
        self._version = 0
        self._lock = threading.Lock()
        self._submissions: weakref.WeakKeyDictionary[VyreBackend, tuple[int, int]] = (
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
            InvalidProgram: a duplicate or empty name, an unknown dtype, a bad
                count, or initial contents of the wrong size or dtype.
        """
        if not isinstance(name, str) or not name:
            raise InvalidProgram(
                f"resource name must be a non-empty str, got {name!r}", fix="name it"
            )
        if name in self._resources:
            raise InvalidProgram(
                f"resource {name!r} is declared twice", fix="give every resource its own name"
            )
        kind = as_dtype(dtype, f"resource {name!r} dtype")
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
            InvalidProgram: the program is invalid, or a binding is missing,
                unknown, of another dtype or count, or aliases a written resource.
        """
        if not isinstance(program, Program):
            raise InvalidProgram(
                f"an arm needs a Program, got {type(program).__name__}",
                fix="build the kernel with vyre_async.ir.Program(...)",
            )
        validate_or_raise(program)
        if not isinstance(bindings, Mapping):
            raise InvalidProgram(
                f"bindings must map buffer names to resource names, got {bindings!r}",
                fix='pass e.g. {"a": "x", "out": "y"}',
            )
        if config is not None and not isinstance(config, DispatchConfig):
            raise InvalidProgram(
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
                raise InvalidProgram(
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
        return plan_arms(self.summaries())

    def __repr__(self) -> str:
        name = f" {self.label!r}" if self.label else ""
        return f"<ArmGraph{name} {len(self._resources)} resources, {len(self._arms)} arms>"

    # Running ---------------------------------------------------------------------------
    async def run(
        self,
        backend: VyreBackend,
        outputs: Iterable[str] | None = None,
        *,
        values: Mapping[str, np.ndarray | bytes] | None = None,
        residency: Residency = "auto",
    ) -> GraphResult:
        """Run every arm on ``backend``, layer by layer, and return the requested resources.

        Args:
            backend: Where the arms run.
            outputs: Resource names to return (default: every resource).
            values: Contents replacing some resources' initial contents for this run.
            residency: ``"auto"`` (resident buffers when the backend has them),
                ``"resident"`` (required) or ``"host"``.

        Returns:
            The outputs and a `GraphReport`.

        Raises:
            InvalidProgram: an unknown output or value name, or a value of the
                wrong size or dtype; or an arm's dispatch was rejected.
            UnsupportedFeature: ``residency="resident"`` on a backend without
                resident buffers, or an arm needs a feature the backend lacks.
            BackendError: an arm failed (the error names the arm in a note). With
                host joins the other arms of its layer are awaited before it is
                raised and later layers never start; with device joins every arm
                was already submitted, and all of them are awaited first (the
                first failure in submission order is raised).
        """
        if residency not in ("auto", "resident", "host"):
            raise InvalidProgram(
                f"residency must be 'auto', 'resident' or 'host', got {residency!r}",
                fix='pass residency="auto"',
            )
        with self._lock:
            arms = tuple(self._arms)
            resources = dict(self._resources)
            version = self._version
            seen_version, count = self._submissions.get(backend, (version, 0))
            submission = (count if seen_version == version else 0) + 1
            self._submissions[backend] = (version, submission)
        wanted = list(resources) if outputs is None else list(outputs)
        for name in wanted:
            if name not in resources:
                raise InvalidProgram(
                    f"output {name!r} is not a resource of this graph",
                    fix=f"ask for declared resources: {sorted(resources)}",
                )
        state: dict[str, np.ndarray | ResidentBuffer] = {
            name: res.contents() for name, res in resources.items()
        }
        for name, value in (values or {}).items():
            res = resources.get(name)
            if res is None:
                raise InvalidProgram(
                    f"value for {name!r}, which is not a resource of this graph",
                    fix=f"pass values for declared resources: {sorted(resources)}",
                )
            state[name] = normalize_input(
                BufferDecl(name, 0, Access.READ, res.dtype, res.count), value
            )
        plan = plan_arms([arm.summary for arm in arms])
        decision = choose_execution_mode(
            backend,
            batch_size=len(arms),
            repeats=submission,
            config=DispatchConfig(persistent_thread=_persistent_mode(arms)),
        )
        runner = _Run(
            graph_label=self.label,
            backend=backend,
            arms=arms,
            resources=resources,
            plan=plan,
            decision=decision,
            state=state,
            resident=residency != "host",
            required=residency == "resident",
        )
        started = time.perf_counter()
        if not telemetry.is_enabled():
            layer_wall = await runner.execute()
        else:
            span = _tracer.start_span(
                "vyre.graph",
                attributes={
                    "vyre.backend.id": backend.id,
                    "vyre.graph.arms": len(arms),
                    "vyre.graph.layers": len(plan.layers),
                    "vyre.graph.joins": plan.joins,
                    "vyre.graph.submission": submission,
                    **({"vyre.graph.label": self.label} if self.label else {}),
                    **decision.span_attributes(),
                },
            )
            with trace.use_span(span, end_on_exit=True):
                layer_wall = await runner.execute()
                span.set_attribute("vyre.graph.residency", runner.residency)
                span.set_attribute("vyre.graph.joins_on", runner.joins_on)
                if runner.host_join_reason:
                    span.set_attribute("vyre.graph.host_join_reason", runner.host_join_reason)
        wall = time.perf_counter() - started
        try:
            out = {name: runner.take(name) for name in wanted}
        finally:
            runner.release()
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
        )
        return GraphResult(outputs=out, report=report)


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


class _Run:
    """The state of one graph submission (private to `ArmGraph.run`)."""

    def __init__(
        self,
        *,
        graph_label: str | None,
        backend: VyreBackend,
        arms: tuple[Arm, ...],
        resources: Mapping[str, GraphResource],
        plan: ArmPlan,
        decision: ExecutionDecision,
        state: dict[str, np.ndarray | ResidentBuffer],
        resident: bool,
        required: bool,
    ) -> None:
        self.graph_label = graph_label
        self.backend = backend
        self.arms = arms
        self.resources = resources
        self.plan = plan
        self.decision = decision
        self.state = state
        self.resident = resident
        self.required = required
        self.owned: list[ResidentBuffer] = []
        self.arm_runs: list[ArmRun] = []
        self.in_flight: list[PendingDispatch] = []
        self.host_join_reason: str | None = None

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
        uploads every resource an arm reads (a backend without resident buffers
        says so here, and the run falls back to host arrays).
        """
        if not self.resident:
            return "host_residency"
        if not self.backend.capabilities().ordered_resident_buffers:
            return "unordered_resident_buffers"
        for arm in self.arms:
            for decl in arm.program.buffers:
                if decl.access.is_output and decl.dtype is DType.BOOL:
                    return "bool_resource_written"
        read = sorted(  # WRITE-only resources get fresh zeroed buffers instead
            {arm.resource_of(decl.name) for arm in self.arms for decl in arm.program.inputs}
        )
        for resource in read:  # upload now; a backend without resident buffers says so here
            self._input(resource)
        return None if self.residency == "resident" else "host_residency"

    async def _execute_device_joins(self) -> list[float]:
        """Submit every arm at once; the backend orders them on their resident buffers."""
        started = time.monotonic()
        launched = [
            (i, number, layer, self._launch_resident(self.arms[i], number, layer))
            for number, layer in enumerate(self.plan.layers)
            for i in layer
        ]
        pendings = [pending for _, _, _, pending in launched]
        await self._await_layer(tuple(i for i, _, _, _ in launched), pendings)
        runs = {
            i: self._arm_run(self.arms[i], number, layer, pending)
            for i, number, layer, pending in launched
        }
        self.arm_runs = [runs[i] for i in range(len(self.arms))]
        settled = {i: _settled_at(pending) for i, _, _, pending in launched}
        walls: list[float] = []
        previous = started
        for layer in self.plan.layers:
            end = max([previous, *(settled[i] for i in layer)])
            walls.append(end - previous)
            previous = end
        return walls

    async def _execute_host_joins(self) -> list[float]:
        """Dispatch a layer, await it, store its outputs, then start the next."""
        walls: list[float] = []
        runs: dict[int, ArmRun] = {}
        for number, layer in enumerate(self.plan.layers):
            started = time.perf_counter()
            pendings = [self._launch(self.arms[i], number, layer) for i in layer]
            results = await self._await_layer(layer, pendings)
            walls.append(time.perf_counter() - started)
            for i, pending, outputs in zip(layer, pendings, results, strict=True):
                self._store(self.arms[i], outputs)
                runs[i] = self._arm_run(self.arms[i], number, layer, pending)
        self.arm_runs = [runs[i] for i in range(len(self.arms))]
        return walls

    def _launch_resident(self, arm: Arm, number: int, layer: tuple[int, ...]) -> PendingDispatch:
        """Dispatch ``arm`` with every buffer resident: WRITE buffers get fresh zeroed ones."""
        program = _resident_variant(arm.program)
        inputs: list[np.ndarray | ResidentBuffer] = []
        for decl in program.inputs:
            resource = arm.resource_of(decl.name)
            if arm.program.buffer(decl.name).access is Access.WRITE:
                res = self.resources[resource]
                handle = self.backend.alloc(
                    res.dtype, res.count, label=f"{self.graph_label or 'graph'}:{resource}"
                )
                self.owned.append(handle)  # the replaced buffer is freed at the end
                self.state[resource] = handle
                inputs.append(handle)
            else:
                inputs.append(self._input(resource))
        return self._dispatch(arm, number, layer, program, inputs)

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

    def _launch(self, arm: Arm, number: int, layer: tuple[int, ...]) -> PendingDispatch:
        inputs = [self._input(arm.resource_of(decl.name)) for decl in arm.program.inputs]
        return self._dispatch(arm, number, layer, arm.program, inputs)

    def _dispatch(
        self,
        arm: Arm,
        number: int,
        layer: tuple[int, ...],
        program: Program,
        inputs: list[np.ndarray | ResidentBuffer],
    ) -> PendingDispatch:
        attributes: dict[str, AttributeValue] = {
            "vyre.arm.index": arm.index,
            "vyre.arm.label": arm.label,
            "vyre.policy.arm.layer": number,
            "vyre.policy.arm.concurrent": len(layer) > 1,
            **self.decision.span_attributes(),
        }
        if self.graph_label:
            attributes["vyre.graph.label"] = self.graph_label
        waits = self.plan.waits_for(arm.index)
        if waits is not None:
            attributes["vyre.policy.arm.reason"] = waits.reason
            attributes["vyre.policy.arm.after"] = waits.earlier
        with dispatch_attributes(attributes):
            pending = self.backend.dispatch(program, inputs, arm.config)
        self.in_flight.append(pending)
        return pending

    async def _await_layer(
        self, layer: tuple[int, ...], pendings: list[PendingDispatch]
    ) -> list[list[np.ndarray]]:
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
            arm = self.arms[index]
            error.add_note(
                f"in arm {arm.label!r} (index {index}, layer {self.plan.layer_of[index]}) of "
                f"graph {self.graph_label or '(unlabelled)'}"
            )
            raise error
        return results

    def _store(self, arm: Arm, outputs: list[np.ndarray]) -> None:
        for decl, output in zip(arm.program.outputs, outputs, strict=True):
            resource = arm.resource_of(decl.name)
            old = self.state[resource]
            self.state[resource] = output
            if isinstance(old, ResidentBuffer):
                self._free(old)

    def _arm_run(
        self, arm: Arm, number: int, layer: tuple[int, ...], pending: PendingDispatch
    ) -> ArmRun:
        attributes = pending.record.attributes or {}
        stream = attributes.get("vyre.stream")
        timing = pending.timing
        waits = self.plan.waits_for(arm.index)
        cache_hit = pending.record.cache_hit
        return ArmRun(
            index=arm.index,
            label=arm.label,
            layer=number,
            concurrent_with=tuple(i for i in layer if i != arm.index),
            waits_for=None if waits is None else waits.earlier,
            reason=None if waits is None else waits.reason,
            conflicts=tuple(c for c in self.plan.conflicts if c.later == arm.index),
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
