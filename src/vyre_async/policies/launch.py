"""Launch policies for repeated work: persistent kernel, command reuse, the primary mode.

All costs are integer nanoseconds measured by calibration. Comparisons are
exact and the tie-breaks are fixed: a break-even stays on plain launches, and
when both alternatives save the same, command reuse wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vyre_async._exports import public_dir as _public_dir
from vyre_async.policies._checks import non_negative_int

__all__ = [
    "CommandReuseVerdict",
    "ExecutionModeVerdict",
    "PersistentVerdict",
    "decide_command_reuse",
    "decide_persistent_kernel",
    "select_primary_execution_mode",
]
__dir__ = _public_dir(__name__)

PersistentKind = Literal["standard", "persistent"]
ReuseKind = Literal["plain", "record_and_replay"]
ModeKind = Literal["plain", "persistent", "command_reuse"]


def _check_kind(record: str, kind: str, allowed: tuple[str, ...], savings_ns: int) -> None:
    if kind not in allowed:
        raise ValueError(f"{record}.kind must be one of {allowed}, not {kind!r}")
    non_negative_int(f"{record}.savings_ns", savings_ns)
    if kind == allowed[0] and savings_ns != 0:
        raise ValueError(f"{record}: savings_ns must be 0 when kind is {allowed[0]!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class PersistentVerdict:
    """Standard launches or one persistent kernel for a batch.

    Attributes:
        kind: ``"standard"`` or ``"persistent"``.
        reason: Why launches stay standard — ``"single_launch"`` (batch ≤ 1),
            ``"no_launch_overhead"`` (L = 0), ``"setup_not_amortized"`` (B·L ≤ S,
            a tie included), or a caller's reason such as
            ``"unsupported_by_backend"`` / ``"disabled"``; ``None`` when persistent.
        savings_ns: ``B·L - S`` when persistent, else 0.
    """

    kind: PersistentKind
    reason: str | None = None
    savings_ns: int = 0

    def __post_init__(self) -> None:
        _check_kind("PersistentVerdict", self.kind, ("standard", "persistent"), self.savings_ns)

    @property
    def profitable(self) -> bool:
        """True when a persistent kernel saves time."""
        return self.kind == "persistent"


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandReuseVerdict:
    """Plain launches or record once and replay (CUDA graphs) for a repeated shape.

    Attributes:
        kind: ``"plain"`` or ``"record_and_replay"``.
        reason: Why launches stay plain — ``"single_launch"`` (R ≤ 1),
            ``"replay_not_cheaper"`` (L ≤ Rep), ``"record_not_amortized"``
            (R·(L - Rep) ≤ Rec, a tie included), or a caller's reason such as
            ``"unsupported_by_backend"``; ``None`` when replaying.
        savings_ns: ``R·(L - Rep) - Rec`` when replaying, else 0.
    """

    kind: ReuseKind
    reason: str | None = None
    savings_ns: int = 0

    def __post_init__(self) -> None:
        _check_kind(
            "CommandReuseVerdict", self.kind, ("plain", "record_and_replay"), self.savings_ns
        )

    @property
    def profitable(self) -> bool:
        """True when record-and-replay saves time."""
        return self.kind == "record_and_replay"


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionModeVerdict:
    """The one execution mode chosen for repeated work.

    Attributes:
        kind: ``"plain"``, ``"persistent"`` or ``"command_reuse"``.
        reason: ``"neither_profitable"`` for plain launches (or a caller's reason
            such as ``"unsupported_by_backend"`` / ``"uncalibrated"``);
            ``"persistent_saves_more"``, ``"command_reuse_saves_more"`` or
            ``"tie_prefers_command_reuse"`` when both were profitable; ``None``
            when only the chosen mode was; ``"forced"`` when the config forced
            persistent threads.
        savings_ns: The chosen mode's savings (0 for plain launches).
    """

    kind: ModeKind
    reason: str | None = None
    savings_ns: int = 0

    def __post_init__(self) -> None:
        _check_kind(
            "ExecutionModeVerdict",
            self.kind,
            ("plain", "persistent", "command_reuse"),
            self.savings_ns,
        )


def decide_persistent_kernel(batch_size: int, launch_ns: int, setup_ns: int) -> PersistentVerdict:
    """Return whether ``batch_size`` launches should become one persistent kernel.

    Standard launches cost ``B·L + B·K``, a persistent kernel ``S + B·K``; the
    per-item kernel time ``K`` cancels. Rule: ``B ≤ 1`` → standard; ``L == 0`` →
    standard; ``B·L ≤ S`` → standard (a tie stays standard); else persistent with
    ``savings = B·L - S``. Example: L = 5 µs, S = 50 µs → B = 10 stays standard,
    B = 100 saves 450 µs.

    Args:
        batch_size: Launches in the batch (B).
        launch_ns: Per-launch overhead (L), from calibration.
        setup_ns: Persistent-kernel setup cost (S), from calibration.

    Returns:
        The verdict.

    Raises:
        TypeError: an argument is not an integer.
        ValueError: an argument is negative.
    """
    b = non_negative_int("batch_size", batch_size)
    lat = non_negative_int("launch_ns", launch_ns)
    setup = non_negative_int("setup_ns", setup_ns)
    if b <= 1:
        return PersistentVerdict(kind="standard", reason="single_launch")
    if lat == 0:
        return PersistentVerdict(kind="standard", reason="no_launch_overhead")
    total = b * lat
    if total <= setup:
        return PersistentVerdict(kind="standard", reason="setup_not_amortized")
    return PersistentVerdict(kind="persistent", savings_ns=total - setup)


def decide_command_reuse(
    repeats: int, launch_ns: int, record_ns: int, replay_ns: int
) -> CommandReuseVerdict:
    """Return whether a shape repeated ``repeats`` times should be recorded once and replayed.

    Rule: ``R ≤ 1`` → plain; ``L ≤ Rep`` → plain; ``R·(L - Rep) ≤ Rec`` → plain
    (a tie stays plain); else record-and-replay with ``savings = R·(L - Rep) - Rec``.
    "Same shape" means same program, same bindings, same geometry.

    Args:
        repeats: Times the same shape runs (R).
        launch_ns: Per-launch overhead (L).
        record_ns: Cost of recording (capture and instantiate) once (Rec).
        replay_ns: Cost of one replay (Rep).

    Returns:
        The verdict.

    Raises:
        TypeError: an argument is not an integer.
        ValueError: an argument is negative.
    """
    r = non_negative_int("repeats", repeats)
    lat = non_negative_int("launch_ns", launch_ns)
    rec = non_negative_int("record_ns", record_ns)
    rep = non_negative_int("replay_ns", replay_ns)
    if r <= 1:
        return CommandReuseVerdict(kind="plain", reason="single_launch")
    if lat <= rep:
        return CommandReuseVerdict(kind="plain", reason="replay_not_cheaper")
    total = r * (lat - rep)
    if total <= rec:
        return CommandReuseVerdict(kind="plain", reason="record_not_amortized")
    return CommandReuseVerdict(kind="record_and_replay", savings_ns=total - rec)


def select_primary_execution_mode(
    persistent: PersistentVerdict, reuse: CommandReuseVerdict
) -> ExecutionModeVerdict:
    """Collapse the persistent-kernel and command-reuse verdicts into one mode.

    Both profitable: persistent wins only with strictly larger savings (a tie
    goes to command reuse, which holds no SMs). One profitable: that one.
    Neither: plain launches. Example: B = R = 500, L = 5 µs, S = 50 µs,
    Rec = 25 µs, Rep = 0.5 µs → persistent (2.45 ms against 2.225 ms).

    Args:
        persistent: The `decide_persistent_kernel` verdict.
        reuse: The `decide_command_reuse` verdict.

    Returns:
        The mode, with the chosen savings.

    Raises:
        TypeError: an argument has the wrong verdict type.
    """
    if not isinstance(persistent, PersistentVerdict):
        raise TypeError(
            f"persistent must be a PersistentVerdict, got {type(persistent).__name__}\n"
            "Fix: pass decide_persistent_kernel(...)"
        )
    if not isinstance(reuse, CommandReuseVerdict):
        raise TypeError(
            f"reuse must be a CommandReuseVerdict, got {type(reuse).__name__}\n"
            "Fix: pass decide_command_reuse(...)"
        )
    if persistent.profitable and reuse.profitable:
        if persistent.savings_ns > reuse.savings_ns:
            return ExecutionModeVerdict(
                kind="persistent", reason="persistent_saves_more", savings_ns=persistent.savings_ns
            )
        reason = (
            "tie_prefers_command_reuse"
            if persistent.savings_ns == reuse.savings_ns
            else "command_reuse_saves_more"
        )
        return ExecutionModeVerdict(
            kind="command_reuse", reason=reason, savings_ns=reuse.savings_ns
        )
    if persistent.profitable:
        return ExecutionModeVerdict(kind="persistent", savings_ns=persistent.savings_ns)
    if reuse.profitable:
        return ExecutionModeVerdict(kind="command_reuse", savings_ns=reuse.savings_ns)
    return ExecutionModeVerdict(kind="plain", reason="neither_profitable")
