"""The calibration record: what was measured on one device, and its cache key."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

import blake3

from vyre_async._arguments import real_number
from vyre_async._exports import public_dir as _public_dir
from vyre_async.errors import InvalidArgument

if TYPE_CHECKING:
    pass

__all__ = [
    "CALIBRATION_FORMAT_VERSION",
    "Calibration",
    "calibration_key",
]
__dir__ = _public_dir(__name__)

CALIBRATION_FORMAT_VERSION = 2  # 2: persistent_item_ns; CUDA launch_ns per batched launch
_NS_FIELDS = (
    "launch_ns",
    "record_ns",
    "replay_ns",
    "persistent_setup_ns",
    "persistent_item_ns",
    "compile_ns",
)
_RATE_FIELDS = ("h2d_bytes_per_s", "d2h_bytes_per_s")
_BPS_FIELDS = ("concurrent_overlap_bps", "resident_gain_bps", "fusion_gain_bps")
_IDENTITY_FIELDS = ("backend_id", "backend_version", "device_fingerprint")


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """Measured costs of one device, in integer nanoseconds and bytes per second.

    ``None`` means "not measured" (the backend has no such path): a policy that
    needs it stays on plain launches.

    Attributes:
        backend_id: The backend that measured.
        backend_version: Its version.
        device_fingerprint: `VyreBackend.device_fingerprint` of the device.
        launch_ns: Host cost of one plain launch (L).
        record_ns: Recording (capture + instantiate) a command list once (Rec).
        replay_ns: Replaying one recorded launch (Rep).
        persistent_setup_ns: Persistent-kernel setup and shutdown (S): the fixed
            host cost of one persistent batch.
        persistent_item_ns: Host cost each work item still adds to a persistent
            batch (planning, staging); the policy counts ``L - persistent_item_ns``
            as the per-launch overhead a persistent kernel saves.
        h2d_bytes_per_s: Upload bandwidth (from pinned memory on GPUs).
        d2h_bytes_per_s: Download bandwidth.
        compile_ns: Compiling one typical pipeline (the cost of a cache miss).
        concurrent_overlap_bps: How much of the shorter of two independent dispatches
            running them concurrently hides, against running them one after the
            other, in basis points of its time (10000: fully hidden; 0: no gain;
            negative: together they took longer). Measured by
            `measure_arm_overlap` (`calibration_for` fills it in when the
            backend's ``calibrate()`` left it None); the arm scheduler's
            concurrency policy (`vyre_async.policies.decide_arm_concurrency`)
            reads it.
        resident_gain_bps: How much faster a dispatch runs with its buffers
            resident, the way the arm graph runs it (inputs uploaded once, each
            WRITE output a fresh zeroed resident buffer run as READ_WRITE), than
            the same dispatch on host arrays, in basis points of the host-array
            time (negative: resident was slower). Measured by
            `measure_resident_gain` (`calibration_for` fills it in when the
            backend's ``calibrate()`` left it None; None on a backend without
            resident buffers); the arm graph's residency policy
            (`vyre_async.policies.decide_residency`) reads it.
        fusion_gain_bps: How much faster a batch of 16 tiny dispatches runs fused
            into one launch than as 16 launches, in basis points of the separate
            time (negative: fused was slower, as on the reference engine, which
            interprets the fused kernel's member selection over every lane).
            Measured by `measure_fusion_gain` (`calibration_for` fills it in when
            the backend's ``calibrate()`` left it None); the fusion policy
            (`vyre_async.policies.pipeline_fusion.decide_fusion`) reads it.
        timing: How times were taken: ``"host"`` clocks or ``"device_events"``.
        measured_at: Unix time of the measurement.

    Raises:
        ValueError: a cost is negative or not an integer, a bandwidth is not a
            positive finite number, or an id is empty.
    """

    backend_id: str
    backend_version: str
    device_fingerprint: str
    launch_ns: int
    record_ns: int | None = None
    replay_ns: int | None = None
    persistent_setup_ns: int | None = None
    persistent_item_ns: int | None = None
    h2d_bytes_per_s: float | None = None
    d2h_bytes_per_s: float | None = None
    compile_ns: int | None = None
    concurrent_overlap_bps: int | None = None
    resident_gain_bps: int | None = None
    fusion_gain_bps: int | None = None
    timing: str = "host"
    measured_at: float = 0.0

    def __post_init__(self) -> None:
        for name in ("backend_id", "backend_version", "device_fingerprint", "timing"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"Calibration.{name} must be a str\nFix: pass a string")
        if not self.backend_id:
            raise ValueError("Calibration.backend_id must not be empty\nFix: pass backend.id")
        for name in _NS_FIELDS:
            value = getattr(self, name)
            if value is None and name != "launch_ns":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"Calibration.{name} must be a non-negative int of nanoseconds, got "
                    f"{value!r}\nFix: round the measurement to whole nanoseconds"
                )
        for name in _RATE_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ValueError(
                    f"Calibration.{name} must be a positive finite number, got {value!r}\n"
                    "Fix: leave it None when not measured"
                )
        for name in _BPS_FIELDS:
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not -10_000 <= value <= 10_000
            ):
                raise ValueError(
                    f"Calibration.{name} must be an int in -10000..10000 or None, got "
                    f"{value!r}\nFix: clamp the measurement to basis points"
                )
        measured_at = real_number(self.measured_at)
        if not math.isfinite(measured_at):  # (not a number; NaN; an int beyond any float)
            raise ValueError("Calibration.measured_at must be a finite number\nFix: time.time()")
        object.__setattr__(self, "measured_at", measured_at)  # (a float: it is saved as JSON)

    def key(self) -> str:
        """Return the 64-hex cache key of this record's device."""
        return calibration_key(self.backend_id, self.backend_version, self.device_fingerprint)

    def to_json(self) -> dict[str, Any]:
        """Return the record as a JSON-ready dict (with its format version)."""
        data = asdict(self)
        data["format_version"] = CALIBRATION_FORMAT_VERSION
        return data

    @classmethod
    def from_json(cls, data: object) -> Calibration:
        """Build a record from `to_json` output.

        Raises:
            ValueError: not a dict of this format version, unknown or missing
                fields, or invalid values.
        """
        if not isinstance(data, dict):
            raise ValueError("a calibration record must be a JSON object")
        if data.get("format_version") != CALIBRATION_FORMAT_VERSION:
            raise ValueError(f"calibration format version {data.get('format_version')!r}")
        names = {f.name for f in fields(cls)}
        body = {k: v for k, v in data.items() if k != "format_version"}
        unknown = set(body) - names
        if unknown:
            raise ValueError(f"unknown calibration fields {sorted(unknown)}")
        try:
            return cls(**body)
        except TypeError as exc:
            raise ValueError(str(exc)) from None


def _median(values: Any) -> float:
    """``statistics.median`` (imported when measuring, not with vyre-async)."""
    import statistics

    return float(statistics.median(values))


def _json() -> Any:
    """The ``json`` module (imported when a record is read or written)."""
    import json

    return json


def calibration_key(backend_id: str, backend_version: str, device_fingerprint: str) -> str:
    """Return the 64-hex key a device's calibration is stored under.

    Raises:
        InvalidArgument: a part is not a str, or has no UTF-8 form (a lone surrogate).
    """
    parts = ("vyre-calibration", backend_id, backend_version, device_fingerprint)
    try:
        if not all(isinstance(part, str) for part in parts):
            raise TypeError
        raw = "\0".join(parts).encode()
    except (TypeError, UnicodeEncodeError):
        raise InvalidArgument(
            f"a calibration is keyed by a backend id, version and device fingerprint, each a "
            f"str with a UTF-8 form; got {parts[1:]!r}",
            fix="pass the backend's own id, version and device_fingerprint()",
        ) from None
    return str(blake3.blake3(raw).hexdigest())
