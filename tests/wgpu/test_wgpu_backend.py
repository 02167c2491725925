"""The wgpu backend on a real adapter (lavapipe in CI): selection, limits, long loops,
batching, wide grids, caches, errors and the event loop's responsiveness.

The contract suite and the conformance corpus run on ``wgpu`` too (it is a registered
backend: `vyre_async.testing` parametrises over every one); these tests cover what is
particular to WebGPU and to lavapipe.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from vyre_async import DiskPipelineCache, DispatchConfig, VyreBackend, acquire_backend
from vyre_async.errors import (
    BackendError,
    DispatchTimeout,
    UnsupportedFeature,
)
from vyre_async.ir import (
    Access,
    Assign,
    Barrier,
    Bin,
    BufferDecl,
    Cast,
    DType,
    If,
    Let,
    Load,
    Loop,
    Program,
    Return,
    Store,
    Var,
    f32,
    gid,
    lid,
    nwg,
    u32,
    wgid,
)
from vyre_async.programs import elementwise_xor
from vyre_reference import reference_backend

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    """asyncio only: the contract suite runs ``wgpu`` under trio as well."""
    return "asyncio"


def _spin(lanes: int = 1) -> Program:
    """``out[l] = sum(range(n[l]))`` per lane: as many loop iterations as you like."""
    return Program(
        [
            BufferDecl("n", 0, Access.READ, DType.U32, lanes),
            BufferDecl("out", 1, Access.WRITE, DType.U32, lanes),
        ],
        1,
        [
            Let("acc", u32(0)),
            Loop("i", u32(0), Load("n", gid(0)), [Assign("acc", Var("acc") + Var("i"))]),
            Store("out", gid(0), Var("acc")),
        ],
        op_id="test.spin",
    )


def _count_submits(backend: VyreBackend, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the executor's own submissions: each entry is how many command buffers.

    wgpu-py's ``map_sync`` submits an empty command buffer of its own before mapping
    (wgpu-native issue 305); those are not counted.
    """
    import threading

    import wgpu

    device = backend.executor._device
    queue_type = type(device.queue)
    buffer_type = type(device.create_buffer(size=4, usage=wgpu.BufferUsage.MAP_READ))
    real_submit, real_map = queue_type.submit, buffer_type.map_sync
    mapping = threading.local()
    submits: list[int] = []

    def submit(self: Any, command_buffers: Any) -> Any:
        if not getattr(mapping, "on", False):
            submits.append(len(command_buffers))
        return real_submit(self, command_buffers)

    def map_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        mapping.on = True
        try:
            return real_map(self, *args, **kwargs)
        finally:
            mapping.on = False

    monkeypatch.setattr(queue_type, "submit", submit)
    monkeypatch.setattr(buffer_type, "map_sync", map_sync)
    return submits


# Selection and limits ----------------------------------------------------------------


async def test_lavapipe_is_a_cpu_device_with_the_adapters_limits(
    wgpu_backend: VyreBackend, wgpu_adapter: dict[str, str]
) -> None:
    """Limits come from the adapter, and a CPU adapter never passes for a GPU."""
    caps = wgpu_backend.capabilities()
    assert wgpu_adapter["backend_type"] in ("Vulkan", "Metal", "D3D12")
    limits = dict(wgpu_backend.executor._adapter.limits)  # the adapter it chose
    if wgpu_adapter["adapter_type"] == "CPU":
        assert caps.cpu_device
        assert "CPU adapter" in caps.device_name
    assert caps.max_workgroup_lanes == limits["max-compute-invocations-per-workgroup"]
    assert caps.max_storage_buffer_bytes == limits["max-storage-buffer-binding-size"]
    assert caps.max_workgroup_memory_bytes == limits["max-compute-workgroup-storage-size"]
    assert not caps.async_compute  # one queue: the arm policies serialise
    assert caps.max_grid_size is None  # wider grids are split, not refused


def _fake_adapters(monkeypatch: pytest.MonkeyPatch, adapters: list[Any]) -> None:
    import wgpu

    monkeypatch.setattr(wgpu.gpu, "enumerate_adapters_sync", lambda: adapters)


class _Adapter:
    def __init__(self, **info: str) -> None:
        self.info = {"device": "fake", **info}


