"""The probes a backend's ``calibrate`` runs: launch, compile, copy, batch, overlap, residency."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from vyre_async._calibration.record import Calibration, _median
from vyre_async._exports import public_dir as _public_dir
from vyre_async.errors import UnsupportedFeature
from vyre_async.ir.expr import u32
from vyre_async.ir.program import Program
from vyre_async.ir.stmt import Store
from vyre_async.ir.types import Access, BufferDecl, DType

if TYPE_CHECKING:
    from vyre_async._seams import BackendLike, DeviceIdentity, PipelineLike
    from vyre_async.policies.launch import ModeKind

__all__ = [
    "ARM_OVERLAP_PROBE_ELEMENTS",
    "RESIDENT_GAIN_PROBE_ELEMENTS",
    "launch_probe_program",
    "measure_arm_overlap",
    "measure_batch_costs",
    "measure_host_costs",
    "measure_fusion_gain",
    "measure_resident_gain",
    "resident_gain_probe_program",
]
__dir__ = _public_dir(__name__)

_log = logging.getLogger("vyre_async.calibration")


ARM_OVERLAP_PROBE_ELEMENTS = 1 << 18


def measure_arm_overlap(
    backend: BackendLike, *, rounds: int = 5, elements: int = ARM_OVERLAP_PROBE_ELEMENTS
) -> int | None:
    """Measure how much running two independent dispatches concurrently saves on ``backend``.

    The probes are two typical, different kernels over ``elements`` words: an
    elementwise xor and a 256-bin histogram (workgroup atomics, a barrier,
    storage atomics). Each round (after one warm-up of each) runs them one after
    the other, each awaited before the next is dispatched (times ``a``, ``b``),
    then both dispatched before either is awaited (time ``c``); the round's
    overlap is ``(a + b - c) / min(a, b)``, the share of the shorter dispatch
    that concurrency hid. The result is the median over ``rounds`` (the probe
    order alternates), clamped to -1..1, in basis points. Host clocks; blocks
    the calling thread (call it outside event loops, like ``calibrate()``).

    It runs on ``backend`` itself: its worker threads or streams are what the
    arm scheduler will use. A backend may measure it in its own ``calibrate()``
    instead (on a probe with the same concurrency).

    Args:
        backend: The backend to measure.
        rounds: Timed rounds (>= 1).
        elements: Words per probe buffer.

    Returns:
        Basis points in -10000..10000, or None when the probes could not run
        (logged on the ``vyre_async.calibration`` logger).
    """
    from vyre_async.programs import elementwise_xor, histogram

    data = np.arange(elements, dtype=np.uint32)
    probes = (
        (elementwise_xor(elements), [data, data]),
        (histogram(), [data, np.zeros(256, np.uint32)]),
    )
    samples: list[float] = []
    try:
        for program, inputs in probes:
            backend.dispatch(program, inputs).result()  # compile and warm
        for number in range(max(1, rounds)):
            (p1, i1), (p2, i2) = probes if number % 2 == 0 else probes[::-1]
            start = time.perf_counter()
            backend.dispatch(p1, i1).result()
            middle = time.perf_counter()
            backend.dispatch(p2, i2).result()
            in_order_end = time.perf_counter()
            first, second = backend.dispatch(p1, i1), backend.dispatch(p2, i2)
            first.result()
            second.result()
            together = time.perf_counter() - in_order_end
            shorter = max(min(middle - start, in_order_end - middle), 1e-9)
            samples.append((in_order_end - start - together) / shorter)
    except Exception as exc:  # a backend that cannot run the probes is not calibrated for it
        _log.warning("arm overlap of backend %r not measured (%s)", backend.id, exc)
        return None
    return max(-10_000, min(10_000, round(_median(samples) * 10_000)))


#: Elements of each buffer of `measure_resident_gain`'s probe (1 MiB each).
RESIDENT_GAIN_PROBE_ELEMENTS = 1 << 18


def resident_gain_probe_program(elements: int = RESIDENT_GAIN_PROBE_ELEMENTS) -> Program:
    """The resident side of `measure_resident_gain`'s probe: the xor, its output READ_WRITE."""
    from vyre_async.programs import elementwise_xor

    xor = elementwise_xor(elements)
    return Program(
        [
            BufferDecl(d.name, d.binding, Access.READ_WRITE, d.dtype, d.count)
            if d.access is Access.WRITE
            else d
            for d in xor.buffers
        ],
        xor.workgroup_size,
        xor.body,
        op_id="calibrate.resident_gain",
    )


