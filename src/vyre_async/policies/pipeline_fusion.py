"""Fusion of independent dispatches into fewer launches: a pure decision over plain data.

A batch of N tiny independent dispatches pays N launches; on a GPU the launch,
not the work, dominates. `decide_fusion` decides whether they run as fused
launches — one program in which each workgroup range runs one member
(`vyre_async.ir.fusion.fuse_programs`) — and how they group: members must
share a workgroup shape, hold no grid barrier and touch disjoint buffers (no
member writes what another reads or writes), and a group must fit the
backend's storage-buffer bindings and workgroup memory. With calibrated costs
it fuses when the calibrated fusion gain is positive (``fusion_gain_bps``: how
much faster 16 tiny dispatches ran fused than separately on this device) and
what it saves, ``N * launch_ns * gain`` (scaled by the share of the ``N - 1``
launches the groups remove), outweighs the fused
pipeline's one-time compile (``compile_ns``, or nothing once compiled); a
break-even stays separate. Integer nanoseconds, exact comparisons.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from vyre_async._exports import public_dir as _public_dir
from vyre_async.ir.limits import MAX_BUFFERS
from vyre_async.ir.program import Program
from vyre_async.ir.stmt import Barrier, GridBarrier, Return
from vyre_async.ir.types import Access
from vyre_async.ir.walk import iter_stmts
from vyre_async.policies._checks import non_negative_int

__all__ = ["FUSION_REASONS", "FusionMember", "FusionVerdict", "decide_fusion", "describe_member"]
__dir__ = _public_dir(__name__)

FusionKind = Literal["fuse", "separate"]
#: Every reason a verdict can give.
FUSION_REASONS = (
    "cheaper",  # fuse: the time saved outweighs the compile
    "requested",  # fuse: mode "force"
    "disabled",  # mode "disable"
    "single_member",
    "grid_barrier",
    "workgroup_mismatch",
    "conflict",  # a member writes a buffer another reads or writes
    "limits",  # no two members fit one launch (bindings, workgroup memory)
    "uncalibrated",
    "not_worth_it",  # fused is not faster here, or the compile costs more than it saves
    "resident_inputs",
    "workgroup_override",
    "cooperative",
    "config_mismatch",  # members whose dispatch configs differ (labels aside)
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FusionMember:
    """One dispatch as the policy sees it.

    Attributes:
        workgroup: Its workgroup shape.
        workgroups: Workgroups in its grid (0: not known yet, as when an arm
            graph decides before planning; no rule depends on it).
        storage_buffers: Its buffers other than WORKGROUP ones (each one binding).
        workgroup_slots: ``(dtype, count)`` of each WORKGROUP buffer.
        has_grid_barrier: It holds a `GridBarrier` (never fused).
        barrier_and_return: It has both a ``Barrier`` and a ``Return`` (one per group).
        reads: Identities of the buffers it reads.
        writes: Identities of the buffers it writes.
    """

    workgroup: tuple[int, int, int]
    workgroups: int
    storage_buffers: int
    workgroup_slots: tuple[tuple[str, int], ...] = ()
    has_grid_barrier: bool = False
    barrier_and_return: bool = False
    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True, kw_only=True)
class FusionVerdict:
    """Whether and how members fuse.

    Attributes:
        kind: ``"fuse"`` or ``"separate"``.
        reason: One of `FUSION_REASONS`.
        groups: Member indices of each launch, in order (every member once; a
            group of one runs alone). ``((0,), (1,), ...)`` when separate.
        savings_ns: Estimated host time saved (0 when separate).
    """

    kind: FusionKind
    reason: str
    groups: tuple[tuple[int, ...], ...]
    savings_ns: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("fuse", "separate"):
            raise ValueError(f"FusionVerdict.kind must be 'fuse' or 'separate', not {self.kind!r}")
        if self.reason not in FUSION_REASONS:
            raise ValueError(f"FusionVerdict.reason {self.reason!r} is not in FUSION_REASONS")
        non_negative_int("FusionVerdict.savings_ns", self.savings_ns)
        if self.kind == "separate" and self.savings_ns:
            raise ValueError("FusionVerdict: savings_ns must be 0 when kind is 'separate'")

    @classmethod
    def separate(cls, members: int, reason: str) -> FusionVerdict:
        """The verdict that runs ``members`` dispatches one launch each, for ``reason``."""
        return cls(kind="separate", reason=reason, groups=tuple((i,) for i in range(members)))

    @property
    def launches(self) -> int:
        """Launches the members take under this verdict."""
        return len(self.groups)

    def span_attributes(self) -> dict[str, str | int]:
        """The ``vyre.policy.fusion*`` attributes recorded on every member's span."""
        return {
            "vyre.policy.fusion": self.kind,
            "vyre.policy.fusion.reason": self.reason,
            "vyre.policy.fusion.members": sum(len(g) for g in self.groups),
            "vyre.policy.fusion.launches": self.launches,
            "vyre.policy.fusion.savings_ns": self.savings_ns,
        }


def describe_member(
    program: Program,
    workgroups: int,
    *,
    reads: frozenset[str] = frozenset(),
    writes: frozenset[str] = frozenset(),
) -> FusionMember:
    """Describe one dispatch of ``program`` over ``workgroups`` workgroups (memoised facts)."""
    facts = program.memo.get("policies.fusion")
    if facts is None:
        grid = barrier = ret = False
        for stmt in iter_stmts(program.body):
            grid |= isinstance(stmt, GridBarrier)
            barrier |= isinstance(stmt, Barrier)
            ret |= isinstance(stmt, Return)
        storage = sum(1 for d in program.buffers if d.access is not Access.WORKGROUP)
        slots = tuple((d.dtype.value, d.count) for d in program.workgroup_buffers)
        facts = program.memo["policies.fusion"] = (grid, barrier and ret, storage, slots)
    grid, both, storage, slots = facts
    return FusionMember(
        workgroup=program.workgroup_size,
        workgroups=workgroups,
        storage_buffers=storage,
        workgroup_slots=slots,
        has_grid_barrier=grid,
        barrier_and_return=both,
        reads=reads,
        writes=writes,
    )


