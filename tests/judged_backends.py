"""Almost-right backends: each is the reference backend wrong in exactly one way.

`tests/test_contract_judged.py` copies this module into a temporary package
outside the repository and runs the shipped contract suite
(``python -m pytest --pyargs vyre_async.testing --vyre-backend=...``) against
every backend here: the suite must pass `Base` and fail each of the others, in
the contract test named in `FAMILY`. Each flaw is one a backend author could
plausibly write; each is built on the reference backend, so nothing else differs.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vyre_async import BackendCapabilities, Launch, PendingDispatch
from vyre_async._pending import settle_hook
from vyre_async.errors import DispatchFailed
from vyre_async.ir import Access
from vyre_reference import ReferenceExecutor

Outputs = list[np.ndarray]


def relaunch(launch: Launch, **changes: Any) -> Launch:
    """``launch`` with some fields replaced (a backend's own completer, pending or inputs)."""
    fields = {
        "pipeline": launch.pipeline,
        "plan": launch.plan,
        "inputs": launch.inputs,
        "config": launch.config,
        "pending": launch.pending,
        "completer": launch.completer,
        "compile_s": launch.compile_s,
        "template": launch.template,
        "resident": launch.resident,
        "shape": launch.shape,
    }
    fields.update(changes)
    return Launch(**fields)


class Relay:
    """A completer that forwards to the real one; `outputs` changes what resolves it."""

    def __init__(self, completer: Any, outputs: Callable[[Outputs], Outputs]) -> None:
        self._completer = completer
        self._outputs = outputs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._completer, name)

    def resolve(self, outputs: Sequence[np.ndarray], **timing: Any) -> bool:
        return bool(self._completer.resolve(self._outputs(list(outputs)), **timing))


class Base(ReferenceExecutor):
    """The reference backend under another id: the suite must pass it."""

    id = "judged-base"

    def retire(self) -> None:
        """Stop whatever this instance still runs (the harness calls it after a failure)."""
        self._stop_all()


class _ChangesOutputs(Base):
    """Resolves every dispatch with `change` (outputs) applied."""

    def change(self, launch: Launch, outputs: Outputs) -> Outputs:
        raise NotImplementedError

    def enqueue(self, launch: Launch) -> PendingDispatch:
        relay = Relay(launch.completer, lambda outputs: self.change(launch, outputs))
        super().enqueue(relaunch(launch, completer=relay))
        return launch.pending


class WrongDtype(_ChangesOutputs):
    """u32 outputs come back as int32: the same bytes, the wrong dtype."""

    id = "judged-wrong-dtype"

    def change(self, launch: Launch, outputs: Outputs) -> Outputs:
        return [o.view(np.int32) if o.dtype == np.uint32 else o for o in outputs]


class WrongLength(_ChangesOutputs):
    """Every output has one element too many (a readback off by one)."""

    id = "judged-wrong-length"

    def change(self, launch: Launch, outputs: Outputs) -> Outputs:
        return [np.append(o, np.zeros(1, o.dtype)) for o in outputs]


class OneLaneOff(_ChangesOutputs):
    """The last element of the first output of two or more has its lowest bit flipped."""

    id = "judged-one-lane-off"

    def change(self, launch: Launch, outputs: Outputs) -> Outputs:
        for output in outputs:
            if output.size >= 2:
                output.view(np.uint32)[-1] ^= 1
                break
        return outputs


class SharedOutputs(_ChangesOutputs):
    """Outputs are views of one readback buffer per launch shape, reused by the next dispatch."""

    id = "judged-shared-outputs"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.staging: dict[int, tuple[object, Outputs]] = {}  # id(template) -> buffers

    def change(self, launch: Launch, outputs: Outputs) -> Outputs:
        template = launch.template
        _, staging = self.staging.get(id(template), (None, []))
        if [s.shape for s in staging] != [o.shape for o in outputs]:
            staging = [np.empty_like(o) for o in outputs]
            self.staging[id(template)] = (template, staging)
        for buffer, output in zip(staging, outputs, strict=True):
            buffer[...] = output
        return list(staging)


