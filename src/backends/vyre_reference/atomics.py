"""Atomic read-modify-write on U32 words, for every active lane of a statement at once.

Semantics: the atomics of one `Atomic` node execute in *lane order* (increasing
linear lane id), each one seeing the memory left by the previous ones. That
is one of the sequential orders the IR allows, so the final memory of the
commutative ops is exact and the old values are consistent. Out-of-bounds
lanes do nothing and get 0.

When the old value is not used (``Let(name, Atomic(...))`` with ``name``
never read), only the final memory is computed: ``np.add.at`` / ``bincount``
/ ``ufunc.at``, or a per-column sum when the index depends only on the local
id. Otherwise lanes are stably sorted by address and each address's run is
scanned (segmented exclusive scans), and compare-and-swap is processed in
rounds of distinct addresses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from vyre_async.abc import public_dir as _public_dir
from vyre_async.ir.ops import AtomicOp
from vyre_reference.affine import Affine
from vyre_reference.lanes import GridLanes, LaneSet

__all__ = ["apply_atomic"]
__dir__ = _public_dir(__name__)

_M32 = np.uint64(0xFFFF_FFFF)
_U32_KEYS = 1 << 32  # targets smaller than this use uint32 addresses (cheaper than int64)
U32Array = npt.NDArray[np.uint32]

_UFUNC: dict[AtomicOp, np.ufunc] = {
    AtomicOp.OR: np.bitwise_or,
    AtomicOp.AND: np.bitwise_and,
    AtomicOp.XOR: np.bitwise_xor,
    AtomicOp.MIN: np.minimum,
    AtomicOp.MAX: np.maximum,
}


def apply_atomic(
    lanes: LaneSet,
    mask: npt.NDArray[np.bool_] | None,
    arr: npt.NDArray[np.uint32],
    *,
    workgroup: bool,
    op: AtomicOp,
    index: Any,
    value: Any,
    expected: Any,
    want_old: bool,
    check: Callable[[], None],
) -> Any:
    """Apply one atomic node on the active lanes and return the old values.

    Args:
        lanes: The lanes executing the node.
        mask: Active lanes (None = all).
        arr: The target: a 1-D storage array or a 2-D workgroup array.
        workgroup: True when ``arr`` is a WORKGROUP buffer.
        op: The atomic operator.
        index: Element index per lane (U32 value or `Affine`).
        value: Operand per lane (U32).
        expected: Comparand per lane for ``cas`` (else ignored).
        want_old: False when nothing reads the result (only memory is updated).
        check: Cancellation check, called between compare-and-swap rounds.

    Returns:
        The old word per lane (uint32 array on ``lanes``; 0 for inactive and
        out-of-bounds lanes), or a 0 scalar when ``want_old`` is False.
    """
    count = arr.shape[-1]
    if (
        not want_old
        and op is AtomicOp.ADD
        and _column_add(lanes, mask, arr, workgroup, index, value)
    ):
        return np.uint32(0)
    shape = lanes.shape
    index = np.broadcast_to(lanes.value(index), shape)
    value = lanes.value(value)
    if mask is None and count and int(index.max()) < count:
        active: Any = None
        all_active = True
    else:
        active = index < count
        if mask is not None:
            active &= mask
        all_active = bool(active.all())
        if not all_active and not active.any():
            return np.zeros(shape, dtype=np.uint32) if want_old else np.uint32(0)
    if workgroup:
        rows = lanes.wg_ids()
        if arr.size < _U32_KEYS:
            keys_full: npt.NDArray[Any] = rows.astype(np.uint32) * np.uint32(count) + index
        else:
            keys_full = rows * count + index
        keys_full = np.broadcast_to(keys_full, shape)
        target = arr.reshape(-1)
    else:
        keys_full = index
        target = arr
    keys = keys_full.reshape(-1) if all_active else keys_full[active]
    vals = _lanes_of(value, shape, active, all_active)
    exps = _lanes_of(expected, shape, active, all_active) if op is AtomicOp.CAS else None
    if not want_old:
        _final_only(target, op, keys, vals, exps, check)
        return np.uint32(0)
    old = _ordered(target, op, keys, vals, exps, check)
    result = np.zeros(shape, dtype=np.uint32)
    if all_active:
        result.reshape(-1)[:] = old
    else:
        result[active] = old
    return result


def _lanes_of(value: Any, shape: tuple[int, ...], active: Any, all_active: bool) -> Any:
    """Return ``value`` on the active lanes in lane order (a scalar stays a scalar)."""
    if not isinstance(value, np.ndarray):
        return value
    full = np.broadcast_to(value, shape)
    return full.reshape(-1) if all_active else full[active]


def _column_add(
    lanes: LaneSet,
    mask: npt.NDArray[np.bool_] | None,
    arr: npt.NDArray[np.uint32],
    workgroup: bool,
    index: Any,
    value: Any,
) -> bool:
    """Apply an unused-result ``add`` whose index depends only on the local id; True if done."""
    if not (isinstance(lanes, GridLanes) and isinstance(lanes.rows, slice)):
        return False
    if type(index) is Affine:
        if not index.lid_only or index.is_uniform:
            return False
        cols = lanes.materialize(index)
    elif isinstance(index, np.ndarray) and index.ndim == 2 and index.shape[0] == 1:
        cols = index
    else:
        return False
    cols = cols.reshape(-1)
    if cols.shape[0] != lanes.shape[1]:
        return False
    count = arr.shape[-1]
    value = lanes.value(value)
    vals = np.broadcast_to(value, lanes.shape)
    if mask is not None:
        vals = np.where(mask, vals, np.uint32(0))
    ok = cols < count
    if workgroup:
        if np.unique(cols).shape[0] != cols.shape[0]:
            return False
        view = arr[lanes.rows]
        view[:, cols[ok]] += vals[:, ok]
        return True
    sums = vals.sum(axis=0, dtype=np.uint64)
    np.add.at(arr, cols[ok], (sums[ok] & _M32).astype(np.uint32))
    return True


def _final_only(
    target: U32Array,
    op: AtomicOp,
    keys: npt.NDArray[Any],
    vals: Any,
    exps: Any,
    check: Callable[[], None],
) -> None:
    """Update ``target`` as the sequence of atomics would, without old values."""
    if op is AtomicOp.ADD:
        np.add.at(target, keys, vals)  # uint32 addition wraps modulo 2**32
    elif op is AtomicOp.EXCHANGE:
        target[keys] = vals  # last lane in lane order wins
    elif op is AtomicOp.CAS:
        _ordered(target, op, keys, vals, exps, check)
    else:
        _UFUNC[op].at(target, keys, vals)


def _ordered(
    target: U32Array,
    op: AtomicOp,
    keys: npt.NDArray[Any],
    vals: Any,
    exps: Any,
    check: Callable[[], None],
) -> U32Array:
    """Apply the atomics in lane order; return each lane's old value (lane order)."""
    k = keys.shape[0]
    order = np.argsort(keys, kind="stable")
    ks = keys[order]
    vs = np.broadcast_to(np.asarray(vals, dtype=np.uint32), (k,))[order]
    first = np.empty(k, dtype=np.bool_)
    first[0] = True
    np.not_equal(ks[1:], ks[:-1], out=first[1:])
    last = np.empty(k, dtype=np.bool_)
    last[-1] = True
    last[:-1] = first[1:]
    init = target[ks]
    if op is AtomicOp.CAS:
        es = np.broadcast_to(np.asarray(exps, dtype=np.uint32), (k,))[order]
        old_sorted = _cas_rounds(target, ks, vs, es, first, check)
    elif op is AtomicOp.EXCHANGE:
        old_sorted = np.empty(k, dtype=np.uint32)
        old_sorted[0] = init[0]
        old_sorted[1:] = vs[:-1]
        old_sorted = np.where(first, init, old_sorted)
        target[ks[last]] = vs[last]
    elif op is AtomicOp.ADD:
        csum = np.cumsum(vs, dtype=np.uint64)
        seg = np.cumsum(first) - 1
        starts = np.flatnonzero(first)
        before = np.where(starts > 0, csum[starts - 1], np.uint64(0))
        exclusive = csum - vs - before[seg]
        old_sorted = ((init.astype(np.uint64) + exclusive) & _M32).astype(np.uint32)
        ends = np.flatnonzero(last)
        target[ks[ends]] = ((init[ends] + csum[ends] - before) & _M32).astype(np.uint32)
    else:
        fn = _UFUNC[op]
        inclusive = _segmented_scan(fn, vs, ks, first)
        shifted = np.empty(k, dtype=np.uint32)
        shifted[0] = 0
        shifted[1:] = inclusive[:-1]
        old_sorted = np.where(first, init, fn(init, shifted))
        target[ks[last]] = fn(init[last], inclusive[last])
    old = np.empty(k, dtype=np.uint32)
    old[order] = old_sorted
    return old


