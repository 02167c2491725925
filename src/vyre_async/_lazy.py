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
from collections.abc import Callable, Iterable, Mapping, Sequence

from vyre_async._exports import public_dir

__all__ = ["lazy_exports"]
__dir__ = public_dir(__name__)


def lazy_exports(
    package: str,
    sources: Mapping[str, str],
    public: Sequence[str],
    submodules: Iterable[str] = (),
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """Return ``(__getattr__, __dir__)`` for ``package``.

    Args:
        package: The package's ``__name__``.
        sources: Public name -> the module defining it: a submodule relative to
            ``package`` (``"backend"``), or a full module name under the same
            top-level package (``"vyre_async._store"``).
        public: The package's ``__all__``.
        submodules: Further submodules that ``package.submodule`` loads on first
            access, as it did when the package imported them eagerly (those
            in ``sources`` do anyway). Any other missing name is an
            `AttributeError` at once: ``hasattr`` never imports anything else.
    """
    top = package.partition(".")[0] + "."

    def full(source: str) -> str:
        return source if source.startswith(top) else f"{package}.{source}"

    loadable = frozenset(s for s in sources.values() if not s.startswith(top)) | frozenset(
        submodules
    )

    def __getattr__(name: str) -> object:
        """Import and return the public ``name``, or a listed submodule, on first access."""
        source = sources.get(name)
        if source is None:
            if name in loadable:
                return importlib.import_module(f"{package}.{name}")
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(full(source)), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this hook
        return value

    listed = public_dir(package)

    def __dir__() -> list[str]:
        """List every public name, loaded or not, with the dunders and loaded submodules."""
        return sorted(set(listed()) | set(public))

    return __getattr__, __dir__
