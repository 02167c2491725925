"""Calibration: the measured device costs the launch policies consume.

A backend measures, once per device, its per-launch overhead, command
record/replay cost, persistent-kernel setup, host↔device bandwidth and compile
cost (`VyreBackend.calibrate`, which asks its executor). `calibration_for`
returns the cached record — in memory, then on disk keyed by backend id,
version and device fingerprint —
and measures only when asked to. Records are JSON files ``<key>.json`` in a
`CalibrationStore`'s root, by default ``<cache root>/calibration/v2/`` (the
folder is named for `CALIBRATION_FORMAT_VERSION`). A record is written to a
temp file named with the writer's pid, fsynced and ``os.replace``d, so a reader
never sees a partial record. A record that is corrupt, of another format
version, another device's, too large, or not a regular file reads as "not
calibrated" with a log line, never a crash or a hang.

The root may hold other files, so the store owns only the records and temp
files it wrote (see `CalibrationStore`): listing and clearing open only regular
files named like those, and delete only the store's own; an existing directory
keeps its mode (only a directory the store creates gets 0700); temp files left
by killed writers are reclaimed. The file-system rules are shared with the
pipeline disk cache (`vyre_async.cache.files`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import blake3
import numpy as np

from vyre_async._exports import public_dir as _public_dir
from vyre_async.arguments import real_number
from vyre_async.cache.disk import default_cache_root
from vyre_async.cache.files import (
    NotRegularFile,
    create_temp,
    make_private_dirs,
    non_regular_occupant,
    open_regular,
    read_prefix,
    root_directory,
    temp_is_stale,
    temp_name_pattern,
    unlink_unchanged,
)
from vyre_async.errors import InvalidArgument, InvalidProgram, UnsupportedFeature
from vyre_async.ir.expr import u32
from vyre_async.ir.program import Program
from vyre_async.ir.stmt import Store
from vyre_async.ir.types import Access, BufferDecl, DType

if TYPE_CHECKING:
    from vyre_async.policies.launch import ModeKind
    from vyre_async.seams import BackendLike, DeviceIdentity, PipelineLike

__all__ = [
    "CALIBRATION_FORMAT_VERSION",
    "MAX_RECORD_BYTES",
    "Calibration",
    "CalibrationStore",
    "calibration_for",
    "calibration_key",
    "default_calibration_root",
    "format_calibration",
    "launch_probe_program",
    "measure_arm_overlap",
    "measure_host_costs",
    "measure_resident_gain",
    "resident_gain_probe_program",
]
__dir__ = _public_dir(__name__)

CALIBRATION_FORMAT_VERSION = 2  # 2: persistent_item_ns; CUDA launch_ns per batched launch
MAX_RECORD_BYTES = 1 << 20  # a record is a few hundred bytes; a larger file is not one
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
_BPS_FIELDS = ("concurrent_overlap_bps", "resident_gain_bps")
_IDENTITY_FIELDS = ("backend_id", "backend_version", "device_fingerprint")
_RECORD_NAME = re.compile(r"(?P<key>[0-9a-f]{64})\.json")
_TEMP_PREFIX = ".calibration"
_TEMP_NAME = temp_name_pattern(r"\.calibration")
# How every record `CalibrationStore.save` writes begins (sorted keys, indent 2):
# a temp file is the store's if it is empty or begins with (part of) this.
_RECORD_HEAD = b'{\n  "backend_id": '


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


def default_calibration_root() -> Path:
    """Return ``<cache root>/calibration/v<CALIBRATION_FORMAT_VERSION>`` (``.../calibration/v2``).

    The cache root is ``$VYRE_CACHE_DIR`` when set, else the platform user cache
    directory of vyre-async (the parent of the pipeline cache).
    """
    env = os.environ.get("VYRE_CACHE_DIR")
    base = Path(env).expanduser() if env else default_cache_root().parent
    return base / "calibration" / f"v{CALIBRATION_FORMAT_VERSION}"


def _encode(record: Calibration) -> bytes:
    """Return the bytes `CalibrationStore.save` writes for ``record`` (they begin _RECORD_HEAD)."""
    text: str = _json().dumps(record.to_json(), indent=2, sort_keys=True)
    return text.encode()


def _read_json(path: Path) -> tuple[object, os.stat_result]:
    """Read and parse the JSON document at ``path``, opened as a regular file only.

    Returns:
        The parsed document and the ``fstat`` of the file it was read from.

    Raises:
        FileNotFoundError: Nothing is at ``path``.
        NotRegularFile: A symlink (not followed), FIFO (not waited on), device,
            socket or directory is there.
        OSError: It could not be opened or read.
        ValueError: It is larger than `MAX_RECORD_BYTES`, not UTF-8, or not JSON
            (nesting too deep for the parser included).
    """
    fd, st = open_regular(path)
    try:
        if st.st_size > MAX_RECORD_BYTES:
            raise ValueError(f"it holds {st.st_size} bytes, over the {MAX_RECORD_BYTES}-byte limit")
        data = read_prefix(fd, MAX_RECORD_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError(f"it holds over {MAX_RECORD_BYTES} bytes, the limit")
    try:
        return _json().loads(data.decode("utf-8")), st
    except RecursionError:
        raise ValueError("its JSON is nested too deeply") from None


def _is_record_for(data: object, key: str) -> bool:
    """Return whether ``data`` is a calibration record (of any format version so far) for ``key``.

    That is: a JSON object with an int ``format_version`` from 1 to
    `CALIBRATION_FORMAT_VERSION`, string ``backend_id``, ``backend_version``
    and ``device_fingerprint`` whose `calibration_key` is ``key``, and a
    ``launch_ns``. Its values need not be valid: a damaged record is still one.
    """
    if not isinstance(data, dict):
        return False
    version = data.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int):
        return False
    if not 1 <= version <= CALIBRATION_FORMAT_VERSION or "launch_ns" not in data:
        return False
    identity = [part for name in _IDENTITY_FIELDS if isinstance(part := data.get(name), str)]
    if len(identity) != len(_IDENTITY_FIELDS):
        return False
    try:
        return calibration_key(*identity) == key
    except InvalidProgram:  # an id without a UTF-8 form: no key of ours
        return False


class CalibrationStore:
    """Calibration records on disk: one JSON file per device, directly in ``root``.

    ``root`` may hold files the store did not write (it may be any directory),
    so the store owns only these, directly in ``root``:

    - a *record*: a regular file (not a symlink) ``<key>.json``, ``key`` 64
      lowercase hex characters, of at most `MAX_RECORD_BYTES`, holding a JSON
      object with the record fields (``format_version`` from 1 to
      `CALIBRATION_FORMAT_VERSION`, ``backend_id``, ``backend_version``,
      ``device_fingerprint``, ``launch_ns``) whose `calibration_key` is ``key``;
    - a *temp file*: a regular file ``.calibration.<pid>.<16 hex>.tmp``
      (``pid`` is the writer's process id) that is empty or begins the way
      every record `save` writes begins.

    `entries` and `clear` look at nothing else, and nothing else is ever
    deleted: other names, subdirectories, symlinks and special files are not
    opened, and a regular file named like a record that is not one (or is
    larger than `MAX_RECORD_BYTES`) is opened to check, never deleted.

    Args:
        root: Directory of the records; `default_calibration_root()` when None.
            `save` creates it (and its missing parents) with mode 0700; a
            directory that already exists keeps its mode.

    Raises:
        InvalidArgument: ``root`` is not None, a str or a path-like object.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = root_directory(root, default_calibration_root, "CalibrationStore")

    def path_for(self, backend_id: str, backend_version: str, device_fingerprint: str) -> Path:
        """Return the file holding the record of that device: ``root/<calibration_key>.json``."""
        return (
            self.root / f"{calibration_key(backend_id, backend_version, device_fingerprint)}.json"
        )

    def load(
        self, backend_id: str, backend_version: str, device_fingerprint: str
    ) -> Calibration | None:
        """Return the stored record of that device, or None.

        None when nothing is there, and, with a warning on the
        ``vyre_async.calibration`` logger, when the file there is not a
        regular file (a symlink is not followed, a FIFO not waited on), is
        larger than `MAX_RECORD_BYTES`, cannot be read, is corrupt or of
        another format version, or holds another device's record.
        """
        return self._read(self.path_for(backend_id, backend_version, device_fingerprint))

    def save(self, record: Calibration) -> bool:
        """Write ``record`` atomically; return False (and log a warning) when it was not written.

        Missing directories up to ``root`` are created with mode 0700; existing
        ones keep their mode. The record is written to a new temp file
        ``.calibration.<pid>.<16 hex>.tmp`` in ``root`` (created with
        ``O_EXCL | O_NOFOLLOW``), fsynced and renamed onto the record's path:
        a regular file there is replaced; anything else there (a symlink,
        FIFO, directory...) is left alone and the save fails. After a
        successful save, stale temp files are reclaimed (see `clear`).
        """
        path = self.root / f"{record.key()}.json"
        payload = _encode(record)
        tmp: Path | None = None
        try:
            make_private_dirs(self.root)
            fd, tmp = create_temp(self.root, _TEMP_PREFIX)
            with os.fdopen(fd, "wb") as fh:
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
            occupant = non_regular_occupant(path)
            if occupant is not None:
                _log.warning(
                    "calibration record %s is a %s, not a regular file; leaving it there and "
                    "not saving",
                    path,
                    occupant,
                )
                return False
            os.replace(tmp, path)
            tmp = None
        except OSError as exc:
            _log.warning("calibration record %s could not be written (%s)", path, exc)
            return False
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        self._reclaim_temps()
        return True

    def entries(self) -> list[Calibration]:
        """Return every readable record, sorted by backend id and device fingerprint.

        Only regular files named ``<64 hex>.json`` directly in ``root`` are
        read; each that is not a current, valid record stored under its own
        key is skipped with a warning (as in `load`).
        """
        found = [self._read(path) for path, _ in self._files(_RECORD_NAME)]
        records = [r for r in found if r is not None]
        return sorted(records, key=lambda r: (r.backend_id, r.device_fingerprint))

    def clear(self) -> int:
        """Delete every record the store owns; return how many were removed.

        Records of older format versions, and damaged ones that still carry
        the record fields under their own key, are deleted too. Temp files
        whose writer process no longer exists, or that are older than
        `vyre_async.cache.files.STALE_TEMP_SECONDS`, are reclaimed (not
        counted); those of live writers stay. Nothing else is deleted.
        """
        removed = 0
        for path, match in self._files(_RECORD_NAME):
            try:
                data, st = _read_json(path)
            except (OSError, ValueError):
                continue
            if _is_record_for(data, match["key"]) and unlink_unchanged(path, st):
                removed += 1
        self._reclaim_temps()
        return removed

    def _files(self, pattern: re.Pattern[str]) -> Iterator[tuple[Path, re.Match[str]]]:
        """Yield the regular files (not symlinks) directly in ``root`` whose names match."""
        try:
            with os.scandir(self.root) as it:
                listing = sorted(it, key=lambda item: item.name)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            _log.warning("calibration directory %s could not be listed (%s)", self.root, exc)
            return
        for item in listing:
            match = pattern.fullmatch(item.name)
            if match is None:
                continue
            try:
                if not item.is_file(follow_symlinks=False):
                    continue
            except OSError:
                continue
            yield Path(item.path), match

    def _reclaim_temps(self) -> None:
        """Delete the store's temp files whose writer is gone or that are stale."""
        now = time.time()
        for path, match in self._files(_TEMP_NAME):
            try:
                fd, st = open_regular(path)
            except OSError:
                continue
            try:
                head = read_prefix(fd, len(_RECORD_HEAD))
            except OSError:
                continue
            finally:
                os.close(fd)
            if _RECORD_HEAD.startswith(head) and temp_is_stale(
                int(match["pid"]), st.st_mtime, now=now
            ):
                unlink_unchanged(path, st)

    @staticmethod
    def _read(path: Path) -> Calibration | None:
        """Return the record at ``path`` if it is a valid current record under its own key."""
        try:
            data, _ = _read_json(path)
        except FileNotFoundError:
            return None
        except NotRegularFile as exc:
            _log.warning("calibration record %s; ignoring it", exc)
            return None
        except OSError as exc:
            _log.warning("calibration record %s could not be read (%s)", path, exc)
            return None
        except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
            _log.warning("calibration record %s is unreadable (%s); ignoring it", path, exc)
            return None
        try:
            record = Calibration.from_json(data)
            key = record.key()
        # (a 401-digit number where seconds go, a lone surrogate in an id: damage too)
        except (ValueError, OverflowError, InvalidProgram) as exc:
            _log.warning("calibration record %s is unreadable (%s); ignoring it", path, exc)
            return None
        if key != path.stem:
            _log.warning("calibration record %s belongs to another device; ignoring it", path)
            return None
        return record


_ABSENT = object()
_memo: weakref.WeakKeyDictionary[BackendLike, object] = weakref.WeakKeyDictionary()
_memo_lock = threading.Lock()


def calibration_for(
    backend: BackendLike,
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
            record = _with_policy_inputs(backend, record)
            where.save(record)
    elif (
        record is not None
        and measure
        and (record.concurrent_overlap_bps is None or record.resident_gain_bps is None)
    ):
        filled = _with_policy_inputs(backend, record)  # a record written before the fields
        if filled != record:
            record = filled
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
            "  arm overlap:      "
            + (
                "not measured"
                if record.concurrent_overlap_bps is None
                else f"{record.concurrent_overlap_bps / 100:+.0f} % of the shorter of two "
                "concurrent dispatches hidden"
            ),
            "  resident gain:    "
            + (
                "not measured"
                if record.resident_gain_bps is None
                else f"{record.resident_gain_bps / 100:+.0f} % faster with resident buffers "
                "than with host arrays"
            ),
        ]
    )


