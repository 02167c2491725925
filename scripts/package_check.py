"""Build vyre-async as users get it and check what they get: ``make package-check``.

Steps, each printed with its time; the first failure stops the run (exit 1)
with what went wrong:

1. ``python -m build``: the sdist, then the wheel built *from the sdist*;
   and a second wheel built straight from the tree, which must hold the same files.
2. The contents: ``check-wheel-contents`` on the wheel, then `wheel_problems`
   (the four top-level packages and nothing else, ``py.typed`` in each, every
   entry point's module present, the version) and `sdist_problems`.
3. A fresh virtual environment, outside the repository, with the wheel
   installed by pip (its dependencies from the index) plus pytest, trio and
   Sybil; the working directory is a temporary folder and ``PYTHONPATH`` is
   unset, so nothing can come from ``src/``. There: ``import vyre_async``
   resolves into the venv, ``vyre-async info`` lists ``reference`` as usable,
   ``vyre-async demo`` passes, every Python block of README.md runs (Sybil,
   with the repository's ``conftest.py``), and the shipped contract suite
   passes through its pytest plugin (``--pyargs vyre_async.testing
   --vyre-backend=reference``).
4. The GPU machine's route: ``pip install --no-deps --target DIR`` of the
   wheel; ``vyre_async``, ``vyre_reference`` and ``vyre_cupy`` import from
   DIR, and ``scripts/gpu-check`` (run with DIR on ``PYTHONPATH``) gets as far
   as its device probe and reports "no GPU" there cleanly.

Usage::

    python scripts/package_check.py                    # everything (a few minutes)
    python scripts/package_check.py --wheel-only PATH  # step 2's layout checks on a wheel
"""

from __future__ import annotations

import argparse
import ast
import configparser
import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import venv
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The top-level packages a wheel must hold, and nothing else beside its .dist-info.
PACKAGES = ("vyre_async", "vyre_reference", "vyre_cupy", "vyre_ray", "vyre_wgpu")
#: Runtime dependencies the wheel must declare.
REQUIRES = ("anyio", "numpy", "blake3", "opentelemetry-api")
#: Packages of the dev environment that the GPU machine's image does not have.
GPU_IMAGE_LACKS = ("sybil", "opentelemetry.proto", "ray", "starlette", "uvicorn", "httpx")


class CheckFailed(Exception):
    """A step found a problem (the message says which and what was seen)."""


def _module_file(names: set[str], module: str) -> bool:
    path = module.replace(".", "/")
    return f"{path}.py" in names or f"{path}/__init__.py" in names


def _unreadable(path: Path, kind: str) -> str | None:
    """Why ``path`` cannot be opened as a ``kind`` (None: it is a file)."""
    if not path.exists():
        return (
            f"{path}: no such file. Fix: pass the path of a built {kind} "
            "(`python -m build` writes the sdist and the wheel under dist/)"
        )
    if not path.is_file():
        return f"{path} is not a file. Fix: pass the path of a built {kind}, not a folder"
    return None


def wheel_problems(wheel: Path) -> list[str]:
    """Every problem of the wheel's layout and metadata (empty: the wheel is right)."""
    unreadable = _unreadable(wheel, "wheel")
    if unreadable:
        return [unreadable]
    try:
        with zipfile.ZipFile(wheel) as archive:
            return _archive_problems(archive)
    except zipfile.BadZipFile as exc:
        return [
            f"{wheel} is not a wheel: not a zip archive ({exc}). Fix: rebuild it with "
            "`python -m build --wheel`"
        ]


