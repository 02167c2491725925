"""DiskPipelineCache: the behaviour mutation testing (issue 28) found unchecked.

Exact warning texts and the line each warning points at, the counters, the
size limits at their boundaries, the on-disk format, and what the cache does on
platforms or file systems the suite does not run on (simulated: no ``utime`` on
a descriptor, no ``O_NOFOLLOW``, a read-only or failing file system). Clocks
are injected (``time.time`` / ``time.time_ns``) and file times set with
``os.utime``: nothing here sleeps.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
import sys
import time
import tracemalloc
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, TypeVar

import blake3
import pytest

import vyre_async._cache.disk as disk
import vyre_async._cache.files as files
from vyre_async._cache import DiskPipelineCache, PipelineCacheWarning, default_cache_root
from vyre_async.errors import InvalidProgram

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX file types and modes")

T = TypeVar("T")
KEY = blake3.blake3(b"k").hexdigest()
OTHER = blake3.blake3(b"other").hexdigest()
MAX = 256 << 20  # the documented per-entry limit (MAX_ENTRY_BYTES)
HEADER = struct.Struct("<4sHH32sQ32s")  # magic, version, flags, key, payload length, checksum


def _key(prefix: str, n: int) -> str:
    """A key in the subdirectory ``prefix`` (two hex characters)."""
    return prefix + blake3.blake3(b"%d" % n).hexdigest()[2:]


def _entry(
    key: str,
    payload: bytes,
    *,
    magic: bytes = b"VYPC",
    version: int = 1,
    stored_key: str | None = None,
    length: int | None = None,
    checksum: bytes | None = None,
) -> bytes:
    """The bytes of an entry file as the documented format lays it out."""
    return (
        HEADER.pack(
            magic,
            version,
            0,
            bytes.fromhex(stored_key or key),
            len(payload) if length is None else length,
            blake3.blake3(payload).digest() if checksum is None else checksum,
        )
        + payload
    )


# Where warnings point ----------------------------------------------------------------


@dataclass
class Warned:
    category: type[Warning]
    message: str
    code: CodeType | None  # the code of the frame the warning points at
    lineno: int


def _outer(frame: FrameType | None) -> FrameType | None:
    """The calling frame, past mutmut's trampolines (present only under mutation testing)."""
    frame = frame.f_back if frame is not None else None
    while frame is not None and frame.f_globals.get("__name__", "").startswith("mutmut."):
        frame = frame.f_back
    return frame


def _warned(call: Callable[[], T], monkeypatch: pytest.MonkeyPatch) -> tuple[T, list[Warned]]:
    """Run ``call``; return its result and the warnings it issued, each with where it points.

    Where a warning points is the frame its ``stacklevel`` names. Under mutmut
    every mutated function is entered through two trampoline frames, which
    shift what a stacklevel names; the frame is found here counting only the
    project's frames, so the answer is the one a user gets. Outside mutmut it
    is checked against the location `warnings` itself recorded.
    """
    real_warn = warnings.warn
    found: list[Warned] = []
    exact: list[bool] = []

    def spy(message: Any, category: Any = None, stacklevel: int = 1, source: Any = None) -> None:
        real_warn(message, category, stacklevel=stacklevel + 1, source=source)
        frame: FrameType | None = sys._getframe(1)
        direct = frame
        for _ in range(stacklevel - 1):
            frame, direct = _outer(frame), direct.f_back if direct is not None else None
        exact.append(frame is direct)
        found.append(
            Warned(
                category,
                str(message),
                frame.f_code if frame is not None else None,
                frame.f_lineno if frame is not None else 0,
            )
        )

    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        monkeypatch.setattr(warnings, "warn", spy)
        try:
            result = call()
        finally:
            monkeypatch.setattr(warnings, "warn", real_warn)
    assert len(recorded) == len(found)
    for w, f, same in zip(recorded, found, exact, strict=True):
        if same and f.code is not None:  # no trampolines skipped: the recorded location agrees
            assert (w.filename, w.lineno) == (f.code.co_filename, f.lineno)
    return result, found


def _expect_warning(call: Callable[[], T], message: str, monkeypatch: pytest.MonkeyPatch) -> T:
    """Run ``call``: exactly one PipelineCacheWarning ``message``, pointing at ``call``'s line."""
    result, found = _warned(call, monkeypatch)
    assert [(w.category, w.message) for w in found] == [(PipelineCacheWarning, message)]
    assert found[0].code is call.__code__, "the warning must point at the caller of the cache"
    assert found[0].code.co_filename == __file__
    return result


