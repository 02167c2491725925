#!/usr/bin/env python3
"""Mutation testing with mutmut: per-package scores, survivors, and the triage.

mutmut (https://github.com/boxed/mutmut) rewrites every function of the code
it mutates into a set of mutants (an operator swapped, a constant changed, an
argument dropped, ...) and runs, for each mutant, the tests that reached that
function in a first, clean run. A mutant that no test notices *survived*.

The project's layout is one mutmut cannot take as it is (the backends live
under ``src/backends/`` and are imported as top-level packages), so this script
builds a work folder (``build/mutation/PACKAGE``) from the committed tree
(``git archive HEAD``) with every package flat under ``src/``, writes mutmut's
settings there, runs mutmut, and reports::

    .venv/bin/python scripts/mutation.py config              # one package
    .venv/bin/python scripts/mutation.py config cache plan   # several, one after the other
    .venv/bin/python scripts/mutation.py --list              # the packages and their tests
    .venv/bin/python scripts/mutation.py config --survivors  # print each survivor's diff
    .venv/bin/python scripts/mutation.py ir --resume         # go on with a run (after edits too;
                                                             # or from its committed checkpoint)
    .venv/bin/python scripts/mutation.py ir --reuse          # rerun what is open, committed tests
    .venv/bin/python scripts/mutation.py ir --check tests/ir/test_wire_fuzz.py [--fresh]
    .venv/bin/python scripts/mutation.py ir --checkpoint     # save a run's verdicts (to commit)

Each package's result is written to ``build/mutation/PACKAGE/result.json`` and
summarised on stdout as JSON (a line per package). Mutants judged equivalent
(no behaviour a user can observe changes) are listed with a one-line reason in
``scripts/mutation_equivalent/PACKAGE.toml`` (``"mutant name" = "reason"``); the
score counts them with the killed ones and says how many there were. ``--check``
runs other tests against the open mutants (in one process, or with ``--fresh``
each in an interpreter of its own) and records its kills for the next report.
"""

from __future__ import annotations

import argparse
import ast
import compileall
import difflib
import fnmatch
import io
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "mutation"
EQUIVALENT = ROOT / "scripts" / "mutation_equivalent"
CHECKPOINTS = ROOT / "scripts" / "mutation_checkpoints"

# What the tests read besides the code (copied into mutmut's "mutants" folder).
ALSO_COPY = [
    "tests",
    "README.md",
    "docs",
    "examples",
    "scripts",
    "benchmarks",
    "pyproject.toml",
    "CHANGELOG.md",
    "Makefile",
]

# Tests that cannot run inside mutmut's forked runner or that only reach the
# code through other processes (a mutant there is invisible to them anyway).
DESELECT_ALWAYS = [
    "--deselect=tests/test_soak.py",
    "--ignore=tests/service",
    "--ignore=tests/ray",
    "--ignore=tests/test_packaging.py",
    "--ignore=tests/test_orphan_guard.py",
    "--ignore=tests/test_testing_plugin.py",
    "--ignore=tests/test_soak.py",
    "--ignore=tests/test_docs_need_sybil.py",
]


@dataclass(frozen=True)
class Package:
    """A unit of the mutation report: the files mutated and the tests run on them."""

    name: str
    paths: tuple[str, ...]  # relative to the flat src/ (globs allowed by mutmut's only_mutate)
    tests: tuple[str, ...]
    note: str = ""
    # Tests that cannot pass on any mutmut-rewritten copy of the package, with the reason.
    deselect: tuple[str, ...] = ()


