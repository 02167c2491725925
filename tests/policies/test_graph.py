"""Arm graphs on the reference backend: building, layering, running, reporting, failing."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from typing import Any

import anyio
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.driver.fakes import DelayBackend
from tests.helpers import backend_of
from tests.policies.kernels import accumulate, atomic_sum, binop, rotate
from vyre_async import (
    DispatchConfig,
    DispatchTimeout,
    InvalidProgram,
    PendingDispatch,
    UnsupportedFeature,
    VyreBackend,
)
from vyre_async._capabilities import BackendCapabilities
from vyre_async._graph import ArmGraph, GraphResult, Residency, summarize_arm
from vyre_async._pipeline import Launch
from vyre_async._resident import ResidentBuffer
from vyre_async.abc import Executor
from vyre_async.ir import Access, Atomic, BufferDecl, DType, Let, Load, Program
from vyre_async.ir import u32 as c32
from vyre_async.policies import ArmSummary
from vyre_async.programs import saxpy
from vyre_reference import ReferenceExecutor, reference_backend

N = 64
RNG = np.random.default_rng(7)


class RecordingBackend(ReferenceExecutor):
    """Keeps every pending dispatch so tests can read its span attributes."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.launched: list[PendingDispatch] = []

    def enqueue(self, launch: Launch) -> None:
        self.launched.append(launch.pending)
        super().enqueue(launch)

    def attributes(self) -> list[dict[str, Any]]:
        return [dict(p.record.attributes or {}) for p in self.launched]


class HostOnlyBackend(RecordingBackend):
    """The reference engine without resident buffers (the contract's defaults)."""

    upload = Executor.upload
    alloc = Executor.alloc
    download = Executor.download
    free = Executor.free


def rand_u32(n: int = N) -> np.ndarray:
    return RNG.integers(0, 2**32, n, dtype=np.uint32)


def xor_graph() -> tuple[ArmGraph, dict[str, np.ndarray]]:
    """p = x^y, q = y^z, r = p^q, s = x^z, x = r^s: layers [0, 1, 3], [2], [4]."""
    graph = ArmGraph(label="xor")
    init = {name: rand_u32() for name in "xyz"}
    for name, data in init.items():
        graph.resource(name, "u32", N, initial=data)
    for name in "pqrs":
        graph.resource(name, DType.U32, N)
    x = binop("xor", N)
    graph.arm(x, {"a": "x", "b": "y", "out": "p"}, label="p")
    graph.arm(x, {"a": "y", "b": "z", "out": "q"}, label="q")
    graph.arm(x, {"a": "p", "b": "q", "out": "r"}, label="r")
    graph.arm(x, {"a": "x", "b": "z", "out": "s"}, label="s")
    graph.arm(x, {"a": "r", "b": "s", "out": "x"}, label="x")
    return graph, init


@pytest.fixture
def backend() -> Iterator[VyreBackend]:
    b = backend_of(RecordingBackend, inline_ns=0)
    yield b
    anyio.run(b.shutdown)


# Summaries ----------------------------------------------------------------------------


def test_summary_follows_the_binding_plan() -> None:
    program = saxpy(N)  # x, y READ; alpha UNIFORM; out WRITE
    summary = summarize_arm(program, {"x": "X", "y": "Y", "alpha": "A", "out": "O"})
    assert summary == ArmSummary({"X", "Y", "A"}, {"O"})
    assert summarize_arm(accumulate(), {"x": "X", "y": "Y"}) == ArmSummary({"X", "Y"}, {"X"})


def test_atomic_targets_count_as_reads_and_writes() -> None:
    # A WRITE buffer that is an atomic target is read too (the atomic reads the old word).
    program = Program(
        [
            BufferDecl("a", 0, Access.READ, DType.U32),
            BufferDecl("hits", 1, Access.WRITE, DType.U32, 4),
        ],
        64,
        [Let("old", Atomic("add", "hits", c32(0), Load("a", c32(0))))],
    )
    assert summarize_arm(program, {"a": "A", "hits": "H"}) == ArmSummary({"A", "H"}, {"H"})
    assert summarize_arm(atomic_sum(), {"a": "A", "total": "T"}) == ArmSummary({"A", "T"}, {"T"})


# Building ------------------------------------------------------------------------------


def test_plan_without_a_backend() -> None:
    graph, _ = xor_graph()
    plan = graph.plan()
    assert plan.layers == ((0, 1, 3), (2,), (4,))
    assert plan.joins == 2
    assert [s.writes for s in graph.summaries()] == [{"p"}, {"q"}, {"r"}, {"s"}, {"x"}]
    assert graph.arms[2].label == "r" and graph.arms[2].resource_of("out") == "r"
    assert "5 arms" in repr(graph)


