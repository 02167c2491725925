"""Each reference test compiles its programs itself.

The engine keeps compiled programs (``compile_program``'s cache) and launch
geometries (``memory._builtins``) for the whole process. mutmut runs a
mutant's tests in a child forked from the process that ran every test once
cleanly, so without this a program compiled there came back from the cache
and a mutant of the compiler was never run (a false survivor); the same holds
for one test's program met again in a later test. Clearing before each test
costs the suite a few seconds.
"""

from __future__ import annotations

import pytest

import vyre_reference
from vyre_reference import memory


@pytest.fixture(autouse=True)
def _compile_afresh() -> None:
    vyre_reference.cache_clear()
    memory._builtins.cache_clear()
