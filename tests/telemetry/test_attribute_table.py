"""The span attribute table in docs/tracing.md is exactly what the spans carry.

One table, one test: the table is parsed, workloads that between them set every
documented key run on the reference backend, a test backend and the CUDA backend
on the fake device (``tests/cupy/fake_cupy.py``), and the keys of every finished
span are compared with the table, per span name, both ways, and each value with
its documented type. A misspelt key in the code (or in the docs) shows up as one
missing and one undocumented key.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import numpy as np
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.cupy.emulator import build_emulator
from tests.cupy.fake_cupy import FakeDevice
from tests.driver.fakes import DelayBackend
from tests.helpers import backend_of
from tests.policies.kernels import binop
from vyre_async import DispatchConfig, DispatchTimeout, VyreBackend
from vyre_async._graph import ArmGraph
from vyre_async.ir.ops import CORE_OPS
from vyre_async.programs import elementwise_xor
from vyre_async.testing.corpus import cases
from vyre_reference import ReferenceExecutor, reference_backend

pytestmark = pytest.mark.anyio
TABLE = Path(__file__).resolve().parents[2] / "docs" / "tracing.md"
SPANS = {"dispatch": "vyre.dispatch", "graph": "vyre.graph"}
N = 64
XOR = elementwise_xor(N)
INPUTS = [np.arange(N, dtype=np.uint32), np.ones(N, np.uint32)]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: The documented type of a key, as a check of one attribute value.
TYPES: dict[str, Callable[[object], bool]] = {
    "string": lambda v: isinstance(v, str),
    "int": _is_int,
    "float": lambda v: isinstance(v, float),
    "bool": lambda v: isinstance(v, bool),
    "int[3]": lambda v: isinstance(v, tuple | list) and len(v) == 3 and all(map(_is_int, v)),
}


def documented() -> tuple[dict[str, set[str]], dict[str, str]]:
    """Return ``{span name: keys}`` and ``{key: type}`` from docs/tracing.md's table."""
    text = TABLE.read_text()
    section = text[text.index("### Span attributes") :]
    section = section[: section.index("\n#", 1)]
    table: dict[str, set[str]] = {name: set() for name in SPANS.values()}
    types: dict[str, str] = {}
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert rows, "the span attribute table has no rows"
    for row in rows:
        key_cell, span_cell, type_cell, _ = (cell.strip() for cell in row.strip("|").split("|"))
        (key,) = re.fullmatch(r"`([a-z0-9_.]+)`", key_cell).groups()  # type: ignore[union-attr]
        assert key not in types, f"{key} has two rows"
        assert type_cell in TYPES, f"{key}: unknown type {type_cell!r}"
        types[key] = type_cell
        for span in span_cell.split(","):
            table[SPANS[span.strip()]].add(key)
    return table, types


@pytest.fixture(scope="module")
def fake_cupy() -> Iterator[FakeDevice]:
    """The fake CUDA device, installed as ``cupy`` (the kernels the fake device knows)."""
    from tests.cupy.conftest import fake_device, fake_device_programs

    programs = fake_device_programs()
    library = build_emulator(programs, library=True).wait().binary
    with fake_device(library, programs) as device:
        yield device


async def _test_backend() -> None:
    """A test backend with a stream and device timing; labels, a timeout, a cancelled await."""
    backend = backend_of(DelayBackend, delay=0.001)
    try:
        await backend.dispatch(XOR, INPUTS, DispatchConfig(label="l", profile="p"))
        slow = backend_of(DelayBackend, delay=0.5)
        try:
            with pytest.raises(DispatchTimeout):
                await slow.dispatch(XOR, INPUTS, DispatchConfig(timeout=0.01))
            with anyio.move_on_after(0.01):
                await slow.dispatch(XOR, INPUTS)
        finally:
            await slow.aclose()
    finally:
        await backend.aclose()


class _NoLogicalAnd(ReferenceExecutor):
    id = "no-land"

    def supported_ops(self) -> frozenset[str]:
        return CORE_OPS - {"bin.land"}


async def _reference() -> None:
    """Shape prediction, a batch, and arm graphs joined on the device and on the host."""
    backend = reference_backend(inline_ns=0)
    try:
        for _ in range(3):  # the third dispatch is scored against a prediction
            await backend.dispatch(XOR, INPUTS)
        for pending in backend.compile(XOR).dispatch_batch([INPUTS] * 3):
            await pending
        for pending in backend.compile(XOR).dispatch_batch([INPUTS] * 3, fusion="force"):
            await pending
        no_land = VyreBackend(_NoLogicalAnd(), prefetch=False)  # cannot build a fused program
        try:
            for pending in no_land.compile(XOR).dispatch_batch([INPUTS] * 2, fusion="force"):
                await pending
        finally:
            await no_land.aclose()
        for residency in ("auto", "host"):
            graph = ArmGraph(label="g")
            for name in "xy":
                graph.resource(name, "u32", N, initial=np.arange(N, dtype=np.uint32))
            graph.resource("p", "u32", N)
            graph.resource("q", "u32", N)
            xor = binop("xor", N)
            graph.arm(xor, {"a": "x", "b": "y", "out": "p"}, label="p")
            graph.arm(xor, {"a": "p", "b": "y", "out": "q"}, label="q")  # waits for p
            await graph.run(backend, residency=residency)  # type: ignore[arg-type]
    finally:
        await backend.shutdown()


async def _cuda(fake_cupy: FakeDevice) -> None:
    """Uploads into a private arena, graph replays into the graph's arena, a batch run plain."""
    from vyre_cupy import create_backend

    backend = create_backend(disk_cache=None)
    try:
        pipeline = backend.compile(elementwise_xor(1001))  # a size of its own: a fresh graph
        a = np.arange(1001, dtype=np.uint32)
        await pipeline.dispatch([a, a])
        for pending in pipeline.dispatch_batch([[a, a]] * 3, mode="command_reuse"):
            await pending
        mixed = [[a, a], [a[:500], a[:500]]]  # mixed shapes cannot run as one persistent batch
        for pending in pipeline.dispatch_batch(mixed, mode="persistent"):
            await pending
    finally:
        await backend.shutdown()
    # A grid-barrier program on a device without cooperative launch: split, each segment
    # timed by device events.
    fake_cupy.cooperative = False
    try:
        split = create_backend(disk_cache=None)
    finally:
        fake_cupy.cooperative = True
    try:
        case = next(c for c in cases() if c.name == "grid_barrier_many_phases")
        await split.dispatch(case.program, case.inputs, case.config())
    finally:
        await split.shutdown()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # spans do not depend on the loop
async def test_every_documented_attribute_is_on_a_span_and_no_other(
    spans: InMemorySpanExporter, fake_cupy: FakeDevice
) -> None:
    await _test_backend()
    await _reference()
    await _cuda(fake_cupy)
    table, types = documented()
    seen: dict[str, set[str]] = {name: set() for name in SPANS.values()}
    for span in spans.get_finished_spans():
        if span.name in seen:
            attributes = span.attributes or {}
            seen[span.name] |= set(attributes)
            for key, value in attributes.items():
                kind = types.get(key)
                assert kind is None or TYPES[kind](value), f"{key} = {value!r} is not {kind}"
    for name in SPANS.values():
        missing, extra = table[name] - seen[name], seen[name] - table[name]
        assert not missing, f"documented for {name} but on no span: {sorted(missing)}"
        assert not extra, f"on {name} spans but not in docs/tracing.md: {sorted(extra)}"
