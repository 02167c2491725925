"""The shipped conformance corpus is exactly the reviewed one.

`vyre_async.testing.corpus` is data that third-party backends are judged by:
a case whose inputs, program or expected outputs change silently changes the
contract, and the reference backend cannot notice when the change keeps the
case self-consistent (an input value changed before the oracle computes the
expected outputs from it, a lane count halved in program and oracle alike).
So each case is recorded here, field by field, as digests in
``tests/corpus_snapshot.json``; a change to the corpus fails this test and
names the cases and fields that moved. Recording a deliberate change:

    .venv/bin/python tests/test_corpus_snapshot.py

and the diff of the JSON file goes into review with the change.

Expected F32 outputs of cases with a ULP budget (transcendental ops, whose
oracle is the platform's libm) are recorded by dtype and shape only: their
last bits may differ between C libraries, which the budget allows.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from vyre_async.testing.corpus import Case, cases

SNAPSHOT = Path(__file__).with_name("corpus_snapshot.json")


def _arrays(arrays: tuple[np.ndarray[Any, Any], ...], *, values: bool) -> list[str]:
    out = []
    for array in arrays:
        head = f"{array.dtype.str}{list(array.shape)}"
        if values:
            data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False)
            head += ":" + hashlib.sha256(data.tobytes()).hexdigest()[:24]
        out.append(head)
    return out


def describe(case: Case) -> dict[str, Any]:
    """What the snapshot records of one case (digests of the arrays, the rest as is)."""
    budgeted = case.ulp_budget > 0
    return {
        "rules": list(case.rules),
        "program": case.program.fingerprint().hex()[:24],
        "inputs": _arrays(case.inputs, values=True),
        "expected": _arrays(case.expected, values=not budgeted),
        "grid": list(case.grid) if case.grid is not None else None,
        "ulp_budget": case.ulp_budget,
        "fixpoint_iterations": case.fixpoint_iterations,
        "error": case.error.__name__ if case.error is not None else None,
    }


def snapshot() -> dict[str, dict[str, Any]]:
    """The corpus as the snapshot records it, in the corpus's order."""
    return {case.name: describe(case) for case in cases()}


def test_the_corpus_is_the_recorded_one() -> None:
    recorded = json.loads(SNAPSHOT.read_text())
    now = snapshot()
    added = [name for name in now if name not in recorded]
    removed = [name for name in recorded if name not in now]
    changed = {
        name: sorted(field for field in now[name] if now[name][field] != recorded[name].get(field))
        for name in now
        if name in recorded and now[name] != recorded[name]
    }
    assert not (added or removed or changed), (
        "the conformance corpus differs from tests/corpus_snapshot.json: "
        f"added {added}, removed {removed}, changed {changed}\n"
        "Fix: if the change is intended, record it with "
        "`.venv/bin/python tests/test_corpus_snapshot.py` and review the JSON diff"
    )
    assert list(now) == list(recorded), "the corpus's cases are in another order"


def test_the_snapshot_tells_a_changed_input_from_a_changed_program() -> None:
    case = cases()[0]
    base = describe(case)
    inputs = tuple(array.copy() for array in case.inputs)
    inputs[0].view(np.uint8).reshape(-1)[0] ^= 1
    other = describe(
        Case(
            name=case.name,
            rules=case.rules,
            program=case.program,
            inputs=inputs,
            expected=case.expected,
            grid=case.grid,
        )
    )
    assert [field for field in base if base[field] != other[field]] == ["inputs"]


if __name__ == "__main__":
    SNAPSHOT.write_text(json.dumps(snapshot(), indent=1) + "\n")
    print(f"recorded {len(json.loads(SNAPSHOT.read_text()))} cases in {SNAPSHOT}", file=sys.stderr)
