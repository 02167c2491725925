"""Fusion of arm-graph layers: a layer's independent arms as one launch, exact outputs, spans
and the report saying which layers fused and why (or why not)."""

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

from tests.helpers import backend_of
from tests.policies.kernels import binop
from tests.policies.test_graph import (
    INLINE,
    ORACLE,
    THREADED,
    RecordingBackend,
    graphs,
    sequential,
    xor_graph,
)
from vyre_async import (
    BackendClosed,
    Calibration,
    DispatchConfig,
    InvalidArgument,
    InvalidProgram,
    KernelCompileFailed,
    PendingDispatch,
    VyreBackend,
)
from vyre_async import _calibration as calibration
from vyre_async._capabilities import BackendCapabilities
from vyre_async._fusion import FusionRequest, group_verdict
from vyre_async._graph import ArmGraph, GraphResult, Residency
from vyre_async._pipeline import Launch
from vyre_reference import reference_backend

N = 64


@pytest.fixture
def backend() -> Iterator[VyreBackend]:
    b = backend_of(RecordingBackend, inline_ns=0)
    yield b
    anyio.run(b.shutdown)


def _calibrate(backend: VyreBackend, gain_bps: int | None, overlap_bps: int | None = None) -> None:
    record = Calibration(
        backend_id=backend.id,
        backend_version=backend.version,
        device_fingerprint=backend.device_fingerprint(),
        launch_ns=50_000,
        compile_ns=1_000,
        concurrent_overlap_bps=overlap_bps,
        fusion_gain_bps=gain_bps,
    )
    with calibration.store._memo_lock:
        calibration.store._memo[backend] = record


def _spy_members(backend: VyreBackend) -> list[PendingDispatch]:
    """Keep every arm's own `PendingDispatch` of the fused layers (`dispatch_group`)."""
    members: list[PendingDispatch] = []
    front = backend.front
    real = front.dispatch_group

    def spy(*args: Any, **kwargs: Any) -> tuple[list[PendingDispatch], list[str]]:
        pendings, fallbacks = real(*args, **kwargs)
        members.extend(pendings)
        return pendings, fallbacks

    front.dispatch_group = spy  # type: ignore[method-assign]
    return members


def _check_xor(result: GraphResult, init: dict[str, np.ndarray]) -> None:
    x, y, z = init["x"], init["y"], init["z"]
    p, q, s = x ^ y, y ^ z, x ^ z
    expected = {"p": p, "q": q, "r": p ^ q, "s": s, "x": p ^ q ^ s, "y": y, "z": z}
    for name, value in expected.items():
        assert np.array_equal(result.outputs[name], value), name


@pytest.mark.anyio
@pytest.mark.parametrize("residency", ["auto", "host"])
async def test_forced_fusion_runs_each_layer_as_one_launch(
    backend: VyreBackend, residency: Residency
) -> None:
    members = _spy_members(backend)
    graph, init = xor_graph()  # layers [0, 1, 3], [2], [4]
    result = await graph.run(backend, residency=residency, fusion="force")
    _check_xor(result, init)
    report = result.report
    assert len(backend.executor.launched) == 3  # one per layer, not five
    verdict = report.fusion[0]
    assert verdict is not None
    assert (verdict.kind, verdict.reason, verdict.groups) == ("fuse", "requested", ((0, 1, 2),))
    assert report.fusion[1:] == (None, None)  # layers of one arm
    assert "fused into 1 launch (requested)" in report.describe()
    assert len(members) == 3
    for index, pending in enumerate(members):
        attributes = pending.record.attributes or {}
        assert attributes["vyre.policy.fusion"] == "fuse"
        assert attributes["vyre.fusion.index"] == index
        assert attributes["vyre.arm.index"] == report.layers[0][index]
        assert attributes["vyre.policy.arm.layer"] == 0
    assert [arm.wall_s is not None for arm in report.arms] == [True] * 5
    assert backend.executor.resident_count == 0


@pytest.mark.anyio
async def test_disabled_and_uncalibrated_fusion_keep_arms_separate_and_say_why(
    backend: VyreBackend,
) -> None:
    graph, init = xor_graph()
    for mode, reason in (("auto", "uncalibrated"), ("disable", "disabled")):
        backend.executor.launched.clear()
        result = await graph.run(backend, fusion=mode)
        _check_xor(result, init)
        verdict = result.report.fusion[0]
        assert verdict is not None and (verdict.kind, verdict.reason) == ("separate", reason)
        assert len(backend.executor.launched) == 5
        by_arm = {a["vyre.arm.index"]: a for a in backend.executor.attributes()}
        assert by_arm[0]["vyre.policy.fusion"] == "separate"
        assert by_arm[0]["vyre.policy.fusion.reason"] == reason
        assert "vyre.policy.fusion" not in by_arm[2]  # a layer of one arm: no verdict
        assert "fused into" not in result.report.describe()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("gain_bps", "kind", "reason"),
    [
        (2_000, "fuse", "cheaper"),
        (-500, "separate", "not_worth_it"),
        (0, "separate", "not_worth_it"),
    ],
)
async def test_the_calibrated_gain_decides(
    backend: VyreBackend, gain_bps: int, kind: str, reason: str
) -> None:
    _calibrate(backend, gain_bps)
    graph, init = xor_graph()
    result = await graph.run(backend, residency="host")
    _check_xor(result, init)
    verdict = result.report.fusion[0]
    assert verdict is not None and (verdict.kind, verdict.reason) == (kind, reason)
    assert len(backend.executor.launched) == (3 if kind == "fuse" else 5)


