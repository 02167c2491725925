"""Batches on the CUDA backend (fake device): persistent kernel, CUDA graph replay, fallbacks.

Every batch is checked item by item against the numpy reference engine, on the
whole conformance corpus: the batch kernel (``<entry>_batch``) and the captured
graphs run in the CPU emulator behind the fake ``cupy`` (``fake_cupy.py``).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import anyio
import numpy as np
import pytest

import vyre_cupy.batch
import vyre_cupy.launch
from tests.conformance.corpus import Case, cases
from tests.cupy.device_programs import accumulate
from tests.cupy.fake_cupy import FakeDevice, FakeGraph
from tests.cupy.unit_programs import early_return
from vyre_async import (
    DeviceOutOfMemory,
    DispatchConfig,
    InvalidProgram,
    UnsupportedFeature,
    VyreBackend,
)
from vyre_async._calibration import Calibration, CalibrationStore, calibration_for
from vyre_async._pending import DispatchCompleter, PendingDispatch
from vyre_async._shadow import compare_outputs
from vyre_async.programs import elementwise_xor
from vyre_cupy import create_backend
from vyre_cupy.codegen import generate, has_grid_barrier
from vyre_cupy.layout import plan_layout
from vyre_reference import execute

CORPUS = [c for c in cases() if c.error is None]


@pytest.fixture(scope="module")
def backend(fake: FakeDevice) -> Iterator[VyreBackend]:
    backend = create_backend(disk_cache=None, prefetch=False)
    yield backend
    anyio.run(backend.shutdown)


@pytest.fixture
def own_backend(fake: FakeDevice) -> Iterator[VyreBackend]:
    """A backend of the test's own: no graph captured, no event recycled yet.

    A test that fails while it holds a replay on the device never lets it go on: closing
    gives up on it after ``close_timeout``.
    """
    backend = create_backend(disk_cache=None, prefetch=False)
    backend.close_timeout = 1.0
    yield backend
    anyio.run(backend.shutdown)


def _hold_next_replay(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Hold the next graph replay on the device: its stream stops before the graph's work.

    Returns ``(reached, gate)``: ``reached`` is set once the stream stopped there (its
    upload done); setting ``gate`` lets it go on. Later replays are not held.
    """
    reached, gate = threading.Event(), threading.Event()
    launch = FakeGraph.launch

    def hold() -> None:
        reached.set()
        gate.wait()

    def held(graph: FakeGraph, stream: Any = None) -> None:
        monkeypatch.setattr(FakeGraph, "launch", launch)
        stream.enqueue(hold)
        launch(graph, stream)

    monkeypatch.setattr(FakeGraph, "launch", held)
    return reached, gate


def _variants(case: Case, n: int) -> list[list[np.ndarray]]:
    """``n`` input sets of the case's shape: its own inputs, then rotated copies.

    A fused program's member table (its last input) is not data: it stays as it is.
    """
    table = len(case.inputs) - 1 if case.program.op_id.startswith("fused:") else -1
    return [
        [a if i == table else np.roll(np.asarray(a), k) for i, a in enumerate(case.inputs)]
        for k in range(n)
    ]


def _attributes(pending: PendingDispatch) -> dict[str, Any]:
    return dict(pending.record.attributes or {})


def _check_items(case: Case, batch: list[list[np.ndarray]], results: list[Any]) -> None:
    for inputs, outputs in zip(batch, results, strict=True):
        want = execute(
            case.program,
            inputs,
            grid_override=case.grid,
            fixpoint_iterations=case.fixpoint_iterations,
        )
        divergence = compare_outputs(
            case.name, case.program, inputs, outputs, want, ulp_budget=case.ulp_budget
        )
        assert divergence is None, str(divergence)


@pytest.mark.parametrize("mode", ["persistent", "command_reuse"])
def test_every_corpus_case_batched_equals_the_reference_item_by_item(
    backend: VyreBackend, mode: str
) -> None:
    check_corpus_batched(backend, mode)


