"""Calibration: the measured device costs the launch policies consume.

A backend measures, once per device, its per-launch overhead, command
record/replay cost, persistent-kernel setup, host↔device bandwidth and compile
cost (`VyreBackend.calibrate`, which asks its executor). The package holds, in
three modules:

- `vyre_async._calibration.record`: the `Calibration` record and its cache key;
- `vyre_async._calibration.store`: where records live — `CalibrationStore` on
  disk, and `calibration_for`, which returns the cached record (in memory,
  then on disk keyed by backend id, version and device fingerprint) and
  measures only when asked to;
- `vyre_async._calibration.probes`: the measurements a backend's ``calibrate``
  runs (`measure_host_costs`, `measure_batch_costs`, `measure_arm_overlap`,
  `measure_resident_gain`, `measure_fusion_gain`) and their probe programs.
"""

from vyre_async._calibration.probes import (
    ARM_OVERLAP_PROBE_ELEMENTS,
    RESIDENT_GAIN_PROBE_ELEMENTS,
    launch_probe_program,
    measure_arm_overlap,
    measure_batch_costs,
    measure_fusion_gain,
    measure_host_costs,
    measure_resident_gain,
    resident_gain_probe_program,
)
from vyre_async._calibration.record import CALIBRATION_FORMAT_VERSION, Calibration, calibration_key
from vyre_async._calibration.store import (
    MAX_RECORD_BYTES,
    CalibrationStore,
    calibration_for,
    default_calibration_root,
    format_calibration,
)
from vyre_async._exports import public_dir as _public_dir

__all__ = [
    "ARM_OVERLAP_PROBE_ELEMENTS",
    "CALIBRATION_FORMAT_VERSION",
    "MAX_RECORD_BYTES",
    "RESIDENT_GAIN_PROBE_ELEMENTS",
    "Calibration",
    "CalibrationStore",
    "calibration_for",
    "calibration_key",
    "default_calibration_root",
    "format_calibration",
    "launch_probe_program",
    "measure_arm_overlap",
    "measure_batch_costs",
    "measure_host_costs",
    "measure_fusion_gain",
    "measure_resident_gain",
    "resident_gain_probe_program",
]
__dir__ = _public_dir(__name__)
