"""Calibration records, their on-disk store, and the primary execution mode they feed."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.driver.fakes import BytesBackend
from tests.helpers import backend_of
from vyre_async import BackendCapabilities, DispatchConfig, compile
from vyre_async._calibration import (
    Calibration,
    CalibrationStore,
    calibration_for,
    calibration_key,
    default_calibration_root,
    format_calibration,
)
from vyre_async._execution import choose_execution_mode
from vyre_async._pending import PendingDispatch
from vyre_async._pipeline import Launch
from vyre_async.programs import elementwise_xor
from vyre_reference import ReferenceExecutor, reference_backend

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

    def enqueue(self, launch: Launch) -> None:
        self.seen.append(launch.pending)
        super().enqueue(launch)


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
        {"measured_at": Decimal("1.5")},  # (not a Real: it would not save as JSON)
        {"measured_at": 10**400},
    ],
)
def test_invalid_records_are_rejected(change: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="Fix:"):
        replace(GPU_LIKE, **change)


@pytest.mark.parametrize("stamp", [Fraction(3, 2), np.float32(1.5), np.int64(2), 10**3])
def test_any_real_time_stamp_is_kept_as_a_float_that_saves(stamp: object) -> None:
    record = replace(GPU_LIKE, measured_at=stamp)
    assert type(record.measured_at) is float and record.measured_at == float(stamp)  # type: ignore[arg-type]
    assert Calibration.from_json(json.loads(json.dumps(record.to_json()))) == record


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
    backend = backend_of(CapableBackend, calibration=replace(GPU_LIKE, measured_at=0.0))
    assert calibration_for(backend, store=store) is None  # never measures by default
    first = calibration_for(backend, measure=True, store=store)
    assert first is not None and first.measured_at > 0  # stamped
    assert calibration_for(backend, measure=True, store=store) == first
    assert backend.executor.calibrations == 1
    # A new backend object for the same device reads the disk record.
    other = backend_of(CapableBackend)
    assert calibration_for(other, store=store) == first
    assert other.executor.calibrations == 0
    assert calibration_for(other, refresh=True, store=store) is not None
    assert other.executor.calibrations == 1


def test_backends_without_calibration_return_none(tmp_path: Path) -> None:
    backend = backend_of(BytesBackend)
    assert backend.calibrate() is None
    assert calibration_for(backend, measure=True, store=CalibrationStore(tmp_path)) is None
    assert not list(tmp_path.iterdir())


def test_reference_backend_measures_what_it_has(tmp_path: Path) -> None:
    backend = reference_backend()
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
        backend_of(CapableBackend), batch_size=500, repeats=500, calibration=GPU_LIKE
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
        backend_of(CapableBackend), batch_size=5, repeats=5, calibration=GPU_LIKE
    )
    assert (decision.mode.kind, decision.mode.reason) == ("plain", "neither_profitable")
    assert decision.persistent.reason == "setup_not_amortized"
    assert decision.reuse.reason == "record_not_amortized"


def test_backend_without_paths_is_plain_and_says_why() -> None:
    decision = choose_execution_mode(reference_backend(), batch_size=10_000, repeats=10_000)
    assert (decision.mode.kind, decision.mode.reason) == ("plain", "unsupported_by_backend")
    assert decision.persistent.reason == decision.reuse.reason == "unsupported_by_backend"
    assert not decision.calibrated


def test_uncalibrated_capable_backend_is_plain() -> None:
    backend = backend_of(CapableBackend, calibration=None)
    decision = choose_execution_mode(backend, batch_size=500, repeats=500)
    assert (decision.mode.kind, decision.mode.reason) == ("plain", "uncalibrated")


def test_config_disables_and_forces_persistent_threads() -> None:
    backend = backend_of(CapableBackend)
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
        backend_of(ReplayOnly), batch_size=500, repeats=500, calibration=GPU_LIKE
    )
    assert (decision.mode.kind, decision.mode.savings_ns) == ("command_reuse", 2_225_000)
    assert decision.persistent.reason == "unsupported_by_backend"


def test_mode_inputs_are_validated() -> None:
    with pytest.raises(ValueError, match="Fix:"):
        choose_execution_mode(reference_backend(), batch_size=-1, repeats=1)


def test_dispatch_batch_records_the_verdict_on_every_span(tmp_path: Path) -> None:
    backend = backend_of(CapableBackend)
    calibration_for(backend, measure=True, store=CalibrationStore(tmp_path))
    pipeline = compile(backend, elementwise_xor(64))
    inputs = [np.zeros(64, np.uint32)] * 2
    pendings = pipeline.dispatch_batch([inputs] * 500)
    assert len(pendings) == 500
    attrs = [dict(p.record.attributes or {}) for p in pendings]
    assert all(a["vyre.policy.execution_mode"] == "persistent" for a in attrs)
    small = pipeline.dispatch_batch([inputs] * 3)
    assert small[0].record.attributes["vyre.policy.execution_mode"] == "plain"


def test_dispatch_batch_on_the_reference_backend_is_plain() -> None:
    backend = reference_backend()
    pipeline = compile(backend, elementwise_xor(64))
    pendings = pipeline.dispatch_batch([[np.ones(64, np.uint32)] * 2] * 4)
    for pending in pendings:
        assert pending.result()[0].tolist() == [0] * 64
        attrs = pending.record.attributes
        assert attrs["vyre.policy.execution_mode"] == "plain"
        assert attrs["vyre.policy.execution_mode.reason"] == "unsupported_by_backend"


# The store owns only its own files ----------------------------------------------------------

posix_only = pytest.mark.skipif(
    sys.platform == "win32", reason="POSIX file types, modes, symlinks and signals"
)
IDS = ("capable-test", "1.0", "gpu-a")  # GPU_LIKE's device


def _record_json(fingerprint: str, **changes: Any) -> bytes:
    """Return the JSON of GPU_LIKE measured on device ``fingerprint`` (and ``changes``)."""
    data = {**replace(GPU_LIKE, device_fingerprint=fingerprint).to_json(), **changes}
    return json.dumps(data, indent=2, sort_keys=True).encode()


def _key(fingerprint: str) -> str:
    return calibration_key("capable-test", "1.0", fingerprint)


def _snapshot(root: Path) -> dict[str, tuple[str, object]]:
    """Return every path under ``root`` (symlinks not followed) with its type and content."""
    found: dict[str, tuple[str, object]] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                found[str(path.relative_to(root))] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                found[str(path.relative_to(root))] = ("dir", stat.S_IMODE(st.st_mode))
            elif stat.S_ISREG(st.st_mode):
                found[str(path.relative_to(root))] = ("file", path.read_bytes())
            else:
                found[str(path.relative_to(root))] = ("special", stat.S_IFMT(st.st_mode))
    return found


def _users_files(tmp_path: Path) -> Path:
    """Make a directory of a user's files, some named or shaped like calibration records."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "data.json").write_bytes(b'{"user": "data"}')
    (root / "notes.txt").write_bytes(b"notes")
    (root / "settings.json").write_bytes(_record_json("gpu-copy"))  # a valid record, user's name
    # A valid record under the name of another device's key (wrong name).
    (root / f"{_key('gpu-z')}.json").write_bytes(_record_json("gpu-a"))
    # Record-like names, wrong content.
    (root / f"{_key('gpu-text')}.json").write_bytes(b"not json at all")
    (root / f"{_key('gpu-obj')}.json").write_bytes(b'{"format_version": 2, "launch_ns": 1}')
    (root / f"{_key('gpu-list')}.json").write_bytes(b"[1, 2, 3]")
    # A valid record whose name is upper-case hex: not a name the store writes.
    (root / f"{_key('gpu-upper').upper()}.json").write_bytes(_record_json("gpu-upper"))
    # Directories: one named like a record, one holding a record.
    (root / f"{_key('gpu-dir')}.json").mkdir()
    (root / f"{_key('gpu-dir')}.json" / "inner.json").write_bytes(_record_json("gpu-dir"))
    (root / "sub").mkdir()
    (root / "sub" / f"{_key('gpu-sub')}.json").write_bytes(_record_json("gpu-sub"))
    if sys.platform != "win32":
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "record.json").write_bytes(_record_json("gpu-link"))
        (root / f"{_key('gpu-link')}.json").symlink_to(outside / "record.json")
        (root / "link.json").symlink_to(outside / "record.json")
    return root


