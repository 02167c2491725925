"""Ends a test session's leftover processes if the session itself is killed.

`tests/ray_cluster.py` ends the Ray cluster (and `tests/service`, `tests/otlp_receiver`
their servers) at the end of a session that ends normally. A pytest that is
SIGKILLed (a CI timeout, an out-of-memory kill) runs none of that: its
children are re-parented and live on. The guard is a small process started at
session start (`start`) that, every ``interval_s``, notes every live
descendant of the session's process as (pid, start time). When the session's
process is gone — the write end of the guard's stdin closes with it, however
it ended — the guard SIGKILLs every noted process still alive with the same
start time (so a recycled pid is never hit), then exits. After a normal end
nothing is left to kill. Processes are only ever killed by pid, never by name
or group.

    python -m tests.orphan_guard PID [INTERVAL_S]
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

#: How often the guard notes the session's descendants.
INTERVAL_S = 0.5
#: Pids of the guards this process started (not leftovers of its session).
GUARDS: set[int] = set()


def _table() -> dict[int, tuple[int, int]]:
    """Every live process: pid -> (parent pid, start time in clock ticks since boot)."""
    table: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if fields[0] == "Z":  # a zombie: dead already
            continue
        table[int(entry.name)] = (int(fields[1]), int(fields[19]))
    return table


def descendants(root: int, table: dict[int, tuple[int, int]] | None = None) -> dict[int, int]:
    """Live descendants of ``root``: pid -> start time."""
    table = _table() if table is None else table
    found: dict[int, int] = {}
    frontier = {root}
    while frontier:
        frontier = {
            pid for pid, (parent, _) in table.items() if parent in frontier and pid not in found
        }
        found.update((pid, table[pid][1]) for pid in frontier)
    return found


def guard(root: int, interval_s: float = INTERVAL_S) -> list[int]:
    """Note ``root``'s descendants until stdin closes; then kill those still alive.

    Returns the pids killed.
    """
    me = os.getpid()
    noted: dict[int, int] = {}
    born = _table().get(root, (0, None))[1]
    while True:
        table = _table()
        if table.get(root, (0, None))[1] != born:  # gone (a forked child may hold the pipe)
            break
        noted.update(descendants(root, table))
        noted.pop(me, None)
        ready, _, _ = select.select([sys.stdin], [], [], interval_s)
        if ready and not os.read(sys.stdin.fileno(), 4096):  # EOF: the session is gone
            break
    killed = []
    for pid in leftovers(noted, _table(), me):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


def leftovers(noted: dict[int, int], table: dict[int, tuple[int, int]], me: int) -> list[int]:
    """The noted processes still alive as themselves: same pid, same start time."""
    return sorted(
        pid
        for pid, started in noted.items()
        if pid != me and pid in table and table[pid][1] == started
    )


def start(root: int | None = None, interval_s: float = INTERVAL_S) -> subprocess.Popen[bytes]:
    """Start a guard for ``root`` (default: this process); it ends when ``root`` does.

        The guard's stdin is a pipe only ``root`` holds: its end closes the pipe. The
    guard also checks that ``root`` is alive at every look, for a forked child
    that kept the pipe open.
    """
    root = os.getpid() if root is None else root
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.orphan_guard", str(root), str(interval_s)],
        stdin=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[1],
        start_new_session=True,  # a signal to the session's group does not reach it
    )
    GUARDS.add(process.pid)
    return process


def stop(process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """End a guard `start` returned, after it killed what its session left behind."""
    if process.stdin is not None:
        process.stdin.close()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    GUARDS.discard(process.pid)


if __name__ == "__main__":
    killed = guard(int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else INTERVAL_S)
    if killed:
        print(f"orphan_guard: killed the session's leftover processes {killed}", file=sys.stderr)
