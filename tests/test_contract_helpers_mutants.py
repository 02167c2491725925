"""The shipped contract suite's helpers do what its tests assume (issue 28, "testing" triage).

mutmut's run on `vyre_async.testing.test_contract` left mutants of the suite's
helpers that the suite, run on the correct reference backend, still passed: a
wrong helper mostly makes a contract test weaker, which a correct backend does
not notice. Backend authors run these helpers' programs on their backends (and
this repository's CUDA and reliability tests import them), so each is pinned
here as shipped:

- the programs (``spin``, ``lane_ids``, ``_rw_program``, ``_copy_program``,
  ``resident_order_programs``): their exact buffer declarations and op ids (what
  a backend compiles, and what its errors name), and their outputs on the
  reference backend, byte for byte, on shapes and values the suite does not use
  itself (a 3-D workgroup for ``lane_ids``, wrapping u32 values); the slow
  kernel really spins (a huge count runs into its deadline);
- ``_off_the_loop``: the call's value or its own exception, on a daemon thread
  named for the suite, bounded by 30 s by default;
- ``_turns_lasting``: at most three timed looks (one for a slow backend), a
  count of at least ``least`` scaled to ``seconds``, capped at 2**31 (a u32);
  timed on a fake clock, so nothing here races;
- ``_rss_bytes``: the resident set in bytes (it grows by what is touched);
- ``_resident_setup``: its skip names the backend without resident buffers;
- the kernels themselves, by fingerprint (`SHIPPED_KERNELS`): the slow kernel's
  guarded store is first met after 1 529 123 826 turns, far beyond the suite's
  counts but a second's work on a GPU, so a change to its recurrence or guard
  is a change to the contract too.
"""

from __future__ import annotations

import mmap
import threading
import types
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, cast

import anyio
import numpy as np
import pytest

from vyre_async import (
    Access,
    DispatchConfig,
    DispatchTimeout,
    DType,
    InvalidProgram,
    Program,
    UnsupportedFeature,
    VyreBackend,
)
from vyre_async.testing import test_contract as suite
from vyre_reference import reference_backend

pytestmark = pytest.mark.anyio

U32_MAX = 0xFFFF_FFFF
HOURS = 2_000_000_000  # spin turns: hours on the reference engine

R, W, RW, UNI = Access.READ, Access.WRITE, Access.READ_WRITE, Access.UNIFORM


def _decls(program: Program) -> list[tuple[str, int, Access, DType, int]]:
    return [(d.name, d.binding, d.access, d.dtype, d.count) for d in program.buffers]


def _programs() -> dict[str, Program]:
    slow_add, triple, copy = suite.resident_order_programs()
    return {
        "spin": suite.spin(),
        "spin4": suite.spin(4),
        "lane_ids": suite.lane_ids((4, 2, 3)),
        "slow_add": slow_add,
        "triple": triple,
        "copy": copy,
    }


# The programs, as declared -------------------------------------------------------------------

DECLARED = {
    "spin": ("test.spin", (1, 1, 1), [("n", 0, UNI, DType.U32, 1), ("out", 1, W, DType.U32, 1)]),
    "spin4": ("test.spin", (4, 1, 1), [("n", 0, UNI, DType.U32, 1), ("out", 1, W, DType.U32, 4)]),
    "lane_ids": ("test.lane_ids", (4, 2, 3), [("out", 0, W, DType.U32, 24)]),
    "slow_add": (
        "test.slow_add",
        (64, 1, 1),
        [("x", 0, RW, DType.U32, 64), ("n", 1, UNI, DType.U32, 1)],
    ),
    "triple": ("test.triple", (64, 1, 1), [("x", 0, RW, DType.U32, 64)]),
    "copy": ("test.copy", (64, 1, 1), [("x", 0, R, DType.U32, 64), ("out", 1, W, DType.U32, 64)]),
}


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_each_program_declares_its_buffers_at_consecutive_bindings(name: str) -> None:
    """What a backend compiles: buffers bound at slots 0, 1, ..., sized, and the op id."""
    program = _programs()[name]
    op_id, workgroup, decls = DECLARED[name]
    assert (program.op_id, program.workgroup_size, _decls(program)) == (op_id, workgroup, decls)


