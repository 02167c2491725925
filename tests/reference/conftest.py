"""Each reference test compiles its programs itself.

The engine keeps compiled programs (``compile_program``'s cache) and launch
geometries (``memory._builtins``) for the whole process. mutmut's clean run
ties a function to the tests during which it ran: a test whose program an
earlier test compiled never reaches the compiler, so the compiler's mutants
were not run against it. In one process (``scripts/mutation.py --check``, the
triage's kill checks) a program compiled by the clean pass came back from the
cache under every mutant. Clearing before each test costs the suite no
measurable time (29.7 s for ``tests/reference`` with it, 31.8 s without).
"""

from __future__ import annotations

import pytest

import vyre_reference
from vyre_reference import memory


@pytest.fixture(autouse=True)
def _compile_afresh() -> None:
    vyre_reference.cache_clear()
    memory._builtins.cache_clear()
