"""docs/architecture.md names exactly the modules a warm reference dispatch runs code in.

The measurement of the page is repeated here: a warm, awaited 64-lane xor on
the reference backend, after enough repeats for shape prediction to reach its
steady state, traced with `sys.setprofile`. Every module whose code runs,
except the reference interpreter (the backend's device), must be in the
page's numbered list, and the list must hold at most 8 modules.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
#: The reference interpreter: the modules that run the kernel itself.
INTERPRETER = {
    f"vyre_reference.{name}"
    for name in ("engine", "compile", "frame", "lanes", "memory", "affine", "arith")
}

TRACE = """
import asyncio, sys
import numpy as np
from vyre_async.programs import elementwise_xor
from vyre_reference import reference_backend

async def main():
    backend = reference_backend()
    program = elementwise_xor(64)
    data = np.arange(64, dtype=np.uint32)
    for _ in range(100):
        await backend.dispatch(program, [data, data])
    seen = set()

    def profile(frame, event, arg):
        if event == "call":
            seen.add(frame.f_globals.get("__name__", "?"))

    sys.setprofile(profile)
    outputs = await backend.dispatch(program, [data, data])
    sys.setprofile(None)
    assert (outputs[0] == 0).all()
    await backend.aclose()
    print("\\n".join(sorted(m for m in seen if m.startswith("vyre"))))

asyncio.run(main())
"""


def documented_modules() -> list[str]:
    text = DOC.read_text()
    section = text[text.index("## How many modules one warm dispatch touches") :]
    return re.findall(r"^\d+\. `([\w.]+)`", section, flags=re.MULTILINE)


def test_the_page_lists_at_most_eight_modules() -> None:
    listed = documented_modules()
    assert 1 <= len(listed) <= 8, listed
    assert len(set(listed)) == len(listed)


def test_a_warm_reference_dispatch_runs_exactly_the_listed_modules() -> None:
    out = subprocess.run(
        [sys.executable, "-c", TRACE], capture_output=True, text=True, check=True, timeout=120
    )
    ran = set(out.stdout.split())
    assert "vyre_reference.engine" in ran  # (the trace saw the kernel run: not vacuous)
    assert ran - INTERPRETER == set(documented_modules())
