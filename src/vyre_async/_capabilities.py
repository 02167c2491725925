"""`BackendCapabilities`: the honest, frozen record of what a backend can do natively."""

from __future__ import annotations

from dataclasses import dataclass, fields

from vyre_async._exports import public_dir as _public_dir

__all__ = ["FEATURES", "BackendCapabilities"]
__dir__ = _public_dir(__name__)

#: Boolean feature names of the record, in declaration order.
FEATURES = (
    "subgroup_ops",
    "f16",
    "bf16",
    "tensor_cores",
    "async_compute",
    "indirect_dispatch",
    "grid_sync",
    "persistent_threads",
    "graph_replay",
    "distributed",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendCapabilities:
    """What a backend supports natively. ``True`` is a promise that the native path exists.

    The defaults are the conservative answer of a backend that reports nothing:
    every feature False, ``max_workgroup_size (1, 1, 1)``,
    ``max_storage_buffer_bytes 0`` ("not reported"), ``max_grid_size None`` (not
    reported), ``subgroup_size None``.
    """

    subgroup_ops: bool = False
    f16: bool = False
    bf16: bool = False
    tensor_cores: bool = False
    async_compute: bool = False
    indirect_dispatch: bool = False
    grid_sync: bool = False
    persistent_threads: bool = False
    graph_replay: bool = False
    distributed: bool = False
    max_workgroup_size: tuple[int, int, int] = (1, 1, 1)
    max_workgroup_lanes: int = 1
    max_storage_buffer_bytes: int = 0
    max_workgroup_memory_bytes: int = 0
    #: Storage buffers one launch may bind (0: not reported; the IR's own limit applies).
    #: The fusion policy keeps a fused launch within it.
    max_storage_buffers: int = 0
    #: Most workgroups per grid axis, checked by the driver before every new launch
    #: shape reaches the executor (None: not reported, no limit checked).
    max_grid_size: tuple[int, int, int] | None = None
    subgroup_size: int | None = None
    device_name: str = ""
    #: Dispatches sharing a resident buffer take effect in submission order without
    #: the caller awaiting in between (docs/backend-authors.md). Arm graphs join
    #: layers on the device only on backends that say so.
    ordered_resident_buffers: bool = False
    #: The device is a CPU (a software driver such as Mesa's lavapipe), not a GPU:
    #: ``acquire_preferred_backend`` never picks it; users ask for it by id.
    cpu_device: bool = False

    def __post_init__(self) -> None:
        for name in FEATURES:
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"capability {name!r} must be a bool")

    @property
    def features(self) -> frozenset[str]:
        """The names of the features reported True."""
        return frozenset(
            f.name for f in fields(self) if f.name in FEATURES and getattr(self, f.name)
        )

    def score(self) -> int:
        """Return a ranking score: more native features and larger limits score higher."""
        points = 16 if self.max_storage_buffer_bytes > 0 else 0
        points += 8 if self.max_workgroup_lanes >= 64 else 0
        points += 4 if self.max_workgroup_lanes >= 256 else 0
        points += 8 if self.subgroup_size else 0
        weights = {
            "subgroup_ops": 8,
            "f16": 2,
            "bf16": 2,
            "tensor_cores": 4,
            "indirect_dispatch": 2,
            "async_compute": 4,
            "graph_replay": 2,
        }
        points += sum(w for name, w in weights.items() if getattr(self, name))
        points += 4 if self.max_workgroup_memory_bytes > 0 else 0
        return points
