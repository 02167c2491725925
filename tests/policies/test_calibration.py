"""Calibration records, their on-disk store, and the primary execution mode they feed."""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.driver.fakes import BytesBackend
from vyre_async import BackendCapabilities, DispatchConfig, compile
from vyre_async.calibration import (
    Calibration,
    CalibrationStore,
    calibration_for,
    default_calibration_root,
    format_calibration,
)
from vyre_async.execution import choose_execution_mode
from vyre_async.pending import PendingDispatch
from vyre_async.pipeline import Launch
from vyre_async.programs import elementwise_xor
from vyre_reference import ReferenceBackend

US = 1_000
GPU_LIKE = Calibration(
    backend_id="capable-test",
    backend_version="1.0",
    device_fingerprint="gpu-a",
    launch_ns=5 * US,
    record_ns=25 * US,
    replay_ns=500,
    persistent_setup_ns=50 * US,
    h2d_bytes_per_s=12e9,
    d2h_bytes_per_s=13e9,
    compile_ns=40_000 * US,
    timing="device_events",
    measured_at=1.0,
)


class CapableBackend(BytesBackend):
    """A fake with graph replay and persistent threads, calibrated like a GPU."""

    id = "capable-test"

    def __init__(self, *, calibration: Calibration | None = GPU_LIKE, **kwargs: Any) -> None:
        super().__init__(fingerprint="gpu-a", **kwargs)
        self.calibration = calibration
        self.calibrations = 0
        self.seen: list[PendingDispatch] = []

    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities(
            graph_replay=True,
            persistent_threads=True,
            max_workgroup_size=(1024, 1024, 64),
            max_workgroup_lanes=1024,
        )

    def calibrate(self) -> Calibration | None:
        self.calibrations += 1
        return self.calibration

    def enqueue(self, launch: Launch) -> PendingDispatch:
        self.seen.append(launch.pending)
        return super().enqueue(launch)


# The record -----------------------------------------------------------------------------


def test_json_round_trip() -> None:
    data = GPU_LIKE.to_json()
    assert data["format_version"] == 2
    assert Calibration.from_json(json.loads(json.dumps(data))) == GPU_LIKE
    assert len(GPU_LIKE.key()) == 64


@pytest.mark.parametrize(
    "change",
    [
        {"launch_ns": -1},
        {"launch_ns": 1.5},
        {"record_ns": True},
        {"h2d_bytes_per_s": 0.0},
        {"d2h_bytes_per_s": float("inf")},
        {"backend_id": ""},
        {"measured_at": float("nan")},
    ],
)
def test_invalid_records_are_rejected(change: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="Fix:"):
        replace(GPU_LIKE, **change)


@pytest.mark.parametrize(
    "payload",
    [
        [],
        {"format_version": 2},
        {**GPU_LIKE.to_json(), "extra": 1},
        {**GPU_LIKE.to_json(), "format_version": 1},  # the old format: measured differently
    ],
)
def test_from_json_rejects_foreign_payloads(payload: object) -> None:
    with pytest.raises(ValueError):
        Calibration.from_json(payload)


def test_format_mentions_every_cost() -> None:
    text = format_calibration(GPU_LIKE)
    for needle in ("5.00 us", "25.00 us", "0.50 us", "50.00 us", "12.00 GB/s", "device_events"):
        assert needle in text
    assert "not measured" in format_calibration(replace(GPU_LIKE, record_ns=None))


# The store ------------------------------------------------------------------------------


def test_store_round_trip_and_permissions(tmp_path: Path) -> None:
    store = CalibrationStore(tmp_path / "cal")
    assert store.load("capable-test", "1.0", "gpu-a") is None
    assert store.entries() == []
    assert store.save(GPU_LIKE)
    assert store.load("capable-test", "1.0", "gpu-a") == GPU_LIKE
    assert store.load("capable-test", "1.0", "gpu-b") is None  # another device
    assert store.load("capable-test", "2.0", "gpu-a") is None  # another version
    if sys.platform != "win32":
        assert stat.S_IMODE(os.stat(store.root).st_mode) == 0o700
    assert not list(store.root.glob("*.tmp"))
    assert store.entries() == [GPU_LIKE]
    assert store.clear() == 1 and store.entries() == []


