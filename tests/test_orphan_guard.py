"""The orphan guard ends what a killed test session left running, and nothing else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import orphan_guard

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

ROOT = Path(__file__).resolve().parents[1]
#: A session: starts its guard, a grandchild that would outlive it, prints both pids.
SESSION = r"""
import subprocess, sys, time
from tests import orphan_guard
guard = orphan_guard.start(interval_s=float(sys.argv[2]))
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
time.sleep(0.5)  # at 0.05 s a look, the guard has noted the child by now
print(guard.pid, child.pid, flush=True)
if sys.argv[1] == "wait":
    time.sleep(120)
else:  # a normal end, as tests/conftest.py ends a session
    orphan_guard.stop(guard)
"""


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(orphan_guard.alive(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def _session(how: str, interval_s: float = 0.05) -> tuple[subprocess.Popen[str], int, int]:
    session = subprocess.Popen(
        [sys.executable, "-c", SESSION, how, str(interval_s)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert session.stdout is not None
    guard, child = map(int, session.stdout.readline().split())
    session.stdout.close()
    return session, guard, child


def test_a_killed_session_leaves_no_process_behind() -> None:
    session, guard, child = _session("wait")
    try:
        assert orphan_guard.alive(child) and orphan_guard.alive(guard)
        session.send_signal(signal.SIGKILL)  # as a CI timeout would
        session.wait()
        assert _gone_within([child], 10), "the session's grandchild outlived it"
        assert _gone_within([guard], 10), "the guard did not exit after its work"
    finally:
        for pid in (child, guard):
            if orphan_guard.alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_session_that_ends_normally_has_its_leftovers_ended_too() -> None:
    # One look a minute: only the guard's last look, at the session's end, sees the child.
    session, guard, child = _session("exit", interval_s=60.0)
    try:
        assert session.wait(30) == 0
        assert _gone_within([child, guard], 10)
    finally:
        for pid in (child, guard):
            if orphan_guard.alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_only_the_noted_processes_themselves_are_killed() -> None:
    # pid -> (parent, start time): 11 lives on; 12's pid was reused by a process
    # started later; 13 has gone; 10 is the guard itself.
    table = {10: (1, 500), 11: (1, 100), 12: (1, 900)}
    noted = {10: 500, 11: 100, 12: 200, 13: 300}
    assert orphan_guard.leftovers(noted, table, me=10) == [11]


def test_descendants_are_found_through_every_generation() -> None:
    table = {2: (1, 0), 3: (2, 0), 4: (3, 0), 5: (1, 0), 6: (99, 0)}
    assert set(orphan_guard.descendants(1, table)) == {2, 3, 4, 5}
    assert set(orphan_guard.descendants(3, table)) == {4}


def test_this_sessions_guard_is_running_and_not_counted_as_a_leftover() -> None:
    from tests import ray_cluster

    assert orphan_guard.GUARDS, "conftest starts a guard for the session"
    assert all(orphan_guard.alive(pid) for pid in orphan_guard.GUARDS)
    assert not (ray_cluster.descendants() & orphan_guard.GUARDS)