def test_default_labels() -> None:
    graph = ArmGraph()
    graph.resource("a", "u32", N)
    graph.resource("o", "u32", N)
    first = graph.arm(binop("xor", N), {"a": "a", "b": "a", "out": "o"})
    unnamed = Program(binop("xor", N).buffers, 64, binop("xor", N).body)
    second = graph.arm(unnamed, {"a": "a", "b": "a", "out": "o"})
    assert (first, second) == (0, 1)
    assert [arm.label for arm in graph.arms] == ["test.xor", "arm1"]


@pytest.mark.parametrize(
    ("bindings", "match"),
    [
        ({"a": "x", "b": "y", "out": "o", "zz": "x"}, "no such"),
        ({"a": "x", "b": "nope", "out": "o"}, "undeclared"),
        ({"a": "x", "out": "o"}, "unbound"),
        ({"a": "x", "b": "f", "out": "o"}, "f32"),
        ({"a": "x", "b": "y", "out": "short"}, "count"),
        ({"a": "x", "b": "o", "out": "o"}, "written"),
    ],
)
def test_bad_bindings_are_rejected(bindings: dict[str, str], match: str) -> None:
    graph = ArmGraph()
    for name in ("x", "y", "o"):
        graph.resource(name, "u32", N)
    graph.resource("f", "f32", N)
    graph.resource("short", "u32", N - 1)
    with pytest.raises(InvalidProgram, match=match) as info:
        graph.arm(binop("xor", N), bindings)
    assert "Fix:" in str(info.value)
    assert graph.arms == ()


def test_read_only_aliasing_is_allowed() -> None:
    graph = ArmGraph()
    graph.resource("x", "u32", N)
    graph.resource("o", "u32", N)
    graph.arm(binop("xor", N), {"a": "x", "b": "x", "out": "o"})
    with pytest.raises(InvalidProgram, match="written"):
        graph.arm(accumulate(), {"x": "x", "y": "x"})


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("", "u32", 4), "non-empty"),
        (("x", "u64", 4), "dtype"),
        (("x", "u32", 0), "count"),
        (("x", "u32", True), "count"),
        (("x", "u32", 4, np.zeros(5, np.uint32)), "count=4"),
        (("x", "u32", 4, np.zeros(4, np.float32)), "dtype"),
    ],
)
def test_bad_resources_are_rejected(args: tuple[Any, ...], match: str) -> None:
    graph = ArmGraph()
    with pytest.raises(InvalidProgram, match=match):
        graph.resource(*args)


def test_other_building_errors() -> None:
    graph = ArmGraph()
    graph.resource("x", "u32", N)
    with pytest.raises(InvalidProgram, match="twice"):
        graph.resource("x", "u32", N)
    with pytest.raises(InvalidProgram, match="Program"):
        graph.arm("not a program", {})  # type: ignore[arg-type]
    with pytest.raises(InvalidProgram, match="map"):
        graph.arm(binop("xor", N), [("a", "x")])  # type: ignore[arg-type]
    with pytest.raises(InvalidProgram, match="DispatchConfig"):
        graph.arm(binop("xor", N), {}, config={"timeout": 1})  # type: ignore[arg-type]
    with pytest.raises(InvalidProgram):
        ArmGraph(label=3)  # type: ignore[arg-type]


def test_initial_contents_are_private_copies() -> None:
    data = np.arange(4, dtype=np.uint32)
    graph = ArmGraph()
    graph.resource("x", "u32", 4, initial=data)
    data[:] = 9
    resource = graph.resources["x"]
    assert resource.initial is not None and resource.initial.tolist() == [0, 1, 2, 3]
    assert not resource.initial.flags.writeable
    graph.resource("b", "u32", 2, initial=np.array([1, 2], np.uint32).tobytes())
    assert graph.resources["b"].contents().tolist() == [1, 2]


# Running --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_run_matches_the_arithmetic_and_reports_layers(backend: VyreBackend) -> None:
    graph, init = xor_graph()
    result = await graph.run(backend, outputs=["p", "r", "x"])
    x, y, z = init["x"], init["y"], init["z"]
    assert np.array_equal(result.outputs["p"], x ^ y)
    assert np.array_equal(result.outputs["r"], x ^ z)
    assert np.array_equal(result.outputs["x"], np.zeros(N, np.uint32))  # (x^z) ^ (x^z)
    report = result.report
    assert report.layers == ((0, 1, 3), (2,), (4,))
    assert report.joins == 2
    assert report.residency == "resident"
    assert report.backend_id == "reference"
    assert [a.layer for a in report.arms] == [0, 0, 1, 0, 2]
    assert report.arms[0].concurrent_with == (1, 3)
    assert (report.arms[2].waits_for, report.arms[2].reason) == (0, "read_after_write")
    assert (report.arms[4].waits_for, report.arms[4].reason) == (2, "read_after_write")
    assert {(c.earlier, c.reason) for c in report.arms[4].conflicts} == {
        (0, "write_after_read"),
        (2, "read_after_write"),
        (3, "read_after_write"),
    }
    assert all(a.wall_s is not None and a.wall_s > 0 for a in report.arms)
    assert len(report.layer_wall_s) == 3 and report.wall_s >= sum(report.layer_wall_s) * 0.99
    assert report.execution.mode.kind == "plain"
    assert report.execution.mode.reason == "unsupported_by_backend"
    text = report.describe()
    assert "layer 0" in text and "concurrent" in text and "read_after_write" in text
    assert backend.executor.resident_count == 0  # every uploaded resource was freed


