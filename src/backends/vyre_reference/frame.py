"""Frames: the lanes a body is running on, their variables, mask and returns.

A `Frame` runs a statement list on a `LaneSet`. ``mask`` (None = every lane of
the set) says which of those lanes are still active; expressions are evaluated
on every lane of the set and the mask is applied only at side effects
(assignments, stores, atomics). Divergent control makes child frames with
`branch`:

- a condition that is uniform, or true on every active lane, runs the body in
  the same frame;
- a condition that depends only on the workgroup or only on the local id cuts
  the lane set along that axis (a `GridLanes` child);
- a condition true on a contiguous run of lanes, or on few lanes, compacts
  them into a `FlatLanes` child;
- otherwise the body runs masked on the same lanes, sharing the variables.

`merge` brings a child's assignments to outer variables and its returned lanes
back to the parent. Lanes that executed `Return` leave the mask for good.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from vyre_async.abc import public_dir as _public_dir
from vyre_reference.lanes import GridLanes, LaneSet, as_selector

if TYPE_CHECKING:
    from vyre_reference.memory import LaunchState

__all__ = ["COMPACT_BELOW", "Env", "Frame", "StmtFn", "branch", "merge", "run_body"]
__dir__ = _public_dir(__name__)

#: Compact a divergent branch into its own lane list when fewer than this share of lanes runs it.
COMPACT_BELOW = 0.25

StmtFn = Callable[["Frame"], None]


class Env(dict[str, Any]):
    """Variables of a frame. A child lane set's env fetches (and cuts) parent values on demand.

    Attributes:
        assigned: Names given a new value with `Assign` through this env.
    """

    __slots__ = ("assigned", "lanes", "parent")

    def __init__(self, parent: Env | None = None, lanes: LaneSet | None = None) -> None:
        super().__init__()
        self.parent = parent
        self.lanes = lanes
        self.assigned: set[str] = set()

    def __missing__(self, name: str) -> Any:
        if self.parent is None or self.lanes is None:
            raise KeyError(name)
        value = self.lanes.restrict(self.parent[name])
        self[name] = value
        return value


class Frame:
    """One body running on a lane set.

    Attributes:
        lanes: The lanes this frame covers.
        mask: Active lanes among them (bool, broadcastable), or None for all.
        env: Variables.
        state: The launch (memory, geometry, cancellation).
        returned: Lanes of ``lanes`` that executed `Return` inside this frame, or None.
        dead: True once no lane of the frame is active.
    """

    __slots__ = ("dead", "env", "lanes", "mask", "returned", "state")

    def __init__(
        self,
        lanes: LaneSet,
        mask: npt.NDArray[np.bool_] | None,
        env: Env,
        state: LaunchState,
    ) -> None:
        self.lanes = lanes
        self.mask = mask
        self.env = env
        self.state = state
        self.returned: npt.NDArray[np.bool_] | None = None
        self.dead = False


def run_body(frame: Frame, body: tuple[StmtFn, ...]) -> None:
    """Run ``body`` statement by statement on every active lane of ``frame`` in lockstep.

    Raises:
        Cancelled: the launch's cancel event was set (checked before every statement).
    """
    check = frame.state.check_cancel
    for stmt in body:
        check()
        stmt(frame)
        if frame.dead:
            return


def branch(frame: Frame, cond: Any) -> Frame | None:
    """Return the frame running code on the active lanes of ``frame`` where ``cond`` holds.

    Args:
        frame: The current frame.
        cond: A numpy bool scalar or a bool array broadcastable to ``frame.lanes``.

    Returns:
        ``frame`` itself when every active lane takes the branch, None when none
        does, else a child frame (see the module docstring).
    """
    if not isinstance(cond, np.ndarray):
        return frame if cond else None
    lanes = frame.lanes
    mask = frame.mask
    if (
        isinstance(lanes, GridLanes)
        and cond.ndim == 2
        and (cond.shape[0] == 1 or cond.shape[1] == 1)
        and cond.shape != lanes.shape
    ):
        return _cut_axis(frame, lanes, cond)
    active = cond if mask is None else np.logical_and(cond, mask)
    if active.shape != lanes.shape:
        active = np.broadcast_to(active, lanes.shape)
    n_true = int(np.count_nonzero(active))
    if n_true == 0:
        return None
    if n_true == lanes.size:
        return frame
    if isinstance(lanes, GridLanes) and n_true < lanes.size // 2:
        cut = _cut_empty(frame, lanes, active)
        if cut is not None:
            return cut
    flat = active.reshape(-1)
    first = int(np.argmax(flat))
    last = flat.shape[0] - 1 - int(np.argmax(flat[::-1]))
    if last - first + 1 == n_true:
        child = lanes.child_flat(slice(first, last + 1))
    elif n_true < COMPACT_BELOW * lanes.size:
        child = lanes.child_flat(np.flatnonzero(flat))
    else:
        return Frame(lanes, np.ascontiguousarray(active), frame.env, frame.state)
    return Frame(child, None, Env(frame.env, child), frame.state)


def _cut_empty(frame: Frame, lanes: GridLanes, active: npt.NDArray[np.bool_]) -> Frame | None:
    """Return a branch frame without the workgroups and local lanes where ``active`` is all false.

    The child's mask is ``active`` cut to the smaller grid (None when it is all
    true). Returns None when no whole row or column is inactive.
    """
    cols = active.any(axis=0)
    rows = active.any(axis=1)
    keep_cols = bool(cols.all())
    keep_rows = bool(rows.all())
    if keep_cols and keep_rows:
        return None
    rows_rel = None if keep_rows else as_selector(np.flatnonzero(rows))
    cols_rel = None if keep_cols else as_selector(np.flatnonzero(cols))
    child = lanes.child_grid(rows_rel, cols_rel)
    mask = child.restrict(active)
    return Frame(child, None if mask.all() else mask, Env(frame.env, child), frame.state)


def _cut_axis(frame: Frame, lanes: GridLanes, cond: npt.NDArray[np.bool_]) -> Frame | None:
    axis = 1 if cond.shape[0] == 1 else 0
    vector = cond[0] if axis == 1 else cond[:, 0]
    n_true = int(np.count_nonzero(vector))
    if n_true == 0:
        return None
    if n_true == vector.shape[0]:
        return frame
    rel = as_selector(np.flatnonzero(vector))
    child = lanes.child_cols(rel) if axis == 1 else lanes.child_rows(rel)
    mask = frame.mask
    if mask is not None:
        mask = child.restrict(mask)
        assert mask is not None
        if not np.any(mask):
            return None
    return Frame(child, mask, Env(frame.env, child), frame.state)


def merge(parent: Frame, child: Frame, outer: Mapping[str, type[np.generic]]) -> None:
    """Bring ``child``'s effects on the parent's lanes back into ``parent``.

    Args:
        parent: The frame ``child`` was made from by `branch`.
        child: The finished child frame.
        outer: Variables the child's body may assign that live outside it, with
            their numpy dtypes.
    """
    if child is parent:
        return
    if child.lanes is not parent.lanes:
        env = child.env
        for name in env.assigned:
            dtype = outer.get(name)
            if dtype is None:
                continue
            full = parent.lanes.full(parent.env[name], dtype)
            child.lanes.scatter(full, child.lanes.value(env[name]))
            parent.env[name] = full
            parent.env.assigned.add(name)
    returned = child.returned
    if returned is None:
        return
    if child.lanes is not parent.lanes:
        full_ret = np.zeros(parent.lanes.shape, dtype=np.bool_)
        child.lanes.scatter(full_ret, returned)
        returned = full_ret
    parent.returned = returned if parent.returned is None else parent.returned | returned
    alive = np.logical_not(returned)
    if parent.mask is not None:
        alive &= parent.mask
    parent.mask = alive
    if not alive.any():
        parent.dead = True
