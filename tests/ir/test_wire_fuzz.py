"""Fuzz the wire decoder with hostile bytes: it must answer `InvalidProgram` or a program.

Deterministic (a seeded `random.Random` and a derandomized Hypothesis corpus)
and quick. Inputs: random byte strings, random bodies behind a valid header
and digest, and mutations of valid encodings of random programs (bit flips,
byte edits, truncations, splices, length-field inflation, duplicated and
deleted chunks), half of them re-sealed with a recomputed digest so the fuzz
reaches past the integrity check into the parser.
"""

from __future__ import annotations

import os
import random
import struct
import time
import tracemalloc
from collections.abc import Callable, Iterator

import pytest
from blake3 import blake3
from hypothesis import HealthCheck, Phase, given, settings

from tests.strategies import programs
from vyre_async import InvalidProgram
from vyre_async.ir import (
    Access,
    Atomic,
    Block,
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
    Stmt,
    Store,
    Un,
    Var,
    f32,
    gid,
    u32,
)
from vyre_async.ir.limits import MAX_EXPR_DEPTH, MAX_NAME_BYTES, MAX_NODES, MAX_STMT_DEPTH

SEED = 20_261_122
N_RANDOM = 1_000  # arbitrary byte strings
N_SEALED_RANDOM = 1_000  # random bodies behind a valid header and digest
N_MUTATIONS = 25_000  # mutated valid encodings
TRACED = 2_000  # inputs decoded under tracemalloc
# A bound against decoding that grows faster than its input; ten times wider on a
# mutmut-rewritten copy, where every call goes through a trampoline.
MAX_CALL_SECONDS = 0.25 * (10 if "MUTANT_UNDER_TEST" in os.environ else 1)
MAX_PEAK_BYTES = 4 * 1024 * 1024
HEADER = b"VYIR\x01\x00\x00\x00"
HEADER_V2 = b"VYIR\x02\x00\x00\x00"  # version 2: programs with a GridBarrier
_INTERESTING_U32 = (0xFFFF_FFFF, 0x7FFF_FFFF, 0x8000_0000, 0x0001_0000, MAX_NODES + 1, 257, 0)
_INTEGRITY_WORDS = ("digest", "magic", "version", "flags", "header")


def _seal(body: bytes, header: bytes = HEADER) -> bytes:
    return header + blake3(body).digest() + body


def _reseal(data: bytes) -> bytes:
    if len(data) < 40:
        return data
    return data[:8] + blake3(data[40:]).digest() + data[40:]