async def test_a_wrong_input_count_names_each_program_by_its_op_id() -> None:
    programs = _programs()
    one = np.zeros(1, np.uint32)
    expected = [
        ("spin", [], "program test.spin takes 1 input(s) (n:u32), got 0"),
        ("lane_ids", [one], "program test.lane_ids takes 0 input(s) (none), got 1"),
        ("slow_add", [one], "program test.slow_add takes 2 input(s) (x:u32, n:u32), got 1"),
        ("triple", [], "program test.triple takes 1 input(s) (x:u32), got 0"),
        ("copy", [], "program test.copy takes 1 input(s) (x:u32), got 0"),
    ]
    async with reference_backend() as backend:
        for name, inputs, message in expected:
            with pytest.raises(InvalidProgram) as info:
                backend.dispatch(programs[name], inputs)
            assert str(info.value).partition("\n")[0] == message


async def test_inputs_of_another_length_than_declared_are_refused() -> None:
    """The helpers' input buffers are sized: a dispatch with a wrong-length input fails."""
    p = _programs()
    n2 = np.array([5, 7], np.uint32)
    x65 = np.arange(65, dtype=np.uint32)
    n1 = np.array([5], np.uint32)
    calls = [
        (p["spin"], [n2], "input for buffer 'n' has 2 elements; the buffer declares count=1"),
        (p["slow_add"], [x65[:64], n2], "input for buffer 'n' has 2 elements"),
        (p["slow_add"], [x65, n1], "input for buffer 'x' has 65 elements"),
        (p["triple"], [x65], "input for buffer 'x' has 65 elements; the buffer declares count=64"),
        (p["copy"], [x65], "input for buffer 'x' has 65 elements; the buffer declares count=64"),
    ]
    async with reference_backend() as backend:
        for program, inputs, message in calls:
            with pytest.raises(InvalidProgram, match=message):
                backend.dispatch(program, inputs)


# The programs, as run ------------------------------------------------------------------------


async def test_spin_sums_the_range_it_is_given_into_its_one_output() -> None:
    async with reference_backend() as backend:
        for n in (0, 1, 2, 100, 3000):
            outputs = await backend.dispatch(suite.spin(), [np.array([n], np.uint32)])
            assert [o.tolist() for o in outputs] == [[sum(range(n))]]
        wide = await backend.dispatch(suite.spin(3), [np.array([10], np.uint32)])
        assert [o.tolist() for o in wide] == [[45, 0, 0]]  # only lane 0's sum is stored


@pytest.mark.parametrize(
    "shape", [(4, 2, 3), (3, 1, 5), (1, 4, 4), (5, 3, 1), (64, 1, 1), (1, 64, 1), (1, 1, 64)]
)
async def test_lane_ids_gives_every_lane_its_linear_id_plus_one(
    shape: tuple[int, int, int],
) -> None:
    """``out[l] = l + 1``, x fastest, on every workgroup shape (the suite uses one axis)."""
    lanes = shape[0] * shape[1] * shape[2]
    async with reference_backend() as backend:
        outputs = await backend.dispatch(
            suite.lane_ids(shape), [], DispatchConfig(grid_override=(1, 1, 1))
        )
    assert [o.tolist() for o in outputs] == [list(range(1, lanes + 1))]


async def test_the_ordering_kernels_add_one_triple_and_copy_byte_for_byte() -> None:
    slow_add, triple, copy = suite.resident_order_programs()
    x = np.random.default_rng(3).integers(0, 2**32, 64, dtype=np.uint32)
    x[:4] = [0, 1, U32_MAX, 0x5555_5556]  # the u32 wraps: +1 and *3 go past 2**32
    with np.errstate(over="ignore"):
        plus_one, tripled = x + np.uint32(1), x * np.uint32(3)
    async with reference_backend() as backend:
        for spins in (0, 3000, 20000):  # the counts the ordering tests use
            added = await backend.dispatch(slow_add, [x, np.array([spins], np.uint32)])
            assert [o.tobytes() for o in added] == [plus_one.tobytes()], spins
        assert [o.tobytes() for o in await backend.dispatch(triple, [x])] == [tripled.tobytes()]
        assert [o.tobytes() for o in await backend.dispatch(copy, [x])] == [x.tobytes()]
        small = suite.resident_order_programs(8)
        assert [p.workgroup_size for p in small] == [(8, 1, 1)] * 3
        outputs = await backend.dispatch(small[0], [x[:8], np.array([7], np.uint32)])
        assert [o.tobytes() for o in outputs] == [plus_one[:8].tobytes()]


