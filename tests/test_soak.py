"""Soak: valid and hostile work interleaved from many tasks, bounded in time (CI: ~20 s).

Forty tasks draw, at random and for ``VYRE_SOAK_SECONDS`` in all (split between
asyncio and trio), one of:

- a standard workload with fresh random inputs, checked byte for byte against
  its numpy oracle;
- a hostile call (wrong types, sizes, dtypes, configs, owners, a closed backend,
  an invalid program, oversize inputs), which must raise a `BackendError` whose
  message ends with a ``Fix:``;
- a long dispatch whose await is cancelled, or which runs into its timeout;
- an increment of a resident buffer the task owns (READ_WRITE, checked at the end);
- corrupting an on-disk pipeline cache entry (truncation, garbage, a foreign
  header, deletion), then compiling from that cache in a fresh backend, which
  must recompile with a warning;
- a dispatch whose done-callback waits on its own backend: downloads a
  resident buffer, dispatches and waits (``dispatch_sync`` or ``result()``), or
  closes a backend of its own (issue 26: none of it may hang);
- a request to the example service (uvicorn in a subprocess): valid ones
  checked exactly, hostile ones (nested bodies, unknown routes and methods,
  booleans and NaN for numbers, empty arrays, lying counts, odd ``Host``
  headers) refused with 4xx JSON holding a message and a Fix, never a 5xx.

Meanwhile the OpenTelemetry SDK records every dispatch through a span processor
that raises at ``on_start`` or ``on_end`` one time in five: no dispatch may
notice, and every fault must be reported (``threading.excepthook``).

Asserted: no wrong result, every failure a `BackendError` with a Fix, nothing
hangs (a hard deadline), and nothing leaks: no dispatch left in flight, no
extra threads, resident buffers freed, RSS growth bounded.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import math
import os
import queue
import random
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from opentelemetry.sdk.trace import SpanProcessor

from tests import otel_sdk
from tests.driver.fakes import BytesBackend
from tests.helpers import backend_of
from vyre_async import (
    BackendClosed,
    BackendError,
    DispatchConfig,
    DispatchTimeout,
    ResidentBuffer,
)
from vyre_async._backend import VyreBackend
from vyre_async._cache.disk import DiskPipelineCache, PipelineCacheWarning
from vyre_async.ir import Access, BufferDecl, DType, Load, Program, Store, gid, ops_used, u32
from vyre_async.programs import Workload, elementwise_xor, standard_workloads
from vyre_async.testing.test_contract import spin
from vyre_reference import reference_backend

pytestmark = pytest.mark.anyio

SOAK_SECONDS = float(os.environ.get("VYRE_SOAK_SECONDS", "20"))
TASKS = 40
U = np.uint32


def _rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _threads() -> int:
    """Threads other than trio's own cache (anyio's test runner drives trio in guest mode)
    and the process's one done-callback thread (started once, by the first callback)."""
    return sum(
        not t.name.startswith("Trio thread") and t.name != "vyre-callbacks"
        for t in threading.enumerate()
    )


class _FlakySpans(SpanProcessor):
    """A span processor that raises at start or end one time in five while ``active``."""

    active = False
    rng = random.Random(11)

    def on_start(self, span: object, parent_context: object = None) -> None:
        if self.active and self.rng.random() < 0.2:
            raise RuntimeError("soak: a span processor's on_start fault")

    def on_end(self, span: object) -> None:
        if self.active and self.rng.random() < 0.2:
            raise RuntimeError("soak: a span processor's on_end fault")


_FLAKY: _FlakySpans | None = None
NAN_BODY = b'{"inputs": [[NaN], [1]], "alpha": 1}'


def _flaky_spans() -> _FlakySpans:
    """The in-memory SDK (installed once per session) with the flaky processor added once."""
    global _FLAKY
    if _FLAKY is None:
        from opentelemetry import trace

        otel_sdk.install()
        _FLAKY = _FlakySpans()
        trace.get_tracer_provider().add_span_processor(_FLAKY)  # type: ignore[attr-defined]
    return _FLAKY


def _increment() -> Program:
    """``acc[i] += 1`` on a READ_WRITE buffer."""
    return Program(
        [BufferDecl("acc", 0, Access.READ_WRITE, DType.U32)],
        64,
        [Store("acc", gid(), Load("acc", gid()) + u32(1))],
        op_id="soak.increment",
    )