# default_cache_root, per platform ------------------------------------------------------

ROOTS = [
    ("linux", {}, ".cache/vyre-async/pipelines"),
    ("linux", {"XDG_CACHE_HOME": "{tmp}/xdg"}, "{tmp}/xdg/vyre-async/pipelines"),
    ("linux", {"XDG_CACHE_HOME": ""}, ".cache/vyre-async/pipelines"),
    ("linux", {"VYRE_CACHE_DIR": ""}, ".cache/vyre-async/pipelines"),
    ("linux", {"VYRE_CACHE_DIR": "~/mine"}, "mine"),
    ("darwin", {"XDG_CACHE_HOME": "{tmp}/xdg"}, "Library/Caches/vyre-async/pipelines"),
    ("win32", {"LOCALAPPDATA": "{tmp}/local"}, "{tmp}/local/vyre-async/Cache/pipelines"),
    ("win32", {}, "AppData/Local/vyre-async/Cache/pipelines"),
    ("win32", {"LOCALAPPDATA": ""}, "AppData/Local/vyre-async/Cache/pipelines"),
    ("win32", {"VYRE_CACHE_DIR": "{tmp}/env"}, "{tmp}/env"),
]


@pytest.mark.parametrize(("platform", "env", "expected"), ROOTS)
def test_default_cache_root_per_platform(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    platform: str,
    env: dict[str, str],
    expected: str,
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    for name in ("VYRE_CACHE_DIR", "XDG_CACHE_HOME", "LOCALAPPDATA"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(tmp=tmp_path))
    with monkeypatch.context() as m:
        m.setattr(sys, "platform", platform)
        root = default_cache_root()
    want = expected.format(tmp=tmp_path)
    assert str(root) == (want if want.startswith("/") else str(home / want))


# Argument errors: the message and its Fix ------------------------------------------


class BytesPath:
    """A path-like object whose path is bytes (not a usable cache root)."""

    def __fspath__(self) -> bytes:
        return b"/tmp/cache"

    def __repr__(self) -> str:
        return "BytesPath(b'/tmp/cache')"


ROOT_FIX = 'Fix: pass a path, e.g. DiskPipelineCache("~/.cache/vyre"), or None for the default'
BAD_ROOTS = [
    (42, "DiskPipelineCache root must be a directory path (str or os.PathLike), got 42"),
    ("", "DiskPipelineCache root '' is not a usable directory path"),
    (
        "a\0b",
        "DiskPipelineCache root 'a\\x00b' is not a usable directory path"
        " (it holds a NUL character)",
    ),
    (
        "cache-\ud800",
        "DiskPipelineCache root 'cache-\\ud800' is not a usable directory path"
        " (it has no file system name: a lone surrogate)",
    ),
    (BytesPath(), "DiskPipelineCache root BytesPath(b'/tmp/cache') is not a usable directory path"),
]


@pytest.mark.parametrize(
    ("root", "message"), BAD_ROOTS, ids=["int", "empty", "nul", "surrogate", "bytes"]
)
def test_a_bad_root_is_refused_with_its_fix(root: object, message: str) -> None:
    with pytest.raises(InvalidProgram) as raised:
        DiskPipelineCache(root)  # type: ignore[arg-type]
    assert str(raised.value) == f"{message}\n{ROOT_FIX}"


def test_a_root_with_a_tilde_is_under_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert DiskPipelineCache("~/pipelines").root == tmp_path / "pipelines"


@pytest.mark.parametrize("bad", [-1, "1"])
def test_bad_max_bytes_message(tmp_path: Path, bad: object) -> None:
    with pytest.raises(InvalidProgram) as raised:
        DiskPipelineCache(tmp_path, max_bytes=bad)  # type: ignore[arg-type]
    assert str(raised.value) == (
        f"DiskPipelineCache max_bytes must be an int >= 0, got {bad!r}\n"
        "Fix: pass e.g. max_bytes=1073741824"
    )


@pytest.mark.parametrize("bad", ["ABC", KEY.upper(), KEY[:-1]])
def test_bad_key_message(tmp_path: Path, bad: str) -> None:
    with pytest.raises(InvalidProgram) as raised:
        DiskPipelineCache(tmp_path).path_for(bad)
    assert str(raised.value) == (
        f"cache key must be 64 lowercase hex characters, got {bad!r}\n"
        "Fix: pass a pipeline identity's .hex (a lowercase blake3 hex digest)"
    )


def _strided() -> memoryview:
    return memoryview(b"abcdef")[::2]


@pytest.mark.parametrize(
    ("payload", "name"),
    [("text", "str"), (5, "int"), (None, "NoneType"), ([1, 2], "list"), (_strided(), "memoryview")],
    ids=["str", "int", "None", "list", "strided-memoryview"],
)
def test_a_payload_that_is_not_bytes_is_refused(tmp_path: Path, payload: object, name: str) -> None:
    cache = DiskPipelineCache(tmp_path / "root")
    with pytest.raises(InvalidProgram) as raised:
        cache.put(KEY, payload)  # type: ignore[arg-type]
    assert str(raised.value) == (
        f"a pipeline cache entry holds bytes, got a {name}\n"
        "Fix: pass the bytes of the serialised pipeline"
    )
    assert not (tmp_path / "root").exists()


@pytest.mark.parametrize(
    "payload",
    [b"abc", bytearray(b"abc"), memoryview(b"abc"), memoryview(b"xabcx")[1:4]],
    ids=["bytes", "bytearray", "memoryview", "memoryview-slice"],
)
def test_bytes_like_payloads_are_stored(tmp_path: Path, payload: Any) -> None:
    cache = DiskPipelineCache(tmp_path)
    assert cache.put(KEY, payload) is True
    assert cache.get(KEY) == b"abc"


# The entry file ---------------------------------------------------------------------


def test_the_entry_file_is_the_documented_header_then_the_payload(tmp_path: Path) -> None:
    cache = DiskPipelineCache(tmp_path)
    assert cache.put(KEY, b"payload")
    path = tmp_path / KEY[:2] / f"{KEY}.bin"
    data = path.read_bytes()
    assert data == _entry(KEY, b"payload")
    magic, version, flags, key, length, checksum = HEADER.unpack(data[: HEADER.size])
    assert (magic, version, flags, key.hex(), length) == (b"VYPC", 1, 0, KEY, 7)
    assert checksum == blake3.blake3(b"payload").digest() and data[HEADER.size :] == b"payload"
    if sys.platform != "win32":
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_info_reports_the_root_and_the_cap(tmp_path: Path) -> None:
    cache = DiskPipelineCache(tmp_path / "root", max_bytes=12345)
    assert cache.put(KEY, b"abc")
    info = cache.info()
    assert (info.root, info.max_bytes, info.entries, info.total_bytes) == (
        tmp_path / "root",
        12345,
        1,
        HEADER.size + 3,
    )


# Damaged entries: exact warnings, counters, and the file is kept ----------------------

DAMAGED = [
    ("empty", b"", "is truncated (0-byte header)"),
    ("short-header", b"VYPC\x01\x00\x00\x00ab", "is truncated (10-byte header)"),
    ("magic", _entry(KEY, b"x" * 10, magic=b"PKZP"), "is not a vyre-async entry (magic b'PKZP')"),
    ("version-0", _entry(KEY, b"x" * 10, version=0), "has format version 0, expected 1"),
    ("version-2", _entry(KEY, b"x" * 10, version=2), "has format version 2, expected 1"),
    ("other-key", _entry(KEY, b"x" * 10, stored_key=OTHER), "was written for another key"),
    (
        "claims-limit+1",
        _entry(KEY, b"x" * 10, length=MAX + 1),
        f"claims {MAX + 1} bytes (limit {MAX})",
    ),
    (
        "claims-limit",
        _entry(KEY, b"x" * 10, length=MAX),
        f"holds 10 payload bytes, its header says {MAX}",
    ),
    (
        "claims-limit-1",
        _entry(KEY, b"x" * 10, length=MAX - 1),
        f"holds 10 payload bytes, its header says {MAX - 1}",
    ),
    (
        "one-short",
        _entry(KEY, b"x" * 99, length=100),
        "holds 99 payload bytes, its header says 100",
    ),
    (
        "one-long",
        _entry(KEY, b"x" * 101, length=100),
        "holds more payload bytes than the 100 its header says",
    ),
    (
        "ten-long",
        _entry(KEY, b"x" * 110, length=100),
        "holds more payload bytes than the 100 its header says",
    ),
    (
        "checksum",
        _entry(KEY, b"x" * 100, checksum=blake3.blake3(b"y").digest()),
        "failed its checksum",
    ),
]


@pytest.mark.parametrize(("data", "problem"), [d[1:] for d in DAMAGED], ids=[d[0] for d in DAMAGED])
def test_a_damaged_entry_is_a_miss_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: bytes, problem: str
) -> None:
    cache = DiskPipelineCache(tmp_path)
    path = cache.path_for(KEY)
    path.parent.mkdir()
    path.write_bytes(data)
    message = f"pipeline cache entry {KEY} {problem}; ignoring it and recompiling"
    for n in (1, 2):
        assert _expect_warning(lambda: cache.get(KEY), message, monkeypatch) is None
        assert (cache.hits, cache.misses, cache.errors) == (0, n, n)
    assert path.read_bytes() == data  # get never deletes