def measure_resident_gain(
    backend: BackendLike, *, rounds: int = 5, elements: int = RESIDENT_GAIN_PROBE_ELEMENTS
) -> int | None:
    """Measure how much faster a dispatch runs on resident buffers than on host arrays.

    The probe is an elementwise xor over ``elements`` words, run the two ways
    the arm graph can run it (`vyre_async._graph.ArmGraph.run`): on host arrays
    (``dispatch(xor, [a, b])``), and on resident buffers: both inputs uploaded
    once, the output a fresh zero-filled resident buffer (``alloc``) passed to
    the same kernel with that buffer READ_WRITE, freed afterwards. Every
    dispatch is awaited (``.result()``) before the next; a resident dispatch's
    time includes its ``alloc`` and ``free``. Each round (after one warm-up of
    each) times ``repeats = 3`` dispatches of each way, the order alternating
    between rounds; the round's gain is ``(host - resident) / host`` of the
    medians. The result is the median over ``rounds``, clamped to -1..1, in
    basis points. Host clocks; blocks the calling thread (call it outside
    event loops, like ``calibrate()``). Tens of milliseconds on the reference
    backend.

    Args:
        backend: The backend to measure.
        rounds: Timed rounds (>= 1).
        elements: Words per probe buffer.

    Returns:
        Basis points in -10000..10000, or None when the backend has no resident
        buffers (its ``upload`` raised `UnsupportedFeature`) or the probe could
        not run (logged on the ``vyre_async.calibration`` logger).
    """
    from vyre_async.programs import elementwise_xor

    xor = elementwise_xor(elements)
    resident_xor = resident_gain_probe_program(elements)
    out = next(d for d in xor.buffers if d.access is Access.WRITE)
    data = np.arange(elements, dtype=np.uint32)
    uploaded: list[Any] = []
    try:
        try:
            uploaded.append(backend.upload(data, label="calibrate.resident_gain"))
        except UnsupportedFeature:
            _log.info("resident gain of backend %r not measured: no resident buffers", backend.id)
            return None
        uploaded.append(backend.upload(data, label="calibrate.resident_gain"))

        def on_host() -> float:
            start = time.perf_counter()
            backend.dispatch(xor, [data, data]).result()
            return time.perf_counter() - start

        def resident() -> float:
            start = time.perf_counter()
            fresh = backend.alloc(out.dtype, elements, label="calibrate.resident_gain")
            try:
                backend.dispatch(resident_xor, [*uploaded, fresh]).result()
            finally:
                backend.free(fresh)
            return time.perf_counter() - start

        on_host()  # compile and warm
        resident()
        samples: list[float] = []
        for number in range(max(1, rounds)):
            ways = (on_host, resident) if number % 2 == 0 else (resident, on_host)
            times: dict[Callable[[], float], list[float]] = {way: [] for way in ways}
            for _ in range(3):
                for way in ways:
                    times[way].append(way())
            host_s = max(_median(times[on_host]), 1e-9)
            samples.append((host_s - _median(times[resident])) / host_s)
    except Exception as exc:  # a backend that cannot run the probe is not calibrated for it
        _log.warning("resident gain of backend %r not measured (%s)", backend.id, exc)
        return None
    finally:
        for handle in uploaded:
            with contextlib.suppress(Exception):
                backend.free(handle)
    return max(-10_000, min(10_000, round(_median(samples) * 10_000)))


def launch_probe_program() -> Program:
    """The smallest real kernel (one lane stores one word): what ``launch_ns`` times.

    Backends' ``calibrate()`` dispatch it to measure per-launch host overhead.
    """
    return Program(
        [BufferDecl("out", 0, Access.WRITE, DType.U32, 1)],
        1,
        [Store("out", 0, u32(0))],
        op_id="calibrate.launch",
    )


