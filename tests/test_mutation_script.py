"""`scripts/mutation.py`: diffs, reruns, scores, refusals, checkpoints (mutmut itself runs once)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_script", ROOT / "scripts/mutation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutation_script"] = module
    spec.loader.exec_module(module)
    return module


mutation = _load()

# What mutmut writes for a module `pkg/mod.py` with one function `f`: the original,
# two mutants, and the verdicts in a .meta file next to it.
MUTATED = """
def x_f__mutmut_orig(a):
    if a > 0:
        return a + 1
    return 0


def x_f__mutmut_1(a):
    if a >= 0:
        return a + 1
    return 0


def x_f__mutmut_2(a):
    if a > 0:
        return a - 1
    return 0
"""


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    source = tmp_path / "mutants" / "src" / "pkg"
    source.mkdir(parents=True)
    (source / "mod.py").write_text(MUTATED, encoding="utf-8")
    meta = {"exit_code_by_key": {"pkg.mod.x_f__mutmut_1": 0, "pkg.mod.x_f__mutmut_2": 1}}
    (source / "mod.py.meta").write_text(json.dumps(meta), encoding="utf-8")
    monkeypatch.setattr(mutation, "EQUIVALENT", tmp_path / "equivalent")
    return tmp_path


def test_survivor_diffs_show_the_changed_line_of_each_mutant(work: Path) -> None:
    text = mutation.survivor_diffs(work, ["pkg.mod.x_f__mutmut_1", "pkg.mod.x_f__mutmut_2"])
    first, second = text.split("=== ")[1:]
    assert first.startswith("pkg.mod.x_f__mutmut_1\n")
    assert "-    if a > 0:\n+    if a >= 0:" in first
    assert "-        return a + 1\n+        return a - 1" in second
    assert "mutmut_orig" not in text


def test_results_read_every_verdict(work: Path) -> None:
    assert mutation._results(work) == {"pkg.mod.x_f__mutmut_1": 0, "pkg.mod.x_f__mutmut_2": 1}


def test_rerun_takes_what_was_not_caught_and_not_equivalent(work: Path) -> None:
    package = mutation.Package("demo", ("pkg/*",), ("tests",))
    assert mutation._to_rerun(work, package) == ["pkg.mod.x_f__mutmut_1"]
    (work / "equivalent").mkdir()
    (work / "equivalent" / "demo.toml").write_text(
        '"pkg.mod.x_f__mutmut_1" = "a is never 0"\n', encoding="utf-8"
    )
    assert mutation._equivalent("demo") == {"pkg.mod.x_f__mutmut_1": "a is never 0"}
    assert mutation._to_rerun(work, package) == []


def test_an_equivalent_whose_name_comes_to_mean_another_change_counts_as_open(
    work: Path,
) -> None:
    package = mutation.Package("demo", ("pkg/*",), ("tests",))
    (work / "equivalent").mkdir()
    (work / "equivalent" / "demo.toml").write_text(
        '"pkg.mod.x_f__mutmut_1" = "a is never 0"\n', encoding="utf-8"
    )
    first = mutation.summarise(work, package, mutation._results(work))
    assert (first["equivalent"], first["survived"], first["moved_equivalents"]) == (1, 0, [])
    # (what the reason was written for: the first report pins it)
    assert first["pins"] == {"pkg.mod.x_f__mutmut_1": "-if a > 0:\n+if a >= 0:"}
    mutation._pins_path("demo").write_text(json.dumps(first["pins"]), encoding="utf-8")
    # An edit above it: mutmut numbers the function's mutants anew, and 1 is now the other.
    mod = work / "mutants" / "src" / "pkg" / "mod.py"
    swapped = (
        MUTATED.replace("def x_f__mutmut_1", "def TMP")
        .replace("def x_f__mutmut_2", "def x_f__mutmut_1")
        .replace("def TMP", "def x_f__mutmut_2")
    )
    mod.write_text(swapped, encoding="utf-8")
    second = mutation.summarise(work, package, mutation._results(work))
    assert second["moved_equivalents"] == ["pkg.mod.x_f__mutmut_1"]
    assert (second["equivalent"], second["survived"]) == (0, 1)
    assert second["survivors"] == ["pkg.mod.x_f__mutmut_1"]
    assert second["pins"] == first["pins"]  # (kept until someone checks the reason)
    assert mutation._to_rerun(work, package) == ["pkg.mod.x_f__mutmut_1"]
    # Checked against the new diff and its pin deleted: it holds again, pinned anew.
    mutation._pins_path("demo").write_text("{}", encoding="utf-8")
    third = mutation.summarise(work, package, mutation._results(work))
    assert (third["equivalent"], third["moved_equivalents"]) == (1, [])
    assert third["pins"] == {"pkg.mod.x_f__mutmut_1": "-return a + 1\n+return a - 1"}


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (0, "survived"),
        (1, "killed"),
        (-24, "timeout"),
        (-7, "segfault"),  # (a bus error: a crash all the same)
        (255, "suspicious"),
        (None, "not checked"),
    ],
)
def test_verdicts(code: int | None, status: str) -> None:
    assert mutation.STATUS.get(code, "suspicious") == status


def test_an_unknown_package_is_refused_with_a_fix(capsys: pytest.CaptureFixture[str]) -> None:
    assert mutation.main(["nonesuch"]) == 2
    err = capsys.readouterr().err
    assert "unknown package(s): nonesuch" in err and "Fix: choose from config, cache" in err


def test_every_package_names_files_and_tests_that_exist() -> None:
    for package in mutation.PACKAGES.values():
        tests = list(package.tests)
        while "-k" in tests:  # a -k expression is not a path
            at = tests.index("-k")
            del tests[at : at + 2]
        for test in tests:  # paths, node ids, and the contract suite's --vyre-backend=ID
            path, _, name = test.partition("::")
            assert test.startswith("--vyre-backend=") or (ROOT / path).exists(), (
                package.name,
                test,
            )
            if name:  # a node id names a test of that file
                assert _defines(ROOT / path, name.split("[")[0]), test
        for test in package.deselect:
            path, _, name = test.partition("::")
            assert (ROOT / path).exists() and _defines(ROOT / path, name), test
        for pattern in package.paths:
            found = [*(ROOT / "src").glob(pattern), *(ROOT / "src" / "backends").glob(pattern)]
            assert found, (package.name, pattern)


def _defines(path: Path, name: str) -> bool:
    """Whether a test file defines ``name`` (a function, or a name bound to one)."""
    text = path.read_text(encoding="utf-8")
    return re.search(rf"^(async )?def {name}\(|^{name} = ", text, re.MULTILINE) is not None


def test_reuse_without_a_previous_run_is_refused_with_a_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mutation, "WORK", tmp_path)
    with pytest.raises(SystemExit) as info:
        mutation.run_package(
            mutation.PACKAGES["config"], max_children=1, survivors=False, reuse=True
        )
    assert "--reuse needs a previous run" in str(info.value)
    assert "Fix: run scripts/mutation.py config without --reuse first" in str(info.value)


def test_resume_without_an_interrupted_run_is_refused_with_a_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mutation, "WORK", tmp_path)
    with pytest.raises(SystemExit) as info:
        mutation.run_package(
            mutation.PACKAGES["ir"], max_children=1, survivors=False, reuse=False, resume=True
        )
    assert "--resume needs an interrupted run" in str(info.value)
    assert "Fix: run scripts/mutation.py ir without --resume" in str(info.value)
    with pytest.raises(SystemExit, match="--resume and --reuse are two different runs"):
        mutation.run_package(
            mutation.PACKAGES["ir"], max_children=1, survivors=False, reuse=True, resume=True
        )


def test_a_run_goes_on_with_changed_code_forgetting_only_what_the_change_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (the run's copy of the tree is flat: src/backends/vyre_ray is src/vyre_ray there)
    work = tmp_path / "ray"
    for name in ("backend.py", "errors.py", "__init__.py"):
        copy = work / "src" / "vyre_ray" / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text("old\n", encoding="utf-8")
        os.utime(copy, (1, 1))
    checked = {
        "vyre_ray.backend.x_f__mutmut_1": {"fresh": True},
        "vyre_ray.errors.x_g__mutmut_2": {"fresh": True},
        "vyre_ray.x___getattr____mutmut_1": {"fresh": True},
    }
    (work / "checked.json").write_text(json.dumps(checked), encoding="utf-8")
    package = mutation.PACKAGES["ray"]
    changed = mutation._changed_sources(work, package)
    assert "backends/vyre_ray/backend.py" in changed and "backends/vyre_ray/__init__.py" in changed
    mutation._take_changes(work, ["backends/vyre_ray/backend.py", "backends/vyre_ray/__init__.py"])
    taken = work / "src" / "vyre_ray" / "backend.py"
    committed = mutation._committed("src/backends/vyre_ray", "tests/corpus_snapshot.json")
    assert taken.read_bytes() == committed["src/backends/vyre_ray/backend.py"]  # (HEAD's)
    assert taken.stat().st_mtime > time.time() - 60  # (newer than its mutants: regenerated)
    assert (work / "src" / "vyre_ray" / "errors.py").read_text(encoding="utf-8") == "old\n"
    assert json.loads((work / "checked.json").read_text(encoding="utf-8")) == {
        "vyre_ray.errors.x_g__mutmut_2": {"fresh": True}
    }
    assert "backends/vyre_ray/backend.py" not in mutation._changed_sources(work, package)
    gone = work / "tests" / "test_deleted_since.py"
    gone.parent.mkdir(parents=True)
    gone.write_text("def test_x(): pass\n", encoding="utf-8")
    mutation._take_tests(work, package, 1)  # (what --resume does too: the committed tests)
    snapshot = work / "tests" / "corpus_snapshot.json"
    assert snapshot.read_bytes() == committed["tests/corpus_snapshot.json"]
    assert not gone.exists()
    settings = tomllib.loads((work / "pyproject.toml").read_text(encoding="utf-8"))
    assert settings["tool"]["mutmut"]["only_mutate"] == ["src/vyre_ray/*"]  # (kept: mutmut's own)


def test_only_and_sample_killed_need_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert mutation.main(["ir", "--only", "vyre_async.ir.wire.*"]) == 2
    assert "--only, --fresh and --sample-killed go with --check" in capsys.readouterr().err
    assert mutation.main(["ir", "--sample-killed", "3"]) == 2
    assert mutation.main(["ir", "--fresh"]) == 2


FAKE_MUTATED = """
import os
import subprocess


