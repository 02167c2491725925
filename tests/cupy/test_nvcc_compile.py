"""Every generated kernel of the corpus and of the operator table compiles for sm_90.

The corpus's grid-barrier programs compile twice: as one cooperative kernel
(``cooperative_groups::this_grid().sync()``) and as one kernel per segment.

One ``nvcc -cubin -arch=sm_90`` invocation (PTX generation *and* ``ptxas``)
with the exact options the backend gives NVRTC; codegen that does not compile
fails the suite. Skipped (with the reason) only when ``nvcc`` is absent.
"""

from __future__ import annotations

import pytest

from tests.cupy.conftest import Toolchain
from tests.cupy.emulator import NVCC


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (the CUDA toolkit is not installed)")
def test_all_kernels_compile_for_sm90_without_warnings(toolchain: Toolchain) -> None:
    assert toolchain.nvcc is not None
    returncode, log = toolchain.nvcc.wait()
    assert returncode == 0, f"nvcc rejected {toolchain.nvcc.source}:\n{log[-8000:]}"
    assert "warning" not in log.lower(), log[-4000:]
    expected = (
        len(toolchain.corpus) + len(toolchain.ops) + len(toolchain.probes) + len(toolchain.segments)
    )
    assert len(toolchain.nvcc.kernels) == expected
    assert len(toolchain.corpus) >= 40
