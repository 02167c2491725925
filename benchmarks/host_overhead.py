"""The driver's own host cost per dispatch, next to the floors of CPython; prints one JSON object.

Everything is measured in one run, in interleaved rounds (each round takes
``--repeats`` samples of every case, in turn), and reported as medians of the
per-round medians, so machine noise hits every case alike:

- **floors**: an asyncio future set and awaited; a future resolved through one
  extra loop turn; a blocked worker thread handing a result back with
  ``loop.call_soon_threadsafe`` (the cheapest cross-thread completion);
- **null device, inline**: a backend written against the backend-author seam
  whose ``enqueue`` resolves the dispatch at once (outputs allocated once, so
  the device costs ~nothing). The driver's own cost is the awaited round trip
  minus the bare-future floor;
- **null device, thread**: the same with a worker thread resolving each launch,
  minus the thread hand-off floor;
- **reference**: the warm awaited round trip of a 64-lane xor on the reference
  backend minus the engine alone on the same work (precompiled, no driver).

Each driver case also gets a breakdown by module (``cProfile`` over a separate
batch of dispatches, own time per module scaled to the measured median, so the
shares are those of the profile and the total is the real one; time blocked in
epoll or on a lock is its own line). Modules stand in for phases: ``backend``
(front end and pipeline lookup), ``plan``, ``pending``, ``prefetch``,
``telemetry``, the engine's own modules. The CUDA path on
the fake device is not measured here yet.

Goals (issue 14, as added cost over the floor): null inline <= 6 us, null thread
<= 10 us, reference <= engine + 8 us.

    python benchmarks/host_overhead.py [--rounds 15] [--repeats 200]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import platform
import pstats
import queue
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from vyre_async import VyreBackend, __version__
from vyre_async.capabilities import BackendCapabilities
from vyre_async.config import DispatchConfig
from vyre_async.ir import Program
from vyre_async.pending import PendingDispatch
from vyre_async.pipeline import Launch
from vyre_async.plan import normalize_inputs, plan_dispatch
from vyre_async.programs import elementwise_xor
from vyre_reference import ReferenceBackend
from vyre_reference.compile import compile_program
from vyre_reference.engine import run_plan

N = 64
PROGRAM = elementwise_xor(N)
RNG = np.random.default_rng(0)
INPUTS = [RNG.integers(0, 2**32, N, dtype=np.uint32) for _ in range(2)]
GOALS_US = {"null_inline": 6.0, "null_thread": 10.0, "reference": 8.0}


class NullBackend(VyreBackend):
    """A backend whose device does nothing: outputs are allocated once and reused.

    ``threaded=False`` resolves inside ``enqueue``; ``threaded=True`` hands every
    launch to one worker thread that resolves it (like a completion thread).
    """

    id = "null-bench"
    version = "1"

    def __init__(self, *, threaded: bool) -> None:
        super().__init__(prefetch=True)
        self.threaded = threaded
        self._outputs: dict[int, list[np.ndarray]] = {}
        self._queue: queue.SimpleQueue[Launch | None] = queue.SimpleQueue()
        if threaded:
            threading.Thread(target=self._serve, daemon=True, name="null-device").start()

    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities(max_workgroup_size=(1024, 1024, 64), max_workgroup_lanes=1024)

    def build_pipeline(self, program: Program, config: DispatchConfig) -> Any:
        return program

    def _outputs_for(self, launch: Launch) -> list[np.ndarray]:
        key = id(launch.plan.program)
        out = self._outputs.get(key)
        if out is None:
            out = [
                np.zeros(launch.plan.count_of(d.name), d.dtype.numpy) for d in launch.plan.outputs
            ]
            self._outputs[key] = out
        return out

    def enqueue(self, launch: Launch) -> PendingDispatch:
        if self.threaded:
            self._queue.put(launch)
        else:
            launch.completer.resolve(self._outputs_for(launch))
        return launch.pending

    def _serve(self) -> None:
        while (launch := self._queue.get()) is not None:
            launch.completer.resolve(self._outputs_for(launch))

    async def shutdown(self) -> None:
        self._queue.put(None)
        await super().shutdown()


# Floors -----------------------------------------------------------------------------


async def bare_future() -> None:
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(None)
    await fut


async def future_one_turn() -> None:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    loop.call_soon(fut.set_result, None)
    await fut


class HandOff:
    """A blocked worker thread that completes a loop future per job (the bare hand-off)."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None]
        self.jobs = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, daemon=True, name="hand-off")
        self.thread.start()

    def _serve(self) -> None:
        while (job := self.jobs.get()) is not None:
            loop, fut = job
            loop.call_soon_threadsafe(fut.set_result, None)

    async def __call__(self) -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.jobs.put((loop, fut))
        await fut

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()


# Sampling ---------------------------------------------------------------------------


