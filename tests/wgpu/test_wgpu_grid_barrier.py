"""Grid-wide barriers on the wgpu backend: one launch per segment, byte for byte as the
reference (which runs them natively, in lockstep over the whole grid).

WebGPU has no grid barrier, so `vyre_wgpu` runs a `GridBarrier` program as the segments
of `split_at_grid_barriers`, in order, in one command buffer on the same buffers. These
tests compare whole programs with the reference: barriers first and last, six segments,
workgroup memory across a barrier (zero again after it), a reduction across workgroups,
READ_WRITE and WRITE buffers handed from phase to phase, a grid wider than one launch,
fixpoint iterations; then the span's ``vyre.segment`` phases, the disk cache, coalesced
submissions, lavapipe's loop cap and the refusal of ``cooperative=True``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.wgpu.test_wgpu_backend import _count_submits
from vyre_async import (
    DiskPipelineCache,
    DispatchConfig,
    GridBarrier,
    VyreBackend,
    split_at_grid_barriers,
)
from vyre_async.errors import UnsupportedFeature
from vyre_async.ir import (
    Access,
    Assign,
    Atomic,
    Barrier,
    Bin,
    BufferDecl,
    DType,
    Expr,
    If,
    Let,
    Load,
    Loop,
    Program,
    Store,
    Var,
    f32,
    gid,
    i32,
    lid,
    nwg,
    u32,
    wgid,
)
from vyre_async.ir.ops import GRID_BARRIER_OP
from vyre_reference import reference_backend

pytestmark = pytest.mark.anyio

Case = tuple[Program, list[np.ndarray], DispatchConfig | None]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def reference() -> AsyncIterator[VyreBackend]:
    backend = reference_backend()
    try:
        yield backend
    finally:
        await backend.aclose()


async def _same_as_reference(
    wgpu: VyreBackend, reference: VyreBackend, case: Case
) -> list[np.ndarray]:
    program, inputs, config = case
    want = await reference.dispatch(program, inputs, config)
    got = await wgpu.dispatch(program, inputs, config)
    assert len(got) == len(want)
    for index, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, (program.op_id, index)
        assert a.tobytes() == b.tobytes(), (program.op_id, index, a[:16], b[:16])
    return list(got)


def _next(n: int, step: int = 1) -> Expr:
    """The index ``step`` lanes on (wrapping): a value another workgroup wrote."""
    return Bin("mod", gid(0) + u32(step), u32(n))


def _first_and_last() -> Case:
    n = 32
    program = Program(
        [
            BufferDecl("x", 0, Access.READ, DType.U32, n),
            BufferDecl("out", 1, Access.WRITE, DType.U32, n),
        ],
        8,
        [GridBarrier(), Store("out", gid(0), Load("x", gid(0)) * u32(3)), GridBarrier()],
        op_id="gb.first_and_last",
    )
    return program, [np.arange(n, dtype=np.uint32) + 5], None


def _six_segments(n: int = 64) -> Program:
    """Six phases, each reading what the last wrote in another workgroup: a READ_WRITE
    buffer ``a`` and a WRITE buffer ``b`` handed back and forth."""
    body: list[Any] = []
    for phase in range(6):
        src, dst = ("a", "b") if phase % 2 == 0 else ("b", "a")
        if phase:
            body.append(GridBarrier())
        body.append(
            Store(dst, gid(0), Load(src, _next(n, phase + 1)) * u32(3) + u32(phase) + gid(0))
        )
    return Program(
        [
            BufferDecl("a", 0, Access.READ_WRITE, DType.U32, n),
            BufferDecl("b", 1, Access.WRITE, DType.U32, n),
        ],
        4,
        body,
        op_id="gb.six",
    )


def _workgroup_memory() -> Case:
    """Workgroup memory written before a grid barrier reads zero after it."""
    n, wg = 32, 8
    program = Program(
        [
            BufferDecl("x", 0, Access.READ, DType.U32, n),
            BufferDecl("before", 1, Access.WRITE, DType.U32, n),
            BufferDecl("after", 2, Access.WRITE, DType.U32, n),
            BufferDecl("counted", 3, Access.WRITE, DType.U32, n),
            BufferDecl("sh", 4, Access.WORKGROUP, DType.U32, wg),
            BufferDecl("tally", 5, Access.WORKGROUP, DType.U32, 1),
        ],
        wg,
        [
            Store("sh", lid(0), Load("x", gid(0)) + u32(1)),
            Let("old", Atomic("add", "tally", u32(0), u32(5))),
            Barrier(),
            Store("before", gid(0), Load("sh", Bin("mod", lid(0) + u32(1), u32(wg)))),
            GridBarrier(),
            Store("after", gid(0), Load("sh", lid(0))),  # zero again
            Let("old", Atomic("add", "tally", u32(0), u32(1))),
            Barrier(),
            Store("counted", gid(0), Load("tally", u32(0)) * u32(100) + Var("old") * u32(0)),
        ],
        op_id="gb.workgroup_memory",
    )
    return program, [np.arange(n, dtype=np.uint32) * 7], None


def _reduction() -> Case:
    """A sum over every workgroup: per-workgroup partials, then one lane sums them, then
    every lane reads the total (three phases; f32 partials summed in a fixed order)."""
    n, wg = 512, 64
    groups = n // wg
    tree: list[Any] = []
    stride = wg // 2
    while stride:
        tree += [
            If(
                lid(0).lt(u32(stride)),
                [Store("sh", lid(0), Load("sh", lid(0)) + Load("sh", lid(0) + u32(stride)))],
            ),
            Barrier(),
        ]
        stride //= 2
    program = Program(
        [
            BufferDecl("x", 0, Access.READ, DType.F32, n),
            BufferDecl("partial", 1, Access.WRITE, DType.F32, groups),
            BufferDecl("total", 2, Access.READ_WRITE, DType.F32, 1),
            BufferDecl("share", 3, Access.WRITE, DType.F32, n),
            BufferDecl("sh", 4, Access.WORKGROUP, DType.F32, wg),
        ],
        wg,
        [
            Store("sh", lid(0), Load("x", gid(0))),
            Barrier(),
            *tree,
            If(lid(0).eq(u32(0)), [Store("partial", wgid(0), Load("sh", u32(0)))]),
            GridBarrier(),
            If(
                gid(0).eq(u32(0)),
                [
                    Let("acc", f32(0.0)),
                    Loop(
                        "i", u32(0), nwg(0), [Assign("acc", Var("acc") + Load("partial", Var("i")))]
                    ),
                    Store("total", u32(0), Var("acc")),
                ],
            ),
            GridBarrier(),
            Store("share", gid(0), Load("x", gid(0)) / Load("total", u32(0))),
        ],
        op_id="gb.reduction",
    )
    x = np.random.default_rng(7).random(n, dtype=np.float32)
    return program, [x, np.array([-1.5], np.float32)], None


def _handover() -> Case:
    """READ_WRITE and WRITE buffers written in one phase are read, reversed (so by lanes
    of other workgroups), in a later one; a phase in between touches neither. No lane
    reads within a phase an element another lane of it writes."""
    n = 48
    program = Program(
        [
            BufferDecl("rw", 0, Access.READ_WRITE, DType.I32, n),
            BufferDecl("w", 1, Access.WRITE, DType.U32, n),
            BufferDecl("out", 2, Access.WRITE, DType.U32, n),
            BufferDecl("mid", 3, Access.WRITE, DType.U32, n),
        ],
        16,
        [
            Store("rw", gid(0), Load("rw", gid(0)) * i32(5) - i32(7)),
            Store("w", gid(0), gid(0) * gid(0)),
            GridBarrier(),
            Store("mid", gid(0), nwg(0)),
            GridBarrier(),
            Store(
                "out",
                gid(0),
                Load("rw", u32(n - 1) - gid(0)).cast(DType.U32) ^ Load("w", u32(n - 1) - gid(0)),
            ),
            GridBarrier(),
            Store(
                "rw",
                gid(0),
                Load("w", u32(n - 1) - gid(0)).cast(DType.I32)
                - Load("out", gid(0)).cast(DType.I32),
            ),
        ],
        op_id="gb.handover",
    )
    return program, [np.arange(n, dtype=np.int32) * -3 + 11], None


def _only_barriers() -> Case:
    program = Program(
        [BufferDecl("out", 0, Access.WRITE, DType.U32, 4)],
        4,
        [GridBarrier(), GridBarrier()],
        op_id="gb.only_barriers",
    )
    return program, [], None


def _cases() -> list[Case]:
    six = _six_segments()
    a = np.arange(64, dtype=np.uint32) * 2654435761 % 1000
    return [
        _first_and_last(),
        (six, [a], None),
        (six, [a], DispatchConfig(workgroup_override=16)),
        (six, [a], DispatchConfig(fixpoint_iterations=3)),
        _workgroup_memory(),
        _reduction(),
        _handover(),
        _only_barriers(),
    ]


async def test_grid_barrier_programs_match_the_reference(
    wgpu_backend: VyreBackend, reference: VyreBackend
) -> None:
    assert len(split_at_grid_barriers(_six_segments())) == 6
    for case in _cases():
        got = await _same_as_reference(wgpu_backend, reference, case)
        if case[0].op_id == "gb.workgroup_memory":
            before, after, counted = got
            assert before.all() and not after.any()  # zero again after the grid barrier
            assert set(counted.tolist()) == {800}


async def test_a_grid_wider_than_one_launch_runs_every_segment_over_every_chunk(
    wgpu_backend: VyreBackend, reference: VyreBackend
) -> None:
    """Each segment is several launches (one per chunk of the grid); a lane reads what a
    lane of another chunk wrote in the segment before."""
    limit = wgpu_backend.executor._limits["max-compute-workgroups-per-dimension"]
    n = (limit + 10) * 2
    program = Program(
        [
            BufferDecl("wg", 0, Access.WRITE, DType.U32, n),
            BufferDecl("next", 1, Access.WRITE, DType.U32, n),
        ],
        2,
        [
            Store("wg", gid(0), wgid(0) * u32(3) + nwg(0)),
            GridBarrier(),
            Store("next", gid(0), Load("wg", _next(n, 2 * limit - 1))),
        ],
        op_id="gb.wide",
    )
    _, nxt = await _same_as_reference(wgpu_backend, reference, (program, [], None))
    assert nxt[0] == (limit - 1) * 3 + limit + 10  # written by the first chunk's last group


async def test_segments_are_counted_on_the_span_and_timed_only_when_they_ran_alone(
    wgpu_backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vyre_async._pending import DispatchCompleter

    # Phases are taken for dispatches a span shows them on: as if one did.
    monkeypatch.setattr(DispatchCompleter, "wants_phases", property(lambda self: True))
    pending = wgpu_backend.dispatch(_six_segments(), [np.zeros(64, np.uint32)])
    await pending
    record = pending.record
    assert record.attributes is not None and record.attributes["vyre.segments"] == 6
    # One submission: no segment's run time is known, so none is recorded as a phase.
    assert not [p for p in record.phases or () if p[0] == "vyre.segment"]
    # A sliced rerun times each segment from its first slice to its last status.
    program = _spin_after_barrier(4, shared_in_loop=False)
    counts = np.array([3, 70_000, 0, 140_001], np.uint32)
    pending = wgpu_backend.dispatch(program, [counts, np.zeros(4, np.uint32)])
    await pending
    phases = [(a, b) for name, a, b in pending.record.phases or () if name == "vyre.segment"]
    assert (
        len(phases)
        == len(split_at_grid_barriers(program))
        == pending.record.attributes["vyre.segments"]
    )
    assert all(a <= b for a, b in phases) and phases == sorted(phases)
    # A program without grid barriers records no segments.
    plain = Program(
        [BufferDecl("o", 0, Access.WRITE, DType.U32, 4)], 4, [Store("o", gid(0), u32(1))]
    )
    pending = wgpu_backend.dispatch(plain, [])
    await pending
    assert not [p for p in pending.record.phases or () if p[0] == "vyre.segment"]
    assert "vyre.segments" not in (pending.record.attributes or {})


async def test_a_multi_segment_pipeline_comes_back_from_the_disk_cache(
    wgpu_adapter: dict[str, str], tmp_path: Path
) -> None:
    from vyre_wgpu import create_backend

    program, inputs, _ = _reduction()
    first = create_backend(prefetch=False, disk_cache=DiskPipelineCache(tmp_path))
    try:
        want = await first.dispatch(program, inputs)
    finally:
        await first.aclose()
    disk = DiskPipelineCache(tmp_path)
    second = create_backend(prefetch=False, disk_cache=disk)
    built: list[Program] = []
    build = second.executor.build_pipeline
    second.executor.build_pipeline = lambda p, c: built.append(p) or build(p, c)  # type: ignore[method-assign]
    try:
        got = await second.dispatch(program, inputs)
        native = second.compile(program).native
    finally:
        await second.aclose()
    assert disk.hits == 1 and built == []  # loaded from the WGSL on disk, not generated
    assert native.segmented and len(native.shaders) == 3
    for a, b in zip(got, want, strict=True):
        assert a.tobytes() == b.tobytes()


async def test_queued_dispatches_keep_their_segments_in_order(
    wgpu_backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dispatches of grid-barrier and plain programs coalesced into one submission, and a
    batch (one submission by construction), each run their own segments in order."""
    program = _six_segments()
    plain = Program(
        [
            BufferDecl("a", 0, Access.READ, DType.U32, 64),
            BufferDecl("o", 1, Access.WRITE, DType.U32, 64),
        ],
        4,
        [Store("o", gid(0), Load("a", gid(0)) + u32(1))],
    )
    inputs = [np.full(64, k, np.uint32) + np.arange(64, dtype=np.uint32) for k in range(12)]
    reference = reference_backend()
    try:
        wants = [await reference.dispatch(program, [a]) for a in inputs]
    finally:
        await reference.aclose()
    pipeline = wgpu_backend.compile(program)
    await pipeline.dispatch([inputs[0]])  # shape planned, buffers pooled
    await wgpu_backend.dispatch(plain, [inputs[0]])
    submits = _count_submits(wgpu_backend, monkeypatch)
    pendings = []
    for a in inputs:
        pendings.append(wgpu_backend.dispatch(program, [a]))
        pendings.append(wgpu_backend.dispatch(plain, [a]))
    for k, a in enumerate(inputs):
        got = await pendings[2 * k]
        assert [g.tobytes() for g in got] == [w.tobytes() for w in wants[k]]
        assert (await pendings[2 * k + 1])[0].tolist() == (a + 1).tolist()
    assert len(submits) < len(pendings)
    submits.clear()
    outputs = [await p for p in pipeline.dispatch_batch([[a] for a in inputs])]
    assert submits == [1]
    for got, want in zip(outputs, wants, strict=True):
        assert [g.tobytes() for g in got] == [w.tobytes() for w in want]