def measure_host_costs(
    backend: DeviceIdentity,
    probe: BackendLike,
    *,
    compile_once: Callable[[int], object],
    copy_bytes: int,
    settle: Callable[[], object] = lambda: None,
) -> Calibration:
    """Measure the costs every backend has, on ``probe``, and return ``backend``'s record.

    The shared part of a ``calibrate()``: the median host time ``dispatch()``
    takes for `launch_probe_program` (after one warm-up), the median of three
    ``compile_once(i)`` calls, and the best of three ``upload`` (then
    ``settle()``, which waits for the copy) and ``download`` of ``copy_bytes``.
    Host clocks; replay and persistent costs stay None.

    Args:
        backend: The backend or executor the record is for (id, version, device
            fingerprint).
        probe: A private backend on the same device that does the work.
        compile_once: Compiles one typical pipeline; called with 0, 1, 2.
        copy_bytes: Bytes per copy (a multiple of 4).
        settle: Waits until submitted uploads finished (asynchronous backends).
    """
    trivial = launch_probe_program()
    probe.dispatch(trivial, []).result()  # compile once
    launches = []
    for _ in range(64):
        start = time.perf_counter_ns()
        pending = probe.dispatch(trivial, [])
        launches.append(time.perf_counter_ns() - start)
        pending.result()
    compiles = []
    for i in range(3):
        start = time.perf_counter_ns()
        compile_once(i)
        compiles.append(time.perf_counter_ns() - start)
    data = np.arange(copy_bytes // 4, dtype=np.uint32)
    probe.free(probe.upload(data))  # warm pinned pools
    settle()
    ups: list[float] = []
    downs: list[float] = []
    for _ in range(3):
        began = time.perf_counter()
        handle = probe.upload(data)
        settle()
        ups.append(time.perf_counter() - began)
        began = time.perf_counter()
        probe.download(handle)
        downs.append(time.perf_counter() - began)
        probe.free(handle)
    return Calibration(
        backend_id=backend.id,
        backend_version=backend.version,
        device_fingerprint=backend.device_fingerprint(),
        launch_ns=int(_median(launches)),
        compile_ns=int(_median(compiles)),
        h2d_bytes_per_s=data.nbytes / max(min(ups), 1e-9),
        d2h_bytes_per_s=data.nbytes / max(min(downs), 1e-9),
        timing="host",
        measured_at=time.time(),
    )


def measure_batch_costs(
    pipeline: PipelineLike,
    inputs: Sequence[Any],
    *,
    record_ns: Callable[[], int | None],
    rounds: int = 5,
) -> dict[str, int]:
    """Measure the launch-mode costs of ``pipeline``'s backend with ``dispatch_batch(mode=...)``.

    Host clocks, medians of ``rounds``; every batch is awaited before the next.
    Returns ``launch_ns`` (per launch of a plain 16-launch batch, L),
    ``replay_ns`` (per launch of a 16-replay batch once the graph exists, Rep),
    ``record_ns`` (from ``record_ns()`` after the first replay batch, Rec), and
    ``persistent_item_ns``/``persistent_setup_ns`` (slope and intercept of the
    persistent batch's host time between 4 and 32 items, m and S). A mode the
    backend lacks is left out.

    Args:
        pipeline: A compiled typical program.
        inputs: One input set for it.
        record_ns: Returns the capture cost of the graph the first replay batch made.
        rounds: Timed batches per figure.
    """
    caps = pipeline.backend.capabilities()

    def timed(size: int, mode: ModeKind) -> int:
        start = time.perf_counter_ns()
        pendings = pipeline.dispatch_batch([inputs] * size, mode=mode)
        took = time.perf_counter_ns() - start
        for pending in pendings:
            pending.result()
        return took

    def median(size: int, mode: ModeKind) -> float:
        return _median(timed(size, mode) for _ in range(rounds))

    timed(16, "plain")  # warm
    costs = {"launch_ns": int(median(16, "plain") / 16)}
    if caps.graph_replay:
        timed(16, "command_reuse")  # captures the graph
        recorded = record_ns()
        if recorded is not None:
            costs["record_ns"] = int(recorded)
            costs["replay_ns"] = int(median(16, "command_reuse") / 16)
    if caps.persistent_threads:
        timed(4, "persistent")  # warm
        small, large = median(4, "persistent"), median(32, "persistent")
        item = max((large - small) / 28, 0.0)
        costs["persistent_item_ns"] = int(item)
        costs["persistent_setup_ns"] = int(max(small - 4 * item, 0.0))
    return costs


#: Dispatches in `measure_fusion_gain`'s batch, and the words of each one's xor.
FUSION_GAIN_MEMBERS = 16
FUSION_GAIN_ELEMENTS = 256


def measure_fusion_gain(
    backend: BackendLike, *, rounds: int = 5, members: int = FUSION_GAIN_MEMBERS
) -> int | None:
    """Measure how much faster a batch of tiny dispatches runs fused than separately.

    The probe is a ``dispatch_batch`` of ``members`` elementwise xors of
    `FUSION_GAIN_ELEMENTS` words, each on its own inputs, run fused
    (``fusion="force"``: one launch) and separately (``fusion="disable"``),
    every batch awaited. After one warm-up of each (which compiles the fused
    pipeline), each round times 3 batches of each way, alternating the order;
    the round's gain is ``(separate - fused) / separate`` of the medians. The
    result is the median over ``rounds``, clamped to -1..1, in basis points.
    Host clocks; blocks the calling thread. Tens of milliseconds on the
    reference backend.

    Returns:
        Basis points in -10000..10000, or None when the probe could not run
        (logged on the ``vyre_async.calibration`` logger).
    """
    from vyre_async.programs import elementwise_xor

    try:
        pipeline = backend.compile(elementwise_xor(FUSION_GAIN_ELEMENTS))
        words = np.arange(FUSION_GAIN_ELEMENTS, dtype=np.uint32)
        batch = [[words, words + np.uint32(k)] for k in range(max(2, members))]

        def run(fusion: str) -> float:
            start = time.perf_counter()
            for pending in pipeline.dispatch_batch(batch, fusion=fusion):
                pending.result()
            return time.perf_counter() - start

        def fused() -> float:
            return run("force")

        def separate() -> float:
            return run("disable")

        fused()
        separate()
        samples: list[float] = []
        for number in range(max(1, rounds)):
            ways = (fused, separate) if number % 2 == 0 else (separate, fused)
            times: dict[Callable[[], float], list[float]] = {way: [] for way in ways}
            for _ in range(3):
                for way in ways:
                    times[way].append(way())
            apart = max(_median(times[separate]), 1e-9)
            samples.append((apart - _median(times[fused])) / apart)
    except Exception as exc:  # a backend that cannot run the probe is not calibrated for it
        _log.warning("fusion gain of backend %r not measured (%s)", backend.id, exc)
        return None
    return max(-10_000, min(10_000, round(_median(samples) * 10_000)))
