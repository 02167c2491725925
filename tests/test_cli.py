"""The vyre-async command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import blake3
import pytest

import vyre_async
from vyre_async import (
    BackendRegistration,
    UnsupportedFeature,
    register_backend,
)
from vyre_async._cache import DiskPipelineCache
from vyre_async.cli import main

KEY = blake3.blake3(b"cli").hexdigest()


def test_info_prints_version_and_backends(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert vyre_async.__version__ in out
    assert "registered backends" in out


def test_info_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["vyre_async"] == vyre_async.__version__
    assert isinstance(report["backends"], list)
    by_id = {b["id"]: b for b in report["backends"]}
    assert by_id["reference"]["usable"] is True and by_id["reference"]["fix"] is None


@pytest.mark.usefixtures("isolated")
def test_info_says_whether_each_backend_can_start_and_how_to_fix_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def no_device() -> None:
        raise UnsupportedFeature("no CUDA device is visible", fix="check nvidia-smi")

    register_backend(BackendRegistration(id="gpuish", factory=_never_built, probe=no_device))
    register_backend(
        BackendRegistration(id="broken", factory="no_such_module_vyre:factory", precedence=5)
    )
    register_backend(BackendRegistration(id="fine", factory=_never_built, probe=lambda: None))
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    gpu = next(i for i, line in enumerate(lines) if line.strip().startswith("gpuish"))
    assert "cannot start here" in lines[gpu]
    assert lines[gpu + 1].strip() == "no CUDA device is visible"
    assert lines[gpu + 2].strip() == "Fix: check nvidia-smi"
    broken = next(line for line in lines if line.strip().startswith("broken"))
    assert "cannot start here" in broken and "ModuleNotFoundError" in out
    fine = next(line for line in lines if line.strip().startswith("fine"))
    assert "usable" in fine.split()


def _never_built() -> None:
    raise AssertionError("info must not build a backend to probe it")


def test_console_script_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "vyre_async.cli", "info"], capture_output=True, text=True, check=True
    )
    assert "vyre-async" in out.stdout


def test_missing_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2


def test_cache_clear_leaves_a_users_files_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"  # VYRE_CACHE_DIR pointed at a user's data directory
    sub = data / KEY[:2]
    sub.mkdir(parents=True)
    user = {
        data / "report.bin": b"quarterly numbers",
        sub / "photo.bin": b"\xff\xd8\xff",
        sub / f"{KEY[:2]}{'e' * 62}.bin": b"an entry's name, a user's bytes " * 4,
    }
    for path, content in user.items():
        path.write_bytes(content)
    monkeypatch.setenv("VYRE_CACHE_DIR", str(data))
    assert DiskPipelineCache().put(KEY, b"compiled")
    assert main(["cache", "info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 1
    assert main(["cache", "clear"]) == 0
    assert "removed 1 pipeline cache entry" in capsys.readouterr().out
    assert not DiskPipelineCache().path_for(KEY).exists()
    assert {path: path.read_bytes() for path in user} == user


def test_cache_info_reports_temp_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = DiskPipelineCache(tmp_path)
    assert cache.put(KEY, b"compiled")
    # A write in progress in this (live) process, named the way put() names it.
    temp = cache.path_for(KEY).parent / f".{KEY[:16]}.{os.getpid()}.{'0' * 16}.tmp"
    temp.write_bytes(b"VYPC partial")
    assert main(["cache", "info", "--dir", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["entries"], report["temp_files"], report["temp_bytes"]) == (1, 1, 12)
    assert report["total_bytes"] == cache.path_for(KEY).stat().st_size + 12
    assert main(["cache", "clear", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "removed 1 pipeline cache entry" in out and "kept 1 temp file" in out
    assert temp.read_bytes() == b"VYPC partial"