def _spin_after_barrier(lanes: int, *, shared_in_loop: bool) -> Program:
    """A long loop in the segment after a grid barrier; workgroup memory in the first
    segment (and, with ``shared_in_loop``, in the loop's segment too)."""
    acc: Expr = Var("acc") + Var("i")
    if shared_in_loop:
        acc = acc + Load("sh", u32(0))
    return Program(
        [
            BufferDecl("n", 0, Access.READ, DType.U32, lanes),
            BufferDecl("copy", 1, Access.READ_WRITE, DType.U32, lanes),
            BufferDecl("out", 2, Access.WRITE, DType.U32, lanes),
            BufferDecl("sh", 3, Access.WORKGROUP, DType.U32, 1),
        ],
        1,
        [
            Store("sh", u32(0), Load("n", gid(0))),
            Store("copy", gid(0), Load("sh", u32(0))),
            GridBarrier(),
            Let("acc", u32(0)),
            Loop("i", u32(0), Load("copy", gid(0)), [Assign("acc", acc)]),
            Store("out", gid(0), Var("acc")),
        ],
        op_id="gb.spin",
    )


async def test_a_segment_with_loops_past_lavapipes_cap_runs_in_slices(
    wgpu_backend: VyreBackend,
) -> None:
    """The loop's segment touches no workgroup memory: sliced like any such program."""
    counts = np.array([3, 70_000, 0, 140_001], np.uint32)
    copy, out = await wgpu_backend.dispatch(
        _spin_after_barrier(4, shared_in_loop=False), [counts, np.zeros(4, np.uint32)]
    )
    assert copy.tolist() == counts.tolist()
    assert out.tolist() == [sum(range(int(n))) % 2**32 for n in counts]


