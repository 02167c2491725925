"""DiskPipelineCache: atomic single-file entries, checksums, 0700, LRU cap, concurrency.

Also the ownership rules: the cache counts and deletes only the files it wrote
(by name and header), keeps the mode of directories it did not create, reads
entries as regular files only, and reclaims the temp files of killed writers.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import blake3
import pytest

from vyre_async._cache import DiskPipelineCache, PipelineCacheWarning, default_cache_root
from vyre_async.cli import main
from vyre_async.errors import ErrorCode, InvalidProgram

posix_only = pytest.mark.skipif(
    sys.platform == "win32", reason="POSIX file types, modes and signals"
)

KEY = blake3.blake3(b"k").hexdigest()
OTHER = blake3.blake3(b"other").hexdigest()


def test_round_trip_layout_and_modes(tmp_path: Path) -> None:
    cache = DiskPipelineCache(tmp_path / "root")
    assert cache.get(KEY) is None
    assert cache.put(KEY, b"payload")
    path = tmp_path / "root" / KEY[:2] / f"{KEY}.bin"
    assert path.is_file()
    assert cache.get(KEY) == b"payload"
    assert stat.S_IMODE((tmp_path / "root").stat().st_mode) == 0o700
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert (cache.hits, cache.misses) == (1, 1)


def test_root_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VYRE_CACHE_DIR", str(tmp_path / "env"))
    assert default_cache_root() == tmp_path / "env"
    assert DiskPipelineCache().root == tmp_path / "env"
    monkeypatch.delenv("VYRE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):
        assert default_cache_root() == tmp_path / "xdg" / "vyre-async" / "pipelines"


def _corrupt(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif how == "bitflip":
        data[-1] ^= 0x01
        path.write_bytes(bytes(data))
    elif how == "header_bitflip":
        data[5] ^= 0x40  # format version
        path.write_bytes(bytes(data))
    elif how == "foreign":
        path.write_bytes(b"\x80\x04\x95not a vyre entry, maybe a pickle" * 3)
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "huge_length":
        data[40:48] = (2**63).to_bytes(8, "little")
        path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "how", ["truncated", "bitflip", "header_bitflip", "foreign", "empty", "huge_length"]
)
def test_corrupt_entries_are_misses_with_a_warning(tmp_path: Path, how: str) -> None:
    cache = DiskPipelineCache(tmp_path)
    cache.put(KEY, b"x" * 100)
    _corrupt(cache.path_for(KEY), how)
    with pytest.warns(PipelineCacheWarning, match=KEY):
        assert cache.get(KEY) is None
    assert cache.errors == 1
    assert cache.put(KEY, b"fresh")  # then overwritten
    assert cache.get(KEY) == b"fresh"


def test_entry_written_for_another_key_is_foreign(tmp_path: Path) -> None:
    cache = DiskPipelineCache(tmp_path)
    cache.put(OTHER, b"other payload")
    target = cache.path_for(KEY)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(cache.path_for(OTHER), target)
    with pytest.warns(PipelineCacheWarning, match="another key"):
        assert cache.get(KEY) is None


def test_bad_keys_raise_invalid_program(tmp_path: Path) -> None:
    cache = DiskPipelineCache(tmp_path)
    for bad in ["", "../" + KEY[3:], KEY.upper(), KEY[:-1], KEY + "\n"]:
        for call in (cache.get, cache.path_for):
            with pytest.raises(InvalidProgram, match="64 lowercase hex") as raised:
                call(bad)
            assert isinstance(raised.value, ValueError)
            assert raised.value.code is ErrorCode.INVALID_PROGRAM
            assert "Fix:" in str(raised.value)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("bad", [-1, 1.5, "1024", True, None])
def test_bad_max_bytes_raise_invalid_program(tmp_path: Path, bad: object) -> None:
    with pytest.raises(InvalidProgram, match="max_bytes") as raised:
        DiskPipelineCache(tmp_path, max_bytes=bad)  # type: ignore[arg-type]
    assert isinstance(raised.value, ValueError)
    assert "Fix:" in str(raised.value)
    assert DiskPipelineCache(tmp_path, max_bytes=0).max_bytes == 0


def test_size_cap_evicts_least_recently_used(tmp_path: Path) -> None:
    cache = DiskPipelineCache(tmp_path, max_bytes=3 * 1100)
    keys = [blake3.blake3(bytes([i])).hexdigest() for i in range(4)]
    for age, key in enumerate(keys[:3]):
        cache.put(key, bytes(1000))
        os.utime(cache.path_for(key), (1000 + age, 1000 + age))
    assert cache.get(keys[0]) is not None  # a hit refreshes recency
    cache.put(keys[3], bytes(1000))
    assert cache.info().total_bytes <= 3 * 1100
    assert [cache.path_for(k).exists() for k in keys] == [True, False, True, True]


def test_write_failure_is_a_warning(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cache = DiskPipelineCache(blocker)
    with pytest.warns(PipelineCacheWarning, match="could not be written"):
        assert not cache.put(KEY, b"data")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: no process has this id now (barring reuse within moments)
    return proc.pid


def _temp_path(cache: DiskPipelineCache, key: str, pid: int, tag: str = "0" * 16) -> Path:
    """Return where a writer ``pid`` puts its temp file for ``key`` (put()'s naming)."""
    return cache.path_for(key).parent / f".{key[:16]}.{pid}.{tag}.tmp"


def test_clear_and_info(tmp_path: Path) -> None:
    cache = DiskPipelineCache(tmp_path)
    cache.put(KEY, b"a")
    cache.put(OTHER, b"bb")
    stray = _temp_path(cache, KEY, _dead_pid())
    stray.write_bytes(b"VYPC\x01\x00stray")
    info = cache.info()
    assert (info.entries, info.temp_files, info.temp_bytes) == (2, 1, len(b"VYPC\x01\x00stray"))
    assert info.total_bytes == 2 * 80 + 3 + info.temp_bytes
    assert cache.clear() == 2
    assert cache.info().entries == 0
    assert not stray.exists()


def test_cli_cache_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    DiskPipelineCache(tmp_path).put(KEY, b"abc")
    assert main(["cache", "info", "--dir", str(tmp_path), "--json"]) == 0
    assert '"entries": 1' in capsys.readouterr().out
    assert main(["cache", "clear", "--dir", str(tmp_path)]) == 0
    assert "removed 1 pipeline cache entry" in capsys.readouterr().out
    assert main(["cache", "info", "--dir", str(tmp_path)]) == 0
    assert "entries: 0" in capsys.readouterr().out


WRITER = textwrap.dedent(
    """
    import sys, warnings
    warnings.simplefilter("error")
    from vyre_async._cache import DiskPipelineCache
    root, tag, rounds = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])
    cache = DiskPipelineCache(root)
    keys = [bytes([i]) * 32 for i in range(4)]
    torn = 0
    for n in range(rounds):
        for k in keys:
            payload = tag * (1000 + (n * 37) % 5000)
            cache.put(k.hex(), payload)
            got = cache.get(k.hex())
            if got is None or len(set(got)) != 1:
                torn += 1
    print(torn)
    """
)


def test_two_processes_writing_the_same_keys_never_tear(tmp_path: Path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), tag, "150"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in ("A", "B")
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out.strip() == "0"
    cache = DiskPipelineCache(tmp_path)
    for i in range(4):
        payload = cache.get((bytes([i]) * 32).hex())
        assert payload is not None and len(set(payload)) == 1
    assert not list(tmp_path.rglob("*.tmp"))


# Ownership: only the cache's own files are counted, evicted or cleared ----------


def _entry_bytes(tmp_path: Path, key: str, payload: bytes) -> bytes:
    """Return the bytes of a genuine entry for ``key`` (written by a scratch cache)."""
    scratch = DiskPipelineCache(tmp_path / "scratch")
    assert scratch.put(key, payload)
    return scratch.path_for(key).read_bytes()


def _snapshot(*roots: Path) -> dict[Path, object]:
    """Map every path under ``roots`` to its bytes, link target or "dir"."""
    found: dict[Path, object] = {}
    for root in roots:
        for path in [root, *root.rglob("*")]:
            if path.is_symlink():
                found[path] = ("link", os.readlink(path))
            elif path.is_dir():
                found[path] = "dir"
            else:
                found[path] = path.read_bytes()
    return found


def _user_files(tmp_path: Path, root: Path) -> Path:
    """Fill ``root`` with files the cache must never count or delete; return an outside dir."""
    hh = KEY[:2]
    sub = root / hh
    sub.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    linked_key = hh + "2" * 62
    (outside / "target.bin").write_bytes(_entry_bytes(tmp_path, linked_key, b"linked"))
    (root / "notes.txt").write_text("my notes")
    (root / "top.bin").write_bytes(b"a top-level .bin")
    (sub / "photo.bin").write_bytes(b"\xff\xd8\xff a photo")
    (sub / f"{hh}{'f' * 62}.bin").write_bytes(b"right name, no VYPC header")
    (sub / f"{hh}{'3' * 62}.bin").write_bytes(_entry_bytes(tmp_path, KEY, b"x"))  # other key
    (sub / f"{KEY}.bin.bak").write_bytes(_entry_bytes(tmp_path, KEY, b"backup"))
    (sub / f"{linked_key}.bin").symlink_to(outside / "target.bin")
    (sub / f"{hh}{'1' * 62}.bin").mkdir()
    (sub / f"{hh}{'1' * 62}.bin" / "inside.bin").write_bytes(b"in a dir")
    (sub / "nested").mkdir()
    (sub / "nested" / f"{KEY}.bin").write_bytes(_entry_bytes(tmp_path, KEY, b"nested"))
    wrong_dir = root / ("00" if hh != "00" else "01")
    wrong_dir.mkdir()
    (wrong_dir / f"{KEY}.bin").write_bytes(_entry_bytes(tmp_path, KEY, b"wrong dir"))
    upper = root / "AB"
    upper.mkdir()
    (upper / f"ab{'0' * 62}.bin").write_bytes(_entry_bytes(tmp_path, "ab" + "0" * 62, b"u"))
    (sub / ".x.tmp").write_bytes(b"a dot file")
    (sub / f".{KEY[:16]}.x.tmp").write_bytes(b"VYPC not our temp name")
    (sub / f".{KEY[:16]}.{_dead_pid()}.{'0' * 16}.tmp").write_bytes(b"right name, user bytes")
    return outside


def test_clear_info_and_eviction_touch_only_the_caches_own_files(tmp_path: Path) -> None:
    root = tmp_path / "data"  # VYRE_CACHE_DIR pointed at a user's data directory
    cache = DiskPipelineCache(root)
    assert cache.put(KEY, b"mine")
    assert cache.put(OTHER, b"mine too")
    ours = [cache.path_for(KEY), cache.path_for(OTHER)]
    outside = _user_files(tmp_path, root)
    before = {p: v for p, v in _snapshot(root, outside).items() if p not in ours}

    info = cache.info()
    assert info.entries == 2
    assert info.total_bytes == sum(p.stat().st_size for p in ours)
    assert info.temp_files == 0
    assert cache.clear() == 2
    assert not any(p.exists() for p in ours)
    assert _snapshot(root, outside) == before

    tiny = DiskPipelineCache(root, max_bytes=0)  # evicts every entry it owns, even the new one
    assert tiny.put(KEY, b"again")
    assert not tiny.path_for(KEY).exists()
    assert _snapshot(root, outside) == before
    assert tiny.info().entries == 0


def test_get_never_deletes_a_foreign_file_at_an_entry_path(tmp_path: Path) -> None:
    cache = DiskPipelineCache(tmp_path)
    path = cache.path_for(KEY)
    path.parent.mkdir()
    user_bytes = b"a user's file that happens to have an entry's name. " * 4
    path.write_bytes(user_bytes)
    with pytest.warns(PipelineCacheWarning, match="not a vyre-async entry"):
        assert cache.get(KEY) is None
    assert path.read_bytes() == user_bytes
    assert cache.info().entries == 0 and cache.clear() == 0
    assert path.read_bytes() == user_bytes
    assert cache.put(KEY, b"fresh")  # the contract: a foreign entry is then overwritten
    assert cache.get(KEY) == b"fresh"


# Permissions: only directories the cache creates get 0700 ------------------------


@posix_only
def test_existing_root_keeps_its_mode(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o1777)  # like /tmp: sticky and world-writable
    cache = DiskPipelineCache(root)
    assert cache.put(KEY, b"payload")
    assert stat.S_IMODE(root.stat().st_mode) == 0o1777
    assert stat.S_IMODE(cache.path_for(KEY).parent.stat().st_mode) == 0o700  # created here
    cache.clear()
    assert stat.S_IMODE(root.stat().st_mode) == 0o1777


@posix_only
def test_existing_subdirectory_keeps_its_mode(tmp_path: Path) -> None:
    root = tmp_path / "root"
    sub = root / KEY[:2]
    sub.mkdir(parents=True)
    root.chmod(0o750)
    sub.chmod(0o755)
    assert DiskPipelineCache(root).put(KEY, b"payload")
    assert stat.S_IMODE(root.stat().st_mode) == 0o750
    assert stat.S_IMODE(sub.stat().st_mode) == 0o755


@posix_only
@pytest.mark.parametrize("umask", [0o022, 0o277], ids=["umask022", "umask277"])
def test_every_directory_the_cache_creates_is_0700(tmp_path: Path, umask: int) -> None:
    tmp_path.chmod(0o751)
    old = os.umask(umask)
    try:
        assert DiskPipelineCache(tmp_path / "a" / "b" / "root").put(KEY, b"payload")
    finally:
        os.umask(old)
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o751
    for created in ("a", "a/b", "a/b/root", f"a/b/root/{KEY[:2]}"):
        assert stat.S_IMODE((tmp_path / created).stat().st_mode) == 0o700, created
    assert DiskPipelineCache(tmp_path / "a" / "b" / "root").get(KEY) == b"payload"


# Entries are opened as regular files only ---------------------------------------


def _get_in_thread(cache: DiskPipelineCache, key: str, fifo: Path | None = None) -> list[object]:
    """Run ``cache.get(key)`` in a thread; fail (not hang) if it takes more than 10 s."""
    outcome: list[object] = []

    def run() -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outcome.append(cache.get(key))
        outcome.append([w for w in caught if issubclass(w.category, PipelineCacheWarning)])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=10)
    if thread.is_alive() and fifo is not None:
        # Release the blocked reader so the suite goes on, then report the hang.
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(timeout=10)
        pytest.fail("get() blocked on a FIFO at the entry path")
    assert not thread.is_alive()
    return outcome