def test_entries_read_only_the_stores_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = _users_files(tmp_path)
    before = _snapshot(root)
    outside = _snapshot(tmp_path / "outside") if sys.platform != "win32" else {}
    store = CalibrationStore(root)
    gpu_b = replace(GPU_LIKE, device_fingerprint="gpu-b")
    assert store.save(GPU_LIKE) and store.save(gpu_b)
    with caplog.at_level(logging.WARNING, logger="vyre_async.calibration"):
        assert store.entries() == [GPU_LIKE, gpu_b]
    after = _snapshot(root)
    assert {k: v for k, v in after.items() if k in before} == before
    assert set(after) - set(before) == {f"{GPU_LIKE.key()}.json", f"{gpu_b.key()}.json"}
    if sys.platform != "win32":
        assert _snapshot(tmp_path / "outside") == outside


def test_clear_deletes_only_the_stores_records(tmp_path: Path) -> None:
    root = _users_files(tmp_path)
    before = _snapshot(root)
    outside = _snapshot(tmp_path / "outside") if sys.platform != "win32" else {}
    store = CalibrationStore(root)
    assert store.save(GPU_LIKE) and store.save(replace(GPU_LIKE, device_fingerprint="gpu-b"))
    # A record of the previous format version, under its own key, is the store's too.
    old = {**json.loads(_record_json("gpu-old")), "format_version": 1}
    del old["persistent_item_ns"]
    (root / f"{_key('gpu-old')}.json").write_text(json.dumps(old))
    assert store.clear() == 3
    assert _snapshot(root) == before  # every other file byte-identical, nothing else gone
    if sys.platform != "win32":
        assert _snapshot(tmp_path / "outside") == outside
    assert store.clear() == 0


