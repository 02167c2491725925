"""What an arm graph run returns: the outputs and the `GraphReport` of how it ran."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from vyre_async._execution import ExecutionDecision
from vyre_async._exports import public_dir as _public_dir
from vyre_async.policies.arms import ArmConflict
from vyre_async.policies.concurrency import ArmConcurrencyVerdict
from vyre_async.policies.pipeline_fusion import FusionVerdict
from vyre_async.policies.residency import ResidencyVerdict

if TYPE_CHECKING:
    pass

__all__ = ["ArmRun", "GraphReport", "GraphResult"]
__dir__ = _public_dir(__name__)


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
        fusion: Per layer, the `FusionVerdict` for its arms (None for a layer of
            one arm): ``fuse`` when they were submitted together as fused launches
            (``groups``: the positions in the layer of each launch's arms), else
            ``separate`` and why.
        fusion_fallback: Per layer, None, or the error type when a fused group's
            program could not be built and its arms ran as their own launches
            (their spans say so in ``vyre.policy.fusion.fallback``).
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
    fusion: tuple[FusionVerdict | None, ...] = ()
    fusion_fallback: tuple[str | None, ...] = ()

    @property
    def layers_in_order(self) -> int:
        """Layers of several arms that ran in order (``vyre.graph.layers_in_order``)."""
        return layers_in_order(self.layers, self.concurrency, self.fusion)

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
                fused = self.fusion[number] if number < len(self.fusion) else None
                fallback = (
                    self.fusion_fallback[number] if number < len(self.fusion_fallback) else None
                )
                if fused is not None and fused.kind == "fuse":
                    if fallback is None:
                        how += f", fused into {fused.launches} launch" + (
                            "es" if fused.launches > 1 else ""
                        )
                        how += f" ({fused.reason})"
                    else:
                        how += f", fusion fell back to separate launches ({fallback})"
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


def layers_in_order(
    layers: Sequence[Sequence[int]],
    concurrency: Sequence[ArmConcurrencyVerdict],
    fusion: Sequence[FusionVerdict | None] = (),
) -> int:
    """Count the layers of several arms that ran in order: the arm-concurrency verdict
    said so and they were not fused (a fused layer's arms are submitted together)."""
    return sum(
        1
        for number, verdict in enumerate(concurrency)
        if len(layers[number]) > 1
        and not verdict.concurrent
        and not (number < len(fusion) and (f := fusion[number]) is not None and f.kind == "fuse")
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphResult:
    """The outputs and report of one graph submission.

    Attributes:
        outputs: The requested resources' final contents (new arrays).
        report: How the run went.
    """

    outputs: dict[str, np.ndarray]
    report: GraphReport
