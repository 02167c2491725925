"""The pytest plugin of `vyre_async.testing`, as backend authors use it (issue 28, plugin triage).

mutmut's run on ``vyre_async/testing/plugin.py`` left mutants that
``tests/test_testing_plugin.py`` (the shipped suite run on an out-of-tree
backend, in subprocesses) did not notice: the ``--vyre-backend`` usage errors'
messages and ``Fix:`` lines, a module spec split at the last colon instead of
the first, a ``--vyre-backend`` registration that refused to replace one
already registered, the option's ``--help`` section (its title, metavar and
text; the group a conftest extends by name), its value without the option,
and which tests ``pytest_generate_tests`` parametrises over which backends.

Each is pinned here in this process, where mutmut's runner sees the mutant:
``_register`` is called directly, and the rest runs inner pytest sessions
with ``pytester`` (``inline_run``: in process, a few hundred milliseconds each)
on a registry of the test's own (``isolated``): fake backends ``alpha`` and
``gamma`` (which cannot start) dispatch, ``beta`` does not. What the inner
sessions show is what a user sees: node ids, outcomes, skip and failure
texts, ``pytest --help``, ``config.getoption`` and the registered markers.
"""

from __future__ import annotations

import textwrap

import pytest
from _pytest._code.code import ExceptionRepr

from vyre_async._registry import BackendRegistration, register_backend, registered_backends
from vyre_async.testing.plugin import _register

pytest_plugins = ["pytester"]

pytestmark = pytest.mark.usefixtures("isolated")

FIX_IMPORT = (
    "Fix: put the package on the path (pip install -e . or PYTHONPATH) and name a "
    "BackendRegistration, e.g. --vyre-backend=mypkg.registration:REGISTRATION"
)

FAKES = """
from vyre_async import BackendRegistration


class FakeBackend:
    closed = False

    def __init__(self, backend_id):
        self.id = backend_id


def _no_device():
    raise RuntimeError("no device here")


ALPHA = BackendRegistration(id="alpha", factory=lambda: FakeBackend("alpha"))
BETA = BackendRegistration(id="beta", factory=lambda: FakeBackend("beta"), dispatches=False)
GAMMA = BackendRegistration(id="gamma", factory=_no_device, precedence=1)
"""

# A backend author's conftest: the fakes registered, the plugin's --help section
# extended by its group name, and an id hook that renames every other parameter.
CONFTEST = """
import pytest

from vyre_async import register_backend
from vyre_fakes import ALPHA, BETA, GAMMA

for registration in (ALPHA, BETA, GAMMA):
    register_backend(registration)


def pytest_addoption(parser):
    parser.getgroup("vyre-async").addoption(
        "--vyre-extra", action="store_true", help="a backend author's own flag"
    )


def pytest_make_parametrize_id(config, val, argname):
    return f"{argname}={val}"
"""

SUITE = """
import pytest


@pytest.mark.vyre_contract
def test_contract(vyre_backend):
    assert type(vyre_backend).__name__ == "FakeBackend"


@pytest.mark.vyre_contract
@pytest.mark.usefixtures("vyre_backend")
def test_through_usefixtures():
    pass


@pytest.mark.vyre_contract
@pytest.mark.parametrize(argnames="n", argvalues=[1])
def test_keyword_parametrize(vyre_backend, n):
    assert type(vyre_backend).__name__ == "FakeBackend"


@pytest.mark.vyre_contract
@pytest.mark.parametrize("vyre_backend", ["own"])
def test_own_parameter(vyre_backend):
    assert vyre_backend == "own"


@pytest.mark.filterwarnings("default")  # marked, but not as a contract test
def test_unmarked(vyre_backend):
    pass
"""

OWN_FIXTURE = """
import pytest


@pytest.fixture
def vyre_backend():
    return "mine"


@pytest.mark.vyre_contract
def test_module_fixture(vyre_backend):
    assert vyre_backend == "mine"
"""

GAMMA_CANNOT_START = (
    "backend 'gamma' failed to start: RuntimeError: no device here\n"
    "Fix: check that 'gamma' and its runtime are installed correctly"
)