@pytest.mark.parametrize("size", [0, 1, 100])
def test_an_entry_of_exactly_its_length_is_a_hit(tmp_path: Path, size: int) -> None:
    cache = DiskPipelineCache(tmp_path)
    path = cache.path_for(KEY)
    path.parent.mkdir()
    path.write_bytes(_entry(KEY, b"p" * size))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.get(KEY) == b"p" * size
        assert cache.get(KEY) == b"p" * size
    assert (cache.hits, cache.misses, cache.errors) == (2, 0, 0)


def test_a_long_tail_after_the_payload_is_not_read_into_memory(tmp_path: Path) -> None:
    cache = DiskPipelineCache(tmp_path)
    path = cache.path_for(KEY)
    path.parent.mkdir()
    with path.open("wb") as fh:
        fh.write(_entry(KEY, b"x" * 100))
        fh.truncate(HEADER.size + 100 + (8 << 20))  # 8 MiB more (sparse): a damaged file
    tracemalloc.start()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert cache.get(KEY) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "holds more payload bytes than the 100 its header says" in str(caught[0].message)
    assert peak < 1 << 20


class _FailingReads:
    """A file object whose reads fail as on a failing disk."""

    def __init__(self, fh: Any) -> None:
        self._fh = fh

    def __enter__(self) -> _FailingReads:
        return self

    def __exit__(self, *exc: object) -> None:
        self._fh.close()

    def fileno(self) -> int:
        return int(self._fh.fileno())

    def read(self, size: int = -1) -> bytes:
        raise OSError(errno.EIO, "Input/output error")