def f(a):
    mutant = os.environ.get("MUTANT_UNDER_TEST", "")
    if mutant.endswith("_2"):
        return a + 2  # the one the test below sees
    if mutant.endswith("_6"):
        import time

        time.sleep(600)  # a mutant that hangs its tests
    return a * 2


def make():  # run once, at import: a table of functions
    if os.environ.get("MUTANT_UNDER_TEST", "").endswith("_5"):
        return lambda a: a * 3
    return lambda a: a * 2


TABLE = make()
"""


def test_check_runs_tests_against_each_open_mutant_and_records_the_kills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mutation, "WORK", tmp_path / "work")
    monkeypatch.setattr(mutation, "EQUIVALENT", tmp_path / "equivalent")
    work = tmp_path / "work" / "fake"
    source = work / "mutants" / "src" / "fakepkg"
    source.mkdir(parents=True)
    (source / "__init__.py").write_text(FAKE_MUTATED, encoding="utf-8")
    codes = {
        "fakepkg.x_f__mutmut_1": 0,  # survived: open
        "fakepkg.x_f__mutmut_2": 33,  # no tests: open
        "fakepkg.x_f__mutmut_3": -11,  # crashed the forked runner: open
        "fakepkg.x_f__mutmut_4": 1,  # killed: not rerun
        "fakepkg.x_make__mutmut_5": 0,  # survived mutmut's runner: it changes code run at import
    }
    (work / "codes.json").write_text(json.dumps(codes), encoding="utf-8")
    test = tmp_path / "test_fake.py"
    test.write_text(
        "from fakepkg import TABLE, f\n\n\ndef test_f():\n    assert f(3) == TABLE(3) == 6\n"
    )
    package = mutation.Package("fake", ("fakepkg/*",), ())
    # Only the names matching a pattern.
    assert mutation.check_tests(package, [str(test)], only="*_mutmut_[23]") == {
        "fakepkg.x_f__mutmut_2": "killed",
        "fakepkg.x_f__mutmut_3": "survived",
    }
    with pytest.raises(SystemExit, match="--only 'nothing\\*' matches none of the 3 mutants"):
        mutation.check_tests(package, [str(test)], only="nothing*")
    # The kill is recorded: the next check leaves mutant 2 out, and the report counts it.
    checked = json.loads((work / "checked.json").read_text(encoding="utf-8"))
    assert list(checked) == ["fakepkg.x_f__mutmut_2"]
    assert checked["fakepkg.x_f__mutmut_2"]["tests"] == [str(test)]
    assert checked["fakepkg.x_f__mutmut_2"]["fresh"] is True  # confirmed in its own interpreter
    assert checked["fakepkg.x_f__mutmut_2"]["pytest_addopts"] == ""
    # In one process, the import ran once, without a mutant: mutant 5 goes unseen.
    assert mutation.check_tests(package, [str(test)]) == {
        "fakepkg.x_f__mutmut_1": "survived",
        "fakepkg.x_f__mutmut_3": "survived",
        "fakepkg.x_make__mutmut_5": "survived",
    }
    # In an interpreter of its own, the import sees it.
    assert mutation.check_tests(package, [str(test)], only="*make*", fresh=True) == {
        "fakepkg.x_make__mutmut_5": "killed"
    }
    assert json.loads((work / "checked.json").read_text(encoding="utf-8"))[
        "fakepkg.x_make__mutmut_5"
    ]["fresh"]
    # A kill recorded without confirmation (as checks did before) is open again.
    recorded = json.loads((work / "checked.json").read_text(encoding="utf-8"))
    recorded["fakepkg.x_f__mutmut_1"] = {"tests": [], "fresh": False, "commit": "old"}
    (work / "checked.json").write_text(json.dumps(recorded), encoding="utf-8")
    assert "fakepkg.x_f__mutmut_1" in mutation._to_rerun(work, package)
    report = mutation.summarise(work, package, codes)
    assert report["killed"] == 2  # mutmut's: mutant 4, and mutant 3's crash
    assert report["killed_by_check"] == 2
    assert sorted(report["killed_by_check_mutants"]) == [
        "fakepkg.x_f__mutmut_2",
        "fakepkg.x_make__mutmut_5",
    ]
    assert report["survivors"] == ["fakepkg.x_f__mutmut_1"]
    assert report["no_test_mutants"] == []
    assert report["score"] == round(4 / 5, 4)
    assert mutation._to_rerun(work, package) == ["fakepkg.x_f__mutmut_1"]
    # A sample of the killed ones instead (false kills): mutant 4 is the only one; not recorded.
    # A mutant that hangs its tests is ended with its process group and counted killed.
    env = {**os.environ, "PYTHONPATH": str(work / "mutants" / "src")}
    started = time.monotonic()
    assert mutation._fresh_runner(["fakepkg.x_f__mutmut_6"], [str(test)], env, slack=2.0) == {
        "fakepkg.x_f__mutmut_6": "killed"
    }
    assert time.monotonic() - started < 120
    assert mutation.check_tests(package, [str(test)], sample_killed=5) == {
        "fakepkg.x_f__mutmut_4": "survived"  # (this fake's mutant 4 changes nothing: a false kill)
    }
    assert "fakepkg.x_f__mutmut_4" not in json.loads(
        (work / "checked.json").read_text(encoding="utf-8")
    )
    test.write_text("from fakepkg import f\n\n\ndef test_f():\n    assert f(3) == 7\n")
    with pytest.raises(SystemExit, match="--check failed"):
        mutation.check_tests(package, [str(test)])  # the tests fail without a mutant
    with pytest.raises(SystemExit, match="--check failed"):
        mutation.check_tests(package, [str(test)], fresh=True)


def test_check_needs_a_run_of_todays_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(mutation, "WORK", tmp_path)
    with pytest.raises(SystemExit) as info:
        mutation.check_tests(mutation.PACKAGES["config"], ["tests/test_cli.py"])
    assert "--check needs a previous run" in str(info.value)
    assert "Fix: run scripts/mutation.py config first" in str(info.value)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "codes.json").write_text("{}", encoding="utf-8")
    with pytest.raises(SystemExit) as info:  # no copy of config.py: the code changed
        mutation.check_tests(mutation.PACKAGES["config"], ["tests/test_cli.py"])
    assert "the code changed since the last run (" in str(info.value)
    assert "vyre_async/_config.py" in str(info.value)
    assert mutation.main(["config", "cache", "--check", "tests/test_cli.py"]) == 2
    assert "--check takes one package" in capsys.readouterr().err


def test_every_test_file_written_for_mutants_is_run_by_a_package() -> None:
    # A triage file left out of its package's tests kills nothing in the next run.
    covered = {test for package in mutation.PACKAGES.values() for test in package.tests}
    for path in (ROOT / "tests").rglob("test_*_mutants.py"):
        relative = path.relative_to(ROOT)
        assert any(
            str(relative) == test or str(relative).startswith(test.rstrip("/") + "/")
            for test in covered
        ), relative


def test_a_run_is_not_resumed_with_another_test_selection(tmp_path: Path) -> None:
    # mutmut resets every verdict of a run whose test selection changed (found the hard way).
    package = mutation.PACKAGES["config"]
    work = tmp_path / "config"
    work.mkdir()
    (work / "pyproject.toml").write_text(mutation._settings(package, 2), encoding="utf-8")
    mutation._same_selection(work, package)  # the same: goes on
    other = mutation.Package(package.name, package.paths, (*package.tests, "tests/test_x.py"))
    with pytest.raises(SystemExit) as info:
        mutation._same_selection(work, other)
    assert "the package's test selection changed since its run began" in str(info.value)
    assert "Fix: run scripts/mutation.py config without --resume" in str(info.value)


SOURCE = """
def f(a):
    if a > 0:
        return a + 1
    return 0


