"""The differential generators across backends: generated CUDA C and Ray against the reference.

The programs of `tests.reference.differential_programs` — a value read from a
writable buffer then stored over, every index pattern into storage and workgroup
memory, many lanes' atomics on one address — chosen so that every parameter
value of each generator occurs four times (`covering`: 264 programs, one
``g++`` build of about 10 s on a cold cache, nothing on a warm one), run on:

- the CPU emulator (one batch run), with its race detector on: a launch the
  generator built race-free must not be flagged, and must come out byte for byte
  as the reference's; a launch the detector flags is not compared (real threads
  may order its racing accesses either way);
- the fake CuPy device (the unchanged `CupyExecutor` over the emulator built as a
  library, at the same time as the batch emulator): every parameter value once,
  the race-free cases and the atomics;
- the ``ray`` backend (reference workers over Ray): those again, byte for byte,
  the atomics' lane order included (the session's cluster is started on first use);
- a real GPU (``gpu`` marker; skipped without one): every race-free case and the
  atomics. An H100 ran it once, when it was written, with no difference (228
  cases, 19.5 s).

Atomics are compared by what ir.md fixes: the old values and final words must
be those of *some* sequential order of each address's atomics
(`sequential_witness`; the emulator's threads pick the order), the final words
of commutative operators exactly, and everything else byte for byte.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import anyio
import numpy as np
import pytest

from tests.cupy.conftest import fake_device
from tests.cupy.emulator import BuildJob, build_emulator, request_for
from tests.reference import differential_programs as dp
from tests.reference.test_differential import atomic_violations
from vyre_async import DispatchConfig
from vyre_reference import execute


def _cases(times: int) -> tuple[dp.Case, ...]:
    """Cases in which every parameter value of each generator occurs ``times`` times."""
    rows = [dp.alias_case(*row) for row in dp.covering(dp.ALIAS_AXES, times, "alias")]
    for axes in (dp.STORAGE_AXES, dp.SHARED_AXES):
        rows += [dp.index_case(*row) for row in dp.covering(axes, times, "index")]
    rows += [dp.atomic_case(*row) for row in dp.covering(dp.ATOMIC_AXES, times, "atomic")]
    return tuple({c.name: c for c in rows}.values())


@functools.cache
def selected() -> tuple[dp.Case, ...]:
    """The emulator's cases: every parameter value of each generator four times over."""
    return _cases(4)


@functools.cache
def on_device() -> tuple[dp.Case, ...]:
    """The fake device's cases: every parameter value once, race-free (or atomics)."""
    return tuple(c for c in _cases(1) if c.race_free or c.atomic is not None)


@pytest.fixture(scope="module")
def builds() -> Iterator[tuple[BuildJob, BuildJob]]:
    """The batch emulator and the fake device's library, built at the same time."""
    batch = build_emulator([c.program for c in selected()])
    library = build_emulator([c.program for c in on_device()], library=True)
    yield batch, library
    batch.stop()
    library.stop()


def differences(case: dp.Case, got: list[np.ndarray[Any, Any]]) -> list[str]:
    """Return how ``got`` disagrees with the reference (atomics: with any sequential order)."""
    want = execute(case.program, [a.copy() for a in case.inputs], grid_override=case.grid)
    loose: set[str] = set()
    bad: list[str] = []
    check = case.atomic
    if check is not None:
        bad += atomic_violations(case, got)
        if check.olds is not None:
            loose.add(check.olds)  # only the lanes at a site; the others must be exact
        if not check.commutative:
            loose |= {site.final for site in check.sites}
    site_lanes: set[int] = set()
    if check is not None:
        site_lanes = {lane for site in check.sites for lane, _, _ in site.lanes}
    for decl, g, w in zip(case.program.outputs, got, want, strict=True):
        if g.dtype != w.dtype or g.shape != w.shape:
            bad.append(f"{decl.name}: {g.dtype}{g.shape}, reference {w.dtype}{w.shape}")
            continue
        differ = g.view(np.uint32) != w.view(np.uint32)
        if decl.name in loose:
            if check is not None and decl.name == check.olds:
                differ[sorted(site_lanes)] = False
            else:
                continue
        if differ.any():
            at = int(np.flatnonzero(differ)[0])
            bad.append(f"{decl.name}[{at}]: {g[at]!r}, reference {w[at]!r} ({g.tolist()})")
    return [f"{case.name}: {b}" for b in bad]


def test_the_emulator_matches_the_reference(builds: tuple[BuildJob, BuildJob]) -> None:
    cases = selected()
    requests = [
        request_for(k, c.program, list(c.inputs), grid=c.grid, trace=True)
        for k, c in enumerate(cases)
    ]
    results = builds[0].wait().run(requests)
    bad: list[str] = []
    racy = compared = 0
    for case, result in zip(cases, results, strict=True):
        if result.racy and case.atomic is None:
            assert not case.race_free, (
                f"{case.name}: built race-free, but the detector found a race"
            )
            racy += 1
            continue
        compared += 1
        bad += differences(case, result.outputs)
    assert not bad, f"{len(bad)} differences:\n" + "\n".join(bad[:10])
    assert compared >= 0.7 * len(cases), (compared, racy, len(cases))


def test_the_fake_device_matches_the_reference(builds: tuple[BuildJob, BuildJob]) -> None:
    from vyre_cupy import create_backend

    cases = on_device()
    with fake_device(builds[1].wait().binary, [c.program for c in cases]):
        backend = create_backend(disk_cache=None)
        try:
            bad: list[str] = []
            for case in cases:
                got = backend.dispatch_sync(
                    case.program, list(case.inputs), DispatchConfig(grid_override=case.grid)
                )
                bad += differences(case, got)
        finally:
            anyio.run(backend.shutdown)
    assert not bad, f"{len(bad)} differences:\n" + "\n".join(bad[:10])


def test_the_ray_backend_matches_the_reference() -> None:
    """The same cases over Ray (workers running the reference engine): byte for byte, the
    atomics' lane order included. The session's Ray cluster is started on first use."""
    pytest.importorskip("ray", reason="the ray extra is not installed")
    from vyre_async import acquire_backend

    backend = acquire_backend("ray")
    bad: list[str] = []
    for case in on_device():
        got = backend.dispatch_sync(
            case.program, list(case.inputs), DispatchConfig(grid_override=case.grid)
        )
        want = execute(case.program, [a.copy() for a in case.inputs], grid_override=case.grid)
        for decl, g, w in zip(case.program.outputs, got, want, strict=True):
            if g.dtype != w.dtype or not np.array_equal(g.view(np.uint32), w.view(np.uint32)):
                bad.append(f"{case.name}: {decl.name} {g.tolist()}, reference {w.tolist()}")
    assert not bad, f"{len(bad)} differences:\n" + "\n".join(bad[:10])


@pytest.mark.gpu
def test_a_gpu_matches_the_reference() -> None:
    """On a real CUDA device (skipped without one): the emulator's race-free cases and the
    atomics, byte for byte (atomics: by a sequential order)."""
    from tests.cupy.test_cupy_gpu import REASON

    if REASON is not None:
        pytest.skip(REASON)
    from vyre_cupy import create_backend

    backend = create_backend(disk_cache=None)
    bad: list[str] = []
    try:
        for case in selected():
            if case.race_free or case.atomic is not None:
                got = backend.dispatch_sync(
                    case.program, list(case.inputs), DispatchConfig(grid_override=case.grid)
                )
                bad += differences(case, got)
    finally:
        anyio.run(backend.shutdown)
    assert not bad, f"{len(bad)} differences:\n" + "\n".join(bad[:10])