def test_no_adapter_names_the_driver_package(
    wgpu_adapter: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vyre_wgpu import create_backend, probe

    _fake_adapters(monkeypatch, [])
    for build in (probe, create_backend):
        with pytest.raises(UnsupportedFeature, match="no Vulkan, Metal or D3D12 adapter") as info:
            build()
        assert "Fix: install a Vulkan driver" in str(info.value)
        assert "apt-get install mesa-vulkan-drivers libvulkan1" in str(info.value)


def test_an_opengl_adapter_is_never_used(
    wgpu_adapter: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mesa's GL gets integer remainders wrong: wgpu's GL fallback is not an option."""
    from vyre_wgpu import select_adapter

    _fake_adapters(monkeypatch, [_Adapter(backend_type="OpenGL", adapter_type="CPU")])
    with pytest.raises(UnsupportedFeature, match=r"adapters seen: fake \(OpenGL, CPU\)"):
        select_adapter()


def test_asking_for_a_gpu_where_there_is_only_a_cpu_adapter(
    wgpu_adapter: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vyre_wgpu import ADAPTER_ENV, select_adapter

    cpu = _Adapter(backend_type="Vulkan", adapter_type="CPU")
    gpu = _Adapter(backend_type="Vulkan", adapter_type="IntegratedGPU")
    _fake_adapters(monkeypatch, [cpu])
    with pytest.raises(UnsupportedFeature, match="no hardware GPU adapter") as info:
        select_adapter("gpu")
    assert f"Fix: set {ADAPTER_ENV}=cpu to run on the CPU adapter" in str(info.value)
    monkeypatch.setenv(ADAPTER_ENV, "gpu")
    with pytest.raises(UnsupportedFeature, match="no hardware GPU adapter"):
        select_adapter()
    monkeypatch.setenv(ADAPTER_ENV, "any")
    assert select_adapter() is cpu
    _fake_adapters(monkeypatch, [cpu, gpu])
    assert select_adapter() is gpu  # hardware first
    assert select_adapter("cpu") is cpu


def test_a_bad_adapter_setting_is_refused(
    wgpu_adapter: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vyre_wgpu import ADAPTER_ENV, select_adapter

    monkeypatch.setenv(ADAPTER_ENV, "fastest")
    with pytest.raises(UnsupportedFeature, match="'fastest' is not an adapter choice") as info:
        select_adapter()
    assert f"Fix: set {ADAPTER_ENV} to gpu, cpu or any" in str(info.value)


def test_without_wgpu_py_the_fix_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from vyre_wgpu import select_adapter

    monkeypatch.setitem(sys.modules, "wgpu", None)
    with pytest.raises(UnsupportedFeature, match="needs wgpu-py") as info:
        select_adapter()
    assert "pip install 'vyre-async[wgpu]'" in str(info.value)


def test_the_registry_acquires_it_by_id_but_never_prefers_it(wgpu_adapter: dict[str, str]) -> None:
    from vyre_async import acquire_preferred_backend

    backend = acquire_backend("wgpu")
    assert backend.id == "wgpu"
    if backend.capabilities().cpu_device:
        assert acquire_preferred_backend(allow_reference=True).id != "wgpu"


def test_mesa_shader_cache_lives_under_vyres_cache_dir(
    wgpu_adapter: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import os

    from vyre_wgpu import select_adapter

    monkeypatch.delenv("MESA_SHADER_CACHE_DIR", raising=False)
    monkeypatch.setenv("VYRE_CACHE_DIR", str(tmp_path))
    select_adapter()
    assert os.environ["MESA_SHADER_CACHE_DIR"] == str(tmp_path / "mesa")
    assert (tmp_path / "mesa").is_dir()
    monkeypatch.setenv("MESA_SHADER_CACHE_DIR", "/somewhere/the/user/chose")
    select_adapter()
    assert os.environ["MESA_SHADER_CACHE_DIR"] == "/somewhere/the/user/chose"


# Long loops on lavapipe ---------------------------------------------------------------


async def test_loops_longer_than_lavapipes_cap_run_exactly_in_slices(
    wgpu_backend: VyreBackend,
) -> None:
    """Lavapipe ends an invocation's loops after 65 535 iterations; sliced shaders resume."""
    counts = np.array([0, 1, 65_535, 65_536, 200_000, 1_000_003, 7, 130_000], np.uint32)
    (out,) = await wgpu_backend.dispatch(_spin(len(counts)), [counts])
    assert out.tolist() == [sum(range(int(n))) % 2**32 for n in counts]


async def test_resumed_lanes_keep_every_variable_and_branch(wgpu_backend: VyreBackend) -> None:
    """Nested loops under an If, with u32/i32/f32/bool variables live across the cut."""
    lanes = 4
    program = Program(
        [
            BufferDecl("n", 0, Access.READ, DType.U32, lanes),
            BufferDecl("out", 1, Access.WRITE, DType.U32, lanes),
            BufferDecl("fout", 2, Access.WRITE, DType.F32, lanes),
            BufferDecl("iout", 3, Access.WRITE, DType.I32, lanes),
        ],
        lanes,
        [
            Let("acc", u32(7)),
            Let("fa", f32(0.5)),
            Let("ia", Cast(DType.I32, u32(3))),
            Let("odd", Bin("ne", Bin("and", gid(0), u32(1)), u32(0))),
            If(
                Bin("lt", gid(0), u32(3)),
                [
                    Loop(
                        "i",
                        u32(0),
                        Load("n", gid(0)),
                        [
                            Let("t", Bin("mul", Var("i"), u32(3))),
                            Loop(
                                "j",
                                u32(0),
                                u32(5),
                                [
                                    Assign("acc", Bin("xor", Var("acc") + Var("t"), Var("j"))),
                                    Assign(
                                        "odd", Bin("ne", Var("odd"), Bin("eq", Var("j"), u32(2)))
                                    ),
                                ],
                            ),
                            Assign("fa", Var("fa") + f32(0.25)),
                            Assign("ia", Bin("sub", Var("ia"), Cast(DType.I32, u32(2)))),
                        ],
                    )
                ],
                [Assign("acc", u32(99))],
            ),
            Store("out", gid(0), Bin("add", Var("acc"), Cast(DType.U32, Var("odd")))),
            Store("fout", gid(0), Var("fa")),
            Store("iout", gid(0), Var("ia")),
        ],
        op_id="test.resume",
    )
    counts = np.array([30_000, 5, 17_000, 50_000], np.uint32)  # up to 180 000 iterations
    got = await wgpu_backend.dispatch(program, [counts])
    reference = reference_backend()
    try:
        want = await reference.dispatch(program, [counts])
    finally:
        await reference.aclose()
    for a, b in zip(got, want, strict=True):
        assert a.tobytes() == b.tobytes()


async def test_a_barrier_program_past_the_cap_fails_instead_of_returning_wrong_outputs(
    wgpu_backend: VyreBackend, wgpu_adapter: dict[str, str]
) -> None:
    if wgpu_adapter["adapter_type"] != "CPU":
        pytest.skip("only lavapipe cuts loops")
    program = Program(
        [
            BufferDecl("n", 0, Access.UNIFORM, DType.U32, 1),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 4),
        ],
        4,
        [
            Let("acc", u32(0)),
            Loop("i", u32(0), Load("n", u32(0)), [Assign("acc", Var("acc") + Var("i"))]),
            Barrier(),
            Store("out", lid(0), Var("acc")),
        ],
    )
    (out,) = await wgpu_backend.dispatch(program, [np.array([1000], np.uint32)])
    assert out.tolist() == [sum(range(1000))] * 4
    with pytest.raises(UnsupportedFeature, match="after 65535 iterations in all") as info:
        await wgpu_backend.dispatch(program, [np.array([70_000], np.uint32)])
    assert "Fix: run it on a hardware adapter" in str(info.value)


async def test_a_long_dispatch_stops_at_its_timeout_between_slices(
    wgpu_backend: VyreBackend, wgpu_adapter: dict[str, str]
) -> None:
    if wgpu_adapter["adapter_type"] != "CPU":
        pytest.skip("a hardware adapter runs the loop unsliced: it cannot be stopped")
    start = time.monotonic()
    with pytest.raises(DispatchTimeout):
        await wgpu_backend.dispatch(
            _spin(), [np.array([4_000_000_000], np.uint32)], DispatchConfig(timeout=0.1)
        )
    assert time.monotonic() - start < 5
    (out,) = await wgpu_backend.dispatch(_spin(), [np.array([10], np.uint32)])
    assert out.tolist() == [45]  # the device thread is free again


async def test_lanes_that_return_do_nothing_more_in_programs_with_barriers(
    wgpu_backend: VyreBackend,
) -> None:
    """A returned lane walks on to meet the barriers, and must neither store again in the
    loop it returned from nor keep turning it (lavapipe would call that a cut loop)."""
    programs = [
        Program(
            [BufferDecl("out", 0, Access.WRITE, DType.U32, 16)],
            4,
            [
                Barrier(),
                Loop(
                    "i",
                    u32(0),
                    u32(4),
                    [
                        Store("out", gid(0) * u32(4) + Var("i"), u32(1)),
                        If(Bin("eq", Var("i"), u32(1)), [Return()]),
                    ],
                ),
            ],
        ),
        Program(
            [BufferDecl("out", 0, Access.WRITE, DType.U32, 4)],
            4,
            [
                Barrier(),
                Loop("i", u32(0), u32(100_000), [If(Bin("eq", Var("i"), u32(0)), [Return()])]),
                Store("out", lid(0), u32(7)),
            ],
        ),
    ]
    reference = reference_backend()
    try:
        for program in programs:
            (want,) = await reference.dispatch(program, [])
            (got,) = await wgpu_backend.dispatch(program, [])
            assert got.tolist() == want.tolist()
    finally:
        await reference.aclose()
    assert want.tolist() == [0, 0, 0, 0]


async def test_f32_arithmetic_on_constants_is_never_folded_or_fused(
    wgpu_backend: VyreBackend,
) -> None:
    """A left operand that is a constant once compiled (a cast of a literal) is as opaque
    as a literal, and ``x * y + z`` rounds twice (no implicit fma contraction)."""
    x = np.array([np.inf, np.nan, -0.0, 1.0, 1 + 2**-12], np.float32)
    z = np.full(5, -(1 + 2**-11), np.float32)
    program = Program(
        [
            BufferDecl("x", 0, Access.READ, DType.F32),
            BufferDecl("z", 1, Access.READ, DType.F32),
            BufferDecl("zero_times", 2, Access.WRITE, DType.F32, 5),
            BufferDecl("mul_add", 3, Access.WRITE, DType.F32, 5),
        ],
        5,
        [
            Store("zero_times", gid(0), Cast(DType.F32, u32(0)) * Load("x", gid(0))),
            Store("mul_add", gid(0), Load("x", gid(0)) * Load("x", gid(0)) + Load("z", gid(0))),
        ],
    )
    zero_times, mul_add = await wgpu_backend.dispatch(program, [x, z])
    assert np.isnan(zero_times[:2]).all()
    assert zero_times[2:].view(np.uint32).tolist() == [0x8000_0000, 0, 0]
    assert mul_add[4] == np.float32(0.0)  # fused: 5.96e-8


# Launches -----------------------------------------------------------------------------


async def test_a_batch_is_one_submission(
    wgpu_backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = wgpu_backend.compile(elementwise_xor(64))
    batch = [[np.full(64, k, np.uint32), np.arange(64, dtype=np.uint32)] for k in range(16)]
    await pipeline.dispatch(batch[0])  # shape planned, buffers pooled
    submits = _count_submits(wgpu_backend, monkeypatch)
    pendings = pipeline.dispatch_batch(batch)
    outputs = [await pending for pending in pendings]
    assert submits == [1]
    for (a, b), (out,) in zip(batch, outputs, strict=True):
        assert out.tolist() == (a ^ b).tolist()


async def test_concurrent_dispatches_share_submissions(
    wgpu_backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dispatches queued while the device thread is busy go out together."""
    xor = elementwise_xor(64)
    a = np.arange(64, dtype=np.uint32)
    await wgpu_backend.dispatch(xor, [a, a])
    submits = _count_submits(wgpu_backend, monkeypatch)
    pendings = [wgpu_backend.dispatch(xor, [a, np.full(64, k, np.uint32)]) for k in range(64)]
    for k, pending in enumerate(pendings):
        assert (await pending)[0].tolist() == (a ^ k).tolist()
    assert len(submits) < 64


async def test_a_grid_wider_than_the_adapter_allows_runs_as_several_launches(
    wgpu_backend: VyreBackend,
) -> None:
    limit = wgpu_backend.executor._limits["max-compute-workgroups-per-dimension"]
    n = (limit + 10) * 2
    program = Program(
        [
            BufferDecl("wg", 0, Access.WRITE, DType.U32, n),
            BufferDecl("grid", 1, Access.WRITE, DType.U32, n),
        ],
        2,
        [Store("wg", gid(0), wgid(0)), Store("grid", gid(0), nwg(0))],
    )
    wg, grid = await wgpu_backend.dispatch(program, [])
    assert wg.tolist() == (np.arange(n) // 2).tolist()
    assert set(grid.tolist()) == {limit + 10}


async def test_a_workgroup_override_gets_its_own_pipeline(wgpu_backend: VyreBackend) -> None:
    program = Program(
        [BufferDecl("out", 0, Access.WRITE, DType.U32, 64)],
        8,
        [Store("out", gid(0), Bin("add", Bin("mul", wgid(0), u32(1000)), lid(0)))],
    )
    for workgroup in (8, 16, 32):
        (out,) = await wgpu_backend.dispatch(
            program, [], DispatchConfig(workgroup_override=workgroup)
        )
        want = [(i // workgroup) * 1000 + i % workgroup for i in range(64)]
        assert out.tolist() == want


async def test_bad_input_is_refused_as_the_reference_refuses_it(wgpu_backend: VyreBackend) -> None:
    """Same error class and code before launch, for every kind of bad call."""
    xor = elementwise_xor(8)
    ok = np.zeros(8, np.uint32)
    invalid = Program(
        [BufferDecl("o", 0, Access.WRITE, DType.U32, 1)], 1, [Store("o", u32(0), Var("x"))]
    )
    calls: list[tuple[Program, list[Any], DispatchConfig | None]] = [
        (xor, [ok], None),  # too few inputs
        (xor, [ok, ok, ok], None),  # too many
        (xor, [ok, np.zeros(8, np.float32)], None),  # wrong dtype
        (_spin(4), [np.zeros(3, np.uint32)], None),  # wrong size for a sized buffer
        (xor, [ok, ok], DispatchConfig(grid_override=(2**31, 1, 1))),  # over 2**32 lanes
        (invalid, [], None),  # undeclared variable
    ]
    reference = reference_backend()
    try:
        for program, inputs, config in calls:
            with pytest.raises(BackendError) as theirs:
                reference.dispatch(program, inputs, config)
            with pytest.raises(BackendError) as ours:
                wgpu_backend.dispatch(program, inputs, config)
            assert type(ours.value) is type(theirs.value), (ours.value, theirs.value)
            assert ours.value.code == theirs.value.code
            assert "\nFix: " in str(ours.value)
    finally:
        await reference.aclose()


async def test_pipelines_come_back_from_the_disk_cache(
    wgpu_adapter: dict[str, str], tmp_path: Path
) -> None:
    """The disk cache keeps the WGSL and its reflection; a new backend builds from them."""
    from vyre_wgpu import create_backend

    program = _spin(3)
    counts = np.array([3, 70_000, 10], np.uint32)
    first = create_backend(prefetch=False, disk_cache=DiskPipelineCache(tmp_path))
    try:
        want = await first.dispatch(program, [counts])
    finally:
        await first.aclose()
    disk = DiskPipelineCache(tmp_path)
    second = create_backend(prefetch=False, disk_cache=disk)
    built: list[Program] = []
    build = second.executor.build_pipeline
    second.executor.build_pipeline = lambda p, c: built.append(p) or build(p, c)  # type: ignore[method-assign]
    try:
        got = await second.dispatch(program, [counts])
    finally:
        await second.aclose()
    assert got[0].tolist() == want[0].tolist() == [3, sum(range(70_000)) % 2**32, 45]
    assert disk.hits == 1 and built == []  # loaded from the WGSL on disk, not generated


# The event loop -----------------------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_the_loop_keeps_ticking_while_a_long_dispatch_runs(
    wgpu_backend: VyreBackend,
) -> None:
    """Submits and read-back maps block (lavapipe): they happen on the device thread."""
    program = _spin()
    n = np.array([1_000_000], np.uint32)
    await wgpu_backend.dispatch(program, [n])  # compiled, and its slicing planned
    ticks = 0
    done = False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            await anyio.sleep(0.001)
            ticks += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        start = time.perf_counter()
        await wgpu_backend.dispatch(program, [n])
        took = time.perf_counter() - start
        done = True
    # About one tick per millisecond while the loop is free; a blocked loop gets 0-2.
    # benchmarks/wgpu_backend.py records the figure; here a wide margin against a loaded machine.
    if took < 0.02:
        pytest.skip(f"the dispatch took {took * 1000:.1f} ms: too short to tell (a fast GPU)")
    assert ticks >= 0.3 * took / 0.001, (ticks, took)
