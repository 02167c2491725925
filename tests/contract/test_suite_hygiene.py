"""The shipped suite leaves nothing running behind its tests.

A contract test that acquires a backend of its own must close it: one left open
kept its threads for the rest of the session, and a later test that counts a
backend's threads (the CUDA backend's one completion thread) failed whenever it
ran after it. Found when mutation testing ran the CUDA tests in another order.
"""

from __future__ import annotations

from typing import Any

import pytest

from vyre_async import VyreBackend, acquire_backend
from vyre_async.testing import test_contract as suite
from vyre_reference import ReferenceBackend

pytestmark = pytest.mark.anyio


async def test_a_backend_a_contract_test_acquires_is_closed_when_it_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    acquired: list[VyreBackend] = []
    real = acquire_backend

    def recording(*args: Any, **kwargs: Any) -> VyreBackend:
        backend = real(*args, **kwargs)
        acquired.append(backend)
        return backend

    monkeypatch.setattr(suite, "acquire_backend", recording)
    await suite.test_a_closed_backend_refuses_every_operation(ReferenceBackend())
    assert len(acquired) == 1  # the test's own check that the Fix gives a new instance
    assert all(backend.closed for backend in acquired)
