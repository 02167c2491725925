"""Benchmark the canonical wire form: cold encode + fingerprint, and decode, of ~10 000 nodes.

Run ``python benchmarks/wire.py [--repeats N]``; it prints one JSON object::

    {"benchmark": "wire", "nodes": ..., "wire_bytes": ...,
     "encode_fingerprint_ms": {"median": ..., "p90": ..., "min": ...},
     "decode_ms": {...}, "python": ..., "machine": ...}

"Cold" means every repeat encodes a fresh `Program` object, so the per-program
memo (which caches the wire bytes and the fingerprint) is never hit. The
target is well under 50 ms for encode + fingerprint on a slow 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

from vyre_async.ir import (
    Access,
    Assign,
    Atomic,
    Barrier,
    Block,
    BufferDecl,
    BufLen,
    Cast,
    DType,
    Fma,
    If,
    Let,
    Load,
    Loop,
    Program,
    Return,
    Select,
    Stmt,
    Store,
    Un,
    Var,
    f32,
    gid,
    i32,
    lid,
    u32,
    wgid,
)
from vyre_async.ir.walk import iter_exprs, iter_stmts

TARGET_NODES = 10_000


def _unit(k: int) -> list[Stmt]:
    """One chunk of kernel-like code (about 90 nodes); with the tail, every kind of node."""
    i, x, y, acc = Var("i"), Var(f"x{k}"), Var(f"y{k}"), Var(f"acc{k}")
    return [
        Let(f"x{k}", Load("src", i + k)),
        Let(f"y{k}", Fma(x, f32(1.5), Un("sqrt", Un("abs", x)) * f32(-0.0))),
        Let(f"acc{k}", Cast(DType.U32, y)),
        Loop(
            f"j{k}",
            u32(0),
            u32(4),
            [
                Assign(f"acc{k}", acc + Load("idx", Var(f"j{k}") + wgid() * u32(4))),
                Store("shared", lid(), acc ^ (acc >> u32(3))),
                Barrier(),
            ],
        ),
        If(
            i.lt(BufLen("out")).land(x.gt(f32(0.25))),
            [
                Store("out", i, Select(y.ge(x), y, x - y)),
                Block([Let(f"t{k}", Cast(DType.I32, acc) * i32(-3))]),
            ],
            [Store("counts", i % u32(16), Atomic("add", "counts", u32(0), u32(1)))],
        ),
    ]


def build_program(target_nodes: int = TARGET_NODES) -> tuple[list[BufferDecl], list[Stmt]]:
    """Return the buffers and body of a valid program with about ``target_nodes`` nodes."""
    buffers = [
        BufferDecl("src", 0, Access.READ, DType.F32),
        BufferDecl("idx", 1, Access.UNIFORM, DType.U32, 64),
        BufferDecl("out", 2, Access.WRITE, DType.F32, 4096),
        BufferDecl("counts", 3, Access.READ_WRITE, DType.U32, 16),
        BufferDecl("shared", 4, Access.WORKGROUP, DType.U32, 256),
    ]
    body: list[Stmt] = [Let("i", gid())]
    k = 0
    while count_nodes(body) < target_nodes:
        body.extend(_unit(k))
        k += 1
    body.append(If(Var("i").ge(BufLen("src")), [Return()]))
    return buffers, body


def count_nodes(body: list[Stmt] | tuple[Stmt, ...]) -> int:
    """Return the number of statement and expression nodes in ``body``."""
    return sum(1 for _ in iter_stmts(body)) + sum(1 for _ in iter_exprs(body))


def _summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return {
        "median": round(statistics.median(ordered) * 1e3, 3),
        "p90": round(p90 * 1e3, 3),
        "min": round(ordered[0] * 1e3, 3),
    }


def run(repeats: int) -> dict[str, object]:
    """Run the benchmark and return the JSON-ready result."""
    buffers, body = build_program()
    nodes = count_nodes(body)
    encode: list[float] = []
    wire = b""
    for attempt in range(repeats + 3):  # the first 3 are warm-up
        program = Program(buffers, 256, body, op_id="bench.wire")  # fresh: empty memo
        start = time.perf_counter()
        wire = program.to_wire()
        program.fingerprint()
        elapsed = time.perf_counter() - start
        if attempt >= 3:
            encode.append(elapsed)
    decode: list[float] = []
    for attempt in range(repeats + 3):
        start = time.perf_counter()
        decoded = Program.from_wire(wire)
        elapsed = time.perf_counter() - start
        if attempt >= 3:
            decode.append(elapsed)
    assert decoded.to_wire() == wire
    return {
        "benchmark": "wire",
        "nodes": nodes,
        "wire_bytes": len(wire),
        "repeats": repeats,
        "encode_fingerprint_ms": _summary(encode),
        "decode_ms": _summary(decode),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
    }


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the benchmark and print its JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=30, help="timed repeats (default 30)")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
