"""The registry as users and backend authors see it, to the letter (issue 28, registry triage).

mutmut's run on ``vyre_async/_registry.py`` left mutants no test noticed: Fix
texts replaced or dropped, messages changed, log lines on the wrong logger or
with the wrong values, attributes (``backend_id``, ``failures``) lost, a
duplicate entry point that hid every later one. Each table below pins one
function's observable output exactly: the message, its ``Fix:``, the
exception's attributes, the log records of ``vyre_async._registry``, the
`BackendProbe` verdicts `vyre-async info` prints. The mutants no test can
tell apart are listed with their reasons in
``scripts/mutation_equivalent/registry.toml``.
"""

from __future__ import annotations

import logging
import math
import os
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from tests.driver.fakes import BytesBackend
from vyre_async import BackendNotFound, InvalidProgram, UnsupportedFeature
from vyre_async import _registry as registry
from vyre_async._capabilities import BackendCapabilities
from vyre_async._registry import (
    BackendProbe,
    BackendRegistration,
    acquire_backend,
    acquire_preferred_backend,
    probe_backend,
    register_backend,
    registered_backends,
)

pytestmark = pytest.mark.usefixtures("isolated")

LOGGER = "vyre_async.registry"


def _parts(err: BaseException) -> tuple[str, str]:
    """An error's message and its Fix (the last line, ``Fix: ...``)."""
    message, _, fix = str(err).rpartition("\nFix: ")
    return message, fix


def _backend(backend_id: str, *, gpu: bool = False) -> type[BytesBackend]:
    """A fake backend class with its own id (``gpu``: capabilities that rank higher)."""

    def capabilities(self: BytesBackend) -> BackendCapabilities:
        return BackendCapabilities(
            async_compute=True, max_storage_buffer_bytes=1 << 30, max_workgroup_lanes=1024
        )

    body: dict[str, Any] = {"id": backend_id}
    if gpu:
        body["capabilities"] = capabilities
    return type(f"Fake_{backend_id}", (BytesBackend,), body)


def _records(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int, str]]:
    return [r for r in caplog.record_tuples if r[0] == LOGGER]


# BackendRegistration: what a backend author is told about a bad record ---------------

REFUSED_REGISTRATIONS = [
    (
        {"id": ""},
        "backend id must be a non-empty str, got ''",
        'name the backend, e.g. id="mybackend"',
    ),
    (
        {"id": 7},
        "backend id must be a non-empty str, got 7",
        'name the backend, e.g. id="mybackend"',
    ),
    (
        {"factory": "json.loads"},
        "backend 'x': factory 'json.loads' must look like 'module:callable'",
        'write the factory as "package.module:callable"',
    ),
    (
        {"factory": 42},
        "backend 'x': factory must be a 'module:callable' path or a callable, got 42",
        "pass the backend class or a function that builds it",
    ),
    (
        {"factory": None},
        "backend 'x': factory must be a 'module:callable' path or a callable, got None",
        "pass the backend class or a function that builds it",
    ),
    (
        {"precedence": math.inf},
        "backend 'x': precedence must be a finite number, got inf",
        "pass precedence=100 (lower wins among equally capable backends)",
    ),
    (
        {"precedence": -math.inf},
        "backend 'x': precedence must be a finite number, got -inf",
        "pass precedence=100 (lower wins among equally capable backends)",
    ),
    (
        {"precedence": math.nan},
        "backend 'x': precedence must be a finite number, got nan",
        "pass precedence=100 (lower wins among equally capable backends)",
    ),
    (
        {"precedence": 10**400},  # beyond a float: not finite
        f"backend 'x': precedence must be a finite number, got {10**400!r}",
        "pass precedence=100 (lower wins among equally capable backends)",
    ),
    (
        {"precedence": True},
        "backend 'x': precedence must be a finite number, got True",
        "pass precedence=100 (lower wins among equally capable backends)",
    ),
    (
        {"precedence": "10"},
        "backend 'x': precedence must be a finite number, got '10'",
        "pass precedence=100 (lower wins among equally capable backends)",
    ),
    (
        {"probe": "json.loads"},
        "backend 'x': probe must be a 'module:callable' path, a callable or None, got 'json.loads'",
        'write the probe as "package.module:callable", or leave it out',
    ),
    (
        {"probe": 3},
        "backend 'x': probe must be a 'module:callable' path, a callable or None, got 3",
        'write the probe as "package.module:callable", or leave it out',
    ),
]


