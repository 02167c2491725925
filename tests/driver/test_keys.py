"""The driver's cache and memo keys, field by field (issue 28, tests by method).

A key that leaves out an input which changes the result serves a stale result
(another program's kernel, a plan for other sizes); a key holding an input
which changes nothing only costs a recompile or a re-plan. Each key here has a
table: a base case, then one case per input changed alone. An input that can
change the result must miss (a build, a new template, a scored misprediction)
and the result after the miss must be right; an input that cannot must hit.
The tables are checked against the code (``dataclasses.fields`` of the key's
types, the key function's parameters), so an input added later without a case
fails ``test_*_has_a_case_for_every_*``.

The keys:

1. the pipeline identity (`vyre_async._cache.identity.pipeline_identity`, as
   `PipelineStore` uses it: its identity memo, the memory LRU, the disk cache);
2. the launch template (`DispatchFrontEnd._plan` and `_new_template`: program, config, pipeline
   identity, input sizes);
3. the prefetcher's shape fingerprint (identity digest, grid, workgroup).

The CUDA backend's keys are in ``tests/cupy/test_cupy_keys.py``, calibration's
in ``tests/policies/test_calibration_keys.py``, the Ray worker's program memo
in ``tests/ray/test_ray_keys.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from tests import otel_sdk
from tests.driver.fakes import BytesBackend
from tests.helpers import backend_of
from vyre_async import DiskPipelineCache, DispatchConfig, InvalidProgram, UnsupportedFeature
from vyre_async._cache import identity as identity_module
from vyre_async._cache.identity import PipelineIdentity, pipeline_identity
from vyre_async._frontend import DispatchFrontEnd, LaunchTemplate
from vyre_async._pipeline import Launch
from vyre_async._plan import LaunchGeometry, plan_dispatch
from vyre_async._prefetch import Prefetcher
from vyre_async.ir import (
    Access,
    BufferDecl,
    BufLen,
    DType,
    Expr,
    If,
    Let,
    Load,
    Program,
    Store,
    Var,
    gid,
)
from vyre_reference import ReferenceExecutor, execute
from vyre_reference.compile import compile_program

N = 16


def program(
    *,
    a: tuple[Any, ...] = ("a", 0, Access.READ, DType.U32, 0),
    out: tuple[Any, ...] = ("out", 2, Access.WRITE, DType.U32, N),
    tile: tuple[Any, ...] = ("tile", 3, Access.WORKGROUP, DType.U32, 8),
    workgroup: int = 8,
    combine: Callable[[Expr, Expr], Expr] = lambda x, y: x ^ y,
    op_id: str = "keys.base",
) -> Program:
    """``out[i] = a[i] ^ b[i]`` with a WORKGROUP buffer the body leaves alone.

    Every keyword changes one field of the program (a buffer's, for ``a``,
    ``out`` and ``tile``), so each case below changes one thing.
    """
    i = Var("i")
    name = out[0]
    return Program(
        [
            BufferDecl(*a),
            BufferDecl("b", 1, Access.READ, DType.U32),
            BufferDecl(*out),
            BufferDecl(*tile),
        ],
        workgroup,
        [
            Let("i", gid()),
            If(i.lt(BufLen(name)), [Store(name, i, combine(Load("a", i), Load("b", i)))]),
        ],
        op_id=op_id,
    )


BASE = program()


def inputs_for(prog: Program, n: int = N) -> list[np.ndarray]:
    """Inputs of ``prog``: ``a = 0..n-1``, ``b = 5``, and zeros for a READ_WRITE ``out``."""
    values = {"a": np.arange(n, dtype=np.uint32), "b": np.full(n, 5, np.uint32)}
    return [values.get(d.name, np.zeros(n, np.uint32)) for d in prog.inputs]


def expected(prog: Program, inputs: list[np.ndarray], cfg: DispatchConfig) -> list[np.ndarray]:
    """What ``prog`` computes under ``cfg`` (the reference engine, no pipeline cache involved)."""
    return execute(
        prog,
        inputs,
        grid_override=cfg.grid_override,
        workgroup_override=cfg.workgroup_override,
        fixpoint_iterations=cfg.iterations,
    )


def assert_outputs(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def close(backend: Any) -> None:
    anyio.run(backend.aclose)


# 1. The pipeline identity ------------------------------------------------------------------


class KeyBackend(ReferenceExecutor):
    """The reference engine with every identity input of a backend settable.

    Counts its builds and disk loads; stores a pipeline on disk as its program's
    wire bytes, so a second backend can load it (a hit) instead of building.
    """

    id = "keys-test"

    def __init__(
        self,
        *,
        version: str = "1.0",
        device: str = "device-a",
        compiler: str = "cc 1.0",
        options: Mapping[str, object] | None = None,
        options_for: Callable[[DispatchConfig], Mapping[str, object]] | None = None,
        **kwargs: Any,
    ) -> None:
        self.version = version
        super().__init__(**kwargs)
        self.device = device
        self.compiler = compiler
        self.options = dict(options or {})
        self.options_for = options_for
        self.builds = 0
        self.loads = 0

    def device_fingerprint(self) -> str:
        return self.device

    def compiler_fingerprint(self) -> str:
        return self.compiler

    def compile_options(self, config: DispatchConfig) -> Mapping[str, object]:
        return self.options if self.options_for is None else self.options_for(config)

    def build_pipeline(self, program: Program, config: DispatchConfig) -> Any:
        self.builds += 1
        return super().build_pipeline(program, config)

    def serialize_pipeline(self, native: Any) -> bytes | None:
        return native.program.to_wire()  # type: ignore[no-any-return]

    def load_pipeline(self, payload: bytes, program: Program, config: DispatchConfig) -> Any:
        self.loads += 1
        return compile_program(Program.from_wire(payload))


class OtherIdBackend(KeyBackend):
    id = "keys-test-2"


@pytest.fixture
def spans() -> Iterator[Any]:
    """The in-memory span exporter (the SDK is installed once per session, `tests.otel_sdk`)."""
    exporter, _ = otel_sdk.install()
    exporter.clear()
    yield exporter
    exporter.clear()


@pytest.fixture
def backends() -> Iterator[list[Any]]:
    """Backends a test makes; each is closed after it."""
    made: list[Any] = []
    yield made
    for backend in made:
        close(backend)


# The parameters of pipeline_identity, and where each one's cases are.
IDENTITY_PARAMETERS = {
    "program": "PROGRAM_CASES (one per field of Program, BUFFER_CASES per field of BufferDecl)",
    "config": "CONFIG_IDENTITY (one per field of DispatchConfig)",
    "backend_id": "BACKEND_CASES",
    "backend_version": "BACKEND_CASES",
    "device_fingerprint": "BACKEND_CASES",
    "compiler": "BACKEND_CASES",
    "compile_options": "BACKEND_CASES, and test_a_config_field_a_backend_compiles_with_recompiles",
}

MISS, HIT = "miss", "hit"

# field of BufferDecl -> (case name, the program with that field of one buffer changed, verdict)
BUFFER_CASES: dict[str, list[tuple[str, Program, str]]] = {
    "name": [("tile renamed", program(tile=("tile2", 3, Access.WORKGROUP, DType.U32, 8)), MISS)],
    "binding": [("tile rebound", program(tile=("tile", 5, Access.WORKGROUP, DType.U32, 8)), MISS)],
    "access": [("out read-write", program(out=("out", 2, Access.READ_WRITE, DType.U32, N)), MISS)],
    "dtype": [("tile i32", program(tile=("tile", 3, Access.WORKGROUP, DType.I32, 8)), MISS)],
    "count": [
        # Shared memory is sized in the kernel: its count is compiled in.
        ("workgroup count", program(tile=("tile", 3, Access.WORKGROUP, DType.U32, 16)), MISS),
        # Other buffers' counts reach the kernel at launch (zeroed in the digest).
        ("write count", program(out=("out", 2, Access.WRITE, DType.U32, 2 * N)), HIT),
        ("read count", program(a=("a", 0, Access.READ, DType.U32, N)), HIT),
    ],
}

# field of Program -> cases
PROGRAM_CASES: dict[str, list[tuple[str, Program, str]]] = {
    "buffers": [case for cases in BUFFER_CASES.values() for case in cases],
    "workgroup_size": [("workgroup 4", program(workgroup=4), MISS)],
    "body": [("or for xor", program(combine=lambda x, y: x | y), MISS)],
    "op_id": [("op id", program(op_id="keys.other"), MISS)],
}

# field of DispatchConfig -> (changed config, verdict for the pipeline identity)
CONFIG_IDENTITY: dict[str, tuple[DispatchConfig, str]] = {
    "profile": (DispatchConfig(profile="p"), HIT),
    "ulp_budget": (DispatchConfig(ulp_budget=1), MISS),
    "timeout": (DispatchConfig(timeout=30.0), HIT),
    "label": (DispatchConfig(label="l"), HIT),
    "max_output_bytes": (DispatchConfig(max_output_bytes=1 << 20), HIT),
    "workgroup_override": (DispatchConfig(workgroup_override=(4, 1, 1)), MISS),
    "grid_override": (DispatchConfig(grid_override=(1, 1, 1)), HIT),
    "fixpoint_iterations": (DispatchConfig(fixpoint_iterations=2), HIT),
    "speculation": (DispatchConfig(speculation="disable"), HIT),
    "persistent_thread": (DispatchConfig(persistent_thread="disable"), HIT),
    "cooperative": (DispatchConfig(cooperative=True), HIT),
}

# A second backend sharing the first one's disk cache, made with one change.
BACKEND_CASES: dict[str, tuple[type[KeyBackend], dict[str, Any], str]] = {
    "backend_id": (OtherIdBackend, {}, MISS),
    "backend_version": (KeyBackend, {"version": "1.1"}, MISS),
    "device_fingerprint": (KeyBackend, {"device": "device-b"}, MISS),
    "compiler": (KeyBackend, {"compiler": "cc 1.1"}, MISS),
    "compile_options": (KeyBackend, {"options": {"fast_math": True}}, MISS),
    # Settings of the backend object that change no code.
    "no prefetcher": (KeyBackend, {"prefetch": False}, HIT),
    "pipeline cache capacity": (KeyBackend, {"pipeline_cache_capacity": 4}, HIT),
    "worker count": (KeyBackend, {"max_workers": 1}, HIT),
}


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}


def test_the_identity_has_a_case_for_every_input() -> None:
    assert set(inspect.signature(pipeline_identity).parameters) == set(IDENTITY_PARAMETERS)
    assert set(PROGRAM_CASES) == _fields(Program)
    assert set(BUFFER_CASES) == _fields(BufferDecl)
    assert set(CONFIG_IDENTITY) == _fields(DispatchConfig)
    backend_parameters = {p for p, where in IDENTITY_PARAMETERS.items() if "BACKEND" in where}
    assert backend_parameters <= set(BACKEND_CASES)
    # The config's verdicts are the policy digest's documented fields.
    policy = {name for name, (_, verdict) in CONFIG_IDENTITY.items() if verdict == MISS}
    assert policy == {"ulp_budget", "workgroup_override"}
    # Every component of the identity is changed by some case (test_the_components_...).
    assert _fields(PipelineIdentity) == {
        "program_digest",
        "policy_digest",
        "device_digest",
        "digest",
    }


PROGRAM_TABLE = [
    pytest.param(field, changed, verdict, id=f"{field}: {name}")
    for field, cases in {
        **{f"buffers.{f}": c for f, c in BUFFER_CASES.items()},
        **{f: c for f, c in PROGRAM_CASES.items() if f != "buffers"},
    }.items()
    for name, changed, verdict in cases
]


@pytest.mark.parametrize(("field", "changed", "verdict"), PROGRAM_TABLE)
def test_a_program_field_changed_alone(
    backends: list[Any], field: str, changed: Program, verdict: str
) -> None:
    backend = backend_of(KeyBackend)
    backends.append(backend)
    config = DispatchConfig()
    base_inputs = inputs_for(BASE)
    assert_outputs(backend.dispatch_sync(BASE, base_inputs), expected(BASE, base_inputs, config))
    assert backend.executor.builds == 1

    inputs = inputs_for(changed)
    outputs = backend.dispatch_sync(changed, inputs)

    stats = backend.cache_stats()
    if verdict == MISS:
        assert backend.executor.builds == 2, f"changing {field} must recompile"
        assert stats.miss_reasons.get("program_changed") == 1
        assert backend.pipeline_identity(changed) != backend.pipeline_identity(BASE)
    else:
        assert backend.executor.builds == 1, f"changing {field} this way must reuse the pipeline"
        assert (stats.hits, stats.misses) == (1, 1)
        assert backend.pipeline_identity(changed) == backend.pipeline_identity(BASE)
    assert_outputs(outputs, expected(changed, inputs, config))


@pytest.mark.parametrize(
    ("field", "case"), list(CONFIG_IDENTITY.items()), ids=list(CONFIG_IDENTITY)
)
def test_a_config_field_changed_alone(
    backends: list[Any], field: str, case: tuple[DispatchConfig, str]
) -> None:
    changed, verdict = case
    backend = backend_of(KeyBackend)
    backends.append(backend)
    inputs = inputs_for(BASE)
    base = backend.compile(BASE)
    assert backend.executor.builds == 1

    pipeline = backend.compile(BASE, changed)

    if verdict == MISS:
        assert backend.executor.builds == 2, f"changing {field} must recompile"
        assert backend.cache_stats().miss_reasons.get("policy_changed") == 1
        assert pipeline.identity.policy_digest != base.identity.policy_digest
    else:
        assert backend.executor.builds == 1, f"changing {field} must reuse the pipeline"
        assert pipeline.identity == base.identity
    assert pipeline.config == changed  # it plans with this caller's config
    if changed.cooperative and not backend.capabilities().grid_sync:  # refused at dispatch
        with pytest.raises(UnsupportedFeature, match="cooperative"):
            backend.dispatch(BASE, inputs, changed)
    else:  # (the reference engine has grid sync: a cooperative launch is its one launch)
        assert_outputs(
            backend.dispatch_sync(BASE, inputs, changed), expected(BASE, inputs, changed)
        )
        assert_outputs(pipeline.dispatch(inputs).result(), expected(BASE, inputs, changed))


@pytest.mark.parametrize(("name", "case"), list(BACKEND_CASES.items()), ids=list(BACKEND_CASES))
def test_a_backend_input_changed_alone(
    tmp_path: Path,
    backends: list[Any],
    name: str,
    case: tuple[type[KeyBackend], dict[str, Any], str],
) -> None:
    cls, change, verdict = case
    first = backend_of(KeyBackend, disk_cache=DiskPipelineCache(tmp_path))
    backends.append(first)
    first.compile(BASE)
    same = backend_of(KeyBackend, disk_cache=DiskPipelineCache(tmp_path))
    backends.append(same)
    assert same.compile(BASE).source == "disk" and same.executor.builds == 0  # the base hits

    other = backend_of(cls, disk_cache=DiskPipelineCache(tmp_path), **change)
    backends.append(other)
    pipeline = other.compile(BASE)

    if verdict == MISS:
        assert (pipeline.source, other.executor.builds, other.executor.loads) == (
            "compiled",
            1,
            0,
        ), name
        assert pipeline.identity != same.compile(BASE).identity
        assert DiskPipelineCache(tmp_path).info().entries == 2
    else:
        assert (pipeline.source, other.executor.builds, other.executor.loads) == ("disk", 0, 1), (
            name
        )
    inputs = inputs_for(BASE)
    assert_outputs(other.dispatch_sync(BASE, inputs), expected(BASE, inputs, DispatchConfig()))


def test_the_key_version_changed_alone(
    tmp_path: Path, backends: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = backend_of(KeyBackend, disk_cache=DiskPipelineCache(tmp_path))
    backends.append(first)
    before = first.compile(BASE).identity
    monkeypatch.setattr(identity_module, "CACHE_KEY_VERSION", identity_module.CACHE_KEY_VERSION + 1)
    other = backend_of(KeyBackend, disk_cache=DiskPipelineCache(tmp_path))
    backends.append(other)

    pipeline = other.compile(BASE)

    assert (pipeline.source, other.executor.builds, other.executor.loads) == ("compiled", 1, 0)
    assert pipeline.identity.digest != before.digest
    inputs = inputs_for(BASE)
    assert_outputs(other.dispatch_sync(BASE, inputs), expected(BASE, inputs, DispatchConfig()))


def test_the_components_of_the_identity_each_follow_their_inputs() -> None:
    """The identity's parts (`classify_miss` reads them) change with their own inputs only."""
    base_args: dict[str, Any] = {
        "backend_id": "b",
        "backend_version": "1",
        "device_fingerprint": "d",
        "compiler": "c",
        "compile_options": {},
    }
    base = pipeline_identity(BASE, None, **base_args)
    changes: dict[str, tuple[Program, DispatchConfig | None, dict[str, Any]]] = {
        "program_digest": (program(op_id="x"), None, {}),
        "policy_digest": (BASE, DispatchConfig(ulp_budget=1), {}),
        "device_digest": (BASE, None, {"device_fingerprint": "e"}),
    }
    for component, (prog, cfg, args) in changes.items():
        changed = pipeline_identity(prog, cfg, **{**base_args, **args})
        assert changed.digest != base.digest
        for other in changes:
            same = getattr(changed, other) == getattr(base, other)
            assert same is (other != component), (component, other)


