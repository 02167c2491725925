"""Buffers of one launch, and bounds-checked loads and stores on lane sets.

Storage buffers are flat 1-D arrays; a WORKGROUP buffer is one 2-D
``(workgroups, count)`` array, row ``W`` being workgroup ``W``'s private copy.
An out-of-bounds load yields 0 and an out-of-bounds store does nothing, for
both kinds (a workgroup index past ``count`` never reaches another row).

Loads may return *views* of a buffer (a slice for ``x[gid]``, a strided view
for ``x[wgid * s + lid]``); callers copy a view of a writable buffer before
keeping it past the current statement. Colliding stores within one statement
keep the value of the last lane in lane order.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import as_strided

from vyre_async.abc import public_dir as _public_dir
from vyre_reference.affine import Affine
from vyre_reference.cancel import Cancelled
from vyre_reference.lanes import FlatLanes, GridLanes, LaneSet

__all__ = ["LaunchState", "load_global", "load_workgroup", "store_global", "store_workgroup"]
__dir__ = _public_dir(__name__)

_MOD = 1 << 32


def _never() -> None:
    return None


class LaunchState:
    """Everything a frame needs from the launch it belongs to.

    Attributes:
        arrays: Buffer name → storage (1-D) or workgroup (2-D) array.
        lengths: Buffer name → element count as a uint32 scalar (`BufLen`).
        builtins: ``(kind, axis)`` → `Affine` for gid/lid/wgid, uint32 scalar for nwg.
        grid: Workgroups per axis.
        workgroup: Lanes per workgroup axis.
        check_cancel: Raises `Cancelled` once the cancel event is set.
    """

    __slots__ = ("arrays", "builtins", "check_cancel", "grid", "lengths", "workgroup")

    def __init__(
        self,
        arrays: dict[str, npt.NDArray[Any]],
        lengths: dict[str, np.uint32],
        grid: tuple[int, int, int],
        workgroup: tuple[int, int, int],
        cancel: threading.Event | None,
    ) -> None:
        self.arrays = arrays
        self.lengths = lengths
        self.grid = grid
        self.workgroup = workgroup
        self.builtins = _builtins(grid, workgroup)
        self.check_cancel: Callable[[], None] = _never if cancel is None else _checker(cancel)


@functools.lru_cache(maxsize=256)
def _builtins(
    grid: tuple[int, int, int], workgroup: tuple[int, int, int]
) -> dict[tuple[str, int], Any]:
    """Return the builtin values of one launch geometry (immutable; shared between launches)."""
    builtins: dict[tuple[str, int], Any] = {}
    for axis in range(3):
        unit = tuple(1 if k == axis else 0 for k in range(3))
        wg_unit = tuple(workgroup[axis] if k == axis else 0 for k in range(3))
        builtins[("lid", axis)] = Affine(0, (0, 0, 0), unit)  # type: ignore[arg-type]
        builtins[("wgid", axis)] = Affine(0, unit, (0, 0, 0))  # type: ignore[arg-type]
        builtins[("gid", axis)] = Affine(0, wg_unit, unit)  # type: ignore[arg-type]
        builtins[("nwg", axis)] = np.uint32(grid[axis] % _MOD)
    return builtins


def _checker(cancel: threading.Event) -> Callable[[], None]:
    def check() -> None:
        if cancel.is_set():
            raise Cancelled("the dispatch was cancelled; the reference engine stopped")

    return check


# ---------------------------------------------------------------------------------
# storage buffers


def _affine_view(
    lanes: LaneSet, arr: npt.NDArray[Any], index: Affine, *, store: bool
) -> npt.NDArray[Any] | None:
    """Return the view of ``arr`` that ``arr[index]`` reads on ``lanes``, or None.

    Only in-bounds, non-negative-stride cases qualify; for a store the map from
    lanes to elements must also be one-to-one.
    """
    lin = index.linear(lanes.grid, lanes.workgroup)
    if lin is None:
        return None
    c, a, b = lin
    if a < 0 or b < 0:
        return None
    n = arr.shape[0]
    item = arr.itemsize
    if isinstance(lanes, GridLanes):
        if not (isinstance(lanes.rows, slice) and isinstance(lanes.cols, slice)):
            return None
        ng, nl = lanes.shape
        off = c + a * lanes.rows.start + b * lanes.cols.start
        last = off + a * (ng - 1) + b * (nl - 1)
        if off < 0 or last >= n:
            return None
        if store and not (
            (a or ng == 1) and (b or nl == 1) and (ng == 1 or nl == 1 or a >= b * nl)
        ):
            return None
        if b and a == b * nl:  # rows follow each other: a plain strided slice, reshaped
            return arr[off : last + 1 : b].reshape(ng, nl)
        shape = (ng if a else 1, nl if b else 1)
        return as_strided(arr[off:], shape=shape, strides=(a * item, b * item), writeable=store)
    assert isinstance(lanes, FlatLanes)
    nl_total = lanes.workgroup[0] * lanes.workgroup[1] * lanes.workgroup[2]
    if not isinstance(lanes.lanes, slice) or a != b * nl_total or b == 0:
        return None
    k = lanes.size
    off = c + b * lanes.lanes.start
    last = off + b * (k - 1)
    if off < 0 or last >= n:
        return None
    return arr[off : last + 1 : b]


def load_global(lanes: LaneSet, arr: npt.NDArray[Any], index: Any) -> Any:
    """Return ``arr[index]`` on ``lanes`` (0 where out of bounds); may be a view of ``arr``."""
    n = arr.shape[0]
    if type(index) is Affine:
        view = _affine_view(lanes, arr, index, store=False)
        if view is not None:
            return view[0, 0] if view.shape == (1, 1) else view
        index = lanes.materialize(index)
    if not isinstance(index, np.ndarray):
        i = int(index)
        return arr[i] if i < n else arr.dtype.type(0)
    if n == 0 or index.size == 0:
        return np.zeros(index.shape, dtype=arr.dtype)
    if int(index.max()) < n:
        return arr[index]
    ok = index < n
    return np.where(ok, arr[np.where(ok, index, 0)], arr.dtype.type(0))


def _in_order(view: npt.NDArray[Any], arr: npt.NDArray[Any]) -> bool:
    """Return True when ``view`` walks ``arr`` from its first element contiguously in C order."""
    if view.__array_interface__["data"][0] != arr.__array_interface__["data"][0]:
        return False
    expected = arr.itemsize
    for extent, stride in zip(reversed(view.shape), reversed(view.strides), strict=True):
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True


def _last_active(lanes: LaneSet, mask: npt.NDArray[np.bool_] | None) -> tuple[int, ...] | None:
    if mask is None:
        return tuple(s - 1 for s in lanes.shape)
    hits = np.flatnonzero(np.broadcast_to(mask, lanes.shape))
    if hits.size == 0:
        return None
    return tuple(int(i) for i in np.unravel_index(int(hits[-1]), lanes.shape))


def _unshare(value: Any, arr: npt.NDArray[Any]) -> Any:
    if isinstance(value, np.ndarray) and np.may_share_memory(value, arr):
        return value.copy()
    return value


def store_global(
    lanes: LaneSet,
    mask: npt.NDArray[np.bool_] | None,
    arrays: dict[str, npt.NDArray[Any]],
    name: str,
    index: Any,
    value: Any,
    *,
    fresh: bool = False,
) -> None:
    """Write ``value`` to ``arrays[name][index]`` on the active lanes (out of bounds: nothing).

    With ``fresh`` (the value is a new array nothing else references), a store
    that overwrites the whole buffer in order adopts the value as the buffer
    instead of copying it.
    """
    arr = arrays[name]
    value = _unshare(value, arr)
    if mask is None and type(index) is Affine:
        view = _affine_view(lanes, arr, index, store=True)
        if view is not None:
            if (
                fresh
                and isinstance(value, np.ndarray)
                and value.base is None
                and value.flags.writeable  # (a lane set's cached value is read-only)
                and value.dtype == arr.dtype
                and value.size == arr.size
                and value.flags.c_contiguous
                and view.size == arr.size
                and _in_order(view, arr)
            ):
                arrays[name] = value.reshape(-1)
                return
            view[...] = value
            return
    index = lanes.value(index)
    n = arr.shape[0]
    if not isinstance(index, np.ndarray):
        i = int(index)
        if i >= n:
            return
        last = _last_active(lanes, mask)
        if last is None:
            return
        arr[i] = (
            np.broadcast_to(value, lanes.shape)[last] if isinstance(value, np.ndarray) else value
        )
        return
    index = np.broadcast_to(index, lanes.shape)
    sel = index < n
    if mask is not None:
        sel &= mask
    if sel.all():
        arr[index.reshape(-1)] = (
            np.broadcast_to(value, lanes.shape).reshape(-1)
            if isinstance(value, np.ndarray)
            else value
        )
        return
    arr[index[sel]] = (
        np.broadcast_to(value, lanes.shape)[sel] if isinstance(value, np.ndarray) else value
    )


# ---------------------------------------------------------------------------------
# workgroup buffers


def _progression(row: npt.NDArray[Any]) -> slice | None:
    """Return ``row`` (increasing integers with one positive step) as a slice, else None."""
    n = row.shape[0]
    start = int(row[0])
    if n == 1:
        return slice(start, start + 1)
    step = int(row[1]) - start
    if step <= 0:
        return None
    if not np.array_equal(row, np.arange(start, start + step * n, step)):
        return None
    return slice(start, start + step * (n - 1) + 1, step)


def _lid_window(
    lanes: LaneSet, index: Affine, count: int
) -> tuple[slice, int, int, int, int] | None:
    """Return (rows, col0, step, lo, hi) when ``index`` is ``col0 + step·L`` on a grid set.

    Lanes ``lo..hi-1`` of the set's columns are in bounds (``0 <= index < count``).
    """
    if not isinstance(lanes, GridLanes):
        return None
    if not (isinstance(lanes.rows, slice) and isinstance(lanes.cols, slice)):
        return None
    if not index.lid_only:
        return None
    lo_index, hi_index = lanes.bounds(index)
    if lo_index < 0 or hi_index >= _MOD:  # some lane's index wraps: the general path
        return None
    lin = index.linear(lanes.grid, lanes.workgroup)
    if lin is None or lin[2] <= 0:
        return None
    c, _, b = lin
    nl = lanes.shape[1]
    off = c + b * lanes.cols.start
    lo = min(nl, -(off // b)) if off < 0 else 0  # first lane with off + b·L >= 0
    hi = min(nl, -(-(count - off) // b)) if count > off else 0  # lanes with off + b·L < count
    return lanes.rows, off, b, lo, max(lo, hi)


def load_workgroup(lanes: LaneSet, arr: npt.NDArray[Any], index: Any) -> Any:
    """Return each lane's workgroup row of ``arr`` at ``index`` (0 where out of bounds)."""
    count = arr.shape[1]
    if type(index) is Affine:
        window = _lid_window(lanes, index, count)
        if window is not None:
            rows, off, b, lo, hi = window
            nl = lanes.shape[1]
            if lo == 0 and hi == nl:
                return arr[rows, off : off + b * (nl - 1) + 1 : b]
            out = np.zeros(lanes.shape, dtype=arr.dtype)
            if lo < hi:
                out[:, lo:hi] = arr[rows, off + b * lo : off + b * (hi - 1) + 1 : b]
            return out
        index = lanes.materialize(index)
    rows_ids = lanes.wg_ids()
    if not isinstance(index, np.ndarray):
        i = int(index)
        if isinstance(lanes, GridLanes):
            if i >= count:
                return np.zeros((lanes.shape[0], 1), dtype=arr.dtype)
            if isinstance(lanes.rows, slice):
                return arr[lanes.rows, i : i + 1]
            return arr[rows_ids, i]
        if i >= count:
            return np.zeros(lanes.shape, dtype=arr.dtype)
        return arr[rows_ids, i]
    if index.size == 0:
        return np.zeros(index.shape, dtype=arr.dtype)
    if count and int(index.max()) < count:
        if (
            isinstance(lanes, GridLanes)
            and isinstance(lanes.rows, slice)
            and index.shape == (1, lanes.shape[1])
        ):
            cols = _progression(index[0])
            return arr[lanes.rows, cols if cols is not None else index[0]]
        return arr[rows_ids, index]
    ok = index < count
    if count == 0:
        return np.zeros(np.broadcast_shapes(rows_ids.shape, index.shape), dtype=arr.dtype)
    return np.where(ok, arr[rows_ids, np.where(ok, index, 0)], arr.dtype.type(0))