class WritesCallersInput(Base):
    """Saves a copy: reads the caller's arrays and writes READ_WRITE results back into them."""

    id = "judged-writes-callers-input"
    copies_inputs = True  # (it copies nothing)

    def enqueue(self, launch: Launch) -> PendingDispatch:
        callers = list(launch.inputs)
        names = [d.name for d in launch.plan.inputs]

        def in_place(outputs: Outputs) -> Outputs:
            for index, decl in enumerate(launch.plan.outputs):
                if decl.access is Access.READ_WRITE:
                    theirs = callers[names.index(decl.name)]
                    if isinstance(theirs, np.ndarray) and theirs.size == outputs[index].size:
                        flat = theirs.reshape(-1)
                        flat[...] = outputs[index]
                        outputs[index] = flat
            return outputs

        flat = tuple(i.reshape(-1) if isinstance(i, np.ndarray) else i for i in callers)
        relay = Relay(launch.completer, in_place)
        super().enqueue(relaunch(launch, completer=relay, inputs=flat))
        return launch.pending


class LateSettle(Base):
    """Settles each dispatch half a second after its work ended (a coarse completion poll)."""

    id = "judged-late-settle"
    delay_s = 0.5

    def enqueue(self, launch: Launch) -> PendingDispatch:
        completer = launch.completer

        class Late(Relay):
            def resolve(self, outputs: Sequence[np.ndarray], **timing: Any) -> bool:
                later(completer.resolve, list(outputs), **timing)
                return True

            def fail(self, error: BaseException, **timing: Any) -> bool:
                later(completer.fail, error, **timing)
                return True

        def later(settle: Callable[..., object], *args: Any, **kwargs: Any) -> None:
            timer = threading.Timer(self.delay_s, settle, args, kwargs)
            timer.daemon = True
            timer.start()

        super().enqueue(relaunch(launch, completer=Late(completer, list)))
        return launch.pending


class RunsInDispatch(Base):
    """Runs every dispatch inside ``dispatch()`` (stopping at its deadline, as the reference's
    inline path does) instead of starting the work and returning."""

    id = "judged-runs-in-dispatch"

    def enqueue(self, launch: Launch) -> PendingDispatch:
        self._check_open()
        if launch.resident:
            return super().enqueue(launch)
        self._run_inline(launch, launch.config.iterations)
        return launch.pending


class CloseLeavesWork(Base):
    """`shutdown` only marks the backend closed: running dispatches run on, never settled."""

    id = "judged-close-leaves-work"

    async def close(self, timeout: float) -> None:
        self._closed = True


class CloseDropsQueued(Base):
    """Closing stops running dispatches but forgets queued ones without settling them."""

    id = "judged-close-drops-queued"

    def _stop_all(self) -> Any:
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
            running = list(self._running)
        if pool is None:
            return None
        for job in pool.close():
            self._forget(job)  # (never settled: its waiters wait forever)
        for job in running:
            job.launch.completer.stop_requested.set()
        return pool


class KeepsFailedDispatches(Base):
    """Forgets a dispatch when it succeeds, but keeps every one that failed or timed out."""

    id = "judged-keeps-failed"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.in_flight_launches: dict[int, Launch] = {}

    def enqueue(self, launch: Launch) -> PendingDispatch:
        kept = self.in_flight_launches
        kept[id(launch)] = launch

        def forget(pending: PendingDispatch) -> None:
            if pending.exception() is None:
                kept.pop(id(launch), None)

        settle_hook(launch.pending, forget)
        return super().enqueue(launch)


class SerialClaimsConcurrency(Base):
    """Claims ``async_compute`` (dispatches run concurrently) but runs one at a time."""

    id = "judged-serial-claims-concurrency"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_workers=1, inline_ns=0, **kwargs)

    def capabilities(self) -> BackendCapabilities:
        return dataclasses.replace(super().capabilities(), async_compute=True)