def test_a_config_field_a_backend_compiles_with_recompiles(backends: list[Any]) -> None:
    """The store's identity memo is keyed by the compile options a config maps to.

    A backend may turn any config field into a compile option; then that field
    changes code though it is not in the policy digest. The memo (program,
    policy digest, options) must miss on it: a memo keyed by the policy alone
    would hand out the first config's pipeline.
    """
    backend = backend_of(KeyBackend, options_for=lambda cfg: {"profile": cfg.profile})
    backends.append(backend)
    fast, safe = DispatchConfig(profile="fast"), DispatchConfig(profile="safe")

    first = backend.compile(BASE, fast)
    second = backend.compile(BASE, safe)
    again = backend.compile(BASE, DispatchConfig(profile="fast"))  # an equal config: a hit

    assert backend.executor.builds == 2
    assert second.identity != first.identity and again.identity == first.identity
    inputs = inputs_for(BASE)
    assert_outputs(second.dispatch(inputs).result(), expected(BASE, inputs, safe))


# 2. Launch templates --------------------------------------------------------------------


class TemplateBackend(BytesBackend):
    """Records each launch; derives a per-shape fact in ``plan_shape``, as executors do.

    The fact is what an executor may derive from the launch shape (the reference
    executor: inline or pooled; Ray: the program's wire bytes): every launch
    checks that the fact it was handed (``launch.shape``) is its own.
    """

    id = "keys-template-test"

    def plan_shape(self, native: Any, plan: Any, config: DispatchConfig) -> Any:
        self.shapes_planned = getattr(self, "shapes_planned", 0) + 1
        return (plan, config.launch_shape(), config.label)

    def enqueue(self, launch: Launch) -> Any:
        assert launch.template is not None
        fact = (launch.plan, launch.config.launch_shape(), launch.config.label)
        assert launch.shape == fact, "a launch got another shape's template"
        return super().enqueue(launch)