@posix_only
def test_save_keeps_the_mode_of_existing_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    assert CalibrationStore(shared).save(GPU_LIKE)
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777
    # The default root: an existing "calibration" folder keeps its mode as well.
    monkeypatch.setenv("VYRE_CACHE_DIR", str(shared))
    (shared / "calibration").mkdir()
    os.chmod(shared / "calibration", 0o755)
    assert CalibrationStore().save(GPU_LIKE)
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777
    assert stat.S_IMODE(os.stat(shared / "calibration").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(shared / "calibration" / "v2").st_mode) == 0o700


@posix_only
def test_save_creates_missing_directories_private(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    root = tmp_path / "a" / "b" / "c"
    old_umask = os.umask(0o022)
    try:
        assert CalibrationStore(root).save(GPU_LIKE)
    finally:
        os.umask(old_umask)
    for folder in (tmp_path / "a", tmp_path / "a" / "b", root):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700, folder
    assert stat.S_IMODE(os.stat(tmp_path).st_mode) == 0o755  # existed: untouched


def _without_blocking(what: str, call: Callable[[], object], fifo: Path) -> object:
    """Run ``call()`` in a thread; fail (not hang) if it blocks on ``fifo`` for 10 s."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # re-raised below, in the test's thread
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=10)
    if thread.is_alive():
        # Release the blocked reader so the suite goes on, then report the hang.
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(timeout=10)
        pytest.fail(f"{what} blocked on a FIFO at a record path")
    (result,) = outcome
    if isinstance(result, BaseException):
        raise result
    return result


@posix_only
def test_a_fifo_at_a_record_path_reads_as_absent_without_blocking(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CalibrationStore(tmp_path)
    path = store.path_for(*IDS)
    os.mkfifo(path)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="vyre_async.calibration"):
        assert _without_blocking("load()", lambda: store.load(*IDS), path) is None
        assert _without_blocking("entries()", store.entries, path) == []
        assert _without_blocking("clear()", store.clear, path) == 0
    assert time.monotonic() - started < 10
    assert any("FIFO" in r.getMessage() for r in caplog.records)
    assert stat.S_ISFIFO(os.lstat(path).st_mode)  # left in place


@posix_only
def test_a_symlink_at_a_record_path_is_not_followed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_bytes(_record_json("gpu-a"))  # a valid record of this very device
    store = CalibrationStore(tmp_path / "root")
    store.root.mkdir()
    path = store.path_for(*IDS)
    path.symlink_to(target)
    with caplog.at_level(logging.WARNING, logger="vyre_async.calibration"):
        assert store.load(*IDS) is None
        assert store.entries() == []
        assert store.clear() == 0
        assert store.save(GPU_LIKE) is False  # not written through, nor replaced
    assert any("symbolic link" in r.getMessage() for r in caplog.records)
    assert path.is_symlink() and os.readlink(path) == str(target)
    assert target.read_bytes() == _record_json("gpu-a")


def test_an_oversized_file_at_a_record_path_is_not_read_nor_deleted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CalibrationStore(tmp_path)
    path = store.path_for(*IDS)
    # Valid JSON of this device's record, padded past MAX_RECORD_BYTES (1 MiB).
    padded = _record_json("gpu-a") + b" " * (1 << 20)
    path.write_bytes(padded)
    with caplog.at_level(logging.WARNING, logger="vyre_async.calibration"):
        assert store.load(*IDS) is None
        assert store.entries() == []
    assert caplog.records
    assert store.clear() == 0
    assert path.read_bytes() == padded


def test_deeply_nested_json_at_a_record_path_reads_as_absent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CalibrationStore(tmp_path)
    path = store.path_for(*IDS)
    path.write_bytes(b"[" * 100_000)
    with caplog.at_level(logging.WARNING, logger="vyre_async.calibration"):
        assert store.load(*IDS) is None  # a log line, not a RecursionError
        assert store.entries() == []
    assert caplog.records
    assert store.clear() == 0 and path.exists()


STALLED_SAVE = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from vyre_async._calibration import Calibration, CalibrationStore

    root, ready = Path(sys.argv[1]), Path(sys.argv[2])

    def stall(src, dst):  # the temp file is written and fsynced: stop before the rename
        ready.write_text(str(src))
        time.sleep(600)

    os.replace = stall
    record = Calibration(
        backend_id="stalled", backend_version="1", device_fingerprint="gpu-k", launch_ns=1
    )
    CalibrationStore(root).save(record)
    """
)