def g(b):
    return b * 2
"""


def _seeded_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Any]:
    """A work folder as a new run has it (the flat tree), before mutmut: src/pkg/mod.py."""
    monkeypatch.setattr(mutation, "EQUIVALENT", tmp_path / "equivalent")
    monkeypatch.setattr(mutation, "CHECKPOINTS", tmp_path / "checkpoints")
    (tmp_path / "equivalent").mkdir()
    work = tmp_path / "work"
    (work / "src" / "pkg").mkdir(parents=True)
    (work / "src" / "pkg" / "mod.py").write_text(SOURCE, encoding="utf-8")
    (work / "src" / "pkg" / "other.py").write_text(SOURCE, encoding="utf-8")  # (not mutated)
    return work, mutation.Package("demo", ("pkg/mod.py",), ("tests",))


def _meta(work: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (work / "mutants" / "src" / "pkg" / "mod.py.meta").read_text(encoding="utf-8")
    )
    return data


def test_a_new_run_begins_with_the_equivalents_whose_change_is_the_pinned_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work, package = _seeded_package(tmp_path, monkeypatch)
    # What mutmut makes of f: the first two are `a >= 0` and `a > 1`.
    (tmp_path / "equivalent" / "demo.toml").write_text(
        '"pkg.mod.x_f__mutmut_1" = "a is never 0"\n'
        '"pkg.mod.x_f__mutmut_2" = "judged on another change"\n'
        '"pkg.mod.x_g__mutmut_1" = "listed, never pinned"\n',
        encoding="utf-8",
    )
    pins = {
        "pkg.mod.x_f__mutmut_1": "-if a > 0:\n+if a >= 0:",
        "pkg.mod.x_f__mutmut_2": "-if a > 0:\n+if a >= 0:",  # (its change moved: run it)
    }
    mutation._pins_path("demo").write_text(json.dumps(pins), encoding="utf-8")
    counts = mutation._seed(work, package, None)
    assert counts == {"from_checkpoint": 0, "equivalents_not_rerun": 1}
    meta = _meta(work)
    codes = meta["exit_code_by_key"]
    assert codes["pkg.mod.x_f__mutmut_1"] == 0
    assert codes["pkg.mod.x_f__mutmut_2"] is None and codes["pkg.mod.x_g__mutmut_1"] is None
    assert len(codes) > 5 and sum(c is not None for c in codes.values()) == 1
    assert set(meta["hash_by_function_name"]) == {"x_f", "x_g"}  # (mutmut keeps verdicts by them)
    assert not (work / "mutants" / "src" / "pkg" / "other.py.meta").exists()


def test_a_checkpoint_carries_a_run_to_another_machine_for_the_unchanged_functions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work, package = _seeded_package(tmp_path, monkeypatch)
    mutation._seed(work, package, None)
    meta = _meta(work)
    names = sorted(meta["exit_code_by_key"])
    for i, name in enumerate(names):  # (as mutmut leaves them: some done, some not yet)
        meta["exit_code_by_key"][name] = None if i % 3 == 2 else (1 if i % 3 else 0)
    (work / "mutants" / "src" / "pkg" / "mod.py.meta").write_text(json.dumps(meta))
    survivor_f = next(n for n in names if "x_f_" in n and meta["exit_code_by_key"][n] == 0)
    survivor_g = next(n for n in names if "x_g_" in n and meta["exit_code_by_key"][n] == 0)
    checked = {survivor_f: {"fresh": True}, survivor_g: {"fresh": True}}
    (work / "checked.json").write_text(json.dumps(checked), encoding="utf-8")
    state = mutation.checkpoint(work, package)
    saved = json.loads(mutation._checkpoint_path("demo").read_text(encoding="utf-8"))
    assert saved == json.loads(json.dumps(state))
    done = {k: v for k, v in meta["exit_code_by_key"].items() if v is not None}
    assert saved["files"]["src/pkg/mod.py"]["verdicts"] == done
    assert (saved["mutants"], saved["verdicts"]) == (len(names), len(done))
    assert saved["selection"] == mutation._selection(package)
    # Another machine: the same code, then g changed.
    for changed in (False, True):
        other = tmp_path / f"other{changed}"
        (other / "src" / "pkg").mkdir(parents=True)
        text = SOURCE.replace("b * 2", "b * 3") if changed else SOURCE
        (other / "src" / "pkg" / "mod.py").write_text(text, encoding="utf-8")
        counts = mutation._seed(other, package, saved)
        codes = _meta(other)["exit_code_by_key"]
        kept = {k: v for k, v in done.items() if not (changed and "x_g_" in k)}
        assert {k: v for k, v in codes.items() if v is not None} == kept
        assert counts["from_checkpoint"] == len(kept)
        restored = json.loads((other / "checked.json").read_text(encoding="utf-8"))
        assert set(restored) == ({survivor_f} if changed else {survivor_f, survivor_g})


def test_a_checkpoint_of_other_tests_or_none_is_refused_with_a_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(mutation, "WORK", tmp_path / "work")
    monkeypatch.setattr(mutation, "CHECKPOINTS", tmp_path / "checkpoints")
    package = mutation.PACKAGES["config"]
    with pytest.raises(SystemExit) as info:
        mutation.run_package(package, max_children=1, survivors=False, reuse=False, resume=True)
    assert "or a checkpoint in" in str(info.value)
    (tmp_path / "checkpoints").mkdir()
    saved = {"selection": [*mutation._selection(package), "tests/test_x.py"], "files": {}}
    mutation._checkpoint_path("config").write_text(json.dumps(saved), encoding="utf-8")
    with pytest.raises(SystemExit) as info:
        mutation.run_package(package, max_children=1, survivors=False, reuse=False, resume=True)
    assert "was written by a run that selected other tests" in str(info.value)
    assert "Fix: run scripts/mutation.py config without --resume" in str(info.value)
    assert mutation.main(["config", "--checkpoint"]) == 2
    err = capsys.readouterr().err
    assert "config: no run in" in err and "Fix: run scripts/mutation.py config first" in err


def test_mutmut_keeps_the_seeded_verdicts_and_runs_only_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The assumption `_seed` rests on, checked with mutmut itself on a one-function project.
    work, package = _seeded_package(tmp_path, monkeypatch)
    (work / "tests").mkdir()
    (work / "tests" / "test_mod.py").write_text(
        "from pkg.mod import f, g\n\n\ndef test_f():\n    assert f(1) == 2 and f(-1) == 0\n"
        "    assert g(2) == 4\n",
        encoding="utf-8",
    )
    (work / "pyproject.toml").write_text(
        '[tool.mutmut]\nsource_paths = ["src"]\nonly_mutate = ["src/pkg/mod.py"]\n'
        'pytest_add_cli_args = ["-p", "no:cacheprovider"]\n'
        'pytest_add_cli_args_test_selection = ["tests"]\n',
        encoding="utf-8",
    )
    # Listed (wrongly: the test kills it) and pinned: mutmut must not run it again.
    first = "pkg.mod.x_g__mutmut_1"
    (tmp_path / "equivalent" / "demo.toml").write_text(f'"{first}" = "x"\n', encoding="utf-8")
    pins = {first: "-return b * 2\n+return b / 2"}
    mutation._pins_path("demo").write_text(json.dumps(pins), encoding="utf-8")
    assert mutation._seed(work, package, None)["equivalents_not_rerun"] == 1
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-m", "mutmut", "run", "--max-children", "1"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    codes = _meta(work)["exit_code_by_key"]
    assert codes[first] == 0  # (kept: run, it would have been killed)
    assert all(code is not None for code in codes.values())
    assert sum(code == 1 for code in codes.values()) >= len(codes) - 3  # (the rest are caught)


def test_a_run_whose_stats_run_crashed_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    crashed = "⠋ Running stats\nChildProcessError: Child exited with code -11\n"
    outputs = [crashed, "failed to collect stats. runner returned 1\n", "Running clean tests\n"]
    calls: list[list[str]] = []

    def fake_run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        out = outputs[len(calls) - 1]
        failed = any(word in out for word in ("failed", "Failed", "Child exited"))
        return subprocess.CompletedProcess(command, int(failed), out, "")

    monkeypatch.setattr(mutation.subprocess, "run", fake_run)
    done = mutation._run_mutmut(["mutmut", "run"], tmp_path, {}, "demo")
    assert (done.returncode, len(calls)) == (0, 3)
    assert (tmp_path / "mutmut-stats-1.log").read_text(encoding="utf-8").startswith(crashed)
    # A failure after the stats run (a mutant run, a clean run) is not retried.
    outputs[:] = ["Running clean tests\nChildProcessError: Child exited with code -11\n"]
    calls.clear()
    assert mutation._run_mutmut(["mutmut", "run"], tmp_path, {}, "demo").returncode == 1
    assert len(calls) == 1
    # Nor forever: a test that really fails fails every attempt.
    outputs[:] = [crashed] * mutation.STATS_ATTEMPTS
    calls.clear()
    assert mutation._run_mutmut(["mutmut", "run"], tmp_path, {}, "demo").returncode == 1
    assert len(calls) == mutation.STATS_ATTEMPTS


def test_crashes_are_run_again_after_a_fix(
    work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    meta_path = work / "mutants" / "src" / "pkg" / "mod.py.meta"
    codes = {"pkg.mod.x_f__mutmut_1": -11, "pkg.mod.x_f__mutmut_2": -7}
    codes |= {"pkg.mod.x_f__mutmut_3": 1, "pkg.mod.x_f__mutmut_4": 0, "pkg.mod.x_f__mutmut_5": -24}
    meta_path.write_text(json.dumps({"exit_code_by_key": codes}), encoding="utf-8")
    assert mutation.forget_crashes(work) == 2
    assert json.loads(meta_path.read_text(encoding="utf-8"))["exit_code_by_key"] == {
        **codes,
        "pkg.mod.x_f__mutmut_1": None,
        "pkg.mod.x_f__mutmut_2": None,
    }
    monkeypatch.setattr(mutation, "WORK", tmp_path / "none")
    with pytest.raises(SystemExit, match="--rerun-crashes goes on with a run in"):
        mutation.run_package(
            mutation.PACKAGES["config"],
            max_children=1,
            survivors=False,
            reuse=False,
            rerun_crashes=True,
        )
