"""What the reference backend reports and decides before it runs anything (issue 28).

Found by mutation testing: no test read these.

- The launch-cost estimate decides where a dispatch runs: one estimated below
  ``inline_ns`` runs inline, on the caller's thread, the others on the worker
  pool. So the estimate is observable exactly: a dispatch estimated at ``e`` ns
  runs inline with ``inline_ns=floor(e) + 1`` and on the pool with
  ``inline_ns=floor(e)``. The tests check it against the documented cost model
  (per statement, expression node, loop iteration, lane-step, atomic lane and
  byte copied or zero-filled; the module's constants, by name) for every kind
  of statement the estimate walks.
- ``capabilities()``, ``calibrate()`` (measured on a private probe backend, on
  fresh compiles, without scoring its dispatches as prefetch predictions), the
  constructor's argument errors, resident buffer labels and ownership, and a
  dispatch run inline that passes its timeout.
"""

from __future__ import annotations

import gc
import threading
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio
import numpy as np
import pytest

import vyre_reference
import vyre_reference.backend as backend_module
from tests import otel_sdk
from vyre_async import DispatchConfig, DispatchTimeout, InvalidProgram
from vyre_async._backend import VyreBackend
from vyre_async._plan import plan_dispatch
from vyre_async.ir import (
    Access,
    Assign,
    Atomic,
    Block,
    BufferDecl,
    DType,
    If,
    Let,
    Load,
    Loop,
    Program,
    Stmt,
    Store,
    Var,
    gid,
    lid,
    u32,
)
from vyre_async.ir.limits import MAX_WORKGROUP_BYTES, MAX_WORKGROUP_LANES
from vyre_reference import cache_clear, cache_info, reference_backend

S = backend_module._STMT_NS
X = backend_module._EXPR_NS
ITER = backend_module._ITERATION_NS
LANE = backend_module._LANE_STMT_NS
ATOM = backend_module._ATOMIC_LANE_NS
BYTE = backend_module._BYTE_NS
HANDOFF_NS = backend_module.HANDOFF_NS

N = 128  # lanes: two workgroups of 64
_X = BufferDecl("x", 0, Access.READ, DType.U32)
_ACC = BufferDecl("acc", 1, Access.READ_WRITE, DType.U32, 1)
_OUT = BufferDecl("out", 2, Access.WRITE, DType.U32, N)
_SHARED = BufferDecl("sh", 3, Access.WORKGROUP, DType.U32, 256)


def _bump() -> Stmt:
    """``old = atomicAdd(acc[0], 1)``: 3 expression nodes, one of them an atomic."""
    return Let("old", Atomic("add", "acc", u32(0), u32(1)))


@dataclass(frozen=True)
class _Case:
    """A program and its cost by the model: per launch ``fixed`` ns, and per lane
    ``steps`` lane-steps (statements and expression nodes) and ``atomics`` atomics."""

    buffers: Sequence[BufferDecl]
    body: Sequence[Stmt]
    fixed: float
    steps: float
    atomics: float
    shared_bytes: int = 0


