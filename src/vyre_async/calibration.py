"""Calibration: the measured device costs the launch policies consume.

A backend measures, once per device, its per-launch overhead, command
record/replay cost, persistent-kernel setup, host↔device bandwidth and compile
cost (`VyreBackend.calibrate`). `calibration_for` returns the cached record —
in memory, then on disk keyed by backend id, version and device fingerprint —
and measures only when asked to. Records are JSON files under
``<cache root>/calibration/v1/`` (directory mode 0700, written to a temporary
file, fsynced and ``os.replace``d, so a reader never sees a partial record). A
corrupt or foreign file reads as "not calibrated" with a log line, never a crash.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import blake3
import numpy as np

from vyre_async.cache.disk import default_cache_root
from vyre_async.ir.expr import u32
from vyre_async.ir.program import Program
from vyre_async.ir.stmt import Store
from vyre_async.ir.types import Access, BufferDecl, DType

if TYPE_CHECKING:
    from vyre_async.backend import VyreBackend
    from vyre_async.pipeline import CompiledPipeline
    from vyre_async.policies.launch import ModeKind

__all__ = [
    "CALIBRATION_FORMAT_VERSION",
    "Calibration",
    "CalibrationStore",
    "calibration_for",
    "calibration_key",
    "default_calibration_root",
    "format_calibration",
    "launch_probe_program",
    "measure_host_costs",
]

CALIBRATION_FORMAT_VERSION = 2  # 2: persistent_item_ns; CUDA launch_ns per batched launch
_log = logging.getLogger("vyre_async.calibration")
_NS_FIELDS = (
    "launch_ns",
    "record_ns",
    "replay_ns",
    "persistent_setup_ns",
    "persistent_item_ns",
    "compile_ns",
)
_RATE_FIELDS = ("h2d_bytes_per_s", "d2h_bytes_per_s")


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
        if (
            isinstance(self.measured_at, bool)
            or not isinstance(self.measured_at, int | float)
            or not math.isfinite(self.measured_at)
        ):
            raise ValueError("Calibration.measured_at must be a finite number\nFix: time.time()")

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


def calibration_key(backend_id: str, backend_version: str, device_fingerprint: str) -> str:
    """Return the 64-hex key a device's calibration is stored under."""
    text = "\0".join(("vyre-calibration", backend_id, backend_version, device_fingerprint))
    return str(blake3.blake3(text.encode()).hexdigest())


def default_calibration_root() -> Path:
    """Return ``<cache root>/calibration/v1``.

    The cache root is ``$VYRE_CACHE_DIR`` when set, else the platform user cache
    directory of vyre-async (the parent of the pipeline cache).
    """
    env = os.environ.get("VYRE_CACHE_DIR")
    base = Path(env).expanduser() if env else default_cache_root().parent
    return base / "calibration" / f"v{CALIBRATION_FORMAT_VERSION}"


