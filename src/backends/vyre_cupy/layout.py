"""Where each buffer of one launch lives: one device arena, one upload, one readback.

A launch allocates a single device arena laid out as::

    [vy_lens | READ/UNIFORM inputs | READ_WRITE buffers | WRITE buffers]
     <----------- uploaded from pinned staging ----------->
                                    <------ read back into pinned memory ------>
                                                         <- zeroed (memset) ->

so its upload is one host-to-device copy, its zeroing one memset and its
readback one device-to-host copy, all enqueued on the dispatch's stream.
Resident buffers are bound directly (no arena space) unless a READ_WRITE
resident buffer is also passed in another slot: then it is copied into the
arena (device to device) so each slot starts from the same contents, as on the
reference backend, and copied back after the launch. Every slot is aligned to
256 bytes. Pure Python: tested without a GPU.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from vyre_async.abc import public_dir as _public_dir
from vyre_async.ir.types import Access

__all__ = ["ALIGN", "ArenaLayout", "Slot", "Source", "plan_layout"]
__dir__ = _public_dir(__name__)

#: Byte alignment of every buffer inside the arena (cudaMalloc's alignment).
ALIGN = 256


class Source(Enum):
    """Where a parameter's initial contents come from."""

    HOST = "host"  # uploaded from pinned staging
    DEVICE = "device"  # copied from a resident buffer (device to device)
    ZERO = "zero"  # a WRITE buffer, zero-filled
    DIRECT = "direct"  # a resident buffer bound in place (no arena space)


@dataclass(frozen=True, slots=True)
class Slot:
    """One kernel parameter's place in the launch.

    Attributes:
        source: Where its initial contents come from.
        offset: Byte offset in the arena (None for `Source.DIRECT`).
        nbytes: Size in bytes.
        readback: Byte offset in the pinned readback buffer for output
            parameters, else None.
    """

    source: Source
    offset: int | None
    nbytes: int
    readback: int | None


@dataclass(frozen=True, slots=True)
class ArenaLayout:
    """The arena of one launch (see the module docstring)."""

    slots: tuple[Slot, ...]
    lens_bytes: int
    upload_bytes: int
    zero_offset: int
    zero_bytes: int
    download_offset: int
    download_bytes: int
    readback_bytes: int
    total_bytes: int


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_layout(
    accesses: Sequence[Access], counts: Sequence[int], resident: Sequence[Source | None]
) -> ArenaLayout:
    """Return the arena layout of one launch (memoised: repeated shapes cost a lookup).

    Args:
        accesses: Access mode of each kernel parameter (non-WORKGROUP buffers, in order).
        counts: Element count of each parameter.
        resident: Per parameter: None for a host input or WRITE buffer, else
            `Source.DIRECT` or `Source.DEVICE` for a resident input.

    Returns:
        The layout; ``vy_lens`` always sits at offset 0.
    """
    return _plan_layout(tuple(accesses), tuple(counts), tuple(resident))


@functools.lru_cache(maxsize=1024)
def _plan_layout(
    accesses: tuple[Access, ...], counts: tuple[int, ...], resident: tuple[Source | None, ...]
) -> ArenaLayout:
    n = len(accesses)
    sources: list[Source] = []
    for access, where in zip(accesses, resident, strict=True):
        if access is Access.WRITE:
            sources.append(Source.ZERO)
        else:
            sources.append(where or Source.HOST)
    offsets: list[int | None] = [None] * n
    lens_bytes = 4 * max(1, n)
    at = _align(lens_bytes)
    groups = [
        i for i in range(n) if accesses[i] is not Access.READ_WRITE and sources[i] is Source.HOST
    ] + [
        i for i in range(n) if accesses[i] is Access.READ_WRITE and sources[i] is not Source.DIRECT
    ]
    first_rw = next((i for i in groups if accesses[i] is Access.READ_WRITE), None)
    download_offset: int | None = None
    for i in groups:
        if i == first_rw:
            download_offset = at
        offsets[i] = at
        at += _align(4 * counts[i])
    upload_bytes = at
    zero_offset = at
    if download_offset is None:
        download_offset = at
    for i in range(n):
        if sources[i] is Source.ZERO:
            offsets[i] = at
            at += _align(4 * counts[i])
    zero_bytes = at - zero_offset
    download_bytes = at - download_offset
    readback_at = download_bytes
    slots = []
    for i in range(n):
        nbytes = 4 * counts[i]
        readback: int | None = None
        if accesses[i] in (Access.READ_WRITE, Access.WRITE):
            offset = offsets[i]
            if offset is not None:
                readback = offset - download_offset
            else:
                readback = readback_at
                readback_at += _align(nbytes)
        slots.append(Slot(sources[i], offsets[i], nbytes, readback))
    return ArenaLayout(
        slots=tuple(slots),
        lens_bytes=lens_bytes,
        upload_bytes=upload_bytes,
        zero_offset=zero_offset,
        zero_bytes=zero_bytes,
        download_offset=download_offset,
        download_bytes=download_bytes,
        readback_bytes=readback_at,
        total_bytes=max(at, ALIGN),
    )