async def sample_async(fn: Callable[[], Awaitable[Any]], n: int) -> float:
    """Median seconds of ``n`` awaited calls."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        await fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sample_sync(fn: Callable[[], Any], n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def engine_alone() -> Callable[[], Any]:
    """The reference engine on the same work, precompiled, without the driver."""
    compiled = compile_program(PROGRAM)

    def run() -> Any:
        arrays = normalize_inputs(PROGRAM, INPUTS)
        plan = plan_dispatch(PROGRAM, [a.size for a in arrays])
        return run_plan(plan, arrays, compiled=compiled)

    return run


_SRC = Path(__file__).resolve().parents[1] / "src"


_WAITS = ("poll", "acquire", "wait", "select")


def _module_of(filename: str, name: str) -> str:
    """Group one profiled function: a vyre module, a library, or blocked time."""
    if filename == "~":  # a builtin: "<method 'poll' of 'select.epoll' objects>" etc.
        return "blocked (epoll, locks)" if any(w in name for w in _WAITS) else "builtins"
    path = Path(filename)
    try:
        return str(path.resolve().relative_to(_SRC)).removesuffix(".py")
    except ValueError:
        pass
    for library in ("numpy", "anyio", "asyncio", "threading", "queue"):
        if library in path.parts or path.stem == library:
            return library
    if path.name == "host_overhead.py":
        return "benchmark (null device, loop)"
    return "other"


async def breakdown(dispatch: Callable[[], Awaitable[Any]], n: int, total_us: float) -> Any:
    """Own time per module under cProfile, scaled so the shares add up to ``total_us``."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(n):
        await dispatch()
    profile.disable()
    stats = pstats.Stats(profile)
    own: dict[str, float] = defaultdict(float)
    for (filename, _line, name), row in stats.stats.items():  # type: ignore[attr-defined]
        own[_module_of(filename, name)] += row[2]  # tottime
    whole = sum(own.values()) or 1.0
    ranked = sorted(own.items(), key=lambda kv: -kv[1])
    return {name: round(total_us * t / whole, 2) for name, t in ranked if t / whole >= 0.01}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    inline = NullBackend(threaded=False)
    threaded = NullBackend(threaded=True)
    reference = ReferenceBackend()
    hand_off = HandOff()
    engine = engine_alone()

    def dispatcher(backend: VyreBackend) -> Callable[[], Awaitable[Any]]:
        async def go() -> Any:
            return await backend.dispatch(PROGRAM, INPUTS)

        return go

    cases: dict[str, Callable[[], Awaitable[Any]]] = {
        "floor_bare_future": bare_future,
        "floor_future_one_loop_turn": future_one_turn,
        "floor_thread_hand_off": hand_off,
        "null_inline": dispatcher(inline),
        "null_thread": dispatcher(threaded),
        "reference": dispatcher(reference),
    }
    for fn in cases.values():  # warm: compile, caches, thread start
        await sample_async(fn, 200)
    rounds: dict[str, list[float]] = {name: [] for name in [*cases, "engine_alone"]}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            rounds[name].append(await sample_async(fn, args.repeats))
        rounds["engine_alone"].append(sample_sync(engine, args.repeats))
    median_us = {name: statistics.median(v) * 1e6 for name, v in rounds.items()}
    spread_us = {
        name: round((max(v) - min(v)) * 1e6, 2) for name, v in rounds.items()
    }  # of the per-round medians
    own = {
        "null_inline": median_us["null_inline"] - median_us["floor_bare_future"],
        "null_thread": median_us["null_thread"] - median_us["floor_thread_hand_off"],
        "reference": median_us["reference"] - median_us["engine_alone"],
    }
    profiles = {name: await breakdown(cases[name], args.profile, median_us[name]) for name in own}
    hand_off.close()
    for backend in (inline, threaded, reference):
        await backend.aclose()
    return {
        "benchmark": "host_overhead",
        "program": f"xor, {N} lanes",
        "median_us": {k: round(v, 2) for k, v in median_us.items()},
        "round_spread_us": spread_us,
        "driver_own_us": {k: round(v, 2) for k, v in own.items()},
        "over_floor_of": {
            "null_inline": "floor_bare_future",
            "null_thread": "floor_thread_hand_off",
            "reference": "engine_alone",
        },
        "goals_us": GOALS_US,
        "goals_met": {k: own[k] <= GOALS_US[k] for k in own},
        "breakdown_us_by_module": profiles,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "vyre_async": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": f"{platform.machine()}, {platform.system()} {platform.release()}",
        "date": time.strftime("%Y-%m-%d"),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds")
    parser.add_argument("--repeats", type=int, default=200, help="samples per case per round")
    parser.add_argument("--profile", type=int, default=2000, help="dispatches per breakdown")
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=2))
