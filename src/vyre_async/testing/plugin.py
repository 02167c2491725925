"""The pytest plugin of `vyre_async.testing`: ``--vyre-backend`` and the ``vyre_backend`` fixture.

Loaded in every pytest session of an environment where vyre-async is installed
(entry point ``pytest11``; ``-p no:vyre_async`` turns it off), so it stays out
of other projects' way: it imports nothing of vyre-async until a test asks
for it, and it parametrises only tests marked ``vyre_contract`` (the shipped
suite) that ask for ``vyre_backend`` and are not parametrised on it already.
Without ``--vyre-backend`` those tests run on every registered dispatching
backend, skipping (with the reason) any that cannot start on this machine; a
backend named with ``--vyre-backend`` that cannot start fails instead.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from vyre_async._exports import public_dir as _public_dir

__all__ = ["pytest_addoption", "pytest_configure", "pytest_generate_tests", "vyre_backend"]
__dir__ = _public_dir(__name__)

_CHOSEN = pytest.StashKey[tuple[list[str], bool]]()
MARKER = "vyre_contract"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vyre-async", "vyre-async backend contract suite")
    group.addoption(
        "--vyre-backend",
        action="append",
        default=[],
        metavar="ID",
        help="run the vyre_async.testing contract suite against this backend: a registered "
        "id, or package.module:NAME of a BackendRegistration to register first "
        "(repeatable; default: every registered backend that dispatches)",
    )


def _register(spec: str) -> str:
    from vyre_async._registry import BackendRegistration, register_backend

    module_name, _, attribute = spec.partition(":")
    try:
        registration = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise pytest.UsageError(
            f"--vyre-backend {spec!r}: cannot import {attribute!r} from {module_name!r} ({exc})\n"
            "Fix: put the package on the path (pip install -e . or PYTHONPATH) and name a "
            "BackendRegistration, e.g. --vyre-backend=mypkg.registration:REGISTRATION"
        ) from exc
    if not isinstance(registration, BackendRegistration):
        raise pytest.UsageError(
            f"--vyre-backend {spec!r} names a {type(registration).__name__}, not a "
            "BackendRegistration\nFix: point it at BackendRegistration(id=..., factory=...)"
        )
    register_backend(registration, replace=True)
    return registration.id


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}: a vyre-async contract test, run per backend (--vyre-backend)"
    )
    chosen: list[str] = list(config.getoption("vyre_backend") or [])
    ids = [_register(spec) if ":" in spec else spec for spec in chosen]
    config.stash[_CHOSEN] = (ids, bool(ids))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if (
        "vyre_backend" not in metafunc.fixturenames
        or metafunc.definition.get_closest_marker(MARKER) is None
        or hasattr(metafunc.module, "vyre_backend")  # a module of its own: that fixture
        or any(
            "vyre_backend" in str(marker.args[0] if marker.args else "")
            for marker in metafunc.definition.iter_markers("parametrize")
        )
    ):
        return
    ids, explicit = metafunc.config.stash.get(_CHOSEN, ([], False))
    if not explicit:
        from vyre_async._registry import registered_backends

        ids = [r.id for r in registered_backends() if r.dispatches]
    metafunc.parametrize("vyre_backend", ids, indirect=True, ids=ids)


@pytest.fixture
def vyre_backend(request: pytest.FixtureRequest) -> Any:
    """The backend under test (`acquire_backend` of the id the test is parametrised with)."""
    from vyre_async._registry import acquire_backend
    from vyre_async.errors import BackendError

    backend_id = str(request.param)
    try:
        return acquire_backend(backend_id)
    except BackendError as exc:
        _, explicit = request.config.stash.get(_CHOSEN, ([], False))
        if explicit:
            pytest.fail(f"backend {backend_id!r} named by --vyre-backend cannot start: {exc}")
        pytest.skip(f"backend {backend_id!r} cannot start here: {exc}")