@pytest.mark.anyio
async def test_a_layer_run_in_order_still_fuses() -> None:
    backend = backend_of(RecordingBackend, inline_ns=0, max_workers=2)
    try:
        _calibrate(backend, 3_000, overlap_bps=-3_000)  # the concurrency policy: in order
        graph, init = xor_graph()
        result = await graph.run(backend)
        assert result.report.concurrency[0].kind == "in_order"
        verdict = result.report.fusion[0]
        assert verdict is not None and verdict.kind == "fuse"
        assert len(backend.executor.launched) == 3
        # submitted together in one launch: the report says so, not "in order"
        assert result.report.arms[0].concurrent_with == (1, 3)
        assert result.report.layers_in_order == 0
        _check_xor(result, init)
        apart = await graph.run(backend, fusion="disable")
        assert apart.report.layers_in_order == 1
        assert apart.report.arms[0].concurrent_with == ()
    finally:
        await backend.shutdown()


def _two_arm_graph(first: DispatchConfig | None, second: DispatchConfig | None) -> ArmGraph:
    graph = ArmGraph()
    for name in ("a", "b", "o1", "o2"):
        graph.resource(name, "u32", N, initial=np.arange(N, dtype=np.uint32) * 7)
    graph.arm(binop("xor", N), {"a": "a", "b": "b", "out": "o1"}, config=first)
    graph.arm(binop("add", N), {"a": "a", "b": "b", "out": "o2"}, config=second)
    return graph


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("first", "second", "reason"),
    [
        (DispatchConfig(label="one"), DispatchConfig(label="two"), "requested"),
        (None, DispatchConfig(timeout=5.0), "config_mismatch"),
        (
            DispatchConfig(workgroup_override=32),
            DispatchConfig(workgroup_override=32),
            "workgroup_override",
        ),
    ],
)
async def test_arm_configs_must_agree_apart_from_labels(
    backend: VyreBackend,
    first: DispatchConfig | None,
    second: DispatchConfig | None,
    reason: str,
) -> None:
    graph = _two_arm_graph(first, second)
    result = await graph.run(backend, fusion="force")
    verdict = result.report.fusion[0]
    assert verdict is not None and verdict.reason == reason
    a = np.arange(N, dtype=np.uint32) * 7
    assert np.array_equal(result.outputs["o1"], a ^ a)
    assert np.array_equal(result.outputs["o2"], a + a)


@pytest.mark.anyio
async def test_a_bad_fusion_mode_is_refused_before_anything_runs(backend: VyreBackend) -> None:
    graph, _ = xor_graph()
    with pytest.raises(InvalidArgument, match="fusion must be one of") as info:
        await graph.run(backend, fusion="always")
    assert 'Fix: pass fusion="auto"' in str(info.value)
    assert backend.executor.launched == []


class Refusing(RecordingBackend):
    """Refuses to enqueue the launches `refuses` names (by default: fused ones)."""

    def refuses(self, launch: Launch) -> bool:
        return (launch.plan.program.op_id or "").startswith("fused")

    def enqueue(self, launch: Launch) -> None:
        if self.refuses(launch):
            raise BackendClosed("refused here", backend_id=self.id)
        super().enqueue(launch)


