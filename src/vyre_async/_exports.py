"""What ``dir()`` shows of a public module: its ``__all__``, never the names it imported.

Every public module of vyre-async and its backends ends its header with::

    __dir__ = _public_dir(__name__)

so ``dir(vyre_async.programs)``, tab completion and ``help()`` list the module's
own API, not ``np``, ``math``, ``dataclass`` or ``annotations``. The names stay
importable as attributes (code inside the package uses them); only the listing
changes. ``tests/test_public_api.py`` checks every public module.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType

__all__ = ["public_dir"]


def public_dir(module_name: str) -> Callable[[], list[str]]:
    """Return a module-level ``__dir__`` listing ``__all__``, dunders and loaded submodules."""

    def __dir__() -> list[str]:
        module = sys.modules[module_name]
        names = vars(module)
        prefix = module_name + "."
        return sorted(
            {
                *getattr(module, "__all__", ()),
                *(n for n in names if n.startswith("__") and n.endswith("__")),
                *(
                    n
                    for n, v in names.items()
                    if isinstance(v, ModuleType) and v.__name__.startswith(prefix)
                ),
            }
        )

    return __dir__
