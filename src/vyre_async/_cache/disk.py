"""`DiskPipelineCache`: compiled pipeline bytes on disk, safe across processes.

Layout ``root/<2 hex>/<64 hex>.bin``. Each entry is one file: a header (magic
``VYPC``, format version, the key it was written for, payload length, blake3
checksum of the payload) followed by the payload. Entries are written to a
temporary file in the same directory, fsynced and ``os.replace``d into place, so
a reader never sees a partial entry and concurrent writers from several
processes are safe (the last complete write wins). Nothing is ever unpickled or
executed: entries are opaque bytes handed back to the backend that wrote them.
I/O failures become warnings, never crashes.

Ownership. The root may hold other files (``$VYRE_CACHE_DIR`` can point
anywhere), so the cache owns only the files it wrote, recognised by name *and*
header:

- an *entry* is a regular file (not a symlink) ``root/<hh>/<key>.bin`` where
  ``key`` is 64 lowercase hex characters, ``<hh>`` is a directory (not a
  symlink) named ``key[:2]``, and the file starts with the magic, a known
  format version and ``key`` itself;
- a *temp file* is a regular file ``root/<hh>/.<key[:16]>.<pid>.<16 hex>.tmp``
  (``pid`` is the writer's process id, ``hh`` is ``key[:2]``) that is empty or
  starts with the magic (or the first bytes of it).

Eviction, `DiskPipelineCache.clear` and `DiskPipelineCache.info` look at those
files only; any other file, name, subdirectory or symlink under the root is
never counted, written to or deleted (a file named like the cache's is opened
for reading, never following a symlink, to check its header).
`DiskPipelineCache.get` opens an
entry as a regular file only: a FIFO, device, directory or symlink at an entry
path, like a corrupt or foreign file there, is a miss with a
`PipelineCacheWarning` and is left in place (``get`` never deletes anything).
The next `DiskPipelineCache.put` for that key replaces a regular file there
with the new entry; anything else it leaves alone (the put fails with a
warning), and it never writes through a ``<2 hex>`` subdirectory that is a
symlink (eviction and clear would not see the entry).

Permissions. A directory the cache creates (the root, parents of the root that
did not exist, a ``<2 hex>`` subdirectory) gets mode 0700; a directory that
already existed keeps its mode.

Temp files. A writer killed between creating its temp file and renaming it
leaves the temp file behind. The cache's temp files count toward the size cap,
and eviction and `DiskPipelineCache.clear` delete the ones whose writer process
no longer exists, or that are older than `STALE_TEMP_SECONDS` whoever wrote
them (a reused pid, another host on a shared file system). A temp file of a
live writer is left alone. Liveness is ``os.kill(pid, 0)`` on POSIX (a process
of another user counts as alive); on Windows it is not probed, so only age
reclaims temp files there. A writer in another pid namespace looks dead: if
its temp file is reclaimed mid-write, its put fails with a warning.

The file-system rules above (regular files only, private directories, temp
files named with the writer's pid) are `vyre_async._cache.files`, shared with
the calibration store.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import blake3

from vyre_async._arguments import whole_number
from vyre_async._cache.files import (
    STALE_TEMP_SECONDS,
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
from vyre_async._exports import public_dir as _public_dir
from vyre_async.errors import InvalidArgument

__all__ = [
    "DEFAULT_MAX_BYTES",
    "ENTRY_FORMAT_VERSION",
    "STALE_TEMP_SECONDS",
    "DiskCacheInfo",
    "DiskPipelineCache",
    "PipelineCacheWarning",
    "default_cache_root",
]
__dir__ = _public_dir(__name__)

ENTRY_FORMAT_VERSION = 1
DEFAULT_MAX_BYTES = 1 << 30
MAX_ENTRY_BYTES = 256 << 20
_MAGIC = b"VYPC"
_KNOWN_VERSIONS = frozenset({ENTRY_FORMAT_VERSION})
_HEADER = struct.Struct("<4sHH32sQ32s")  # magic, version, flags, key, payload length, checksum
_OWNER = struct.Struct("<4sHH32s")  # the leading part of the header that says whose file it is

_SUBDIR_NAME = re.compile(r"[0-9a-f]{2}")
#: How far in the past `DiskPipelineCache.touch` dates entries in use: more than a file
#: system's write-clock tick, so that the entry written next is the newest.
_TOUCH_LEAD_NS = 20_000_000
_KEY = re.compile(r"[0-9a-f]{64}")
_ENTRY_NAME = re.compile(r"([0-9a-f]{64})\.bin")
_TEMP_NAME = temp_name_pattern(r"\.(?P<key>[0-9a-f]{16})")


class PipelineCacheWarning(RuntimeWarning):
    """A disk-cache entry could not be read or written; the cache carried on without it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DiskCacheInfo:
    """A summary of the files a disk cache owns under its root.

    Attributes:
        root: The cache root.
        entries: Number of entries (files that are the cache's by name and header).
        total_bytes: Bytes of the entries plus the temp files: the figure the
            size cap applies to.
        max_bytes: The size cap.
        temp_files: Number of the cache's temp files: writes in progress, and
            those left by killed writers until eviction or
            `DiskPipelineCache.clear` reclaims them.
        temp_bytes: Bytes of those temp files (included in ``total_bytes``).
    """

    root: Path
    entries: int
    total_bytes: int
    max_bytes: int
    temp_files: int = 0
    temp_bytes: int = 0