@pytest.mark.parametrize(("fields", "message", "fix"), REFUSED_REGISTRATIONS)
def test_refused_registrations_say_what_and_how_to_fix(
    fields: dict[str, Any], message: str, fix: str
) -> None:
    with pytest.raises(InvalidProgram) as info:
        BackendRegistration(**{"id": "x", "factory": "json:loads", **fields})
    assert _parts(info.value) == (message, fix)


# (precedence given, precedence kept): any finite real number, kept as a plain int or float
ACCEPTED_PRECEDENCES = [
    (0, 0),
    (-1, -1),
    (2.5, 2.5),
    (3.0, 3),
    (np.int64(7), 7),
    (np.float64(0.25), 0.25),
    (Fraction(9, 1), 9),
]


@pytest.mark.parametrize(("given", "kept"), ACCEPTED_PRECEDENCES)
def test_finite_precedences_are_kept_as_plain_numbers(given: object, kept: float) -> None:
    registration = BackendRegistration(id="x", factory="json:loads", precedence=given)  # type: ignore[arg-type]
    assert registration.precedence == kept
    assert type(registration.precedence) is type(kept)


def _probe_ok() -> None:
    """A probe that finds everything in place."""


def test_a_probe_path_is_accepted_and_called() -> None:
    registration = BackendRegistration(
        id="x", factory="json:loads", probe="tests.test_registry_mutants:_probe_ok"
    )
    assert registration.probe == "tests.test_registry_mutants:_probe_ok"
    assert probe_backend(registration) == BackendProbe(id="x", usable=True)


# Factory paths ------------------------------------------------------------------------


def test_a_factory_path_follows_dotted_attributes() -> None:
    found: object = BackendRegistration(id="x", factory="os:path.join").load_factory()
    assert found is os.path.join


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("json:__doc__", "backend 'x': 'json:__doc__' is not callable"),
        ("os:path.sep", "backend 'x': 'os:path.sep' is not callable"),
    ],
)
def test_a_factory_path_to_a_non_callable_names_the_backend(factory: str, message: str) -> None:
    with pytest.raises(TypeError) as info:
        BackendRegistration(id="x", factory=factory).load_factory()
    assert str(info.value) == message


# register_backend ---------------------------------------------------------------------


@pytest.mark.parametrize("value", ["cupy", None, {"id": "cupy"}])
def test_register_backend_refuses_what_is_not_a_registration(value: object) -> None:
    with pytest.raises(InvalidProgram) as info:
        register_backend(value)  # type: ignore[arg-type]
    assert _parts(info.value) == (
        f"register_backend expects a BackendRegistration, got {value!r}",
        'pass BackendRegistration(id="...", factory=...)',
    )


def test_a_duplicate_id_is_refused_with_its_fix() -> None:
    register_backend(BackendRegistration(id="dup", factory=BytesBackend))
    with pytest.raises(InvalidProgram) as info:
        register_backend(BackendRegistration(id="dup", factory=BytesBackend))
    assert _parts(info.value) == (
        "backend 'dup' is already registered",
        "pass replace=True to replace it, or register under another id",
    )


def test_replacing_a_registration_ends_reuse_of_the_old_instance() -> None:
    old, new = _backend("swap"), _backend("swap")
    register_backend(BackendRegistration(id="swap", factory=old))
    first = acquire_backend("swap")
    assert type(first.executor) is old  # (an executor factory: the registry wraps it)
    register_backend(BackendRegistration(id="swap", factory=new), replace=True)
    second = acquire_backend("swap")
    assert type(second.executor) is new and second is not first
    assert acquire_backend("swap") is second


# acquire_backend ----------------------------------------------------------------------


