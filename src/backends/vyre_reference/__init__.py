"""The numpy reference engine: the exact oracle of the Program IR semantics.

`execute(program, inputs)` runs every lane of the grid at once with numpy
arrays and masks and returns the outputs; see ``docs/reference-engine.md``.
`ReferenceBackend` (id ``"reference"``) serves it through the driver contract.
"""

from vyre_reference.backend import ReferenceBackend
from vyre_reference.cancel import Cancelled
from vyre_reference.compile import CompiledProgram, cache_clear, cache_info, compile_program
from vyre_reference.engine import execute, run_plan

__all__ = [
    "Cancelled",
    "CompiledProgram",
    "ReferenceBackend",
    "cache_clear",
    "cache_info",
    "compile_program",
    "execute",
    "run_plan",
]