def _project(pytester: pytest.Pytester, conftest: str = CONFTEST) -> None:
    pytester.syspathinsert()
    pytester.makepyfile(
        vyre_fakes=FAKES, conftest=conftest, test_suite=SUITE, test_own_fixture=OWN_FIXTURE
    )


def _outcomes(reprec: pytest.HookRecorder) -> dict[str, tuple[str, str]]:
    """Each test's name (with its ids) -> (outcome, the skip or failure text)."""
    found: dict[str, tuple[str, str]] = {}
    for report in reprec.getreports("pytest_runtest_logreport"):
        name = report.nodeid.split("::")[-1]
        if report.when == "call" or report.outcome != "passed":
            text = ""
            if report.skipped:
                assert isinstance(report.longrepr, tuple)
                text = report.longrepr[2]
            elif report.failed:
                assert isinstance(report.longrepr, ExceptionRepr)
                assert report.longrepr.reprcrash is not None
                text = report.longrepr.reprcrash.message
            found.setdefault(name, (report.outcome, text))
    return found


# _register ----------------------------------------------------------------------------


def _usage_error(spec: str) -> str:
    with pytest.raises(pytest.UsageError) as info:
        _register(spec)
    return str(info.value)


def test_a_spec_whose_module_is_not_installed_is_a_usage_error_with_a_fix() -> None:
    assert _usage_error("nosuch_vyre_pkg.registration:TINY") == (
        "--vyre-backend 'nosuch_vyre_pkg.registration:TINY': cannot import 'TINY' from "
        "'nosuch_vyre_pkg.registration' (No module named 'nosuch_vyre_pkg')\n" + FIX_IMPORT
    )


def test_a_spec_naming_a_missing_attribute_is_a_usage_error_with_a_fix() -> None:
    assert _usage_error("vyre_reference.registration:NOPE") == (
        "--vyre-backend 'vyre_reference.registration:NOPE': cannot import 'NOPE' from "
        "'vyre_reference.registration' (module 'vyre_reference.registration' has no "
        "attribute 'NOPE')\n" + FIX_IMPORT
    )


def test_a_spec_is_split_at_its_first_colon() -> None:
    """The module is what comes before the first colon; the rest names the attribute."""
    assert _usage_error("vyre_reference.registration:REGISTRATION:extra") == (
        "--vyre-backend 'vyre_reference.registration:REGISTRATION:extra': cannot import "
        "'REGISTRATION:extra' from 'vyre_reference.registration' (module "
        "'vyre_reference.registration' has no attribute 'REGISTRATION:extra')\n" + FIX_IMPORT
    )


def test_a_spec_naming_something_else_says_what_it_names() -> None:
    # The class instead of an instance of it: the commonest slip.
    assert _usage_error("vyre_reference.registration:BackendRegistration") == (
        "--vyre-backend 'vyre_reference.registration:BackendRegistration' names a type, not "
        "a BackendRegistration\nFix: point it at BackendRegistration(id=..., factory=...)"
    )
    assert _usage_error("vyre_async.testing.plugin:MARKER") == (
        "--vyre-backend 'vyre_async.testing.plugin:MARKER' names a str, not "
        "a BackendRegistration\nFix: point it at BackendRegistration(id=..., factory=...)"
    )


def test_a_spec_replaces_a_registration_of_the_same_id() -> None:
    """A conftest (or an earlier session in this process) registered the id already."""
    from vyre_reference.registration import REGISTRATION

    register_backend(BackendRegistration(id="reference", factory="elsewhere:Backend"))
    assert _register("vyre_reference.registration:REGISTRATION") == "reference"
    assert _register("vyre_reference.registration:REGISTRATION") == "reference"
    assert registered_backends() == [REGISTRATION]


# pytest_addoption ---------------------------------------------------------------------