@pytest.mark.parametrize("which", ["slow_add", "spin"])
async def test_the_slow_kernels_really_spin_until_their_deadline(which: str) -> None:
    """A count of hours keeps the kernel running: it ends at its deadline, not at once."""
    slow_add, _, _ = suite.resident_order_programs()
    hours = np.array([HOURS], np.uint32)
    program, inputs = (
        (slow_add, [np.arange(64, dtype=np.uint32), hours])
        if which == "slow_add"
        else (suite.spin(), [hours])
    )
    async with reference_backend() as backend:
        backend.compile(program)
        with anyio.fail_after(30), pytest.raises(DispatchTimeout):
            await backend.dispatch(program, inputs, DispatchConfig(timeout=0.2))


# _resident_setup ------------------------------------------------------------------------------


class _NoResidents:
    id = "no-residents"

    def upload(self, array: np.ndarray) -> object:
        raise UnsupportedFeature("resident buffers are not supported")


def test_resident_setup_skips_a_backend_without_resident_buffers_by_name() -> None:
    backend = cast(VyreBackend, _NoResidents())
    with pytest.raises(pytest.skip.Exception) as info:
        suite._resident_setup(backend)
    assert info.value.msg == "backend 'no-residents' has no resident buffers"


async def test_resident_setup_gives_x0_its_resident_copy_and_the_ordering_kernels() -> None:
    async with reference_backend() as backend:
        x0, x, programs = suite._resident_setup(backend)
        assert x0.tolist() == list(range(64)) and x0.dtype == np.uint32
        assert backend.download(x).tobytes() == x0.tobytes()
        assert programs == suite.resident_order_programs(64)
        backend.free(x)


# _off_the_loop --------------------------------------------------------------------------------


async def test_off_the_loop_returns_the_value_of_a_call_run_on_a_daemon_thread() -> None:
    caller = threading.current_thread()
    seen: list[tuple[str, bool, bool]] = []
    value = object()

    def call() -> object:
        thread = threading.current_thread()
        seen.append((thread.name, thread.daemon, thread is caller))
        return value

    assert await suite._off_the_loop(call) is value
    assert seen == [("vyre-contract-dispatch", True, False)]


async def test_off_the_loop_raises_the_calls_own_exception() -> None:
    error = KeyError("from dispatch()")

    def call() -> object:
        raise error

    with pytest.raises(KeyError) as info:
        await suite._off_the_loop(call)
    assert info.value is error


async def test_off_the_loop_fails_a_call_that_outlasts_its_bound() -> None:
    release = threading.Event()
    with anyio.move_on_after(10) as outer:
        try:
            with pytest.raises(TimeoutError):
                await suite._off_the_loop(lambda: release.wait(30), 0.1)
        finally:
            release.set()  # the abandoned thread ends
    assert not outer.cancelled_caught, "the call was not bounded"


async def test_off_the_loop_bounds_a_call_by_30_seconds_unless_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bounds: list[float | None] = []

    def fail_after(seconds: float | None) -> AbstractContextManager[anyio.CancelScope]:
        bounds.append(seconds)
        return anyio.fail_after(seconds)

    monkeypatch.setattr(suite, "anyio", types.SimpleNamespace(fail_after=fail_after))
    assert await suite._off_the_loop(lambda: 1) == 1
    assert await suite._off_the_loop(lambda: 2, 7.5) == 2
    assert bounds == [30.0, 7.5]


# _turns_lasting (on a fake clock) -------------------------------------------------------------


