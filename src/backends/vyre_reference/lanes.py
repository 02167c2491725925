"""Lane sets: which lanes of the grid a piece of code is running on, as array shapes.

A launch has ``NG`` workgroups of ``NL`` lanes; lane ``W·NL + L`` is local lane
``L`` of workgroup ``W`` (linear ids, x fastest), which is also the engine's
*lane order*. Code runs on a `LaneSet`:

- `GridLanes` — a product ``rows x cols`` of workgroups and local lanes (each a
  slice or an index array). Values on it have shape ``(ng, nl)`` or a
  broadcastable shape: ``(ng, 1)`` for per-workgroup values, ``(1, nl)`` for
  per-local-lane values, and a numpy scalar for uniform values. numpy
  broadcasting then keeps per-workgroup and per-local work small.
- `FlatLanes` — an explicit, increasing list (or contiguous range) of linear
  lane ids; values have shape ``(k,)`` or are scalars. Sparse branches compact
  to it.

A child lane set remembers how it was cut from its parent, so values move down
(`restrict`) and assignments move back up (`scatter`). Row-major order of every
lane set is increasing lane order, which fixes the order of colliding stores
and of atomics within a statement.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from vyre_async.abc import public_dir as _public_dir
from vyre_reference.affine import Affine

__all__ = ["FlatLanes", "GridLanes", "LaneSet", "Selector", "as_selector", "selector_len"]
__dir__ = _public_dir(__name__)

#: A subset of one axis: a step-1 slice or an increasing int64 index array.
Selector = slice | npt.NDArray[np.int64]
IntArray = npt.NDArray[np.int64]

_MOD = 1 << 32


def selector_len(sel: Selector) -> int:
    """Return how many indices ``sel`` selects."""
    if isinstance(sel, slice):
        return int(sel.stop) - int(sel.start)
    return int(sel.shape[0])


def as_selector(indices: IntArray) -> Selector:
    """Return increasing ``indices`` as a slice when they are contiguous, else as they are."""
    n = indices.shape[0]
    if n and int(indices[-1]) - int(indices[0]) == n - 1:
        return slice(int(indices[0]), int(indices[-1]) + 1)
    return indices


def _sel_array(sel: Selector) -> IntArray:
    if isinstance(sel, slice):
        return np.arange(sel.start, sel.stop, dtype=np.int64)
    return sel


def _compose(outer: Selector, inner: Selector) -> Selector:
    """Return the absolute selector of ``inner`` (relative to ``outer``)."""
    if isinstance(outer, slice) and isinstance(inner, slice):
        return slice(outer.start + inner.start, outer.start + inner.stop)
    if isinstance(outer, slice):
        return as_selector(inner + outer.start)
    return as_selector(outer[inner])


class LaneSet:
    """Common interface of the lane sets (see the module docstring).

    Attributes:
        grid: Workgroups per axis of the launch.
        workgroup: Lanes per axis of a workgroup.
        shape: Shape of a full per-lane array on this set.
        size: Number of lanes.
        parent: The lane set this one was cut from (None for the launch's root).
    """

    __slots__ = ("_cache", "grid", "parent", "shape", "size", "workgroup")

    def __init__(
        self,
        grid: tuple[int, int, int],
        workgroup: tuple[int, int, int],
        shape: tuple[int, ...],
        parent: LaneSet | None,
    ) -> None:
        self.grid = grid
        self.workgroup = workgroup
        self.shape = shape
        self.size = math.prod(shape)
        self.parent = parent
        self._cache: dict[Any, Any] = {}

    # -- ids ------------------------------------------------------------------------
    def wg_ids(self) -> IntArray:
        """Return the linear workgroup id of every lane (broadcastable int64 array)."""
        raise NotImplementedError

    def lid_ids(self) -> IntArray:
        """Return the linear local id of every lane (broadcastable int64 array)."""
        raise NotImplementedError

    def coord(self, kind: str, axis: int) -> IntArray:
        """Return ``wgid(axis)`` (kind ``"w"``) or ``lid(axis)`` (kind ``"l"``) as int64."""
        key = (kind, axis)
        hit = self._cache.get(key)
        if hit is None:
            linear = self.wg_ids() if kind == "w" else self.lid_ids()
            ext = self.grid if kind == "w" else self.workgroup
            if ext[axis] == math.prod(ext):
                hit = linear
            elif axis == 0:
                hit = linear % ext[0]
            elif axis == 1:
                hit = (linear // ext[0]) % ext[1]
            else:
                hit = linear // (ext[0] * ext[1])
            self._cache[key] = hit
        return hit

    def coord_range(self, kind: str, axis: int) -> tuple[int, int]:
        """Return the (min, max) of a coordinate over this lane set."""
        key = ("range", kind, axis)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._slice_range(kind, axis)
            if hit is None:
                values = self.coord(kind, axis)
                hit = (int(values.min()), int(values.max())) if values.size else (0, 0)
            self._cache[key] = hit
        return hit

    def _slice_range(self, kind: str, axis: int) -> tuple[int, int] | None:
        """Return a coordinate's range without materialising it, when the ids form a slice."""
        return None

    # -- affine values --------------------------------------------------------------
    def bounds(self, value: Affine) -> tuple[int, int]:
        """Return exact-integer (low, high) bounds of ``value`` before wrapping (conservative)."""
        lo = hi = value.c
        for kind, coefs in (("w", value.wg), ("l", value.lid)):
            for axis in range(3):
                k = coefs[axis]
                if k:
                    cmin, cmax = self.coord_range(kind, axis)
                    lo += min(k * cmin, k * cmax)
                    hi += max(k * cmin, k * cmax)
        return lo, hi

    def materialize(self, value: Affine) -> Any:
        """Return ``value`` as a uint32 scalar or a broadcastable uint32 array on this set."""
        if value.is_uniform:
            return np.uint32(value.c % _MOD)
        hit = self._cache.get(value)
        if hit is not None:
            return hit
        lo, hi = self.bounds(value)
        exact = lo >= 0 and hi < _MOD  # no lane wraps: compute in uint32 directly
        result = self._arange(value) if exact else None
        if result is None:
            work = np.uint32 if exact else np.int64
            total: Any = None
            for kind, coefs in (("w", value.wg), ("l", value.lid)):
                part: Any = None
                for axis in range(3):
                    k = coefs[axis]
                    if k:
                        term = self.coord(kind, axis) * k
                        part = term if part is None else part + term
                if part is not None:
                    part = part.astype(work) if exact else part
                    total = part if total is None else total + part
            assert total is not None
            if value.c:
                total = total + work(value.c % _MOD if exact else value.c)
            result = total if exact else (total & (_MOD - 1)).astype(np.uint32)
        # Cached, so shared by every later use of ``value`` on these lanes: read-only, so
        # that no in-place write or store take-over can change it (they check writeable).
        result.flags.writeable = False
        self._cache[value] = result
        return result

    def _arange(self, value: Affine) -> Any:
        """Return ``value`` from one ``arange`` when it steps evenly through the lanes, or None."""
        return None

    def value(self, value: Any) -> Any:
        """Return ``value`` with an `Affine` materialized (other values unchanged)."""
        if type(value) is Affine:
            return self.materialize(value)
        return value

    def full(self, value: Any, dtype: type[np.generic]) -> npt.NDArray[Any]:
        """Return a new, owned, full-shape array holding ``value`` on every lane."""
        out = np.empty(self.shape, dtype=dtype)
        out[...] = self.value(value)
        return out

    # -- moving values between a parent and this set ----------------------------------
    def restrict(self, value: Any) -> Any:
        """Return a parent-set value as a value on this set."""
        raise NotImplementedError

    def scatter(self, parent_full: npt.NDArray[Any], value: Any) -> None:
        """Write this set's ``value`` into the parent-shaped ``parent_full`` array in place."""
        raise NotImplementedError

    # -- cutting children -------------------------------------------------------------
    def child_rows(self, rel: Selector) -> LaneSet:
        """Return the subset keeping workgroups ``rel`` (grid sets only)."""
        raise NotImplementedError

    def child_cols(self, rel: Selector) -> LaneSet:
        """Return the subset keeping local lanes ``rel`` (grid sets only)."""
        raise NotImplementedError

    def child_flat(self, rel: Selector) -> FlatLanes:
        """Return the subset keeping the lanes at row-major positions ``rel``."""
        return FlatLanes(self, rel)


class GridLanes(LaneSet):
    """The product of selected workgroups (``rows``) and selected local lanes (``cols``)."""

    __slots__ = ("_cols_rel", "_rows_rel", "cols", "rows")

    def __init__(
        self,
        grid: tuple[int, int, int],
        workgroup: tuple[int, int, int],
        rows: Selector,
        cols: Selector,
        parent: GridLanes | None = None,
        rows_rel: Selector | None = None,
        cols_rel: Selector | None = None,
    ) -> None:
        super().__init__(grid, workgroup, (selector_len(rows), selector_len(cols)), parent)
        self.rows = rows
        self.cols = cols
        self._rows_rel = rows_rel
        self._cols_rel = cols_rel

    @staticmethod
    def root(grid: tuple[int, int, int], workgroup: tuple[int, int, int]) -> GridLanes:
        """Return the set of every lane of a launch."""
        ng = grid[0] * grid[1] * grid[2]
        nl = workgroup[0] * workgroup[1] * workgroup[2]
        return GridLanes(grid, workgroup, slice(0, ng), slice(0, nl))

    def _slice_range(self, kind: str, axis: int) -> tuple[int, int] | None:
        selector = self.rows if kind == "w" else self.cols
        ext = self.grid if kind == "w" else self.workgroup
        if not isinstance(selector, slice) or selector.step not in (None, 1):
            return None
        start, stop = selector.start or 0, selector.stop
        if stop is None or stop <= start:
            return None
        total = math.prod(ext)
        if ext[axis] == total:  # the coordinate is the linear id itself
            return (start, stop - 1)
        if start == 0 and stop == total:  # every id: the full extent of the axis
            return (0, ext[axis] - 1)
        return None

    def wg_ids(self) -> IntArray:
        hit = self._cache.get("W")
        if hit is None:
            hit = _sel_array(self.rows)[:, None]
            self._cache["W"] = hit
        return hit

    def lid_ids(self) -> IntArray:
        hit = self._cache.get("L")
        if hit is None:
            hit = _sel_array(self.cols)[None, :]
            self._cache["L"] = hit
        return hit

    def _arange(self, value: Affine) -> Any:
        nl_total = self.workgroup[0] * self.workgroup[1] * self.workgroup[2]
        lin = value.linear(self.grid, self.workgroup)
        if (
            lin is None
            or not isinstance(self.rows, slice)
            or not isinstance(self.cols, slice)
            or self.cols != slice(0, nl_total)
            or lin[1] != lin[2] * nl_total
            or lin[2] <= 0
            or self.shape[0] == 1
        ):
            return None
        c, _, b = lin
        start = c + b * self.rows.start * nl_total
        flat = np.arange(start, start + b * self.size, b, dtype=np.uint32)
        return flat.reshape(self.shape)

    def restrict(self, value: Any) -> Any:
        if not isinstance(value, np.ndarray):
            return value
        if self._rows_rel is not None and value.shape[0] != 1:
            value = value[self._rows_rel]
        if self._cols_rel is not None and value.shape[1] != 1:
            value = value[:, self._cols_rel]
        return value

    def scatter(self, parent_full: npt.NDArray[Any], value: Any) -> None:
        rows = slice(None) if self._rows_rel is None else self._rows_rel
        cols = slice(None) if self._cols_rel is None else self._cols_rel
        if isinstance(rows, np.ndarray) and isinstance(cols, np.ndarray):
            parent_full[np.ix_(rows, cols)] = value
        else:
            parent_full[rows, cols] = value

    def child_grid(self, rows_rel: Selector | None, cols_rel: Selector | None) -> GridLanes:
        """Return the subset keeping workgroups ``rows_rel`` and local lanes ``cols_rel``.

        Either selector may be None (keep that axis whole); both are relative to this set.
        """
        rows = self.rows if rows_rel is None else _compose(self.rows, rows_rel)
        cols = self.cols if cols_rel is None else _compose(self.cols, cols_rel)
        return GridLanes(self.grid, self.workgroup, rows, cols, self, rows_rel, cols_rel)

    def child_rows(self, rel: Selector) -> LaneSet:
        return self.child_grid(rel, None)

    def child_cols(self, rel: Selector) -> LaneSet:
        return self.child_grid(None, rel)


class FlatLanes(LaneSet):
    """An increasing list of lanes cut from a parent set at row-major positions ``rel``.

    Attributes:
        lanes: Absolute linear lane ids (a slice when contiguous).
    """

    __slots__ = ("_rel", "lanes")

    def __init__(self, parent: LaneSet, rel: Selector) -> None:
        super().__init__(parent.grid, parent.workgroup, (selector_len(rel),), parent)
        self._rel = rel
        nl_total = parent.workgroup[0] * parent.workgroup[1] * parent.workgroup[2]
        if isinstance(parent, FlatLanes):
            self.lanes: Selector = _compose(parent.lanes, rel)
        else:
            assert isinstance(parent, GridLanes)
            if (
                isinstance(rel, slice)
                and isinstance(parent.rows, slice)
                and isinstance(parent.cols, slice)
                and parent.cols == slice(0, nl_total)
            ):
                base = parent.rows.start * nl_total
                self.lanes = slice(base + rel.start, base + rel.stop)
            else:
                r, c = self._rc()
                self.lanes = as_selector(
                    _sel_array(parent.rows)[r] * nl_total + _sel_array(parent.cols)[c]
                )

    def _rc(self) -> tuple[IntArray, IntArray]:
        """Return the parent-relative (row, col) of every lane (grid parents only)."""
        hit = self._cache.get("rc")
        if hit is None:
            nl = self.parent.shape[1]  # type: ignore[union-attr]
            pos = _sel_array(self._rel)
            hit = (pos // nl, pos % nl)
            self._cache["rc"] = hit
        return hit

    def _linear(self) -> IntArray:
        hit = self._cache.get("lanes")
        if hit is None:
            hit = _sel_array(self.lanes)
            self._cache["lanes"] = hit
        return hit

    def wg_ids(self) -> IntArray:
        hit = self._cache.get("W")
        if hit is None:
            nl_total = self.workgroup[0] * self.workgroup[1] * self.workgroup[2]
            hit = self._linear() // nl_total
            self._cache["W"] = hit
        return hit

    def lid_ids(self) -> IntArray:
        hit = self._cache.get("L")
        if hit is None:
            nl_total = self.workgroup[0] * self.workgroup[1] * self.workgroup[2]
            hit = self._linear() % nl_total
            self._cache["L"] = hit
        return hit

    def restrict(self, value: Any) -> Any:
        if not isinstance(value, np.ndarray):
            return value
        parent = self.parent
        assert parent is not None
        if isinstance(parent, FlatLanes):
            return value[self._rel]
        if value.shape == parent.shape and value.flags.c_contiguous:
            return value.reshape(-1)[self._rel]
        r, c = self._rc()
        return value[r if value.shape[0] != 1 else 0, c if value.shape[1] != 1 else 0]

    def scatter(self, parent_full: npt.NDArray[Any], value: Any) -> None:
        if isinstance(self.parent, FlatLanes):
            parent_full[self._rel] = value
        else:
            parent_full.reshape(-1)[self._rel] = value
