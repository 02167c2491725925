"""Compiled pipelines and the launch record backends receive.

A `CompiledPipeline` is a program compiled once for one backend under one
policy (``ulp_budget``, ``workgroup_override``); it dispatches many times with
inputs of any size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vyre_async._cache.identity import PipelineIdentity
from vyre_async._config import DispatchConfig
from vyre_async._exports import public_dir as _public_dir
from vyre_async._frontend import DispatchFrontEnd, InputLike, Launch
from vyre_async._pending import PendingDispatch
from vyre_async._seams import BackendLike
from vyre_async.errors import InvalidArgument, InvalidProgram
from vyre_async.ir.program import Program

if TYPE_CHECKING:
    from vyre_async.policies.launch import ModeKind

__all__ = ["CompiledPipeline", "InputLike", "Launch", "compile"]
__dir__ = _public_dir(__name__)


class CompiledPipeline:
    """A program compiled for one backend; dispatch it as often as needed.

    Created by `compile` / ``backend.compile``; never constructed by users.

    Attributes:
        backend: The backend that compiled it.
        program: The program.
        config: The config it was compiled under (its policy fields apply).
        identity: The cache identity.
        native: The backend's compiled artifact (``None`` for pass-through).
        compile_s: Seconds spent building it (0.0 when loaded from a cache).
        source: ``"compiled"``, ``"disk"`` (loaded from the disk cache).
    """

    __slots__ = (
        "backend",
        "compile_s",
        "config",
        "front",
        "identity",
        "native",
        "program",
        "source",
    )

    def __init__(
        self,
        *,
        backend: BackendLike,
        front: DispatchFrontEnd,
        program: Program,
        config: DispatchConfig,
        identity: PipelineIdentity,
        native: Any,
        compile_s: float,
        source: str,
    ) -> None:
        self.backend = backend
        self.front = front
        self.program = program
        self.config = config
        self.identity = identity
        self.native = native
        self.compile_s = compile_s
        self.source = source

    def rebind(self, program: Program, config: DispatchConfig) -> CompiledPipeline:
        """Return this compiled kernel as the pipeline of ``program`` under ``config``.

        For a program of the same kernel digest (it differs in buffer counts at
        most) and a config of the same policy; the native artifact is shared.
        """
        return CompiledPipeline(
            backend=self.backend,
            front=self.front,
            program=program,
            config=config,
            identity=self.identity,
            native=self.native,
            compile_s=self.compile_s,
            source=self.source,
        )

    def dispatch(
        self, inputs: Sequence[InputLike], config: DispatchConfig | None = None
    ) -> PendingDispatch:
        """Launch the pipeline on ``inputs`` and return the pending result at once.

        Raises:
            InvalidProgram: wrong inputs, or ``config`` needs different code
                (another ``ulp_budget`` or ``workgroup_override``).
            UnsupportedFeature: the config asks for something the backend lacks.
        """
        return self.front.dispatch_pipeline(self, inputs, config)

    def dispatch_batch(
        self,
        batch: Sequence[Sequence[InputLike]],
        config: DispatchConfig | None = None,
        *,
        mode: ModeKind | None = None,
        fusion: str = "auto",
    ) -> list[PendingDispatch]:
        """Launch the pipeline once per input set; return the pending results in order.

        Every input set is checked and planned before anything starts, so a bad
        one raises with nothing launched. The primary execution mode for the
        batch (plain launches, graph replay or a persistent kernel) is chosen by
        the execution-mode policy (``docs/policies.md``) from the backend's
        capabilities and cached calibration, with ``B = R = len(batch)``, and the
        executor runs the batch that way where it can (`Executor.enqueue_batch`).
        Every dispatch span records the verdict (``vyre.policy.execution_mode``,
        ``...reason``) and what ran (``vyre.batch.mode``, ``vyre.batch.mode.reason``
        when the backend could not follow the verdict).

        Args:
            batch: One sequence of inputs per dispatch.
            config: The dispatch config of every dispatch (default: the pipeline's).
            mode: Run the batch in this mode instead of the policy's choice
                (``"plain"``, ``"persistent"`` or ``"command_reuse"``; the verdict's
                reason is then ``"requested"``): for benchmarks and calibration.
            fusion: ``"auto"``: the fusion policy (``docs/policies.md``) decides from
                the backend's calibration whether the items run as one fused launch
                (each workgroup range runs one item; each item's outputs are byte for
                byte those of its own launch); ``"force"``: fused whenever that is
                legal; ``"disable"``: one launch per item. Every span records the
                verdict (``vyre.policy.fusion``, ``...reason``).

        Raises:
            InvalidProgram: ``batch`` is not a list, an input set does not fit the
                program (nothing is launched), or ``mode`` is not one of the three.
            UnsupportedFeature: the config asks for something the backend lacks, or
                ``mode`` names a path the backend does not have.
            InvalidArgument: ``fusion`` is not ``"auto"``, ``"force"`` or ``"disable"``.
            BackendClosed: the backend was closed.
        """
        if not isinstance(batch, list | tuple):
            raise InvalidProgram(
                f"dispatch_batch takes a list of input lists, got a {type(batch).__name__}",
                fix="pass [[a1, b1], [a2, b2], ...]: one list of inputs per dispatch",
            )
        items = list(batch)
        # (imported with the first batch: the policies stay out of `import vyre_async`)
        from vyre_async._execution import choose_execution_mode, requested_mode

        cfg = config or self.config
        decision = choose_execution_mode(
            self.backend, batch_size=len(items), repeats=len(items), config=cfg
        )
        if mode is not None:
            decision = requested_mode(self.backend, decision, mode, cfg)
        request = None
        if len(items) > 1:
            from vyre_async._fusion import fusion_request

            request = fusion_request(fusion, self.backend)
        return self.front.dispatch_batch(self, items, config, decision, request)

    def __repr__(self) -> str:
        return (
            f"<CompiledPipeline {self.program.op_id or 'program'} on {self.backend.id} "
            f"{self.identity.hex[:12]} ({self.source})>"
        )


def compile(
    backend: BackendLike, program: Program, config: DispatchConfig | None = None
) -> CompiledPipeline:
    """Return ``program`` compiled for ``backend`` (memory cache → disk cache → compile).

    Raises:
        InvalidProgram: the program does not validate.
        InvalidArgument: ``backend`` is not a backend, or ``config`` is not a
            `DispatchConfig`.
        KernelCompileFailed: the backend's compiler rejected it.
    """
    compile_on = getattr(backend, "compile", None)
    if not callable(compile_on):
        raise InvalidArgument(
            f"compile(backend, program) needs a backend first, got a {type(backend).__name__}",
            fix='pass a backend, e.g. compile(acquire_backend("reference"), program)',
        )
    pipeline: CompiledPipeline = compile_on(program, config)
    return pipeline