PACKAGES: dict[str, Package] = {
    p.name: p
    for p in [
        Package(
            "config",
            ("vyre_async/_config.py", "vyre_async/_arguments.py"),
            ("tests/driver", "tests/test_cli.py"),
        ),
        Package(
            "cache",
            ("vyre_async/_cache/*", "vyre_async/_store.py"),  # (the memory LRU is in _store)
            ("tests/driver", "tests/policies/test_calibration.py", "tests/reliability"),
        ),
        Package(
            "plan",
            ("vyre_async/_plan.py",),
            # (plan's own tests: every reference dispatch plans too, so with tests/reference
            # each surviving mutant cost a 40 s run and a full run took over an hour)
            ("tests/test_plan.py", "tests/test_plan_mutants.py"),
        ),
        Package(
            "registry",
            ("vyre_async/_registry.py",),
            (
                "tests/test_registry.py",
                "tests/test_registry_mutants.py",
                "tests/driver",
                "tests/test_cli.py",
            ),
        ),
        Package("pending", ("vyre_async/_pending.py",), ("tests/driver", "tests/reliability")),
        Package(
            "policies",
            ("vyre_async/policies/*",),
            ("tests/policies",),
            # mutmut's rewrite of __init__.py adds `MutantDict` to the package's
            # names; this test asserts the names are exactly __all__.
            deselect=("tests/policies/test_annotations_api.py::test_public_names_are_exactly_all",),
        ),
        Package(
            "ir",
            ("vyre_async/ir/*",),
            # (ir's own tests; tests/reference reaches the IR through every dispatch and is
            # run on the open mutants afterwards with --check, as for plan)
            ("tests/ir",),
            # 10-25 s each per mutant on a rewritten copy (a program at MAX_NODES; 27 000
            # hostile decodes; parsing the 2 MB rewritten wire.py): run on the open
            # mutants afterwards with --check, not on every mutant of what they reach
            deselect=(
                "tests/ir/test_wire.py::test_node_limit",
                "tests/ir/test_wire.py::test_wire_module_uses_no_pickle",
                "tests/ir/test_wire_fuzz.py::test_decoder_survives_hostile_inputs",
            ),
        ),
        Package(
            "telemetry",
            ("vyre_async/telemetry/*", "vyre_async/tracing.py"),
            (
                "tests/telemetry",
                "tests/policies/test_spans.py",
                "tests/reliability/test_lost_spans.py",  # the file exporter, in process
                "tests/reliability/test_raw_exceptions.py",
            ),
        ),
        Package(
            "timeline",
            ("vyre_async/timeline.py",),
            ("tests/test_timeline.py", "tests/test_timeline_mutants.py", "tests/test_cli.py"),
        ),
        Package(
            "testing",
            ("vyre_async/testing/*",),
            # (the suite on the reference backend, the corpus against its oracle and its
            # recorded snapshot: the corpus's cases are built at collection, before mutmut
            # switches a mutant on, so only the snapshot test, which builds them again, sees a
            # mutant of corpus.py; the judged backends and the plugin's own tests run in
            # subprocesses, which see a mutant only through --check, on the open mutants)
            (
                "tests/test_corpus_snapshot.py",
                "tests/test_contract_helpers_mutants.py",
                "tests/test_corpus_mutants.py",
                "tests/test_testing_plugin_mutants.py",
                "tests/contract",
                "--vyre-backend=reference",
                "tests/reference/test_corpus.py",
            ),
        ),
        Package(
            "reference",
            ("vyre_reference/*",),
            # (its own tests, 25 s; the contract suite and tests/driver dispatch on it too and
            # run on the open mutants afterwards with --check)
            ("tests/reference",),
            deselect=(
                # mutmut's rewrite of __init__.py adds `MutantDict` to the package's names
                "tests/reference/test_corpus.py::test_public_api_is_exactly_all",
                # mutmut 3.8's stats run raises LookupError on its call-context variable in
                # the engine's unawaited dispatches (run in contexts of their own): --check
                "tests/reference/test_ordering_property.py::"
                "test_unawaited_dispatches_on_shared_buffers_equal_sequential_execution",
                # (the same LookupError: an inline dispatch runs in a context of its own)
                "tests/reference/test_backend_mutants.py::"
                "test_an_unrecorded_dispatch_takes_no_phase_times",
            ),
        ),
        Package(
            "ray",
            ("vyre_ray/*",),
            # (no cluster: a fake `ray` drives the pool's driver side against in-process
            # Workers, 2 s. Every test that starts a pool reaches __init__, _connect and the
            # dispatch path, and would cost each of their mutants a local cluster, about 9 s:
            # tests/ray/test_ray_backend.py and the contract suite on ray (--vyre-backend=ray
            # through PYTEST_ADDOPTS) run on the open mutants afterwards with --check --fresh)
            (
                "tests/ray/test_ray_driver_mutants.py",
                "tests/ray/test_ray_pool_mutants.py",
                "tests/ray/test_ray_keys.py",
                "tests/ray/test_ray_backend.py::test_the_cluster_is_named_or_asked_for",
                "tests/ray/test_ray_backend.py::test_ray_is_never_preferred_only_asked_for_by_id",
                "tests/ray/test_ray_backend.py::test_a_pool_size_must_be_a_whole_number",
                "tests/ray/test_ray_backend.py::"
                "test_worker_options_ray_would_refuse_are_refused_with_a_fix",
                "tests/ray/test_ray_backend.py::"
                "test_an_unreachable_cluster_is_refused_with_its_own_fix",
                "tests/ray/test_ray_backend.py::test_ray_errors_become_vyre_errors_with_a_fix",
            ),
            note="the pool's driver side on a fake ray (no cluster); the cluster under --check",
            deselect=(
                # reads backend.py's source, which on the rewritten copy holds every mutant's
                # `_Shipped(...)` call (`_Shipped(None, ...)` among them)
                "tests/ray/test_ray_keys.py::test_the_pool_names_programs_by_their_fingerprint",
            ),
        ),
        Package(
            "cupy",
            ("vyre_cupy/layout.py", "vyre_cupy/batch.py", "vyre_cupy/launch.py"),
            # (the unchanged CupyBackend on the fake device, the emulator built as a library:
            # these mutants leave the generated CUDA C as it is, so every g++ build is a cache
            # hit. The fake device's trio duplicates run the host code its asyncio tests run,
            # but for the poll budget (none without an asyncio loop), which test_cupy_polling's
            # trio and plain-thread tests cover: they run under --check, as do the deselected)
            (
                "tests/cupy/test_cupy_layout.py",
                "tests/cupy/test_cupy_batch.py",
                "tests/cupy/test_cupy_keys.py",
                "tests/cupy/test_cupy_polling.py",
                "tests/cupy/test_cupy_stop_messages.py",
                "tests/cupy/test_cupy_fake_device.py",
                "tests/cupy/test_cupy_differential.py::test_the_fake_device_matches_the_reference",
                "-k",
                "not (test_cupy_fake_device and trio)",
            ),
            note="CUDA host side: the fake device (the emulator as a library; no GPU, no nvcc)",
            deselect=(
                # 23 s and 19 s, reaching every function of batch.py and most of launch.py (a
                # survivor there cost 40 s more), and 5 s (10 000 dispatches): --check
                "tests/cupy/test_cupy_fake_device.py::test_policy_benchmark_runs_on_the_fake_device",
                "tests/cupy/test_cupy_fake_device.py::"
                "test_calibrate_measures_launch_modes_compile_and_copies",
                "tests/cupy/test_cupy_fake_device.py::test_load_10000_dispatches_from_200_tasks",
            ),
        ),
        Package(
            "cupy-codegen",
            ("vyre_cupy/codegen.py", "vyre_cupy/prelude.py"),
            # (the generated CUDA C read as text: no compiler runs; prelude.py is one string
            # constant, of which mutmut makes no mutant. The emulator, nvcc and the fake
            # device run on the open mutants afterwards with --check)
            (
                "tests/cupy/test_codegen.py",
                "tests/cupy/test_codegen_mutants.py",  # (one small emulator build, cached)
                "tests/cupy/test_emulation_ubsan.py::"
                "test_shift_counts_and_divisors_are_literals_in_the_generated_kernels",
                "tests/cupy/test_cupy_compile.py::test_compile_failed_without_a_line_number",
            ),
            note="CUDA C generator: text-level tests (the emulator, nvcc, fake device: --check)",
            deselect=(
                # the `toolchain` fixture starts the corpus, operator-table and fake-device g++
                # builds and nvcc at once, all cache misses for a mutant that changes the
                # generated text (15-20 s of CPU each): --check
                "tests/cupy/test_codegen.py::test_hostile_program_still_runs_correctly",
                "tests/cupy/test_codegen.py::test_ssa_program_runs_both_arms",
                "tests/cupy/test_codegen.py::test_loop_bounds_are_snapshots",
                "tests/cupy/test_codegen.py::test_oob_atomics_return_zero",
                "tests/cupy/test_codegen.py::test_race_detector_flags_exactly_the_racy_probes",
            ),
        ),
    ]
}

STATUS = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    37: "caught by type check",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "suspicious",  # mutmut says timeout; a runner that could not start a test says 255 too
    # a crash of the forked runner's child: a segmentation fault, SIGKILL, a bus error
    # (the CUDA fake device's emulator reading where a mutant's offset points past a
    # buffer), an abort; --check runs each of them again (see check_tests)
    -11: "segfault",
    -9: "segfault",
    -7: "segfault",
    -6: "segfault",
    None: "not checked",
}