def template_of(backend: TemplateBackend) -> LaunchTemplate:
    template = backend.executor.launches[-1].template
    assert template is not None
    return template


# The parameters of DispatchFrontEnd._new_template (what plans a template) and where
# each one's cases are.
TEMPLATE_PARAMETERS = {
    "pipeline": "test_a_template_input_changed_alone[pipeline...]",
    "program": "test_a_template_input_changed_alone[program...]",
    "config": "TEMPLATE_CONFIG (one per field of DispatchConfig)",
    "sizes": "test_a_template_input_changed_alone[size of ...] (one per input)",
}

# field of DispatchConfig -> (changed config, verdict for the template, what a dispatch raises)
TEMPLATE_CONFIG: dict[str, tuple[DispatchConfig, str, type[Exception] | None]] = {
    "profile": (DispatchConfig(profile="p"), MISS, None),  # on the span
    "ulp_budget": (DispatchConfig(ulp_budget=1), MISS, None),  # another pipeline
    "timeout": (DispatchConfig(timeout=30.0), HIT, None),  # (see the xfail below)
    "label": (DispatchConfig(label="l"), MISS, None),  # on the span
    "max_output_bytes": (DispatchConfig(max_output_bytes=4), MISS, InvalidProgram),
    "workgroup_override": (DispatchConfig(workgroup_override=(4, 1, 1)), MISS, None),
    "grid_override": (DispatchConfig(grid_override=(1, 1, 1)), MISS, None),
    "fixpoint_iterations": (DispatchConfig(fixpoint_iterations=2), MISS, None),
    "speculation": (DispatchConfig(speculation="force"), MISS, UnsupportedFeature),
    "persistent_thread": (DispatchConfig(persistent_thread="force"), MISS, UnsupportedFeature),
    "cooperative": (DispatchConfig(cooperative=True), MISS, UnsupportedFeature),
}


