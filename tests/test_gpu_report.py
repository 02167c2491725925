"""docs/benchmarks/gpu.md shows what gpu-check.json holds, each goal marked by its figure."""

from __future__ import annotations

import copy
import importlib.machinery
import importlib.util
import json
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


def test_a_goal_is_marked_by_its_figure(report: dict[str, Any]) -> None:
    arms = report["steps"]["policy_benchmark"]["arm_concurrency"]
    arms.update(concurrency_factor=1.2, met=False)
    assert "1.2× faster | ≥ 2.5× | **missed** |" in gpu_report.render(report)
    better = copy.deepcopy(report)
    better["steps"]["policy_benchmark"]["arm_concurrency"].update(concurrency_factor=3.1, met=True)
    assert "3.1× faster | ≥ 2.5× | met |" in gpu_report.render(better)
    fast = copy.deepcopy(report)
    fast["steps"]["benchmark"]["throughput_tiny"]["backend_64_tasks_per_s"] = 60_000.0
    assert "60,000/s" in gpu_report.render(fast) and "≥ 50,000/s | met |" in gpu_report.render(fast)


def test_write_replaces_only_the_marked_tables(tmp_path: Path) -> None:
    page = f"intro\n{gpu_report.BEGIN}\nold\n{gpu_report.END}\nprose after\n"
    assert gpu_report.replace(page, "new\n") == (
        f"intro\n{gpu_report.BEGIN}\nnew\n{gpu_report.END}\nprose after\n"
    )
    with pytest.raises(SystemExit, match="markers"):
        gpu_report.replace("no markers here", "new\n")
