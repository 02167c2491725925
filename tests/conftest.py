"""Shared pytest configuration: async tests run on asyncio and on trio; caches stay
private; undefined behaviour in kernels the fake CUDA device ran fails the test; the
``ray`` backend runs on one local cluster of two workers, ended with the session (and
by an orphan guard if pytest itself is killed)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

from tests import orphan_guard, ray_cluster
from tests.otlp_receiver import receiver  # noqa: F401 - an in-test OTLP receiver fixture

pytest.register_assert_rewrite("tests.ray.fake_ray")  # (its helpers assert; tests import it)

# Property tests run the same examples on every run ("ci", the default): a bug a
# test can find is found every time, never by luck. "explore" draws new examples
# each run, to look for bugs nobody has a case for yet (make explore); each one
# it finds becomes an @example or a test of its own. "mutation" is "ci" without
# deadlines or shrinking, for mutmut's forked runs (scripts/mutation.py).
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile(
    "explore", derandomize=False, max_examples=1000, print_blob=True, deadline=None
)
settings.register_profile(
    "mutation",
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    # a failing example kills the mutant: shrinking it (minutes on a rewritten copy) adds nothing
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
settings.load_profile(os.environ.get("VYRE_HYPOTHESIS_PROFILE", "ci"))

# mutmut's rewrite calls every function through a trampoline (three frames for
# one), so the IR tests that nest to the validator's depth limit overflow
# Python's default recursion limit on a rewritten copy only.
if "MUTANT_UNDER_TEST" in os.environ:
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))
    # mutmut puts its rewritten copy first on sys.path only: the processes a test
    # starts (Ray's workers, subprocesses) would import the original package, on
    # which a rewritten class pickled by reference (the Ray pool's Worker, with its
    # mutant table) cannot load. They import the copy's src/ too, as under --check.
    _spec = importlib.util.find_spec("vyre_async")
    if _spec is not None and _spec.origin is not None:
        _copy = str(Path(_spec.origin).parents[1])  # the copy's src/ (every package flat in it)
        _paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if _copy not in _paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([_copy, *_paths])

if importlib.util.find_spec("ray") is not None and not os.environ.get("RAY_ADDRESS"):
    # acquire_backend("ray") (the contract tests) starts one local cluster on first use.
    os.environ.setdefault("VYRE_RAY_LOCAL_WORKERS", "2")


@pytest.fixture(scope="session", autouse=True)
def _session_processes_end(request: pytest.FixtureRequest) -> Iterator[None]:
    """End the session's Ray cluster and every process of it, also after failures.

    An orphan guard (`tests.orphan_guard`) also ends them, and any other process
    the session left, at the end or if pytest itself is killed. It is started
    with output capture off, so what it reports reaches the real stderr.
    """
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        guard = orphan_guard.start()
    try:
        yield
        ray = sys.modules.get("ray")
        ray_was_up = ray is not None and ray.is_initialized()
        ray_cluster.end_cluster()
        if ray_was_up:
            # The registry's Ray pool (if it built one) died with the cluster: a later session
            # in this process (scripts/mutation.py --check runs one per mutant) builds its own.
            # Only that one: the others still run, and dropped unclosed they would leak threads.
            from vyre_async import _registry as registry

            with registry._lock:
                registry._instances.pop("ray", None)
    finally:
        orphan_guard.stop(guard)


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A registry of the test's own: no entry points, no local registrations, no instances.

    Backends a test registers or builds are gone after it, and the installed
    ones (the reference, Ray) do not show up in what it lists or acquires.
    """
    from vyre_async import _registry as registry

    monkeypatch.setattr(registry, "entry_points", lambda *, group: [])
    monkeypatch.setattr(registry, "_local", {})
    registry._forget_instances()
    yield
    registry._forget_instances()


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session", autouse=True)
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Point the pipeline and calibration caches at a fresh folder for the whole run.

    Without it, backends built with their default disk cache (registry, contract
    tests, the CLI) read and wrote the user's ``~/.cache/vyre-async``: kernels a
    test compiled leaked into real use, and kernels from an older checkout could
    be loaded by a test.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VYRE_CACHE_DIR", str(tmp_path_factory.mktemp("vyre-cache")))
        yield


def _fail_on_undefined_behaviour() -> None:
    """Fail the running test phase with the UBSan reports of fake CUDA devices, if any."""
    fake = sys.modules.get("tests.cupy.fake_cupy")
    if fake is not None:  # a fake device may have run kernels in this process
        fake.fail_on_sanitizer_reports()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    try:
        return (yield)
    finally:
        _fail_on_undefined_behaviour()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    try:
        return (yield)
    finally:
        _fail_on_undefined_behaviour()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    try:
        return (yield)
    finally:
        _fail_on_undefined_behaviour()
