"""Shadow conformance: assert_conformance and the sampling ShadowBackend."""

from __future__ import annotations

import pickle
import threading
import time

import anyio
import numpy as np
import pytest

from tests.helpers import backend_of
from vyre_async import (
    ConformanceCase,
    DispatchConfig,
    DispatchFailed,
    Divergence,
    InvalidProgram,
    Launch,
    PendingDispatch,
    ShadowBackend,
    assert_conformance,
)
from vyre_async._shadow import compare_outputs
from vyre_async.ir import Access, BufferDecl, DType, Let, Load, Program, Store, Un, Var, gid
from vyre_async.programs import elementwise_xor, saxpy
from vyre_reference import ReferenceExecutor, reference_backend

U = np.uint32


class _OffByOne(ReferenceExecutor):
    """The reference, except that element 3 of every output is flipped in its lowest bit."""

    id = "off-by-one"

    def enqueue(self, launch: Launch) -> PendingDispatch:
        real = self._inner.dispatch(launch.plan.program, launch.inputs, launch.config)
        outputs = [o.copy() for o in real.result()]
        for o in outputs:
            if o.size > 3:
                o.view(np.uint32)[3] ^= 1
        launch.completer.resolve(outputs)
        return launch.pending

    def __init__(self) -> None:
        super().__init__()
        self._inner = reference_backend(prefetch=False)


def _xor_case(label: str = "xor") -> ConformanceCase:
    return ConformanceCase(
        label=label, program=elementwise_xor(16), inputs=[np.arange(16, dtype=U), np.ones(16, U)]
    )


def test_identical_backends_conform() -> None:
    reference = reference_backend(prefetch=False)
    assert_conformance(reference_backend(prefetch=False), reference, [_xor_case(), _xor_case("b")])


def test_first_difference_raises_a_divergence_with_context() -> None:
    case = _xor_case()
    with pytest.raises(Divergence) as info:
        assert_conformance(
            backend_of(_OffByOne, prefetch=False), reference_backend(prefetch=False), [case]
        )
    d = info.value
    assert (d.label, d.output_index, d.element) == ("xor", 0, 3)
    assert d.fingerprint == case.program.fingerprint().hex()
    assert int(d.backend_output[3]) ^ int(d.reference_output[3]) == 1
    assert d.inputs is case.inputs
    clone = pickle.loads(pickle.dumps(d))
    assert (clone.label, clone.element, str(clone)) == (d.label, d.element, str(d))


def test_an_empty_case_list_is_an_error() -> None:
    reference = reference_backend(prefetch=False)
    with pytest.raises(InvalidProgram, match="Fix:"):
        assert_conformance(reference, reference, [])


def _exp_program() -> Program:
    i = Var("i")
    return Program(
        [
            BufferDecl("x", 0, Access.READ, DType.F32),
            BufferDecl("y", 1, Access.WRITE, DType.F32, 4),
        ],
        4,
        [Let("i", gid()), Store("y", i, Un("exp", Load("x", i)))],
    )


def test_transcendental_outputs_are_compared_within_the_ulp_budget() -> None:
    program = _exp_program()
    want = [np.array([1.0, 2.0, np.nan, 4.0], np.float32)]
    near = [want[0].copy()]
    near[0].view(np.uint32)[0] += 2  # 2 ULP off
    assert compare_outputs("exp", program, [], near, want) is None  # default budget 2
    assert compare_outputs("exp", program, [], near, want, ulp_budget=1) is not None
    nan_moved = [np.array([1.0, 2.0, 3.0, 4.0], np.float32)]
    assert compare_outputs("exp", program, [], nan_moved, want) is not None
    exact = saxpy(4)  # no transcendental op: bit-exact
    one_ulp = [want[0].copy()]
    one_ulp[0].view(np.uint32)[1] += 1
    assert compare_outputs("saxpy", exact, [], one_ulp, want) is not None


def test_size_and_count_mismatches_diverge() -> None:
    program = elementwise_xor(4)
    want = [np.zeros(4, U)]
    assert "elements" in str(compare_outputs("x", program, [], [np.zeros(3, U)], want))
    assert "count differs" in str(compare_outputs("x", program, [], [], want))


def test_shadow_serves_the_primary_and_records_divergences() -> None:
    seen: list[Divergence] = []
    shadow = ShadowBackend(
        backend_of(_OffByOne, prefetch=False),
        reference_backend(prefetch=False),
        sample_rate=1.0,
        on_divergence=seen.append,
    )
    case = _xor_case()
    outputs = shadow.dispatch_sync(case.program, case.inputs, DispatchConfig(label="req"))
    expected = np.arange(16, dtype=U) ^ 1
    expected[3] ^= 1
    assert outputs[0].tolist() == expected.tolist()  # the primary's answer, never failed
    anyio.run(shadow.flush)  # (the comparison, on_divergence included, has run)
    assert (
        shadow.executor.stats.dispatches,
        shadow.executor.stats.sampled,
        shadow.executor.stats.compared,
    ) == (1, 1, 1)
    assert shadow.executor.stats.divergences == 1 and len(seen) == 1
    assert seen[0].label == "req" and shadow.executor.stats.recent[0] is seen[0]


