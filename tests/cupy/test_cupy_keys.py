"""The CUDA backend's cache keys, field by field (issue 28, tests by method), on the fake device.

Each key gets a base case, then one case per input changed alone: an input
that changes what runs must miss (an NVRTC compile, a new launch template, a
new graph capture) and the result after the miss must be right; an input that
changes nothing must hit. Each table is checked against the code (the fields
of `DeviceInfo` and `BindingPlan`, the names the fingerprints read, the arity
of the graph key), so an input added later without a case fails here.

1. the pipeline identity as the device and compiler make it: `DeviceInfo`
   (the probe) through ``device_fingerprint()``, the compiler fingerprint's
   parts (NVRTC version and options, the target, the code generator, the
   prelude), the backend's version;
2. the kernel's launch templates (`vyre_cupy.launch.template_for`: by buffer counts);
3. the captured CUDA graphs (`vyre_cupy.batch.graph_for`: counts, grid,
   workgroup, iterations) — a mutation sample dropped one of these and the
   suite let it through;
4. the launch shape a batch must share (`vyre_cupy.batch.batch_obstacle`).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import vyre_cupy.backend
import vyre_cupy.compile
import vyre_cupy.device
from tests.cupy.device_programs import accumulate
from tests.cupy.fake_cupy import FakeDevice
from vyre_async import DiskPipelineCache, DispatchConfig, VyreBackend
from vyre_async._execution import choose_execution_mode, requested_mode
from vyre_async._pipeline import CompiledPipeline, Launch
from vyre_async._plan import BindingPlan, LaunchGeometry
from vyre_async.ir import Program
from vyre_async.programs import elementwise_xor
from vyre_cupy import CupyExecutor, create_backend
from vyre_cupy.batch import batch_obstacle, enqueue_replay, graph_for
from vyre_cupy.device import DeviceInfo
from vyre_cupy.kernel import CudaKernel
from vyre_cupy.launch import template_for
from vyre_reference import execute

MISS, HIT = "miss", "hit"
XOR = elementwise_xor(64)


def shutdown(backend: VyreBackend) -> None:
    anyio.run(backend.shutdown)


def xor_inputs(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 2**32, n, dtype=np.uint32) for _ in range(2)]


def assert_outputs(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def reference(prog: Program, inputs: list[np.ndarray], cfg: DispatchConfig) -> list[np.ndarray]:
    return execute(
        prog,
        inputs,
        grid_override=cfg.grid_override,
        workgroup_override=cfg.workgroup_override,
        fixpoint_iterations=cfg.iterations,
    )


@pytest.fixture(scope="module")
def backend(fake: FakeDevice) -> Iterator[VyreBackend]:
    made = create_backend(disk_cache=None, prefetch=False)
    yield made
    shutdown(made)


# 1. The pipeline identity from the device and the compiler --------------------------------


def _modules() -> tuple[Any, Any, Any]:
    """The fake ``cupy``, its runtime and NVRTC, as the probe imports them."""
    cupy = sys.modules["cupy"]
    return cupy, cupy.cuda.runtime, sys.modules["cupy_backends.cuda.libs.nvrtc"]


def _properties(**changes: object) -> Callable[[pytest.MonkeyPatch], dict[str, Any]]:
    def patch(mp: pytest.MonkeyPatch) -> dict[str, Any]:
        _, runtime, _ = _modules()
        props = {**runtime.getDeviceProperties(0), **changes}
        mp.setattr(runtime, "getDeviceProperties", lambda ordinal: dict(props))
        return {}

    return patch


def _set(where: Callable[[], Any], name: str, value: object) -> Callable[..., dict[str, Any]]:
    def patch(mp: pytest.MonkeyPatch) -> dict[str, Any]:
        mp.setattr(where(), name, value)
        return {}

    return patch


def _second_device(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    mp.setattr(_modules()[1], "getDeviceCount", lambda: 2)
    return {"device": 1}


def _fewer_multiprocessors(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    cupy = _modules()[0]
    make = cupy.cuda.Device

    def device(ordinal: int = 0) -> Any:
        found = make(ordinal)
        return types.SimpleNamespace(
            id=found.id, attributes={**found.attributes, "MultiProcessorCount": 66}
        )

    mp.setattr(cupy.cuda, "Device", device)
    return {}


def _options(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    # An edit of NVRTC_OPTIONS in compile.py: every module that imported it sees it.
    options = (*vyre_cupy.compile.NVRTC_OPTIONS, "-lineinfo")
    mp.setattr(vyre_cupy.compile, "NVRTC_OPTIONS", options)
    mp.setattr(vyre_cupy.backend, "NVRTC_OPTIONS", options)
    return {}


Patch = Callable[[pytest.MonkeyPatch], dict[str, Any]]

# field of DeviceInfo -> [(case, patch, verdict)]
DEVICE_CASES: dict[str, list[tuple[str, Patch, str]]] = {
    "ordinal": [("a second device of the same model", _second_device, HIT)],
    "name": [("another model", _properties(name=b"Emulated other (CPU)"), MISS)],
    "compute_capability": [("sm_89", _properties(major=8, minor=9), MISS)],
    "total_memory": [("more memory", _properties(totalGlobalMem=1 << 35), HIT)],
    "attributes": [("fewer SMs", _fewer_multiprocessors, HIT)],
    "driver_version": [
        ("driver 13.1", _set(lambda: _modules()[1], "driverGetVersion", lambda: 13010), MISS)
    ],
    "runtime_version": [
        ("runtime 13.1", _set(lambda: _modules()[1], "runtimeGetVersion", lambda: 13010), MISS)
    ],
    "cupy_version": [("cupy 14", _set(lambda: _modules()[0], "__version__", "14.0.0+fake"), MISS)],
    "nvrtc_version": [
        ("nvrtc 13.1", _set(lambda: _modules()[2], "getVersion", lambda: (13, 1)), MISS)
    ],
    "nvrtc_archs": [
        # Only through the target: without sm_90 it compiles PTX for compute_89 ...
        (
            "no sm_90",
            _set(lambda: _modules()[2], "getSupportedArchs", lambda: (75, 80, 86, 89)),
            MISS,
        ),
        # ... while one more architecture leaves the target (and the code) as it was.
        (
            "one more arch",
            _set(
                lambda: _modules()[2],
                "getSupportedArchs",
                lambda: (75, 80, 86, 89, 90, 100, 103, 120),
            ),
            HIT,
        ),
    ],
}

# module constant the compiler fingerprint reads -> [(case, patch, verdict)]
COMPILER_CASES: dict[str, list[tuple[str, Patch, str]]] = {
    "NVRTC_OPTIONS": [("another option", _options, MISS)],
    "CODEGEN_VERSION": [
        (
            "codegen bumped",
            _set(
                lambda: vyre_cupy.backend,
                "CODEGEN_VERSION",
                vyre_cupy.backend.CODEGEN_VERSION + ".1",
            ),
            MISS,
        )
    ],
    "PRELUDE_DIGEST": [
        ("prelude edited", _set(lambda: vyre_cupy.backend, "PRELUDE_DIGEST", "0" * 16), MISS)
    ],
}

# What the backend object adds: its version (in the identity); settings that change no code.
BACKEND_CASES: list[tuple[str, Patch, str]] = [
    ("backend version", _set(lambda: CupyExecutor, "version", "9.9.9"), MISS),
    ("fewer streams", lambda mp: {"streams": 2}, HIT),
    ("no prefetcher", lambda mp: {"prefetch": False}, HIT),
]


def _names_read(function: Any) -> set[str]:
    """Attribute and global names a function's source reads."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    return names | {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}