def check_corpus_batched(backend: VyreBackend, mode: str) -> None:
    """Batch 3 input sets of every corpus case in ``mode``; each equals the reference.

    Also run by ``test_cupy_gpu`` on a real device.
    """
    ran = {"persistent": 0, "command_reuse": 0, "plain": 0, "grid_barrier": 0}
    for case in CORPUS:
        pipeline = backend.compile(case.program, case.config())
        batch = _variants(case, 3)
        pendings = pipeline.dispatch_batch(batch, case.config(), mode=mode)  # type: ignore[arg-type]
        _check_items(case, batch, [p.result() for p in pendings])
        applied = {_attributes(p)["vyre.batch.mode"] for p in pendings}
        assert len(applied) == 1
        ran[applied.pop()] += 1
        attrs = _attributes(pendings[0])
        assert attrs["vyre.policy.execution_mode"] == mode
        assert attrs["vyre.policy.execution_mode.reason"] == "requested"
        assert attrs["vyre.batch.size"] == 3
        if attrs["vyre.batch.mode"] == "plain":
            reason = attrs["vyre.batch.mode.reason"]
            if reason == "iterations":
                assert mode == "persistent" and case.fixpoint_iterations > 1
            elif reason == "empty_launch":  # zero lanes: nothing to launch, nothing to batch
                assert any(np.asarray(a).size == 0 for a in case.inputs) or case.grid
            elif reason == "grid_barrier":  # each item runs its own launches (vyre_cupy.grid)
                assert has_grid_barrier(case.program)
                ran["grid_barrier"] += 1
            else:
                assert reason == "kernel_uses_barriers" and mode == "persistent"
                assert generate(case.program).batch_entry is None
    assert ran[mode] >= 30  # most of the corpus really ran batched
    if mode == "persistent":
        assert ran["plain"] >= 1  # barrier programs fell back, and said why
    else:  # graphs capture any kernel, iterations included; only empty launches stay plain
        assert ran["plain"] - ran["grid_barrier"] <= 2


def test_a_persistent_batch_is_one_launch_and_replays_capture_once(
    backend: VyreBackend, fake: FakeDevice
) -> None:
    program = elementwise_xor(1003)  # a size no other test uses: its graph is captured here
    pipeline = backend.compile(program)
    rng = np.random.default_rng(7)
    batch = [[rng.integers(0, 2**32, 1003, dtype=np.uint32) for _ in range(2)] for _ in range(40)]
    launches, batched = fake.launches, fake.batch_launches
    results = [p.result() for p in pipeline.dispatch_batch(batch, mode="persistent")]
    assert fake.launches == launches + 1 and fake.batch_launches == batched + 1
    for (a, b), (out,) in zip(batch, results, strict=True):
        np.testing.assert_array_equal(out, a ^ b)

    captures, replays = fake.captures, fake.replays
    for _ in range(2):  # the second call reuses the graph captured by the first
        results = [p.result() for p in pipeline.dispatch_batch(batch, mode="command_reuse")]
        for (a, b), (out,) in zip(batch, results, strict=True):
            np.testing.assert_array_equal(out, a ^ b)
    assert fake.captures == captures + 1 and fake.replays == replays + 80


def test_replays_from_concurrent_batches_never_share_the_arena_at_once(
    backend: VyreBackend,
) -> None:
    program = elementwise_xor(512)
    pipeline = backend.compile(program)
    batches = [
        [[np.full(512, 1000 * t + i, np.uint32), np.full(512, 7, np.uint32)] for i in range(25)]
        for t in range(4)
    ]
    results: list[list[Any]] = [[] for _ in batches]

    def run(t: int) -> None:
        pendings = pipeline.dispatch_batch(batches[t], mode="command_reuse")
        results[t] = [p.result()[0] for p in pendings]

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for batch, got in zip(batches, results, strict=True):
        for (a, b), out in zip(batch, got, strict=True):
            np.testing.assert_array_equal(out, a ^ b)


def test_batches_that_cannot_run_batched_run_plain_and_say_why(backend: VyreBackend) -> None:
    xor = backend.compile(elementwise_xor(64))
    resident = backend.upload(np.arange(64, dtype=np.uint32))
    try:
        mixed = [
            [np.arange(64, dtype=np.uint32)] * 2,
            [np.arange(32, dtype=np.uint32)] * 2,
        ]
        with_resident = [[resident, np.ones(64, np.uint32)]] * 2
        for batch, reason in ((mixed, "mixed_shapes"), (with_resident, "resident_inputs")):
            for mode in ("persistent", "command_reuse"):
                pendings = xor.dispatch_batch(batch, mode=mode)  # type: ignore[arg-type]
                for inputs, pending in zip(batch, pendings, strict=True):
                    a, b = (
                        backend.download(x) if not isinstance(x, np.ndarray) else x for x in inputs
                    )
                    want = np.zeros(64, np.uint32)  # out has 64 elements; loads past a, b read 0
                    want[: a.size] = a ^ b
                    np.testing.assert_array_equal(pending.result()[0], want)
                    attrs = _attributes(pending)
                    assert attrs["vyre.batch.mode"] == "plain"
                    assert attrs["vyre.batch.mode.reason"] == reason
    finally:
        backend.free(resident)


