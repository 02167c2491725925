"""Small helpers shared by the test suite."""

from __future__ import annotations

from typing import Any

from vyre_async._backend import VyreBackend
from vyre_async.abc import Executor

#: `VyreBackend`'s own keyword arguments; every other one goes to the executor.
ENGINE_ARGS = frozenset(("pipeline_cache_capacity", "disk_cache", "prefetch", "close_timeout"))


def backend_of(executor: type[Executor], *args: Any, **kwargs: Any) -> VyreBackend:
    """Build ``VyreBackend(executor(*args, **own), **engine)``, splitting ``kwargs`` by owner."""
    engine = {k: kwargs.pop(k) for k in list(kwargs) if k in ENGINE_ARGS}
    return VyreBackend(executor(*args, **kwargs), **engine)