def _flat_tree(dest: Path) -> None:
    """Unpack the committed tree (``git archive HEAD``) to ``dest``, every package under ``src/``.

    The committed tree, not the working one: a run measures a commit, and edits
    in progress (a test half written) cannot fail its clean run.
    """
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", "--format=tar", "HEAD"], cwd=ROOT, capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    backends = dest / "src" / "backends"
    for package in sorted(backends.iterdir()):
        if package.is_dir():
            shutil.move(str(package), dest / "src" / package.name)
    shutil.rmtree(backends)


def _settings(package: Package, max_children: int) -> str:
    tests = list(package.tests)
    selection = [*tests, *DESELECT_ALWAYS, *(f"--deselect={t}" for t in package.deselect)]
    lines = [
        "",
        "[tool.mutmut]",
        'source_paths = ["src"]',
        f"only_mutate = {json.dumps(['src/' + p for p in package.paths])}",
        f"also_copy = {json.dumps(ALSO_COPY)}",
        f"pytest_add_cli_args_test_selection = {json.dumps(selection)}",
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "--hypothesis-profile=mutation"]',
        'process_isolation = "forkserver"',
        "use_git_change_detection = false",
        "track_dependencies = false",
        "timeout_multiplier = 5.0",
        "timeout_constant = 10.0",
    ]
    return "\n".join(lines) + "\n"


def _committed(*paths: str) -> dict[str, bytes]:
    """The committed files (``HEAD``) under ``paths``, by path: a run measures a commit."""
    command = ["git", "archive", "--format=tar", "HEAD", *paths]
    archive = subprocess.run(command, cwd=ROOT, capture_output=True, check=True).stdout
    files = {}
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            data = tar.extractfile(member) if member.isfile() else None
            if data is not None:
                files[member.name] = data.read()
    return files


def _changed_sources(work: Path, package: Package) -> list[str]:
    """The package's committed files that differ from the work folder's copy (under src/)."""
    changed = []
    for name, data in sorted(_committed("src").items()):
        relative = Path(name).relative_to("src")
        flat = relative.relative_to("backends") if relative.parts[0] == "backends" else relative
        if relative.suffix != ".py" or not any(
            fnmatch.fnmatch(str(flat), pattern) for pattern in package.paths
        ):
            continue
        copy = work / "src" / flat
        if not copy.exists() or copy.read_bytes() != data:
            changed.append(str(relative))
    return changed


def _take_changes(work: Path, changed: list[str]) -> None:
    """Bring changed files into a run's copy, for a run that goes on with the new code.

    mutmut regenerates a file whose source is newer than its mutants, and resets the
    verdicts of each function whose hash changed (its mutants are run again); the other
    functions keep theirs. A ``--check`` kill in a changed file is forgotten (its name
    may mean another mutant now), and listed equivalents are held to their pins.
    """
    files = set()
    committed = _committed(*(f"src/{relative}" for relative in changed))
    for relative in changed:
        flat = Path(relative)
        flat = flat.relative_to("backends") if flat.parts[0] == "backends" else flat
        (work / "src" / flat).write_bytes(committed[f"src/{relative}"])  # (newer than its mutants)
        module = flat.parent if flat.name == "__init__.py" else flat.with_suffix("")
        files.add(module.as_posix())
    path = work / "checked.json"
    if path.exists():
        recorded = json.loads(path.read_text(encoding="utf-8"))
        kept = {name: e for name, e in recorded.items() if _module_of(name) not in files}
        path.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _same_selection(work: Path, package: Package) -> None:
    """Refuse to resume a run whose package now selects other tests.

    mutmut keys its verdicts to its settings: a changed test selection (a test
    deselected or added to the package) resets every verdict of the run.
    """
    path = work / "pyproject.toml"
    recorded = tomllib.loads(path.read_text(encoding="utf-8")).get("tool", {}).get("mutmut", {})
    wanted = tomllib.loads(_settings(package, 1))["tool"]["mutmut"]
    key = "pytest_add_cli_args_test_selection"
    if recorded and recorded.get(key) != wanted[key]:
        raise SystemExit(
            f"{package.name}: the package's test selection changed since its run began; "
            "mutmut would reset every verdict of the run\n"
            f"Fix: run scripts/mutation.py {package.name} without --resume (a full run), or "
            "restore the selection in scripts/mutation.py until the run is over"
        )


def _selection(package: Package) -> list[str]:
    """The pytest arguments selecting a package's tests (mutmut keys its verdicts to them)."""
    wanted = tomllib.loads(_settings(package, 1))["tool"]["mutmut"]
    return [str(a) for a in wanted["pytest_add_cli_args_test_selection"]]


