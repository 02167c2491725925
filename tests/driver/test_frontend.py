"""The dispatch front end: launch templates, the inputs a backend receives, the store's memo.

Backends here are written against the seam only (`BytesBackend` answers every
dispatch inline and records its `Launch`; the reference backend is used where
resident buffers are needed). Private members (``front._by_id``) are read to
check the memo stays bounded.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from tests.driver.fakes import BytesBackend
from tests.helpers import backend_of
from vyre_async import (
    BackendClosed,
    DispatchConfig,
    InvalidProgram,
    Launch,
    PendingDispatch,
)
from vyre_async._frontend import TEMPLATE_CAPACITY, LaunchTemplate
from vyre_async._plan import plan_dispatch
from vyre_async._resident import ResidentBuffer
from vyre_async.programs import elementwise_xor
from vyre_reference import ReferenceExecutor


def xor_inputs(n: int) -> list[np.ndarray]:
    return [np.arange(n, dtype=np.uint32), np.full(n, 5, dtype=np.uint32)]


def close(backend: Any) -> None:
    anyio.run(backend.aclose)


@pytest.fixture
def backend() -> Iterator[BytesBackend]:
    backend = backend_of(BytesBackend, prefetch=False)
    yield backend
    close(backend)


class CopyingBackend(BytesBackend):
    """Copies every host input into its own memory inside ``enqueue`` (``copies_inputs``)."""

    id = "copying-test"
    copies_inputs = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.received: list[tuple[Any, ...]] = []
        self.copied: list[list[np.ndarray]] = []

    def enqueue(self, launch: Launch) -> PendingDispatch:
        self.received.append(launch.inputs)
        # "Device memory": each input copied once, flat, in C order.
        self.copied.append([np.array(item, copy=True).reshape(-1) for item in launch.inputs])
        return super().enqueue(launch)


class CapturingReference(ReferenceExecutor):
    """The reference backend, recording each `Launch` it is given."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.launches: list[Launch] = []

    def enqueue(self, launch: Launch) -> PendingDispatch:
        self.launches.append(launch)
        return super().enqueue(launch)


def template_of(backend: BytesBackend) -> LaunchTemplate:
    template = backend.executor.launches[-1].template
    assert template is not None
    return template


# Launch templates -----------------------------------------------------------------------


