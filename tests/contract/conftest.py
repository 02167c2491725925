"""Contract tests run against every registered, dispatching backend.

A backend that cannot start on this machine (no GPU) is skipped with the
reason its factory gave; a skip is never counted as a pass.
"""

from __future__ import annotations

import pytest

from vyre_async import BackendError, VyreBackend, acquire_backend, registered_backends

BACKEND_IDS = [r.id for r in registered_backends() if r.dispatches]


@pytest.fixture(params=BACKEND_IDS)
def backend(request: pytest.FixtureRequest) -> VyreBackend:
    try:
        return acquire_backend(str(request.param))
    except BackendError as exc:
        pytest.skip(f"backend {request.param!r} cannot start here: {exc}")
