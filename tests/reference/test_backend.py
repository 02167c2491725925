"""The reference backend on the driver contract: resident buffers, scheduling, lifecycle."""

from __future__ import annotations

import gc
import sys
import threading
import time

import anyio
import numpy as np
import pytest

from vyre_async import (
    BackendClosed,
    DispatchConfig,
    DispatchTimeout,
    InvalidProgram,
    acquire_backend,
)
from vyre_async._backend import VyreBackend
from vyre_async._pending import wait_for_callbacks
from vyre_async.ir import (
    Access,
    Assign,
    BufferDecl,
    DType,
    Let,
    Load,
    Loop,
    Program,
    Store,
    Var,
    gid,
    u32,
)
from vyre_async.programs import elementwise_xor, histogram
from vyre_reference import ReferenceExecutor, reference_backend

U = np.uint32


def _accumulate() -> Program:
    """acc[i] += x[i] (acc is READ_WRITE)."""
    i = Var("i")
    return Program(
        [
            BufferDecl("x", 0, Access.READ, DType.U32),
            BufferDecl("acc", 1, Access.READ_WRITE, DType.U32),
        ],
        64,
        [Let("i", gid()), Store("acc", i, Load("acc", i) + Load("x", i))],
        op_id="test.accumulate",
    )


def test_registered_and_acquired_once() -> None:
    backend = acquire_backend("reference")
    assert isinstance(backend, VyreBackend) and isinstance(backend.executor, ReferenceExecutor)
    assert acquire_backend("reference") is backend
    caps = backend.capabilities()
    assert caps.features == frozenset({"grid_sync"})  # lockstep: grid barriers are exact
    assert "stmt.grid_barrier" in backend.supported_ops()
    assert caps.max_workgroup_lanes == 1024


def test_resident_buffers_round_trip_and_update_in_place() -> None:
    backend = reference_backend()
    acc = backend.alloc(DType.U32, 64, label="acc")
    x = backend.upload(np.arange(64, dtype=U))
    assert backend.executor.resident_count == 2
    for _ in range(3):
        outputs = backend.dispatch_sync(_accumulate(), [x, acc])
    assert backend.download(acc).tolist() == [3 * i for i in range(64)]
    assert outputs[0].tolist() == [3 * i for i in range(64)]
    backend.free(acc)
    backend.free(x)
    assert backend.executor.resident_count == 0
    with pytest.raises(InvalidProgram, match="was freed"):
        backend.download(acc)
    with pytest.raises(InvalidProgram, match="was freed"):
        backend.free(acc)


def test_resident_inputs_are_checked() -> None:
    backend = reference_backend()
    floats = backend.upload(np.zeros(64, np.float32))
    ints = backend.upload(np.zeros(64, U))
    with pytest.raises(InvalidProgram, match="holds f32") as info:
        backend.dispatch(_accumulate(), [floats, ints])
    assert "Fix:" in str(info.value)
    other = reference_backend()
    foreign = other.upload(np.zeros(64, U))  # same backend id, another instance
    with pytest.raises(InvalidProgram, match="another instance") as info:
        backend.dispatch(_accumulate(), [foreign, ints])
    assert "Fix:" in str(info.value)
    for refused in (backend.download, backend.free):
        with pytest.raises(InvalidProgram, match="another instance"):
            refused(foreign)
    with pytest.raises(InvalidProgram, match="dtype complex128"):
        backend.upload(np.zeros(4, complex))
    with pytest.raises(InvalidProgram, match="multiple of 4"):
        backend.upload(b"abc")
    assert backend.upload(b"\x01\x00\x00\x00").count == 1
    with pytest.raises(InvalidProgram, match="int >= 0"):
        backend.alloc("u32", -1)


def test_tiny_dispatches_run_inline_and_large_ones_on_the_pool() -> None:
    backend = reference_backend()
    tiny = backend.dispatch(elementwise_xor(64), [np.ones(64, U)] * 2)
    assert tiny.done()  # ran inside dispatch()
    big_n = 1 << 18
    big = backend.dispatch(elementwise_xor(big_n), [np.ones(big_n, U)] * 2)
    assert big.result()[0].size == big_n
    assert any(t.name.startswith("vyre-reference") for t in threading.enumerate())
    no_inline = reference_backend(inline_ns=0)
    assert no_inline.dispatch(elementwise_xor(64), [np.ones(64, U)] * 2).result()[0][0] == 0