def test_the_identity_has_a_case_for_every_device_and_compiler_input() -> None:
    fields = {f.name for f in dataclasses.fields(DeviceInfo)}
    assert set(DEVICE_CASES) == fields
    # What the fingerprints read: every DeviceInfo field they read is a miss case ...
    read = _names_read(DeviceInfo.fingerprint.fget) | _names_read(CupyExecutor.compiler_fingerprint)
    misses = {name for name, cases in DEVICE_CASES.items() if any(v == MISS for *_, v in cases)}
    assert read & fields == misses - {"nvrtc_archs"}  # (the archs reach it as the target)
    assert "_target" in read
    # ... and every module constant they read has its cases.
    constants = {name for name in read if name.isupper()}
    assert constants == set(COMPILER_CASES)


TABLE = [
    pytest.param(field, patch, verdict, id=f"{field}: {name}")
    for field, cases in {**DEVICE_CASES, **COMPILER_CASES, "backend": BACKEND_CASES}.items()
    for name, patch, verdict in cases
]


#: The fingerprint(s) each input of the identity reaches. The compiler fingerprint
#: reads the target (``-arch``), which `CupyExecutor` chooses from the compute
#: capability and NVRTC's architectures.
FINGERPRINT_OF: dict[str, set[str]] = {
    "name": {"device"},
    "compute_capability": {"device", "compiler"},
    "driver_version": {"device"},
    "runtime_version": {"device"},
    "cupy_version": {"device"},
    "nvrtc_version": {"compiler"},
    "nvrtc_archs": {"compiler"},
    "NVRTC_OPTIONS": {"compiler"},
    "CODEGEN_VERSION": {"compiler"},
    "PRELUDE_DIGEST": {"compiler"},
}
TARGET_INPUTS = {"compute_capability", "nvrtc_archs"}