def _with_policy_inputs(backend: BackendLike, record: Calibration) -> Calibration:
    """``record`` with ``concurrent_overlap_bps`` and ``resident_gain_bps`` measured on
    ``backend`` where they are None (a field that cannot be measured stays None)."""
    if record.concurrent_overlap_bps is None:
        overlap = measure_arm_overlap(backend)
        if overlap is not None:
            record = replace(record, concurrent_overlap_bps=overlap)
    if record.resident_gain_bps is None:
        gain = measure_resident_gain(backend)
        if gain is not None:
            record = replace(record, resident_gain_bps=gain)
    return record


#: Elements of the two probe dispatches of `measure_arm_overlap` (1 MiB each).
ARM_OVERLAP_PROBE_ELEMENTS = 1 << 18


def measure_arm_overlap(
    backend: BackendLike, *, rounds: int = 5, elements: int = ARM_OVERLAP_PROBE_ELEMENTS
) -> int | None:
    """Measure how much running two independent dispatches concurrently saves on ``backend``.

    The probes are two typical, different kernels over ``elements`` words: an
    elementwise xor and a 256-bin histogram (workgroup atomics, a barrier,
    storage atomics). Each round (after one warm-up of each) runs them one after
    the other, each awaited before the next is dispatched (times ``a``, ``b``),
    then both dispatched before either is awaited (time ``c``); the round's
    overlap is ``(a + b - c) / min(a, b)``, the share of the shorter dispatch
    that concurrency hid. The result is the median over ``rounds`` (the probe
    order alternates), clamped to -1..1, in basis points. Host clocks; blocks
    the calling thread (call it outside event loops, like ``calibrate()``).

    It runs on ``backend`` itself: its worker threads or streams are what the
    arm scheduler will use. A backend may measure it in its own ``calibrate()``
    instead (on a probe with the same concurrency).

    Args:
        backend: The backend to measure.
        rounds: Timed rounds (>= 1).
        elements: Words per probe buffer.

    Returns:
        Basis points in -10000..10000, or None when the probes could not run
        (logged on the ``vyre_async.calibration`` logger).
    """
    from vyre_async.programs import elementwise_xor, histogram

    data = np.arange(elements, dtype=np.uint32)
    probes = (
        (elementwise_xor(elements), [data, data]),
        (histogram(), [data, np.zeros(256, np.uint32)]),
    )
    samples: list[float] = []
    try:
        for program, inputs in probes:
            backend.dispatch(program, inputs).result()  # compile and warm
        for number in range(max(1, rounds)):
            (p1, i1), (p2, i2) = probes if number % 2 == 0 else probes[::-1]
            start = time.perf_counter()
            backend.dispatch(p1, i1).result()
            middle = time.perf_counter()
            backend.dispatch(p2, i2).result()
            in_order_end = time.perf_counter()
            first, second = backend.dispatch(p1, i1), backend.dispatch(p2, i2)
            first.result()
            second.result()
            together = time.perf_counter() - in_order_end
            shorter = max(min(middle - start, in_order_end - middle), 1e-9)
            samples.append((in_order_end - start - together) / shorter)
    except Exception as exc:  # a backend that cannot run the probes is not calibrated for it
        _log.warning("arm overlap of backend %r not measured (%s)", backend.id, exc)
        return None
    return max(-10_000, min(10_000, round(_median(samples) * 10_000)))