def _shown(path: Path) -> str:
    """``path`` relative to the repository where it is in it (for messages)."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _checkpoint_path(package: str) -> Path:
    return CHECKPOINTS / f"{package}.json"


def checkpoint(work: Path, package: Package) -> dict[str, Any]:
    """Save a run's verdicts so far to ``scripts/mutation_checkpoints/PACKAGE.json``, to commit.

    ``build/`` is not committed, and a long run (the reference engine's takes hours on
    two cores) can outlive the machine it began on. The checkpoint keeps, per mutated
    file, mutmut's hash of each function and every verdict reached, and the ``--check``
    kills; ``--resume`` on a machine without the work folder starts from it (see
    `_seed`). It can be written while mutmut runs: a verdict is in a .meta file once
    mutmut has it.
    """
    files: dict[str, Any] = {}
    for meta in sorted((work / "mutants").rglob("*.meta")):
        for _ in range(20):  # (mutmut may be writing it)
            try:
                data = json.loads(meta.read_text(encoding="utf-8"))
                break
            except json.JSONDecodeError:
                time.sleep(0.1)
        else:
            raise SystemExit(f"{meta}: not JSON after 2 s\nFix: run --checkpoint again")
        verdicts = {k: v for k, v in data["exit_code_by_key"].items() if v is not None}
        relative = meta.relative_to(work / "mutants").as_posix().removesuffix(".meta")
        files[relative] = {"hashes": data.get("hash_by_function_name", {}), "verdicts": verdicts}
    describe = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    state = {
        "package": package.name,
        "selection": _selection(package),
        "written": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": describe,
        "mutants": sum(
            len(json.loads(m.read_text(encoding="utf-8"))["exit_code_by_key"])
            for m in (work / "mutants").rglob("*.meta")
        ),
        "verdicts": sum(len(f["verdicts"]) for f in files.values()),
        "checked": _checked(work),
        "files": files,
    }
    path = _checkpoint_path(package.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state, indent=0, sort_keys=True) + "\n", encoding="utf-8")
    return state


def _seed(work: Path, package: Package, saved: dict[str, Any] | None) -> dict[str, int]:
    """Write mutmut's .meta files before the first run in a new work folder.

    mutmut skips a mutant that has a verdict, and keeps the verdicts of each function
    whose hash is the one in the .meta file when it writes its mutants. Two kinds are
    written: a checkpoint's verdicts (``saved``), for the functions whose hash is the
    same today, and a listed equivalent whose change is the one its pin records, as
    survived (it was run, seen to survive and judged when it was listed; the report
    counts it with the equivalents, and a moved one, whose change differs from its pin,
    is run). Returns how many of each.
    """
    from mutmut.mutation.file_mutation import mutate_file_contents
    from mutmut.utils.format_utils import get_mutant_name

    listed, pins = _equivalent(package.name), _pins(package.name)
    files = saved["files"] if saved else {}
    counts = {"from_checkpoint": 0, "equivalents_not_rerun": 0}
    kept_checks = {}
    for source in sorted((work / "src").rglob("*.py")):
        relative = source.relative_to(work)
        if not any(fnmatch.fnmatch(str(relative.relative_to("src")), p) for p in package.paths):
            continue
        mutated = mutate_file_contents(str(relative), source.read_text(encoding="utf-8"))
        old = files.get(relative.as_posix(), {})
        old_hashes, old_verdicts = old.get("hashes", {}), old.get("verdicts", {})
        same = {f for f, h in mutated.hash_by_function_name.items() if old_hashes.get(f) == h}
        codes: dict[str, int | None] = {}
        for name in mutated.mutant_names:
            key = get_mutant_name(relative, name)
            function = key.partition("__mutmut_")[0].rpartition(".")[2]
            codes[key] = old_verdicts.get(key) if function in same else None
            if codes[key] is not None:
                counts["from_checkpoint"] += 1
                if saved and key in saved.get("checked", {}):
                    kept_checks[key] = saved["checked"][key]
        candidates = [k for k, c in codes.items() if c is None and k in listed and k in pins]
        changes = _changes_in(mutated.code, candidates) if candidates else {}
        for key in candidates:
            if changes.get(key) == pins[key]:
                codes[key] = 0
                counts["equivalents_not_rerun"] += 1
        meta = work / "mutants" / f"{relative}.meta"
        meta.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "exit_code_by_key": codes,
            "hash_by_function_name": dict(mutated.hash_by_function_name),
            "type_check_error_by_key": {},
            "durations_by_key": {},
            "estimated_durations_by_key": {},
        }
        meta.write_text(json.dumps(data, indent=4), encoding="utf-8")
    if kept_checks:
        (work / "checked.json").write_text(
            json.dumps(kept_checks, indent=1, sort_keys=True) + "\n", encoding="utf-8"
        )
    (work / "seeded.json").write_text(json.dumps(counts) + "\n", encoding="utf-8")
    return counts


def _take_tests(work: Path, package: Package, max_children: int) -> None:
    """Put the committed tests (and what they read) in a run's copy; mutmut copies them on.

    What was there goes first (a test deleted since is gone). ``pyproject.toml`` is
    among them: mutmut's settings are written to it again.
    """
    for name in ALSO_COPY:
        target = work / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    for name, data in _committed(*ALSO_COPY).items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_bytes(data)
    with (work / "pyproject.toml").open("a", encoding="utf-8") as f:
        f.write(_settings(package, max_children))


def _module_of(mutant: str) -> str:
    """``pkg/mod`` for a mutant name ``pkg.mod.x_f__mutmut_1`` (or a method's ``xǁCǁm``)."""
    parts = mutant.split(".")
    index = next(i for i, part in enumerate(parts) if part.startswith(("x_", "xǁ")))
    return "/".join(parts[:index])


def _checked(work: Path) -> dict[str, dict[str, Any]]:
    """The mutants ``--check`` runs killed since the work folder's run, with their tests.

    Only kills seen in an interpreter of the mutant's own count (``fresh``): in one
    process, state a test leaves behind (a cache, a registry's instance) can fail a
    later run whatever the mutant. A kill recorded without it (before checks
    confirmed them) is open again until a ``--fresh`` check confirms it.
    """
    path = work / "checked.json"
    recorded = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    return {name: entry for name, entry in recorded.items() if entry.get("fresh")}


def _record(work: Path, name: str, entry: dict[str, Any]) -> None:
    """Add one confirmed kill to the work folder's ``checked.json`` (at once: a check may stop)."""
    path = work / "checked.json"
    recorded = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    recorded[name] = entry
    path.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _to_rerun(work: Path, package: Package) -> list[str]:
    """The last run's mutants not caught (by it or a --check) and not listed as equivalent."""
    kept = work / "codes.json"
    codes = json.loads(kept.read_text(encoding="utf-8")) if kept.exists() else _results(work)
    caught = {"killed", "timeout", "segfault", "caught by type check"}
    checked = _checked(work)
    open_ = [
        name
        for name, code in codes.items()
        if STATUS.get(code, "suspicious") not in caught and name not in checked
    ]
    holding, _, _ = _equivalents(work, package.name, open_)
    return sorted(name for name in open_ if name not in holding)


def _equivalent(package: str) -> dict[str, str]:
    """The mutants of ``package`` judged equivalent, each with its reason."""
    path = EQUIVALENT / f"{package}.toml"
    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return {str(m): str(r) for m, r in data.items()}


def _pins_path(package: str) -> Path:
    return EQUIVALENT / f"{package}.changes.json"


def _pins(package: str) -> dict[str, str]:
    """What each listed equivalent changed when it was judged (see `_equivalents`)."""
    path = _pins_path(package)
    if not path.exists():
        return {}
    return {str(k): str(v) for k, v in json.loads(path.read_text(encoding="utf-8")).items()}


def _changes(work: Path, mutants: list[str]) -> dict[str, str]:
    """Each mutant's change: the removed and added lines of its diff, without context."""
    return _removed_and_added(survivor_diffs(work, mutants))


def _removed_and_added(diffs: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for block in diffs.split("=== ")[1:]:
        name, _, diff = block.partition("\n")
        out[name] = "\n".join(
            line[0] + line[1:].strip() for line in diff.splitlines() if line[:1] in ("-", "+")
        )
    return out


def _equivalents(
    work: Path, package: str, survivors: list[str]
) -> tuple[set[str], list[str], dict[str, str]]:
    """Which listed equivalents among ``survivors`` still hold, which moved, and the pins.

    A reason is judged against one change; after an edit to the code, mutmut numbers a
    function's mutants anew, and a listed name can come to mean another change. So the
    change each listed name had when it was first seen is pinned
    (``scripts/mutation_equivalent/PACKAGE.changes.json``, written by every report); a
    name whose change differs from its pin has moved: it counts as open until its reason
    is checked against the new diff and its pin deleted (the next report pins it again).
    Returns (holding, moved, the pins to write).
    """
    listed = _equivalent(package)
    pins = _pins(package)
    mine = [m for m in survivors if m in listed]
    now = _changes(work, mine) if mine else {}
    moved = sorted(m for m in mine if m in pins and pins[m] != now[m])
    holding = {m for m in mine if m not in moved}
    written = {m: c for m, c in pins.items() if m in listed}
    written.update({m: now[m] for m in holding if m not in pins})
    return holding, moved, dict(sorted(written.items()))


def _results(work: Path) -> dict[str, int | None]:
    """Every mutant's exit code, from the .meta files mutmut leaves next to each mutated file."""
    codes: dict[str, int | None] = {}
    for meta in (work / "mutants").rglob("*.meta"):
        data = json.loads(meta.read_text(encoding="utf-8"))
        codes.update(data.get("exit_code_by_key", {}))
    return codes


def _functions(path: Path) -> dict[str, str]:
    """Every function of a mutmut-rewritten file by name (the original and each mutant)."""
    return _functions_in(path.read_text(encoding="utf-8"))


def _functions_in(source: str) -> dict[str, str]:
    """Every function of mutmut-rewritten source text by name (see `_functions`)."""
    lines = source.splitlines()  # (once: ast.get_source_segment splits the file on every call)
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and "__mutmut_" in node.name:
            end = node.end_lineno or node.lineno
            found[node.name] = "\n".join(lines[node.lineno - 1 : end])
    return found


def _diffs_in(functions: dict[str, str], names: list[str]) -> list[str]:
    """``=== name`` and the unified diff of each mutant against its original function."""
    out: list[str] = []
    for mutant in names:
        local = mutant.split(".")[-1]
        original = functions.get(local.rpartition("__mutmut_")[0] + "__mutmut_orig", "")
        changed = functions.get(local, "")
        diff = difflib.unified_diff(
            original.replace(local.rpartition("__mutmut_")[0] + "__mutmut_orig", "f").splitlines(),
            changed.replace(local, "f").splitlines(),
            lineterm="",
            n=1,
        )
        body = [line for line in diff if not line.startswith(("---", "+++"))]
        out.append(f"=== {mutant}\n" + "\n".join(body))
    return out


def _changes_in(code: str, names: list[str]) -> dict[str, str]:
    """Each mutant's change (see `_changes`), from one mutmut-rewritten file's text."""
    return _removed_and_added("\n".join(_diffs_in(_functions_in(code), names)) + "\n")


def survivor_diffs(work: Path, mutants: list[str]) -> str:
    """A unified diff per mutant: the original function against the mutant, from mutmut's files."""
    by_file: dict[Path, list[str]] = {}
    for mutant in mutants:
        parts = mutant.split(".")
        index = next(i for i, part in enumerate(parts) if part.startswith(("x_", "xǁ")))
        module = "/".join(parts[:index])
        candidates = [
            work / "mutants" / "src" / f"{module}.py",
            work / "mutants" / "src" / module / "__init__.py",
        ]
        path = next((c for c in candidates if c.exists()), candidates[0])
        by_file.setdefault(path, []).append(mutant)
    out: list[str] = []
    for path, names in sorted(by_file.items()):
        out += _diffs_in(_functions(path), names)
    return "\n".join(out) + "\n"


def summarise(work: Path, package: Package, codes: dict[str, int | None]) -> dict[str, Any]:
    """The report of a run from every mutant's exit code, the equivalents and the checks."""
    by_status: dict[str, list[str]] = {}
    for name, code in sorted(codes.items()):
        by_status.setdefault(STATUS.get(code, "suspicious"), []).append(name)
    equivalent = _equivalent(package.name)
    # Killed by a --check run of this same code (a fresh interpreter sees what mutmut's
    # forked runner cannot: code that runs at import, in a forked child, in a subprocess).
    checked = _checked(work)
    caught_statuses = ("killed", "timeout", "segfault", "caught by type check")
    by_check = sorted(
        name
        for name in checked
        if name in codes and STATUS.get(codes[name], "suspicious") not in caught_statuses
    )
    for status in list(by_status):
        if status not in caught_statuses:
            by_status[status] = [m for m in by_status[status] if m not in checked]
    survived = by_status.get("survived", [])
    holding, moved, pins = _equivalents(work, package.name, survived)
    justified = [m for m in survived if m in holding]
    open_survivors = [m for m in survived if m not in holding]
    caught = sum(
        len(by_status.get(s, [])) for s in ("killed", "timeout", "segfault", "caught by type check")
    )
    total = len(codes)
    judged = total - len(by_status.get("skipped", []))  # a mutant not checked is not caught
    score = (caught + len(by_check) + len(justified)) / judged if judged else 0.0
    return {
        "package": package.name,
        "files": list(package.paths),
        "tests": list(package.tests),
        "mutants": total,
        "killed": caught,
        "killed_by_check": len(by_check),
        "equivalent": len(justified),
        "survived": len(open_survivors),
        "no_tests": len(by_status.get("no tests", [])),
        "other": {
            s: len(v)
            for s, v in by_status.items()
            if s not in ("killed", "survived", "no tests", "timeout")
        },
        "timeouts": len(by_status.get("timeout", [])),
        "score": round(score, 4),
        "survivors": open_survivors,
        "no_test_mutants": by_status.get("no tests", []),
        "killed_by_check_mutants": {name: checked[name] for name in by_check},
        # Listed as equivalent yet gone, or caught: after a change to the code a name can
        # mean another mutant (mutmut numbers a function's mutants in order), so check each.
        "stale_equivalents": sorted(set(equivalent) - set(survived)),
        # Listed, but the name's change is not the one its reason was written for.
        "moved_equivalents": moved,
        "pins": pins,
    }


# How often a run whose stats run crashed is started again (see `_run_mutmut`).
STATS_ATTEMPTS = 10


def _stats_crashed(output: str) -> bool:
    """Whether mutmut stopped in its stats run (before any clean run or mutant)."""
    return "Running clean tests" not in output and (
        "failed to collect stats" in output or "ChildProcessError: Child exited" in output
    )


def _run_mutmut(
    command: list[str], work: Path, env: dict[str, str], name: str
) -> subprocess.CompletedProcess[str]:
    """Run mutmut in ``work``; start it again while its stats run crashes.

    mutmut 3.8's stats run (every test, each function call recorded in a context
    variable) crashes at times on the reference engine's worker threads: a
    segmentation fault in ``ContextVar.set`` or a ``LookupError`` from its reset, in
    tests that pass without it, six times in seven runs on one day. Nothing of the
    run is lost (the stats are not saved, the verdicts are mutmut's .meta files), so
    the same command is run again; a test that really fails fails every attempt.
    """
    for attempt in range(1, STATS_ATTEMPTS + 1):
        done = subprocess.run(
            command, cwd=work, env=env, capture_output=True, text=True, check=False
        )
        if done.returncode == 0 or not _stats_crashed(done.stdout + done.stderr):
            return done
        (work / f"mutmut-stats-{attempt}.log").write_text(
            done.stdout + "\n" + done.stderr, encoding="utf-8"
        )
        print(
            f"{name}: mutmut's stats run stopped (attempt {attempt} of {STATS_ATTEMPTS}, "
            f"mutmut-stats-{attempt}.log); starting it again",
            file=sys.stderr,
            flush=True,
        )
    return done


def forget_crashes(work: Path) -> int:
    """Set each crash verdict (see `STATUS`) of a run back to not checked; return how many.

    For a run whose crashes were the tests' own (found and fixed): ``--resume`` then
    runs those mutants again under mutmut, which is far cheaper than ``--check --fresh``.
    """
    count = 0
    for meta in (work / "mutants").rglob("*.meta"):
        data = json.loads(meta.read_text(encoding="utf-8"))
        codes = data["exit_code_by_key"]
        crashed = [k for k, c in codes.items() if c is not None and STATUS.get(c) == "segfault"]
        for name in crashed:
            codes[name] = None
        if crashed:
            meta.write_text(json.dumps(data, indent=4), encoding="utf-8")
            count += len(crashed)
    return count


def _saved(package: Package) -> dict[str, Any] | None:
    """A committed checkpoint of ``package``'s run, if any, refused if its tests were others."""
    path = _checkpoint_path(package.name)
    if not path.exists():
        return None
    saved: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if saved.get("selection") != _selection(package):
        raise SystemExit(
            f"{package.name}: the checkpoint {_shown(path)} was written by a run that "
            "selected other tests; its verdicts are not today's package's\n"
            f"Fix: run scripts/mutation.py {package.name} without --resume (a full run), or "
            "restore the selection in scripts/mutation.py until the run is over"
        )
    return saved


def run_package(
    package: Package,
    *,
    max_children: int,
    survivors: bool,
    reuse: bool,
    resume: bool = False,
    rerun_equivalents: bool = False,
    rerun_crashes: bool = False,
) -> dict[str, Any]:
    work = WORK / package.name
    command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children)]
    previous = work / "result.json"
    run_mutmut = True
    if resume and reuse:
        raise SystemExit(
            f"{package.name}: --resume and --reuse are two different runs\n"
            "Fix: --resume finishes an interrupted run; --reuse reruns a finished run's "
            "open mutants against the committed tests: pass one of them"
        )
    restore = None  # (a resume on a machine without the run's folder: from its checkpoint)
    if resume and not (work / "mutants").is_dir():
        restore = _saved(package)
        if restore is None:
            raise SystemExit(
                f"{package.name}: --resume needs an interrupted run in {work} or a checkpoint "
                f"in {_shown(_checkpoint_path(package.name))}\n"
                f"Fix: run scripts/mutation.py {package.name} without --resume"
            )
    if rerun_crashes and (not resume or restore is not None):
        raise SystemExit(
            f"{package.name}: --rerun-crashes goes on with a run in {work}\n"
            f"Fix: run scripts/mutation.py {package.name} --resume --rerun-crashes there "
            "(a new run checks every mutant anyway)"
        )
    if resume and restore is None:  # (the committed tests whether or not the code changed)
        _same_selection(work, package)
        _take_tests(work, package, max_children)
    if rerun_crashes:
        print(f"{package.name}: {forget_crashes(work)} crashes to run again", file=sys.stderr)
    if resume and restore is None and (changed := _changed_sources(work, package)):
        _take_changes(work, changed)
        print(
            f"{package.name}: the code changed since the run ({', '.join(changed[:3])}): "
            "the mutants of the functions that changed are checked again, the others keep "
            "their verdicts",
            file=sys.stderr,
        )
    if reuse and not previous.exists():
        raise SystemExit(
            f"{package.name}: --reuse needs a previous run in {work}\n"
            f"Fix: run scripts/mutation.py {package.name} without --reuse first"
        )
    if reuse:
        changed = _changed_sources(work, package)
        if changed:
            raise SystemExit(  # the survivors' names may no longer mean the same mutants
                f"{package.name}: the code changed since the last run ({', '.join(changed[:3])}); "
                "--reuse reruns survivors against new tests only\n"
                f"Fix: run scripts/mutation.py {package.name} --resume (the changed functions' "
                "mutants are checked again), then --reuse"
            )
        _take_tests(work, package, max_children)
        rerun = _to_rerun(work, package)
        run_mutmut = bool(rerun)  # none left: only the verdicts are read again
        command += rerun
    elif not resume or restore is not None:  # (a resumed run keeps its tree and verdicts)
        _flat_tree(work)
        with (work / "pyproject.toml").open("a", encoding="utf-8") as f:
            f.write(_settings(package, max_children))
        if restore is not None or not rerun_equivalents:
            _seed(work, package, restore)
    started = time.monotonic()
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    # (the CUDA tests' fixtures let the builds they started finish and be cached, so
    # that the next mutant finds them: tests/cupy/emulator.py BUILD_GRACE_S)
    env.setdefault("VYRE_BUILD_GRACE_S", "120")
    done = (
        _run_mutmut(command, work, env, package.name)
        if run_mutmut
        else subprocess.CompletedProcess(command, 0, "", "")
    )
    seconds = round(time.monotonic() - started, 1)
    if run_mutmut:
        (work / "mutmut.log").write_text(done.stdout + "\n" + done.stderr, encoding="utf-8")
    if done.returncode != 0:  # a failed clean run, a crash: no verdict of this run is kept
        why = (
            "a test failed in mutmut's clean run, so no mutant was checked"
            if "failed to collect stats" in done.stdout
            else f"mutmut exited with status {done.returncode}"
        )
        fix = (
            f"run scripts/mutation.py {package.name} without --reuse (the committed tests run on "
            "the last run's copy of the code, and code they test changed since)"
            if reuse
            else f"run scripts/mutation.py {package.name} without --resume (a resumed run has the "
            "committed tests and package, but the other packages' code of the day it began)"
            if resume
            else f"make `pytest {shlex.join(package.tests)}` pass at HEAD, then run it again"
        )
        raise SystemExit(f"{package.name}: {why} (see {work / 'mutmut.log'})\nFix: {fix}")
    codes = _results(work)
    kept = work / "codes.json"  # every mutant's last verdict: a --reuse run checks only some
    if reuse and kept.exists():
        for name, code in json.loads(kept.read_text(encoding="utf-8")).items():
            if codes.get(name) is None:
                codes[name] = code
    kept.write_text(json.dumps(codes, indent=0, sort_keys=True) + "\n", encoding="utf-8")
    result = summarise(work, package, codes)
    pins = result.pop("pins")
    if pins or _pins_path(package.name).exists():
        _pins_path(package.name).write_text(
            json.dumps(pins, indent=0, ensure_ascii=False) + "\n", encoding="utf-8"
        )
    seeded = work / "seeded.json"
    if seeded.exists():  # (verdicts this work folder began with, not run by it)
        result["seeded"] = json.loads(seeded.read_text(encoding="utf-8"))
    result["seconds"] = seconds
    result["mutmut_exit"] = done.returncode
    (work / "result.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    (work / "survivors.txt").write_text(
        survivor_diffs(work, result["survivors"] + result["no_test_mutants"]), encoding="utf-8"
    )
    if survivors:
        print((work / "survivors.txt").read_text(encoding="utf-8"), file=sys.stderr)
    return result


