"""`DiskPipelineCache`: compiled pipeline bytes on disk, safe across processes.

Layout ``root/<2 hex>/<64 hex>.bin``. Each entry is one file: a header (magic,
format version, the key it was written for, payload length, blake3 checksum of
the payload) followed by the payload. Entries are written to a temporary file in
the same directory, fsynced and ``os.replace``d into place, so a reader never
sees a partial entry and concurrent writers from several processes are safe
(the last complete write wins). A corrupt, truncated or foreign entry reads as
a miss with a `PipelineCacheWarning`, and is removed. Nothing is ever
unpickled or executed: entries are opaque bytes handed back to the backend
that wrote them. I/O failures become warnings, never crashes.
"""

from __future__ import annotations

import contextlib
import os
import struct
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import blake3

__all__ = [
    "DEFAULT_MAX_BYTES",
    "ENTRY_FORMAT_VERSION",
    "DiskCacheInfo",
    "DiskPipelineCache",
    "PipelineCacheWarning",
    "default_cache_root",
]

ENTRY_FORMAT_VERSION = 1
DEFAULT_MAX_BYTES = 1 << 30
MAX_ENTRY_BYTES = 256 << 20
_MAGIC = b"VYPC"
_HEADER = struct.Struct("<4sHH32sQ32s")  # magic, version, flags, key, payload length, checksum


class PipelineCacheWarning(RuntimeWarning):
    """A disk-cache entry could not be read or written; the cache carried on without it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DiskCacheInfo:
    """A summary of a disk cache's contents."""

    root: Path
    entries: int
    total_bytes: int
    max_bytes: int


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


def _warn(message: str) -> None:
    warnings.warn(message, PipelineCacheWarning, stacklevel=3)


class DiskPipelineCache:
    """A size-capped, crash-safe, multi-process store of compiled pipeline bytes.

    Args:
        root: Directory of the cache; `default_cache_root()` when None. Created
            with mode 0700.
        max_bytes: Size cap; least recently used entries are evicted beyond it.
    """

    def __init__(
        self, root: str | os.PathLike[str] | None = None, *, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.root = Path(root).expanduser() if root is not None else default_cache_root()
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.errors = 0

    # Paths ----------------------------------------------------------------------
    def path_for(self, key: str) -> Path:
        """Return the file that holds entry ``key`` (64 lowercase hex characters).

        Raises:
            ValueError: ``key`` is not 64 hex characters.
        """
        if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
            raise ValueError(f"cache key must be 64 lowercase hex characters, got {key!r}")
        return self.root / key[:2] / f"{key}.bin"

    def _ensure_dir(self, path: Path) -> None:
        for directory in (self.root, path):
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            if sys.platform != "win32" and directory.stat().st_mode & 0o777 != 0o700:
                directory.chmod(0o700)

    # Read -----------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        """Return the payload stored under ``key``, or None (missing, corrupt or foreign)."""
        path = self.path_for(key)
        try:
            with path.open("rb") as fh:
                header = fh.read(_HEADER.size)
                payload = self._check(key, header, fh)
        except FileNotFoundError:
            self.misses += 1
            return None
        except OSError as exc:
            self.misses += 1
            self.errors += 1
            _warn(f"pipeline cache entry {path} could not be read ({exc}); recompiling")
            return None
        if payload is None:
            self.misses += 1
            self.errors += 1
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        self.hits += 1
        with contextlib.suppress(OSError):
            os.utime(path)  # recency for LRU eviction
        return payload

    def _check(self, key: str, header: bytes, fh: BinaryIO) -> bytes | None:
        problem = self._problem(key, header, fh)
        if isinstance(problem, str):
            _warn(f"pipeline cache entry {key} {problem}; ignoring it and recompiling")
            return None
        return problem

    @staticmethod
    def _problem(key: str, header: bytes, fh: BinaryIO) -> bytes | str:
        if len(header) != _HEADER.size:
            return f"is truncated ({len(header)}-byte header)"
        magic, version, _flags, stored_key, length, checksum = _HEADER.unpack(header)
        if magic != _MAGIC:
            return f"is not a vyre-async entry (magic {magic!r})"
        if version != ENTRY_FORMAT_VERSION:
            return f"has format version {version}, expected {ENTRY_FORMAT_VERSION}"
        if stored_key.hex() != key:
            return "was written for another key"
        if length > MAX_ENTRY_BYTES:
            return f"claims {length} bytes (limit {MAX_ENTRY_BYTES})"
        payload = fh.read(length + 1)
        if len(payload) != length:
            return f"holds {len(payload)} payload bytes, its header says {length}"
        if blake3.blake3(payload).digest() != checksum:
            return "failed its checksum"
        return bytes(payload)

    # Write ----------------------------------------------------------------------
    def put(self, key: str, payload: bytes) -> bool:
        """Store ``payload`` under ``key`` atomically; return False (with a warning) on failure."""
        path = self.path_for(key)
        if len(payload) > MAX_ENTRY_BYTES:
            _warn(
                f"pipeline of {len(payload)} bytes exceeds the {MAX_ENTRY_BYTES}-byte entry "
                "limit; not cached"
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
        tmp: str | None = None
        try:
            self._ensure_dir(path.parent)
            fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "wb") as fh:
                fh.write(header)
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
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

    def _entries(self) -> list[tuple[float, int, Path]]:
        found: list[tuple[float, int, Path]] = []
        if not self.root.is_dir():
            return found
        for sub in self.root.iterdir():
            if len(sub.name) != 2 or not sub.is_dir():
                continue
            for entry in sub.glob("*.bin"):
                with contextlib.suppress(OSError):
                    st = entry.stat()
                    found.append((st.st_mtime, st.st_size, entry))
        return found

    def _evict(self) -> None:
        with self._lock:
            entries = self._entries()
            total = sum(size for _, size, _ in entries)
            for _, size, entry in sorted(entries, key=lambda e: e[0]):
                if total <= self.max_bytes:
                    break
                with contextlib.suppress(OSError):
                    entry.unlink()
                    total -= size

    # Maintenance ----------------------------------------------------------------
    def info(self) -> DiskCacheInfo:
        """Return the number and total size of the entries."""
        entries = self._entries()
        return DiskCacheInfo(
            root=self.root,
            entries=len(entries),
            total_bytes=sum(size for _, size, _ in entries),
            max_bytes=self.max_bytes,
        )

    def clear(self) -> int:
        """Delete every entry (and stray temporary files); return how many entries were removed."""
        removed = 0
        for _, _, entry in self._entries():
            with contextlib.suppress(OSError):
                entry.unlink()
                removed += 1
        if self.root.is_dir():
            for sub in self.root.iterdir():
                if len(sub.name) == 2 and sub.is_dir():
                    for stray in sub.glob(".*.tmp"):
                        with contextlib.suppress(OSError):
                            stray.unlink()
        return removed