#: Elements of each buffer of `measure_resident_gain`'s probe (1 MiB each).
RESIDENT_GAIN_PROBE_ELEMENTS = 1 << 18


def resident_gain_probe_program(elements: int = RESIDENT_GAIN_PROBE_ELEMENTS) -> Program:
    """The resident side of `measure_resident_gain`'s probe: the xor, its output READ_WRITE."""
    from vyre_async.programs import elementwise_xor

    xor = elementwise_xor(elements)
    return Program(
        [
            BufferDecl(d.name, d.binding, Access.READ_WRITE, d.dtype, d.count)
            if d.access is Access.WRITE
            else d
            for d in xor.buffers
        ],
        xor.workgroup_size,
        xor.body,
        op_id="calibrate.resident_gain",
    )


def measure_resident_gain(
    backend: BackendLike, *, rounds: int = 5, elements: int = RESIDENT_GAIN_PROBE_ELEMENTS
) -> int | None:
    """Measure how much faster a dispatch runs on resident buffers than on host arrays.

    The probe is an elementwise xor over ``elements`` words, run the two ways
    the arm graph can run it (`vyre_async.graph.ArmGraph.run`): on host arrays
    (``dispatch(xor, [a, b])``), and on resident buffers: both inputs uploaded
    once, the output a fresh zero-filled resident buffer (``alloc``) passed to
    the same kernel with that buffer READ_WRITE, freed afterwards. Every
    dispatch is awaited (``.result()``) before the next; a resident dispatch's
    time includes its ``alloc`` and ``free``. Each round (after one warm-up of
    each) times ``repeats = 3`` dispatches of each way, the order alternating
    between rounds; the round's gain is ``(host - resident) / host`` of the
    medians. The result is the median over ``rounds``, clamped to -1..1, in
    basis points. Host clocks; blocks the calling thread (call it outside
    event loops, like ``calibrate()``). Tens of milliseconds on the reference
    backend.

    Args:
        backend: The backend to measure.
        rounds: Timed rounds (>= 1).
        elements: Words per probe buffer.

    Returns:
        Basis points in -10000..10000, or None when the backend has no resident
        buffers (its ``upload`` raised `UnsupportedFeature`) or the probe could
        not run (logged on the ``vyre_async.calibration`` logger).
    """
    from vyre_async.programs import elementwise_xor

    xor = elementwise_xor(elements)
    resident_xor = resident_gain_probe_program(elements)
    out = next(d for d in xor.buffers if d.access is Access.WRITE)
    data = np.arange(elements, dtype=np.uint32)
    uploaded: list[Any] = []
    try:
        try:
            uploaded.append(backend.upload(data, label="calibrate.resident_gain"))
        except UnsupportedFeature:
            _log.info("resident gain of backend %r not measured: no resident buffers", backend.id)
            return None
        uploaded.append(backend.upload(data, label="calibrate.resident_gain"))

        def on_host() -> float:
            start = time.perf_counter()
            backend.dispatch(xor, [data, data]).result()
            return time.perf_counter() - start

        def resident() -> float:
            start = time.perf_counter()
            fresh = backend.alloc(out.dtype, elements, label="calibrate.resident_gain")
            try:
                backend.dispatch(resident_xor, [*uploaded, fresh]).result()
            finally:
                backend.free(fresh)
            return time.perf_counter() - start

        on_host()  # compile and warm
        resident()
        samples: list[float] = []
        for number in range(max(1, rounds)):
            ways = (on_host, resident) if number % 2 == 0 else (resident, on_host)
            times: dict[Callable[[], float], list[float]] = {way: [] for way in ways}
            for _ in range(3):
                for way in ways:
                    times[way].append(way())
            host_s = max(_median(times[on_host]), 1e-9)
            samples.append((host_s - _median(times[resident])) / host_s)
    except Exception as exc:  # a backend that cannot run the probe is not calibrated for it
        _log.warning("resident gain of backend %r not measured (%s)", backend.id, exc)
        return None
    finally:
        for handle in uploaded:
            with contextlib.suppress(Exception):
                backend.free(handle)
    return max(-10_000, min(10_000, round(_median(samples) * 10_000)))


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
    backend: DeviceIdentity,
    probe: BackendLike,
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
        backend: The backend or executor the record is for (id, version, device
            fingerprint).
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
        launch_ns=int(_median(launches)),
        compile_ns=int(_median(compiles)),
        h2d_bytes_per_s=data.nbytes / max(min(ups), 1e-9),
        d2h_bytes_per_s=data.nbytes / max(min(downs), 1e-9),
        timing="host",
        measured_at=time.time(),
    )


def measure_batch_costs(
    pipeline: PipelineLike,
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
        return _median(timed(size, mode) for _ in range(rounds))

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
