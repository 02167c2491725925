"""Fusion in ``dispatch_batch``: members keep their own results and spans, the verdict is
recorded, failures reach every member, and what cannot fuse runs separately."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import vyre_async._fusion as fusion_module
from vyre_async import (
    Calibration,
    DispatchConfig,
    DispatchFailed,
    InvalidArgument,
    VyreBackend,
)
from vyre_async.abc import Launch
from vyre_async.ir.ops import CORE_OPS
from vyre_async.programs import elementwise_xor, sum_reduction
from vyre_reference import ReferenceExecutor

N = 96


def _batch(count: int, seed: int = 0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        [rng.integers(0, 2**32, N, dtype=np.uint32), rng.integers(0, 2**32, N, dtype=np.uint32)]
        for _ in range(count)
    ]


def _results(pendings: list[Any]) -> list[list[np.ndarray]]:
    return [p.result() for p in pendings]


def _fusion_attributes(pending: Any) -> dict[str, Any]:
    attributes = pending.record.attributes or {}
    return {k: v for k, v in attributes.items() if "fusion" in k}


@pytest.fixture
def backend() -> Any:
    backend = VyreBackend(ReferenceExecutor(), prefetch=False)
    yield backend
    backend.dispatch_sync(elementwise_xor(4), [np.zeros(4, np.uint32)] * 2)  # still usable


def test_forced_fusion_gives_every_member_its_own_outputs(backend: VyreBackend) -> None:
    pipeline = backend.compile(elementwise_xor(N))
    batch = _batch(6)
    fused = pipeline.dispatch_batch(batch, fusion="force")
    for index, (pending, (a, b)) in enumerate(zip(fused, batch, strict=True)):
        (out,) = pending.result()
        assert np.array_equal(out, a ^ b)
        assert _fusion_attributes(pending) == {
            "vyre.policy.fusion": "fuse",
            "vyre.policy.fusion.reason": "requested",
            "vyre.policy.fusion.members": 6,
            "vyre.policy.fusion.launches": 1,
            "vyre.policy.fusion.savings_ns": 0,
            "vyre.fusion.index": index,
        }


def test_disabled_fusion_runs_one_launch_per_item_and_says_so(backend: VyreBackend) -> None:
    pipeline = backend.compile(elementwise_xor(N))
    pendings = pipeline.dispatch_batch(_batch(3), fusion="disable")
    _results(pendings)
    assert _fusion_attributes(pendings[0]) == {
        "vyre.policy.fusion": "separate",
        "vyre.policy.fusion.reason": "disabled",
        "vyre.policy.fusion.members": 3,
        "vyre.policy.fusion.launches": 3,
        "vyre.policy.fusion.savings_ns": 0,
    }


@pytest.mark.parametrize(
    ("gain", "kind", "reason"), [(4000, "fuse", "cheaper"), (-500, "separate", "not_worth_it")]
)
def test_auto_follows_the_calibrated_gain(
    backend: VyreBackend, monkeypatch: pytest.MonkeyPatch, gain: int, kind: str, reason: str
) -> None:
    record = Calibration(
        backend_id=backend.id,
        backend_version=backend.version,
        device_fingerprint=backend.device_fingerprint(),
        launch_ns=50_000,
        compile_ns=1_000,
        fusion_gain_bps=gain,
    )
    monkeypatch.setattr(fusion_module, "calibration_for", lambda _: record)
    pipeline = backend.compile(elementwise_xor(N))
    batch = _batch(8, seed=3)
    pendings = pipeline.dispatch_batch(batch)
    for pending, (a, b) in zip(pendings, batch, strict=True):
        assert np.array_equal(pending.result()[0], a ^ b)
    seen = _fusion_attributes(pendings[0])
    assert (seen["vyre.policy.fusion"], seen["vyre.policy.fusion.reason"]) == (kind, reason)


def test_without_a_calibration_auto_keeps_them_separate(
    backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fusion_module, "calibration_for", lambda _: None)
    pendings = backend.compile(elementwise_xor(N)).dispatch_batch(_batch(2))
    _results(pendings)
    assert _fusion_attributes(pendings[1])["vyre.policy.fusion.reason"] == "uncalibrated"


def test_an_unknown_fusion_mode_is_refused_before_anything_runs(backend: VyreBackend) -> None:
    pipeline = backend.compile(elementwise_xor(N))
    with pytest.raises(InvalidArgument, match="fusion must be one of") as info:
        pipeline.dispatch_batch(_batch(2), fusion="always")
    assert "Fix:" in str(info.value)


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (DispatchConfig(workgroup_override=(32, 1, 1)), "workgroup_override"),
        (DispatchConfig(cooperative=True), "cooperative"),
    ],
)
def test_configs_that_fix_the_launch_keep_members_separate(
    backend: VyreBackend, config: DispatchConfig, reason: str
) -> None:
    pendings = backend.compile(elementwise_xor(N), config).dispatch_batch(
        _batch(2), config, fusion="force"
    )
    _results(pendings)
    assert _fusion_attributes(pendings[0])["vyre.policy.fusion.reason"] == reason


def test_resident_inputs_keep_members_separate(backend: VyreBackend) -> None:
    a = backend.upload(np.arange(N, dtype=np.uint32))
    pendings = backend.compile(elementwise_xor(N)).dispatch_batch(
        [[a, np.ones(N, np.uint32)], [a, np.zeros(N, np.uint32)]], fusion="force"
    )
    assert pendings[1].result()[0].tolist() == list(range(N))
    assert _fusion_attributes(pendings[0])["vyre.policy.fusion.reason"] == "resident_inputs"
    backend.free(a)


class _FailsFused(ReferenceExecutor):
    id = "fails-fused"

    def enqueue(self, launch: Launch) -> None:
        if launch.plan.program.op_id.startswith("fused:"):
            launch.completer.fail(DispatchFailed("the fused launch broke", fix="none"))
            return
        super().enqueue(launch)


def test_a_failed_fused_launch_fails_every_member() -> None:
    backend = VyreBackend(_FailsFused(), prefetch=False)
    pendings = backend.compile(elementwise_xor(N)).dispatch_batch(_batch(3), fusion="force")
    for pending in pendings:
        with pytest.raises(DispatchFailed, match="the fused launch broke"):
            pending.result()


class _NoLogicalAnd(ReferenceExecutor):
    id = "no-land"

    def supported_ops(self) -> frozenset[str]:
        return CORE_OPS - {"bin.land"}  # the fused program selects its member with one


def test_a_fused_program_the_backend_cannot_build_falls_back_to_separate_launches() -> None:
    backend = VyreBackend(_NoLogicalAnd(), prefetch=False)
    batch = _batch(3, seed=9)
    pendings = backend.compile(elementwise_xor(N)).dispatch_batch(batch, fusion="force")
    for pending, (a, b) in zip(pendings, batch, strict=True):
        assert np.array_equal(pending.result()[0], a ^ b)
        assert _fusion_attributes(pending)["vyre.policy.fusion.fallback"] == "UnsupportedFeature"


def test_members_with_workgroup_memory_and_their_own_grids_fuse(backend: VyreBackend) -> None:
    program = sum_reduction(2048, workgroup=64, items_per_lane=2)
    pipeline = backend.compile(program)
    rng = np.random.default_rng(4)
    batch = [[rng.standard_normal(2048).astype(np.float32)] for _ in range(5)]
    config = DispatchConfig(grid_override=(16, 1, 1))
    fused = _results(pipeline.dispatch_batch(batch, config, fusion="force"))
    apart = _results(pipeline.dispatch_batch(batch, config, fusion="disable"))
    for got, want in zip(fused, apart, strict=True):
        assert got[0].view(np.uint32).tolist() == want[0].view(np.uint32).tolist()


def test_fused_programs_of_one_body_keep_their_own_buffer_counts(backend: VyreBackend) -> None:
    # The fused programs of xors of 96 and of 100 words share a fingerprint (counts are not
    # part of it), so the second batch finds the first one's pipeline: it must still be
    # planned with its own counts (found by running benchmarks/fusion.py).
    rng = np.random.default_rng(3)
    for n in (96, 100, 96):
        pipeline = backend.compile(elementwise_xor(n))
        batch = [[rng.integers(0, 2**32, n, dtype=np.uint32) for _ in range(2)] for _ in range(3)]
        for pending, (a, b) in zip(
            pipeline.dispatch_batch(batch, fusion="force"), batch, strict=True
        ):
            (out,) = pending.result()
            assert out.shape == (n,) and np.array_equal(out, a ^ b)
            assert _fusion_attributes(pending)["vyre.policy.fusion"] == "fuse"