class WorkgroupYOverstated(Base):
    """Reports the reference's workgroup limits, (1024, 1024, 64), but its kernels map the
    y axis onto a 64-wide one: a workgroup taller than 64 fails at launch."""

    id = "judged-workgroup-overstated"

    def enqueue(self, launch: Launch) -> PendingDispatch:
        if launch.plan.geometry.workgroup[1] > 64:
            launch.completer.fail(
                DispatchFailed(
                    f"too many resources requested for launch: workgroup "
                    f"{launch.plan.geometry.workgroup}",
                    fix="use a workgroup with at most 64 lanes on the y axis",
                )
            )
            return launch.pending
        return super().enqueue(launch)


class UnorderedResident(Base):
    """Claims ``ordered_resident_buffers`` but lets dispatches sharing a buffer run as they
    come."""

    id = "judged-unordered-resident"

    def _order(self, launch: Launch) -> tuple[tuple[threading.Event, ...], threading.Event]:
        return (), threading.Event()


class ResidentWritesLost(Base):
    """Runs READ_WRITE resident buffers on copies and never writes the results back."""

    id = "judged-resident-writes-lost"

    def _write_back(self, launch: Launch, natives: list[np.ndarray], outputs: Outputs) -> None:
        return None


@dataclass(frozen=True)
class Flaw:
    """One member of the family: its backend class and the contract tests that must catch it."""

    cls: type[Base]
    caught_by: tuple[str, ...]

    @property
    def id(self) -> str:
        return self.cls.id


BASE = Base
FAMILY: tuple[Flaw, ...] = (
    Flaw(WrongDtype, ("test_corpus_byte_for_byte",)),
    Flaw(WrongLength, ("test_corpus_byte_for_byte",)),
    Flaw(OneLaneOff, ("test_corpus_byte_for_byte",)),
    Flaw(
        SharedOutputs,
        (
            "test_outputs_belong_to_the_caller",
            "test_a_fused_batch_gives_every_item_its_own_outputs",
        ),
    ),
    Flaw(WritesCallersInput, ("test_corpus_byte_for_byte",)),
    Flaw(LateSettle, ("test_dispatches_settle_as_soon_as_their_work_ends",)),
    Flaw(RunsInDispatch, ("test_dispatch_returns_before_the_work_ends",)),
    # (Three backends that handed back a PendingDispatch of their own — without the
    # config's timeout, running done-callbacks twice, remembering a taken result — were
    # members until the executor seam: the driver hands out the pending now, whatever
    # `enqueue` returns, so an executor cannot write those flaws. tests/driver/
    # test_backend.py checks that the caller gets the driver's pending.)
    Flaw(CloseLeavesWork, ("test_closing_ends_a_dispatch_that_would_run_for_hours",)),
    Flaw(CloseDropsQueued, ("test_closing_ends_a_dispatch_that_would_run_for_hours",)),
    Flaw(KeepsFailedDispatches, ("test_cancelling_waiters_leaves_everything_else_intact",)),
    Flaw(SerialClaimsConcurrency, ("test_claimed_concurrency_is_real",)),
    Flaw(WorkgroupYOverstated, ("test_the_reported_workgroup_limits_are_honoured",)),
    Flaw(
        UnorderedResident,
        (
            # its arm graph's resident layers depend on the order of the layer before
            "test_a_fused_batch_gives_every_item_its_own_outputs",
            "test_dispatches_sharing_a_resident_buffer_take_effect_in_submission_order",
        ),
    ),
    Flaw(
        ResidentWritesLost,
        (
            # its arm graph's resident layers read what the layer before wrote
            "test_a_fused_batch_gives_every_item_its_own_outputs",
            "test_dispatches_sharing_a_resident_buffer_take_effect_in_submission_order",
        ),
    ),
)