def test_the_help_has_a_section_of_its_own_that_a_conftest_can_extend(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    _project(pytester)
    result = pytester.runpytest("--help")
    assert result.ret == 0
    lines = result.stdout.lines
    start = lines.index("vyre-async backend contract suite:")
    section = lines[start : lines.index("", start)]
    assert " ".join(" ".join(section).split()) == (
        "vyre-async backend contract suite: --vyre-backend=ID run the vyre_async.testing "
        "contract suite against this backend: a registered id, or package.module:NAME of a "
        "BackendRegistration to register first (repeatable; default: every registered "
        "backend that dispatches) --vyre-extra a backend author's own flag"
    )
    assert not any(line.startswith("vyre-async") for line in lines[start + 1 :])


# pytest_configure and pytest_generate_tests -------------------------------------------


def test_without_the_option_the_value_is_empty_and_the_marker_is_described(
    pytester: pytest.Pytester,
) -> None:
    _project(pytester)
    config = pytester.parseconfigure("--strict-markers")
    assert config.getoption("vyre_backend") == []
    assert (
        "vyre_contract: a vyre-async contract test, run per backend (--vyre-backend)"
        in config.getini("markers")
    )


def test_marked_tests_run_on_every_dispatching_backend_skipping_those_that_cannot_start(
    pytester: pytest.Pytester,
) -> None:
    _project(pytester)
    reprec = pytester.inline_run("--strict-markers")
    outcomes = _outcomes(reprec)
    assert outcomes.pop("test_unmarked")[0] == "failed"  # no backend: the fixture has no param
    skipped = ("skipped", f"Skipped: backend 'gamma' cannot start here: {GAMMA_CANNOT_START}")
    assert outcomes == {
        # by precedence: gamma (1), then alpha (100); beta does not dispatch
        "test_contract[gamma]": skipped,
        "test_contract[alpha]": ("passed", ""),
        "test_through_usefixtures[gamma]": skipped,
        "test_through_usefixtures[alpha]": ("passed", ""),
        "test_keyword_parametrize[gamma-n=1]": skipped,
        "test_keyword_parametrize[alpha-n=1]": ("passed", ""),
        "test_own_parameter[vyre_backend=own]": ("passed", ""),
        "test_module_fixture": ("passed", ""),
    }


def test_named_backends_run_in_the_order_named_and_one_that_cannot_start_fails(
    pytester: pytest.Pytester,
) -> None:
    _project(pytester)
    reprec = pytester.inline_run(
        "--strict-markers",
        "--vyre-backend=beta",
        "--vyre-backend=vyre_fakes:ALPHA",  # registered by the conftest already: replaced
        "--vyre-backend=gamma",
        "-k",
        "not unmarked",
    )
    outcomes = _outcomes(reprec)
    failed = outcomes.pop("test_contract[gamma]")
    assert failed[0] == "failed"
    assert failed[1] == (
        f"Failed: backend 'gamma' named by --vyre-backend cannot start: {GAMMA_CANNOT_START}"
    )
    assert {name: outcome for name, (outcome, _) in outcomes.items()} == {
        "test_contract[beta]": "passed",
        "test_contract[alpha]": "passed",
        "test_through_usefixtures[beta]": "passed",
        "test_through_usefixtures[alpha]": "passed",
        "test_through_usefixtures[gamma]": "failed",
        "test_keyword_parametrize[beta-n=1]": "passed",
        "test_keyword_parametrize[alpha-n=1]": "passed",
        "test_keyword_parametrize[gamma-n=1]": "failed",
        "test_own_parameter[vyre_backend=own]": "passed",
        "test_module_fixture": "passed",
    }
    names = [r.nodeid.split("::")[-1] for r in reprec.getreports("pytest_runtest_logreport")]
    contract = [name for name in dict.fromkeys(names) if name.startswith("test_contract[")]
    assert contract == ["test_contract[beta]", "test_contract[alpha]", "test_contract[gamma]"]


def test_hooks_a_conftest_imports_without_the_plugin_run_every_dispatching_backend(
    pytester: pytest.Pytester,
) -> None:
    """``-p no:vyre_async`` and the hooks wired by hand: no ``pytest_configure`` ran."""
    conftest = CONFTEST + textwrap.dedent(
        """
        from vyre_async.testing.plugin import pytest_generate_tests, vyre_backend


        def pytest_configure(config):
            config.addinivalue_line("markers", "vyre_contract: the suite's marker")
        """
    )
    _project(pytester, conftest)
    reprec = pytester.inline_run("-p", "no:vyre_async", "-k", "test_contract")
    assert {name: outcome for name, (outcome, _) in _outcomes(reprec).items()} == {
        "test_contract[gamma]": "skipped",
        "test_contract[alpha]": "passed",
    }
