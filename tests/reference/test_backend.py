"""The reference backend on the driver contract: resident buffers, scheduling, lifecycle."""

from __future__ import annotations

import threading

import anyio
import anyio.lowlevel
import numpy as np
import pytest

from vyre_async import DispatchConfig, InvalidProgram, acquire_backend
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
from vyre_reference import ReferenceBackend

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
    assert isinstance(backend, ReferenceBackend)
    assert acquire_backend("reference") is backend
    caps = backend.capabilities()
    assert caps.features == frozenset()  # nothing native is claimed
    assert caps.max_workgroup_lanes == 1024


def test_resident_buffers_round_trip_and_update_in_place() -> None:
    backend = ReferenceBackend()
    acc = backend.alloc(DType.U32, 64, label="acc")
    x = backend.upload(np.arange(64, dtype=U))
    assert backend.resident_count == 2
    for _ in range(3):
        outputs = backend.dispatch_sync(_accumulate(), [x, acc])
    assert backend.download(acc).tolist() == [3 * i for i in range(64)]
    assert outputs[0].tolist() == [3 * i for i in range(64)]
    backend.free(acc)
    backend.free(x)
    assert backend.resident_count == 0
    with pytest.raises(InvalidProgram, match="was freed"):
        backend.download(acc)
    with pytest.raises(InvalidProgram, match="was freed"):
        backend.free(acc)


def test_resident_inputs_are_checked() -> None:
    backend = ReferenceBackend()
    floats = backend.upload(np.zeros(64, np.float32))
    ints = backend.upload(np.zeros(64, U))
    with pytest.raises(InvalidProgram, match="holds f32") as info:
        backend.dispatch(_accumulate(), [floats, ints])
    assert "Fix:" in str(info.value)
    other = ReferenceBackend()
    foreign = other.upload(np.zeros(64, U))
    foreign.backend_id = "bytes-test"  # as if made by another backend
    with pytest.raises(InvalidProgram, match="belongs to backend"):
        backend.dispatch(_accumulate(), [foreign, ints])
    with pytest.raises(InvalidProgram, match="dtype complex128"):
        backend.upload(np.zeros(4, complex))
    with pytest.raises(InvalidProgram, match="multiple of 4"):
        backend.upload(b"abc")
    assert backend.upload(b"\x01\x00\x00\x00").count == 1
    with pytest.raises(InvalidProgram, match="count >= 0"):
        backend.alloc("u32", -1)


def test_tiny_dispatches_run_inline_and_large_ones_on_the_pool() -> None:
    backend = ReferenceBackend()
    tiny = backend.dispatch(elementwise_xor(64), [np.ones(64, U)] * 2)
    assert tiny.done()  # ran inside dispatch()
    big_n = 1 << 18
    big = backend.dispatch(elementwise_xor(big_n), [np.ones(big_n, U)] * 2)
    assert big.result()[0].size == big_n
    assert any(t.name.startswith("vyre-reference") for t in threading.enumerate())
    no_inline = ReferenceBackend(inline_ns=0)
    assert no_inline.dispatch(elementwise_xor(64), [np.ones(64, U)] * 2).result()[0][0] == 0


def test_runtime_loop_bounds_never_run_inline() -> None:
    backend = ReferenceBackend()
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
        ReferenceBackend().dispatch_sync(histogram(), [np.zeros(8, U), np.zeros(256, U)])
    assert "ValueError" in str(info.value)


@pytest.mark.anyio
async def test_shutdown_finishes_work_then_refuses_more() -> None:
    backend = ReferenceBackend(inline_ns=0)
    async with backend:
        pending = backend.dispatch(elementwise_xor(4096), [np.ones(4096, U)] * 2)
        await backend.flush()
        assert pending.done()
    with pytest.raises(InvalidProgram, match="shut down"):
        backend.dispatch(elementwise_xor(64), [np.ones(64, U)] * 2)
    await anyio.lowlevel.checkpoint()


def test_a_done_callback_may_download_what_its_dispatch_wrote() -> None:
    """The buffer is released to later users before callbacks run: no self-deadlock."""
    from tests.contract.test_contract import resident_order_programs

    backend = ReferenceBackend(inline_ns=0)
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
    assert seen[0][0].startswith("vyre-reference")  # ran on the worker that wrote x
    assert seen[0][1] == [1, 2, 3]
    assert pending.result()[0][:3].tolist() == [1, 2, 3]
    backend.free(x)
