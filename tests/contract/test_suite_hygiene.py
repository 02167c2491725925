"""A contract test that acquires a backend of its own closes it.

`test_a_closed_backend_refuses_every_operation` acquires a new instance to show
that its error's Fix works. Left open, it kept its threads for the rest of the
session, and a later test that counts a backend's threads (the CUDA backend's
one completion thread) failed whenever it ran after it. Found when mutation
testing ran the CUDA tests in another order.
"""

from __future__ import annotations

from typing import Any

import pytest

from vyre_async import VyreBackend, acquire_backend
from vyre_async.testing import test_contract as suite

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

    # as the plugin runs it: on the registry's instance, which the test closes
    backend = acquire_backend("reference")
    monkeypatch.setattr(suite, "acquire_backend", recording)
    await suite.test_a_closed_backend_refuses_every_operation(backend)
    assert len(acquired) == 1  # the test's own check that the Fix gives a new instance
    assert acquired[0] is not backend
    assert all(backend.closed for backend in acquired)