def test_default_root_honours_the_cache_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("VYRE_CACHE_DIR", str(tmp_path))
    assert default_calibration_root() == tmp_path / "calibration" / "v2"
    assert CalibrationStore().save(GPU_LIKE)
    if sys.platform != "win32":
        for folder in (tmp_path / "calibration", tmp_path / "calibration" / "v2"):
            assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert CalibrationStore().entries() == [GPU_LIKE]
    monkeypatch.delenv("VYRE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):
        assert default_calibration_root() == tmp_path / "xdg" / "vyre-async" / "calibration" / "v2"


def test_corrupt_and_foreign_records_read_as_absent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CalibrationStore(tmp_path)
    path = store.path_for("capable-test", "1.0", "gpu-a")
    path.parent.mkdir(parents=True, exist_ok=True)
    with caplog.at_level(logging.WARNING, logger="vyre_async.calibration"):
        path.write_text("{ not json")
        assert store.load("capable-test", "1.0", "gpu-a") is None
        # A valid record stored under another device's file name.
        path.write_text(json.dumps(replace(GPU_LIKE, device_fingerprint="gpu-z").to_json()))
        assert store.load("capable-test", "1.0", "gpu-a") is None
    assert len(caplog.records) == 2


def test_unwritable_store_logs_and_carries_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="vyre_async.calibration"):
        assert CalibrationStore(blocker / "sub").save(GPU_LIKE) is False
    assert caplog.records


# calibration_for --------------------------------------------------------------------------


def test_measured_once_per_device_then_cached(tmp_path: Path) -> None:
    store = CalibrationStore(tmp_path)
    backend = CapableBackend(calibration=replace(GPU_LIKE, measured_at=0.0))
    assert calibration_for(backend, store=store) is None  # never measures by default
    first = calibration_for(backend, measure=True, store=store)
    assert first is not None and first.measured_at > 0  # stamped
    assert calibration_for(backend, measure=True, store=store) == first
    assert backend.calibrations == 1
    # A new backend object for the same device reads the disk record.
    other = CapableBackend()
    assert calibration_for(other, store=store) == first
    assert other.calibrations == 0
    assert calibration_for(other, refresh=True, store=store) is not None
    assert other.calibrations == 1


def test_backends_without_calibration_return_none(tmp_path: Path) -> None:
    backend = BytesBackend()
    assert backend.calibrate() is None
    assert calibration_for(backend, measure=True, store=CalibrationStore(tmp_path)) is None
    assert not list(tmp_path.iterdir())


def test_reference_backend_measures_what_it_has(tmp_path: Path) -> None:
    backend = ReferenceBackend()
    record = calibration_for(backend, measure=True, store=CalibrationStore(tmp_path))
    assert record is not None
    assert (record.backend_id, record.device_fingerprint) == (
        "reference",
        f"numpy-{np.__version__}",
    )
    assert record.launch_ns > 0 and record.compile_ns is not None and record.compile_ns > 0
    assert record.h2d_bytes_per_s is not None and record.d2h_bytes_per_s is not None
    assert (record.record_ns, record.replay_ns, record.persistent_setup_ns) == (None, None, None)
    assert CalibrationStore(tmp_path).entries() == [record]


# The primary execution mode -----------------------------------------------------------------


def test_bundle_example_on_a_capable_backend() -> None:
    decision = choose_execution_mode(
        CapableBackend(), batch_size=500, repeats=500, calibration=GPU_LIKE
    )
    assert (decision.mode.kind, decision.mode.savings_ns) == ("persistent", 2_450_000)
    assert decision.reuse.savings_ns == 2_225_000
    attrs = decision.span_attributes()
    assert attrs["vyre.policy.execution_mode"] == "persistent"
    assert attrs["vyre.policy.execution_mode.reason"] == "persistent_saves_more"
    assert attrs["vyre.policy.command_reuse"] == "record_and_replay"
    assert "vyre.policy.persistent.reason" not in attrs