CASES = {
    # let v = x[gid] (2 nodes); out[gid] = v + 1 (gid, v, 1, +: 4 nodes)
    "straight": _Case(
        [_X, _OUT],
        [Let("v", Load("x", gid())), Store("out", gid(), Var("v") + u32(1))],
        fixed=2 * S + 6 * X,
        steps=2 + 6,
        atomics=0,
    ),
    # the atomic (3 nodes), then out[gid] = old (2 nodes) with no atomic
    "atomic": _Case(
        [_ACC, _OUT],
        [_bump(), Store("out", gid(), Var("old"))],
        fixed=2 * S + 5 * X,
        steps=2 + 5,
        atomics=1,
    ),
    # both branches count: the If (cond: 3 nodes), then the atomic case, else a store (2)
    "if": _Case(
        [_ACC, _OUT],
        [
            If(
                gid().lt(u32(64)),
                [_bump(), Store("out", gid(), Var("old"))],
                [Store("out", gid(), u32(7))],
            )
        ],
        fixed=(S + 3 * X) + (2 * S + 5 * X) + (S + 2 * X),
        steps=(1 + 3) + (2 + 5) + (1 + 2),
        atomics=1,
    ),
    # a Block (no nodes of its own) around the atomic case
    "block": _Case(
        [_ACC, _OUT],
        [Block([_bump(), Store("out", gid(), Var("old"))])],
        fixed=S + (2 * S + 5 * X),
        steps=1 + (2 + 5),
        atomics=1,
    ),
    # the atomic, then 3 trips over out[gid] = i + old (4 nodes; the Loop's bounds: 2
    # nodes), then a loop whose end is below its start: no trips, only its bounds
    "loops": _Case(
        [_ACC, _OUT],
        [
            _bump(),
            Loop("i", u32(2), u32(5), [Store("out", gid(), Var("i") + Var("old"))]),
            Loop("j", u32(4), u32(1), [Store("out", gid(), u32(9))]),
        ],
        fixed=(S + 3 * X) + (S + 2 * X) + 3 * (ITER + S + 4 * X) + (S + 2 * X),
        steps=(1 + 3) + (1 + 2) + 3 * (1 + 1 + 4) + (1 + 2),
        atomics=1,
    ),
    # an atomic inside a literal loop counts once per trip: the Loop (its bounds: 2 nodes),
    # then 3 trips over the atomic (3 nodes, one of them the atomic)
    "atomic loop": _Case(
        [_ACC, _OUT],
        [Loop("i", u32(0), u32(3), [_bump()]), Store("out", gid(), u32(1))],
        fixed=(S + 2 * X) + 3 * (ITER + S + 3 * X) + (S + 2 * X),
        steps=(1 + 2) + 3 * (1 + 1 + 3) + (1 + 2),
        atomics=3,
    ),
    # every workgroup zero-fills its 256-word WORKGROUP buffer (3 nodes per store)
    "shared": _Case(
        [_X, _OUT, _SHARED],
        [Store("sh", lid(), Load("x", gid())), Store("out", gid(), Load("sh", lid()))],
        fixed=2 * S + 6 * X,
        steps=2 + 6,
        atomics=0,
        shared_bytes=4 * 256,
    ),
}


def _inputs(program: Program) -> list[np.ndarray]:
    return [np.arange(N if d.name == "x" else 1, dtype=np.uint32) for d in program.inputs]


def _model_ns(case: _Case, program: Program, inputs: list[np.ndarray]) -> float:
    """The documented cost model for one launch of ``program`` on ``inputs``."""
    plan = plan_dispatch(program, [a.size for a in inputs])
    geometry = plan.geometry
    per_lane = case.steps * LANE + case.atomics * ATOM
    launch = case.fixed + geometry.lanes * per_lane + geometry.workgroups * case.shared_bytes * BYTE
    return (plan.bytes_in + plan.bytes_out) * BYTE + launch


def _runs_inline(
    monkeypatch: pytest.MonkeyPatch, program: Program, inputs: list[np.ndarray], inline_ns: int
) -> bool:
    """Dispatch on a fresh backend; return whether the engine ran on this thread."""
    threads: list[threading.Thread] = []

    def spy(*args: object, **kwargs: object) -> object:
        threads.append(threading.current_thread())
        return vyre_reference.run_plan(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(backend_module, "run_plan", spy)
    backend = reference_backend(inline_ns=inline_ns, prefetch=False)
    try:
        backend.dispatch(program, inputs).result(timeout=30)
    finally:
        anyio.run(backend.aclose)
        monkeypatch.setattr(backend_module, "run_plan", vyre_reference.run_plan)
    assert len(threads) == 1
    return threads[0] is threading.current_thread()


@pytest.mark.parametrize("name", CASES)
def test_a_dispatch_runs_inline_exactly_when_the_cost_model_is_below_inline_ns(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    case = CASES[name]
    program = Program(case.buffers, 64, case.body, op_id=f"test.cost.{name}")
    inputs = _inputs(program)
    floor = int(_model_ns(case, program, inputs))
    assert floor > 0
    assert _runs_inline(monkeypatch, program, inputs, floor + 1)
    assert not _runs_inline(monkeypatch, program, inputs, floor)


def test_a_dispatch_run_inline_still_stops_at_its_timeout() -> None:
    # A literal loop of 2**24 trips, run inline because inline_ns allows it: the
    # engine stops at its next safe point after the deadline.
    program = Program(
        [BufferDecl("out", 0, Access.WRITE, DType.U32, 1)],
        1,
        [
            Let("acc", u32(0)),
            Loop("i", u32(0), u32(1 << 24), [Assign("acc", Var("acc") + Var("i"))]),
            Store("out", u32(0), Var("acc")),
        ],
        op_id="test.inline_runaway",
    )
    backend = reference_backend(inline_ns=10**18, prefetch=False)
    pending = backend.dispatch(program, [], DispatchConfig(timeout=0.2))
    assert pending.done()  # it ran inside dispatch()
    with pytest.raises(DispatchTimeout, match=r"did not finish within its timeout of 0\.2 s"):
        pending.result()


def test_capabilities_report_the_engine_limits() -> None:
    caps = reference_backend().capabilities()
    assert caps.max_workgroup_size == (MAX_WORKGROUP_LANES, MAX_WORKGROUP_LANES, 64)
    assert caps.max_workgroup_lanes == MAX_WORKGROUP_LANES
    assert caps.max_storage_buffer_bytes == (1 << 32) - 4
    assert caps.max_workgroup_memory_bytes == MAX_WORKGROUP_BYTES
    assert caps.device_name == "numpy reference (CPU)"
    assert caps.ordered_resident_buffers is True


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"max_workers": 0},
            "max_workers must be an int >= 1, got 0\nFix: pass e.g. max_workers=2",
        ),
        (
            {"inline_ns": -1},
            f"inline_ns must be an int >= 0, got -1\nFix: pass e.g. inline_ns={HANDOFF_NS}",
        ),
    ],
)
def test_out_of_range_arguments_are_named_with_a_valid_example(
    kwargs: dict[str, int], message: str
) -> None:
    with pytest.raises(InvalidProgram) as info:
        reference_backend(**kwargs)
    assert str(info.value) == message