def test_a_bad_input_set_launches_nothing(backend: VyreBackend, fake: FakeDevice) -> None:
    pipeline = backend.compile(elementwise_xor(16))
    good = [np.zeros(16, np.uint32)] * 2
    launches = fake.launches
    for mode in (None, "persistent", "command_reuse"):
        with pytest.raises(InvalidProgram, match="Fix:"):
            pipeline.dispatch_batch([good, good, [np.zeros(16, np.float32)] * 2], mode=mode)  # type: ignore[arg-type]
    assert fake.launches == launches


def test_an_empty_batch_returns_nothing_in_every_mode(backend: VyreBackend) -> None:
    pipeline = backend.compile(elementwise_xor(16))
    for mode in (None, "plain", "persistent", "command_reuse"):
        assert pipeline.dispatch_batch([], mode=mode) == []  # type: ignore[arg-type]


def test_the_policy_picks_the_mode_from_calibration(
    backend: VyreBackend, fake: FakeDevice, tmp_path: Any
) -> None:
    store = CalibrationStore(tmp_path)
    base = Calibration(
        backend_id=backend.id,
        backend_version=backend.version,
        device_fingerprint=backend.device_fingerprint(),
        launch_ns=20_000,
        record_ns=60_000,
        replay_ns=15_000,
        persistent_setup_ns=50_000,
    )
    store.save(base)
    pipeline = backend.compile(elementwise_xor(64))
    a = np.arange(64, dtype=np.uint32)
    try:
        _forget_calibration(backend)  # earlier batches remembered "none cached"
        assert calibration_for(backend, store=store) == base
        # B = 16: persistent saves 16*20 - 50 = 270 us, replay 16*5 - 60 = 20 us.
        pendings = pipeline.dispatch_batch([[a, a]] * 16)
        attrs = _attributes(pendings[0])
        assert attrs["vyre.policy.execution_mode"] == "persistent"
        assert attrs["vyre.batch.mode"] == "persistent"
        assert all(not p.result()[0].any() for p in pendings)
        # B = 2: neither pays off.
        pendings = pipeline.dispatch_batch([[a, a]] * 2)
        assert _attributes(pendings[0])["vyre.batch.mode"] == "plain"
        assert "vyre.batch.mode.reason" not in _attributes(pendings[0])
        [p.result() for p in pendings]
        # persistent_thread="disable": replay is the only profitable path at B = 16.
        pendings = pipeline.dispatch_batch(
            [[a, a]] * 16, DispatchConfig(persistent_thread="disable")
        )
        assert _attributes(pendings[0])["vyre.batch.mode"] == "command_reuse"
        [p.result() for p in pendings]
    finally:
        _forget_calibration(backend)


def _forget_calibration(backend: VyreBackend) -> None:
    from vyre_async._calibration import store

    with store._memo_lock:
        store._memo.pop(backend, None)


def test_a_requested_mode_the_config_disables_is_refused(backend: VyreBackend) -> None:
    pipeline = backend.compile(elementwise_xor(8))
    with pytest.raises(UnsupportedFeature, match="Fix:"):
        pipeline.dispatch_batch([], DispatchConfig(persistent_thread="disable"), mode="persistent")
    with pytest.raises(ValueError, match="mode must be one of"):
        pipeline.dispatch_batch([], mode="fast")  # type: ignore[arg-type]


def test_accumulate_with_read_write_buffers_batches_exactly(backend: VyreBackend) -> None:
    program = accumulate()
    pipeline = backend.compile(program)
    batch = [[np.arange(64, dtype=np.uint32) * k, np.full(64, k, np.uint32)] for k in range(1, 9)]
    for mode in ("persistent", "command_reuse"):
        pendings = pipeline.dispatch_batch(batch, mode=mode)  # type: ignore[arg-type]
        for (x, acc), pending in zip(batch, pendings, strict=True):
            np.testing.assert_array_equal(pending.result()[0], acc + x * 3)
            assert _attributes(pending)["vyre.batch.mode"] == mode