def test_shadow_at_rate_zero_passes_straight_through() -> None:
    shadow = ShadowBackend(
        backend_of(_OffByOne, prefetch=False), reference_backend(prefetch=False), sample_rate=0.0
    )
    case = _xor_case()
    shadow.dispatch_sync(case.program, case.inputs)
    assert (
        shadow.executor.stats.dispatches,
        shadow.executor.stats.sampled,
        shadow.executor.stats.compared,
    ) == (1, 0, 0)
    with pytest.raises(ValueError, match="sample_rate"):
        ShadowBackend(
            backend_of(_OffByOne, prefetch=False),
            reference_backend(prefetch=False),
            sample_rate=1.5,
        )


def test_a_failing_reference_never_fails_the_request() -> None:
    class Broken(ReferenceExecutor):
        id = "broken-ref"

        def enqueue(self, launch: Launch) -> PendingDispatch:
            raise RuntimeError("reference down")

    shadow = ShadowBackend(
        reference_backend(prefetch=False), backend_of(Broken, prefetch=False), sample_rate=1.0
    )
    case = _xor_case()
    assert shadow.dispatch_sync(case.program, case.inputs)[0].size == 16
    assert shadow.executor.stats.reference_errors == 1


def test_shadow_backend_does_not_promise_resident_ordering() -> None:
    """It has no resident buffers, so arm graphs must not join on the device through it."""
    primary = reference_backend(prefetch=False)
    assert primary.capabilities().ordered_resident_buffers
    shadow = ShadowBackend(primary, reference_backend(prefetch=False), sample_rate=0.0)
    caps = shadow.capabilities()
    assert not caps.ordered_resident_buffers
    assert caps.max_workgroup_lanes == primary.capabilities().max_workgroup_lanes


def test_flush_waits_for_every_sampled_comparison() -> None:
    # The caller gets the primary's answer at once; the comparison (and a slow
    # on_divergence within it) comes later, and flush() waits for all of it.
    seen: list[Divergence] = []

    def slow(divergence: Divergence) -> None:
        time.sleep(0.2)
        seen.append(divergence)

    shadow = ShadowBackend(
        backend_of(_OffByOne, prefetch=False),
        reference_backend(prefetch=False),
        sample_rate=1.0,
        on_divergence=slow,
    )
    case = _xor_case()
    for _ in range(3):
        shadow.dispatch_sync(case.program, case.inputs)
    anyio.run(shadow.flush)
    assert (
        shadow.executor.stats.sampled,
        shadow.executor.stats.compared,
        shadow.executor.stats.divergences,
    ) == (3, 3, 3)
    assert len(seen) == 3


def test_flush_does_not_wait_for_a_comparison_a_failed_primary_cannot_make() -> None:
    class Failing(ReferenceExecutor):
        id = "failing"

        def enqueue(self, launch: Launch) -> PendingDispatch:
            launch.completer.fail(RuntimeError("the device fell over"))
            return launch.pending

    shadow = ShadowBackend(
        backend_of(Failing, prefetch=False), reference_backend(prefetch=False), sample_rate=1.0
    )
    case = _xor_case()
    with pytest.raises(DispatchFailed, match="fell over"):
        shadow.dispatch_sync(case.program, case.inputs)

    async def flush_in_time() -> None:
        with anyio.fail_after(5):
            await shadow.flush()

    anyio.run(flush_in_time)
    assert (shadow.executor.stats.sampled, shadow.executor.stats.compared) == (1, 0)


def test_flush_waits_for_the_dispatches_before_it_not_for_those_made_meanwhile() -> None:
    # A comparison made after flush() began may take as long as it likes (here, one
    # whose on_divergence is held): flush() must not wait for it, or a steady stream
    # of sampled dispatches would keep it waiting for ever.
    holds = {"before": threading.Event(), "later": threading.Event()}

    def on_divergence(divergence: Divergence) -> None:
        holds[divergence.label].wait(20)

    shadow = ShadowBackend(
        backend_of(_OffByOne, prefetch=False),
        reference_backend(prefetch=False),
        sample_rate=1.0,
        on_divergence=on_divergence,
    )
    case = _xor_case()

    async def main() -> None:
        flushed = anyio.Event()

        async def flush() -> None:
            await shadow.flush()
            flushed.set()

        try:
            await shadow.dispatch(case.program, case.inputs, DispatchConfig(label="before"))
            async with anyio.create_task_group() as tg:
                tg.start_soon(flush)
                await anyio.sleep(0.05)  # flush waits for "before", whose comparison is held
                assert not flushed.is_set()
                await shadow.dispatch(case.program, case.inputs, DispatchConfig(label="later"))
                holds["before"].set()  # "later" is compared next, and held
                with anyio.fail_after(5):
                    await flushed.wait()
                assert not holds["later"].is_set()  # returned while "later" is still held
        finally:
            for hold in holds.values():
                hold.set()

    anyio.run(main)
