"""The backend and the compiled pipeline as the modules below `VyreBackend` name them.

`VyreBackend` (``vyre_async._backend``) sits on top of the dispatch front end
(``vyre_async._frontend``), the pipeline store (``vyre_async._store``), the
prefetcher and the policies. Those reach the executor through its hooks
(`vyre_async.abc.Executor`); a few — a compiled pipeline's ``backend``, the
calibration probes, the batch policy — hold the user-facing backend itself. So
that imports run one way (top to bottom, with no cycle even for type checking)
they name it and the pipeline by these structural types; `VyreBackend` and
`CompiledPipeline` satisfy them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from vyre_async._exports import public_dir as _public_dir

if TYPE_CHECKING:
    import numpy as np

    from vyre_async._cache.identity import PipelineIdentity
    from vyre_async._capabilities import BackendCapabilities
    from vyre_async._config import DispatchConfig
    from vyre_async._pending import PendingDispatch
    from vyre_async._resident import ResidentBuffer
    from vyre_async.ir.program import Program
    from vyre_async.ir.types import DType

__all__ = ["BackendLike", "DeviceIdentity", "PipelineLike"]
__dir__ = _public_dir(__name__)


class PipelineLike(Protocol):
    """A compiled pipeline (`vyre_async._pipeline.CompiledPipeline`)."""

    @property
    def backend(self) -> BackendLike: ...
    @property
    def program(self) -> Program: ...
    @property
    def config(self) -> DispatchConfig: ...
    @property
    def identity(self) -> PipelineIdentity: ...
    @property
    def native(self) -> Any: ...

    def dispatch_batch(
        self,
        batch: Sequence[Sequence[Any]],
        config: DispatchConfig | None = None,
        *,
        mode: Any = None,
        fusion: str = "auto",
    ) -> list[PendingDispatch]: ...


class DeviceIdentity(Protocol):
    """What names a device's records: a backend's or an executor's id, version, fingerprint."""

    @property
    def id(self) -> str: ...
    @property
    def version(self) -> str: ...

    def device_fingerprint(self) -> str: ...


class BackendLike(Protocol):
    """The members of a backend (`vyre_async._backend.VyreBackend`) the modules below it use."""

    @property
    def id(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def closed(self) -> bool: ...

    def check_open(self) -> None: ...
    def supported_ops(self) -> frozenset[str]: ...
    def capabilities(self) -> BackendCapabilities: ...
    def device_fingerprint(self) -> str: ...
    def compiler_fingerprint(self) -> str: ...
    def compile_options(self, config: DispatchConfig) -> Mapping[str, object]: ...
    def calibrate(self) -> Any: ...
    def compile(self, program: Program, config: DispatchConfig | None = None) -> Any: ...
    def dispatch(
        self, program: Program, inputs: Sequence[Any], config: DispatchConfig | None = None
    ) -> PendingDispatch: ...
    def upload(self, data: np.ndarray | bytes, *, label: str | None = None) -> ResidentBuffer: ...
    def alloc(
        self, dtype: DType | str, count: int, *, label: str | None = None
    ) -> ResidentBuffer: ...
    def download(self, buffer: ResidentBuffer) -> np.ndarray: ...
    def free(self, buffer: ResidentBuffer) -> None: ...