class Soak:
    """Shared state of one soak run."""

    def __init__(
        self, backend: VyreBackend, cache_root: Path, seed: int, service_url: str | None
    ) -> None:
        self.backend = backend
        self.service_url = service_url
        supported = backend.supported_ops()  # (a test backend may not run grid barriers)
        self.workloads = [w for w in standard_workloads() if ops_used(w.program) <= supported]
        self.saxpy = next(w.program for w in self.workloads if w.name == "saxpy")
        self.closed = reference_backend(prefetch=False)
        self.stranger = reference_backend(prefetch=False)
        self.foreign = self.stranger.upload(np.zeros(64, U))
        self.cache = DiskPipelineCache(cache_root)
        self.cache_programs = [  # distinct kernels (the disk-cache test backend has no
            w.program  # grid barriers)
            for w in self.workloads
            if "stmt.grid_barrier" not in ops_used(w.program)
        ]
        self.rng = random.Random(seed)
        self.counts: Counter[str] = Counter()
        self.errors: list[str] = []

    def fail(self, what: str) -> None:
        self.errors.append(what)

    def check_error(self, what: str, exc: BaseException) -> None:
        if not isinstance(exc, BackendError):
            self.fail(f"{what}: raw {type(exc).__name__}: {exc}")
        elif "\nFix: " not in str(exc):
            self.fail(f"{what}: {type(exc).__name__} without a Fix: {exc}")

    # One step of each kind -------------------------------------------------------
    async def valid(self, np_rng: np.random.Generator) -> None:
        workload: Workload = self.rng.choice(self.workloads)
        inputs = workload.make_inputs(np_rng)
        config = DispatchConfig(grid_override=workload.grid, label=workload.name)
        outputs = await self.backend.dispatch(workload.program, inputs, config)
        for got, want in zip(outputs, workload.expected(inputs), strict=True):
            if got.tobytes() != np.asarray(want, got.dtype).tobytes():
                self.fail(f"wrong result from {workload.name}")
        self.counts["valid"] += 1

    def hostile(self) -> None:
        xor = elementwise_xor(64)
        a = np.arange(64, dtype=U)
        huge = np.broadcast_to(U(1), (2**31,))
        f = np.ones(64, np.float32)
        calls: dict[str, Callable[[], object]] = {
            "None inputs": lambda: self.backend.dispatch(xor, None),  # type: ignore[arg-type]
            "generator inputs": lambda: self.backend.dispatch(xor, iter([a, a])),  # type: ignore[arg-type]
            "one input": lambda: self.backend.dispatch(xor, [a]),
            "wrong dtype": lambda: self.backend.dispatch(xor, [a.astype(np.float32), a]),
            "wrong size": lambda: self.backend.dispatch(self.saxpy, [f, f, np.ones(2, np.float32)]),
            "odd bytes": lambda: self.backend.dispatch(xor, [b"abc", a]),
            "dict config": lambda: self.backend.dispatch(xor, [a, a], {"timeout": 1}),  # type: ignore[arg-type]
            "float grid": lambda: DispatchConfig(grid_override=2.5),  # type: ignore[arg-type]
            "huge workgroup": lambda: DispatchConfig(workgroup_override=(2**31, 1, 1)),
            "negative timeout": lambda: DispatchConfig(timeout=-1),
            "bad dtype": lambda: self.backend.alloc("f64", 4),
            "bad count": lambda: self.backend.alloc("u32", 1.5),  # type: ignore[arg-type]
            "huge alloc": lambda: self.backend.alloc("u32", 2**40),
            "huge input": lambda: self.backend.dispatch(elementwise_xor(2**31), [huge, huge]),
            "foreign buffer": lambda: self.backend.dispatch(_increment(), [self.foreign]),
            "closed dispatch": lambda: self.closed.dispatch(xor, [a, a]),
            "closed upload": lambda: self.closed.upload(a),
            "invalid program": lambda: self.backend.dispatch(
                Program([BufferDecl("out", 0, Access.WRITE, DType.U32, 0)], 64, []), []
            ),
            "not a program": lambda: self.backend.dispatch("xor", [a, a]),  # type: ignore[arg-type]
            "bad result timeout": lambda: self.backend.dispatch(xor, [a, a]).result(
                timeout="soon"  # type: ignore[arg-type]
            ),
        }
        name, call = self.rng.choice(list(calls.items()))
        try:
            call()
        except Exception as exc:
            self.check_error(name, exc)
            if name.startswith("closed") and not isinstance(exc, BackendClosed):
                self.fail(f"{name}: {type(exc).__name__}, not BackendClosed")
            self.counts["hostile"] += 1
        else:
            self.fail(f"hostile call {name!r} was accepted")

    async def cancelled(self) -> None:
        pending = self.backend.dispatch(spin(), [np.array([self.rng.randint(2_000, 60_000)], U)])
        with anyio.move_on_after(self.rng.uniform(0.0, 0.01)):
            (out,) = await pending
            n = int(out[0])  # finished before the cancel: check the sum mod 2**32
            self.counts["finished_before_cancel"] += int(n >= 0)
            return
        self.counts["cancelled"] += 1

    async def timed_out(self) -> None:
        n = self.rng.randint(50_000, 400_000)
        config = DispatchConfig(timeout=self.rng.uniform(0.001, 0.02), label="soak.timeout")
        try:
            (out,) = await self.backend.dispatch(spin(), [np.array([n], U)], config)
        except DispatchTimeout as exc:
            self.check_error("timeout", exc)
            self.counts["timed_out"] += 1
        else:
            want = (n * (n - 1) // 2) % 2**32
            if int(out[0]) != want:
                self.fail(f"spin({n}) gave {int(out[0])}, want {want}")
            self.counts["beat_timeout"] += 1

    async def increment(self, mine: ResidentBuffer, done: list[int]) -> None:
        await self.backend.dispatch(_increment(), [mine])
        done[0] += 1
        self.counts["increments"] += 1

    async def callback(self, np_rng: np.random.Generator, mine: ResidentBuffer) -> None:
        """A dispatch whose done-callback waits on its own backend; nothing may hang."""
        a = np_rng.integers(0, 2**32, 64, dtype=U)
        b = np_rng.integers(0, 2**32, 64, dtype=U)
        xor = elementwise_xor(64)
        kind = self.rng.choice(["download", "dispatch_sync", "result", "close"])
        got: queue.SimpleQueue[object] = queue.SimpleQueue()
        backend = reference_backend(prefetch=False) if kind == "close" else self.backend

        def callback(_: object) -> None:
            try:
                if kind == "download":
                    values = self.backend.download(mine)
                    got.put(bool((values == values[0]).all()))
                elif kind == "dispatch_sync":
                    got.put(self.backend.dispatch_sync(xor, [a, b])[0].tobytes())
                elif kind == "result":
                    got.put(self.backend.dispatch(xor, [a, b]).result()[0].tobytes())
                else:
                    anyio.run(backend.aclose)
                    got.put(backend.closed)
            except BaseException as exc:  # the step reports it below
                got.put(exc)

        pending = backend.dispatch(xor, [a, b])
        pending.add_done_callback(callback)
        (out,) = await pending
        if out.tobytes() != (a ^ b).tobytes():
            self.fail("wrong result of a dispatch with a done-callback")
        deadline = time.monotonic() + 30
        while got.empty():
            if time.monotonic() > deadline:
                self.fail(f"a done-callback that did {kind} never finished")
                return
            await anyio.sleep(0.001)
        answer = got.get()
        want = {"download": True, "close": True}.get(kind, (a ^ b).tobytes())
        if isinstance(answer, BaseException):
            self.fail(f"a done-callback's {kind} raised {type(answer).__name__}: {answer}")
        elif answer != want:
            self.fail(f"a done-callback's {kind} gave a wrong answer")
        self.counts[f"callback_{kind}"] += 1

    async def request(self, client: object) -> None:
        """One request to the example service: exact when valid, 4xx JSON with a Fix if not."""
        assert self.service_url is not None
        url = self.service_url
        a = [self.rng.randrange(2**32) for _ in range(self.rng.randint(1, 64))]
        b = [self.rng.randrange(2**32) for _ in a]
        raw = {"Content-Type": "application/octet-stream"}
        requests: dict[str, tuple[str, str, dict[str, object], int]] = {
            "valid json": ("POST", "/v1/run/xor", {"json": {"inputs": [a, b]}}, 200),
            "valid raw": (
                "POST", "/v1/run/xor",
                {"content": np.array(a + b, "<u4").tobytes(),
                 "headers": {**raw, "X-Vyre-Counts": f"{len(a)},{len(b)}"}},
                200,
            ),
            "nested body": ("POST", "/v1/run/xor", {"content": b"[" * 50_000}, 400),
            "unknown route": ("GET", f"/v{self.rng.randint(2, 9)}/what", {}, 404),
            "wrong method": ("DELETE", "/v1/run/xor", {}, 405),
            "unknown program": ("POST", "/v1/run/fft", {"json": {"inputs": [a, b]}}, 404),
            "bool input": ("POST", "/v1/run/xor", {"json": {"inputs": [[True, *a], [1, *b]]}}, 400),
            "nan input": ("POST", "/v1/run/saxpy", {"content": NAN_BODY}, 400),
            "empty arrays": ("POST", "/v1/run/xor", {"json": {"inputs": [[], []]}}, 400),
            "lying counts": (
                "POST", "/v1/run/xor",
                {"content": b"\0" * 8, "headers": {**raw, "X-Vyre-Counts": "100,100"}},
                400,
            ),
            "odd host": (
                "POST", "/v1/run/xor",
                {"json": {"inputs": [a, b]}, "headers": {"Host": f"x{self.rng.random()}.example"}},
                200,
            ),
        }  # fmt: skip
        name, (method, path, options, status) = self.rng.choice(list(requests.items()))
        response = await client.request(method, f"{url}{path}", **options)  # type: ignore[attr-defined]
        if response.status_code != status:
            self.fail(
                f"service {name}: {response.status_code}, want {status}: {response.text[:200]}"
            )
            return
        if status == 200:
            if name == "valid raw":
                out = np.frombuffer(response.content, "<u4").tolist()
            else:
                out = response.json()["outputs"][0]
            if out != [x ^ y for x, y in zip(a, b, strict=True)]:
                self.fail(f"service {name}: a wrong result")
        else:
            try:
                body = json.loads(response.text)
            except ValueError:
                self.fail(f"service {name}: a {status} that is not JSON: {response.text[:100]}")
                return
            if not (body.get("message") and body.get("fix")):
                self.fail(f"service {name}: a refusal without a message and a Fix: {body}")
        self.counts["service"] += 1

    def corrupt_and_reload(self) -> None:
        program = self.rng.choice(self.cache_programs)
        writer = backend_of(BytesBackend, disk_cache=self.cache, prefetch=False)
        writer.compile(program)
        path = self.cache.path_for(writer.pipeline_identity(program).hex)
        damage = self.rng.choice(["truncate", "garbage", "foreign", "delete", "none"])
        if damage != "none" and path.exists():
            data = path.read_bytes()
            if damage == "truncate":
                path.write_bytes(data[: self.rng.randint(0, len(data) - 1)])
            elif damage == "garbage":
                path.write_bytes(os.urandom(len(data)))
            elif damage == "foreign":
                path.write_bytes(b"NOPE" + data[4:])
            else:
                path.unlink()
        reader = backend_of(BytesBackend, disk_cache=self.cache, prefetch=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pipeline = reader.compile(program)
        if pipeline.program != program:
            self.fail("a corrupted cache entry produced another program's pipeline")
        damaged = damage in ("truncate", "garbage", "foreign")
        warned = any(issubclass(w.category, PipelineCacheWarning) for w in caught)
        if damaged and not warned:
            self.fail(f"a {damage} cache entry was not reported")
        if (reader.executor.builds, reader.executor.loads) != (
            (1, 0) if damage != "none" else (0, 1)
        ):
            self.fail(f"{damage}: builds={reader.executor.builds} loads={reader.executor.loads}")
        self.counts[f"cache_{damage}"] += 1


async def _soak(
    seconds: float, cache_root: Path, seed: int, service_url: str | None = None
) -> tuple[Soak, float]:
    backend = reference_backend(max_workers=2)
    soak = Soak(backend, cache_root, seed, service_url)
    client = None
    if service_url is not None:  # (httpx is the service extra's: absent without it)
        import httpx

        # Idle connections end on the client's side first: uvicorn closes a keep-alive
        # connection after 5 s, httpx's pool keeps one 5 s too, and a request sent on a
        # connection the server is closing fails with RemoteProtocolError (seen once
        # in CI at the end of issue 28).
        client = httpx.AsyncClient(timeout=30, limits=httpx.Limits(keepalive_expiry=1.0))
    exporter = otel_sdk.install()[0]
    await soak.closed.aclose()
    deadline = time.monotonic() + seconds
    increments: list[tuple[ResidentBuffer, list[int]]] = []

    async def worker(index: int) -> None:
        np_rng = np.random.default_rng(seed * 1000 + index)
        mine = backend.alloc("u32", 64, label=f"soak-{index}")
        done = [0]
        increments.append((mine, done))
        while time.monotonic() < deadline:
            kind = soak.rng.choices(
                ["valid", "hostile", "cancel", "timeout", "increment", "cache", "callback"]
                + (["service"] if client is not None else []),
                weights=[40, 25, 10, 8, 12, 5, 6] + ([6] if client is not None else []),
            )[0]
            try:
                if kind == "valid":
                    await soak.valid(np_rng)
                elif kind == "hostile":
                    soak.hostile()
                elif kind == "cancel":
                    await soak.cancelled()
                elif kind == "timeout":
                    await soak.timed_out()
                elif kind == "increment":
                    await soak.increment(mine, done)
                elif kind == "callback":
                    await soak.callback(np_rng, mine)
                    exporter.clear()  # (the SDK's in-memory spans: bounded memory)
                elif kind == "service":
                    await soak.request(client)
                else:
                    soak.corrupt_and_reload()
            except Exception as exc:  # every step handles its own expected errors
                soak.fail(f"{kind}: unexpected {type(exc).__name__}: {exc}")
            await anyio.lowlevel.checkpoint()

    started = time.monotonic()
    with anyio.fail_after(seconds + 60):  # a hang fails the soak instead of freezing CI
        async with anyio.create_task_group() as tg:
            for index in range(TASKS):
                tg.start_soon(worker, index)
        await backend.flush()
    if client is not None:
        await client.aclose()
    exporter.clear()
    for mine, done in increments:
        values = backend.download(mine)
        if not (values == done[0]).all():
            soak.fail(f"resident buffer holds {values[0]}, want {done[0]} increments")
        backend.free(mine)
    executor = backend.executor
    if executor.resident_count != 0 or executor.in_flight != 0:
        soak.fail(f"left {executor.resident_count} buffers, {executor.in_flight} in flight")
    await backend.aclose()
    await soak.stranger.aclose()
    return soak, time.monotonic() - started


@pytest.fixture(scope="module")
def service() -> Iterator[str | None]:
    """The example service, when its extra is installed (started once for both loops).

    None without the extra: the soak then runs everything else, never skipped.
    """
    if any(importlib.util.find_spec(m) is None for m in ("uvicorn", "httpx", "starlette")):
        yield None
        return
    from tests.service.test_service import Server

    server = Server()
    yield server.url
    server.stop()


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc for RSS")
async def test_soak_mixed_valid_and_hostile_work(
    tmp_path: Path, anyio_backend: str, service: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seconds = SOAK_SECONDS * (0.6 if anyio_backend == "asyncio" else 0.4)
    flaky = _flaky_spans()
    reported: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: reported.append(args.exc_value))
    gc.collect()
    threads_before = _threads()
    rss_before = _rss_bytes()
    flaky.active = True
    try:
        soak, elapsed = await _soak(seconds, tmp_path / "cache", seed=7, service_url=service)
    finally:
        flaky.active = False
    gc.collect()
    growth = _rss_bytes() - rss_before
    summary = ", ".join(f"{k} {v}" for k, v in sorted(soak.counts.items()))
    print(f"\nsoak ({anyio_backend}, {elapsed:.1f} s): {summary}; RSS +{growth / 2**20:.1f} MiB")
    assert soak.errors == [], sorted(set(soak.errors))[:20]
    # Every span processor fault was reported, and nothing else was.
    faults = [str(e) for e in reported]
    assert faults and all(f.startswith("soak: a span processor's on_") for f in faults), faults[:5]
    assert {f.split("'s ")[1].split(" ")[0] for f in faults} == {"on_start", "on_end"}
    assert sum(v for k, v in soak.counts.items() if k.startswith("callback_")) > 0
    if service is not None:
        assert soak.counts["service"] > 0
    assert soak.counts["valid"] > 0 and soak.counts["hostile"] > 0
    assert soak.counts["cancelled"] + soak.counts["timed_out"] > 0
    assert sum(v for k, v in soak.counts.items() if k.startswith("cache_")) > 0
    assert elapsed < seconds + 30  # stopped when asked: nothing ran on unbounded
    for _ in range(100):  # daemon workers exit once their pool is closed (ms)
        if _threads() <= threads_before:
            break
        await anyio.sleep(0.05)
    assert _threads() <= threads_before, [t.name for t in threading.enumerate()]
    assert growth < 256 * 2**20
    assert not math.isnan(elapsed)