def test_runtime_loop_bounds_never_run_inline() -> None:
    backend = reference_backend()
    program = Program(
        [
            BufferDecl("n", 0, Access.UNIFORM, DType.U32, 1),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 1),
        ],
        1,
        [
            Let("a", u32(0)),
            Loop("i", u32(0), Load("n", u32(0)), [Assign("a", Var("a") + 1)]),
            Store("out", 0, Var("a")),
        ],
    )
    pending = backend.dispatch(program, [np.array([200_000], U)], DispatchConfig(timeout=5))
    assert not pending.done()  # the event loop would have been blocked otherwise
    assert pending.result()[0][0] == 200_000


def test_engine_failures_become_dispatch_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    import vyre_reference.backend as module
    from vyre_async import DispatchFailed

    def broken(*args: object, **kwargs: object) -> list[np.ndarray]:
        raise ValueError("boom")

    monkeypatch.setattr(module, "run_plan", broken)
    with pytest.raises(DispatchFailed, match="boom") as info:
        reference_backend().dispatch_sync(histogram(), [np.zeros(8, U), np.zeros(256, U)])
    assert "ValueError" in str(info.value)


@pytest.mark.anyio
async def test_shutdown_after_flush_keeps_results_then_refuses_more() -> None:
    backend = reference_backend(inline_ns=0)
    async with backend:
        pending = backend.dispatch(elementwise_xor(4096), [np.ones(4096, U)] * 2)
        await backend.flush()
        assert pending.done()
    assert (await pending)[0].tolist() == [0] * 4096  # finished before the close: kept
    with pytest.raises(BackendClosed):
        backend.dispatch(elementwise_xor(64), [np.ones(64, U)] * 2)
    assert backend.executor.in_flight == 0


def test_resident_buffers_of_another_instance_cannot_lose_updates() -> None:
    """0.1.0 accepted a buffer made by another instance: 100 increments gave 63."""
    first, second = reference_backend(inline_ns=0), reference_backend(inline_ns=0)
    acc = first.upload(np.zeros(64, U))
    ones = np.ones(64, U)
    pendings = []
    for i in range(100):
        owner = first if i % 2 == 0 else second
        try:
            pendings.append(owner.dispatch(_accumulate(), [ones, acc]))
        except InvalidProgram as exc:
            assert owner is second and "another instance" in str(exc)
    for pending in pendings:
        pending.result()
    assert len(pendings) == 50
    assert first.download(acc).tolist() == [50] * 64  # every accepted increment, in order


def test_a_done_callback_may_download_what_its_dispatch_wrote() -> None:
    """The buffer is released to later users before callbacks run: no self-deadlock."""
    from tests.contract.test_contract import resident_order_programs

    backend = reference_backend(inline_ns=0)
    slow_add, _, _ = resident_order_programs(64)
    x = backend.upload(np.arange(64, dtype=np.uint32))
    backend.compile(slow_add)
    seen: list[tuple[str, list[int]]] = []
    gate = threading.Event()

    def callback(_pending: object) -> None:
        seen.append((threading.current_thread().name, backend.download(x)[:3].tolist()))
        gate.set()

    pending = backend.dispatch(slow_add, [x, np.array([20000], np.uint32)])
    pending.add_done_callback(callback)
    assert gate.wait(timeout=30), "the callback's download never returned"
    assert seen[0][0] == "vyre-callbacks"  # never on the worker that must finish the work
    assert seen[0][1] == [1, 2, 3]
    assert pending.result()[0][:3].tolist() == [1, 2, 3]
    backend.free(x)


def _empty_loop(trips: int) -> Program:
    """A literal-bound loop with an empty body: 0.1.0 estimated it as free and ran it inline."""
    return Program(
        [BufferDecl("out", 0, Access.WRITE, DType.U32, 1)],
        1,
        [Loop("i", u32(0), u32(trips), []), Store("out", 0, u32(7))],
        op_id="test.empty_loop",
    )