def _separate(n: int, reason: str) -> FusionVerdict:
    return FusionVerdict.separate(n, reason)


def _slot_bytes(counts: Counter[tuple[str, int]]) -> int:
    return sum(4 * count * times for (_, count), times in counts.items())


def _groups(
    members: Sequence[FusionMember], max_buffers: int, max_workgroup_bytes: int
) -> list[tuple[int, ...]]:
    """Pack members, in order, into groups within the limits (a group of one when alone)."""
    groups: list[tuple[int, ...]] = []
    current: list[int] = []
    buffers = 1  # the member table
    slots: Counter[tuple[str, int]] = Counter()
    both = False
    for i, m in enumerate(members):
        mine = Counter(m.workgroup_slots)
        merged = slots | mine  # slots are shared: each (dtype, count) as often as one member needs
        fits = (
            buffers + m.storage_buffers <= max_buffers
            and (not max_workgroup_bytes or _slot_bytes(merged) <= max_workgroup_bytes)
            and not (both and m.barrier_and_return)
        )
        if current and not fits:
            groups.append(tuple(current))
            current, buffers, slots, both = [], 1, Counter(), False
            merged = mine
        current.append(i)
        buffers += m.storage_buffers
        slots = merged
        both |= m.barrier_and_return
    if current:
        groups.append(tuple(current))
    return groups


def decide_fusion(
    members: Sequence[FusionMember],
    *,
    launch_ns: int | None,
    compile_ns: int | None,
    fusion_gain_bps: int | None = None,
    max_storage_buffers: int = 0,
    max_workgroup_bytes: int = 0,
    mode: Literal["auto", "force", "disable"] = "auto",
    blocked: str | None = None,
) -> FusionVerdict:
    """Decide whether ``members`` run as fused launches, and how they group.

    Args:
        members: The dispatches, in order.
        launch_ns: Calibrated host cost of one launch (None: not measured).
        compile_ns: Cost of compiling the fused pipeline now (0 once compiled;
            None: not measured).
        fusion_gain_bps: Calibrated gain of fusing on this device, basis points of
            the separate time (`Calibration.fusion_gain_bps`; None: not measured).
        max_storage_buffers: Storage bindings one launch may use (0: the IR's
            ``MAX_BUFFERS``).
        max_workgroup_bytes: Workgroup memory one workgroup may use (0: no limit).
        mode: ``"auto"`` (costs decide), ``"force"`` (fuse whenever legal) or
            ``"disable"``.
        blocked: A reason the caller already knows keeps them separate (one of
            `FUSION_REASONS`), or None.

    Returns:
        The verdict; separate members get one group each.

    Raises:
        TypeError, ValueError: a cost or limit that is not a non-negative int,
            an unknown ``mode`` or ``blocked`` reason.
    """
    if mode not in ("auto", "force", "disable"):
        raise ValueError(f"mode must be 'auto', 'force' or 'disable', not {mode!r}")
    if blocked is not None and blocked not in FUSION_REASONS:
        raise ValueError(f"blocked reason {blocked!r} is not in FUSION_REASONS")
    limit = non_negative_int("max_storage_buffers", max_storage_buffers) or MAX_BUFFERS
    wg_limit = non_negative_int("max_workgroup_bytes", max_workgroup_bytes)
    launch = None if launch_ns is None else non_negative_int("launch_ns", launch_ns)
    compile_cost = None if compile_ns is None else non_negative_int("compile_ns", compile_ns)
    n = len(members)
    if mode == "disable":
        return _separate(n, "disabled")
    if n < 2:
        return _separate(n, "single_member")
    if blocked is not None:
        return _separate(n, blocked)
    if any(m.has_grid_barrier for m in members):
        return _separate(n, "grid_barrier")
    if any(m.workgroup != members[0].workgroup for m in members):
        return _separate(n, "workgroup_mismatch")
    touched: Counter[str] = Counter()  # identity -> members that read or write it
    written: set[str] = set()
    for m in members:
        touched.update(m.reads | m.writes)
        written |= m.writes
    if any(touched[identity] > 1 for identity in written):
        return _separate(n, "conflict")
    groups = _groups(members, limit, wg_limit)
    if len(groups) == n:
        return _separate(n, "limits")
    if mode == "force":
        saved = n - len(groups)
        savings = 0 if launch is None else max(0, saved * launch - (compile_cost or 0))
        return FusionVerdict(
            kind="fuse", reason="requested", groups=tuple(groups), savings_ns=savings
        )
    if launch is None or compile_cost is None or fusion_gain_bps is None:
        return _separate(n, "uncalibrated")
    if isinstance(fusion_gain_bps, bool) or not isinstance(fusion_gain_bps, int):
        raise TypeError(f"fusion_gain_bps must be an int, got {fusion_gain_bps!r}")
    if not -10_000 <= fusion_gain_bps <= 10_000:
        raise ValueError(f"fusion_gain_bps must be in -10000..10000, got {fusion_gain_bps}")
    # The gain was measured with every member in one launch; with g launches it saves
    # that share of the n - 1 launches fusing can remove.
    removed = n - len(groups)
    savings = n * launch * fusion_gain_bps * removed // (10_000 * (n - 1)) - compile_cost
    if savings <= 0:
        return _separate(n, "not_worth_it")
    return FusionVerdict(kind="fuse", reason="cheaper", groups=tuple(groups), savings_ns=savings)
