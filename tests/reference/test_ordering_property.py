"""Dispatches sharing resident buffers, submitted without awaiting, equal sequential runs.

A property test of the reference backend's ordering (writes wait for earlier
readers and writers of a buffer, reads for earlier writers): random sequences of
``a = a * 3 + b`` and copies over three resident buffers, on 1 to 3 worker
threads, compared with the same operations applied one by one in numpy.
"""

from __future__ import annotations

import anyio
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.contract.test_contract import resident_order_programs
from tests.policies.kernels import accumulate
from vyre_reference import reference_backend

N = 64
ACCUMULATE = accumulate()
_, _, COPY = resident_order_programs(N)

operation = st.one_of(
    st.tuples(st.just("acc"), st.integers(0, 2), st.integers(0, 2)).filter(lambda t: t[1] != t[2]),
    st.tuples(st.just("copy"), st.integers(0, 2), st.just(0)),
)


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(operation, min_size=1, max_size=14), workers=st.integers(1, 3))
def test_unawaited_dispatches_on_shared_buffers_equal_sequential_execution(
    ops: list[tuple[str, int, int]], workers: int
) -> None:
    backend = reference_backend(inline_ns=0, max_workers=workers, prefetch=False)
    start = [np.arange(N, dtype=np.uint32) * np.uint32(k + 1) for k in range(3)]
    handles = [backend.upload(a) for a in start]
    model = [a.copy() for a in start]
    expected_copies = []
    pendings = []
    for kind, a, b in ops:
        if kind == "acc":  # buffer a = a * 3 + buffer b
            pendings.append(backend.dispatch(ACCUMULATE, [handles[a], handles[b]]))
            model[a] = model[a] * np.uint32(3) + model[b]
        else:
            pendings.append(backend.dispatch(COPY, [handles[a]]))
            expected_copies.append(model[a].copy())
    copies = []
    for (kind, _, _), pending in zip(ops, pendings, strict=True):
        outputs = pending.result()
        if kind == "copy":
            copies.append(outputs[0])
    assert [c.tolist() for c in copies] == [e.tolist() for e in expected_copies]
    assert [backend.download(h).tolist() for h in handles] == [m.tolist() for m in model]
    for h in handles:
        backend.free(h)
    anyio.run(backend.shutdown)