def store_workgroup(
    lanes: LaneSet,
    mask: npt.NDArray[np.bool_] | None,
    arr: npt.NDArray[Any],
    index: Any,
    value: Any,
) -> None:
    """Write ``value`` to each active lane's workgroup row of ``arr`` at ``index``."""
    count = arr.shape[1]
    value = _unshare(value, arr)
    if mask is None and type(index) is Affine:
        window = _lid_window(lanes, index, count)
        if window is not None:
            rows, off, b, lo, hi = window
            if lo < hi:
                src = value
                if isinstance(value, np.ndarray) and value.shape[-1] != 1:
                    src = value[:, lo:hi] if value.ndim == 2 else value
                arr[rows, off + b * lo : off + b * (hi - 1) + 1 : b] = src
            return
    index = lanes.value(index)
    if (
        mask is None
        and isinstance(index, np.ndarray)
        and isinstance(lanes, GridLanes)
        and isinstance(lanes.rows, slice)
        and index.shape == (1, lanes.shape[1])
        and count
        and int(index.max()) < count
    ):
        cols = _progression(index[0])
        if cols is not None:
            arr[lanes.rows, cols] = value
            return
    shape = lanes.shape
    rows_ids = np.broadcast_to(lanes.wg_ids(), shape)
    index_b = np.broadcast_to(index, shape)
    sel = index_b < count
    if mask is not None:
        sel &= mask
    if not sel.any():
        return
    data = np.broadcast_to(value, shape)[sel] if isinstance(value, np.ndarray) else value
    arr[rows_ids[sel], index_b[sel]] = data