def _stalled_save(tmp_path: Path, root: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """Start a real save() that stops right before its rename; return it and its temp file."""
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", STALLED_SAVE, str(root), str(ready)])
    deadline = time.monotonic() + 60
    while not ready.exists() or not ready.read_text():
        assert proc.poll() is None, "the writer exited early"
        assert time.monotonic() < deadline, "the writer never wrote its temp file"
        time.sleep(0.02)
    return proc, Path(ready.read_text())


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)  # reaped, so its pid no longer names a process


@posix_only
@pytest.mark.parametrize("reclaim", ["clear", "save"])
def test_temp_file_of_a_killed_writer_is_reclaimed(tmp_path: Path, reclaim: str) -> None:
    root = tmp_path / "root"
    proc, temp = _stalled_save(tmp_path, root)
    try:
        store = CalibrationStore(root)
        assert store.clear() == 0
        assert temp.exists()  # its writer is alive: its write is in progress
    finally:
        _kill(proc)
    assert temp.exists()
    if reclaim == "clear":
        assert store.clear() == 0
    else:
        assert store.save(GPU_LIKE)
        assert store.entries() == [GPU_LIKE]
    assert not temp.exists()
    assert temp.parent == root and temp.name.startswith(f".calibration.{proc.pid}.")
    assert sorted(p.name for p in root.iterdir()) == (
        [] if reclaim == "clear" else [f"{GPU_LIKE.key()}.json"]
    )


def test_old_temp_files_are_reclaimed_and_foreign_ones_kept(tmp_path: Path) -> None:
    store = CalibrationStore(tmp_path)
    pid = os.getpid()  # alive: only age makes its temp files reclaimable
    fresh = tmp_path / f".calibration.{pid}.{'1' * 16}.tmp"
    old = tmp_path / f".calibration.{pid}.{'2' * 16}.tmp"
    foreign = tmp_path / f".calibration.{pid}.{'3' * 16}.tmp"
    fresh.write_bytes(_record_json("gpu-a")[:10])
    old.write_bytes(b"")  # a writer that died before writing anything
    foreign.write_bytes(b"a user's file")
    two_hours_ago = time.time() - 7200
    for path in (old, foreign):
        os.utime(path, (two_hours_ago, two_hours_ago))
    assert store.clear() == 0
    assert not old.exists()
    assert fresh.read_bytes() == _record_json("gpu-a")[:10]
    assert foreign.read_bytes() == b"a user's file"


# The arm overlap ------------------------------------------------------------------------------


def test_arm_overlap_is_measured_and_filled_in(tmp_path: Path) -> None:
    from vyre_async._calibration import measure_arm_overlap

    backend = reference_backend()
    overlap = measure_arm_overlap(backend, rounds=2, elements=1 << 14)
    assert isinstance(overlap, int) and -10_000 <= overlap <= 10_000
    store = CalibrationStore(tmp_path)
    record = calibration_for(backend, measure=True, store=store)
    assert record is not None and record.concurrent_overlap_bps is not None
    assert store.entries() == [record]
    assert "arm overlap:" in format_calibration(record)


def test_a_record_without_the_overlap_gets_it_when_measuring(tmp_path: Path) -> None:
    store = CalibrationStore(tmp_path)
    backend = reference_backend()
    old = Calibration(
        backend_id="reference",
        backend_version=backend.version,
        device_fingerprint=backend.device_fingerprint(),
        launch_ns=1_000,
        measured_at=1.0,
    )
    assert store.save(old)
    assert calibration_for(backend, store=store) == old  # reading never measures
    filled = calibration_for(reference_backend(), measure=True, store=store)
    assert (
        filled is not None
        and filled.launch_ns == 1_000
        and filled.concurrent_overlap_bps is not None
    )
    assert store.entries() == [filled]
    assert "arm overlap:      not measured" in format_calibration(old)


