"""The standard programs: the kernels used by tests, the demo and the benchmarks.

Each builder returns a validated-clean `Program`. `standard_workloads()` pairs
each one with inputs and an independent numpy oracle (written from the kernel's
specification, not derived from any engine), so any backend can be checked
byte for byte against it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from vyre_async._exports import public_dir as _public_dir
from vyre_async.errors import InvalidProgram
from vyre_async.ir import (
    Access,
    Assign,
    Atomic,
    Barrier,
    BufferDecl,
    BufLen,
    DType,
    Expr,
    GridBarrier,
    If,
    Let,
    Load,
    Loop,
    Program,
    Select,
    Stmt,
    Store,
    Var,
    f32,
    gid,
    lid,
    u32,
    wgid,
)

__all__ = [
    "Workload",
    "array_sum",
    "array_sum_oracle",
    "elementwise_xor",
    "exclusive_scan",
    "exclusive_scan_oracle",
    "histogram",
    "prefix_scan",
    "saxpy",
    "standard_workloads",
    "sum_reduction",
    "tiled_matmul",
]
__dir__ = _public_dir(__name__)


def elementwise_xor(n: int, *, workgroup: int = 64) -> Program:
    """Return ``out[i] = a[i] ^ b[i]`` over ``n`` u32 elements (inputs sized at dispatch)."""
    i = Var("i")
    return Program(
        [
            BufferDecl("a", 0, Access.READ, DType.U32),
            BufferDecl("b", 1, Access.READ, DType.U32),
            BufferDecl("out", 2, Access.WRITE, DType.U32, n),
        ],
        workgroup,
        [
            Let("i", gid()),
            If(i.lt(BufLen("out")), [Store("out", i, Load("a", i) ^ Load("b", i))]),
        ],
        op_id="std.xor",
    )


def saxpy(n: int, *, workgroup: int = 256) -> Program:
    """Return ``out[i] = alpha * x[i] + y[i]`` over ``n`` f32 elements (two roundings, no FMA)."""
    i = Var("i")
    return Program(
        [
            BufferDecl("x", 0, Access.READ, DType.F32),
            BufferDecl("y", 1, Access.READ, DType.F32),
            BufferDecl("alpha", 2, Access.UNIFORM, DType.F32, 1),
            BufferDecl("out", 3, Access.WRITE, DType.F32, n),
        ],
        workgroup,
        [
            Let("i", gid()),
            If(
                i.lt(BufLen("out")),
                [Store("out", i, Load("alpha", 0) * Load("x", i) + Load("y", i))],
            ),
        ],
        op_id="std.saxpy",
    )


def sum_reduction(n: int, *, workgroup: int = 256, items_per_lane: int = 1) -> Program:
    """Return a sum of ``n`` f32 values into one partial sum per workgroup.

    Each lane first adds ``items_per_lane`` elements strided by the workgroup
    size (in order), then the workgroup halves a shared scratch buffer with a
    barrier after every round. ``partials`` has ``ceil(n / (workgroup *
    items_per_lane))`` elements; with that many workgroups it holds every
    workgroup's sum, and with a single workgroup the total.

    Raises:
        InvalidProgram: ``workgroup`` is not a power of two in 2..1024 (a ``ValueError``).
    """
    if workgroup < 2 or workgroup > 1024 or workgroup & (workgroup - 1):
        raise InvalidProgram(
            f"workgroup must be a power of two in 2..1024, got {workgroup}",
            fix="pass workgroup=256 (or 2, 4, ... 1024)",
        )
    span = workgroup * items_per_lane
    groups = max(1, math.ceil(n / span))
    base, acc, l0 = Var("base"), Var("acc"), lid()
    body: list[Stmt] = [Let("base", wgid() * u32(span) + l0)]
    if items_per_lane == 1:
        body.append(Let("acc", Load("x", base)))
    else:
        body += [
            Let("acc", f32(0.0)),
            Loop(
                "t",
                u32(0),
                u32(items_per_lane),
                [Let("v", Load("x", base + Var("t") * u32(workgroup))), _assign_add("acc", "v")],
            ),
        ]
    body += [Store("scratch", l0, acc), Barrier()]
    stride = workgroup // 2
    while stride:
        body += [
            If(
                l0.lt(u32(stride)),
                [
                    Store(
                        "scratch",
                        l0,
                        Load("scratch", l0) + Load("scratch", l0 + u32(stride)),
                    )
                ],
            ),
            Barrier(),
        ]
        stride //= 2
    body.append(If(l0.eq(u32(0)), [Store("partials", wgid(), Load("scratch", u32(0)))]))
    return Program(
        [
            BufferDecl("x", 0, Access.READ, DType.F32),
            BufferDecl("partials", 1, Access.WRITE, DType.F32, groups),
            BufferDecl("scratch", 2, Access.WORKGROUP, DType.F32, workgroup),
        ],
        workgroup,
        body,
        op_id="std.sum",
    )


def _assign_add(name: str, other: str) -> Stmt:
    return Assign(name, Var(name) + Var(other))


def histogram(*, bins: int = 256, workgroup: int = 256) -> Program:
    """Return a ``bins``-bin histogram of u32 ``data`` (bin = value mod bins).

    Each workgroup counts into a shared histogram with workgroup atomics, then
    adds its non-zero bins to the global ``hist`` (READ_WRITE, so counts
    accumulate onto the initial contents) with storage atomics.
    """
    i, b = Var("i"), Var("b")
    rounds = math.ceil(bins / workgroup)
    return Program(
        [
            BufferDecl("data", 0, Access.READ, DType.U32),
            BufferDecl("hist", 1, Access.READ_WRITE, DType.U32, bins),
            BufferDecl("local", 2, Access.WORKGROUP, DType.U32, bins),
        ],
        workgroup,
        [
            Let("i", gid()),
            If(
                i.lt(BufLen("data")),
                [Let("old", Atomic("add", "local", Load("data", i) % u32(bins), u32(1)))],
            ),
            Barrier(),
            Loop(
                "r",
                u32(0),
                u32(rounds),
                [
                    Let("b", Var("r") * u32(workgroup) + lid()),
                    Let("c", Load("local", b)),
                    If(
                        b.lt(u32(bins)).land(Var("c").ne(u32(0))),
                        [Let("prev", Atomic("add", "hist", b, Var("c")))],
                    ),
                ],
            ),
        ],
        op_id="std.histogram",
    )


def prefix_scan(n: int) -> Program:
    """Return an inclusive prefix sum (wrapping u32) of ``n <= 1024`` elements in one workgroup.

    Hillis-Steele with two ping-pong workgroup buffers and a barrier per round.

    Raises:
        InvalidProgram: ``n`` is not in 1..1024 (also a ``ValueError``).
    """
    if not 1 <= n <= 1024:
        raise InvalidProgram(
            f"prefix_scan handles 1..1024 elements in one workgroup, got {n}",
            fix="scan at most 1024 elements per dispatch (scan blocks, then their sums)",
        )
    width = 1 << max(0, (n - 1).bit_length())
    lane = Var("l")
    body: list[Stmt] = [Let("l", lid()), Store("ping", lane, Load("x", lane)), Barrier()]
    src, dst, stride = "ping", "pong", 1
    while stride < width:
        shifted = Select(lane.ge(u32(stride)), Load(src, lane - u32(stride)), u32(0))
        body += [Store(dst, lane, Load(src, lane) + shifted), Barrier()]
        src, dst, stride = dst, src, stride * 2
    body.append(If(lane.lt(BufLen("out")), [Store("out", lane, Load(src, lane))]))
    return Program(
        [
            BufferDecl("x", 0, Access.READ, DType.U32),
            BufferDecl("out", 1, Access.WRITE, DType.U32, n),
            BufferDecl("ping", 2, Access.WORKGROUP, DType.U32, width),
            BufferDecl("pong", 3, Access.WORKGROUP, DType.U32, width),
        ],
        width,
        body,
        op_id="std.scan",
    )


def _power_of_two_workgroup(workgroup: int) -> None:
    if (
        isinstance(workgroup, bool)
        or not isinstance(workgroup, int)
        or not (2 <= workgroup <= 1024 and not workgroup & (workgroup - 1))
    ):
        raise InvalidProgram(
            f"workgroup must be a power of two in 2..1024, got {workgroup!r}",
            fix="pass workgroup=256 (or 2, 4, ... 1024)",
        )


def _element_count(n: int, what: str) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 0xFFFF_FFFF:
        raise InvalidProgram(
            f"{what} takes 1 to 2**32 - 1 elements, got {n!r}",
            fix="pass the element count of the input as a positive int",
        )


def _levels(n: int, workgroup: int) -> list[int]:
    """Sizes of the reduction levels above ``n`` elements: ceil(n / w), ... down to 1."""
    sizes = []
    while n > 1:
        n = -(-n // workgroup)
        sizes.append(n)
    return sizes or [1]


def _tree(scratch: str, lane: Expr, workgroup: int) -> list[Stmt]:
    """Halve ``scratch`` into its element 0: ``s[l] += s[l + stride]``, a barrier per round."""
    body: list[Stmt] = []
    stride = workgroup // 2
    while stride:
        body += [
            If(
                lane.lt(u32(stride)),
                [Store(scratch, lane, Load(scratch, lane) + Load(scratch, lane + u32(stride)))],
            ),
            Barrier(),
        ]
        stride //= 2
    return body


def array_sum(n: int, *, workgroup: int = 256) -> Program:
    """Return the f32 sum of all ``n`` elements of ``x`` in one program (grid barriers).

    Each phase reduces one level: workgroup ``g`` adds the ``workgroup``
    values ``level[g*w : g*w + w]`` (zeros past the end) as a tree in shared
    memory (``s[l] += s[l + stride]`` for stride = w/2, ..., 1) into the next
    level's element ``g``; a `GridBarrier` separates the levels, so
    ``ceil(log_w(n))`` phases reduce any length to one value. The order of the
    additions is fixed by that rule, so every backend returns the same bits
    (`standard_workloads`' oracle replays it in numpy).

    Outputs: ``total`` (1 element), then ``partials`` (every level's sums but
    the last, level after level; one unused element when ``n <= workgroup``).

    Raises:
        InvalidProgram: ``n`` is not in 1..2**32-1, or ``workgroup`` is not a
            power of two in 2..1024.
    """
    _element_count(n, "array_sum")
    _power_of_two_workgroup(workgroup)
    levels = _levels(n, workgroup)
    lane, group, i = lid(), wgid(), Var("i")
    body: list[Stmt] = []
    source, base, size = "x", 0, n  # this phase's input: source[base : base + size]
    offset = 0  # where the next level goes in partials
    for k, blocks in enumerate(levels):
        last = k == len(levels) - 1
        target, target_at = ("total", u32(0)) if last else ("partials", u32(offset) + group)
        if k:
            body.append(GridBarrier())
        body.append(
            If(
                group.lt(u32(blocks)),
                [
                    Let("i", group * u32(workgroup) + lane),
                    Store(
                        "scratch",
                        lane,
                        Select(i.lt(u32(size)), Load(source, i + u32(base)), f32(0.0)),
                    ),
                    Barrier(),
                    *_tree("scratch", lane, workgroup),
                    If(lane.eq(u32(0)), [Store(target, target_at, Load("scratch", u32(0)))]),
                ],
            )
        )
        source, base, size = "partials", offset, blocks
        offset += blocks
    return Program(
        [
            BufferDecl("x", 0, Access.READ, DType.F32, n),
            BufferDecl("total", 1, Access.WRITE, DType.F32, 1),
            BufferDecl("partials", 2, Access.WRITE, DType.F32, max(1, sum(levels[:-1]))),
            BufferDecl("scratch", 3, Access.WORKGROUP, DType.F32, workgroup),
        ],
        workgroup,
        body,
        op_id="std.array_sum",
    )


def exclusive_scan(n: int, *, workgroup: int = 256) -> Program:
    """Return the exclusive prefix sum (wrapping u32) of ``n`` elements in one program.

    ``out[i] = x[0] + ... + x[i-1]`` (``out[0] = 0``) for any ``n``, with
    grid barriers between the phases. Up the levels, each workgroup scans its
    ``workgroup`` elements in shared memory (Hillis-Steele, a barrier per
    round), stores its block's exclusive scan in place and its block's total
    one level up; down the levels, every element adds the scanned total of its
    block. ``2 * ceil(log_w(n)) - 1`` phases in all.

    Outputs: ``out`` (``n`` elements), then ``sums`` (the upper levels' scans;
    one unused element when ``n <= workgroup``).

    Raises:
        InvalidProgram: ``n`` is not in 1..2**32-1, or ``workgroup`` is not a
            power of two in 2..1024.
    """
    _element_count(n, "exclusive_scan")
    _power_of_two_workgroup(workgroup)
    sizes = [n, *_levels(n, workgroup)]  # elements per level; the last is 1 block
    offsets = [0]  # level k >= 1 lives at sums[offsets[k] : offsets[k] + sizes[k]]
    for size in sizes[1:-1]:
        offsets.append(offsets[-1] + size)
    lane, group, i = lid(), wgid(), Var("i")

    def at(level: int, index: Expr) -> tuple[str, Expr]:
        return ("out", index) if level == 0 else ("sums", index + u32(offsets[level - 1]))

    top = len(sizes) - 2  # the level scanned by one workgroup
    body: list[Stmt] = []
    for k in range(top + 1):  # up: scan each block of level k, its total to level k + 1
        if k:
            body.append(GridBarrier())
        source, index = ("x", i) if k == 0 else at(k, i)
        scan: list[Stmt] = [
            Let("i", group * u32(workgroup) + lane),
            Store("ping", lane, Select(i.lt(u32(sizes[k])), Load(source, index), u32(0))),
            Barrier(),
        ]
        src, dst, stride = "ping", "pong", 1
        while stride < workgroup:
            shifted = Select(lane.ge(u32(stride)), Load(src, lane - u32(stride)), u32(0))
            scan += [Store(dst, lane, Load(src, lane) + shifted), Barrier()]
            src, dst, stride = dst, src, stride * 2
        before = Select(lane.gt(u32(0)), Load(src, lane - u32(1)), u32(0))
        scan.append(If(i.lt(u32(sizes[k])), [Store(*at(k, i), before)]))
        if k < top:
            total_at = at(k + 1, group)
            scan.append(
                If(
                    lane.eq(u32(workgroup - 1)),
                    [Store(total_at[0], total_at[1], Load(src, lane))],
                )
            )
        body.append(If(group.lt(u32(sizes[k + 1])), scan))
    for k in range(top - 1, -1, -1):  # down: add each block's scanned total
        body += [
            GridBarrier(),
            Let("i", gid()),
            If(
                i.lt(u32(sizes[k])),
                [
                    Store(
                        *at(k, i),
                        Load(*at(k, i)) + Load(*at(k + 1, i / u32(workgroup))),
                    )
                ],
            ),
        ]
    return Program(
        [
            BufferDecl("x", 0, Access.READ, DType.U32, n),
            BufferDecl("out", 1, Access.WRITE, DType.U32, n),
            BufferDecl("sums", 2, Access.WRITE, DType.U32, max(1, sum(sizes[1:-1]))),
            BufferDecl("ping", 3, Access.WORKGROUP, DType.U32, workgroup),
            BufferDecl("pong", 4, Access.WORKGROUP, DType.U32, workgroup),
        ],
        workgroup,
        body,
        op_id="std.exclusive_scan",
    )


def tiled_matmul(m: int, k: int, n: int, *, tile: int = 16) -> Program:
    """Return ``C[mxn] = A[mxk] · B[kxn]`` (f32, row-major) with shared-memory tiles.

    The workgroup is ``(tile, tile)``; launch it with
    ``grid_override=(ceil(n / tile), ceil(m / tile), 1)``. The sizes are read
    from the UNIFORM ``dims`` buffer ``[m, k, n]``, so one compiled kernel serves
    every size; the tile loop's bound is uniform, so its barriers are legal.
    Products are added in ``k`` order with two roundings each (no FMA).
    """
    t = u32(tile)
    row, col, acc = Var("row"), Var("col"), Var("acc")
    big_m, big_k, big_n = Var("M"), Var("K"), Var("N")
    local = lid(1) * t + lid(0)
    ka, kb = Var("ka"), Var("kb")
    return Program(
        [
            BufferDecl("A", 0, Access.READ, DType.F32, m * k),
            BufferDecl("B", 1, Access.READ, DType.F32, k * n),
            BufferDecl("dims", 2, Access.UNIFORM, DType.U32, 3),
            BufferDecl("C", 3, Access.WRITE, DType.F32, m * n),
            BufferDecl("As", 4, Access.WORKGROUP, DType.F32, tile * tile),
            BufferDecl("Bs", 5, Access.WORKGROUP, DType.F32, tile * tile),
        ],
        (tile, tile, 1),
        [
            Let("M", Load("dims", u32(0))),
            Let("K", Load("dims", u32(1))),
            Let("N", Load("dims", u32(2))),
            Let("row", wgid(1) * t + lid(1)),
            Let("col", wgid(0) * t + lid(0)),
            Let("acc", f32(0.0)),
            Loop(
                "tk",
                u32(0),
                (big_k + u32(tile - 1)) / t,
                [
                    Let("ka", Var("tk") * t + lid(0)),
                    Let("kb", Var("tk") * t + lid(1)),
                    Store(
                        "As",
                        local,
                        Select(
                            row.lt(big_m).land(ka.lt(big_k)), Load("A", row * big_k + ka), f32(0.0)
                        ),
                    ),
                    Store(
                        "Bs",
                        local,
                        Select(
                            kb.lt(big_k).land(col.lt(big_n)), Load("B", kb * big_n + col), f32(0.0)
                        ),
                    ),
                    Barrier(),
                    Loop(
                        "j",
                        u32(0),
                        t,
                        [
                            Let(
                                "p",
                                Load("As", lid(1) * t + Var("j"))
                                * Load("Bs", Var("j") * t + lid(0)),
                            ),
                            _assign_add("acc", "p"),
                        ],
                    ),
                    Barrier(),
                ],
            ),
            If(row.lt(big_m).land(col.lt(big_n)), [Store("C", row * big_n + col, acc)]),
        ],
        op_id="std.matmul",
    )


# Workloads: program + inputs + independent oracle ----------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """A standard program with the inputs to run it on and the outputs it must produce.

    Attributes:
        name: Short name (``xor``, ``saxpy``, ``sum``, ``histogram``, ``scan``, ``matmul``).
        program: The program.
        grid: The ``grid_override`` to launch with, or None to infer it.
        make_inputs: Builds the inputs from a numpy ``Generator``.
        oracle: Computes the expected outputs from the inputs with plain numpy.
    """

    name: str
    program: Program
    grid: tuple[int, int, int] | None
    make_inputs: Callable[[np.random.Generator], list[np.ndarray]]
    oracle: Callable[[Sequence[np.ndarray]], list[np.ndarray]]

    def inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Return deterministic inputs for ``seed``."""
        return self.make_inputs(np.random.default_rng(seed))

    def expected(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Return the outputs every backend must produce for ``inputs``, byte for byte."""
        return self.oracle(inputs)


def _u32(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 2**32, size=n, dtype=np.uint32)


def _f32(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32)


def _sum_oracle(
    n: int, workgroup: int, k: int
) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
    def oracle(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        groups = max(1, math.ceil(n / (workgroup * k)))
        x = np.zeros(groups * workgroup * k, np.float32)
        x[: inputs[0].size] = inputs[0]
        lanes = x.reshape(groups, k, workgroup)
        acc = lanes[:, 0, :].copy()
        if k > 1:
            acc = np.zeros((groups, workgroup), np.float32)
            for t in range(k):
                acc = acc + lanes[:, t, :]
        stride = workgroup // 2
        while stride:
            acc[:, :stride] = acc[:, :stride] + acc[:, stride : 2 * stride]
            stride //= 2
        return [acc[:, 0].copy()]

    return oracle


def _matmul_oracle(m: int, k: int, n: int) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
    def oracle(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        a = inputs[0].reshape(m, k)
        b = inputs[1].reshape(k, n)
        acc = np.zeros((m, n), np.float32)
        for kk in range(k):
            acc = acc + a[:, kk, None] * b[None, kk, :]
        return [acc.reshape(-1)]

    return oracle


def _scan_oracle(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.cumsum(inputs[0], dtype=np.uint64).astype(np.uint32)]


def _tree_sums(values: np.ndarray, workgroup: int) -> np.ndarray:
    """Each block of ``workgroup`` f32 values (zeros past the end) halved as `array_sum` does."""
    blocks = -(-values.size // workgroup)
    flat = np.zeros(blocks * workgroup, np.float32)
    flat[: values.size] = values
    acc = flat.reshape(blocks, workgroup)
    stride = workgroup // 2
    while stride:
        acc[:, :stride] = acc[:, :stride] + acc[:, stride : 2 * stride]
        stride //= 2
    return acc[:, 0].copy()


def array_sum_oracle(x: np.ndarray, workgroup: int = 256) -> list[np.ndarray]:
    """Return `array_sum`'s outputs (``total``, ``partials``) for ``x``, computed with numpy."""
    level = np.asarray(x, np.float32).reshape(-1)
    partials = []
    while True:
        level = _tree_sums(level, workgroup)
        if level.size == 1:
            break
        partials.append(level)
    return [level, np.concatenate(partials) if partials else np.zeros(1, np.float32)]


def _exclusive(values: np.ndarray) -> np.ndarray:
    """Exclusive prefix sum, wrapping at 2**32."""
    out = np.zeros(values.size, np.uint64)
    np.cumsum(values[:-1], dtype=np.uint64, out=out[1:])
    return out.astype(np.uint32)


def exclusive_scan_oracle(x: np.ndarray, workgroup: int = 256) -> list[np.ndarray]:
    """Return `exclusive_scan`'s outputs (``out``, ``sums``) for ``x``, computed with numpy."""
    level = np.asarray(x, np.uint32).reshape(-1)
    sums = []
    out = _exclusive(level)
    while level.size > workgroup:
        blocks = -(-level.size // workgroup)
        padded = np.zeros(blocks * workgroup, np.uint64)
        padded[: level.size] = level
        level = padded.reshape(blocks, workgroup).sum(axis=1, dtype=np.uint64).astype(np.uint32)
        sums.append(_exclusive(level))
    return [out, np.concatenate(sums) if sums else np.zeros(1, np.uint32)]


def standard_workloads(*, scale: int = 1) -> list[Workload]:
    """Return the eight standard workloads, sized by ``scale`` (1 = small, for tests).

    Sizes at scale 1: xor 1000, saxpy 1000, sum 5000 (256 lanes, 4 items each),
    histogram 3000 values, scan 1000, matmul 40x24x33 (tile 16), array_sum
    4200 (64 lanes: 3 levels, 2 grid barriers), exclusive_scan 1100 (32 lanes:
    3 levels, 4 grid barriers): just past the sizes that take a level fewer.
    """
    xor_n, saxpy_n, sum_n, hist_n = 1000 * scale, 1000 * scale, 5000 * scale, 3000 * scale
    scan_n = min(1000, 250 * scale + 750)
    m, k, n = 40 * scale, 24 * scale, 33 * scale
    sum_wg, sum_k = 256, 4
    array_n, array_wg = 4200 * scale, 64
    xscan_n, xscan_wg = 1100 * scale, 32

    return [
        Workload(
            name="xor",
            program=elementwise_xor(xor_n),
            grid=None,
            make_inputs=lambda rng: [_u32(rng, xor_n), _u32(rng, xor_n)],
            oracle=lambda ins: [np.bitwise_xor(ins[0], ins[1])],
        ),
        Workload(
            name="saxpy",
            program=saxpy(saxpy_n),
            grid=None,
            make_inputs=lambda rng: [
                _f32(rng, saxpy_n),
                _f32(rng, saxpy_n),
                np.array([1.5], np.float32),
            ],
            oracle=lambda ins: [ins[2][0] * ins[0] + ins[1]],
        ),
        Workload(
            name="sum",
            program=sum_reduction(sum_n, workgroup=sum_wg, items_per_lane=sum_k),
            grid=(math.ceil(sum_n / (sum_wg * sum_k)), 1, 1),
            make_inputs=lambda rng: [_f32(rng, sum_n)],
            oracle=_sum_oracle(sum_n, sum_wg, sum_k),
        ),
        Workload(
            name="histogram",
            program=histogram(),
            grid=None,
            make_inputs=lambda rng: [_u32(rng, hist_n), _u32(rng, 256) % np.uint32(1000)],
            oracle=lambda ins: [
                (ins[1] + np.bincount(ins[0] % 256, minlength=256)).astype(np.uint32)
            ],
        ),
        Workload(
            name="scan",
            program=prefix_scan(scan_n),
            grid=None,
            make_inputs=lambda rng: [_u32(rng, scan_n)],
            oracle=_scan_oracle,
        ),
        Workload(
            name="matmul",
            program=tiled_matmul(m, k, n),
            grid=(math.ceil(n / 16), math.ceil(m / 16), 1),
            make_inputs=lambda rng: [
                _f32(rng, m * k),
                _f32(rng, k * n),
                np.array([m, k, n], np.uint32),
            ],
            oracle=_matmul_oracle(m, k, n),
        ),
        Workload(
            name="array_sum",
            program=array_sum(array_n, workgroup=array_wg),
            grid=None,
            make_inputs=lambda rng: [_f32(rng, array_n)],
            oracle=lambda ins: array_sum_oracle(ins[0], array_wg),
        ),
        Workload(
            name="exclusive_scan",
            program=exclusive_scan(xscan_n, workgroup=xscan_wg),
            grid=None,
            make_inputs=lambda rng: [_u32(rng, xscan_n)],
            oracle=lambda ins: exclusive_scan_oracle(ins[0], xscan_wg),
        ),
    ]