class _Timed:
    """A backend whose every dispatch takes ``took`` seconds of a fake clock."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, took: float) -> None:
        self.now = 64.0  # not 0: a sum of start and end differs from their difference
        self.took = took
        self.dispatched: list[tuple[Program, list[int]]] = []

        def clock() -> float:
            return self.now

        monkeypatch.setattr(suite, "time", types.SimpleNamespace(perf_counter=clock))

    def dispatch(self, program: Program, inputs: list[np.ndarray]) -> Any:
        self.dispatched.append((program, [int(v) for v in inputs[0]]))
        self.now += self.took
        return self._settled()

    async def _settled(self) -> list[np.ndarray]:
        return [np.zeros(1, np.uint32)]

    async def turns(self, seconds: float, least: int) -> int:
        return await suite._turns_lasting(cast(VyreBackend, self), seconds, least)


@pytest.fixture
def timed(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], _Timed]:
    """Backends timed on one fake clock, put in place of the suite's ``time`` module."""
    return lambda took: _Timed(monkeypatch, took)


async def test_turns_lasting_scales_least_by_three_looks_at_a_fast_backend(
    timed: Callable[[float], _Timed],
) -> None:
    backend = timed(0.125)  # least turns take 1/4 of the time asked for
    assert await backend.turns(0.5, 200_000) == 800_000
    assert backend.dispatched == [(suite.spin(), [200_000])] * 3


async def test_turns_lasting_looks_once_at_a_backend_as_slow_as_asked(
    timed: Callable[[float], _Timed],
) -> None:
    for took in (0.5, 2.0):  # least turns take exactly / more than the time asked for
        backend = timed(took)
        assert await backend.turns(0.5, 200_000) == 200_000  # never fewer than least
        assert backend.dispatched == [(suite.spin(), [200_000])]


async def test_turns_lasting_caps_the_count_at_2_to_the_31(
    timed: Callable[[float], _Timed],
) -> None:
    backend = timed(0.0)  # no measurable time: the count would overflow a u32
    turns = await backend.turns(0.5, 200_000)
    assert turns == 2**31
    assert np.array([turns], np.uint32)[0] == turns
    assert len(backend.dispatched) == 3


# _rss_bytes -----------------------------------------------------------------------------------


def test_rss_bytes_counts_the_bytes_of_pages_the_process_touches() -> None:
    """Fresh private pages (a mapping of its own: not memory malloc freed earlier)."""
    size = 64 * 2**20
    block = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        before = suite._rss_bytes()
        np.frombuffer(block, np.uint8)[:: mmap.PAGESIZE] = 1  # every page written
        after = suite._rss_bytes()
    finally:
        block.close()
    assert type(before) is int and type(after) is int
    assert size - 2**20 <= after - before < 4 * size


#: The suite's kernels as shipped, by fingerprint. What they compute beyond the counts the
#: suite dispatches (the slow kernel's guarded store, first met after 1 529 123 826 turns,
#: which a GPU runs in about a second) is part of what a backend author runs: a change to
#: a kernel is a change to the contract, made on purpose with this table.
SHIPPED_KERNELS = {
    "spin()": "71b7a72a4e189f65de0c727cc1e25ac8",
    "spin(64)": "63356d4dd1f0ad4907732c0be7e5170a",
    "lane_ids((4, 2, 3))": "7d4125d0cce045e311194de2d3e79df9",
    "resident_order_programs(64)[0]": "b8faa1b60545949750bb945a2bba5c07",
    "resident_order_programs(64)[1]": "5265f3f8b01a40f5822a7b5b8203d7b2",
    "resident_order_programs(64)[2]": "1f2c43b52eb3db762905f75199182e78",
}


def test_the_suites_kernels_are_the_shipped_ones() -> None:
    built = {
        "spin()": suite.spin(),
        "spin(64)": suite.spin(64),
        "lane_ids((4, 2, 3))": suite.lane_ids((4, 2, 3)),
        **{
            f"resident_order_programs(64)[{i}]": program
            for i, program in enumerate(suite.resident_order_programs(64))
        },
    }
    assert {name: p.fingerprint().hex()[:32] for name, p in built.items()} == SHIPPED_KERNELS