def test_arm_overlap_unmeasurable_stays_none(caplog: pytest.LogCaptureFixture) -> None:
    from vyre_async._calibration import measure_arm_overlap

    class Broken(ReferenceExecutor):
        def enqueue(self, launch: Launch) -> None:
            raise RuntimeError("no")

    with caplog.at_level(logging.WARNING, logger="vyre_async.calibration"):
        assert measure_arm_overlap(backend_of(Broken)) is None
    assert "arm overlap" in caplog.text


@pytest.mark.parametrize("bad", [10_001, -10_001, 1.5, True])
def test_arm_overlap_is_validated(bad: Any) -> None:
    with pytest.raises(ValueError, match="Fix:"):
        replace(GPU_LIKE, concurrent_overlap_bps=bad)
    assert replace(GPU_LIKE, concurrent_overlap_bps=-10_000).concurrent_overlap_bps == -10_000


# The resident gain ----------------------------------------------------------------------------


def test_resident_gain_is_measured_and_filled_in(tmp_path: Path) -> None:
    from vyre_async._calibration import measure_resident_gain

    backend = reference_backend()
    gain = measure_resident_gain(backend, rounds=2, elements=1 << 14)
    assert isinstance(gain, int) and -10_000 <= gain <= 10_000
    assert backend.executor.resident_count == 0  # the probe freed what it uploaded and allocated
    store = CalibrationStore(tmp_path)
    record = calibration_for(backend, measure=True, store=store)
    assert record is not None and record.resident_gain_bps is not None
    assert store.entries() == [record]
    assert "resident gain:" in format_calibration(record)


def test_a_record_written_before_the_resident_gain_loads_and_gets_it(tmp_path: Path) -> None:
    store = CalibrationStore(tmp_path)
    backend = reference_backend()
    old = Calibration(
        backend_id="reference",
        backend_version=backend.version,
        device_fingerprint=backend.device_fingerprint(),
        launch_ns=1_000,
        concurrent_overlap_bps=1_234,
        measured_at=1.0,
    )
    data = old.to_json()
    del data["resident_gain_bps"]  # as an older vyre-async wrote it
    path = store.path_for(old.backend_id, old.backend_version, old.device_fingerprint)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True))
    assert calibration_for(backend, store=store) == old  # reading never measures
    filled = calibration_for(reference_backend(), measure=True, store=store)
    assert filled is not None and filled.resident_gain_bps is not None
    assert (filled.launch_ns, filled.concurrent_overlap_bps) == (1_000, 1_234)  # kept
    assert store.entries() == [filled]
    assert "resident gain:    not measured" in format_calibration(old)


def test_resident_gain_of_a_backend_without_resident_buffers_is_none(tmp_path: Path) -> None:
    from vyre_async._calibration import measure_resident_gain
    from vyre_async.abc import Executor

    class HostOnly(ReferenceExecutor):
        upload = Executor.upload
        alloc = Executor.alloc

    assert measure_resident_gain(backend_of(HostOnly)) is None
    record = calibration_for(backend_of(HostOnly), measure=True, store=CalibrationStore(tmp_path))
    assert record is not None and record.resident_gain_bps is None


def test_resident_gain_unmeasurable_stays_none(caplog: pytest.LogCaptureFixture) -> None:
    from vyre_async._calibration import measure_resident_gain

    class Broken(ReferenceExecutor):
        def enqueue(self, launch: Launch) -> None:
            raise RuntimeError("no")

    backend = backend_of(Broken)
    with caplog.at_level(logging.WARNING, logger="vyre_async.calibration"):
        assert measure_resident_gain(backend) is None
    assert "resident gain" in caplog.text
    assert backend.executor.resident_count == 0


@pytest.mark.parametrize("bad", [10_001, -10_001, 1.5, True])
def test_resident_gain_is_validated(bad: Any) -> None:
    with pytest.raises(ValueError, match="Fix:"):
        replace(GPU_LIKE, resident_gain_bps=bad)
    assert replace(GPU_LIKE, resident_gain_bps=-10_000).resident_gain_bps == -10_000


def test_records_with_the_policy_fields_still_begin_like_temp_files_do(tmp_path: Path) -> None:
    # The store recognises its temp files by how every record it writes begins
    # (sorted keys: "backend_id" first); the basis-point fields sort after it.
    from vyre_async._calibration.store import _RECORD_HEAD, _encode

    record = replace(GPU_LIKE, concurrent_overlap_bps=-5, resident_gain_bps=-1_500)
    assert _encode(record).startswith(_RECORD_HEAD)
    store = CalibrationStore(tmp_path)
    assert store.save(record) and store.entries() == [record]