class Watching(Refusing):
    """Notes, at each resident buffer freed, whether every fused launch had ended."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fused: list[PendingDispatch] = []
        self.frees: list[bool] = []

    def enqueue(self, launch: Launch) -> None:
        super().enqueue(launch)
        if (launch.plan.program.op_id or "").startswith("fused"):
            self.fused.append(launch.pending)

    def free(self, handle: Any) -> None:
        self.frees.append(all(p.done() for p in self.fused))
        super().free(handle)


@pytest.mark.anyio
async def test_a_fused_launch_that_cannot_start_fails_the_run_and_frees_everything() -> None:
    backend = backend_of(Refusing, inline_ns=0)
    try:
        graph, _ = xor_graph()
        for residency in ("host", "auto"):
            with pytest.raises(BackendClosed, match="refused here") as info:
                await graph.run(backend, residency=residency, fusion="force")
            assert "in arm 'p' (index 0, layer 0) of graph xor" in str(info.value.__notes__)
            if residency == "host":  # host joins: no later layer starts
                assert backend.executor.launched == []
            assert backend.executor.resident_count == 0
        graph2, init = xor_graph()
        _check_xor(await graph2.run(backend, fusion="disable"), init)  # still usable
    finally:
        await backend.shutdown()


@pytest.mark.anyio
@pytest.mark.parametrize("residency", ["auto", "host"])
async def test_an_enqueue_failing_partway_waits_for_the_launch_that_started(
    residency: Residency,
) -> None:
    # Seven storage bindings: xor arms take three each, the member table one, so the
    # layer of three fuses as groups (0, 1) and (2,); the lone arm's enqueue is refused.
    class Limited(Watching):
        def refuses(self, launch: Launch) -> bool:  # arm 3, alone in its group
            return (launch.pending.record.attributes or {}).get("vyre.arm.index") == 3

        def capabilities(self) -> BackendCapabilities:
            return dataclasses.replace(super().capabilities(), max_storage_buffers=7)

    backend = backend_of(Limited, inline_ns=0)
    try:
        members = _spy_members(backend)
        graph, _ = xor_graph()
        with pytest.raises(BackendClosed, match="refused here") as info:
            await graph.run(backend, residency=residency, fusion="force")
        assert "in arm 's' (index 3, layer 0)" in str(info.value.__notes__)
        verdict = backend.executor.launched and members
        assert verdict and len(members) == 3
        # the fused launch of arms 0 and 1 ran and settled with its own outputs
        assert [p.exception() is None for p in members] == [True, True, False]
        assert len(backend.executor.fused) == 1
        if residency == "auto":  # no resident buffer was freed under the running launch
            assert backend.executor.frees and all(backend.executor.frees)
        assert backend.executor.resident_count == 0
    finally:
        await backend.shutdown()


@pytest.mark.anyio
async def test_a_fused_program_that_cannot_be_built_runs_the_arms_alone_and_says_so() -> None:
    class NoFused(RecordingBackend):
        def build_pipeline(self, program: Any, config: DispatchConfig) -> Any:
            if (program.op_id or "").startswith("fused"):
                raise KernelCompileFailed("no fused kernels here", fix="none")
            return super().build_pipeline(program, config)

    backend = backend_of(NoFused, inline_ns=0)
    try:
        graph, init = xor_graph()
        result = await graph.run(backend, fusion="force")
        _check_xor(result, init)
        report = result.report
        assert report.fusion_fallback == ("KernelCompileFailed", None, None)
        assert len(backend.executor.launched) == 5
        text = report.describe()
        assert "fusion fell back to separate launches (KernelCompileFailed)" in text
        assert "fused into" not in text
        by_arm = {a["vyre.arm.index"]: a for a in backend.executor.attributes()}
        assert by_arm[0]["vyre.policy.fusion.fallback"] == "KernelCompileFailed"
    finally:
        await backend.shutdown()


@pytest.mark.anyio
async def test_an_arm_that_cannot_be_planned_launches_nothing_of_its_layer(
    backend: VyreBackend,
) -> None:
    huge = DispatchConfig(grid_override=(1 << 25, 1, 1))  # more lanes than the engine holds
    graph = _two_arm_graph(huge, huge)
    with pytest.raises(InvalidProgram, match="lanes"):
        await graph.run(backend, residency="host", fusion="force")
    assert backend.executor.launched == []


@pytest.mark.anyio
async def test_a_closed_backend_refuses_a_fused_layer_before_compiling() -> None:
    class Counting(RecordingBackend):
        builds = 0

        def build_pipeline(self, program: Any, config: DispatchConfig) -> Any:
            Counting.builds += 1
            return super().build_pipeline(program, config)

    backend = backend_of(Counting, inline_ns=0)
    graph, _ = xor_graph()
    await backend.aclose()
    with pytest.raises(BackendClosed):
        await graph.run(backend, residency="host", fusion="force")
    assert Counting.builds == 0


def test_the_policy_sees_what_each_arm_reads_and_writes() -> None:
    backend = reference_backend(prefetch=False)
    program, config = binop("xor", N), DispatchConfig()

    def verdict(second_reads: set[str]) -> tuple[str, str]:
        v = group_verdict(
            backend.front,
            [program, program],
            [config, config],
            [frozenset({"a", "b"}), frozenset(second_reads)],
            [frozenset({"p"}), frozenset({"q"})],
            FusionRequest("force", None, 0, 0),
        )
        return v.kind, v.reason

    assert verdict({"a", "p"}) == ("separate", "conflict")  # reads what the first writes
    assert verdict({"a", "b"}) == ("fuse", "requested")  # shared reads are fine


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.sampled_from(["threaded", "inline"]), st.sampled_from(["auto", "host"]))
def test_fused_graphs_equal_sequential_execution(
    graph: ArmGraph, where: str, residency: Residency
) -> None:
    backend = THREADED if where == "threaded" else INLINE
    run = functools.partial(graph.run, backend, residency=residency, fusion="force")
    result: GraphResult = anyio.run(run)
    expected = sequential(ORACLE, graph)
    for name, value in expected.items():
        assert np.array_equal(result.outputs[name], value), name
    for number, layer in enumerate(result.report.layers):
        verdict = result.report.fusion[number]
        assert (verdict is None) == (len(layer) == 1)
    assert backend.executor.resident_count == 0