def test_each_fingerprint_reads_the_inputs_it_is_said_to() -> None:
    fields = {f.name for f in dataclasses.fields(DeviceInfo)}
    device = _names_read(DeviceInfo.fingerprint.fget) & fields
    compiler = _names_read(CupyExecutor.compiler_fingerprint) & (fields | set(COMPILER_CASES))
    assert device == {f for f, parts in FINGERPRINT_OF.items() if "device" in parts}
    assert compiler | TARGET_INPUTS == {
        f for f, parts in FINGERPRINT_OF.items() if "compiler" in parts
    }
    assert "choose_target(info.compute_capability, info.nvrtc_archs)" in inspect.getsource(
        CupyExecutor.__init__
    )


@pytest.mark.parametrize(("field", "patch", "verdict"), TABLE)
def test_a_device_or_compiler_input_changed_alone(
    fake: FakeDevice,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    field: str,
    patch: Patch,
    verdict: str,
) -> None:
    first = create_backend(disk_cache=DiskPipelineCache(tmp_path), prefetch=False)
    try:
        first.compile(XOR)
        before = {"device": first.device_fingerprint(), "compiler": first.compiler_fingerprint()}
        kwargs = {"prefetch": False, **patch(monkeypatch)}
        other = create_backend(disk_cache=DiskPipelineCache(tmp_path), **kwargs)
        try:
            compiles = fake.compiles
            pipeline = other.compile(XOR)
            if verdict == MISS:
                assert (pipeline.source, fake.compiles) == ("compiled", compiles + 1)
                assert pipeline.identity != first.compile(XOR).identity
                assert DiskPipelineCache(tmp_path).info().entries == 2
            else:
                assert (pipeline.source, fake.compiles) == ("disk", compiles)
                assert pipeline.identity == first.compile(XOR).identity
            # The key's parts (public): each fingerprint follows the fields it reads.
            after = {"device": other.device_fingerprint(), "compiler": other.compiler_fingerprint()}
            changed = {name for name in before if after[name] != before[name]}
            if verdict == HIT:
                assert not changed
            elif field != "backend":
                assert changed == FINGERPRINT_OF[field]
            inputs = xor_inputs(64)
            assert_outputs(other.dispatch(XOR, inputs).result(), [inputs[0] ^ inputs[1]])
        finally:
            shutdown(other)
    finally:
        shutdown(first)


# 2. Launch templates: per kernel, by the plan's buffer counts -----------------------------

# field of BindingPlan -> verdict when it alone differs between two launches of one kernel
TEMPLATE_CASES: dict[str, str] = {
    "counts": MISS,  # the arena layout, vy_lens, the readback all follow them
    "geometry": HIT,  # the grid is a launch argument, not part of the arena
}
# Fields that never differ alone on one kernel: the programs of one kernel have the same
# buffers and differ only in counts, so these follow the program and the counts.
TEMPLATE_DERIVED = {"program", "inputs", "outputs", "bytes_in", "bytes_out"}


def test_the_template_has_a_case_for_every_plan_field() -> None:
    fields = {f.name for f in dataclasses.fields(BindingPlan)}
    assert set(TEMPLATE_CASES) | TEMPLATE_DERIVED == fields
    assert not set(TEMPLATE_CASES) & TEMPLATE_DERIVED


def _templates(pipeline: CompiledPipeline) -> dict[tuple[int, ...], Any]:
    kernel = pipeline.native
    assert isinstance(kernel, CudaKernel)
    return kernel.templates


def test_a_template_input_changed_alone(backend: VyreBackend) -> None:
    prog = elementwise_xor(96)  # a size no other test of this module uses
    pipeline = backend.compile(prog)
    base_inputs = xor_inputs(96)
    assert_outputs(pipeline.dispatch(base_inputs).result(), [base_inputs[0] ^ base_inputs[1]])
    templates = _templates(pipeline)  # (the kernel of every xor of this module's backend)
    base = templates[(96, 96, 96)]
    before = set(templates)
    assert (40, 40, 96) not in before

    # counts: shorter inputs (the output keeps its 96 elements)
    short = xor_inputs(40, seed=1)
    cfg = DispatchConfig()
    assert_outputs(pipeline.dispatch(short).result(), reference(prog, short, cfg))
    assert set(templates) == before | {(40, 40, 96)}

    # geometry: another grid over the same counts is the same template
    one = DispatchConfig(grid_override=(1, 1, 1))  # 64 of the 96 lanes
    outputs = pipeline.dispatch(base_inputs, one).result()
    assert_outputs(outputs, reference(prog, base_inputs, one))
    assert not outputs[0][64:].any()
    # what does not change the template: the contents, a label, a timeout
    other = xor_inputs(96, seed=2)
    labelled = DispatchConfig(label="x", timeout=30.0)
    assert_outputs(pipeline.dispatch(other, labelled).result(), [other[0] ^ other[1]])
    assert set(templates) == before | {(40, 40, 96)}
    assert templates[(96, 96, 96)] is base


