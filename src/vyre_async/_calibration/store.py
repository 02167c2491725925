"""Where calibration records live: `CalibrationStore` on disk, `calibration_for` in memory.

`calibration_for` returns a backend's cached record — in memory, then on
disk keyed by backend id, version and device fingerprint — and measures (the
backend's ``calibrate``) only when asked to. Records are JSON files ``<key>.json`` in a
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
pipeline disk cache (`vyre_async._cache.files`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from vyre_async._cache.disk import default_cache_root
from vyre_async._cache.files import (
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
from vyre_async._calibration import (
    record as record_module,  # (its format version, read at each use)
)
from vyre_async._calibration.probes import (
    measure_arm_overlap,
    measure_fusion_gain,
    measure_resident_gain,
)
from vyre_async._calibration.record import (
    _IDENTITY_FIELDS,
    Calibration,
    _json,
    calibration_key,
)
from vyre_async._exports import public_dir as _public_dir
from vyre_async.errors import InvalidProgram

if TYPE_CHECKING:
    from vyre_async._seams import BackendLike

__all__ = [
    "MAX_RECORD_BYTES",
    "CalibrationStore",
    "calibration_for",
    "default_calibration_root",
    "format_calibration",
]
__dir__ = _public_dir(__name__)

MAX_RECORD_BYTES = 1 << 20  # a record is a few hundred bytes; a larger file is not one
_log = logging.getLogger("vyre_async.calibration")
_RECORD_NAME = re.compile(r"(?P<key>[0-9a-f]{64})\.json")
_TEMP_PREFIX = ".calibration"
_TEMP_NAME = temp_name_pattern(r"\.calibration")
# How every record `CalibrationStore.save` writes begins (sorted keys, indent 2):
# a temp file is the store's if it is empty or begins with (part of) this.
_RECORD_HEAD = b'{\n  "backend_id": '


def default_calibration_root() -> Path:
    """Return ``<cache root>/calibration/v<CALIBRATION_FORMAT_VERSION>`` (``.../calibration/v2``).

    The cache root is ``$VYRE_CACHE_DIR`` when set, else the platform user cache
    directory of vyre-async (the parent of the pipeline cache).
    """
    env = os.environ.get("VYRE_CACHE_DIR")
    base = Path(env).expanduser() if env else default_cache_root().parent
    return base / "calibration" / f"v{record_module.CALIBRATION_FORMAT_VERSION}"


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
    if not 1 <= version <= record_module.CALIBRATION_FORMAT_VERSION or "launch_ns" not in data:
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
        `vyre_async._cache.files.STALE_TEMP_SECONDS`, are reclaimed (not
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
        and (
            record.concurrent_overlap_bps is None
            or record.resident_gain_bps is None
            or record.fusion_gain_bps is None
        )
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
            "  fusion gain:      "
            + (
                "not measured"
                if record.fusion_gain_bps is None
                else f"{record.fusion_gain_bps / 100:+.0f} % faster fused than as separate "
                "launches (16 tiny dispatches)"
            ),
        ]
    )


def _with_policy_inputs(backend: BackendLike, record: Calibration) -> Calibration:
    """``record`` with ``concurrent_overlap_bps``, ``resident_gain_bps`` and
    ``fusion_gain_bps`` measured on ``backend`` where they are None (a field that
    cannot be measured stays None)."""
    if record.concurrent_overlap_bps is None:
        overlap = measure_arm_overlap(backend)
        if overlap is not None:
            record = replace(record, concurrent_overlap_bps=overlap)
    if record.resident_gain_bps is None:
        gain = measure_resident_gain(backend)
        if gain is not None:
            record = replace(record, resident_gain_bps=gain)
    if record.fusion_gain_bps is None:
        fused = measure_fusion_gain(backend)
        if fused is not None:
            record = replace(record, fusion_gain_bps=fused)
    return record


#: Elements of the two probe dispatches of `measure_arm_overlap` (1 MiB each).