def test_every_upload_carries_its_copy_overlap_verdict(backend: VyreBackend) -> None:
    pipeline = backend.compile(elementwise_xor(1001))  # a size of its own: a fresh graph
    a = np.arange(1001, dtype=np.uint32)
    plain = pipeline.dispatch([a, a])
    plain.result()
    attrs = _attributes(plain)
    assert attrs["vyre.policy.copy_overlap"] == "overlap"
    assert attrs["vyre.copy.target"] == "private_arena" and attrs["vyre.copy.staging"] == "pinned"
    persistent = pipeline.dispatch_batch([[a, a]] * 2, mode="persistent")
    for pending in persistent:  # each item's own slice of a fresh arena
        pending.result()
        attrs = _attributes(pending)
        assert attrs["vyre.policy.copy_overlap"] == "overlap"
        assert attrs["vyre.copy.target"] == "private_arena"
    replays = pipeline.dispatch_batch([[a, a]] * 3, mode="command_reuse")
    [p.result() for p in replays]
    first, *rest = (_attributes(p) for p in replays)
    assert first["vyre.policy.copy_overlap"] == "overlap"  # nothing used the new arena yet
    assert first["vyre.copy.target"] == "graph_arena"
    for later in rest:  # the arena is the previous replay's: wait for it, device-side
        assert later["vyre.policy.copy_overlap"] == "serialize"
        assert later["vyre.policy.copy_overlap.reason"] == "kernel_reads_slot"
        assert later["vyre.copy.target"] == "graph_arena"


