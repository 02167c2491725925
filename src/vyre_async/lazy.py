"""Lazy package exports (PEP 562), for packages whose public names are costly to import.

A backend package is imported just to reach its registration record when
backends are listed; its engine, code generator or GPU library must load only
when a name is first used. `lazy_exports` gives such a package its module-level
``__getattr__`` and ``__dir__``::

    __getattr__, __dir__ = lazy_exports(__name__, {"ReferenceBackend": "backend"}, __all__)
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence

from vyre_async._exports import public_dir

__all__ = ["lazy_exports"]
__dir__ = public_dir(__name__)


def lazy_exports(
    package: str, sources: Mapping[str, str], public: Sequence[str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """Return ``(__getattr__, __dir__)`` for ``package``.

    Args:
        package: The package's ``__name__``.
        sources: Public name -> the submodule (relative to ``package``) defining it.
        public: The package's ``__all__``.
    """

    def __getattr__(name: str) -> object:
        """Import and return the public ``name`` from its submodule on first access.

        A submodule not imported yet is imported too (``package.submodule`` works
        as it did when the package imported every submodule eagerly).
        """
        source = sources.get(name)
        if source is None:
            if not name.startswith("__"):
                try:
                    return importlib.import_module(f"{package}.{name}")
                except ModuleNotFoundError as exc:
                    if exc.name != f"{package}.{name}":
                        raise  # the submodule exists and failed to import
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{source}"), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this hook
        return value

    listed = public_dir(package)

    def __dir__() -> list[str]:
        """List every public name, loaded or not, with the dunders and loaded submodules."""
        return sorted(set(listed()) | set(public))

    return __getattr__, __dir__
