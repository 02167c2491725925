"""Arm independence and DAG layering: which arms may run on concurrent streams.

An *arm* is one program of an arm graph. Its `ArmSummary` is the set of buffer
slots it reads and the set it writes (derived by the caller from the binding
plan; this module never walks a program). Two arms may run concurrently when
neither writes what the other touches; a graph of arms is layered so that every
layer holds mutually independent arms and every conflict crosses a layer
boundary (``layers - 1`` device-side joins).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from vyre_async._exports import public_dir as _public_dir

__all__ = [
    "ARM_REASONS",
    "ArmConflict",
    "ArmPlan",
    "ArmSummary",
    "ArmVerdict",
    "can_dispatch_concurrently",
    "layer_arms",
    "layer_dag",
    "plan_arms",
]
__dir__ = _public_dir(__name__)

ArmKind = Literal["independent", "serialize"]
ArmReason = Literal["write_write", "read_after_write", "write_after_read"]
#: Every reason a pair of arms can be serialised for, in the order they are checked.
ARM_REASONS: tuple[ArmReason, ...] = ("write_write", "read_after_write", "write_after_read")


@dataclass(frozen=True, slots=True, init=False)
class ArmSummary:
    """The buffer slots one arm reads and writes.

    Slots are any hashable ids (binding numbers, graph resource names). Atomic
    targets belong to both sets.

    Args:
        reads: Slots the arm reads (any iterable; kept as a frozenset).
        writes: Slots the arm writes (any iterable; kept as a frozenset).

    Raises:
        TypeError: a set is a plain string (pass a collection of slot ids) or
            holds an unhashable item.
    """

    reads: frozenset[Hashable]
    writes: frozenset[Hashable]

    def __init__(self, reads: Iterable[Hashable] = (), writes: Iterable[Hashable] = ()) -> None:
        for name, value in (("reads", reads), ("writes", writes)):
            if isinstance(value, str | bytes):
                raise TypeError(
                    f"ArmSummary.{name} must be a collection of slot ids, got the string "
                    f"{value!r}\nFix: wrap it: ArmSummary({name}={{{value!r}}})"
                )
            object.__setattr__(
                self, name, value if isinstance(value, frozenset) else frozenset(value)
            )

    @property
    def slots(self) -> frozenset[Hashable]:
        """Every slot the arm touches."""
        return self.reads | self.writes


@dataclass(frozen=True, slots=True, kw_only=True)
class ArmVerdict:
    """Whether two arms may run concurrently, and why not.

    Attributes:
        kind: ``"independent"`` or ``"serialize"``.
        reason: ``None`` when independent, else ``"write_write"``,
            ``"read_after_write"`` or ``"write_after_read"``.
        slots: The conflicting slots behind ``reason`` (empty when independent).
    """

    kind: ArmKind
    reason: ArmReason | None = None
    slots: frozenset[Hashable] = frozenset()

    def __post_init__(self) -> None:
        if self.kind not in ("independent", "serialize"):
            raise ValueError(
                f"ArmVerdict.kind must be 'independent' or 'serialize', not {self.kind!r}"
            )
        if (self.kind == "serialize") != (self.reason is not None):
            raise ValueError("ArmVerdict: a reason is given exactly when kind is 'serialize'")
        if self.reason is not None and self.reason not in ARM_REASONS:
            raise ValueError(f"ArmVerdict.reason must be one of {ARM_REASONS}, not {self.reason!r}")

    @property
    def concurrent(self) -> bool:
        """True when the two arms may run on separate streams."""
        return self.kind == "independent"


_INDEPENDENT = ArmVerdict(kind="independent")


def _summary(value: object, name: str) -> ArmSummary:
    if not isinstance(value, ArmSummary):
        raise TypeError(
            f"{name} must be an ArmSummary, got {type(value).__name__}\n"
            "Fix: build it with ArmSummary(reads={...}, writes={...})"
        )
    return value


def can_dispatch_concurrently(a: ArmSummary, b: ArmSummary) -> ArmVerdict:
    """Return whether arm ``a`` (submitted first) and arm ``b`` may run concurrently.

    The first matching rule wins: ``a.writes ∩ b.writes`` → ``write_write``;
    ``a.writes ∩ b.reads`` → ``read_after_write``; ``a.reads ∩ b.writes`` →
    ``write_after_read``; otherwise independent. Shared reads never conflict.

    Args:
        a: The earlier arm.
        b: The later arm.

    Returns:
        The verdict, with the conflicting slots.

    Raises:
        TypeError: an argument is not an `ArmSummary`.
    """
    a, b = _summary(a, "a"), _summary(b, "b")
    if a.writes:
        both = a.writes & b.writes
        if both:
            return ArmVerdict(kind="serialize", reason="write_write", slots=both)
        raw = a.writes & b.reads
        if raw:
            return ArmVerdict(kind="serialize", reason="read_after_write", slots=raw)
    if b.writes:
        war = a.reads & b.writes
        if war:
            return ArmVerdict(kind="serialize", reason="write_after_read", slots=war)
    return _INDEPENDENT


def layer_dag(count: int, edges: Iterable[tuple[int, int]]) -> list[list[int]]:
    """Layer a DAG of ``count`` nodes with Kahn's algorithm (minimum number of layers).

    Layer 0 holds every node without predecessors; each next layer the nodes
    whose last predecessor sits in the layer before. A node's layer is the length
    of the longest path reaching it. Duplicate edges are tolerated.

    Args:
        count: Number of nodes (``0 .. count-1``).
        edges: ``(before, after)`` pairs.

    Returns:
        The layers, each a list of node indices in ascending (submission) order.

    Raises:
        TypeError: ``count`` or an edge endpoint is not an int.
        ValueError: ``count`` is negative, an endpoint is out of range, an edge
            points a node at itself, or the edges form a cycle.
    """
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"count must be an int, got {count!r}\nFix: pass the number of nodes")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}\nFix: pass the number of nodes")
    successors: list[set[int]] = [set() for _ in range(count)]
    indegree = [0] * count
    for edge in edges:
        try:
            before, after = edge
        except (TypeError, ValueError):
            raise ValueError(
                f"an edge must be a (before, after) pair, got {edge!r}\nFix: pass 2-tuples of ints"
            ) from None
        for end in (before, after):
            if isinstance(end, bool) or not isinstance(end, int):
                raise TypeError(f"edge {edge!r} has a non-int endpoint\nFix: use node indices")
            if not 0 <= end < count:
                raise ValueError(
                    f"edge {edge!r} names node {end}, outside 0..{count - 1}\n"
                    "Fix: only connect existing nodes"
                )
        if before == after:
            raise ValueError(
                f"edge {edge!r} makes node {before} depend on itself\nFix: drop self-edges"
            )
        if after not in successors[before]:
            successors[before].add(after)
            indegree[after] += 1
    layers: list[list[int]] = []
    current = [node for node in range(count) if indegree[node] == 0]
    placed = 0
    while current:
        layers.append(current)
        placed += len(current)
        following: list[int] = []
        for node in current:
            for nxt in successors[node]:
                indegree[nxt] -= 1
                if indegree[nxt] == 0:
                    following.append(nxt)
        current = sorted(following)
    if placed != count:
        stuck = sorted(node for node in range(count) if indegree[node] > 0)
        raise ValueError(
            f"the edges form a cycle; nodes {stuck} can never run\n"
            "Fix: remove an edge of the cycle (dependencies must point forward)"
        )
    return layers


@dataclass(frozen=True, slots=True, kw_only=True)
class ArmConflict:
    """One conflicting pair of arms: ``later`` must wait for ``earlier``.

    Attributes:
        earlier: Index of the arm submitted first.
        later: Index of the arm submitted later.
        reason: ``"write_write"``, ``"read_after_write"`` or ``"write_after_read"``.
        slots: The conflicting slots.
    """

    earlier: int
    later: int
    reason: ArmReason
    slots: frozenset[Hashable]


@dataclass(frozen=True, slots=True, kw_only=True)
class ArmPlan:
    """How a graph of arms runs: layers of mutually independent arms.

    Attributes:
        layers: Arm indices per layer, each in submission order.
        layer_of: The layer of every arm, by arm index.
        conflicts: Every conflicting pair, ordered by ``(later, earlier)``.
        joins: Device-side joins between layers (``len(layers) - 1``, 0 when empty).
    """

    layers: tuple[tuple[int, ...], ...]
    layer_of: tuple[int, ...]
    conflicts: tuple[ArmConflict, ...]

    @property
    def joins(self) -> int:
        """Device-side joins between consecutive layers."""
        return max(0, len(self.layers) - 1)

    def waits_for(self, arm: int) -> ArmConflict | None:
        """Return the conflict that placed ``arm`` in its layer (None in layer 0).

        That is the conflict with the lowest-index earlier arm sitting in the
        layer just before ``arm``'s.
        """
        layer = self.layer_of[arm]
        if layer == 0:
            return None
        for conflict in self.conflicts:
            if conflict.later == arm and self.layer_of[conflict.earlier] == layer - 1:
                return conflict
        raise AssertionError(
            "unreachable: a layer > 0 always has a predecessor"
        )  # pragma: no cover


def plan_arms(summaries: Sequence[ArmSummary]) -> ArmPlan:
    """Layer arms by independence and keep every conflict (for reports and spans).

    An edge ``i → j`` (``i`` submitted before ``j``) joins every conflicting pair;
    Kahn layering of those edges gives the layers.

    Args:
        summaries: One `ArmSummary` per arm, in submission order.

    Returns:
        The plan.

    Raises:
        TypeError: an item is not an `ArmSummary`.
    """
    arms = [_summary(s, f"summaries[{i}]") for i, s in enumerate(summaries)]
    conflicts: list[ArmConflict] = []
    for later in range(len(arms)):
        for earlier in range(later):
            verdict = can_dispatch_concurrently(arms[earlier], arms[later])
            if verdict.reason is not None:
                conflicts.append(
                    ArmConflict(
                        earlier=earlier, later=later, reason=verdict.reason, slots=verdict.slots
                    )
                )
    layers = layer_dag(len(arms), ((c.earlier, c.later) for c in conflicts))
    layer_of = [0] * len(arms)
    for index, layer in enumerate(layers):
        for arm in layer:
            layer_of[arm] = index
    return ArmPlan(
        layers=tuple(tuple(layer) for layer in layers),
        layer_of=tuple(layer_of),
        conflicts=tuple(conflicts),
    )


def layer_arms(summaries: Sequence[ArmSummary]) -> list[list[int]]:
    """Return the layers of a graph of arms: mutually independent arms per layer.

    Every conflicting pair ends in different layers, in submission order; the
    number of layers is the length of the longest chain of conflicts; ``layers - 1``
    joins are needed. Examples: a chain of 4 → 4 layers, 3 joins; a diamond
    0→{1,2}→3 → ``[[0], [1, 2], [3]]``, 2 joins.

    Args:
        summaries: One `ArmSummary` per arm, in submission order.

    Returns:
        The layers, each a list of arm indices in submission order.

    Raises:
        TypeError: an item is not an `ArmSummary`.
    """
    return [list(layer) for layer in plan_arms(summaries).layers]