def test_small_batches_stay_plain() -> None:
    decision = choose_execution_mode(
        CapableBackend(), batch_size=5, repeats=5, calibration=GPU_LIKE
    )
    assert (decision.mode.kind, decision.mode.reason) == ("plain", "neither_profitable")
    assert decision.persistent.reason == "setup_not_amortized"
    assert decision.reuse.reason == "record_not_amortized"


def test_backend_without_paths_is_plain_and_says_why() -> None:
    decision = choose_execution_mode(ReferenceBackend(), batch_size=10_000, repeats=10_000)
    assert (decision.mode.kind, decision.mode.reason) == ("plain", "unsupported_by_backend")
    assert decision.persistent.reason == decision.reuse.reason == "unsupported_by_backend"
    assert not decision.calibrated


def test_uncalibrated_capable_backend_is_plain() -> None:
    backend = CapableBackend(calibration=None)
    decision = choose_execution_mode(backend, batch_size=500, repeats=500)
    assert (decision.mode.kind, decision.mode.reason) == ("plain", "uncalibrated")


def test_config_disables_and_forces_persistent_threads() -> None:
    backend = CapableBackend()
    off = choose_execution_mode(
        backend,
        batch_size=500,
        repeats=500,
        config=DispatchConfig(persistent_thread="disable"),
        calibration=GPU_LIKE,
    )
    assert off.persistent.reason == "disabled"
    assert off.mode.kind == "command_reuse"
    forced = choose_execution_mode(
        backend,
        batch_size=2,
        repeats=2,
        config=DispatchConfig(persistent_thread="force"),
        calibration=GPU_LIKE,
    )
    assert (forced.mode.kind, forced.mode.reason, forced.mode.savings_ns) == (
        "persistent",
        "forced",
        0,
    )


def test_only_graph_replay_available() -> None:
    class ReplayOnly(CapableBackend):
        def capabilities(self) -> BackendCapabilities:
            return BackendCapabilities(graph_replay=True)

    decision = choose_execution_mode(
        ReplayOnly(), batch_size=500, repeats=500, calibration=GPU_LIKE
    )
    assert (decision.mode.kind, decision.mode.savings_ns) == ("command_reuse", 2_225_000)
    assert decision.persistent.reason == "unsupported_by_backend"


def test_mode_inputs_are_validated() -> None:
    with pytest.raises(ValueError, match="Fix:"):
        choose_execution_mode(ReferenceBackend(), batch_size=-1, repeats=1)


def test_dispatch_batch_records_the_verdict_on_every_span(tmp_path: Path) -> None:
    backend = CapableBackend()
    calibration_for(backend, measure=True, store=CalibrationStore(tmp_path))
    pipeline = compile(backend, elementwise_xor(64))
    inputs = [np.zeros(64, np.uint32)] * 2
    pendings = pipeline.dispatch_batch([inputs] * 500)
    assert len(pendings) == 500
    attrs = [dict(p.context.get("attributes", {})) for p in pendings]
    assert all(a["vyre.policy.execution_mode"] == "persistent" for a in attrs)
    small = pipeline.dispatch_batch([inputs] * 3)
    assert small[0].context["attributes"]["vyre.policy.execution_mode"] == "plain"


def test_dispatch_batch_on_the_reference_backend_is_plain() -> None:
    backend = ReferenceBackend()
    pipeline = compile(backend, elementwise_xor(64))
    pendings = pipeline.dispatch_batch([[np.ones(64, np.uint32)] * 2] * 4)
    for pending in pendings:
        assert pending.result()[0].tolist() == [0] * 64
        attrs = pending.context["attributes"]
        assert attrs["vyre.policy.execution_mode"] == "plain"
        assert attrs["vyre.policy.execution_mode.reason"] == "unsupported_by_backend"