def test_the_template_has_a_case_for_every_input() -> None:
    parameters = set(inspect.signature(DispatchFrontEnd._new_template).parameters) - {"self"}
    assert parameters == set(TEMPLATE_PARAMETERS)
    assert set(TEMPLATE_CONFIG) == _fields(DispatchConfig)
    assert len(BASE.inputs) == 2  # one size case each, below


def _check_template(
    template: LaunchTemplate, prog: Program, cfg: DispatchConfig, sizes: tuple[int, ...]
) -> None:
    """The template holds what this dispatch would plan for itself."""
    assert template.program == prog
    assert template.config.launch_shape() == cfg.launch_shape()
    assert template.config.label == cfg.label
    assert template.plan == plan_dispatch(
        prog, sizes, grid_override=cfg.grid_override, workgroup_override=cfg.workgroup_override
    )


@pytest.mark.parametrize(
    ("field", "case"),
    [
        pytest.param(
            name,
            case,
            id=name,
            marks=[
                pytest.mark.xfail(
                    strict=True,
                    reason="over-keyed: the template's value key holds the whole config, so "
                    "configs that differ only in timeout (a deadline-based timeout per call, "
                    "the Ray worker's time-left config) each plan their own template and fill "
                    "the front end's LRU with copies of one shape",
                )
            ]
            if name == "timeout"
            else [],
        )
        for name, case in TEMPLATE_CONFIG.items()
    ],
)
def test_a_template_config_field_changed_alone(
    spans: Any, field: str, case: tuple[DispatchConfig, str, type[Exception] | None]
) -> None:
    changed, verdict, refusal = case
    backend = backend_of(TemplateBackend, prefetch=False)
    try:
        inputs = inputs_for(BASE)
        sizes = (N, N)
        backend.dispatch(BASE, inputs).result()
        base = template_of(backend)

        if refusal is not None:  # a re-plan checks the config: a reused template would not
            with pytest.raises(refusal, match="Fix:"):
                backend.dispatch(BASE, inputs, changed)
            return
        spans.clear()
        backend.dispatch(BASE, inputs, changed).result()

        template = template_of(backend)
        assert (template is base) is (verdict == HIT), f"changing {field} alone: {verdict} expected"
        _check_template(template, BASE, changed, sizes)
        (span,) = spans.get_finished_spans()
        attributes = dict(span.attributes or {})
        assert attributes.get("vyre.label") == changed.label
        assert attributes.get("vyre.profile") == changed.profile
        assert attributes["vyre.launch.grid"] == template.plan.geometry.grid
    finally:
        close(backend)


