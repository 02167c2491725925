"""The numpy reference engine: the exact oracle of the Program IR semantics.

`execute(program, inputs)` runs every lane of the grid at once with numpy
arrays and masks and returns the outputs; see ``docs/reference-engine.md``.
`ReferenceExecutor` (id ``"reference"``) serves it through the driver contract;
`reference_backend()` builds ``VyreBackend(ReferenceExecutor(...))``.

The names below load on first access (PEP 562), so importing this package —
as listing backends does, to reach `vyre_reference.registration` — imports
none of the engine.
"""

# Private aliases only: the namespace holds nothing public but `__all__`'s names.
import typing as _typing

from vyre_async.abc import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
    from vyre_reference.backend import ReferenceExecutor, reference_backend
    from vyre_reference.cancel import Cancelled
    from vyre_reference.compile import CompiledProgram, cache_clear, cache_info, compile_program
    from vyre_reference.engine import execute, run_plan

__all__ = [
    "Cancelled",
    "CompiledProgram",
    "ReferenceExecutor",
    "cache_clear",
    "cache_info",
    "compile_program",
    "execute",
    "reference_backend",
    "run_plan",
]

# Public name -> the submodule that defines it.
_SOURCES = {
    "Cancelled": "cancel",
    "CompiledProgram": "compile",
    "ReferenceExecutor": "backend",
    "reference_backend": "backend",
    "cache_clear": "compile",
    "cache_info": "compile",
    "compile_program": "compile",
    "execute": "engine",
    "run_plan": "engine",
}


__getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, __all__)