@pytest.mark.parametrize("value", [3, None, b"reference", ["reference"]])
def test_acquire_backend_refuses_an_id_that_is_not_a_str(value: object) -> None:
    with pytest.raises(InvalidProgram) as info:
        acquire_backend(value)  # type: ignore[arg-type]
    assert _parts(info.value) == (
        f"a backend id is a str, got {value!r}",
        'pass one id, e.g. acquire_backend("reference") (vyre-async info lists them)',
    )


@pytest.mark.parametrize(
    ("installed", "listed"),
    [([], "none"), (["solo"], "solo"), (["zeta", "alpha", "mid"], "alpha, mid, zeta")],
)
def test_an_unknown_id_lists_the_installed_ids(installed: list[str], listed: str) -> None:
    for backend_id in installed:
        register_backend(BackendRegistration(id=backend_id, factory=_backend(backend_id)))
    with pytest.raises(BackendNotFound) as info:
        acquire_backend("cuda9000")
    assert _parts(info.value) == (
        f"no backend 'cuda9000' is installed (installed: {listed})",
        "install the package that provides it (e.g. vyre-async[cuda] for 'cupy') "
        "or use one of the installed ids",
    )
    assert info.value.backend_id == "cuda9000"  # type: ignore[attr-defined]


class _NoId:
    """What a broken factory might return: not a backend, no id at all."""

    def __repr__(self) -> str:
        return "<no id>"


def _broken() -> BytesBackend:
    raise RuntimeError("libcuda.so.1: cannot open shared object file")


def _refuses() -> BytesBackend:
    raise UnsupportedFeature("no CUDA device is visible", fix="check nvidia-smi")


BUILD_FAILURES = [
    (
        "broken",
        _broken,
        "backend 'broken' failed to start: RuntimeError: "
        "libcuda.so.1: cannot open shared object file",
        "check that 'broken' and its runtime are installed correctly",
    ),
    (
        "two-colons",
        "json:loads:extra",
        "backend 'two-colons' failed to start: AttributeError: "
        "module 'json' has no attribute 'loads:extra'",
        "check that 'two-colons' and its runtime are installed correctly",
    ),
    (
        "no-id",
        _NoId,
        "backend factory for 'no-id' built <no id> with another id",
        "make the registration id match the executor class id",
    ),
    (
        "mismatch",
        _backend("other"),
        "backend factory for 'mismatch' built <VyreBackend id='other' version='1.0'> "
        "with another id",
        "make the registration id match the executor class id",
    ),
]


@pytest.mark.parametrize(("backend_id", "factory", "message", "fix"), BUILD_FAILURES)
def test_a_backend_that_cannot_be_built_says_why(
    backend_id: str, factory: Any, message: str, fix: str
) -> None:
    register_backend(BackendRegistration(id=backend_id, factory=factory))
    with pytest.raises(UnsupportedFeature) as info:
        acquire_backend(backend_id)
    got_message, got_fix = _parts(info.value)
    assert got_message == message
    assert got_fix == fix
    assert info.value.backend_id == backend_id  # type: ignore[attr-defined]


def test_a_backend_error_from_the_factory_reaches_the_caller_unchanged() -> None:
    register_backend(BackendRegistration(id="refuses", factory=_refuses))
    with pytest.raises(UnsupportedFeature) as info:
        acquire_backend("refuses")
    assert str(info.value) == "no CUDA device is visible\nFix: check nvidia-smi"


# probe_backend: the verdicts `vyre-async info` prints ----------------------------------


def _probe_refuses() -> None:
    raise UnsupportedFeature("no GPU here", fix="get one")


def _probe_wraps() -> None:
    """A probe that quotes an inner error, its Fix line included, then gives its own."""
    inner = UnsupportedFeature("driver too old", fix="update the driver")
    raise UnsupportedFeature(f"CuPy cannot start: {inner}\n(seen at import)", fix="see above")


def _probe_crashes() -> None:
    raise KeyError("CUDA_PATH")