@pytest.mark.anyio
async def test_every_arm_span_gets_its_layer_and_reason(backend: VyreBackend) -> None:
    graph, _ = xor_graph()
    await graph.run(backend)
    attrs = backend.executor.attributes()
    assert [a["vyre.arm.index"] for a in attrs] == [0, 1, 3, 2, 4]  # layer by layer
    by_arm = {a["vyre.arm.index"]: a for a in attrs}
    assert [by_arm[i]["vyre.policy.arm.layer"] for i in range(5)] == [0, 0, 1, 0, 2]
    assert "vyre.policy.arm.reason" not in by_arm[0]
    assert by_arm[2]["vyre.policy.arm.reason"] == "read_after_write"
    assert by_arm[2]["vyre.policy.arm.after"] == 0
    assert by_arm[0]["vyre.policy.arm.concurrent"] is True
    assert by_arm[4]["vyre.policy.arm.concurrent"] is False
    assert by_arm[1]["vyre.arm.label"] == "q" and by_arm[1]["vyre.graph.label"] == "xor"
    assert by_arm[1]["vyre.policy.execution_mode"] == "plain"
    assert by_arm[1]["vyre.policy.execution_mode.reason"] == "unsupported_by_backend"


@pytest.mark.anyio
async def test_inline_arms_keep_their_span_attributes() -> None:
    """Tiny arms run inside dispatch(): attributes must be in place before that."""
    backend = backend_of(RecordingBackend)  # default inline threshold: 64-lane xors run inline
    graph, _ = xor_graph()
    await graph.run(backend)
    assert all(p.done() for p in backend.executor.launched)
    assert [a["vyre.policy.arm.layer"] for a in backend.executor.attributes()] == [0, 0, 0, 1, 2]


@pytest.mark.anyio
async def test_layer_arms_are_all_in_flight_together() -> None:
    """The three layer-0 arms are dispatched before any of them is awaited."""
    backend = backend_of(DelayBackend, delay=0.05)
    try:
        graph, _ = xor_graph()
        result = await graph.run(backend, residency="host")
        report = result.report
        assert report.residency == "host"
        assert all(arm.stream == 1 for arm in report.arms)  # DelayBackend reports stream 1
        # One worker, 50 ms each: the layer takes ~3 x 50 ms, every arm ~queued together.
        first = [report.arms[i] for i in report.layers[0]]
        assert all(arm.wall_s is not None for arm in first)
        walls = sorted(arm.wall_s or 0 for arm in first)
        assert walls[-1] > 2.5 * 0.05  # the last waited behind the others: all were queued
    finally:
        await backend.aclose()


@pytest.mark.anyio
async def test_independent_arms_overlap_on_worker_threads() -> None:
    """On the reference backend the layer's arms run on its worker threads concurrently."""
    backend = reference_backend(inline_ns=0, max_workers=2)
    graph = ArmGraph()
    big = 1 << 18
    for name in ("a", "b", "c", "d", "o1", "o2"):
        graph.resource(name, "u32", big)
    graph.arm(binop("mul3", big), {"a": "a", "b": "b", "out": "o1"})
    graph.arm(binop("mul3", big), {"a": "c", "b": "d", "out": "o2"})
    result = await graph.run(backend)
    assert result.report.layers == ((0, 1),)
    assert result.report.arms[0].concurrent_with == (1,)
    await backend.shutdown()