_CHECK_RUNNER = """
import contextlib, io, json, os, sys
import pytest
names, args = json.loads(sys.argv[1]), sys.argv[2:]
def run(name):
    os.environ["MUTANT_UNDER_TEST"] = name
    with contextlib.redirect_stdout(io.StringIO()):
        return int(pytest.main(["-q", "-x", "-p", "no:cacheprovider", *args]))
if run("") != 0:
    sys.exit("the tests fail without a mutant: fix them first")
verdicts = {}
for name in names:
    verdicts[name] = "killed" if run(name) != 0 else "survived"
    print(name, verdicts[name], file=sys.stderr, flush=True)
print(json.dumps(verdicts))
"""


def _fresh_runner(
    names: list[str],
    tests: list[str],
    env: dict[str, str],
    on_kill: Callable[[str], None] = lambda name: None,
    slack: float = 30.0,
) -> dict[str, str]:
    """Each mutant in an interpreter of its own: code run at import sees the mutant too.

    A mutant whose tests run past 5 times the clean run plus ``slack`` seconds is
    killed with its process group and counted killed, as mutmut counts a timeout.
    ``on_kill`` is called with each killed mutant's name as soon as it is known.
    """

    def run(name: str, timeout: float | None) -> int:
        command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
        child = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**env, "MUTANT_UNDER_TEST": name},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own group: a timeout ends whatever it started
        )
        try:
            return child.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            return -signal.SIGKILL

    started = time.monotonic()
    if run("", None) != 0:
        raise SystemExit("--check failed: the tests fail without a mutant: fix them first")
    timeout = 5 * (time.monotonic() - started) + slack
    verdicts: dict[str, str] = {}
    for name in names:
        verdicts[name] = "killed" if run(name, timeout) != 0 else "survived"
        print(name, verdicts[name], file=sys.stderr, flush=True)
        if verdicts[name] == "killed":
            on_kill(name)
    return verdicts


