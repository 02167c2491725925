"""Checked-in wire bytes of the standard programs keep the format stable.

If a change to the format is intended, bump the wire version and regenerate:
``VYRE_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/ir/test_golden.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vyre_async.ir import Program, validate
from vyre_async.programs import (
    elementwise_xor,
    histogram,
    prefix_scan,
    saxpy,
    sum_reduction,
    tiled_matmul,
)

GOLDEN = Path(__file__).parent / "golden"
PROGRAMS = {
    "xor": elementwise_xor(1000),
    "saxpy": saxpy(1000),
    "sum": sum_reduction(5000, workgroup=256, items_per_lane=4),
    "histogram": histogram(),
    "scan": prefix_scan(1000),
    "matmul": tiled_matmul(40, 24, 33),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_standard_program_validates_clean(name: str) -> None:
    assert validate(PROGRAMS[name]) == []


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_wire_bytes_match_the_golden_file(name: str) -> None:
    program = PROGRAMS[name]
    path = GOLDEN / f"{name}.hex"
    wire = program.to_wire()
    if os.environ.get("VYRE_REGEN_GOLDEN") == "1":
        path.write_text(wire.hex() + "\n")
    golden = bytes.fromhex(path.read_text().strip())
    assert wire == golden, f"wire form of {name} changed; see this module's docstring"
    assert Program.from_wire(golden) == program
    assert program.fingerprint() == golden[8:40]