class SpyBackend(ReferenceExecutor):
    """Notes, at each dispatch, which earlier dispatches had already finished."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.launched: list[PendingDispatch] = []
        self.done_before: list[list[bool]] = []

    def enqueue(self, launch: Launch) -> None:
        self.done_before.append([p.done() for p in self.launched])
        self.launched.append(launch.pending)
        super().enqueue(launch)


def _spin_add(n: int) -> Program:
    """``out[i] = a[i] + 1`` after a run-time spin of ``spins[0]`` steps (a slow arm)."""
    from vyre_async.ir import Assign, Loop, Store, Var, gid

    return Program(
        [
            BufferDecl("a", 0, Access.READ, DType.U32, n),
            BufferDecl("spins", 1, Access.UNIFORM, DType.U32, 1),
            BufferDecl("out", 2, Access.WRITE, DType.U32, n),
        ],
        n,
        [
            Let("acc", c32(0)),
            Loop("k", c32(0), Load("spins", 0), [Assign("acc", Var("acc") + Var("k"))]),
            Store("out", gid(), Load("a", gid()) + c32(1)),
        ],
        op_id="test.spin_add",
    )


@pytest.mark.anyio
async def test_device_joins_submit_every_arm_before_the_first_finishes() -> None:
    """Resident resources: no host join between layers; the backend orders the arms."""
    backend = backend_of(SpyBackend, inline_ns=0, max_workers=2)
    graph = ArmGraph(label="device")
    x, y = rand_u32(), rand_u32()
    graph.resource("x", "u32", N, initial=x)
    graph.resource("y", "u32", N, initial=y)
    # ~50 ms of engine time: far longer than submitting the other three arms, even on a
    # loaded CI machine (3000 spins once lost that race under load)
    graph.resource("spins", "u32", 1, initial=np.array([50_000], np.uint32))
    for name in ("slow", "w", "z"):
        graph.resource(name, "u32", N)
    xor = binop("xor", N)
    graph.arm(_spin_add(N), {"a": "x", "spins": "spins", "out": "slow"}, label="slow")
    graph.arm(xor, {"a": "x", "b": "y", "out": "w"}, label="w")
    graph.arm(xor, {"a": "slow", "b": "y", "out": "z"}, label="z")  # after slow
    graph.arm(xor, {"a": "z", "b": "w", "out": "x"}, label="x")  # after z, w; x read before
    await graph.run(backend)  # compiles every arm: compiling would otherwise take longest
    backend.executor.launched.clear()
    backend.executor.done_before.clear()
    result = await graph.run(backend)
    report = result.report
    assert report.layers == ((0, 1), (2,), (3,))
    assert report.joins_on == "device" and report.host_join_reason is None
    # the last layer was dispatched while the first layer's slow arm still ran
    assert backend.executor.done_before[3][0] is False
    slow = x + np.uint32(1)
    assert result.outputs["slow"].tolist() == slow.tolist()
    assert result.outputs["w"].tolist() == (x ^ y).tolist()
    assert result.outputs["z"].tolist() == (slow ^ y).tolist()
    assert result.outputs["x"].tolist() == ((slow ^ y) ^ (x ^ y)).tolist()
    # layer walls run from one layer's last completion to the next's
    assert len(report.layer_wall_s) == 3
    assert sum(report.layer_wall_s) <= report.wall_s * 1.01
    assert "3 layers, 2 joins on the device" in report.describe()
    await backend.shutdown()


@pytest.mark.anyio
async def test_host_joins_and_their_reasons(backend: VyreBackend) -> None:
    graph, _ = xor_graph()
    hosted = await graph.run(backend, residency="host")
    assert (hosted.report.joins_on, hosted.report.host_join_reason) == ("host", "host_residency")
    assert "joins on the host (host_residency)" in hosted.report.describe()
    no_resident = backend_of(HostOnlyBackend, inline_ns=0)
    fallback = await graph.run(no_resident)
    assert fallback.report.host_join_reason == "host_residency"
    await no_resident.shutdown()

    class Unordered(RecordingBackend):  # resident buffers, no ordering promise
        def capabilities(self) -> BackendCapabilities:
            return dataclasses.replace(super().capabilities(), ordered_resident_buffers=False)

    unordered = backend_of(Unordered, inline_ns=0)
    awaited = await graph.run(unordered)
    assert (awaited.report.residency, awaited.report.host_join_reason) == (
        "resident",
        "unordered_resident_buffers",
    )
    await unordered.shutdown()
    flags = ArmGraph()
    flags.resource("a", "bool", 4)
    flags.resource("b", "bool", 4)
    flags.arm(
        Program(
            [
                BufferDecl("a", 0, Access.READ, DType.BOOL, 4),
                BufferDecl("b", 1, Access.WRITE, DType.BOOL, 4),
            ],
            4,
            [],
        ),
        {"a": "a", "b": "b"},
    )
    written = await flags.run(backend)
    assert written.report.host_join_reason == "bool_resource_written"


@pytest.mark.anyio
async def test_values_replace_initial_contents_and_outputs_are_copies(
    backend: VyreBackend,
) -> None:
    graph = ArmGraph()
    graph.resource("x", "u32", N, initial=np.ones(N, np.uint32))
    graph.resource("y", "u32", N, initial=np.ones(N, np.uint32))
    graph.arm(accumulate(), {"x": "x", "y": "y"})
    graph.arm(accumulate(), {"x": "x", "y": "y"})
    first = await graph.run(backend, outputs=["x"])
    assert first.outputs["x"].tolist() == [13] * N  # (1*3+1)*3+1
    again = await graph.run(backend, outputs=["x", "y"], values={"x": np.zeros(N, np.uint32)})
    assert again.outputs["x"].tolist() == [4] * N
    assert again.outputs["y"].tolist() == [1] * N
    again.outputs["y"][:] = 7  # the caller owns the arrays
    third = await graph.run(backend, outputs=["y"])
    assert third.outputs["y"].tolist() == [1] * N
    assert [first.report.submission, again.report.submission, third.report.submission] == [1, 2, 3]
    assert third.report.execution.repeats == 3


@pytest.mark.anyio
async def test_changing_the_graph_restarts_the_submission_count(backend: VyreBackend) -> None:
    graph, _ = xor_graph()
    assert (await graph.run(backend, outputs=[])).report.submission == 1
    assert (await graph.run(backend, outputs=[])).report.submission == 2
    graph.resource("extra", "u32", N)
    assert (await graph.run(backend, outputs=[])).report.submission == 1


@pytest.mark.anyio
async def test_run_argument_errors(backend: VyreBackend) -> None:
    graph, _ = xor_graph()
    with pytest.raises(InvalidProgram, match="not a resource"):
        await graph.run(backend, outputs=["nope"])
    with pytest.raises(InvalidProgram, match="not a resource"):
        await graph.run(backend, values={"nope": np.zeros(N, np.uint32)})
    with pytest.raises(InvalidProgram, match="count"):
        await graph.run(backend, values={"x": np.zeros(3, np.uint32)})
    with pytest.raises(InvalidProgram, match="residency"):
        await graph.run(backend, residency="device")  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_empty_graph_returns_the_initial_contents(backend: VyreBackend) -> None:
    graph = ArmGraph()
    graph.resource("x", "u32", 3, initial=np.array([1, 2, 3], np.uint32))
    result = await graph.run(backend)
    assert result.outputs["x"].tolist() == [1, 2, 3]
    assert result.report.layers == () and result.report.joins == 0


# Residency ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_backend_without_resident_buffers_uses_graph_owned_host_arrays() -> None:
    backend = backend_of(HostOnlyBackend, inline_ns=0)
    graph, init = xor_graph()
    result = await graph.run(backend, outputs=["r"])
    assert result.report.residency == "host"
    assert np.array_equal(result.outputs["r"], init["x"] ^ init["z"])
    with pytest.raises(UnsupportedFeature):
        await graph.run(backend, residency="resident")
    await backend.shutdown()


@pytest.mark.anyio
async def test_host_residency_on_request(backend: VyreBackend) -> None:
    graph, init = xor_graph()
    result = await graph.run(backend, outputs=["s"], residency="host")
    assert result.report.residency == "host"
    assert np.array_equal(result.outputs["s"], init["x"] ^ init["z"])
    assert backend.executor.resident_count == 0


@pytest.mark.anyio
async def test_resident_inputs_are_passed_as_resident_buffers() -> None:
    seen: list[type] = []

    class Spy(ReferenceExecutor):
        def enqueue(self, launch: Launch) -> None:
            seen.extend(type(item) for item in launch.inputs)
            super().enqueue(launch)

    graph, _ = xor_graph()
    await graph.run(backend_of(Spy))
    assert seen and all(kind is ResidentBuffer for kind in seen)


@pytest.mark.anyio
async def test_bool_resources_stay_host_arrays(backend: VyreBackend) -> None:
    from vyre_async.ir import BufLen, If, Let, Load, Store, Var, gid

    i = Var("i")
    negate = Program(
        [
            BufferDecl("a", 0, Access.READ, DType.BOOL),
            BufferDecl("out", 1, Access.WRITE, DType.BOOL, 4),
        ],
        4,
        [
            Let("i", gid()),
            If(i.lt(BufLen("out")), [Store("out", i, Load("a", i).land(Load("a", 0)))]),
        ],
    )
    graph = ArmGraph()
    graph.resource("flags", "bool", 4, initial=np.array([1, 0, 1, 0], np.uint32))
    graph.resource("out", "bool", 4)
    graph.arm(negate, {"a": "flags", "out": "out"})
    result = await graph.run(backend, outputs=["out"])
    assert result.outputs["out"].tolist() == [1, 0, 1, 0]  # a[i] and a[0]


# Failures and cancellation ----------------------------------------------------------------


@pytest.mark.anyio
async def test_a_failing_arm_names_itself_and_releases_resources() -> None:
    class Flaky(ReferenceExecutor):
        def enqueue(self, launch: Launch) -> None:
            if launch.plan.program.op_id == "test.or":
                launch.completer.fail(RuntimeError("boom"))
                return
            super().enqueue(launch)

    backend = backend_of(Flaky, inline_ns=0)
    graph = ArmGraph(label="flaky")
    for name in ("a", "b", "o1", "o2"):
        graph.resource(name, "u32", N)
    graph.arm(binop("xor", N), {"a": "a", "b": "b", "out": "o1"}, label="good")
    graph.arm(binop("or", N), {"a": "a", "b": "b", "out": "o2"}, label="bad")
    with pytest.raises(Exception, match="boom") as info:
        await graph.run(backend)
    assert any("'bad'" in note for note in getattr(info.value, "__notes__", []))
    assert backend.executor.resident_count == 0
    await backend.shutdown()


@pytest.mark.anyio
async def test_dispatch_rejections_propagate(backend: VyreBackend) -> None:
    graph = ArmGraph()
    graph.resource("a", "u32", N)
    graph.resource("o", "u32", N)
    graph.arm(
        binop("xor", N),
        {"a": "a", "b": "a", "out": "o"},
        config=DispatchConfig(persistent_thread="force"),  # the reference has no such path
    )
    with pytest.raises(UnsupportedFeature):
        await graph.run(backend)
    assert backend.executor.resident_count == 0


@pytest.mark.anyio
async def test_timeouts_surface_as_dispatch_timeout() -> None:
    backend = reference_backend(inline_ns=0)
    graph = ArmGraph()
    big = 1 << 20
    for name in ("a", "b", "o"):
        graph.resource(name, "u32", big)
    graph.arm(
        binop("mul3", big), {"a": "a", "b": "b", "out": "o"}, config=DispatchConfig(timeout=1e-6)
    )
    with pytest.raises(DispatchTimeout):
        await graph.run(backend)
    assert backend.executor.resident_count == 0
    await backend.shutdown()


@pytest.mark.anyio
async def test_cancellation_waits_for_running_arms_then_frees(backend: VyreBackend) -> None:
    graph = ArmGraph()
    big = 1 << 20
    for name in ("a", "b", "o1", "o2", "o3"):
        graph.resource(name, "u32", big)
    graph.arm(binop("mul3", big), {"a": "a", "b": "b", "out": "o1"})
    graph.arm(binop("mul3", big), {"a": "b", "b": "a", "out": "o2"})
    graph.arm(binop("mul3", big), {"a": "o1", "b": "o2", "out": "o3"})
    with anyio.move_on_after(0.001) as scope:
        await graph.run(backend)
    assert scope.cancelled_caught
    # The running arms finished before run() returned; then their buffers were freed.
    assert backend.executor.launched and all(p.done() for p in backend.executor.launched)
    assert backend.executor.resident_count == 0
    result = await graph.run(backend, outputs=["o3"])  # still usable
    assert result.outputs["o3"].shape == (big,)


# Property: the graph equals sequential execution ---------------------------------------------

TEMPLATES = ("xor", "or", "add", "mul3", "accumulate", "rotate", "atomic")
SIZES = (8, 64, 100)


def _program(kind: str, n: int) -> Program:
    if kind == "accumulate":
        return accumulate()
    if kind == "rotate":
        return rotate(n)
    if kind == "atomic":
        return atomic_sum()
    return binop(kind, n)


@st.composite
def graphs(draw: st.DrawFn) -> ArmGraph:
    n = draw(st.sampled_from(SIZES))
    names = [f"r{i}" for i in range(draw(st.integers(3, 5)))]
    graph = ArmGraph(label="random")
    for name in names:
        graph.resource(
            name,
            "u32",
            n,
            initial=np.array(
                draw(st.lists(st.integers(0, 2**32 - 1), min_size=n, max_size=n)), dtype=np.uint32
            ),
        )
    graph.resource("acc", "u32", 1)
    for _ in range(draw(st.integers(1, 7))):
        kind = draw(st.sampled_from(TEMPLATES))
        program = _program(kind, n)
        sized = [d for d in program.buffers if d.access is not Access.WORKGROUP]
        chosen = draw(st.permutations(names))
        bindings: dict[str, str] = {}
        for decl, resource in zip(sized, chosen, strict=False):
            bindings[decl.name] = "acc" if decl.count == 1 else resource
        if kind in ("xor", "or", "add", "mul3") and draw(st.booleans()):
            bindings["b"] = bindings["a"]  # read-only aliasing
        graph.arm(program, bindings)
    return graph


def sequential(backend: VyreBackend, graph: ArmGraph) -> dict[str, np.ndarray]:
    """The oracle: every arm in submission order, one at a time, host arrays."""
    state = {name: res.contents() for name, res in graph.resources.items()}
    for arm in graph.arms:
        inputs = [state[arm.resource_of(d.name)] for d in arm.program.inputs]
        outputs = backend.dispatch_sync(arm.program, inputs, arm.config)
        for decl, output in zip(arm.program.outputs, outputs, strict=True):
            state[arm.resource_of(decl.name)] = output
    return state


THREADED = reference_backend(inline_ns=0, max_workers=2)
INLINE = reference_backend()
ORACLE = reference_backend(prefetch=False)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.sampled_from(["threaded", "inline"]), st.sampled_from(["auto", "host"]))
def test_graph_equals_sequential_execution(
    graph: ArmGraph, where: str, residency: Residency
) -> None:
    backend = THREADED if where == "threaded" else INLINE
    run = functools.partial(graph.run, backend, residency=residency)
    result: GraphResult = anyio.run(run)
    expected = sequential(ORACLE, graph)
    assert result.outputs.keys() == expected.keys()
    for name, value in expected.items():
        assert np.array_equal(result.outputs[name], value), name
    layer_of = {i: n for n, layer in enumerate(result.report.layers) for i in layer}
    for arm in result.report.arms:
        for conflict in arm.conflicts:
            assert layer_of[conflict.earlier] < layer_of[conflict.later]
    assert backend.executor.resident_count == 0


# Arm concurrency verdicts -------------------------------------------------------------------


def _calibrated(
    backend: VyreBackend, overlap_bps: int | None, *, gain_bps: int | None = None
) -> VyreBackend:
    """Give ``backend`` a cached calibration with ``concurrent_overlap_bps`` (no measuring)."""
    from vyre_async import _calibration as calibration

    record = calibration.Calibration(
        backend_id=backend.id,
        backend_version=backend.version,
        device_fingerprint=backend.device_fingerprint(),
        launch_ns=50_000,
        concurrent_overlap_bps=overlap_bps,
        resident_gain_bps=gain_bps,
    )
    with calibration.store._memo_lock:
        calibration.store._memo[backend] = record
    return backend


@pytest.mark.anyio
@pytest.mark.parametrize("residency", ["auto", "host"])
async def test_no_overlap_runs_each_layer_in_order_and_says_why(residency: Residency) -> None:
    backend = backend_of(SpyBackend, inline_ns=0, max_workers=2)
    _calibrated(backend, -3_000)
    graph, init = xor_graph()  # layers [0, 1, 3], [2], [4]
    result = await graph.run(backend, residency=residency)
    report = result.report
    assert [v.kind for v in report.concurrency] == ["in_order", "in_order", "in_order"]
    assert [v.reason for v in report.concurrency] == ["no_overlap", "single_arm", "single_arm"]
    assert report.concurrency[0].savings_ns < 0 and report.concurrent_overlap_bps == -3_000
    # each arm of layer 0 finished before the next was dispatched
    spy = backend.executor
    assert spy.done_before[1] == [True] and spy.done_before[2] == [True, True]
    assert all(arm.concurrent_with == () for arm in report.arms)
    by_arm = {
        (p.record.attributes or {})["vyre.arm.index"]: p.record.attributes for p in spy.launched
    }
    assert by_arm[0]["vyre.policy.arm_concurrency"] == "in_order"
    assert by_arm[0]["vyre.policy.arm_concurrency.reason"] == "no_overlap"
    assert by_arm[2]["vyre.policy.arm_concurrency.reason"] == "single_arm"
    text = report.describe()
    assert "in order (no_overlap" in text and "arm overlap: -30 %" in text
    x, y, z = init["x"], init["y"], init["z"]
    assert np.array_equal(result.outputs["r"], x ^ z) and np.array_equal(result.outputs["q"], y ^ z)
    # the next run estimates work from this run's measured arm times
    again = await graph.run(backend, residency=residency)
    assert again.report.concurrency[0].reason == "no_overlap"
    await backend.shutdown()


@pytest.mark.anyio
async def test_overlap_that_pays_runs_the_layer_concurrently() -> None:
    backend = _calibrated(backend_of(DelayBackend, delay=0.05), 8_000)
    try:
        graph, _ = xor_graph()
        result = await graph.run(backend, residency="host")
        report = result.report
        assert (report.concurrency[0].kind, report.concurrency[0].reason) == (
            "concurrent",
            "overlap_pays",
        )
        assert report.concurrency[0].savings_ns > 0
        assert report.arms[0].concurrent_with == (1, 3)
        # all three were queued together: the last waited behind the other two
        walls = sorted(report.arms[i].wall_s or 0 for i in report.layers[0])
        assert walls[-1] > 2.5 * 0.05
        assert "concurrent (overlap_pays" in report.describe()
    finally:
        await backend.aclose()


@pytest.mark.anyio
async def test_uncalibrated_backends_keep_layers_concurrent(backend: VyreBackend) -> None:
    graph, _ = xor_graph()
    result = await graph.run(backend)
    assert result.report.concurrency[0].reason == "uncalibrated"
    assert result.report.concurrent_overlap_bps is None
    assert backend.executor.attributes()[0]["vyre.policy.arm_concurrency"] == "concurrent"


@pytest.mark.anyio
async def test_failing_in_order_arm_stops_the_layer() -> None:
    class Failing(SpyBackend):
        def enqueue(self, launch: Launch) -> None:
            if (launch.pending.record.attributes or {}).get("vyre.arm.index") == 1:
                raise UnsupportedFeature("arm 1 cannot run here", fix="none")
            super().enqueue(launch)

    backend = _calibrated(backend_of(Failing, inline_ns=0), 0)
    graph, _ = xor_graph()
    with pytest.raises(UnsupportedFeature):
        await graph.run(backend)
    assert len(backend.executor.launched) == 1  # arm 0 ran and settled; nothing after arm 1
    assert backend.executor.resident_count == 0
    await backend.shutdown()


# Residency verdicts ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_resident_buffers_measured_slower_make_auto_use_host_arrays_and_say_why() -> None:
    seen: list[type] = []

    class Spy(RecordingBackend):
        def enqueue(self, launch: Launch) -> None:
            seen.extend(type(item) for item in launch.inputs)
            super().enqueue(launch)

    backend = _calibrated(backend_of(Spy, inline_ns=0), None, gain_bps=-1_500)
    graph, init = xor_graph()
    result = await graph.run(backend)
    report = result.report
    assert (report.residency, report.residency_reason) == ("host", "resident_slower")
    assert report.residency_verdict is not None and report.residency_verdict.savings_ns < 0
    assert report.resident_gain_bps == -1_500
    assert (report.joins_on, report.host_join_reason) == ("host", "host_residency")
    assert seen and ResidentBuffer not in seen and backend.executor.resident_count == 0
    text = report.describe()
    assert "resources host (resident_slower)" in text and "resident gain: -15 %" in text
    x, y, z = init["x"], init["y"], init["z"]
    assert np.array_equal(result.outputs["r"], x ^ z) and np.array_equal(result.outputs["q"], y ^ z)
    # the caller's choice still wins
    forced = await graph.run(backend, residency="resident")
    assert (forced.report.residency, forced.report.residency_reason) == ("resident", "requested")
    assert forced.report.joins_on == "device"
    await backend.shutdown()


@pytest.mark.anyio
async def test_resident_buffers_that_pay_stay_resident() -> None:
    backend = _calibrated(backend_of(RecordingBackend, inline_ns=0), None, gain_bps=4_000)
    graph, _ = xor_graph()
    report = (await graph.run(backend)).report
    assert (report.residency, report.residency_reason) == ("resident", "resident_pays")
    assert report.joins_on == "device"
    assert report.residency_verdict is not None and report.residency_verdict.savings_ns > 0
    hosted = (await graph.run(backend, residency="host")).report
    assert (hosted.residency, hosted.residency_reason) == ("host", "requested")
    await backend.shutdown()


@pytest.mark.anyio
async def test_uncalibrated_and_unsupported_residency_reasons(backend: VyreBackend) -> None:
    graph, _ = xor_graph()
    report = (await graph.run(backend)).report
    assert (report.residency, report.residency_reason) == ("resident", "uncalibrated")
    assert report.resident_gain_bps is None and "resident gain: not calibrated" in report.describe()
    no_resident = backend_of(HostOnlyBackend, inline_ns=0)
    fallback = (await graph.run(no_resident)).report
    assert (fallback.residency, fallback.residency_reason) == ("host", "no_resident_buffers")
    await no_resident.shutdown()


@pytest.mark.anyio
async def test_a_backends_nan_or_negative_device_time_does_not_break_the_graph(
    backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vyre_async._pending import DispatchCompleter

    graph, init = xor_graph()
    resolve = DispatchCompleter.resolve
    for reported in (float("nan"), -1e-3, None):  # a third-party backend's bad clock
        if reported is not None:

            def bad_clock(
                self: Any, outputs: Any, *args: Any, value: float = reported, **kwargs: Any
            ) -> Any:
                kwargs["device_s"] = value
                return resolve(self, outputs, **kwargs)

            monkeypatch.setattr(DispatchCompleter, "resolve", bad_clock)
        else:
            monkeypatch.setattr(DispatchCompleter, "resolve", resolve)
        result = await graph.run(backend, outputs=["p"])  # and the runs after it still work
        assert np.array_equal(result.outputs["p"], init["x"] ^ init["y"])
