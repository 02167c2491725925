"""The vyre-async command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import vyre_async
from vyre_async.cli import main


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


def test_console_script_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "vyre_async.cli", "info"], capture_output=True, text=True, check=True
    )
    assert "vyre-async" in out.stdout


def test_missing_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