@posix_only
def test_a_fifo_at_an_entry_path_is_a_prompt_miss_and_is_kept(tmp_path: Path) -> None:
    cache = DiskPipelineCache(tmp_path)
    path = cache.path_for(KEY)
    path.parent.mkdir()
    os.mkfifo(path)
    started = time.monotonic()
    result, caught = _get_in_thread(cache, KEY, fifo=path)
    assert time.monotonic() - started < 10
    assert result is None
    assert isinstance(caught, list) and len(caught) == 1 and "FIFO" in str(caught[0].message)
    assert (cache.misses, cache.errors) == (1, 1)
    assert stat.S_ISFIFO(os.lstat(path).st_mode)
    assert cache.info().entries == 0 and cache.clear() == 0
    with pytest.warns(PipelineCacheWarning, match="FIFO"):
        assert not cache.put(KEY, b"payload")  # not replaced: it is not ours
    assert stat.S_ISFIFO(os.lstat(path).st_mode)
    assert not list(path.parent.glob(".*.tmp"))


@posix_only
def test_a_symlink_at_an_entry_path_is_a_miss_and_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.bin"
    target.write_bytes(_entry_bytes(tmp_path, KEY, b"behind a link"))
    cache = DiskPipelineCache(tmp_path / "root")
    path = cache.path_for(KEY)
    path.parent.mkdir(parents=True)
    path.symlink_to(target)
    result, caught = _get_in_thread(cache, KEY)
    assert result is None
    assert isinstance(caught, list) and len(caught) == 1
    assert "symbolic link" in str(caught[0].message)
    assert cache.info().entries == 0 and cache.clear() == 0
    assert path.is_symlink() and os.readlink(path) == str(target)
    assert target.read_bytes() == _entry_bytes(tmp_path, KEY, b"behind a link")