PROBE_VERDICTS = [
    ({"factory": "json:loads"}, BackendProbe(id="p", usable=True)),
    ({"factory": _broken, "probe": _probe_ok}, BackendProbe(id="p", usable=True)),
    (
        {"factory": _broken, "probe": _probe_refuses},
        BackendProbe(id="p", usable=False, reason="no GPU here", fix="get one"),
    ),
    (
        {"factory": _broken, "probe": _probe_wraps},
        BackendProbe(
            id="p",
            usable=False,
            reason="CuPy cannot start: driver too old\nFix: update the driver\n(seen at import)",
            fix="see above",
        ),
    ),
    (
        {"factory": _broken, "probe": _probe_crashes},
        BackendProbe(
            id="p",
            usable=False,
            reason="KeyError: 'CUDA_PATH'",
            fix="reinstall the package that provides the 'p' backend",
        ),
    ),
    (
        {"factory": _broken, "probe": "json:__doc__"},
        BackendProbe(
            id="p",
            usable=False,
            reason="TypeError: backend 'p': 'json:__doc__' is not callable",
            fix="reinstall the package that provides the 'p' backend",
        ),
    ),
    (
        {"factory": "vyre_no_such_module:Backend"},
        BackendProbe(
            id="p",
            usable=False,
            reason="ModuleNotFoundError: No module named 'vyre_no_such_module'",
            fix="reinstall the package that provides the 'p' backend",
        ),
    ),
]


@pytest.mark.parametrize(("fields", "verdict"), PROBE_VERDICTS)
def test_probe_verdicts(fields: dict[str, Any], verdict: BackendProbe) -> None:
    got = probe_backend(BackendRegistration(id="p", **fields))
    assert got == verdict
    assert got.usable is verdict.usable  # a bool, never None (`vyre-async info --json`)


# registered_backends: entry points and what the log says about bad ones ----------------


class _FakeEP:
    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self._value = value

    def load(self) -> Any:
        if isinstance(self._value, Exception):
            raise self._value
        return self._value


ZETA = BackendRegistration(id="zeta", factory="json:loads", precedence=10)
ALPHA = BackendRegistration(id="alpha", factory="json:loads", precedence=10)
FIRST = BackendRegistration(id="first", factory="json:loads", precedence=0)
OTHER_ZETA = BackendRegistration(id="zeta", factory="json:dumps", precedence=1)

# (entry points, ids listed, the warnings of vyre_async._registry)
ENTRY_POINT_CASES = [
    (
        [_FakeEP("boom", ImportError("No module named 'boompkg'")), _FakeEP("a", ALPHA)],
        ["alpha"],
        ["skipping backend entry point 'boom': No module named 'boompkg'"],
    ),
    (
        [_FakeEP("odd", 42), _FakeEP("a", ALPHA)],
        ["alpha"],
        ["skipping backend entry point 'odd': it names 'int', not a BackendRegistration"],
    ),
    (
        [_FakeEP("none", None)],
        [],
        ["skipping backend entry point 'none': it names 'NoneType', not a BackendRegistration"],
    ),
    (
        # The first entry point of an id wins; the ones after a duplicate still count.
        [_FakeEP("z", ZETA), _FakeEP("z2", OTHER_ZETA), _FakeEP("a", ALPHA), _FakeEP("f", FIRST)],
        ["first", "alpha", "zeta"],
        ["duplicate backend id 'zeta' from entry point 'z2' ignored"],
    ),
]


@pytest.mark.parametrize(("eps", "ids", "warnings"), ENTRY_POINT_CASES)
def test_bad_entry_points_are_skipped_and_named_in_the_log(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    eps: list[_FakeEP],
    ids: list[str],
    warnings: list[str],
) -> None:
    monkeypatch.setattr(registry, "entry_points", lambda *, group: eps)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        listed = registered_backends()
    assert [r.id for r in listed] == ids
    assert _records(caplog) == [(LOGGER, logging.WARNING, w) for w in warnings]
    if "zeta" in ids:
        assert next(r for r in listed if r.id == "zeta") is ZETA


# acquire_preferred_backend ------------------------------------------------------------