async def test_a_segment_that_cannot_be_sliced_fails_past_the_cap(
    wgpu_backend: VyreBackend, wgpu_adapter: dict[str, str]
) -> None:
    if wgpu_adapter["adapter_type"] != "CPU":
        pytest.skip("only lavapipe cuts loops")
    program = _spin_after_barrier(2, shared_in_loop=True)
    zeros = np.zeros(2, np.uint32)
    _, out = await wgpu_backend.dispatch(program, [np.array([10, 20], np.uint32), zeros])
    assert out.tolist() == [45, 190]  # the first segment's workgroup memory reads 0 here
    with pytest.raises(UnsupportedFeature, match="after 65535 iterations in all") as info:
        await wgpu_backend.dispatch(program, [np.array([5, 70_000], np.uint32), zeros])
    assert "Fix: run it on a hardware adapter" in str(info.value)


async def test_grid_barriers_are_supported_but_cooperative_launches_are_not(
    wgpu_backend: VyreBackend,
) -> None:
    assert GRID_BARRIER_OP in wgpu_backend.supported_ops()
    assert not wgpu_backend.capabilities().grid_sync
    program, inputs, _ = _first_and_last()
    with pytest.raises(UnsupportedFeature, match="cooperative") as info:
        await wgpu_backend.dispatch(program, inputs, DispatchConfig(cooperative=True))
    assert "Fix: set DispatchConfig(cooperative=False)" in str(info.value)
    plain = Program(
        [BufferDecl("o", 0, Access.WRITE, DType.U32, 4)], 4, [Store("o", gid(0), u32(1))]
    )
    native = wgpu_backend.compile(plain).native
    assert not native.segmented and len(native.shaders) == 1