def _eio(monkeypatch: pytest.MonkeyPatch, cache: DiskPipelineCache) -> Path:
    assert cache.put(KEY, b"payload")
    real = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: _FailingReads(real(fd, *a, **k)))
    return cache.path_for(KEY)


def _not_a_directory(monkeypatch: pytest.MonkeyPatch, cache: DiskPipelineCache) -> Path:
    cache.root.mkdir()
    (cache.root / KEY[:2]).write_bytes(b"a file where the subdirectory goes")
    return cache.path_for(KEY)


def _directory(monkeypatch: pytest.MonkeyPatch, cache: DiskPipelineCache) -> Path:
    cache.path_for(KEY).mkdir(parents=True)
    return cache.path_for(KEY)


def _fifo(monkeypatch: pytest.MonkeyPatch, cache: DiskPipelineCache) -> Path:
    cache.path_for(KEY).parent.mkdir(parents=True)
    os.mkfifo(cache.path_for(KEY))
    return cache.path_for(KEY)


UNREADABLE = [
    pytest.param(
        _eio, "could not be read ([Errno 5] Input/output error); recompiling", id="io-error"
    ),
    pytest.param(
        _not_a_directory,
        "could not be read ([Errno 20] Not a directory: '{path}'); recompiling",
        id="not-a-directory",
    ),
    pytest.param(
        _directory,
        "is a directory, not a regular file; ignoring it and recompiling",
        id="directory",
    ),
    pytest.param(
        _fifo,
        "is a FIFO, not a regular file; ignoring it and recompiling",
        id="fifo",
        marks=posix_only,
    ),
]


@pytest.mark.parametrize(("make", "reason"), UNREADABLE)
def test_an_unreadable_entry_is_a_miss_and_an_error(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[[pytest.MonkeyPatch, DiskPipelineCache], Path],
    reason: str,
) -> None:
    cache = DiskPipelineCache(tmp_path / "root")
    path = make(monkeypatch, cache)
    message = f"pipeline cache entry {path} {reason.format(path=path)}"
    for n in (1, 2):
        assert _expect_warning(lambda: cache.get(KEY), message, monkeypatch) is None
        assert (cache.hits, cache.misses, cache.errors) == (0, n, n)


