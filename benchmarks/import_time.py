"""What ``import vyre_async`` costs a fresh interpreter, beside ``import numpy``; prints JSON.

Each case runs in its own fresh ``python`` process that times only its import
statement (``time.perf_counter`` around it) and prints the seconds; the cases
run interleaved, round after round, and the report gives each case's median.
Byte code is written and warmed first (``PYTHONDONTWRITEBYTECODE`` is removed
from the children's environment), as for an installed package.

Cases:

- ``numpy``: ``import numpy`` (the peer: vyre-async needs numpy to dispatch);
- ``vyre_async``: ``import vyre_async`` (the goal: at most 1.4 x numpy);
- ``readme``: the README's imports, ``from vyre_async import
  acquire_preferred_backend`` and ``from vyre_async.programs import
  elementwise_xor``;
- ``first_dispatch``: those imports plus acquiring the reference backend and
  one 1024-element xor dispatch, ready (everything a first result costs).

Usage: ``python benchmarks/import_time.py [--rounds N] [--output FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

CASES = {
    "numpy": "import numpy",
    "vyre_async": "import vyre_async",
    "readme": (
        "from vyre_async import acquire_preferred_backend\n"
        "from vyre_async.programs import elementwise_xor"
    ),
    "first_dispatch": (
        "import numpy as np\n"
        "from vyre_async import acquire_backend\n"
        "from vyre_async.programs import elementwise_xor\n"
        "a = np.arange(1024, dtype=np.uint32)\n"
        "acquire_backend('reference').dispatch_sync(elementwise_xor(1024), [a, a])"
    ),
}
GOAL = 1.4

_CHILD = """
import time
start = time.perf_counter()
exec(compile({code!r}, "<case>", "exec"))
print(time.perf_counter() - start)
"""


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["VYRE_TELEMETRY"] = env.get("VYRE_TELEMETRY", "on")
    return env


def _time(code: str, env: dict[str, str]) -> float:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD.format(code=code)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=os.path.expanduser("~") if os.path.isdir(os.path.expanduser("~")) else None,
    )
    return float(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--output", help="also write the JSON report to this file")
    args = parser.parse_args(argv)
    env = _environment()
    for code in CASES.values():  # write and warm the byte code of everything imported
        _time(code, env)
    samples: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.rounds):
        for name, code in CASES.items():
            samples[name].append(_time(code, env))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    numpy_s = medians["numpy"]
    import vyre_async

    report: dict[str, Any] = {
        "benchmark": "import_time",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "vyre_async": vyre_async.__version__,
        "rounds": args.rounds,
        "cases": {
            name: {
                "code": CASES[name],
                "median_ms": round(medians[name] * 1e3, 2),
                "min_ms": round(min(samples[name]) * 1e3, 2),
                "max_ms": round(max(samples[name]) * 1e3, 2),
                "ratio_to_numpy": round(medians[name] / numpy_s, 3),
            }
            for name in CASES
        },
        "goal": f"import vyre_async <= {GOAL} x import numpy",
        "met": medians["vyre_async"] / numpy_s <= GOAL,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