def _with_sizes(a: int, b: int) -> list[np.ndarray]:
    return [np.arange(a, dtype=np.uint32), np.full(b, 5, np.uint32)]


def test_a_template_input_changed_alone() -> None:
    """Sizes (each input), the program and the pipeline: each alone is a new template."""
    backend = backend_of(TemplateBackend, prefetch=False)
    try:
        cfg = DispatchConfig()
        backend.dispatch(BASE, _with_sizes(N, N)).result()
        base = template_of(backend)

        # size of input a / size of input b (the program declares both sized at dispatch)
        for a, b in ((N // 2, N), (N, N // 2)):
            backend.dispatch(BASE, _with_sizes(a, b)).result()
            assert template_of(backend) is not base, (a, b)
            _check_template(template_of(backend), BASE, cfg, (a, b))

        # program: another WRITE count has the same pipeline identity and input sizes
        longer = program(out=("out", 2, Access.WRITE, DType.U32, 2 * N))
        assert backend.pipeline_identity(longer) == backend.pipeline_identity(BASE)
        outputs = backend.dispatch(longer, _with_sizes(N, N)).result()
        assert template_of(backend) is not base
        _check_template(template_of(backend), longer, cfg, (N, N))
        assert outputs[0].shape == (2 * N,)

        # pipeline: the same program, config and sizes through a pipeline of another policy
        strict = backend.compile(BASE, DispatchConfig(ulp_budget=1))
        with pytest.raises(InvalidProgram, match="another ulp_budget"):
            strict.dispatch(_with_sizes(N, N), cfg)
    finally:
        close(backend)


def test_what_a_template_does_not_depend_on_hits() -> None:
    """Contents, an equal program or config object, the same pipeline rebound: one template."""
    backend = backend_of(TemplateBackend, prefetch=False)
    try:
        cfg = DispatchConfig(label="x")
        backend.dispatch(BASE, _with_sizes(N, N), cfg).result()
        base = template_of(backend)
        pipeline = backend.compile(BASE, cfg)
        other_contents = [np.full(N, 9, np.uint32), np.arange(N, dtype=np.uint32)]
        for prog, inputs, config, via in (
            (BASE, other_contents, cfg, None),
            (program(), _with_sizes(N, N), cfg, None),  # an equal program object
            (BASE, _with_sizes(N, N), DispatchConfig(label="x"), None),  # an equal config
            (BASE, _with_sizes(N, N), cfg, pipeline.rebind(program(), cfg)),  # same identity
        ):
            if via is None:
                backend.dispatch(prog, inputs, config).result()
            else:
                via.dispatch(inputs, config).result()
            assert template_of(backend) is base
            assert backend.executor.launches[-1].inputs[0].tolist() == inputs[0].tolist()
    finally:
        close(backend)


# 3. The prefetcher's shape fingerprint ---------------------------------------------------

XOR_CFG = DispatchConfig()


def _prefetcher(backend: Any) -> Prefetcher:
    prefetcher = backend.prefetcher
    assert prefetcher is not None
    return prefetcher


def _steady(backend: Any, prog: Program, inputs: list[np.ndarray], cfg: DispatchConfig) -> None:
    for _ in range(4):
        backend.dispatch_sync(prog, inputs, cfg)


# component of the fingerprint -> (what changes it through a dispatch, or None: see below)
FINGERPRINT_CASES: dict[str, tuple[Program, list[np.ndarray], DispatchConfig] | None] = {
    "identity digest": (program(combine=lambda x, y: x | y), inputs_for(BASE), XOR_CFG),
    "grid": (BASE, inputs_for(BASE), DispatchConfig(grid_override=(1, 1, 1))),
    # The workgroup is the program's or the override's: both are in the identity, so no
    # dispatch changes it alone; `test_the_fingerprint_workgroup_changed_alone` calls
    # the prefetcher with one.
    "workgroup": None,
}


def test_the_fingerprint_has_a_case_for_every_component() -> None:
    from vyre_async import _prefetch as prefetch

    assert len(typing.get_args(prefetch.ShapeFingerprint)) == len(FINGERPRINT_CASES)


def _expect_fp(backend: Any, prog: Program, cfg: DispatchConfig, sizes: tuple[int, ...]) -> Any:
    geometry = plan_dispatch(
        prog, sizes, grid_override=cfg.grid_override, workgroup_override=cfg.workgroup_override
    ).geometry
    return (backend.pipeline_identity(prog, cfg).digest, geometry.grid, geometry.workgroup)


@pytest.mark.parametrize(
    "case",
    [c for c in FINGERPRINT_CASES.values() if c is not None],
    ids=[k for k, c in FINGERPRINT_CASES.items() if c is not None],
)
def test_a_fingerprint_component_changed_alone(
    backends: list[Any], case: tuple[Program, list[np.ndarray], DispatchConfig]
) -> None:
    """After a steady run of the base shape, the changed shape is a scored miss, then predicted."""
    prog, inputs, cfg = case
    backend = backend_of(KeyBackend)
    backends.append(backend)
    prefetcher = _prefetcher(backend)
    backend.compile(prog, cfg)  # ready: only the fingerprint can make it a miss
    _steady(backend, BASE, inputs_for(BASE), XOR_CFG)
    before = prefetcher.stats()

    outputs = backend.dispatch_sync(prog, inputs, cfg)  # predicted: the base shape

    after = prefetcher.stats()
    assert after.predictions == before.predictions + 1
    assert after.hits == before.hits, "a changed shape was scored as the predicted one"
    assert_outputs(outputs, expected(prog, inputs, cfg))
    # The result after the miss: two of the new shape, and the new shape is predicted.
    backend.dispatch_sync(prog, inputs, cfg)
    assert prefetcher.predicted == _expect_fp(backend, prog, cfg, (N, N))
    assert prefetcher.predicted != _expect_fp(backend, BASE, XOR_CFG, (N, N))


def test_the_fingerprint_workgroup_changed_alone(backends: list[Any]) -> None:
    backend = backend_of(KeyBackend)
    backends.append(backend)
    prefetcher = _prefetcher(backend)
    _steady(backend, BASE, inputs_for(BASE), XOR_CFG)
    pipeline = backend.compile(BASE)
    grid, workgroup = prefetcher.predicted[1:]  # type: ignore[index]
    other = LaunchGeometry(grid=grid, workgroup=(workgroup[0] // 2, 1, 1))
    pending = backend.dispatch(BASE, inputs_for(BASE))  # (a pending to annotate)
    pending.result()
    before = prefetcher.stats()

    prefetcher.observe(pipeline, other, True, pending)

    after = prefetcher.stats()
    assert (after.predictions, after.hits) == (before.predictions + 1, before.hits)
    prefetcher.observe(pipeline, other, True, pending)
    assert prefetcher.predicted == (pipeline.identity.digest, grid, other.workgroup)


@pytest.mark.parametrize(
    "change",
    ["contents", "label", "timeout", "an equal program"],
)
def test_what_the_fingerprint_does_not_depend_on_hits(backends: list[Any], change: str) -> None:
    backend = backend_of(KeyBackend)
    backends.append(backend)
    prefetcher = _prefetcher(backend)
    _steady(backend, BASE, inputs_for(BASE), XOR_CFG)
    before = prefetcher.stats()
    prog, inputs, cfg = BASE, inputs_for(BASE), XOR_CFG
    if change == "contents":
        inputs = [np.full(N, 7, np.uint32), np.arange(N, dtype=np.uint32)]
    elif change == "label":
        cfg = DispatchConfig(label="other")
    elif change == "timeout":
        cfg = DispatchConfig(timeout=30.0)
    else:
        prog = program()

    outputs = backend.dispatch_sync(prog, inputs, cfg)

    after = prefetcher.stats()
    assert (after.predictions, after.hits) == (before.predictions + 1, before.hits + 1)
    assert_outputs(outputs, expected(prog, inputs, cfg))
