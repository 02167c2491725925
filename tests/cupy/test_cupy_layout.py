"""The launch arena layout and the stream pool (pure Python parts of the runtime)."""

from __future__ import annotations

import itertools
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vyre_async.ir import Access
from vyre_cupy.layout import ALIGN, Source, plan_layout
from vyre_cupy.streams import StreamPool

R, U, RW, W = Access.READ, Access.UNIFORM, Access.READ_WRITE, Access.WRITE


def test_regions_are_contiguous_and_aligned() -> None:
    layout = plan_layout([W, R, RW, U, W], [3, 5, 7, 1, 0], [None] * 5)
    s = layout.slots
    assert [x.source for x in s] == [
        Source.ZERO,
        Source.HOST,
        Source.HOST,
        Source.HOST,
        Source.ZERO,
    ]
    assert all(x.offset is not None and x.offset % ALIGN == 0 for x in s)
    assert layout.lens_bytes == 20 and s[1].offset == ALIGN  # vy_lens first
    # upload = lens + READ/UNIFORM + READ_WRITE; download = READ_WRITE + WRITE; zero = WRITE.
    assert s[1].offset < s[3].offset < s[2].offset < s[0].offset <= s[4].offset
    assert layout.upload_bytes == layout.zero_offset == s[0].offset
    assert layout.download_offset == s[2].offset
    assert layout.download_offset + layout.download_bytes == layout.total_bytes
    assert layout.zero_bytes == layout.total_bytes - layout.zero_offset
    assert [x.readback for x in s] == [
        s[0].offset - s[2].offset,
        None,
        0,
        None,
        s[4].offset - s[2].offset,
    ]
    assert layout.readback_bytes == layout.download_bytes


def test_resident_buffers_bind_in_place_unless_aliased() -> None:
    layout = plan_layout([R, RW, W], [4, 4, 4], [Source.DIRECT, Source.DIRECT, None])
    read, rw, _write = layout.slots
    assert read.source is rw.source is Source.DIRECT and read.offset is rw.offset is None
    assert rw.readback is not None and rw.readback >= layout.download_bytes
    assert layout.readback_bytes == layout.download_bytes + ALIGN
    aliased = plan_layout([R, RW], [4, 4], [Source.DIRECT, Source.DEVICE])
    assert aliased.slots[1].source is Source.DEVICE and aliased.slots[1].offset is not None
    assert aliased.slots[1].readback == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([R, U, RW, W]),
            st.integers(0, 300),
            st.sampled_from([None, Source.DIRECT, Source.DEVICE]),
        ),
        max_size=8,
    )
)
def test_slots_never_overlap(params: list[tuple[Access, int, Source | None]]) -> None:
    accesses = [a for a, _, _ in params]
    counts = [c for _, c, _ in params]
    resident = [None if a is W else r for a, _, r in params]
    resident = [
        Source.DIRECT if (r is Source.DEVICE and a is not RW) else r
        for a, r in zip(accesses, resident, strict=True)
    ]
    layout = plan_layout(accesses, counts, resident)
    spans = [(0, layout.lens_bytes)] + [
        (s.offset, s.offset + s.nbytes) for s in layout.slots if s.offset is not None
    ]
    spans.sort()
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start
    assert all(end <= layout.total_bytes for _, end in spans)
    reads = [(s.readback, s.readback + s.nbytes) for s in layout.slots if s.readback is not None]
    reads.sort()
    for (_, end), (start, _) in itertools.pairwise(reads):
        assert end <= start
    assert all(end <= layout.readback_bytes for _, end in reads)
    for slot, access in zip(layout.slots, accesses, strict=True):
        assert (slot.readback is not None) == (access in (RW, W))
        if slot.source is Source.HOST or slot.source is Source.DEVICE:
            assert slot.offset is not None and slot.offset + slot.nbytes <= layout.upload_bytes


def test_stream_pool_spreads_work_and_creates_streams_lazily() -> None:
    made: list[int] = []

    def make() -> int:
        made.append(len(made))
        return len(made) - 1

    pool = StreamPool(4, make)
    assert pool.created() == 0
    leases = [pool.lease() for _ in range(8)]
    assert pool.busy() == (2, 2, 2, 2) and pool.created() == 4 and len(made) == 4
    for index, _ in leases[:4]:
        pool.release(index)
    assert sum(pool.busy()) == 4
    index, _ = pool.lease()
    assert pool.busy()[index] == 2  # the least busy stream was taken
    with pytest.raises(RuntimeError):
        for _ in range(3):
            pool.release(0)
    with pytest.raises(ValueError):
        StreamPool(0, make)


def test_stream_pool_is_thread_safe() -> None:
    pool = StreamPool(3, object)

    def worker() -> None:
        for _ in range(2000):
            index, _ = pool.lease()
            pool.release(index)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pool.busy() == (0, 0, 0)


def test_a_failing_stream_factory_leaves_the_pool_consistent() -> None:
    def broken() -> None:
        raise RuntimeError("no streams today")

    pool = StreamPool(2, broken)
    with pytest.raises(RuntimeError):
        pool.lease()
    assert pool.busy() == (0, 0)


def test_regions_already_aligned_take_no_padding() -> None:
    # 64 u32 = 256 bytes: exactly one ALIGN each, no gap after it; an empty buffer takes none.
    layout = plan_layout([R, W, W], [64, 64, 0], [None] * 3)
    assert [x.offset for x in layout.slots] == [ALIGN, 2 * ALIGN, 3 * ALIGN]
    assert layout.upload_bytes == 2 * ALIGN and layout.download_bytes == ALIGN
    assert layout.total_bytes == 3 * ALIGN
