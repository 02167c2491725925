"""Ends a test session's leftover processes, also when the session itself is killed.

`tests/ray_cluster.py` ends the Ray cluster (and `tests/service`, `tests/otlp_receiver`
their servers) at the end of a session that ends normally. A pytest that is
SIGKILLed (a CI timeout, an out-of-memory kill) runs none of that: its
children are re-parented and live on. The guard is a small process started at
session start (`start`) that, every ``interval_s``, notes every live
descendant of the session's process as (pid, start time). When its stdin
closes — `stop` at the session's end, or the session's process ending however
it ended — or the session's process is gone, the guard SIGKILLs every noted
process still alive with the same start time (so a recycled pid is never hit),
says which on stderr, and exits. After a clean session that is nothing.
Processes are only ever killed by pid, never by name or group.

    python -m tests.orphan_guard PID START_TIME [INTERVAL_S]
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


def alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie (dead, waiting for its parent)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


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


def guard(root: int, born: int, interval_s: float = INTERVAL_S) -> list[int]:
    """Note ``root``'s descendants until stdin closes; then kill those still alive.

    ``born``: ``root``'s start time (it is gone once no process ``root`` started
    then is alive). After the first look a line ``ready`` goes to stdout.
    Returns the pids killed.
    """
    me = os.getpid()
    noted: dict[int, int] = {}
    first = True
    while True:
        table = _table()
        if table.get(root, (0, None))[1] != born:  # gone (a forked child may hold the pipe)
            break
        noted.update(descendants(root, table))
        noted.pop(me, None)
        if first:
            first = False
            with contextlib.suppress(OSError):  # (whoever started it may not listen)
                os.write(sys.stdout.fileno(), b"ready\n")
        ready, _, _ = select.select([sys.stdin], [], [], interval_s)
        if ready and not os.read(sys.stdin.fileno(), 4096):  # EOF: the session is gone
            break
    table = _table()
    if table.get(root, (0, None))[1] == born:  # still there (a normal end): a last look
        noted.update(descendants(root, table))
        noted.pop(me, None)
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


def start(
    root: int | None = None, interval_s: float = INTERVAL_S, ready_s: float = 30.0
) -> subprocess.Popen[bytes]:
    """Start a guard for ``root`` (default: this process); return once it has looked once.

    The guard's stdin is a pipe only ``root`` holds: its end closes the pipe. The
    guard also checks that ``root`` is alive at every look, for a forked child
    that kept the pipe open. Its stderr is this process's.
    """
    root = os.getpid() if root is None else root
    born = _table()[root][1]
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.orphan_guard", str(root), str(born), str(interval_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[1],
        start_new_session=True,  # a signal to the session's group does not reach it
    )
    assert process.stdout is not None
    readable, _, _ = select.select([process.stdout], [], [], ready_s)
    if not readable or process.stdout.readline() != b"ready\n":
        process.kill()
        process.wait()
        raise RuntimeError(f"the orphan guard did not start within {ready_s} s")
    process.stdout.close()
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
    interval = float(sys.argv[3]) if len(sys.argv) > 3 else INTERVAL_S
    killed = guard(int(sys.argv[1]), int(sys.argv[2]), interval)
    if killed:
        print(f"orphan_guard: killed the session's leftover processes {killed}", file=sys.stderr)