def _archive_problems(archive: zipfile.ZipFile) -> list[str]:
    """`wheel_problems` of an opened wheel."""
    problems: list[str] = []
    names = set(archive.namelist())
    dist_infos = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
    if len(dist_infos) != 1:
        return [f"expected one .dist-info folder, found {sorted(dist_infos)}"]
    (dist_info,) = dist_infos
    top = {n.split("/")[0] for n in names} - {dist_info}
    missing = sorted(set(PACKAGES) - top)
    extra = sorted(top - set(PACKAGES))
    if missing:
        problems.append(f"top-level packages missing: {missing} (found {sorted(top)})")
    if extra:
        problems.append(
            f"unexpected top-level entries {extra}: only {list(PACKAGES)} belong at the "
            "wheel's root (a package under a folder such as backends/ cannot be imported)"
        )
    for package in PACKAGES:
        if package in top:
            for required in ("__init__.py", "py.typed"):
                if f"{package}/{required}" not in names:
                    problems.append(f"{package}/{required} is missing")
    entry_points = configparser.ConfigParser(delimiters=("=",))
    entry_points.optionxform = str  # type: ignore[assignment,method-assign]
    text = f"{dist_info}/entry_points.txt"
    if text not in names:
        problems.append("entry_points.txt is missing")
    else:
        entry_points.read_string(archive.read(text).decode())
        for group in ("vyre_async.backends", "pytest11", "console_scripts"):
            if not entry_points.has_section(group):
                problems.append(f"entry point group [{group}] is missing")
                continue
            for name, target in entry_points.items(group):
                module = target.split(":")[0].strip()
                if not _module_file(names, module):
                    problems.append(
                        f"entry point {group}:{name} = {target.strip()} names module "
                        f"{module!r}, which the wheel lacks"
                    )
        backends = (
            set(dict(entry_points.items("vyre_async.backends")))
            if entry_points.has_section("vyre_async.backends")
            else set()
        )
        if backends != {"reference", "cupy", "ray", "wgpu"}:
            problems.append(
                f"backend entry points {sorted(backends)}, expected cupy, ray, reference, wgpu"
            )
    if f"{dist_info}/METADATA" not in names:
        problems.append(
            f"{dist_info}/METADATA is missing: pip cannot install the wheel. Fix: build it "
            "with `python -m build --wheel` (the build backend writes METADATA)"
        )
        return problems
    metadata = email.parser.Parser().parsestr(archive.read(f"{dist_info}/METADATA").decode())
    declared: set[str] = set()
    for line in metadata.get_all("Requires-Dist") or []:
        if "extra ==" not in line:  # a dependency of an extra is not a dependency
            match = re.match(r"[A-Za-z0-9_.-]+", line)
            if match:
                declared.add(match[0].lower().replace("_", "-"))
    problems += [
        f"Requires-Dist lacks {r} (outside any extra)" for r in REQUIRES if r not in declared
    ]
    version_file = "vyre_async/_version.py"
    if version_file in names:
        tree = ast.parse(archive.read(version_file).decode())
        literal = next(
            (
                node.value.value
                for node in tree.body
                if isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Constant)
                and any(getattr(t, "id", None) == "__version__" for t in node.targets)
            ),
            None,
        )
        if literal != metadata["Version"]:
            problems.append(
                f"vyre_async.__version__ is {literal!r} but the metadata says "
                f"{metadata['Version']!r}"
            )
    return problems


def sdist_problems(sdist: Path) -> list[str]:
    """Every file the sdist lacks to rebuild the wheel and run the tests."""
    unreadable = _unreadable(sdist, "sdist")
    if unreadable:
        return [unreadable]
    try:
        with tarfile.open(sdist) as archive:
            names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    except tarfile.TarError as exc:
        return [
            f"{sdist} is not an sdist: not a tar archive ({exc}). Fix: rebuild it with "
            "`python -m build --sdist`"
        ]
    required = [
        "PKG-INFO",
        "pyproject.toml",
        "README.md",
        "src/vyre_async/__init__.py",
        "src/vyre_async/py.typed",
        *(f"src/backends/{p}/__init__.py" for p in PACKAGES[1:]),
        "tests/conftest.py",
    ]
    return [f"the sdist lacks {name}" for name in required if name not in names]