def test_templates_are_per_kernel(backend: VyreBackend) -> None:
    """The counts are the whole key only within one kernel: another kernel has its own."""
    xor = backend.compile(elementwise_xor(48))
    acc = backend.compile(accumulate())
    x = np.arange(48, dtype=np.uint32)
    assert_outputs(xor.dispatch([x, x]).result(), [np.zeros(48, np.uint32)])
    outputs = acc.dispatch([x, np.ones(48, np.uint32)]).result()
    assert_outputs(outputs, [1 + 3 * x])
    assert _templates(xor) is not _templates(acc)


# 3. Captured CUDA graphs: counts, grid, workgroup, iterations ------------------------------

# component of the graph key -> (program, base config, changed config, changed input size)
GRAPH_CASES: dict[str, tuple[Program, DispatchConfig, DispatchConfig, int] | None] = {
    "counts": (elementwise_xor(200), DispatchConfig(), DispatchConfig(), 120),
    "grid": (elementwise_xor(200), DispatchConfig(), DispatchConfig(grid_override=(2, 1, 1)), 200),
    # The workgroup is compiled into the pipeline identity (the program's or the
    # override's): no dispatch changes it alone; test_the_graph_workgroup_... does.
    "workgroup": None,
    "iterations": (accumulate(), DispatchConfig(), DispatchConfig(fixpoint_iterations=3), 200),
}


def _batch_inputs(prog: Program, n: int, items: int, seed: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[rng.integers(0, 1000, n, dtype=np.uint32) for _ in prog.inputs] for _ in range(items)]


def _replay(
    pipeline: CompiledPipeline, batch: list[list[np.ndarray]], cfg: DispatchConfig
) -> list[list[np.ndarray]]:
    results = [p.result() for p in pipeline.dispatch_batch(batch, cfg, mode="command_reuse")]
    for pending in pipeline.dispatch_batch(batch[:1], cfg, mode="command_reuse"):
        assert pending.record.attributes["vyre.batch.mode"] == "command_reuse"
    return results


def test_the_graph_key_has_a_case_for_every_component(backend: VyreBackend) -> None:
    pipeline = backend.compile(elementwise_xor(72))
    _replay(pipeline, _batch_inputs(pipeline.program, 72, 2, 0), DispatchConfig())
    kernel = pipeline.native
    assert isinstance(kernel, CudaKernel)
    assert kernel.graphs
    assert {len(key) for key in kernel.graphs} == {len(GRAPH_CASES)}


@pytest.mark.parametrize(
    "case",
    [c for c in GRAPH_CASES.values() if c is not None],
    ids=[name for name, c in GRAPH_CASES.items() if c is not None],
)
def test_a_graph_key_component_changed_alone(
    fake: FakeDevice,
    backend: VyreBackend,
    case: tuple[Program, DispatchConfig, DispatchConfig, int],
) -> None:
    prog, base_cfg, changed, n = case
    pipeline = backend.compile(prog, base_cfg)
    kernel = pipeline.native
    assert isinstance(kernel, CudaKernel)
    kernel.graphs.clear()  # (the module's backend is shared: start from no graph)
    base_batch = _batch_inputs(prog, 200, 3, 1)
    captures = fake.captures
    for inputs, outputs in zip(base_batch, _replay(pipeline, base_batch, base_cfg), strict=True):
        assert_outputs(outputs, reference(prog, inputs, base_cfg))
    assert fake.captures == captures + 1

    batch = _batch_inputs(prog, n, 3, 2)
    results = _replay(pipeline, batch, changed)

    assert fake.captures == captures + 2, "a changed launch shape replayed another's graph"
    assert len(kernel.graphs) == 2
    for inputs, outputs in zip(batch, results, strict=True):
        assert_outputs(outputs, reference(prog, inputs, changed))