NOTHING_FIX = (
    "install a GPU backend, e.g. pip install 'vyre-async[cuda]' for NVIDIA GPUs, or "
    "pass allow_reference=True to run on the numpy reference backend (CPU)"
)
FAILURES_FIX = (
    "apply the Fix listed above for the GPU backend you want, or pass "
    "allow_reference=True to run on the numpy reference backend (CPU)"
)
BROKEN_FAILURE = (
    "- broken: backend 'broken' failed to start: RuntimeError: "
    "libcuda.so.1: cannot open shared object file\n"
    "    Fix: check that 'broken' and its runtime are installed correctly"
)
REFUSES_FAILURE = "- refuses: no CUDA device is visible\n    Fix: check nvidia-smi"


@pytest.mark.parametrize("allow_reference", [False, True])
def test_preferred_with_nothing_installed_says_what_to_install(allow_reference: bool) -> None:
    with pytest.raises(UnsupportedFeature) as info:
        acquire_preferred_backend(allow_reference=allow_reference)
    assert _parts(info.value) == (
        "no usable GPU dispatch backend is available:\n- no GPU dispatch backend is installed",
        NOTHING_FIX,
    )
    assert info.value.failures == ()  # type: ignore[attr-defined]


def test_preferred_lists_each_failure_indented_under_its_backend() -> None:
    register_backend(BackendRegistration(id="broken", factory=_broken))
    register_backend(BackendRegistration(id="refuses", factory=_refuses))
    with pytest.raises(UnsupportedFeature) as info:
        acquire_preferred_backend()
    assert _parts(info.value) == (
        f"no usable GPU dispatch backend is available:\n{BROKEN_FAILURE}\n{REFUSES_FAILURE}",
        FAILURES_FIX,
    )
    assert info.value.failures == (BROKEN_FAILURE, REFUSES_FAILURE)  # type: ignore[attr-defined]


def test_preferred_falls_back_to_the_reference_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    register_backend(BackendRegistration(id="broken", factory=_broken))
    register_backend(BackendRegistration(id="refuses", factory=_refuses))
    register_backend(
        BackendRegistration(id="ref-like", factory=_backend("ref-like"), is_reference=True)
    )
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        backend = acquire_preferred_backend(allow_reference=True)
    assert backend.id == "ref-like" and backend is acquire_backend("ref-like")
    assert _records(caplog) == [
        (
            LOGGER,
            logging.WARNING,
            "no GPU backend can start here; dispatching on the CPU with the numpy reference "
            "backend 'ref-like' instead. Why each GPU backend did not start:\n"
            f"{BROKEN_FAILURE}\n{REFUSES_FAILURE}",
        )
    ]


def test_preferred_logs_each_backend_it_skips_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    register_backend(BackendRegistration(id="refuses", factory=_refuses, precedence=0))
    register_backend(BackendRegistration(id="works", factory=_backend("works")))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert acquire_preferred_backend().id == "works"
    assert _records(caplog) == [
        (
            LOGGER,
            logging.DEBUG,
            "backend 'refuses' unavailable: no CUDA device is visible\nFix: check nvidia-smi",
        )
    ]


# (registrations as (id, precedence, gpu-like capabilities, is_reference), allow_reference, chosen)
PREFERENCE_ORDER = [
    ([("b", 10, False, False), ("a", 10, False, False)], False, "a"),  # equal: by id
    ([("a", 10, False, False), ("b", 5, False, False)], False, "b"),  # then precedence
    ([("a", 0, False, False), ("gpu", 90, True, False)], False, "gpu"),  # capabilities first
    ([("ref", 0, True, True), ("cpu", 90, False, False)], True, "cpu"),  # reference: last
]


@pytest.mark.parametrize(("backends", "allow_reference", "chosen"), PREFERENCE_ORDER)
def test_preferred_order(
    backends: list[tuple[str, float, bool, bool]], allow_reference: bool, chosen: str
) -> None:
    for backend_id, precedence, gpu, reference in backends:
        register_backend(
            BackendRegistration(
                id=backend_id,
                factory=_backend(backend_id, gpu=gpu),
                precedence=precedence,
                is_reference=reference,
            )
        )
    assert acquire_preferred_backend(allow_reference=allow_reference).id == chosen