@dataclass(frozen=True, slots=True)
class _Owned:
    """One file the cache owns, as a scan found it."""

    path: Path
    size: int
    mtime: float
    pid: int = 0  # temp files: the writer's process id


def default_cache_root() -> Path:
    """Return the cache root: ``$VYRE_CACHE_DIR``, else the platform's user cache directory."""
    env = os.environ.get("VYRE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
        return base / "vyre-async" / "Cache" / "pipelines"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "vyre-async" / "pipelines"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "vyre-async" / "pipelines"


def _warn(message: str, stacklevel: int = 3) -> None:
    warnings.warn(message, PipelineCacheWarning, stacklevel=stacklevel)


def _is_entry_header(key: str) -> Callable[[bytes], bool]:
    def check(head: bytes) -> bool:
        if len(head) < _OWNER.size:
            return False
        magic, version, _flags, stored_key = _OWNER.unpack_from(head)
        return magic == _MAGIC and version in _KNOWN_VERSIONS and stored_key.hex() == key

    return check


def _is_temp_header(head: bytes) -> bool:
    return _MAGIC.startswith(head[: len(_MAGIC)])  # empty, or the first bytes of an entry


def _owned_stat(path: Path, owned: Callable[[bytes], bool]) -> os.stat_result | None:
    """Return the stat of ``path`` if it is a regular file whose first bytes pass ``owned``."""
    try:
        fd, st = open_regular(path)
    except OSError:
        return None
    try:
        return st if owned(read_prefix(fd, _OWNER.size)) else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _unlink_owned(path: Path, owned: Callable[[bytes], bool]) -> bool:
    """Delete ``path`` only if it is, right now, a regular file the cache owns."""
    st = _owned_stat(path, owned)
    return st is not None and unlink_unchanged(path, st)


def _list(directory: str | Path, stacklevel: int) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        _warn(
            f"pipeline cache directory {directory} could not be listed ({exc}); skipping it",
            stacklevel,
        )
        return []


class DiskPipelineCache:
    """A size-capped, crash-safe, multi-process store of compiled pipeline bytes.

    The cache owns only files it wrote, recognised by name and header (see the
    module docstring); eviction, `clear` and `info` never touch anything else
    under ``root``.

    Args:
        root: Directory of the cache; `default_cache_root()` when None. Missing
            directories are created with mode 0700; an existing directory keeps
            its mode.
        max_bytes: Size cap on the entries plus temp files; least recently used
            entries are evicted beyond it.

    Raises:
        InvalidArgument: ``max_bytes`` is not an int >= 0, or ``root`` is not a path.
    """

    def __init__(
        self, root: str | os.PathLike[str] | None = None, *, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self.max_bytes = whole_number(
            "DiskPipelineCache max_bytes", max_bytes, example=f"max_bytes={DEFAULT_MAX_BYTES}"
        )
        self.root = root_directory(root, default_cache_root, "DiskPipelineCache")
        self._lock = threading.Lock()
        self._verified: dict[Path, tuple[int, int]] = {}  # entry -> (inode, size) seen owned
        self.hits = 0
        self.misses = 0
        self.errors = 0

    # Paths ----------------------------------------------------------------------
    def path_for(self, key: str) -> Path:
        """Return the file that holds entry ``key`` (64 lowercase hex characters).

        Raises:
            InvalidArgument: ``key`` is not 64 lowercase hex characters.
        """
        if not isinstance(key, str) or _KEY.fullmatch(key) is None:
            raise InvalidArgument(
                f"cache key must be 64 lowercase hex characters, got {key!r}",
                fix="pass a pipeline identity's .hex (a lowercase blake3 hex digest)",
            )
        return self.root / key[:2] / f"{key}.bin"

    # Read -----------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        """Return the payload stored under ``key``, or None on a miss.

        Besides a missing entry, a miss is an entry that is corrupt, truncated,
        of another format version or written for another key, or something
        other than a regular file at the entry path: a symlink (not followed), a
        FIFO (never waited on), a device or a directory. Those also count in
        ``errors`` and warn with a `PipelineCacheWarning`. ``get`` never deletes
        anything: the next `put` replaces a bad regular file.

        Raises:
            InvalidArgument: ``key`` is not 64 lowercase hex characters.
        """
        path = self.path_for(key)
        try:
            fd, _ = open_regular(path)
        except FileNotFoundError:
            self.misses += 1
            return None
        except NotRegularFile as exc:
            self._failed_read(f"pipeline cache entry {exc}; ignoring it and recompiling")
            return None
        except OSError as exc:
            self._failed_read(f"pipeline cache entry {path} could not be read ({exc}); recompiling")
            return None
        try:
            with os.fdopen(fd, "rb") as fh:
                payload = self._check(key, fh.read(_HEADER.size), fh)
                if payload is not None:
                    self._touch(fh.fileno(), path)
        except OSError as exc:
            self._failed_read(f"pipeline cache entry {path} could not be read ({exc}); recompiling")
            return None
        if payload is None:
            self.misses += 1
            self.errors += 1
            return None
        self.hits += 1
        return payload

    def _failed_read(self, message: str) -> None:
        self.misses += 1
        self.errors += 1
        _warn(message, 4)

    def touch(self, keys: Iterable[str]) -> int:
        """Mark the entries ``keys`` as just used (for pipelines served from memory).

        Recency for eviction is an entry's mtime, which a read refreshes; a
        pipeline a process keeps serving from its memory cache is not read
        again, so the driver touches those before each `put` (which may evict).
        Only regular files this cache owns are touched (checked by header);
        missing or foreign ones are skipped. Returns how many were touched.

        The times are set explicitly, in the order of ``keys`` (least recently
        used first), a few ms in the past: a file system's clock for writes
        ticks every few ms, so entries touched "now" would tie with each other
        and with the entry written next, and eviction would pick among them
        blindly.
        """
        touched = 0
        base = time.time_ns() - _TOUCH_LEAD_NS
        for key in keys:
            path = self.path_for(key)
            try:
                fd, _ = open_regular(path)
            except OSError:
                continue  # not there (evicted, cleared), or not a regular file
            try:
                if _is_entry_header(key)(read_prefix(fd, _OWNER.size)):
                    when = base + touched * 1000
                    if os.utime in os.supports_fd:
                        os.utime(fd, ns=(when, when))
                    else:
                        os.utime(path, ns=(when, when))
                    touched += 1
            except OSError:
                pass
            finally:
                os.close(fd)
        return touched

    @staticmethod
    def _touch(fd: int, path: Path) -> None:
        """Mark an entry as just used (its mtime is its recency for LRU eviction)."""
        with contextlib.suppress(OSError):
            if os.utime in os.supports_fd:
                os.utime(fd)
            else:
                os.utime(path)

    def _check(self, key: str, header: bytes, fh: BinaryIO) -> bytes | None:
        problem = self._problem(key, header, fh)
        if isinstance(problem, str):
            _warn(f"pipeline cache entry {key} {problem}; ignoring it and recompiling", 4)
            return None
        return problem

    @staticmethod
    def _problem(key: str, header: bytes, fh: BinaryIO) -> bytes | str:
        if len(header) != _HEADER.size:
            return f"is truncated ({len(header)}-byte header)"
        magic, version, _flags, stored_key, length, checksum = _HEADER.unpack(header)
        if magic != _MAGIC:
            return f"is not a vyre-async entry (magic {magic!r})"
        if version not in _KNOWN_VERSIONS:
            return f"has format version {version}, expected {ENTRY_FORMAT_VERSION}"
        if stored_key.hex() != key:
            return "was written for another key"
        if length > MAX_ENTRY_BYTES:
            return f"claims {length} bytes (limit {MAX_ENTRY_BYTES})"
        payload = fh.read(length + 1)  # one byte more tells a longer file from an exact one
        if len(payload) < length:
            return f"holds {len(payload)} payload bytes, its header says {length}"
        if len(payload) > length:
            return f"holds more payload bytes than the {length} its header says"
        if blake3.blake3(payload).digest() != checksum:
            return "failed its checksum"
        return bytes(payload)

    # Write ----------------------------------------------------------------------
    def put(self, key: str, payload: bytes) -> bool:
        """Store ``payload`` under ``key`` atomically; return False (with a warning) on failure.

        The entry is written to a temp file ``.<key[:16]>.<pid>.<16 hex>.tmp``
        in its directory, fsynced and renamed over the entry path. A regular
        file there (an older, corrupt or foreign entry) is replaced; anything
        else there (a symlink, FIFO, directory...), or a ``<2 hex>`` directory
        that is a symlink, is left alone and the put fails. Then least recently
        used entries are evicted until the cache's files fit ``max_bytes``. An
        entry larger than ``max_bytes`` by itself is not written (the others
        stay); ``max_bytes=0`` keeps nothing.

        Raises:
            InvalidArgument: ``key`` is not 64 lowercase hex characters, or
                ``payload`` is not bytes (bytes, bytearray or a contiguous
                memoryview).
        """
        path = self.path_for(key)
        given: object = payload
        if not isinstance(given, bytes | bytearray | memoryview) or (
            isinstance(given, memoryview) and not given.c_contiguous
        ):
            raise InvalidArgument(
                f"a pipeline cache entry holds bytes, got a {type(given).__name__}",
                fix="pass the bytes of the serialised pipeline",
            )
        payload = bytes(given)
        if len(payload) > MAX_ENTRY_BYTES:
            _warn(
                f"pipeline of {len(payload)} bytes exceeds the {MAX_ENTRY_BYTES}-byte entry "
                "limit; not cached"
            )
            return False
        if self.max_bytes and _HEADER.size + len(payload) > self.max_bytes:
            # Storing it would evict every other entry, then it: keep the others.
            _warn(
                f"pipeline of {len(payload)} bytes does not fit the cache's "
                f"max_bytes={self.max_bytes}; not cached (Fix: raise max_bytes)"
            )
            return False
        header = _HEADER.pack(
            _MAGIC,
            ENTRY_FORMAT_VERSION,
            0,
            bytes.fromhex(key),
            len(payload),
            blake3.blake3(payload).digest(),
        )
        tmp: Path | None = None
        try:
            make_private_dirs(path.parent)
            if path.parent.is_symlink():  # eviction and clear never follow it: refuse
                self.errors += 1
                _warn(
                    f"pipeline cache directory {path.parent} is a symbolic link; "
                    "continuing without caching (entries there would escape the size cap)"
                )
                return False
            fd, tmp = create_temp(path.parent, f".{key[:16]}")
            with os.fdopen(fd, "wb") as fh:
                fh.write(header)
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
            occupant = non_regular_occupant(path)
            if occupant is not None:
                self.errors += 1
                _warn(
                    f"pipeline cache entry {path} is a {occupant}, not a regular file; "
                    "leaving it there and continuing without caching"
                )
                return False
            os.replace(tmp, path)
            tmp = None
        except OSError as exc:
            self.errors += 1
            _warn(
                f"pipeline cache entry {path} could not be written ({exc}); continuing without it"
            )
            return False
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        self._evict()
        return True

    # Ownership ------------------------------------------------------------------
    def _scan(self, stacklevel: int) -> tuple[list[_Owned], list[_Owned]]:
        """Return the entries and temp files the cache owns; call with the lock held.

        ``stacklevel`` is that of the warning about a directory that cannot be
        listed, counted from `_warn`: 5 points at the caller of `info` or
        `clear`, 6 at the caller of `put` (through `_evict`).
        """
        entries: list[_Owned] = []
        temps: list[_Owned] = []
        verified: dict[Path, tuple[int, int]] = {}
        for sub in _list(self.root, stacklevel):
            try:
                if not _SUBDIR_NAME.fullmatch(sub.name) or not sub.is_dir(follow_symlinks=False):
                    continue
            except OSError:
                continue
            for item in _list(sub.path, stacklevel):
                try:
                    if not item.is_file(follow_symlinks=False):
                        continue
                    st = item.stat(follow_symlinks=False)
                    inode = item.inode()
                except OSError:
                    continue
                path = Path(item.path)
                entry = _ENTRY_NAME.fullmatch(item.name)
                temp = _TEMP_NAME.fullmatch(item.name)
                if entry is not None and entry[1][:2] == sub.name:
                    seen = (inode, st.st_size)
                    known = bool(inode) and self._verified.get(path) == seen
                    if known or _owned_stat(path, _is_entry_header(entry[1])) is not None:
                        verified[path] = seen
                        entries.append(_Owned(path, st.st_size, st.st_mtime))
                elif (
                    temp is not None
                    and temp["key"][:2] == sub.name
                    and _owned_stat(path, _is_temp_header) is not None
                ):
                    temps.append(_Owned(path, st.st_size, st.st_mtime, pid=int(temp["pid"])))
        self._verified = verified
        return entries, temps

    @staticmethod
    def _reclaim(temps: list[_Owned]) -> list[_Owned]:
        """Delete the temp files of gone or stale writers; return the ones kept."""
        now = time.time()
        kept: list[_Owned] = []
        for temp in temps:
            stale = temp_is_stale(temp.pid, temp.mtime, now=now)
            if not (stale and _unlink_owned(temp.path, _is_temp_header)):
                kept.append(temp)
        return kept

    def _evict(self) -> None:
        with self._lock:
            entries, temps = self._scan(6)
            temps = self._reclaim(temps)
            total = sum(e.size for e in entries) + sum(t.size for t in temps)
            for entry in sorted(entries, key=lambda e: e.mtime):
                if total <= self.max_bytes:
                    break
                if _unlink_owned(entry.path, _is_entry_header(entry.path.stem)):
                    total -= entry.size

    # Maintenance ----------------------------------------------------------------
    def info(self) -> DiskCacheInfo:
        """Return the number and size of the entries and temp files the cache owns.

        Only the cache's own files are counted (see the module docstring);
        nothing is deleted. ``total_bytes`` includes the temp files.
        """
        with self._lock:
            entries, temps = self._scan(5)
        temp_bytes = sum(t.size for t in temps)
        return DiskCacheInfo(
            root=self.root,
            entries=len(entries),
            total_bytes=sum(e.size for e in entries) + temp_bytes,
            max_bytes=self.max_bytes,
            temp_files=len(temps),
            temp_bytes=temp_bytes,
        )

    def clear(self) -> int:
        """Delete every entry and reclaimable temp file the cache owns; return the entries removed.

        Temp files of live writers stay (their writes are in progress); files
        the cache does not own, and directories, are never deleted.
        """
        with self._lock:
            entries, temps = self._scan(5)
            self._reclaim(temps)
            return sum(1 for e in entries if _unlink_owned(e.path, _is_entry_header(e.path.stem)))
