"""One arm graph run: resources placed, arms dispatched in order, layers joined, outputs read."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

import anyio
import numpy as np

from vyre_async._execution import ExecutionDecision
from vyre_async._exports import public_dir as _public_dir
from vyre_async._frontend import DEFAULT_CONFIG
from vyre_async._fusion import FusionRequest, group_verdict
from vyre_async._graph.model import Residency
from vyre_async._graph.report import ArmRun
from vyre_async._graph.schedule import _Schedule, _settled_at, _Step
from vyre_async._pending import PendingDispatch
from vyre_async._resident import ResidentBuffer
from vyre_async.errors import (
    BackendError,
    UnsupportedFeature,
)
from vyre_async.ir.program import Program
from vyre_async.ir.types import DType
from vyre_async.policies.concurrency import ArmConcurrencyVerdict
from vyre_async.policies.pipeline_fusion import FusionVerdict
from vyre_async.policies.residency import ResidencyVerdict, decide_residency
from vyre_async.telemetry import DispatchAttribute, dispatch_attributes

if TYPE_CHECKING:
    from vyre_async._backend import VyreBackend

__all__ = []
__dir__ = _public_dir(__name__)


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
        fusion: FusionRequest,
    ) -> None:
        self.schedule = schedule
        self.fusion = fusion
        layers = len(schedule.plan.layers)
        self.fusion_verdicts: list[FusionVerdict | None] = [None] * layers
        # Per layer: the error type when a fused group could not be built (its arms ran alone).
        self.fusion_fallbacks: list[str | None] = [None] * layers
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
        self.layer_attributes: list[dict[str, DispatchAttribute]] = [
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
            fused = self._launch_fused(number, layer, attributes)
            if fused is not None:  # submitted together, each group as one launch
                launched.extend(zip(layer, fused, strict=True))
                continue
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
            fused = self._launch_fused(number, layer, attributes)
            launches: list[tuple[tuple[int, ...], list[PendingDispatch] | None]]
            if fused is not None:  # submitted together, each group as one launch
                launches = [(layer, fused)]
            else:
                groups = [layer] if self.concurrency[number].concurrent else [(i,) for i in layer]
                launches = [(group, None) for group in groups]
            for group, given in launches:
                pendings = given or [self._launch(self.steps[i], attributes) for i in group]
                results = await self._await_layer(group, pendings)
                for i, pending, outputs in zip(group, pendings, results, strict=True):
                    self._store(self.steps[i], outputs)
                    runs[i] = self._arm_run(self.steps[i], pending)
            walls.append(time.perf_counter() - started)
        self.arm_runs = [runs[i] for i in range(len(self.steps))]
        return walls

    def _launch_fused(
        self, number: int, layer: tuple[int, ...], attributes: dict[str, DispatchAttribute]
    ) -> list[PendingDispatch] | None:
        """Dispatch a layer's arms as the fusion policy groups them; None to run them as usual.

        A layer of more than one arm asks `vyre_async._fusion.group_verdict`
        (its arms touch disjoint resources by construction; the policy checks it
        again from what each reads and writes). A separate verdict launches
        nothing and adds its attributes to the layer's (every arm's span says
        why); a fused one submits every arm of the layer at once, each group of
        the verdict as one launch.
        """
        if len(layer) < 2:
            return None
        device = self.host_join_reason is None  # resident programs on resident buffers
        steps = [self.steps[i] for i in layer]
        programs = [step.resident_program if device else step.arm.program for step in steps]
        configs = [step.arm.config or DEFAULT_CONFIG for step in steps]
        reads = [frozenset(step.inputs) for step in steps]
        writes = [frozenset(step.outputs) for step in steps]
        verdict = group_verdict(self.backend.front, programs, configs, reads, writes, self.fusion)
        self.fusion_verdicts[number] = verdict
        attributes.update(verdict.span_attributes())
        if verdict.kind != "fuse":
            return None
        items = []
        for step, program, config in zip(steps, programs, configs, strict=True):
            inputs = self._resident_inputs(step) if device else self._host_inputs(step)
            items.append((program, inputs, config, {**step.attributes, **attributes}))
        pendings, fallbacks = self.backend.front.dispatch_group(items, verdict)
        self.in_flight.extend(pendings)
        if fallbacks:
            self.fusion_fallbacks[number] = fallbacks[0]
        return pendings

    def fused(self, layer: int) -> bool:
        """True when ``layer``'s arms were submitted together as fused launches."""
        verdict = self.fusion_verdicts[layer]
        return verdict is not None and verdict.kind == "fuse"

    def _launch_resident(
        self, step: _Step, attributes: Mapping[str, DispatchAttribute]
    ) -> PendingDispatch:
        """Dispatch an arm with every buffer resident: WRITE buffers get fresh zeroed ones."""
        return self._dispatch(step, attributes, step.resident_program, self._resident_inputs(step))

    def _resident_inputs(self, step: _Step) -> list[np.ndarray | ResidentBuffer]:
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
        return inputs

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

    def _launch(self, step: _Step, attributes: Mapping[str, DispatchAttribute]) -> PendingDispatch:
        return self._dispatch(step, attributes, step.arm.program, self._host_inputs(step))

    def _host_inputs(self, step: _Step) -> list[np.ndarray | ResidentBuffer]:
        return [self._input(resource) for resource in step.inputs]

    def _dispatch(
        self,
        step: _Step,
        attributes: Mapping[str, DispatchAttribute],
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
            concurrent_with=step.layer_mates
            if self.concurrency[step.layer].concurrent or self.fused(step.layer)
            else (),
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


def _settled_placement(
    verdict: ResidencyVerdict, runner: _Run, gain: int | None, requested: Residency, work_ns: int
) -> ResidencyVerdict:
    """``verdict``, or the host verdict when the run found the backend without resident buffers."""
    if verdict.resident and not runner.resident:
        return decide_residency(gain, requested=requested, resident_buffers=False, work_ns=work_ns)
    return verdict