def test_one_launch_shape_is_planned_once_and_shares_one_template(
    backend: BytesBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    plans: list[tuple[int, ...]] = []

    def counting(program: Any, sizes: Any, **kwargs: Any) -> Any:
        plans.append(tuple(sizes))
        return plan_dispatch(program, sizes, **kwargs)

    monkeypatch.setattr("vyre_async._frontend.plan_dispatch", counting)
    program = elementwise_xor(16)
    config = DispatchConfig(timeout=30.0)
    backend.dispatch(program, xor_inputs(16), config).result()
    first = template_of(backend)
    for _ in range(3):
        backend.dispatch(program, xor_inputs(16), config).result()
        assert template_of(backend) is first
    assert plans == [(16, 16)]  # checked and planned once (sizes: the inputs')
    assert backend.executor.launches[-1].plan is first.plan

    # A new config object equal to the first: the same template.
    backend.dispatch(program, xor_inputs(16), DispatchConfig(timeout=30.0)).result()
    assert template_of(backend) is first
    assert len(plans) == 1

    # Other input sizes: another shape, another template (planned once too).
    backend.dispatch(program, xor_inputs(8), config).result()
    other = template_of(backend)
    assert other is not first
    assert other.plan.counts == (8, 8, 16)
    backend.dispatch(program, xor_inputs(8), config).result()
    assert template_of(backend) is other
    assert len(plans) == 2

    # Another (unequal) config: another template.
    backend.dispatch(program, xor_inputs(16), DispatchConfig(timeout=30.0, label="x")).result()
    assert template_of(backend) is not first

    # And the first shape is still the first template.
    backend.dispatch(program, xor_inputs(16), config).result()
    assert template_of(backend) is first


def test_the_template_memo_stays_bounded(backend: BytesBackend) -> None:
    program = elementwise_xor(4)  # inputs sized at dispatch: every size is a new shape
    config = DispatchConfig()
    shapes = TEMPLATE_CAPACITY + 40
    for n in range(1, shapes + 1):
        backend.dispatch(program, xor_inputs(n), config).result()
        assert backend.executor.launches[-1].plan.counts == (n, n, 4)
    assert len(backend.executor.launches) == shapes
    assert len(backend.front._by_id) <= TEMPLATE_CAPACITY
    assert len(backend.front._by_value) <= TEMPLATE_CAPACITY
    # Early shapes were dropped and are planned again, correctly.
    backend.dispatch(program, xor_inputs(1), config).result()
    assert backend.executor.launches[-1].plan.counts == (1, 1, 4)


def test_a_shape_in_use_keeps_its_template_while_many_others_come_and_go(
    backend: BytesBackend,
) -> None:
    """`TEMPLATE_CAPACITY` is documented as least recently used dropped first."""
    program = elementwise_xor(4)
    config = DispatchConfig()
    backend.dispatch(program, xor_inputs(1), config).result()
    hot = template_of(backend)
    for n in range(2, TEMPLATE_CAPACITY + 50):
        backend.dispatch(program, xor_inputs(n), config).result()  # a one-off shape
        backend.dispatch(program, xor_inputs(1), config).result()  # the hot one, again
        assert template_of(backend) is hot, f"re-planned after {n - 1} other shapes"


# What the backend receives -----------------------------------------------------------------


def test_host_inputs_arrive_as_private_flat_copies(backend: BytesBackend) -> None:
    program = elementwise_xor(16)
    square = np.arange(16, dtype=np.uint32).reshape(4, 4)
    strided = np.arange(32, dtype=np.uint32)[::2]
    backend.dispatch(program, [square, strided]).result()
    launch = backend.executor.launches[-1]
    first, second = launch.inputs
    assert isinstance(first, np.ndarray) and isinstance(second, np.ndarray)
    assert first is not square and second is not strided
    assert first.shape == (16,) and second.shape == (16,)  # flat
    assert first.flags.c_contiguous and second.flags.c_contiguous
    assert not np.shares_memory(first, square) and not np.shares_memory(second, strided)
    square[...] = 99  # the caller reuses its arrays after dispatch()
    strided[...] = 77
    assert first.tolist() == list(range(16))
    assert second.tolist() == list(range(0, 32, 2))
    assert launch.resident is False


def test_a_backend_that_copies_inputs_receives_the_callers_arrays() -> None:
    backend = backend_of(CopyingBackend, prefetch=False)
    try:
        program = elementwise_xor(16)
        square = np.arange(16, dtype=np.uint32).reshape(4, 4)
        strided = np.arange(32, dtype=np.uint32)[::2]
        backend.dispatch(program, [square, strided]).result()
        received = backend.executor.received[-1]
        assert received[0] is square  # the caller's own objects: no copy by the driver
        assert received[1] is strided
        assert backend.executor.launches[-1].resident is False
        copied = backend.executor.copied[-1]
        square[...] = 0  # after dispatch(): the backend's own copy is unaffected
        assert copied[0].tolist() == list(range(16))
        assert copied[1].tolist() == list(range(0, 32, 2))

        # What is not an array of the buffer's dtype is still converted (and checked).
        backend.dispatch(program, [np.arange(16, dtype=np.uint32).tobytes(), strided]).result()
        first = backend.executor.received[-1][0]
        assert isinstance(first, np.ndarray) and first.dtype == np.uint32
        assert first.tolist() == list(range(16))
        with pytest.raises(InvalidProgram, match="Fix:"):
            backend.dispatch(program, [np.zeros(16, np.float32), strided])
    finally:
        close(backend)


def test_resident_inputs_mark_the_launch_resident() -> None:
    backend = backend_of(CapturingReference, prefetch=False)
    try:
        program = elementwise_xor(16)
        a, b = xor_inputs(16)
        buffer = backend.upload(a)
        outputs = backend.dispatch(program, [buffer, b]).result()
        launch = backend.executor.launches[-1]
        assert launch.resident is True
        assert isinstance(launch.inputs[0], ResidentBuffer) and launch.inputs[0] is buffer
        assert outputs[0].tolist() == (a ^ b).tolist()

        outputs = backend.dispatch(program, [a, b]).result()
        assert backend.executor.launches[-1].resident is False
        assert outputs[0].tolist() == (a ^ b).tolist()
        backend.free(buffer)
    finally:
        close(backend)


# The store's identity memo ---------------------------------------------------------------


def test_a_warm_repeat_dispatch_counts_a_cache_hit(backend: BytesBackend) -> None:
    program = elementwise_xor(16)
    config = DispatchConfig()
    first = backend.dispatch(program, xor_inputs(16), config)
    assert first.record.cache_hit is False
    first.result()
    hits = backend.cache_stats().hits
    for i in range(1, 4):
        pending = backend.dispatch(program, xor_inputs(16), config)  # the memoised objects
        assert pending.record.cache_hit is True
        pending.result()
        assert backend.cache_stats().hits == hits + i
    assert backend.executor.builds == 1


def test_closing_the_backend_refuses_even_a_memoised_program() -> None:
    backend = backend_of(BytesBackend, prefetch=False)
    program = elementwise_xor(16)
    config = DispatchConfig()
    for _ in range(2):  # the second lookup takes the identity memo's fast path
        backend.dispatch(program, xor_inputs(16), config).result()
    pipeline, hit = backend.store.lookup(program, config)
    assert hit
    close(backend)
    with pytest.raises(BackendClosed, match="Fix:"):
        backend.compile(program, config)
    with pytest.raises(BackendClosed, match="Fix:"):
        backend.dispatch(program, xor_inputs(16), config)
    with pytest.raises(BackendClosed):
        pipeline.dispatch(xor_inputs(16))


# Errors before launch --------------------------------------------------------------------


def test_errors_before_launch_carry_a_fix_and_leave_no_template_behind(
    backend: BytesBackend,
) -> None:
    program = elementwise_xor(16)  # 64 bytes of output
    too_small = DispatchConfig(max_output_bytes=32)
    for _ in range(3):  # every time, not just the first
        with pytest.raises(InvalidProgram, match="max_output_bytes") as info:
            backend.dispatch(program, xor_inputs(16), too_small)
        assert "\nFix: " in str(info.value)
    for _ in range(2):
        with pytest.raises(InvalidProgram, match="Fix:"):
            backend.dispatch(program, xor_inputs(16)[:1], too_small)  # one input missing
    assert backend.executor.launches == []  # nothing reached the backend
    assert not backend.front._by_id and not backend.front._by_value
    # The same shape under a config that allows it plans and runs.
    big_enough = DispatchConfig(max_output_bytes=64)
    outputs = backend.dispatch(program, xor_inputs(16), big_enough).result()
    assert outputs[0].shape == (16,)
    assert len(backend.front._by_id) == 1


def test_a_template_planned_for_one_pipeline_does_not_skip_another_pipelines_policy_check() -> None:
    """The same program, config and sizes on a pipeline of another policy must still refuse."""
    backend = backend_of(BytesBackend)
    program = elementwise_xor(8)
    loose = DispatchConfig(ulp_budget=3)
    inputs = [np.arange(8, dtype=np.uint32), np.ones(8, dtype=np.uint32)]
    backend.dispatch(program, inputs, loose).result()  # plans (program, loose, sizes)
    strict = backend.compile(program, DispatchConfig(ulp_budget=1))
    with pytest.raises(InvalidProgram, match="another ulp_budget") as info:
        strict.dispatch(inputs, loose)
    assert "Fix:" in str(info.value)


def test_running_out_of_host_memory_copying_an_input_is_device_out_of_memory() -> None:
    """The fast copy path maps MemoryError like the slow one (no raw numpy error)."""
    script = """
import resource, sys
import numpy as np
from tests.driver.fakes import BytesBackend
from tests.helpers import backend_of
from vyre_async import DeviceOutOfMemory
from vyre_async.programs import elementwise_xor
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
n = 2**32 - 1  # 16 GiB once copied; BytesBackend reports no storage limit
huge = np.broadcast_to(np.uint32(1), (n,))
try:
    backend_of(BytesBackend).dispatch(elementwise_xor(n), [huge, huge])
except DeviceOutOfMemory as exc:
    assert "Fix:" in str(exc), exc
    print("mapped")
"""
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.strip() == "mapped", out.stderr[-2000:]