def _edge_programs() -> list[Program]:
    """Programs at the structural limits, so mutations land next to every limit check."""
    deep: Expr = u32(1)
    for _ in range(MAX_EXPR_DEPTH - 1):
        deep = Un("not", deep)
    nested: tuple[Stmt, ...] = (Let("d", deep),)
    for _ in range(MAX_STMT_DEPTH):
        nested = (Block(nested),)
    long_name = "ü" * (MAX_NAME_BYTES // 2)
    many = [BufferDecl(f"b{i}", i, Access.READ, DType.U32) for i in range(40)]
    return [
        Program([], 1, nested),
        Program(
            [
                BufferDecl(long_name, 0, Access.READ_WRITE, DType.U32),
                BufferDecl("o", 1, Access.WRITE, DType.F32, 8),
            ],
            (4, 2, 1),
            [
                Let(long_name, Atomic("cas", long_name, gid(), u32(1), expected=u32(0))),
                Loop(
                    "i",
                    u32(0),
                    u32(4),
                    [If(Var("i").lt(BufLen("o")), [Store("o", Var("i"), f32(-0.0))])],
                ),
            ],
            op_id=long_name,
        ),
        Program(many, 64, [Let(f"v{i}", Load(f"b{i}", gid())) for i in range(40)]),
        # Version 2: grid barriers first, twice in a row, between phases and last.
        Program(
            [BufferDecl("g", 0, Access.READ_WRITE, DType.U32)],
            32,
            [
                GridBarrier(),
                Let("i", gid()),
                Store("g", Var("i"), Load("g", Var("i")) + u32(1)),
                GridBarrier(),
                GridBarrier(),
                Let("i", gid()),
                Store("g", u32(0), Var("i")),
                GridBarrier(),
            ],
        ),
        Program([], 1, [GridBarrier()]),
    ]


@pytest.fixture(scope="module")
def corpus() -> list[bytes]:
    """Valid encodings: derandomized programs from `programs()` plus limit-hugging ones."""
    collected: list[bytes] = []

    @settings(
        derandomize=True,
        max_examples=150,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(programs())
    def collect(p: Program) -> None:
        collected.append(p.to_wire())

    collect()
    collected += [p.to_wire() for p in _edge_programs()]
    return collected


# Mutations -------------------------------------------------------------------------------


def _flip_bits(rng: random.Random, data: bytearray, corpus: list[bytes]) -> bytearray:
    for _ in range(rng.randint(1, 4)):
        if data:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return data


def _set_byte(rng: random.Random, data: bytearray, corpus: list[bytes]) -> bytearray:
    if data:  # small values hit tags and codes; the others their edges
        data[rng.randrange(len(data))] = rng.choice((*range(13), 0x7F, 0x80, 0xFF))
    return data


def _truncate(rng: random.Random, data: bytearray, corpus: list[bytes]) -> bytearray:
    return data[: rng.randrange(len(data) + 1)]


def _splice(rng: random.Random, data: bytearray, corpus: list[bytes]) -> bytearray:
    other = rng.choice(corpus)
    start = rng.randrange(len(other))
    chunk = other[start : start + rng.randint(1, 64)]
    at = rng.randrange(len(data) + 1)
    cut = at + rng.choice((0, rng.randint(0, 16)))  # insert, or overwrite a range
    return data[:at] + chunk + data[cut:]


def _inflate_length(rng: random.Random, data: bytearray, corpus: list[bytes]) -> bytearray:
    # Small little-endian u32 values in the body are mostly lengths and counts.
    candidates = [
        i
        for i in range(40, len(data) - 3)
        if data[i + 1] == 0 and data[i + 2] == 0 and data[i + 3] == 0
    ]
    if candidates:
        at = rng.choice(candidates)
        value = data[at]
        word = rng.choice((*_INTERESTING_U32, value + 1, max(value - 1, 0), value * 2 + 1))
        data[at : at + 4] = struct.pack("<I", word)
    return data


def _duplicate(rng: random.Random, data: bytearray, corpus: list[bytes]) -> bytearray:
    if not data:
        return data
    start = rng.randrange(len(data))
    end = min(len(data), start + rng.randint(1, 48))
    return data[:end] + data[start:end] * rng.randint(1, 3) + data[end:]


def _delete(rng: random.Random, data: bytearray, corpus: list[bytes]) -> bytearray:
    if not data:
        return data
    start = rng.randrange(len(data))
    return data[:start] + data[start + rng.randint(1, 16) :]


_MUTATORS: tuple[Callable[[random.Random, bytearray, list[bytes]], bytearray], ...] = (
    _flip_bits,
    _set_byte,
    _truncate,
    _splice,
    _inflate_length,
    _inflate_length,
    _duplicate,
    _delete,
)


def _inputs(corpus: list[bytes]) -> list[bytes]:
    """Every fuzz input, in a seeded shuffled order (so any batch mixes all kinds)."""
    rng = random.Random(SEED)
    out = list(_generate(rng, corpus))
    rng.shuffle(out)
    return out


def _generate(rng: random.Random, corpus: list[bytes]) -> Iterator[bytes]:
    for _ in range(N_RANDOM):
        prefix = rng.choice((b"", HEADER, b"VYIR"))
        yield prefix + rng.randbytes(rng.randrange(0, 200))
    for _ in range(N_SEALED_RANDOM):
        size = rng.randrange(0, 160)
        if rng.random() < 0.5:
            body = rng.randbytes(size)
        else:  # small bytes look like tags, codes and short lengths
            body = bytes(rng.choice((0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)) for _ in range(size))
        yield _seal(body, rng.choice((HEADER, HEADER_V2)))
    for _ in range(N_MUTATIONS):
        data = bytearray(rng.choice(corpus))
        for _ in range(rng.randint(1, 3)):
            data = rng.choice(_MUTATORS)(rng, data, corpus)
        out = bytes(data)
        yield _reseal(out) if rng.random() < 0.5 else out


# The fuzz --------------------------------------------------------------------------------


class _Stats:
    def __init__(self) -> None:
        self.total = 0
        self.accepted = 0
        self.rejected = 0
        self.parsed = 0  # rejections made past the header and digest checks
        self.max_seconds = 0.0  # thread CPU time of the slowest call


def _decode_one(data: bytes, stats: _Stats) -> None:
    # CPU time of this thread: the decoder's own work, not scheduler stalls of a busy box.
    start = time.thread_time()
    try:
        program = Program.from_wire(data)
    except InvalidProgram as exc:
        text = str(exc)
        assert "Fix:" in text, text
        assert "internal decoder error" not in text, f"{text}\ninput: {data.hex()}"
        stats.rejected += 1
        what = text.split("\nFix:", 1)[0]
        if not any(word in what for word in _INTEGRITY_WORDS):
            stats.parsed += 1
    except BaseException as exc:  # the point: report the input that escaped
        pytest.fail(f"{type(exc).__name__} escaped from_wire: {exc!r}\ninput: {data.hex()}")
    else:
        stats.accepted += 1
        # The decoder accepts canonical bytes only: re-encoding gives the input back.
        assert program.to_wire() == data, data.hex()
    elapsed = time.thread_time() - start
    stats.max_seconds = max(stats.max_seconds, elapsed)
    stats.total += 1


def test_decoder_survives_hostile_inputs(corpus: list[bytes]) -> None:
    stats = _Stats()
    inputs = _inputs(corpus)
    # The first batch runs under tracemalloc: inflated lengths must not allocate.
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        for data in inputs[:TRACED]:
            _decode_one(data, stats)
        peak = tracemalloc.get_traced_memory()[1] - baseline
    finally:
        tracemalloc.stop()
    for data in inputs[TRACED:]:
        _decode_one(data, stats)

    print(
        f"\nwire fuzz: {stats.total} inputs, {stats.accepted} accepted, {stats.rejected} "
        f"rejected ({stats.parsed} inside the body parser), max {stats.max_seconds * 1e3:.2f} "
        f"ms per call, traced peak {peak / 1024:.0f} KiB over {TRACED} inputs"
    )
    assert stats.total == N_RANDOM + N_SEALED_RANDOM + N_MUTATIONS >= 10_000
    assert stats.max_seconds < MAX_CALL_SECONDS
    assert peak < MAX_PEAK_BYTES
    assert stats.parsed >= N_MUTATIONS // 4, "too few inputs got past the integrity checks"
    assert stats.accepted >= 100  # unmodified-looking mutations still decode


def test_corpus_is_valid_and_varied(corpus: list[bytes]) -> None:
    assert len(corpus) >= 150
    assert len(set(corpus)) >= 100
    for data in corpus:
        assert Program.from_wire(data).to_wire() == data