def test_persistent_blocks_loop_over_more_tasks_than_they_are(
    backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One SM holds 32 blocks of 64 lanes: 20 items x 16 workgroups = 320 tasks loop
    # ten times over the 32 blocks.
    monkeypatch.setitem(backend.executor.info.attributes, "MultiProcessorCount", 1)
    pipeline = backend.compile(elementwise_xor(1000))
    rng = np.random.default_rng(11)
    batch = [[rng.integers(0, 2**32, 1000, dtype=np.uint32) for _ in range(2)] for _ in range(20)]
    pendings = pipeline.dispatch_batch(batch, mode="persistent")
    for (a, b), pending in zip(batch, pendings, strict=True):
        np.testing.assert_array_equal(pending.result()[0], a ^ b)
    # Every corpus kernel (3-D grids, early returns, atomics) on 2 blocks: each block
    # runs many tasks of several items one after another.
    monkeypatch.setattr(vyre_cupy.batch, "persistent_blocks", lambda *_: 2)
    looped = 0
    for case in CORPUS:
        if generate(case.program).batch_entry is None or case.fixpoint_iterations > 1:
            continue
        variants = _variants(case, 5)
        pipeline = backend.compile(case.program, case.config())
        pendings = pipeline.dispatch_batch(variants, case.config(), mode="persistent")
        _check_items(case, variants, [p.result() for p in pendings])
        looped += _attributes(pendings[0])["vyre.batch.mode"] == "persistent"
    assert looped >= 30


def test_an_early_return_ends_the_task_not_the_block(
    backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    program = early_return()  # 16 workgroups per item, returns inside a loop
    assert generate(program).batch_entry is not None
    monkeypatch.setattr(vyre_cupy.batch, "persistent_blocks", lambda *_: 2)
    pendings = backend.compile(program).dispatch_batch([[]] * 6, mode="persistent")
    want = execute(program, [])
    assert (want[0][0], want[0][1], want[0][2], want[1][1], want[1][2]) == (0, 4, 2, 7, 0)
    for pending in pendings:
        outputs = pending.result()
        assert _attributes(pending)["vyre.batch.mode"] == "persistent"
        for got, expected in zip(outputs, want, strict=True):
            np.testing.assert_array_equal(got, expected)


def test_batches_too_big_for_one_arena_or_a_kept_graph_run_plain(
    backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = backend.compile(elementwise_xor(256))
    a = np.arange(256, dtype=np.uint32)
    monkeypatch.setattr(vyre_cupy.batch, "PERSISTENT_ARENA_LIMIT", 4096)
    monkeypatch.setattr(vyre_cupy.batch, "GRAPH_ARENA_LIMIT", 1024)
    for mode, reason in (("persistent", "batch_too_large"), ("command_reuse", "arena_too_large")):
        pendings = pipeline.dispatch_batch([[a, a]] * 4, mode=mode)  # type: ignore[arg-type]
        for pending in pendings:
            assert not pending.result()[0].any()
            assert _attributes(pending)["vyre.batch.mode"] == "plain"
            assert _attributes(pending)["vyre.batch.mode.reason"] == reason


def test_a_replay_that_fails_to_enqueue_drops_its_graph_and_fails_the_rest(
    backend: VyreBackend, fake: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = backend.compile(elementwise_xor(1002))  # a size of its own: a fresh graph
    a = np.arange(1002, dtype=np.uint32)
    started = time.perf_counter_ns()
    [p.result() for p in pipeline.dispatch_batch([[a, a]], mode="command_reuse")]
    elapsed = time.perf_counter_ns() - started
    kernel = pipeline.native
    (captured,) = [g for key, g in kernel.graphs.items() if key[0][0] == 1002]
    assert 0 < captured.record_ns <= elapsed  # (the capture's own cost, within the call's)
    calls = {"n": 0}
    launch = captured.graph.launch

    def flaky(stream: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise fake.modules()["cupy"].cuda.runtime.CUDARuntimeError(1)  # invalid value
        launch(stream)

    monkeypatch.setattr(captured.graph, "launch", flaky)
    pendings = pipeline.dispatch_batch([[a, a]] * 4, mode="command_reuse")
    assert not pendings[0].result()[0].any()
    for pending in pendings[1:]:
        with pytest.raises(Exception, match=r"while replaying a CUDA graph(.|\n)*Fix:"):
            pending.result()
    assert captured not in kernel.graphs.values()  # the next batch captures afresh
    assert all(
        not p.result()[0].any() for p in pipeline.dispatch_batch([[a, a]] * 2, mode="command_reuse")
    )


def test_a_kernel_keeps_its_most_recently_used_graphs(
    backend: VyreBackend, fake: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A graph per launch shape (iterations among its key), the least recently used dropped.
    monkeypatch.setattr(vyre_cupy.batch, "GRAPHS_PER_KERNEL", 2)
    pipeline = backend.compile(elementwise_xor(1001))  # a size of its own
    a = np.arange(1001, dtype=np.uint32)

    def run(iterations: int) -> None:
        config = DispatchConfig(fixpoint_iterations=iterations)
        for pending in pipeline.dispatch_batch([[a, a]] * 2, config, mode="command_reuse"):
            assert not pending.result()[0].any()

    def kept() -> list[int]:
        return sorted(key[3] for key in pipeline.native.graphs if key[0][0] == 1001)

    for iterations in (2, 3, 2):  # 2 is the one used last
        run(iterations)
    captures = fake.captures
    run(4)
    assert kept() == [2, 4] and fake.captures == captures + 1
    run(2)
    run(4)
    assert fake.captures == captures + 1  # (both kept: replayed, not captured again)


def test_a_batch_of_one_is_one_persistent_launch(backend: VyreBackend, fake: FakeDevice) -> None:
    pipeline = backend.compile(elementwise_xor(1004))
    a, b = np.arange(1004, dtype=np.uint32), np.full(1004, 5, np.uint32)
    launches, batched = fake.launches, fake.batch_launches
    (pending,) = pipeline.dispatch_batch([[a, b]], mode="persistent")
    np.testing.assert_array_equal(pending.result()[0], a ^ b)
    assert _attributes(pending)["vyre.batch.mode"] == "persistent"
    assert _attributes(pending)["vyre.stream"] in range(
        backend.executor.device_context.streams.size
    )
    assert fake.launches == launches + 1 and fake.batch_launches == batched + 1


def test_a_replay_held_on_the_device_holds_back_no_other_batch(
    own_backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay waits for its own graph's previous replay only, and settles on its own stream.

    One graph's replay is held on the device; a replay of another graph (whose previous
    replay ended before), dispatched after it, runs and settles meanwhile.
    """
    first = own_backend.compile(elementwise_xor(1005))
    other = own_backend.compile(elementwise_xor(1006))
    a, b = np.arange(1005, dtype=np.uint32), np.arange(1006, dtype=np.uint32)
    assert not first.dispatch_batch([[a, a]], mode="command_reuse")[0].result()[0].any()
    anyio.run(own_backend.flush)  # that replay is over, its events handed back
    reached, gate = _hold_next_replay(monkeypatch)
    (held,) = other.dispatch_batch([[b, b]], mode="command_reuse")
    assert reached.wait(30)
    (after,) = first.dispatch_batch([[a, a + 1]], mode="command_reuse")
    # (A failure here leaves the held replay held: the backend gives up on it at closing.)
    np.testing.assert_array_equal(after.result(timeout=30)[0], a ^ (a + 1))
    assert not held.done()
    assert _attributes(held)["vyre.stream"] != _attributes(after)["vyre.stream"]
    gate.set()
    assert not held.result()[0].any()


def test_a_dropped_graph_keeps_its_device_memory_until_its_replay_ends(
    own_backend: VyreBackend, fake: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graph dropped (least recently used) while a replay of it is still on the device:
    its arena stays allocated for that replay, and is given back once the replay ended."""
    monkeypatch.setattr(vyre_cupy.batch, "GRAPHS_PER_KERNEL", 1)
    pipeline = own_backend.compile(elementwise_xor(1007))
    a = np.arange(1007, dtype=np.uint32)

    def run(iterations: int) -> PendingDispatch:
        config = DispatchConfig(fixpoint_iterations=iterations)
        (pending,) = pipeline.dispatch_batch([[a, a]], config, mode="command_reuse")
        return pending

    gc.collect()
    empty = fake.allocated
    assert not run(1).result()[0].any()  # captures the graph of one iteration
    anyio.run(own_backend.flush)
    gc.collect()
    arena = fake.allocated - empty
    assert arena > 0
    reached, gate = _hold_next_replay(monkeypatch)
    held = run(1)
    assert reached.wait(30)
    assert not run(2).result(timeout=30)[0].any()  # a graph of two: the first one is dropped
    gc.collect()
    # (A failure here leaves the held replay held: it never runs on memory given back.)
    assert fake.allocated == empty + 2 * arena
    gate.set()
    assert not held.result()[0].any()
    anyio.run(own_backend.flush)
    gc.collect()
    assert fake.allocated == empty + arena


@pytest.mark.parametrize("mode", ["persistent", "command_reuse"])
def test_batches_time_their_own_work_on_the_device(
    own_backend: VyreBackend, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """Each item's device time and upload/launch/readback phases come from its own events.

    None is negative or longer than the dispatch took. (On a backend of its own every event
    is new: one left unrecorded would read as the clock's zero, hours or days before.)
    """
    monkeypatch.setattr(DispatchCompleter, "wants_phases", property(lambda self: True))
    pipeline = own_backend.compile(elementwise_xor(1008))
    a = np.arange(1008, dtype=np.uint32)
    share = 3 if mode == "persistent" else 1  # items sharing one launch share its time
    for pending in pipeline.dispatch_batch([[a, a]] * 3, mode=mode):  # type: ignore[arg-type]
        assert not pending.result()[0].any()
        assert _attributes(pending)["vyre.batch.mode"] == mode
        timing = pending.timing
        assert timing is not None and timing.wall_s is not None and timing.device_s is not None
        assert 0 < timing.device_s <= timing.wall_s
        phases = (pending.record.phases or [])[-3:]
        assert [name for name, _, _ in phases] == ["vyre.upload", "vyre.launch", "vyre.readback"]
        for _, start, end in phases:
            assert 0 < end - start <= timing.wall_s * 1e9  # (each phase has device work)
        _, start, end = phases[1]  # the launch phase: the device time, shared
        assert abs(timing.device_s * share * 1e9 - (end - start)) <= 10
    monkeypatch.undo()  # no span: device time without phases
    for pending in pipeline.dispatch_batch([[a, a]] * 3, mode=mode):  # type: ignore[arg-type]
        assert not pending.result()[0].any()
        timing = pending.timing
        assert timing is not None and timing.wall_s is not None and timing.device_s is not None
        assert 0 < timing.device_s <= timing.wall_s
        assert timing.compile_s is not None


def test_a_persistent_batch_without_device_memory_fails_each_item_and_frees_its_stream(
    backend: VyreBackend, fake: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of device memory for the batch's arena: every item fails with the device's error
    (and its fix), its stream is given back, and the next batch runs."""
    pipeline = backend.compile(elementwise_xor(1009))
    a = np.arange(1009, dtype=np.uint32)
    gc.collect()
    monkeypatch.setattr(fake, "memory_limit", fake.allocated + 1024)  # less than one arena
    for pending in pipeline.dispatch_batch([[a, a]] * 3, mode="persistent"):
        with pytest.raises(DeviceOutOfMemory, match=r"enqueueing a persistent batch(.|\n)*Fix:"):
            pending.result()
    assert max(backend.executor.device_context.streams.busy()) == 0  # its stream is free again
    monkeypatch.undo()
    for pending in pipeline.dispatch_batch([[a, a ^ 1]] * 3, mode="persistent"):
        assert (pending.result()[0] == 1).all()


@pytest.mark.parametrize(
    ("tasks", "workgroup", "sm_count", "blocks"),
    [
        (1, (64, 1, 1), 132, 1),  # one task: one block
        (1000, (32, 1, 1), 1, 32),  # at most 32 blocks per SM
        (1000, (96, 1, 1), 1, 21),  # 2048 // 96 lanes
        (1000, (683, 1, 1), 1, 2),  # 2048 // 683 lanes
        (1000, (8, 8, 4), 1, 8),  # 256 lanes: x * y * z
        (1000, (16, 8, 4), 2, 8),  # 512 lanes: 4 per SM
        (1000, (1024, 1, 1), 3, 6),  # 1024 lanes: 2 per SM
    ],
)
def test_persistent_blocks_are_what_the_device_holds_at_once(
    tasks: int, workgroup: tuple[int, int, int], sm_count: int, blocks: int
) -> None:
    got = vyre_cupy.batch.persistent_blocks(tasks, workgroup, sm_count)
    assert got == blocks and isinstance(got, int)


def test_a_persistent_launch_sizes_its_blocks_from_its_tasks_and_the_device(
    backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every (item, workgroup) task counts, and the device's SM count (1 if it says none)."""
    asked: list[tuple[int, tuple[int, int, int], int]] = []
    blocks = vyre_cupy.batch.persistent_blocks

    def spy(tasks: int, workgroup: tuple[int, int, int], sm_count: int) -> int:
        asked.append((tasks, workgroup, sm_count))
        return blocks(tasks, workgroup, sm_count)

    monkeypatch.setattr(vyre_cupy.batch, "persistent_blocks", spy)
    pipeline = backend.compile(elementwise_xor(1010))  # 16 workgroups of 64 lanes
    a = np.arange(1010, dtype=np.uint32)
    for pending in pipeline.dispatch_batch([[a, a]] * 3, mode="persistent"):
        assert not pending.result()[0].any()
    twice = DispatchConfig(grid_override=(16, 2, 1))  # every element done by 2 workgroups
    for pending in pipeline.dispatch_batch([[a, a]] * 3, twice, mode="persistent"):
        assert not pending.result()[0].any()
    monkeypatch.delitem(backend.executor.info.attributes, "MultiProcessorCount")
    for pending in pipeline.dispatch_batch([[a, a]] * 3, mode="persistent"):
        assert not pending.result()[0].any()
    assert asked == [(48, (64, 1, 1), 132), (96, (64, 1, 1), 132), (48, (64, 1, 1), 1)]


def test_why_a_batch_runs_plain_at_its_limits(
    backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty batch, iterations on a persistent batch; arenas exactly at a limit still batch."""
    program = elementwise_xor(256)
    pipeline = backend.compile(program)
    kernel = pipeline.native
    assert vyre_cupy.batch.batch_obstacle([], "persistent", kernel) == "empty_batch"
    a = np.arange(256, dtype=np.uint32)
    config = DispatchConfig(fixpoint_iterations=2)
    for pending in pipeline.dispatch_batch([[a, a]] * 2, config, mode="persistent"):
        assert not pending.result()[0].any()
        assert _attributes(pending)["vyre.batch.mode"] == "plain"
        assert _attributes(pending)["vyre.batch.mode.reason"] == "iterations"
    layout = plan_layout([d.access for d in program.buffers], [256] * 3, [None] * 3)
    arena = layout.total_bytes
    monkeypatch.setattr(vyre_cupy.batch, "PERSISTENT_ARENA_LIMIT", 4 * arena)
    monkeypatch.setattr(vyre_cupy.batch, "GRAPH_ARENA_LIMIT", arena)
    for mode in ("persistent", "command_reuse"):
        pendings = pipeline.dispatch_batch([[a, a]] * 4, mode=mode)  # type: ignore[arg-type]
        for pending in pendings:
            assert not pending.result()[0].any()
            assert _attributes(pending)["vyre.batch.mode"] == mode


def test_a_replay_without_pinned_memory_fails_the_rest_of_its_batch(
    backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pinned staging runs out at the second item: it and every later one fail with the
    device's error (and its fix); the first one runs, and so does the next batch."""
    pipeline = backend.compile(elementwise_xor(1011))  # a size of its own
    a = np.arange(1011, dtype=np.uint32)
    cuda = backend.executor.device_context.cupy.cuda
    pinned, calls = cuda.alloc_pinned_memory, {"n": 0}

    def scarce(nbytes: int) -> Any:
        calls["n"] += 1
        if calls["n"] >= 2:
            raise MemoryError(f"out of memory allocating {nbytes} bytes of pinned memory")
        return pinned(nbytes)

    monkeypatch.setattr(cuda, "alloc_pinned_memory", scarce)
    first, *rest = pipeline.dispatch_batch([[a, a ^ 1]] * 4, mode="command_reuse")
    assert (first.result()[0] == 1).all()
    for pending in rest:
        with pytest.raises(DeviceOutOfMemory, match=r"while replaying a CUDA graph(.|\n)*Fix:"):
            pending.result()
    monkeypatch.undo()
    for pending in pipeline.dispatch_batch([[a, a ^ 1]] * 2, mode="command_reuse"):
        assert (pending.result()[0] == 1).all()


def test_a_persistent_batch_of_two_settles_both(backend: VyreBackend) -> None:
    pipeline = backend.compile(elementwise_xor(1012))
    a = np.arange(1012, dtype=np.uint32)
    pendings = pipeline.dispatch_batch([[a, a ^ 1], [a, a ^ 2]], mode="persistent")
    for k, pending in enumerate(pendings, 1):
        assert (pending.result(timeout=30)[0] == k).all()
        assert _attributes(pending)["vyre.batch.mode"] == "persistent"


# Settling a flight, on hand-made events and completers ------------------------------------

# Device event times (ns): 0.25 ms upload, 3 ms kernel, 0.5 ms readback.
UPLOAD_NS, KERNEL_NS, READBACK_NS = 250_000, 3_000_000, 500_000


class Stamp:
    """A recorded event: its device time in ns."""

    def __init__(self, ns: int) -> None:
        self.ns = ns
        self.done = True


class Completer:
    """Stands in for a dispatch's completer: records what the flight tells it."""

    def __init__(self, *, phases: bool, stop: bool = False) -> None:
        self.wants_phases = phases
        self.stop = stop
        self.resolved: list[float] = []  # device_s of each resolve
        self.failed: list[BaseException] = []
        self.phases: dict[str, int] = {}  # name -> length in ns

    def should_stop(self) -> bool:
        return self.stop

    def resolve(self, outputs: list[np.ndarray], *, device_s: float, compile_s: float) -> None:
        assert outputs == [] and compile_s == 0.5
        self.resolved.append(device_s)

    def fail(self, error: BaseException) -> None:
        self.failed.append(error)

    def record_phase(self, name: str, start_ns: int, end_ns: int) -> None:
        self.phases[name] = end_ns - start_ns


def hand_flight(completers: list[Completer]) -> vyre_cupy.launch.Flight:
    ctx: Any = SimpleNamespace(elapsed_ns=lambda a, b: float(b.ns - a.ns))
    launches: Any = [
        SimpleNamespace(
            completer=completer,
            compile_s=0.5,
            config=DispatchConfig(),
            pending=SimpleNamespace(created=time.monotonic()),
            plan=SimpleNamespace(program=SimpleNamespace(op_id="k.add")),
        )
        for completer in completers
    ]
    at = [1_000, 1_000 + UPLOAD_NS]
    at += [at[1] + KERNEL_NS, at[1] + KERNEL_NS + READBACK_NS]
    events = [Stamp(ns) for ns in at]
    return vyre_cupy.launch.Flight(
        ctx, launches, (), stream=0, keep=(), readback=None, events=events
    )


PHASES = {"vyre.upload": UPLOAD_NS, "vyre.launch": KERNEL_NS, "vyre.readback": READBACK_NS}


@pytest.mark.parametrize("phases", [True, False], ids=["traced", "untraced"])
def test_a_launch_is_given_its_kernel_time_exactly(phases: bool) -> None:
    completer = Completer(phases=phases)
    hand_flight([completer])._settle()
    assert completer.resolved == [KERNEL_NS / 1e9]  # the kernel's events only, in seconds
    assert completer.phases == (PHASES if phases else {})


@pytest.mark.parametrize("phases", [True, False], ids=["traced", "untraced"])
def test_a_batch_shares_its_kernel_time_and_a_stopped_item_is_told_its_result_was_dropped(
    phases: bool,
) -> None:
    completers = [
        Completer(phases=phases),
        Completer(phases=phases, stop=True),
        Completer(phases=phases),
    ]
    hand_flight(completers)._settle()
    share = KERNEL_NS / 1e9 / 3  # one kernel run for three items
    assert [c.resolved for c in completers] == [[share], [], [share]]
    assert [c.phases for c in completers] == [
        PHASES if phases else {},
        {},
        PHASES if phases else {},
    ]
    (error,) = completers[1].failed
    assert str(error).splitlines()[0] == (
        "dispatch k.add was stopped: its stop was requested; its result was discarded"
    )


def test_a_persistent_batch_finishes_in_its_streams_order(
    backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bridge finishes watches in order per queue: a batch's queue is its stream."""
    pipeline = backend.compile(elementwise_xor(64))
    a = np.arange(64, dtype=np.uint32)
    bridge = backend.executor.device_context.bridge
    submitted: list[tuple[int, object]] = []
    submit = bridge.submit

    def spy(watch: Any, *, queue: Any, quiet_s: float = 0.0) -> None:
        submitted.append((watch.stream, queue))
        submit(watch, queue=queue, quiet_s=quiet_s)

    monkeypatch.setattr(bridge, "submit", spy)
    for pending in pipeline.dispatch_batch([[a, a]] * 3, mode="persistent"):
        assert not pending.result()[0].any()
    ((stream, queue),) = submitted
    assert queue == stream