def test_misses_and_hits_count_every_lookup(tmp_path: Path) -> None:
    cache = DiskPipelineCache(tmp_path)
    assert cache.get(KEY) is None and cache.get(KEY) is None
    assert (cache.hits, cache.misses, cache.errors) == (0, 2, 0)
    assert cache.put(KEY, b"p")
    assert cache.get(KEY) == b"p" and cache.get(KEY) == b"p" and cache.get(KEY) == b"p"
    assert (cache.hits, cache.misses, cache.errors) == (3, 2, 0)


# Writes that fail: exact warnings, errors counted, nothing left behind ---------------


@pytest.mark.parametrize(("size", "stored"), [(999, True), (1000, True), (1001, False)])
def test_the_entry_size_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int, stored: bool
) -> None:
    monkeypatch.setattr(disk, "MAX_ENTRY_BYTES", 1000)  # the limit, scaled down from 256 MiB
    cache = DiskPipelineCache(tmp_path)
    payload = b"p" * size
    if stored:
        assert cache.put(KEY, payload) is True
        assert cache.get(KEY) == payload
        return
    message = f"pipeline of {size} bytes exceeds the 1000-byte entry limit; not cached"
    assert _expect_warning(lambda: cache.put(KEY, payload), message, monkeypatch) is False
    assert not cache.path_for(KEY).exists() and cache.errors == 0


@pytest.mark.parametrize("slack", [-1, 0, 1])
def test_an_entry_must_fit_max_bytes_header_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slack: int
) -> None:
    cap = HEADER.size + 100 + slack
    cache = DiskPipelineCache(tmp_path, max_bytes=cap)
    if slack >= 0:
        assert cache.put(KEY, b"p" * 100) is True
        assert cache.get(KEY) == b"p" * 100
        assert cache.info().total_bytes == HEADER.size + 100
        return
    message = (
        f"pipeline of 100 bytes does not fit the cache's max_bytes={cap}; not cached "
        "(Fix: raise max_bytes)"
    )
    assert _expect_warning(lambda: cache.put(KEY, b"p" * 100), message, monkeypatch) is False
    assert not cache.path_for(KEY).exists()


def _symlinked_subdirectory(tmp_path: Path, cache: DiskPipelineCache) -> str:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    cache.root.mkdir()
    (cache.root / KEY[:2]).symlink_to(outside, target_is_directory=True)
    return (
        f"pipeline cache directory {cache.root / KEY[:2]} is a symbolic link; "
        "continuing without caching (entries there would escape the size cap)"
    )


def _directory_at_entry(tmp_path: Path, cache: DiskPipelineCache) -> str:
    cache.path_for(KEY).mkdir(parents=True)
    return (
        f"pipeline cache entry {cache.path_for(KEY)} is a directory, not a regular file; "
        "leaving it there and continuing without caching"
    )


def _file_at_subdirectory(tmp_path: Path, cache: DiskPipelineCache) -> str:
    cache.root.mkdir()
    (cache.root / KEY[:2]).write_bytes(b"not a directory")
    return (
        f"pipeline cache entry {cache.path_for(KEY)} could not be written "
        f"([Errno 20] not a directory: '{cache.root / KEY[:2]}'); continuing without it"
    )


@posix_only
@pytest.mark.parametrize(
    "make",
    [_symlinked_subdirectory, _directory_at_entry, _file_at_subdirectory],
    ids=["symlinked-subdirectory", "directory-at-entry", "file-at-subdirectory"],
)
def test_a_put_that_cannot_write_warns_and_counts_an_error(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[[Path, DiskPipelineCache], str],
) -> None:
    cache = DiskPipelineCache(tmp_path / "root")
    message = make(tmp_path, cache)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    for n in (1, 2):
        assert _expect_warning(lambda: cache.put(KEY, b"payload"), message, monkeypatch) is False
        assert cache.errors == n
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # no temp file left behind


