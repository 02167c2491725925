"""Backend registry over the ``vyre_async.backends`` entry-point group.

Registration is side-effect free: listing backends loads only each package's
small registration record. No GPU library is imported, no device opened.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

__all__ = ["ENTRY_POINT_GROUP", "BackendRegistration", "registered_backends"]

ENTRY_POINT_GROUP = "vyre_async.backends"

_log = logging.getLogger("vyre_async.registry")


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendRegistration:
    """A lightweight record naming a backend and how to build it.

    Attributes:
        id: Unique backend id (``"reference"``, ``"cupy"``).
        factory: ``"package.module:callable"`` import path, or a callable that
            imports its heavy dependencies only when called.
        precedence: Lower wins among equally capable backends.
        dispatches: False for backends that only compile or validate.
        is_reference: True for the exact oracle backend.
    """

    id: str
    factory: str | Callable[[], Any]
    precedence: int = 100
    dispatches: bool = True
    is_reference: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"backend id must be a non-empty str, got {self.id!r}")
        if isinstance(self.factory, str) and ":" not in self.factory:
            raise ValueError(
                f"backend {self.id!r}: factory {self.factory!r} must look like 'module:callable'"
            )

    def load_factory(self) -> Callable[[], Any]:
        """Return the factory callable, importing its module if given as a path."""
        if callable(self.factory):
            return self.factory
        module_name, _, attr = self.factory.partition(":")
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
        if not callable(target):
            raise TypeError(f"backend {self.id!r}: {self.factory!r} is not callable")
        return target  # type: ignore[no-any-return]


def registered_backends() -> list[BackendRegistration]:
    """Return every installed backend registration, sorted by ``(precedence, id)``.

    Entry points that fail to load or do not name a `BackendRegistration` are
    skipped with a warning in the ``vyre_async.registry`` log.
    """
    found: dict[str, BackendRegistration] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            record = ep.load()
        except Exception as exc:  # a broken third-party package must not break listing
            _log.warning("skipping backend entry point %r: %s", ep.name, exc)
            continue
        if not isinstance(record, BackendRegistration):
            _log.warning(
                "skipping backend entry point %r: it names %r, not a BackendRegistration",
                ep.name,
                type(record).__name__,
            )
            continue
        if record.id in found:
            _log.warning("duplicate backend id %r from entry point %r ignored", record.id, ep.name)
            continue
        found[record.id] = record
    return sorted(found.values(), key=lambda r: (r.precedence, r.id))