def test_an_empty_literal_loop_never_runs_inline() -> None:
    """2**21 empty iterations blocked dispatch() (the event loop) for 1.2 s on 0.1.0."""
    backend = reference_backend()
    pending = backend.dispatch(_empty_loop(1 << 21), [])
    assert not pending.done()  # ~1 s of engine time: inline, it would be done already
    assert backend.executor.in_flight == 1
    # Stopped rather than waited for (the engine checks for a stop on every iteration):
    # the wait cost 8 s per surviving mutant under mutation testing.
    pending.stop_requested.set()
    with pytest.raises(DispatchTimeout, match="its stop was requested"):
        pending.result(timeout=60)
    shorter = backend.dispatch(_empty_loop(1 << 12), [])  # 4 ms by the estimate: a worker's
    assert shorter.result(timeout=60)[0].tolist() == [7]


def _deep(depth: int) -> object:
    expr: object = gid()
    for _ in range(depth):
        expr = expr + expr  # type: ignore[operator]
    return expr


@pytest.mark.parametrize(
    ("body", "bounded"),
    [
        ([Loop("i", u32(0), u32(1 << 21), [])], False),  # the empty loop: 2 s of engine time
        ([Loop("i", u32(0), u32(1 << 12), [Loop("j", u32(0), u32(1 << 12), [])])], False),
        ([Store("out", gid(), _deep(12))], False),  # one statement, 8191 expression nodes
        ([Store("out", gid(), u32(1))], True),
        ([Loop("i", u32(0), u32(3), [Store("out", gid(), Var("i"))])], True),
    ],
)
def test_the_inline_estimate_counts_iterations_and_expressions(
    body: list[object], bounded: bool
) -> None:
    from vyre_reference.backend import HANDOFF_NS, _static_cost

    fixed_ns, _, _ = _static_cost(tuple(body))  # type: ignore[arg-type]
    assert (fixed_ns < HANDOFF_NS) is bounded


def test_host_memory_running_out_is_device_out_of_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import vyre_reference.backend as module
    from vyre_async import DeviceOutOfMemory

    def exhausted(*args: object, **kwargs: object) -> list[np.ndarray]:
        raise MemoryError

    monkeypatch.setattr(module, "run_plan", exhausted)
    with pytest.raises(DeviceOutOfMemory) as info:
        reference_backend().dispatch_sync(histogram(), [np.zeros(8, U), np.zeros(256, U)])
    assert "Fix:" in str(info.value) and "bug" not in str(info.value)