def test_a_temp_file_reclaimed_mid_write_fails_the_put_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process (in another pid namespace) deleted the temp file before the rename."""
    cache = DiskPipelineCache(tmp_path)
    real = os.replace
    temps: list[str] = []

    def reclaimed_then_replace(src: Any, dst: Any) -> None:
        temps.append(str(src))
        os.unlink(src)
        real(src, dst)

    monkeypatch.setattr(os, "replace", reclaimed_then_replace)
    path = cache.path_for(KEY)

    def put() -> bool:
        return cache.put(KEY, b"payload")

    result, found = _warned(put, monkeypatch)
    assert result is False and cache.errors == 1
    assert [w.message for w in found] == [
        f"pipeline cache entry {path} could not be written ([Errno 2] No such file or "
        f"directory: '{temps[0]}' -> '{path}'); continuing without it"
    ]
    assert not path.exists() and list(path.parent.iterdir()) == []


# The size cap: boundaries and least-recently-used order ------------------------------

SIZE = HEADER.size + 20  # each entry below: 20 payload bytes


@pytest.mark.parametrize(
    ("cap", "kept"),
    [
        (3 * SIZE + 1, "ABC"),
        (3 * SIZE, "ABC"),
        (3 * SIZE - 1, "BC"),
        (2 * SIZE + 1, "BC"),
        (2 * SIZE, "BC"),
        (2 * SIZE - 1, "C"),
        (SIZE, "C"),
    ],
)
def test_eviction_keeps_the_most_recent_entries_that_fit(
    tmp_path: Path, cap: int, kept: str
) -> None:
    keys = {name: blake3.blake3(name.encode()).hexdigest() for name in "ABC"}
    writer = DiskPipelineCache(tmp_path)
    for age, name in enumerate("AB"):
        assert writer.put(keys[name], b"p" * 20)
        os.utime(writer.path_for(keys[name]), (1000 + age, 1000 + age))
    cache = DiskPipelineCache(tmp_path, max_bytes=cap)
    assert cache.put(keys["C"], b"p" * 20)
    assert "".join(n for n in "ABC" if cache.path_for(keys[n]).exists()) == kept
    assert cache.info().total_bytes == len(kept) * SIZE <= cap


# Directories that cannot be listed -----------------------------------------------------


def _unlistable(monkeypatch: pytest.MonkeyPatch, blocked: Path) -> None:
    """``blocked`` cannot be listed: another user's private directory (root may list any)."""
    real = os.scandir

    def scandir(path: Any) -> Any:
        if Path(path) == blocked:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)


@pytest.mark.parametrize("operation", ["info", "clear", "put"])
def test_an_unlistable_subdirectory_is_skipped_with_a_warning_at_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, operation: str
) -> None:
    cache = DiskPipelineCache(tmp_path, max_bytes=0 if operation == "put" else 1 << 30)
    theirs, mine = _key("cd", 1), _key("ef", 1)
    writer = DiskPipelineCache(tmp_path)
    assert writer.put(theirs, b"theirs") and writer.put(mine, b"mine")
    _unlistable(monkeypatch, tmp_path / "cd")
    message = (
        f"pipeline cache directory {tmp_path / 'cd'} could not be listed "
        f"([Errno 13] Permission denied: '{tmp_path / 'cd'}'); skipping it"
    )
    if operation == "info":
        info = _expect_warning(lambda: cache.info(), message, monkeypatch)
        assert info.entries == 1
    elif operation == "clear":
        assert _expect_warning(lambda: cache.clear(), message, monkeypatch) == 1
    else:  # max_bytes=0: the put evicts every entry it can see, its own included
        assert _expect_warning(lambda: cache.put(KEY, b"new"), message, monkeypatch) is True
        assert not cache.path_for(KEY).exists()
    assert writer.path_for(theirs).exists()
    assert writer.path_for(mine).exists() is (operation == "info")


@posix_only
def test_a_root_that_is_a_symlink_loop_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "loop"
    root.symlink_to(root)
    cache = DiskPipelineCache(root)
    message = (
        f"pipeline cache directory {root} could not be listed "
        f"([Errno {errno.ELOOP}] {os.strerror(errno.ELOOP)}: '{root}'); skipping it"
    )
    info = _expect_warning(lambda: cache.info(), message, monkeypatch)
    assert (info.entries, info.temp_files) == (0, 0)
    assert _expect_warning(lambda: cache.clear(), message, monkeypatch) == 0


