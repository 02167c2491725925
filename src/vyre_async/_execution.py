"""The primary execution mode of repeated work, from capabilities, config and calibration.

`choose_execution_mode` applies the pure launch policies
(`vyre_async.policies.launch`) to one backend: a path the backend does not
have natively (capability False), a config that disables it, or a missing
calibration keeps it off, with a reason; otherwise the calibrated costs
decide. The decision's `span_attributes` are recorded on every dispatch of the
batch or graph submission it governs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from vyre_async._calibration import Calibration, calibration_for
from vyre_async._config import DispatchConfig
from vyre_async._exports import public_dir as _public_dir
from vyre_async.errors import InvalidArgument, UnsupportedFeature
from vyre_async.policies._checks import non_negative_int
from vyre_async.policies.launch import (
    CommandReuseVerdict,
    ExecutionModeVerdict,
    ModeKind,
    PersistentVerdict,
    decide_command_reuse,
    decide_persistent_kernel,
    select_primary_execution_mode,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vyre_async._pending import DispatchCompleter
    from vyre_async._seams import BackendLike

__all__ = [
    "UNSUPPORTED",
    "ExecutionDecision",
    "annotate_mode",
    "choose_execution_mode",
    "requested_mode",
]
__dir__ = _public_dir(__name__)

#: Reason used when the backend has no native path for a mode.
UNSUPPORTED = "unsupported_by_backend"
_DEFAULT = DispatchConfig()


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionDecision:
    """The execution mode chosen for repeated work, with both underlying verdicts.

    Attributes:
        mode: The primary mode (``plain``, ``persistent`` or ``command_reuse``).
        persistent: The persistent-kernel verdict.
        reuse: The command-reuse (graph replay) verdict.
        batch_size: Launches in the batch (B).
        repeats: Times the same shape repeats (R).
        calibrated: Whether calibrated costs were available.
    """

    mode: ExecutionModeVerdict
    persistent: PersistentVerdict
    reuse: CommandReuseVerdict
    batch_size: int
    repeats: int
    calibrated: bool

    def span_attributes(self) -> dict[str, str | int | bool]:
        """Return the ``vyre.policy.*`` attributes recorded on every governed dispatch."""
        attributes: dict[str, str | int | bool] = {
            "vyre.policy.execution_mode": self.mode.kind,
            "vyre.policy.execution_mode.savings_ns": self.mode.savings_ns,
            "vyre.policy.persistent": self.persistent.kind,
            "vyre.policy.command_reuse": self.reuse.kind,
        }
        for key, reason in (
            ("vyre.policy.execution_mode.reason", self.mode.reason),
            ("vyre.policy.persistent.reason", self.persistent.reason),
            ("vyre.policy.command_reuse.reason", self.reuse.reason),
        ):
            if reason is not None:
                attributes[key] = reason
        return attributes


def choose_execution_mode(
    backend: BackendLike,
    *,
    batch_size: int,
    repeats: int,
    config: DispatchConfig | None = None,
    calibration: Calibration | None = None,
) -> ExecutionDecision:
    """Decide how ``backend`` should run repeated work: plain, persistent or replayed.

    Persistent kernels need ``capabilities().persistent_threads`` and
    ``config.persistent_thread != "disable"`` (``"force"`` chooses them whatever
    the costs); command reuse needs ``capabilities().graph_replay``. Either also
    needs the calibrated costs (``launch_ns`` plus ``persistent_setup_ns`` or
    ``record_ns``/``replay_ns``). The per-launch overhead a persistent kernel
    saves is ``launch_ns - persistent_item_ns`` (what each item still costs it).
    Without a path the verdict is plain with reason
    ``"unsupported_by_backend"`` (or ``"disabled"`` / ``"uncalibrated"``).

    Args:
        backend: The backend that runs the work.
        batch_size: Launches in the batch (B).
        repeats: Times the same shape repeats (R).
        config: The dispatch config (``persistent_thread`` is honoured).
        calibration: Costs to use; by default the backend's cached calibration
            (`calibration_for`, never measured here).

    Returns:
        The decision.

    Raises:
        TypeError: ``batch_size`` or ``repeats`` is not an integer.
        ValueError: ``batch_size`` or ``repeats`` is negative.
    """
    b = non_negative_int("batch_size", batch_size)
    r = non_negative_int("repeats", repeats)
    cfg = config or _DEFAULT
    caps = backend.capabilities()
    can_persist = caps.persistent_threads and cfg.persistent_thread != "disable"
    cal = calibration
    if cal is None and (can_persist or caps.graph_replay):
        cal = calibration_for(backend)
    if not can_persist:
        reason = "disabled" if caps.persistent_threads else UNSUPPORTED
        persistent = PersistentVerdict(kind="standard", reason=reason)
    elif cal is None or cal.persistent_setup_ns is None:
        persistent = PersistentVerdict(kind="standard", reason="uncalibrated")
    else:
        saved = max(cal.launch_ns - (cal.persistent_item_ns or 0), 0)  # per launch
        persistent = decide_persistent_kernel(b, saved, cal.persistent_setup_ns)
    if not caps.graph_replay:
        reuse = CommandReuseVerdict(kind="plain", reason=UNSUPPORTED)
    elif cal is None or cal.record_ns is None or cal.replay_ns is None:
        reuse = CommandReuseVerdict(kind="plain", reason="uncalibrated")
    else:
        reuse = decide_command_reuse(r, cal.launch_ns, cal.record_ns, cal.replay_ns)
    if can_persist and cfg.persistent_thread == "force":
        mode = ExecutionModeVerdict(
            kind="persistent", reason="forced", savings_ns=persistent.savings_ns
        )
    else:
        mode = select_primary_execution_mode(persistent, reuse)
        if mode.kind == "plain" and persistent.reason == reuse.reason:
            # Both off for the same cause (typically: the backend has neither path).
            mode = ExecutionModeVerdict(kind="plain", reason=persistent.reason)
    return ExecutionDecision(
        mode=mode,
        persistent=persistent,
        reuse=reuse,
        batch_size=b,
        repeats=r,
        calibrated=cal is not None,
    )


class LaunchLike(Protocol):
    """A launch as `annotate_mode` reads it: its completer (`vyre_async.abc.Launch`)."""

    @property
    def completer(self) -> DispatchCompleter: ...


def annotate_mode(
    launches: Sequence[LaunchLike],
    decision: ExecutionDecision,
    applied: str,
    reason: str | None = None,
) -> None:
    """Record on every launch's span the execution mode that actually ran.

    Sets ``vyre.batch.mode`` (``plain``, ``persistent`` or ``command_reuse``) and
    ``vyre.batch.size``; when ``applied`` is not the verdict's mode, also
    ``vyre.batch.mode.reason`` (``reason``, or ``"backend_runs_plain_launches"``
    for a backend that has no batch path of its own). Call it before starting
    the launches: a span may end as soon as its launch does.
    """
    if applied != decision.mode.kind and reason is None:
        reason = "backend_runs_plain_launches"
    for launch in launches:
        launch.completer.annotate("vyre.batch.mode", applied)
        launch.completer.annotate("vyre.batch.size", len(launches))
        if reason is not None and applied != decision.mode.kind:
            launch.completer.annotate("vyre.batch.mode.reason", reason)


_MODES = ("plain", "persistent", "command_reuse")


def requested_mode(
    backend: BackendLike, decision: ExecutionDecision, mode: ModeKind, config: DispatchConfig
) -> ExecutionDecision:
    """Return ``decision`` with its mode replaced by the caller's ``mode`` (reason ``requested``).

    Raises:
        InvalidArgument: ``mode`` is not ``plain``, ``persistent`` or ``command_reuse``
            (also a ``ValueError``).
        UnsupportedFeature: the backend has no such path, or the config disables it.
    """
    if mode not in _MODES:
        raise InvalidArgument(
            f"mode must be one of {_MODES}, not {mode!r}",
            fix='pass mode="plain", "persistent" or "command_reuse" (or None for the policy)',
        )
    caps = backend.capabilities()
    if mode == "persistent" and (
        not caps.persistent_threads or config.persistent_thread == "disable"
    ):
        why = (
            "the config disables persistent threads"
            if caps.persistent_threads
            else f"backend {backend.id!r} has no persistent kernels"
        )
        raise UnsupportedFeature(
            f"cannot run the batch as a persistent kernel: {why}",
            fix='pass mode=None (the policy decides) or DispatchConfig(persistent_thread="auto")',
            feature="persistent_threads",
        )
    if mode == "command_reuse" and not caps.graph_replay:
        raise UnsupportedFeature(
            f"cannot replay the batch: backend {backend.id!r} has no graph replay",
            fix="pass mode=None (the policy decides) or use a backend with graph_replay",
            feature="graph_replay",
        )
    return replace(decision, mode=ExecutionModeVerdict(kind=mode, reason="requested"))