def test_sizes_over_the_largest_buffer_fail_before_anything_is_allocated() -> None:
    """alloc(2**40) and 2**31-element broadcast inputs raised a raw MemoryError on 0.1.0."""
    backend = reference_backend()
    limit = backend.capabilities().max_storage_buffer_bytes
    with pytest.raises(InvalidProgram, match="largest buffer"):
        backend.alloc("u32", 2**40)
    with pytest.raises(InvalidProgram, match="largest buffer"):
        backend.alloc("u32", limit // 4 + 1)
    huge = np.broadcast_to(np.uint32(1), (2**31,))  # 8 GiB once copied; no memory yet
    with pytest.raises(InvalidProgram, match="largest buffer"):
        backend.dispatch(elementwise_xor(2**31), [huge, huge])
    with pytest.raises(InvalidProgram, match="largest buffer"):
        backend.upload(huge)
    big_output = Program(
        [BufferDecl("out", 0, Access.WRITE, DType.U32, 2**31)], 64, [Store("out", gid(), u32(1))]
    )
    with pytest.raises(InvalidProgram, match="largest buffer"):
        backend.dispatch(big_output, [])


def test_a_done_callback_may_download_after_its_dispatch_failed() -> None:
    """fail() ran callbacks before the buffer's done event was set: download() hung."""
    from tests.contract.test_contract import resident_order_programs

    backend = reference_backend(inline_ns=0)
    slow_add, triple, _ = resident_order_programs(64)
    x = backend.upload(np.arange(64, dtype=np.uint32))
    seen: list[list[int]] = []
    finished = threading.Event()

    def callback(_pending: object) -> None:
        seen.append(backend.download(x).tolist())
        finished.set()

    first = backend.dispatch(slow_add, [x, np.array([30_000], U)])  # ~0.1 s: past 0.01 s
    second = backend.dispatch(triple, [x], DispatchConfig(timeout=0.01))
    second.add_done_callback(callback)
    assert finished.wait(30), "the done-callback of a failed dispatch blocked on its own buffer"
    with pytest.raises(DispatchTimeout):
        second.result()
    assert first.result(timeout=30)[0].tolist() == [i + 1 for i in range(64)]
    assert len(seen) == 1 and backend.executor.in_flight == 0


@pytest.mark.anyio
async def test_a_callback_raising_system_exit_neither_hangs_awaiters_nor_kills_the_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reported: list[type[BaseException]] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: reported.append(args.exc_type))
    backend = reference_backend(inline_ns=0, max_workers=1)
    a = np.ones(64, U)
    pending = backend.dispatch(elementwise_xor(64), [a, a])
    pending.add_done_callback(lambda _: sys.exit(3))
    with anyio.fail_after(30):
        assert (await pending)[0].tolist() == [0] * 64
        again = await backend.dispatch(elementwise_xor(64), [a, np.zeros(64, U)])
    assert again[0].tolist() == [1] * 64  # the only worker survived
    assert wait_for_callbacks(10)  # (callbacks run on the callback thread, after the wake-up)
    assert SystemExit in reported
    await backend.aclose()


def test_unclosed_backends_do_not_leak_worker_threads() -> None:
    def workers() -> int:
        return sum(t.name.startswith("vyre-reference") for t in threading.enumerate())

    before = workers()
    for _ in range(10):
        backend = reference_backend(inline_ns=0)
        backend.dispatch_sync(elementwise_xor(64), [np.ones(64, U)] * 2)
        del backend
    gc.collect()
    deadline = time.monotonic() + 10
    while workers() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert workers() <= before


def test_a_worker_that_cannot_start_is_a_dispatch_failed_and_leaves_no_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vyre_async import DispatchFailed

    backend = reference_backend(inline_ns=0)

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patch:
        patch.setattr(threading.Thread, "start", refuse)
        with pytest.raises(DispatchFailed, match="worker thread") as info:
            backend.dispatch(elementwise_xor(64), [np.ones(64, U)] * 2)
    assert "Fix:" in str(info.value) and backend.executor.in_flight == 0
    out = backend.dispatch_sync(elementwise_xor(64), [np.ones(64, U), np.zeros(64, U)])
    assert out[0].tolist() == [1] * 64  # threads start again once they can


def test_the_inline_estimate_counts_bytes() -> None:
    """Big resident copies or WORKGROUP buffers over a small grid ran inline for ms."""
    backend = reference_backend()
    big = backend.upload(np.zeros(1 << 22, U))  # 16 MiB copied in and written back
    pending = backend.dispatch(_accumulate(), [big, big], DispatchConfig(grid_override=1))
    assert not pending.done() and backend.executor.in_flight == 1
    pending.result(timeout=60)
    shared = Program(
        [
            BufferDecl("tile", 0, Access.WORKGROUP, DType.U32, 12 * 1024),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 1),
        ],
        1,
        [Store("tile", u32(0), u32(1))],
        op_id="test.shared_tiles",
    )  # 4000 workgroups x 48 KiB zero-filled: ~200 MB of memory traffic
    pending = backend.dispatch(shared, [], DispatchConfig(grid_override=4000))
    assert not pending.done()
    pending.result(timeout=60)


@pytest.mark.anyio
async def test_aclose_in_a_cancelled_scope_still_releases_everything() -> None:
    backend = reference_backend(inline_ns=0)
    pending = backend.dispatch(_empty_loop(1 << 24), [])
    with anyio.CancelScope() as scope:
        scope.cancel()
        await backend.aclose()
    assert backend.closed and backend.executor.in_flight == 0
    with pytest.raises(BackendClosed):
        pending.result(timeout=30)
