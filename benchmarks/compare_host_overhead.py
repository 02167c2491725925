"""`host_overhead.py` before and after a change, interleaved in one run; prints one JSON object.

Checks out ``--before`` (a git revision) into a temporary worktree and runs
``benchmarks/host_overhead.py`` of that tree and of the working tree in turn,
``--pairs`` times (before, after, before, after, ...), each in a fresh
interpreter of this environment with its own ``src`` first on the path. Every
figure of every run is divided by the floor of the same run, so machine noise
that slows a whole run cancels:

- ``null_inline`` / ``floor_bare_future``;
- ``null_thread`` / ``floor_thread_hand_off``;
- ``reference`` / ``engine_alone``.

Reported per side: the median of those ratios over the runs and their spread
(max - min); per figure, ``after / before`` of the medians and whether the
change exceeds the larger of the two sides' spreads (the run-to-run noise).

    python benchmarks/compare_host_overhead.py --before HEAD~3 [--pairs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: figure -> the floor it is divided by (both medians of the same run).
RATIOS = {
    "null_inline": "floor_bare_future",
    "null_thread": "floor_thread_hand_off",
    "reference": "engine_alone",
}


def run_tree(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    """Run ``tree``'s host_overhead.py (its own ``src`` first) and return its medians."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tree / "src"), str(tree / "src" / "backends"), str(tree)]
    )
    out = subprocess.run(
        [
            sys.executable,
            str(tree / "benchmarks" / "host_overhead.py"),
            "--no-cuda-fake",
            f"--rounds={args.rounds}",
            f"--repeats={args.repeats}",
            f"--profile={args.profile}",
        ],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=True,
    )
    medians: dict[str, float] = json.loads(out.stdout)["median_us"]
    return medians


def ratios(medians: dict[str, float]) -> dict[str, float]:
    return {name: medians[name] / medians[floor] for name, floor in RATIOS.items()}


def summary(runs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {
        name: {
            "median": round(statistics.median(r[name] for r in runs), 4),
            "spread": round(max(r[name] for r in runs) - min(r[name] for r in runs), 4),
        }
        for name in RATIOS
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    revision = subprocess.run(
        ["git", "rev-parse", "--short", args.before],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="vyre-before-") as scratch:
        before_tree = Path(scratch) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(before_tree), revision],
            cwd=ROOT,
            check=True,
        )
        try:
            before: list[dict[str, float]] = []
            after: list[dict[str, float]] = []
            for i in range(args.pairs):
                print(f"pair {i + 1}/{args.pairs}", file=sys.stderr, flush=True)
                before.append(ratios(run_tree(before_tree, args)))
                after.append(ratios(run_tree(ROOT, args)))
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(before_tree)], cwd=ROOT, check=True
            )
    b, a = summary(before), summary(after)
    verdicts = {}
    for name in RATIOS:
        change = a[name]["median"] - b[name]["median"]
        noise = max(a[name]["spread"], b[name]["spread"])
        verdicts[name] = {
            "after_over_before": round(a[name]["median"] / b[name]["median"], 3),
            "worse_beyond_spread": change > noise,
        }
    return {
        "benchmark": "compare_host_overhead",
        "before": revision,
        "after": "working tree",
        "ratio_to_floor": {f"{k} / {v}": k for k, v in RATIOS.items()},
        "before_ratios": b,
        "after_ratios": a,
        "verdicts": verdicts,
        "pairs": args.pairs,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "date": time.strftime("%Y-%m-%d"),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision to compare against")
    parser.add_argument("--pairs", type=int, default=5, help="before/after runs, interleaved")
    parser.add_argument("--rounds", type=int, default=9, help="host_overhead.py --rounds")
    parser.add_argument("--repeats", type=int, default=200, help="host_overhead.py --repeats")
    parser.add_argument("--profile", type=int, default=200, help="host_overhead.py --profile")
    print(json.dumps(main(parser.parse_args()), indent=2))