def _run(
    command: Sequence[str | Path],
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float,
    expect_rc: int = 0,
) -> str:
    """Run ``command``; return its output; raise `CheckFailed` with its tail unless it
    exits ``expect_rc``."""
    done = subprocess.run(
        [str(c) for c in command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = done.stdout + done.stderr
    if done.returncode != expect_rc:
        expected = f" (expected {expect_rc})" if expect_rc else ""
        raise CheckFailed(
            f"`{' '.join(str(c) for c in command)}` exited {done.returncode}{expected}:\n"
            f"{output[-4000:]}"
        )
    return output


def _imported_from(
    python: Path, modules: Sequence[str], prefix: Path, *, cwd: Path, env: dict[str, str]
) -> list[str]:
    """Import ``modules`` with ``python``; return their files; raise `CheckFailed` unless
    every one lies under ``prefix`` (and none in the repository)."""
    code = (
        f"import importlib, json; print(json.dumps([importlib.import_module(m).__file__ "
        f"for m in {list(modules)!r}]))"
    )
    where = _run([python, "-c", code], cwd=cwd, env=env, timeout=120)
    files: list[str] = json.loads(where.strip().splitlines()[-1])
    if any(Path(f).is_relative_to(ROOT) or not Path(f).is_relative_to(prefix) for f in files):
        raise CheckFailed(f"{', '.join(modules)} were imported from {files}, not from {prefix}")
    return files


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment for the installed-package checks: no PYTHONPATH, no stray venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(extra)
    return env


class Checker:
    """Runs the steps in order, printing each with its time."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.passed: list[tuple[str, float]] = []

    def step(self, name: str, action: Callable[[], str | None]) -> None:
        started = time.perf_counter()
        print(f"package-check: {name} ...", flush=True)
        note = action()
        seconds = time.perf_counter() - started
        self.passed.append((name, seconds))
        print(
            f"package-check: {name}: ok ({seconds:.1f} s){f' - {note}' if note else ''}", flush=True
        )

    # 1. Build --------------------------------------------------------------------
    def build(self) -> None:
        dist, direct = self.work / "dist", self.work / "direct"
        python = sys.executable

        def from_sdist() -> str:
            _run([python, "-m", "build", "--outdir", dist, ROOT], cwd=ROOT, timeout=600)
            self.sdist = _one(dist, "*.tar.gz")
            self.wheel = _one(dist, "*.whl")
            return f"{self.sdist.name}, {self.wheel.name} (built from the sdist)"

        def from_tree() -> str:
            _run(
                [python, "-m", "build", "--wheel", "--outdir", direct, ROOT], cwd=ROOT, timeout=600
            )
            ours, theirs = _names(self.wheel), _names(_one(direct, "*.whl"))
            if ours != theirs:
                raise CheckFailed(
                    "the wheel built from the sdist and the one built from the tree differ:\n"
                    f"only from the sdist: {sorted(ours - theirs)}\n"
                    f"only from the tree: {sorted(theirs - ours)}"
                )
            return f"same {len(ours)} files as the wheel built from the sdist"

        self.step("build the sdist and the wheel from it", from_sdist)
        self.step("build a wheel from the tree and compare", from_tree)

    # 2. Contents -----------------------------------------------------------------
    def contents(self) -> None:
        def checker() -> str:
            tool = Path(sys.executable).with_name("check-wheel-contents")
            # --toplevel: exactly these four packages at the root (instead of W009's "one").
            _run([tool, "--toplevel", ",".join(PACKAGES), self.wheel], cwd=self.work, timeout=120)
            return "check-wheel-contents: no problems"

        def layout() -> str:
            problems = wheel_problems(self.wheel) + sdist_problems(self.sdist)
            if problems:
                raise CheckFailed("\n".join(problems))
            return f"{', '.join(PACKAGES)} at the root, py.typed, entry points, version"

        self.step("check-wheel-contents", checker)
        self.step("wheel and sdist layout", layout)

    # 3. A fresh venv -------------------------------------------------------------
    def installed(self) -> None:
        env_dir, run = self.work / "venv", self.work / "run"
        docs = self.work / "docs"
        for folder in (run, docs):
            folder.mkdir()
        bin_dir = env_dir / "bin"
        python = bin_dir / "python"
        env = _clean_env(VYRE_CACHE_DIR=str(self.work / "cache"))

        def install() -> str:
            venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
            # (hypothesis and the SDK: the GPU route below collects tests/cupy, which uses
            # them; the GPU machine has hypothesis, and the SDK from ../shared/tools/gpu-wheels)
            tools = ["pytest", "trio", "sybil", "hypothesis", "opentelemetry-sdk"]
            _run(
                [python, "-m", "pip", "install", "-q", self.wheel, *tools],
                cwd=run,
                env=env,
                timeout=900,
            )
            files = _imported_from(
                python, ["vyre_async", "vyre_reference"], env_dir, cwd=run, env=env
            )
            return f"imports from {Path(files[0]).parent}"

        def info() -> str:
            out = _run([bin_dir / "vyre-async", "info"], cwd=run, env=env, timeout=120)
            line = next((x for x in out.splitlines() if x.strip().startswith("reference")), "")
            if "usable" not in line.split():
                raise CheckFailed(f"`vyre-async info` does not list reference as usable:\n{out}")
            return line.strip()

        def demo() -> str:
            out = _run([bin_dir / "vyre-async", "demo"], cwd=run, env=env, timeout=300)
            return next((x.strip() for x in out.splitlines() if x.startswith("outputs:")), "")

        def readme() -> str:
            shutil.copy(ROOT / "README.md", docs / "README.md")
            shutil.copy(ROOT / "conftest.py", docs / "conftest.py")
            out = _run(
                [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "README.md"],
                cwd=docs,
                env=env,
                timeout=300,
            )
            return out.strip().splitlines()[-1]

        def contract() -> str:
            out = _run(
                [
                    python,
                    "-m",
                    "pytest",
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    "--pyargs",
                    "vyre_async.testing",
                    "--vyre-backend=reference",
                ],
                cwd=run,
                env=env,
                timeout=900,
            )
            summary = out.strip().splitlines()[-1]
            if " passed" not in summary or "failed" in summary or "error" in summary:
                raise CheckFailed(f"the contract suite did not pass:\n{out[-3000:]}")
            return summary

        self.step("install the wheel in a fresh venv (outside the repository)", install)
        self.step("vyre-async info", info)
        self.step("vyre-async demo", demo)
        self.step("README.md's Python blocks (Sybil), on the installed package", readme)
        self.step("the shipped contract suite on reference, through its pytest plugin", contract)
        self.python = python
        self.env = env

    # 4. The GPU machine's route --------------------------------------------------
    def gpu_route(self) -> None:
        target, out = self.work / "site", self.work / "gpu-check"
        env = dict(self.env, PYTHONPATH=str(target), OUT=str(out))

        def target_install() -> str:
            _run(
                [
                    self.python,
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--no-index",
                    "--no-deps",
                    "--no-compile",
                    "--target",
                    target,
                    self.wheel,
                ],
                cwd=self.work,
                env=self.env,
                timeout=300,
            )
            modules = ["vyre_async", "vyre_reference", "vyre_cupy"]
            _imported_from(self.python, modules, target, cwd=self.work, env=env)
            return f"{', '.join(modules)} import from {target}"

        def gpu_check() -> str:
            # Without a GPU, gpu-check records its failed probe and exits 1.
            output = _run(
                [self.python, ROOT / "scripts" / "gpu-check"],
                cwd=ROOT,
                env=env,
                timeout=300,
                expect_rc=1,
            )
            report_file = out / "gpu-check.json"
            if not report_file.exists():
                raise CheckFailed(f"scripts/gpu-check wrote no report:\n{output[-3000:]}")
            report = json.loads(report_file.read_text())
            steps = report.get("steps", {})
            if "Traceback" in output or list(steps) != ["probe"]:
                raise CheckFailed(
                    "scripts/gpu-check should stop at its device probe with 'no GPU' "
                    f"(exit 1, one step 'probe'); it left steps {list(steps)}:\n"
                    f"{output[-3000:]}"
                )
            if report.get("imported_from_src") or str(target) not in report.get(
                "vyre_async_from", ""
            ):
                raise CheckFailed(
                    f"gpu-check imported vyre-async from {report.get('vyre_async_from')}"
                )
            if "cupy" not in report.get("registered_backends", []):
                raise CheckFailed("gpu-check found no 'cupy' backend entry point")
            return f"stopped at the probe: {steps['probe'].get('error')}"

        def collect() -> str:
            # gpu-check's pytest steps as the GPU image would collect them: the wheel from
            # DIR, and none of the packages that image lacks (Sybil, opentelemetry-proto).
            counts = []
            for args in (["-m", "gpu", "tests/cupy"], ["tests/contract", "-k", "cupy"]):
                code = (
                    "import sys\n"
                    f"for name in {GPU_IMAGE_LACKS!r}: sys.modules[name] = None\n"
                    "import pytest\n"
                    "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '--collect-only', "
                    f"*{args!r}]))"
                )
                out = _run([self.python, "-c", code], cwd=ROOT, env=env, timeout=300)
                counts.append(f"{' '.join(args)}: {out.strip().splitlines()[-1]}")
            return "; ".join(counts)

        self.step("pip install --no-deps --target DIR (the GPU machine's route)", target_install)
        self.step("gpu-check's pytest steps collect without what the GPU image lacks", collect)
        self.step("scripts/gpu-check up to its device probe", gpu_check)


def _one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    if len(found) != 1:
        raise CheckFailed(f"expected one {pattern} in {folder}, found {[p.name for p in found]}")
    return found[0]


def _names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {n for n in archive.namelist() if not n.endswith("/RECORD")}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel-only", metavar="WHEEL", help="only check this wheel's layout")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args(argv)
    if args.wheel_only:
        problems = wheel_problems(Path(args.wheel_only))
        for problem in problems:
            print(f"package-check: {problem}", file=sys.stderr)
        print(f"package-check: {args.wheel_only}: {'FAILED' if problems else 'ok'}")
        return 1 if problems else 0
    work = Path(tempfile.mkdtemp(prefix="vyre-package-check-"))
    checker = Checker(work)
    started = time.perf_counter()
    try:
        checker.build()
        checker.contents()
        checker.installed()
        checker.gpu_route()
    except (CheckFailed, subprocess.TimeoutExpired) as exc:
        print(f"package-check: FAILED: {exc}", file=sys.stderr)
        print(f"package-check: the work folder is kept: {work}", file=sys.stderr)
        return 1
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"package-check: all {len(checker.passed)} steps passed in "
        f"{time.perf_counter() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