def check_tests(
    package: Package,
    tests: list[str],
    sample_killed: int = 0,
    only: str = "*",
    *,
    fresh: bool = False,
) -> dict[str, str]:
    """Run ``tests`` (pytest arguments, today's files) against the last run's open mutants.

    The open mutants are those not caught, not listed as equivalent and not
    killed by a recorded check, and those that crashed mutmut's forked runner
    (a segfault there may be the runner's, not a test's verdict). They run one
    after another from the rewritten copy the last run left (mutmut's
    trampolines pick the mutant named in ``MUTANT_UNDER_TEST``): in one
    process, or with ``fresh`` each in an interpreter of its own, which is
    slower but sees a mutant in code that runs at import (a table of functions
    built once). mutmut's forked runner imports
    the tests before it forks, so only such a check can catch those.

    Each kill is recorded at once in the work folder's ``checked.json`` (with
    the tests, ``git describe --dirty`` and ``PYTEST_ADDOPTS``), a one-process
    kill only after a ``fresh`` run confirmed it; the next report of the same
    code counts them as ``killed_by_check``, and a new full run starts without
    them. A ``sample_killed`` check (looking for false kills) records nothing.
    """
    work = WORK / package.name
    if not (work / "codes.json").exists():
        raise SystemExit(
            f"{package.name}: --check needs a previous run in {work}\n"
            f"Fix: run scripts/mutation.py {package.name} first"
        )
    changed = _changed_sources(work, package)
    if changed:
        raise SystemExit(
            f"{package.name}: the code changed since the last run ({', '.join(changed[:3])}); "
            "its mutants are of the old code\n"
            f"Fix: run scripts/mutation.py {package.name} first"
        )
    codes = json.loads((work / "codes.json").read_text(encoding="utf-8"))
    crashed = [n for n, c in codes.items() if STATUS.get(c) == "segfault"]
    names = sorted({*_to_rerun(work, package), *crashed})
    if sample_killed:  # instead: a fixed sample of killed ones, to look for false kills
        killed = sorted(n for n, c in codes.items() if STATUS.get(c) == "killed")
        killed = [name for name in killed if fnmatch.fnmatchcase(name, only)]
        names = sorted(random.Random(28).sample(killed, min(sample_killed, len(killed))))
    matching = [name for name in names if fnmatch.fnmatchcase(name, only)]
    if names and not matching:
        raise SystemExit(
            f"{package.name}: --only {only!r} matches none of the {len(names)} mutants to check\n"
            "Fix: match the names mutmut gives, e.g. 'vyre_async.ir.wire.*' "
            "(see build/mutation/PACKAGE/survivors.txt)"
        )
    names = matching
    # The rewritten copy's modules are large (the corpus's is 25 MB): with
    # PYTHONDONTWRITEBYTECODE set, every fresh interpreter would compile them again (15 s
    # for the corpus), and pytest would rewrite the asserts of the plugin's package again
    # (45 s). compileall writes the bytecode whatever it says; the checks' interpreters
    # may write theirs (pytest's rewritten modules are cached on the first run).
    compileall.compile_dir(work / "mutants" / "src", quiet=1, workers=0)
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
        "PYTHONPATH": str(work / "mutants" / "src"),
        # no deadlines on the slower rewritten copy: a deadline error is no kill
        "VYRE_HYPOTHESIS_PROFILE": "mutation",
        "VYRE_BUILD_GRACE_S": os.environ.get("VYRE_BUILD_GRACE_S", "120"),  # (see run_package)
    }
    described = subprocess.run(
        ["git", "describe", "--always", "--dirty"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    entry = {
        "tests": list(tests),
        "fresh": True,
        "commit": described,  # (-dirty: today's test files were not all committed)
        "pytest_addopts": os.environ.get("PYTEST_ADDOPTS", ""),
    }

    def record(name: str) -> None:
        if not sample_killed:
            _record(work, name, entry)

    if fresh:
        return _fresh_runner(names, tests, env, record)
    done = subprocess.run(
        [sys.executable, "-c", _CHECK_RUNNER, json.dumps(names), *tests],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{package.name}: --check failed (exit status {done.returncode})")
    verdicts: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    killed = [name for name, verdict in verdicts.items() if verdict == "killed"]
    if killed and not sample_killed:
        # Confirmed each in an interpreter of its own before it counts (see _checked).
        confirmed = _fresh_runner(killed, tests, env, record)
        for name, verdict in confirmed.items():
            verdicts[name] = verdict if verdict == "killed" else "killed in one process only"
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("packages", nargs="*", help="packages to mutate (default: all)")
    parser.add_argument("--list", action="store_true", help="print the packages and their tests")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    parser.add_argument(
        "--survivors",
        action="store_true",
        help="also print each survivor's diff on stderr (always written to survivors.txt)",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="rerun the last run's mutants not caught and not equivalent, against the committed "
        "tests",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="finish an interrupted run; after a change to the code, the changed functions' "
        "mutants are run again and the others keep their verdicts (with the committed tests)",
    )
    parser.add_argument(
        "--rerun-equivalents",
        action="store_true",
        help="a new run also runs the listed equivalents whose change is the one pinned "
        "(by default they start as survived and are not run again)",
    )
    parser.add_argument(
        "--rerun-crashes",
        action="store_true",
        help="with --resume: run again the mutants whose tests crashed mutmut's runner "
        "(after a fix to what crashed)",
    )
    parser.add_argument(
        "--checkpoint",
        action="store_true",
        help="save the packages' runs so far (their verdicts) to scripts/mutation_checkpoints/, "
        "to commit: --resume goes on from it where build/mutation is gone",
    )
    parser.add_argument(
        "--check",
        nargs="+",
        metavar="PYTEST_ARG",
        help="run these tests against one package's open mutants (triage); kills are recorded",
    )
    parser.add_argument(
        "--sample-killed",
        type=int,
        default=0,
        metavar="N",
        help="with --check: rerun a fixed sample of N killed mutants instead (false kills)",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="with --check: each mutant in an interpreter of its own (code run at import)",
    )
    parser.add_argument(
        "--only",
        default="*",
        metavar="GLOB",
        help="with --check: only the mutants whose names match, e.g. 'vyre_async.ir.wire.*'",
    )
    args = parser.parse_args(argv)
    if not args.check and (args.only != "*" or args.sample_killed or args.fresh):
        print(
            "--only, --fresh and --sample-killed go with --check\nFix: add --check TESTS",
            file=sys.stderr,
        )
        return 2
    if args.check:
        if len(args.packages) != 1 or args.packages[0] not in PACKAGES:
            print(
                f"--check takes one package\nFix: choose from {', '.join(PACKAGES)}",
                file=sys.stderr,
            )
            return 2
        verdicts = check_tests(
            PACKAGES[args.packages[0]], args.check, args.sample_killed, args.only, fresh=args.fresh
        )
        killed = sum(v == "killed" for v in verdicts.values())
        print(json.dumps({"killed": killed, "open": len(verdicts), "verdicts": verdicts}))
        return 0
    if args.list:
        for p in PACKAGES.values():
            print(
                f"{p.name:10} {' '.join(p.paths)}  <- {shlex.join(p.tests)}"
                + (f"  ({p.note})" if p.note else "")
            )
        return 0
    unknown = [n for n in args.packages if n not in PACKAGES]
    if unknown:
        print(
            f"unknown package(s): {', '.join(unknown)}\nFix: choose from {', '.join(PACKAGES)}",
            file=sys.stderr,
        )
        return 2
    if args.checkpoint:
        for name in args.packages or list(PACKAGES):
            if not (WORK / name / "mutants").is_dir():
                print(
                    f"{name}: no run in {WORK / name} to save\n"
                    f"Fix: run scripts/mutation.py {name} first",
                    file=sys.stderr,
                )
                return 2
            state = checkpoint(WORK / name, PACKAGES[name])
            print(json.dumps({k: state[k] for k in ("package", "mutants", "verdicts", "commit")}))
        return 0
    ok = True
    for name in args.packages or list(PACKAGES):
        result = run_package(
            PACKAGES[name],
            max_children=args.max_children,
            survivors=args.survivors,
            reuse=args.reuse,
            resume=args.resume,
            rerun_equivalents=args.rerun_equivalents,
            rerun_crashes=args.rerun_crashes,
        )
        print(
            json.dumps(
                {
                    k: v
                    for k, v in result.items()
                    if k not in ("survivors", "no_test_mutants", "killed_by_check_mutants")
                }
            )
        )
        ok = ok and result["score"] >= 0.9
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