def test_a_directory_at_an_entry_path_is_a_miss_and_is_kept(tmp_path: Path) -> None:
    cache = DiskPipelineCache(tmp_path)
    path = cache.path_for(KEY)
    path.mkdir(parents=True)
    (path / "inside").write_bytes(b"user data")
    with pytest.warns(PipelineCacheWarning):
        assert cache.get(KEY) is None
    assert cache.info().entries == 0 and cache.clear() == 0
    assert (path / "inside").read_bytes() == b"user data"


# Temp files: counted, and reclaimed once their writer is gone ---------------------

STALLED_WRITER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from vyre_async._cache import DiskPipelineCache

    root, ready, size = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])

    def stall(src, dst):  # the temp file is written and fsynced: stop before the rename
        ready.write_text(str(src))
        time.sleep(600)

    os.replace = stall
    DiskPipelineCache(root).put(sys.argv[4], b"p" * size)
    """
)


def _stalled_writer(tmp_path: Path, root: Path, size: int, key: str) -> subprocess.Popen[bytes]:
    """Start a real put() that stops right before its rename; return once its temp is written."""
    ready = tmp_path / f"ready-{key[:8]}"
    proc = subprocess.Popen(
        [sys.executable, "-c", STALLED_WRITER, str(root), str(ready), str(size), key]
    )
    deadline = time.monotonic() + 60
    while not ready.exists() or not ready.read_text():
        assert proc.poll() is None, "the writer exited early"
        assert time.monotonic() < deadline, "the writer never wrote its temp file"
        time.sleep(0.02)
    return proc


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)  # reaped, so its pid no longer names a process


@posix_only
@pytest.mark.parametrize("reclaim", ["eviction", "clear"])
def test_temp_file_of_a_killed_writer_is_counted_then_reclaimed(
    tmp_path: Path, reclaim: str
) -> None:
    root = tmp_path / "root"
    proc = _stalled_writer(tmp_path, root, 5000, KEY)
    _kill(proc)
    temps = list(root.glob("*/.*.tmp"))
    assert len(temps) == 1 and temps[0].name.split(".")[2] == str(proc.pid)
    cache = DiskPipelineCache(root)
    info = cache.info()
    assert (info.entries, info.temp_files, info.temp_bytes) == (0, 1, 80 + 5000)
    assert info.total_bytes == 80 + 5000
    assert temps[0].exists()  # info() deletes nothing
    if reclaim == "eviction":
        assert cache.put(OTHER, b"new")
        assert cache.get(OTHER) == b"new"
    else:
        assert cache.clear() == 0
    assert not temps[0].exists()
    assert cache.info().temp_files == 0


@posix_only
def test_temp_file_of_a_live_writer_counts_toward_the_cap_and_is_kept(tmp_path: Path) -> None:
    root = tmp_path / "root"
    cache = DiskPipelineCache(root, max_bytes=3000)
    keys = [blake3.blake3(bytes([i])).hexdigest() for i in range(2)]
    assert cache.put(keys[0], bytes(1000))
    os.utime(cache.path_for(keys[0]), (1000, 1000))  # the least recently used
    proc = _stalled_writer(tmp_path, root, 1000, KEY)
    try:
        (temp,) = root.glob("*/.*.tmp")
        assert cache.put(keys[1], bytes(1000))  # 3 x 1080 bytes > 3000: one must go
        assert not cache.path_for(keys[0]).exists()
        assert cache.get(keys[1]) == bytes(1000)
        assert temp.exists()  # its writer is alive: not evicted
        assert cache.info().temp_files == 1
        assert cache.clear() == 1
        assert temp.exists()  # nor cleared
        assert cache.info().total_bytes == temp.stat().st_size == 1080
    finally:
        _kill(proc)
    assert cache.clear() == 0
    assert not temp.exists()


def test_old_temp_files_are_reclaimed_whoever_wrote_them(tmp_path: Path) -> None:
    cache = DiskPipelineCache(tmp_path)
    assert cache.put(KEY, b"entry")
    fresh = _temp_path(cache, KEY, os.getpid(), "1" * 16)
    old = _temp_path(cache, KEY, os.getpid(), "2" * 16)
    fresh.write_bytes(b"VYPC\x01\x00partial")
    old.write_bytes(b"")  # a writer that died before writing anything
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    assert cache.clear() == 1
    assert not old.exists()
    assert fresh.read_bytes() == b"VYPC\x01\x00partial"  # this process is alive and writing
    info = cache.info()
    assert (info.entries, info.temp_files, info.temp_bytes) == (0, 1, len(b"VYPC\x01\x00partial"))


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks need privileges on Windows")
def test_put_never_writes_through_a_symlinked_subdirectory(tmp_path: Path) -> None:
    """Eviction and clear skip such a directory, so its entries escaped the size cap."""
    cache = DiskPipelineCache(tmp_path / "cache")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / KEY[:2]).symlink_to(outside, target_is_directory=True)
    with pytest.warns(PipelineCacheWarning, match="symbolic link"):
        assert not cache.put(KEY, b"payload")
    assert list(outside.iterdir()) == []


def test_an_entry_larger_than_the_whole_cache_is_refused_and_the_others_stay(
    tmp_path: Path,
) -> None:
    cache = DiskPipelineCache(tmp_path, max_bytes=100_000)
    keys = [blake3.blake3(b"small %d" % i).hexdigest() for i in range(20)]
    for key in keys:
        assert cache.put(key, b"x" * 1_000)
    big = blake3.blake3(b"big").hexdigest()
    with pytest.warns(PipelineCacheWarning, match="does not fit"):
        assert cache.put(big, b"y" * 200_000) is False
    assert cache.get(big) is None
    assert cache.info().entries == 20  # nothing was evicted for it
    assert all(cache.get(key) == b"x" * 1_000 for key in keys)


def test_touch_marks_only_the_caches_own_entries_in_the_given_order(tmp_path: Path) -> None:
    cache = DiskPipelineCache(tmp_path)
    keys = [blake3.blake3(b"entry %d" % i).hexdigest() for i in range(3)]
    for key in keys:
        assert cache.put(key, b"payload")
    foreign = blake3.blake3(b"foreign").hexdigest()
    path = cache.path_for(foreign)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not an entry of this cache")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    missing = blake3.blake3(b"missing").hexdigest()
    assert cache.touch([keys[2], foreign, missing, keys[0]]) == 2
    assert path.stat().st_mtime_ns == 1_000_000_000  # not ours: left alone
    times = [cache.path_for(k).stat().st_mtime_ns for k in keys]
    assert times[2] < times[0]  # in the order given: the last is the most recent
    cache.put(blake3.blake3(b"new").hexdigest(), b"payload")
    newest = cache.path_for(blake3.blake3(b"new").hexdigest()).stat().st_mtime_ns
    assert newest > max(times[0], times[2])  # the entry written next is newer still