def _segmented_scan(
    fn: np.ufunc, vs: U32Array, ks: npt.NDArray[Any], first: npt.NDArray[np.bool_]
) -> U32Array:
    """Inclusive scan of ``fn`` within runs of equal ``ks`` (Hillis-Steele doubling)."""
    starts = np.flatnonzero(first)
    longest = int(np.diff(np.append(starts, ks.shape[0])).max())
    out = vs.copy()
    step = 1
    while step < longest:
        same = ks[step:] == ks[:-step]
        out[step:] = np.where(same, fn(out[step:], out[:-step]), out[step:])
        step *= 2
    return out


def _cas_rounds(
    target: U32Array,
    ks: npt.NDArray[Any],
    vs: U32Array,
    es: U32Array,
    first: npt.NDArray[np.bool_],
    check: Callable[[], None],
) -> U32Array:
    """Compare-and-swap in rounds: round ``r`` handles the ``r``-th lane of every address."""
    k = ks.shape[0]
    seg = np.cumsum(first) - 1
    rank = np.arange(k) - np.flatnonzero(first)[seg]
    by_rank = np.argsort(rank, kind="stable")
    sizes = np.bincount(rank)
    old = np.empty(k, dtype=np.uint32)
    offset = 0
    for size in sizes.tolist():
        check()
        pos = by_rank[offset : offset + size]
        offset += size
        where = ks[pos]
        current = target[where]
        old[pos] = current
        hit = current == es[pos]
        target[where[hit]] = vs[pos][hit]
    return old