def test_two_workers_by_default() -> None:
    assert reference_backend().executor.max_workers == 2
    assert reference_backend().executor.inline_ns == HANDOFF_NS


@pytest.mark.parametrize(
    "make",
    [
        lambda b: b.upload(np.zeros(4, np.uint32), label="weights"),
        lambda b: b.alloc("u32", 4, label="weights"),
    ],
    ids=["upload", "alloc"],
)
def test_a_resident_buffer_keeps_its_label(make: Callable[[VyreBackend], object]) -> None:
    buffer = make(reference_backend())
    assert buffer.label == "weights"  # type: ignore[attr-defined]
    assert "'weights'" in repr(buffer)


def test_the_backend_owns_its_resident_buffers_until_they_are_freed() -> None:
    """Dropping the handle frees nothing: the backend still holds (and counts) the buffer."""
    backend = reference_backend()
    data = np.zeros(1 << 18, np.uint32)  # 1 MiB
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        backend.upload(data)  # the handle is dropped at once
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert backend.executor.resident_count == 1
    assert held >= data.nbytes


def test_calibrate_measures_fresh_compiles_on_a_probe() -> None:
    backend = reference_backend()
    cache_clear()
    record = backend.calibrate()
    assert (record.backend_id, record.backend_version, record.device_fingerprint) == (
        "reference",
        backend.version,
        backend.device_fingerprint(),
    )
    assert record.timing == "host"
    measured = (record.launch_ns, record.compile_ns, record.h2d_bytes_per_s, record.d2h_bytes_per_s)
    assert all(value is not None and value > 0 for value in measured), measured
    # no graph replay and no persistent kernels: not measured
    assert (record.record_ns, record.replay_ns) == (None, None)
    assert (record.persistent_setup_ns, record.persistent_item_ns) == (None, None)
    # the launch probe and three programs the engine had not seen: each timed compile
    # is a real one, not a lookup in the compile cache
    assert cache_info()["misses"] >= 4
    assert (
        backend.executor.resident_count == 0 and backend.executor.in_flight == 0
    )  # the probe did the work


_COUNTED = ("vyre.dispatch.count", "vyre.prefetch.hits", "vyre.prefetch.misses")


def _calibration_counts() -> dict[str, int]:
    """Telemetry's dispatch and prefetch counts for calibrate()'s launch probe, by metric."""
    _, reader = otel_sdk.install()
    found: dict[str, int] = {}
    data = reader.get_metrics_data()
    for resource in [] if data is None else data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name not in _COUNTED:
                    continue
                for point in metric.data.data_points:
                    if (point.attributes or {}).get("vyre.program.op_id") == "calibrate.launch":
                        count = int(getattr(point, "value", 0))
                        found[metric.name] = found.get(metric.name, 0) + count
    return found


def test_calibrate_does_not_count_its_probe_dispatches_as_prefetch_predictions() -> None:
    before = _calibration_counts()
    reference_backend().calibrate()
    after = _calibration_counts()
    added = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert added.get("vyre.dispatch.count", 0) >= 65  # telemetry saw the probe's dispatches
    assert "vyre.prefetch.hits" not in added and "vyre.prefetch.misses" not in added


def test_a_second_calibrate_also_measures_fresh_compiles() -> None:
    # (it named its probe programs cal.0 .. cal.2 on every call: a second calibrate() in
    # one process timed compile-cache hits, a compile_ns about 10 times too low)
    backend = reference_backend()
    backend.calibrate()
    misses = cache_info()["misses"]
    backend.calibrate()
    assert cache_info()["misses"] - misses >= 3