class CalibrationStore:
    """Calibration records on disk, one JSON file per device.

    Args:
        root: Directory of the records; `default_calibration_root()` when None.
            Created with mode 0700.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root).expanduser() if root is not None else default_calibration_root()
        # The default root's "calibration" folder is ours too: keep it private as well.
        self._owned = (self.root.parent, self.root) if root is None else (self.root,)

    def path_for(self, backend_id: str, backend_version: str, device_fingerprint: str) -> Path:
        """Return the file holding the record of that device."""
        return (
            self.root / f"{calibration_key(backend_id, backend_version, device_fingerprint)}.json"
        )

    def load(
        self, backend_id: str, backend_version: str, device_fingerprint: str
    ) -> Calibration | None:
        """Return the stored record of that device, or None (absent, corrupt or foreign)."""
        path = self.path_for(backend_id, backend_version, device_fingerprint)
        record = self._read(path)
        if record is None:
            return None
        if (record.backend_id, record.backend_version, record.device_fingerprint) != (
            backend_id,
            backend_version,
            device_fingerprint,
        ):
            _log.warning("calibration record %s belongs to another device; ignoring it", path)
            return None
        return record

    def save(self, record: Calibration) -> bool:
        """Write ``record`` atomically; return False (and log) when it could not be written."""
        path = self.root / f"{record.key()}.json"
        payload = json.dumps(record.to_json(), indent=2, sort_keys=True).encode()
        tmp: str | None = None
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            for directory in self._owned:
                if sys.platform != "win32" and directory.stat().st_mode & 0o777 != 0o700:
                    directory.chmod(0o700)
            fd, tmp = tempfile.mkstemp(prefix=".calibration.", suffix=".tmp", dir=self.root)
            with os.fdopen(fd, "wb") as fh:
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            tmp = None
        except OSError as exc:
            _log.warning("calibration record %s could not be written (%s)", path, exc)
            return False
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        return True

    def entries(self) -> list[Calibration]:
        """Return every readable record, sorted by backend id and device fingerprint."""
        if not self.root.is_dir():
            return []
        found = [self._read(path) for path in sorted(self.root.glob("*.json"))]
        records = [r for r in found if r is not None]
        return sorted(records, key=lambda r: (r.backend_id, r.device_fingerprint))

    def clear(self) -> int:
        """Delete every record; return how many were removed."""
        removed = 0
        if self.root.is_dir():
            for path in self.root.glob("*.json"):
                with contextlib.suppress(OSError):
                    path.unlink()
                    removed += 1
        return removed

    @staticmethod
    def _read(path: Path) -> Calibration | None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            _log.warning("calibration record %s could not be read (%s)", path, exc)
            return None
        try:
            return Calibration.from_json(json.loads(text))
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            _log.warning("calibration record %s is unreadable (%s); ignoring it", path, exc)
            return None


_ABSENT = object()
_memo: weakref.WeakKeyDictionary[VyreBackend, object] = weakref.WeakKeyDictionary()
_memo_lock = threading.Lock()


def calibration_for(
    backend: VyreBackend,
    *,
    measure: bool = False,
    refresh: bool = False,
    store: CalibrationStore | None = None,
) -> Calibration | None:
    """Return ``backend``'s calibration: memory, then disk, then (if asked) a measurement.

    Dispatch paths call this with ``measure=False`` (it never measures there);
    tools and applications call it once with ``measure=True`` at start-up.

    Args:
        backend: The backend.
        measure: Call ``backend.calibrate()`` when nothing is cached, and store
            the result.
        refresh: Measure again even when a record is cached (implies ``measure``).
        store: Where records live; `CalibrationStore()` when None.

    Returns:
        The record, or None when none is cached and none was (or could be) measured.
    """
    if not refresh:
        with _memo_lock:
            known = _memo.get(backend)
        if isinstance(known, Calibration):
            return known
        if known is _ABSENT and not measure:
            return None
    where = store or CalibrationStore()
    fingerprint = backend.device_fingerprint()
    record = None
    if not refresh:
        record = where.load(backend.id, backend.version, fingerprint)
    if record is None and (measure or refresh):
        record = backend.calibrate()
        if record is not None:
            if record.measured_at == 0.0:
                record = replace(record, measured_at=time.time())
            where.save(record)
    with _memo_lock:
        _memo[backend] = record if record is not None else _ABSENT
    return record


def format_calibration(record: Calibration) -> str:
    """Return a short human-readable block describing ``record`` (for ``vyre-async info``)."""

    def ns(value: int | None) -> str:
        return "not measured" if value is None else f"{value / 1000:.2f} us"

    def rate(value: float | None) -> str:
        return "not measured" if value is None else f"{value / 1e9:.2f} GB/s"

    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.measured_at))
    return "\n".join(
        [
            f"calibration: {record.backend_id} {record.backend_version} "
            f"[{record.device_fingerprint or 'host'}] measured {when} ({record.timing} clocks)",
            f"  launch overhead:  {ns(record.launch_ns)}",
            f"  record / replay:  {ns(record.record_ns)} / {ns(record.replay_ns)}",
            f"  persistent setup: {ns(record.persistent_setup_ns)} "
            f"(+ {ns(record.persistent_item_ns)} per item)",
            f"  upload / download: {rate(record.h2d_bytes_per_s)} / {rate(record.d2h_bytes_per_s)}",
            f"  compile:          {ns(record.compile_ns)}",
        ]
    )


def launch_probe_program() -> Program:
    """The smallest real kernel (one lane stores one word): what ``launch_ns`` times.

    Backends' ``calibrate()`` dispatch it to measure per-launch host overhead.
    """
    return Program(
        [BufferDecl("out", 0, Access.WRITE, DType.U32, 1)],
        1,
        [Store("out", 0, u32(0))],
        op_id="calibrate.launch",
    )


def measure_host_costs(
    backend: VyreBackend,
    probe: VyreBackend,
    *,
    compile_once: Callable[[int], object],
    copy_bytes: int,
    settle: Callable[[], object] = lambda: None,
) -> Calibration:
    """Measure the costs every backend has, on ``probe``, and return ``backend``'s record.

    The shared part of a ``calibrate()``: the median host time ``dispatch()``
    takes for `launch_probe_program` (after one warm-up), the median of three
    ``compile_once(i)`` calls, and the best of three ``upload`` (then
    ``settle()``, which waits for the copy) and ``download`` of ``copy_bytes``.
    Host clocks; replay and persistent costs stay None.

    Args:
        backend: The backend the record is for (id, version, device fingerprint).
        probe: A private backend on the same device that does the work.
        compile_once: Compiles one typical pipeline; called with 0, 1, 2.
        copy_bytes: Bytes per copy (a multiple of 4).
        settle: Waits until submitted uploads finished (asynchronous backends).
    """
    trivial = launch_probe_program()
    probe.dispatch(trivial, []).result()  # compile once
    launches = []
    for _ in range(64):
        start = time.perf_counter_ns()
        pending = probe.dispatch(trivial, [])
        launches.append(time.perf_counter_ns() - start)
        pending.result()
    compiles = []
    for i in range(3):
        start = time.perf_counter_ns()
        compile_once(i)
        compiles.append(time.perf_counter_ns() - start)
    data = np.arange(copy_bytes // 4, dtype=np.uint32)
    probe.free(probe.upload(data))  # warm pinned pools
    settle()
    ups: list[float] = []
    downs: list[float] = []
    for _ in range(3):
        began = time.perf_counter()
        handle = probe.upload(data)
        settle()
        ups.append(time.perf_counter() - began)
        began = time.perf_counter()
        probe.download(handle)
        downs.append(time.perf_counter() - began)
        probe.free(handle)
    return Calibration(
        backend_id=backend.id,
        backend_version=backend.version,
        device_fingerprint=backend.device_fingerprint(),
        launch_ns=int(statistics.median(launches)),
        compile_ns=int(statistics.median(compiles)),
        h2d_bytes_per_s=data.nbytes / max(min(ups), 1e-9),
        d2h_bytes_per_s=data.nbytes / max(min(downs), 1e-9),
        timing="host",
        measured_at=time.time(),
    )


def measure_batch_costs(
    pipeline: CompiledPipeline,
    inputs: Sequence[Any],
    *,
    record_ns: Callable[[], int | None],
    rounds: int = 5,
) -> dict[str, int]:
    """Measure the launch-mode costs of ``pipeline``'s backend with ``dispatch_batch(mode=...)``.

    Host clocks, medians of ``rounds``; every batch is awaited before the next.
    Returns ``launch_ns`` (per launch of a plain 16-launch batch, L),
    ``replay_ns`` (per launch of a 16-replay batch once the graph exists, Rep),
    ``record_ns`` (from ``record_ns()`` after the first replay batch, Rec), and
    ``persistent_item_ns``/``persistent_setup_ns`` (slope and intercept of the
    persistent batch's host time between 4 and 32 items, m and S). A mode the
    backend lacks is left out.

    Args:
        pipeline: A compiled typical program.
        inputs: One input set for it.
        record_ns: Returns the capture cost of the graph the first replay batch made.
        rounds: Timed batches per figure.
    """
    caps = pipeline.backend.capabilities()

    def timed(size: int, mode: ModeKind) -> int:
        start = time.perf_counter_ns()
        pendings = pipeline.dispatch_batch([inputs] * size, mode=mode)
        took = time.perf_counter_ns() - start
        for pending in pendings:
            pending.result()
        return took

    def median(size: int, mode: ModeKind) -> float:
        return statistics.median(timed(size, mode) for _ in range(rounds))

    timed(16, "plain")  # warm
    costs = {"launch_ns": int(median(16, "plain") / 16)}
    if caps.graph_replay:
        timed(16, "command_reuse")  # captures the graph
        recorded = record_ns()
        if recorded is not None:
            costs["record_ns"] = int(recorded)
            costs["replay_ns"] = int(median(16, "command_reuse") / 16)
    if caps.persistent_threads:
        timed(4, "persistent")  # warm
        small, large = median(4, "persistent"), median(32, "persistent")
        item = max((large - small) / 28, 0.0)
        costs["persistent_item_ns"] = int(item)
        costs["persistent_setup_ns"] = int(max(small - 4 * item, 0.0))
    return costs
