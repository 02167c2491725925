"""The test session's Ray cluster: one local cluster, every one of its processes ended after.

`tests/conftest.py` sets ``VYRE_RAY_LOCAL_WORKERS=2`` (unless ``RAY_ADDRESS`` or
it is set) when Ray is installed, so ``acquire_backend("ray")`` — the contract
tests — starts one local cluster on first use, shared by the session. At the
end `end_cluster` records the cluster's processes (every descendant of this
process), calls ``ray.shutdown()`` and SIGKILLs by pid whatever is left (Ray's
dashboard and runtime-env agents can outlive a shutdown), then checks that
none is alive. Ray's processes share pytest's process group, so nothing is
ever killed by group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

from tests import orphan_guard


def descendants(root: int | None = None) -> set[int]:
    """Pids of every live process descending from ``root`` (default: this process).

    The session's orphan guards (`tests.orphan_guard`) are not counted.
    """
    root = os.getpid() if root is None else root
    return set(orphan_guard.descendants(root)) - orphan_guard.GUARDS


def end_cluster(timeout_s: float = 10.0) -> list[int]:
    """Shut the session's Ray cluster down; return the pids that had to be killed."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return []
    ours = descendants()
    ray.shutdown()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(orphan_guard.alive(pid) for pid in ours):
        time.sleep(0.1)
    killed = [pid for pid in ours if orphan_guard.alive(pid)]
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(orphan_guard.alive(pid) for pid in killed):
        time.sleep(0.05)
    left = [pid for pid in ours if orphan_guard.alive(pid)]
    if left:
        raise RuntimeError(f"Ray processes still alive after the session: {left}")
    return killed
