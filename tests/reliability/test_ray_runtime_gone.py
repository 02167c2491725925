"""Issue 26, defect 3: the Ray runtime shut down under a live pool.

After ``ray.shutdown()`` a running dispatch never settled, and a later dispatch
started a fresh local Ray cluster (~10 s) and then failed. Now the dispatch in
flight fails with `DeviceLost` within the watchdog's period, later dispatches
fail at once with `DeviceLost`, closing is prompt, and no cluster is started.
Runs in a fresh interpreter: it shuts its own Ray down.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed")

CODE = r"""
import json, threading, time
import anyio, numpy as np, ray
from vyre_async import DeviceLost
from vyre_async.programs import elementwise_xor
from vyre_async.testing.test_contract import spin
from vyre_ray import local_backend

report = {}
pool = local_backend(workers=1)
a = np.arange(8, dtype=np.uint32)
assert pool.dispatch_sync(elementwise_xor(8), [a, a])[0].tolist() == [0] * 8
running = pool.dispatch(spin(), [np.array([4_000_000_000], np.uint32)])  # runs for long
# Shut Ray down once the dispatch runs on its worker (the reported case), which
# the worker says, rather than after a sleep guessed long enough to get there.
deadline = time.monotonic() + 60
while not any(w.in_flight for w in pool.executor.workers()):
    assert time.monotonic() < deadline, "the dispatch never started on its worker"
    time.sleep(0.01)
ray.shutdown()
started = time.monotonic()
try:
    running.result(timeout=20)
    report["in_flight"] = "settled with a result"
except DeviceLost as exc:
    report["in_flight"] = "DeviceLost"
    report["fix"] = "Fix:" in str(exc)
except Exception as exc:
    report["in_flight"] = type(exc).__name__
report["in_flight_s"] = time.monotonic() - started
started = time.monotonic()
try:
    pool.dispatch(elementwise_xor(8), [a, a]).result(timeout=20)
    report["later"] = "ran"
except DeviceLost:
    report["later"] = "DeviceLost"
except Exception as exc:
    report["later"] = type(exc).__name__
report["later_s"] = time.monotonic() - started
started = time.monotonic()
try:
    pool.executor.workers()
    report["workers"] = "answered"
except DeviceLost:
    report["workers"] = "DeviceLost"
report["workers_s"] = time.monotonic() - started
report["ray_started_again"] = ray.is_initialized()
started = time.monotonic()
anyio.run(pool.aclose)
report["close_s"] = time.monotonic() - started
report["ray_started_again"] |= ray.is_initialized()
print(json.dumps(report))
"""


def test_a_pool_whose_ray_runtime_is_shut_down_fails_fast_and_starts_nothing() -> None:
    env = {
        k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VYRE_RAY_LOCAL_WORKERS")
    }
    done = subprocess.run(
        [sys.executable, "-c", CODE],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["in_flight"] == "DeviceLost" and report["fix"], report
    assert report["in_flight_s"] < 5, report
    assert report["later"] == "DeviceLost" and report["later_s"] < 1, report
    assert report["workers"] == "DeviceLost" and report["workers_s"] < 1, report
    assert report["close_s"] < 5, report
    assert report["ray_started_again"] is False, report
