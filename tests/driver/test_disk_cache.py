"""DiskPipelineCache: atomic single-file entries, checksums, 0700, LRU cap, concurrency."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import blake3
import pytest

from vyre_async.cache import DiskPipelineCache, PipelineCacheWarning, default_cache_root
from vyre_async.cli import main

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


def test_bad_keys_are_rejected(tmp_path: Path) -> None:
    cache = DiskPipelineCache(tmp_path)
    for bad in ["", "../" + KEY[3:], KEY.upper(), KEY[:-1]]:
        with pytest.raises(ValueError, match="64 lowercase hex"):
            cache.get(bad)


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


def test_clear_and_info(tmp_path: Path) -> None:
    cache = DiskPipelineCache(tmp_path)
    cache.put(KEY, b"a")
    cache.put(OTHER, b"bb")
    (cache.path_for(KEY).parent / f".{KEY[:16]}.x.tmp").write_bytes(b"stray")
    assert cache.info().entries == 2
    assert cache.clear() == 2
    assert cache.info().entries == 0
    assert not list(cache.path_for(KEY).parent.glob("*.tmp"))


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
    from vyre_async.cache import DiskPipelineCache
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
