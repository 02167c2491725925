"""The calibration record's key, field by field (issue 28, tests by method).

A calibration is measured once per device and found again by `calibration_key`
(backend id, backend version, device fingerprint) under a folder named for the
record format (`CALIBRATION_FORMAT_VERSION`); in memory, `calibration_for`
keeps it per backend object. A key without one of these would hand one
device's costs to another (a CPU engine's launch cost to a GPU's policy).
Each identity field changed alone must miss (nothing found; measuring writes a
record of its own), and everything else about a record or a backend must hit.
The table is checked against the code: every field of `Calibration` is either
in the key (a parameter of `calibration_key`) or a measurement with a case.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import vyre_async._calibration.record as calibration_module
from tests.driver.fakes import BytesBackend
from tests.helpers import backend_of
from vyre_async._calibration import (
    Calibration,
    CalibrationStore,
    calibration_for,
    calibration_key,
)


class CalibratedBackend(BytesBackend):
    """A backend whose calibration identity can be set; ``calibrate`` counts its calls.

    Its record says which backend measured it (``launch_ns``) and has the
    policy inputs filled in, so `calibration_for` measures nothing else.
    """

    id = "calibrated-test"

    def __init__(self, *, version: str = "1.0", launch_ns: int = 1000, **kwargs: Any) -> None:
        self.version = version
        super().__init__(**kwargs)
        self.launch_ns = launch_ns
        self.calibrations = 0

    def calibrate(self) -> Calibration:
        self.calibrations += 1
        return Calibration(
            backend_id=self.id,
            backend_version=self.version,
            device_fingerprint=self.device_fingerprint(),
            launch_ns=self.launch_ns,
            concurrent_overlap_bps=0,
            resident_gain_bps=0,
            fusion_gain_bps=0,
            measured_at=1.0,
        )


class OtherIdBackend(CalibratedBackend):
    id = "calibrated-test-2"


# parameter of calibration_key -> a backend that differs from the base in it alone
KEY_CASES: dict[str, Any] = {
    "backend_id": lambda: backend_of(OtherIdBackend, launch_ns=2000),
    "backend_version": lambda: backend_of(CalibratedBackend, version="1.1", launch_ns=2000),
    "device_fingerprint": lambda: backend_of(
        CalibratedBackend, fingerprint="host-b", launch_ns=2000
    ),
}

# field of Calibration outside the key -> another value (a new measurement of one device)
MEASUREMENTS: dict[str, object] = {
    "launch_ns": 7,
    "record_ns": 8,
    "replay_ns": 9,
    "persistent_setup_ns": 10,
    "persistent_item_ns": 11,
    "h2d_bytes_per_s": 1e9,
    "d2h_bytes_per_s": 2e9,
    "compile_ns": 12,
    "concurrent_overlap_bps": 500,
    "resident_gain_bps": -500,
    "fusion_gain_bps": 700,
    "timing": "device_events",
    "measured_at": 2.0,
}

#: What the base backend (``backend_of(CalibratedBackend)``) measures.
BASE = Calibration(
    backend_id="calibrated-test",
    backend_version="1.0",
    device_fingerprint="host-a",
    launch_ns=1000,
    concurrent_overlap_bps=0,
    resident_gain_bps=0,
    fusion_gain_bps=0,
    measured_at=1.0,
)


def test_every_field_of_a_record_is_in_the_key_or_a_measurement() -> None:
    fields = {f.name for f in dataclasses.fields(Calibration)}
    key = set(inspect.signature(calibration_key).parameters)
    assert key == set(KEY_CASES)
    assert key | set(MEASUREMENTS) == fields
    assert not key & set(MEASUREMENTS)


@pytest.mark.parametrize("field", list(KEY_CASES))
def test_a_key_field_changed_alone_misses(tmp_path: Path, field: str) -> None:
    store = CalibrationStore(tmp_path)
    base = backend_of(CalibratedBackend)
    assert calibration_for(base, measure=True, store=store) == BASE
    other = KEY_CASES[field]()

    assert calibration_for(other, store=store) is None  # not the base's record: a miss
    assert other.executor.calibrations == 0
    measured = calibration_for(other, measure=True, store=store)

    assert other.executor.calibrations == 1
    assert measured is not None and measured.launch_ns == 2000
    assert getattr(measured, field) != getattr(BASE, field)
    assert {r.launch_ns for r in store.entries()} == {1000, 2000}  # one record each
    # The base device still finds its own (a new backend object: from disk).
    again = backend_of(CalibratedBackend)
    assert calibration_for(again, store=store) == BASE and again.executor.calibrations == 0


@pytest.mark.parametrize(("field", "value"), list(MEASUREMENTS.items()), ids=list(MEASUREMENTS))
def test_a_measurement_changed_alone_is_the_same_devices_record(
    tmp_path: Path, field: str, value: object
) -> None:
    """A new measurement of one device replaces its record: same key, one file."""
    store = CalibrationStore(tmp_path)
    assert store.save(BASE)
    newer = replace(BASE, **{field: value})

    assert newer.key() == BASE.key()
    assert store.save(newer)

    assert store.load(BASE.backend_id, BASE.backend_version, BASE.device_fingerprint) == newer
    assert len(store.entries()) == 1
    backend = backend_of(CalibratedBackend)
    assert calibration_for(backend, store=store) == newer and backend.executor.calibrations == 0


@pytest.mark.parametrize(
    "settings",
    [{"prefetch": False}, {"pipeline_cache_capacity": 4}, {"launch_ns": 5}],
    ids=["no prefetcher", "cache capacity", "another backend object"],
)
def test_what_the_key_does_not_hold_hits(tmp_path: Path, settings: dict[str, Any]) -> None:
    store = CalibrationStore(tmp_path)
    assert calibration_for(backend_of(CalibratedBackend), measure=True, store=store) == BASE
    other = backend_of(CalibratedBackend, **settings)

    assert calibration_for(other, measure=True, store=store) == BASE
    assert other.executor.calibrations == 0


def test_the_format_version_changed_alone_misses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VYRE_CACHE_DIR", str(tmp_path))
    assert calibration_for(backend_of(CalibratedBackend), measure=True) == BASE
    old_root = CalibrationStore().root
    monkeypatch.setattr(
        calibration_module,
        "CALIBRATION_FORMAT_VERSION",
        calibration_module.CALIBRATION_FORMAT_VERSION + 1,
    )

    assert CalibrationStore().root != old_root  # the default folder follows the version
    # ... and a record of the old format is not read, wherever it is.
    assert CalibrationStore(old_root).load("calibrated-test", "1.0", "host-a") is None
    backend = backend_of(CalibratedBackend, launch_ns=3000)
    assert calibration_for(backend) is None
    measured = calibration_for(backend, measure=True)
    assert backend.executor.calibrations == 1
    assert measured is not None and measured.launch_ns == 3000


def test_the_memory_memo_is_per_backend_object(tmp_path: Path) -> None:
    """The in-memory memo (by backend object) hands a record to that backend only."""
    store = CalibrationStore(tmp_path)
    base = backend_of(CalibratedBackend)
    calibration_for(base, measure=True, store=store)
    (path,) = tmp_path.glob("*.json")
    path.unlink()  # from now on only the memo holds it

    assert calibration_for(base, store=store) == BASE  # the memo
    other = backend_of(CalibratedBackend, fingerprint="host-b", launch_ns=2000)
    assert calibration_for(other, store=store) is None
