"""docs/benchmarks/gpu.md shows what gpu-check.json holds, each goal marked by its figure."""

from __future__ import annotations

import copy
import importlib.machinery
import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load_script() -> ModuleType:
    path = ROOT / "scripts" / "gpu-report"
    loader = importlib.machinery.SourceFileLoader("gpu_report", str(path))
    spec = importlib.util.spec_from_loader("gpu_report", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


gpu_report = _load_script()


@pytest.fixture
def report() -> dict[str, Any]:
    return dict(json.loads(gpu_report.REPORT.read_text()))


def test_the_committed_tables_are_the_committed_report(report: dict[str, Any]) -> None:
    page = gpu_report.PAGE.read_text()
    assert gpu_report.replace(page, gpu_report.render(report)) == page, (
        "docs/benchmarks/gpu.md disagrees with gpu-check.json: run scripts/gpu-report --write"
    )


def test_the_report_is_a_passing_gpu_run_of_the_installed_wheel(report: dict[str, Any]) -> None:
    assert report["ok"] is True
    assert report["imported_from_src"] is False
    assert report["device"] and report["cupy_version"]
    for step in ("gpu_tests", "contract_on_cupy"):
        s = report["steps"][step]
        assert s["passed"] == s["tests"] > 0 and s["failures"] == s["errors"] == s["skipped"] == 0


def _with(report: dict[str, Any], step: str, section: str, **values: Any) -> str:
    """The tables of a copy of ``report`` with ``values`` set in one section of one step."""
    changed = copy.deepcopy(report)
    changed["steps"][step][section].update(values)
    return str(gpu_report.render(changed))


def test_a_goal_is_marked_by_its_figure(report: dict[str, Any]) -> None:
    # Only the figure changes: the verdict comes from it, not from the report's own "met".
    policy = report["steps"]["policy_benchmark"]
    assert policy["arm_concurrency"]["met"] is False and policy["copy_overlap"]["met"] is False
    slower = _with(report, "policy_benchmark", "arm_concurrency", concurrency_factor=1.2)
    assert "1.2× faster | ≥ 2.5× | **missed** |" in slower
    faster = _with(report, "policy_benchmark", "arm_concurrency", concurrency_factor=3.1)
    assert "3.1× faster | ≥ 2.5× | met |" in faster
    assert "| overlap fraction 0.8 | ≥ 0.7 | met |" in _with(
        report, "policy_benchmark", "copy_overlap", overlap_fraction=0.8
    )
    assert "| 0.15× | ≤ 0.2× | met |" in _with(
        report, "policy_benchmark", "launch_host_cost", vyre_replay_over_plain_host_cost=0.15
    )
    hit = copy.deepcopy(report)
    hit["steps"]["benchmark"]["compile"]["vyre"]["ratio_hit_over_cold"] = 0.05
    assert "| 0.05× | ≤ 0.1× | met |" in gpu_report.render(hit)
    fast = _with(report, "benchmark", "throughput_tiny", backend_64_tasks_per_s=60_000.0)
    assert "60,000/s" in fast and "≥ 50,000/s | met |" in fast
    slow = _with(report, "benchmark", "throughput_tiny", backend_64_tasks_per_s=49_999.0)
    assert "49,999/s" in slow and "≥ 50,000/s | **missed** |" in slow


def test_a_goal_comes_from_the_report_where_it_carries_one(report: dict[str, Any]) -> None:
    assert "| 1.92× faster | ≥ 1.4× | met |" in _with(
        report, "policy_benchmark", "arm_concurrency", target=1.4
    )
    assert "| overlap fraction 0.58 | ≥ 0.5 | met |" in _with(
        report, "policy_benchmark", "copy_overlap", target=0.5
    )
    assert "| 0.198× | ≤ 0.5× | met |" in _with(
        report, "benchmark", "compile", target_ratio_hit_over_cold=0.5
    )
    assert "| 5.347× | ≤ 7.0× | met |" in _with(report, "benchmark", "round_trip", target_ratio=7.0)
    # The committed report carries no goal for these two; a report that does is read.
    assert "≥ 10,000/s | met |" in _with(report, "benchmark", "throughput_tiny", target=10_000)
    assert "| 1.192× | ≤ 1.5× | met |" in _with(
        report, "policy_benchmark", "launch_host_cost", target_replay_over_plain=1.5
    )


def _columns(tables: str) -> list[int]:
    """The number of cells of each table row (``\\|`` inside a cell does not count)."""
    rows = [line for line in tables.splitlines() if line.startswith("|")]
    return [len(re.split(r"(?<!\\)\|", row)) - 2 for row in rows]


def _rows(tables: str, start: str) -> list[str]:
    return [line for line in tables.splitlines() if line.startswith(start)]


def test_a_report_without_its_test_steps_renders(report: dict[str, Any]) -> None:
    # scripts/gpu-check --skip-tests: the benchmarks only.
    del report["steps"]["gpu_tests"], report["steps"]["contract_on_cupy"]
    tables = gpu_report.render(report)
    assert _rows(tables, "| gpu_tests") == ["| gpu_tests | step missing | — | — | — |"]
    assert _rows(tables, "| contract_on_cupy") == [
        "| contract_on_cupy | step missing | — | — | — |"
    ]
    assert "| 1.92× faster | ≥ 2.5× | **missed** |" in tables and "step failed" not in tables
    assert sorted(set(_columns(tables))) == [2, 5, 6]


def test_a_report_cut_off_after_its_first_step_renders(report: dict[str, Any]) -> None:
    # gpu-check rewrites the report after every step; a run killed during the second
    # leaves only the first, and the overall "ok" of what it had.
    report["steps"] = {"gpu_tests": report["steps"]["gpu_tests"]}
    tables = gpu_report.render(report)
    assert "| gpu_tests (`pytest -m gpu tests/cupy`) | 11 | 11 | 0 | 0 |" in tables
    assert _rows(tables, "| contract_on_cupy") == [
        "| contract_on_cupy | step missing | — | — | — |"
    ]
    assert _rows(tables, "| benchmark") == [
        "| benchmark (`benchmarks/cuda_backend.py`) | step missing | — | — | — | |"
    ]
    assert _rows(tables, "| policy_benchmark") == [
        "| policy_benchmark (`benchmarks/cuda_policies.py`) | step missing | — | — | — | |"
    ]
    assert "µs" not in tables and "met" not in tables
    assert sorted(set(_columns(tables))) == [2, 5, 6]


def test_a_failed_step_renders_its_error(report: dict[str, Any]) -> None:
    steps = report["steps"]
    steps["benchmark"] = {"ok": False, "error": "timed out after 900.0 s"}
    steps["policy_benchmark"] = {
        "ok": False,
        "returncode": 1,
        "stderr": "Traceback (most recent call last):\n  ...\nRuntimeError: a | b\n\n",
    }
    steps["contract_on_cupy"] = {
        "ok": False,
        "error": "the 'cupy' backend is not registered:\nthe installed wheel lacks it",
    }
    steps["gpu_tests"] = {
        "command": "-m pytest -q --junitxml=/out/gpu-tests.xml -m gpu tests/cupy",
        "returncode": -1,
        "seconds": 900.0,
        "output_tail": "timed out after 900.0 s: pytest",
        "ok": False,
    }
    tables = gpu_report.render(report)
    assert _rows(tables, "| gpu_tests") == [
        "| gpu_tests | step failed: exit -1: timed out after 900.0 s: pytest | — | — | — |"
    ]
    assert _rows(tables, "| contract_on_cupy") == [
        "| contract_on_cupy | step failed: the 'cupy' backend is not registered: the installed "
        "wheel lacks it | — | — | — |"
    ]
    assert _rows(tables, "| benchmark") == [
        "| benchmark (`benchmarks/cuda_backend.py`) | step failed: timed out after 900.0 s "
        "| — | — | — | |"
    ]
    assert _rows(tables, "| policy_benchmark") == [
        "| policy_benchmark (`benchmarks/cuda_policies.py`) | step failed: exit 1: "
        "RuntimeError: a \\| b | — | — | — | |"
    ]
    assert "µs" not in tables and "met" not in tables
    assert sorted(set(_columns(tables))) == [2, 5, 6]


def test_a_failed_benchmark_leaves_the_other_ones_figures(report: dict[str, Any]) -> None:
    report["steps"]["benchmark"] = {"ok": False, "error": "no GPU"}
    tables = gpu_report.render(report)
    assert tables.count("step failed: no GPU") == 1
    assert "| 1.92× faster | ≥ 2.5× | **missed** |" in tables
    assert "| the policy's verdict for that batch | `persistent` |" in tables
    assert "round trip" not in tables and "saxpy" not in tables


def test_a_report_of_a_machine_without_a_gpu_renders(tmp_path: Path, capsys: Any) -> None:
    # What gpu-check writes where its probe finds no device (package-check runs that).
    partial = {
        "check": "vyre-async cupy backend on a GPU",
        "date": "2026-11-27T02:35:30+00:00",
        "python": "3.12.3",
        "commit": None,
        "cuda_error": "ModuleNotFoundError: No module named 'cupy'",
        "vyre_async_version": "0.1.0",
        "vyre_async_from": "/tmp/site/vyre_async",
        "imported_from_src": False,
        "steps": {"probe": {"ok": False, "error": "ModuleNotFoundError: No module named 'cupy'"}},
        "ok": False,
    }
    path = tmp_path / "gpu-check.json"
    path.write_text(json.dumps(partial))
    assert gpu_report.main([str(path)]) == 0
    tables = capsys.readouterr().out
    assert "| device | step failed: ModuleNotFoundError: No module named 'cupy' |" in tables
    assert "| CUDA driver API / runtime | unknown / unknown |" in tables
    assert "| commit | `unknown` |" in tables
    assert tables.count("step missing") == 4
    assert sorted(set(_columns(tables))) == [2, 5, 6]


def test_the_committed_tables_have_whole_rows(report: dict[str, Any]) -> None:
    assert sorted(set(_columns(gpu_report.render(report)))) == [2, 5, 6]


def test_write_replaces_only_the_marked_tables(tmp_path: Path) -> None:
    page = f"intro\n{gpu_report.BEGIN}\nold\n{gpu_report.END}\nprose after\n"
    assert gpu_report.replace(page, "new\n") == (
        f"intro\n{gpu_report.BEGIN}\nnew\n{gpu_report.END}\nprose after\n"
    )
    with pytest.raises(SystemExit, match="markers"):
        gpu_report.replace("no markers here", "new\n")