@posix_only
def test_entries_behind_a_symlinked_subdirectory_are_not_the_caches(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    key = _key("ab", 7)
    (outside / f"{key}.bin").write_bytes(_entry(key, b"behind a link"))
    root = tmp_path / "root"
    root.mkdir()
    (root / "ab").symlink_to(outside, target_is_directory=True)
    cache = DiskPipelineCache(root, max_bytes=SIZE)
    assert cache.info().entries == 0
    assert cache.put(OTHER, b"p" * 20)  # fills the cap: eviction must not reach through the link
    assert cache.clear() == 1
    assert (outside / f"{key}.bin").read_bytes() == _entry(key, b"behind a link")


def test_an_entry_deleted_during_a_scan_does_not_hide_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process deletes an entry while this one scans the subdirectory."""
    writer = DiskPipelineCache(tmp_path)
    keys = [_key("ab", i) for i in range(4)]
    for key in keys:
        assert writer.put(key, b"p")
    order = [e.name for e in os.scandir(tmp_path / "ab")]
    victim = tmp_path / "ab" / order[1]
    real = disk.read_prefix

    def read_prefix(fd: int, size: int) -> bytes:
        if victim.exists():
            victim.unlink()  # right after the scan listed the directory
        return real(fd, size)

    monkeypatch.setattr(disk, "read_prefix", read_prefix)
    info = DiskPipelineCache(tmp_path).info()
    assert (info.entries, info.total_bytes) == (3, 3 * (HEADER.size + 1))


# Temp files ---------------------------------------------------------------------------


@posix_only
def test_a_write_in_progress_is_a_private_temp_file_named_for_its_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = DiskPipelineCache(tmp_path)
    real = os.replace
    seen: list[tuple[str, int, bytes, Any]] = []

    def observe(src: Any, dst: Any) -> None:
        temp = Path(src)
        seen.append((temp.name, stat.S_IMODE(temp.stat().st_mode), temp.read_bytes(), cache.info()))
        real(src, dst)

    monkeypatch.setattr(os, "replace", observe)
    old = os.umask(0)
    try:
        assert cache.put(KEY, b"payload")
    finally:
        os.umask(old)
    ((name, mode, data, info),) = seen
    assert files.temp_name_pattern(rf"\.{KEY[:16]}").fullmatch(name)
    assert name.startswith(f".{KEY[:16]}.{os.getpid()}.") and len(name.split(".")[3]) == 16
    assert (mode, data) == (0o600, _entry(KEY, b"payload"))
    assert (info.entries, info.temp_files, info.temp_bytes) == (0, 1, HEADER.size + 7)
    assert [p.name for p in (tmp_path / KEY[:2]).iterdir()] == [f"{KEY}.bin"]


def _temp(cache: DiskPipelineCache, pid: int, tag: str, age: float, now: float) -> Path:
    path = cache.path_for(KEY).parent / f".{KEY[:16]}.{pid}.{tag * 16}.tmp"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"VYPC")
    os.utime(path, (now - age, now - age))
    return path


NOW = 1_800_000_000.0


@pytest.mark.parametrize(("age", "reclaimed"), [(3599.0, False), (3600.0, False), (3601.0, True)])
def test_a_live_writers_temp_file_is_reclaimed_only_past_an_hour(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, age: float, reclaimed: bool
) -> None:
    cache = DiskPipelineCache(tmp_path)
    temp = _temp(cache, os.getpid(), "a", age, NOW)
    monkeypatch.setattr(time, "time", lambda: NOW)
    assert cache.clear() == 0
    assert temp.exists() is not reclaimed
    assert cache.info().temp_files == (0 if reclaimed else 1)


def test_a_temp_file_of_a_pid_no_process_can_have_is_reclaimed(tmp_path: Path) -> None:
    cache = DiskPipelineCache(tmp_path)
    temp = _temp(cache, 9_999_999_999, "b", 0.0, time.time())
    assert cache.info().temp_files == 1
    assert cache.clear() == 0
    assert not temp.exists()


@pytest.mark.parametrize(("age", "reclaimed"), [(60.0, False), (3601.0, True)])
def test_on_windows_only_age_reclaims_a_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, age: float, reclaimed: bool
) -> None:
    cache = DiskPipelineCache(tmp_path)
    temp = _temp(cache, 9_999_999_999, "c", age, NOW)  # no such process: not probed there
    monkeypatch.setattr(time, "time", lambda: NOW)
    with monkeypatch.context() as m:
        m.setattr(sys, "platform", "win32")
        assert cache.clear() == 0
    assert temp.exists() is not reclaimed


# Recency: reads and touch() date entries; where utime cannot ---------------------------


@pytest.fixture(params=["utime-on-fd", "utime-on-path-only"])
def utime_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """As here, or as on a platform whose ``os.utime`` takes no descriptor (Windows)."""
    if request.param == "utime-on-path-only":
        real = os.utime

        def utime(path: Any, *args: Any, **kwargs: Any) -> None:
            if isinstance(path, int):
                raise TypeError("utime: path should be string, bytes or os.PathLike, not int")
            real(path, *args, **kwargs)

        monkeypatch.setattr(os, "utime", utime)
        assert os.utime not in os.supports_fd
    yield str(request.param)


def test_a_read_makes_an_entry_the_most_recently_used(tmp_path: Path, utime_kind: str) -> None:
    keys = {name: blake3.blake3(name.encode()).hexdigest() for name in "ABC"}
    cache = DiskPipelineCache(tmp_path, max_bytes=2 * SIZE)
    for age, name in enumerate("AB"):
        assert cache.put(keys[name], b"p" * 20)
        os.utime(cache.path_for(keys[name]), ns=(1000 + age, 1000 + age))
    assert cache.get(keys["A"]) == b"p" * 20
    assert cache.path_for(keys["A"]).stat().st_mtime_ns > 10**18  # now, not 1970
    assert cache.put(keys["C"], b"p" * 20)
    assert [cache.path_for(keys[n]).exists() for n in "ABC"] == [True, False, True]


def test_touch_dates_entries_just_before_now_in_the_order_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, utime_kind: str
) -> None:
    cache = DiskPipelineCache(tmp_path)
    keys = [blake3.blake3(b"%d" % i).hexdigest() for i in range(3)]
    for key in keys:
        assert cache.put(key, b"p")
    now_ns = 1_000_000_000 * 10**9  # an injected clock, far from the real one
    monkeypatch.setattr(time, "time_ns", lambda: now_ns)
    assert cache.touch([keys[2], keys[0], keys[1]]) == 3
    times = [cache.path_for(k).stat().st_mtime_ns for k in (keys[2], keys[0], keys[1])]
    assert times == sorted(set(times))  # strictly in the order given
    lead = 20_000_000  # 20 ms: more than a file system's clock tick
    assert all(now_ns - lead <= t < now_ns - lead + 1_000_000 for t in times)


def test_a_read_only_cache_still_serves_hits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = DiskPipelineCache(tmp_path)
    assert cache.put(KEY, b"payload")

    def read_only(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "utime", read_only)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.get(KEY) == b"payload"
        assert cache.touch([KEY]) == 0
    assert (cache.hits, cache.misses, cache.errors) == (1, 0, 0)


# Platforms without O_NOFOLLOW: symlinks are still refused --------------------------------


@posix_only
def test_without_o_nofollow_a_symlinked_entry_is_still_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "_O_NOFOLLOW", 0)
    monkeypatch.setattr(files, "_READ_FLAGS", files._READ_FLAGS & ~os.O_NOFOLLOW)
    target = tmp_path / "elsewhere.bin"
    target.write_bytes(_entry(KEY, b"behind a link"))
    cache = DiskPipelineCache(tmp_path / "root")
    path = cache.path_for(KEY)
    path.parent.mkdir(parents=True)
    path.symlink_to(target)
    message = f"pipeline cache entry {path} is a symbolic link; ignoring it and recompiling"
    assert _expect_warning(lambda: cache.get(KEY), message, monkeypatch) is None
    assert cache.info().entries == 0
    assert cache.put(OTHER, b"regular")
    assert cache.get(OTHER) == b"regular"


# The scan's memo: a large cache is not re-read on every put -----------------------------


def test_a_second_scan_reads_no_header_of_an_unchanged_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every put scans the cache to evict; an entry verified by the last scan and
    # unchanged since (same inode and size) is not opened again. An entry
    # replaced in between (a new inode) is read again, and a damaged one is
    # still refused.
    cache = DiskPipelineCache(tmp_path)
    keys = [_key("ab", n) for n in range(5)]
    for n, key in enumerate(keys):
        assert cache.put(key, b"payload %d" % n)
    assert cache.info().entries == 5  # the first scan reads each header once
    opened: list[Path] = []
    real = disk._owned_stat

    def counting(path: Path, owned: Callable[[bytes], bool]) -> os.stat_result | None:
        opened.append(path)
        return real(path, owned)

    monkeypatch.setattr(disk, "_owned_stat", counting)
    assert cache.info().entries == 5
    assert opened == []
    replaced = cache.path_for(keys[0])
    fresh = replaced.with_name(replaced.name + ".new")
    fresh.write_bytes(_entry(keys[0], b"payload 0, again"))
    os.replace(fresh, replaced)
    assert cache.info().entries == 5
    assert opened == [replaced]
    opened.clear()
    replaced.write_bytes(b"not an entry at all")  # same inode, another size
    assert cache.info().entries == 4
    assert opened == [replaced]