def test_the_graph_workgroup_changed_alone(fake: FakeDevice, backend: VyreBackend) -> None:
    """A launch of one kernel with another block shape gets its own graph (and replays right).

    No dispatch can make it (see GRAPH_CASES), so the launch is planned and
    then given another workgroup, and replayed through `vyre_cupy.batch`.
    """
    prog = elementwise_xor(256)
    pipeline = backend.compile(prog)
    kernel = pipeline.native
    assert isinstance(kernel, CudaKernel)
    kernel.graphs.clear()
    inputs = xor_inputs(256, seed=3)
    _replay(pipeline, [inputs], DispatchConfig())
    captures = fake.captures
    launch = pipeline.front.plan(pipeline, inputs, None)
    grid = launch.plan.geometry.grid
    narrow = Launch(
        pipeline,
        dataclasses.replace(launch.plan, geometry=LaunchGeometry(grid=grid, workgroup=(32, 1, 1))),
        launch.inputs,
        launch.config,
        launch.pending,
        launch.completer,
        0.0,
        launch.template,
        shape=launch.shape,
    )

    graph = graph_for(backend.executor.device_context, kernel, narrow)
    assert fake.captures == captures + 1
    assert graph is not graph_for(backend.executor.device_context, kernel, launch)
    enqueue_replay(backend.executor.device_context, [narrow], kernel)

    want = execute(prog, inputs, grid_override=grid, workgroup_override=(32, 1, 1))
    assert_outputs(launch.pending.result(), want)
    assert not want[0][128:].any()  # 4 blocks of 32 lanes


@pytest.mark.parametrize(
    "changed",
    [
        DispatchConfig(label="x"),
        DispatchConfig(timeout=30.0),
        DispatchConfig(max_output_bytes=1 << 20),
        DispatchConfig(profile="p"),
    ],
    ids=["label", "timeout", "max_output_bytes", "profile"],
)
def test_what_the_graph_does_not_depend_on_hits(
    fake: FakeDevice, backend: VyreBackend, changed: DispatchConfig
) -> None:
    prog = elementwise_xor(160)
    pipeline = backend.compile(prog)
    _replay(pipeline, _batch_inputs(prog, 160, 2, 4), DispatchConfig())
    captures, replays = fake.captures, fake.replays
    batch = _batch_inputs(prog, 160, 3, 5)  # other contents too

    results = _replay(pipeline, batch, changed)

    assert fake.captures == captures
    assert fake.replays == replays + 4
    for inputs, outputs in zip(batch, results, strict=True):
        assert_outputs(outputs, [inputs[0] ^ inputs[1]])


# 4. The launch shape a batch shares -----------------------------------------------------


def test_a_batch_of_launches_differing_in_one_shape_input_runs_plain(
    backend: VyreBackend,
) -> None:
    """``batch_obstacle``'s shape (counts, geometry, iterations): each alone makes it mixed.

    A batch that shares one graph (or one persistent launch) must share the
    launch shape; launches planned with different configs are refused as
    ``mixed_shapes`` and run plain, each with its own result.
    """
    prog = accumulate()
    pipeline = backend.compile(prog)
    kernel = pipeline.native
    assert isinstance(kernel, CudaKernel)
    n = 64
    changes: dict[str, tuple[int, DispatchConfig, str | None]] = {
        "counts": (32, DispatchConfig(), "mixed_shapes"),
        "grid": (n, DispatchConfig(grid_override=(2, 1, 1)), "mixed_shapes"),
        "iterations": (n, DispatchConfig(fixpoint_iterations=2), "mixed_shapes"),
        "label and timeout": (n, DispatchConfig(label="x", timeout=30.0), None),
    }
    decision = requested_mode(
        backend,
        choose_execution_mode(backend, batch_size=2, repeats=2),
        "command_reuse",
        DispatchConfig(),
    )
    for name, (size, cfg, reason) in changes.items():
        batch = [
            ([np.full(n, 2, np.uint32), np.arange(n, dtype=np.uint32)], DispatchConfig()),
            ([np.full(size, 5, np.uint32), np.arange(size, dtype=np.uint32)], cfg),
        ]
        launches = [pipeline.front.plan(pipeline, inputs, c) for inputs, c in batch]
        assert batch_obstacle(launches, "command_reuse", kernel) == reason, name
        assert batch_obstacle(launches, "persistent", kernel) == reason, name

        backend.executor.enqueue_batch(launches, decision)

        for (inputs, c), launch in zip(batch, launches, strict=True):
            assert_outputs(launch.pending.result(), reference(prog, inputs, c))
            attributes = launch.pending.record.attributes or {}
            assert attributes.get("vyre.batch.mode.reason") == reason, name
        if reason is None:
            assert template_for(kernel, launches[0].plan) is template_for(kernel, launches[1].plan)
