"""Shadow conformance: hold a backend to the reference, byte for byte.

`assert_conformance` runs a list of cases on both backends and raises a
`Divergence` at the first differing byte. `ShadowBackend` wraps a live backend
and re-runs a sample of its dispatches on the reference, recording divergences
without ever failing or delaying a request: it builds a `VyreBackend` over a
`ShadowExecutor`, whose ``enqueue`` hands each launch to both backends.
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
import random
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vyre_async._backend import VyreBackend
from vyre_async._capabilities import BackendCapabilities
from vyre_async._config import DispatchConfig
from vyre_async._executor import Executor, poll_until
from vyre_async._exports import public_dir as _public_dir
from vyre_async._frontend import Launch
from vyre_async._pending import PendingDispatch, defer_to_callbacks, settle_hook
from vyre_async.errors import InvalidArgument
from vyre_async.ir.ops import TRANSCENDENTAL, UnOp
from vyre_async.ir.program import Program
from vyre_async.ir.walk import ops_used

__all__ = [
    "ConformanceCase",
    "Divergence",
    "ShadowBackend",
    "ShadowExecutor",
    "ShadowStats",
    "assert_conformance",
    "compare_outputs",
]
__dir__ = _public_dir(__name__)

_log = logging.getLogger("vyre_async.shadow")
DEFAULT_ULP_BUDGET = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class ConformanceCase:
    """One program run with one set of inputs."""

    label: str
    program: Program
    inputs: Sequence[Any]
    config: DispatchConfig | None = None


class Divergence(AssertionError):
    """A backend's output differs from the reference's.

    Attributes:
        label: The case label.
        fingerprint: The program fingerprint (hex).
        inputs: The inputs both backends received.
        output_index: Which output differs.
        element: Index of the first differing element (``None`` for a size mismatch).
        backend_output: The backend's output array.
        reference_output: The reference's output array.
    """

    def __init__(
        self,
        *,
        label: str,
        fingerprint: str,
        inputs: Sequence[Any],
        output_index: int,
        element: int | None,
        backend_output: np.ndarray,
        reference_output: np.ndarray,
        detail: str,
    ) -> None:
        super().__init__(
            f"case {label!r} (program {fingerprint[:16]}): output {output_index} {detail}"
        )
        self.label = label
        self.fingerprint = fingerprint
        self.inputs = inputs
        self.output_index = output_index
        self.element = element
        self.backend_output = backend_output
        self.reference_output = reference_output

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_divergence, (self.__dict__.copy(), str(self)))


def _rebuild_divergence(state: dict[str, Any], message: str) -> Divergence:
    obj = Divergence.__new__(Divergence)
    AssertionError.__init__(obj, message)
    obj.__dict__.update(state)
    return obj


def _uses_transcendentals(program: Program) -> bool:
    return bool(ops_used(program) & {f"un.{UnOp(op).value}" for op in TRANSCENDENTAL})


def _ulp_key(words: np.ndarray) -> np.ndarray:
    """Map f32 bit patterns to integers whose distance is the ULP distance."""
    signed = words.view(np.int32).astype(np.int64)
    return np.where(signed < 0, -(signed & 0x7FFFFFFF), signed)


def compare_outputs(
    label: str,
    program: Program,
    inputs: Sequence[Any],
    got: Sequence[np.ndarray],
    want: Sequence[np.ndarray],
    *,
    ulp_budget: int | None = None,
) -> Divergence | None:
    """Return the first difference between ``got`` and ``want``, or None when they agree.

    Integer and BOOL outputs, and F32 outputs of programs without transcendental
    operations, must match bit for bit. F32 outputs of programs that use
    ``exp log sin cos tanh rsqrt`` may differ by ``ulp_budget`` ULP (default 2);
    NaN positions must match (payloads are not compared).
    """
    fingerprint = program.fingerprint().hex()
    budget = DEFAULT_ULP_BUDGET if ulp_budget is None else ulp_budget
    loose = _uses_transcendentals(program)
    outputs = program.outputs

    def diverge(index: int, element: int | None, detail: str) -> Divergence:
        return Divergence(
            label=label,
            fingerprint=fingerprint,
            inputs=inputs,
            output_index=index,
            element=element,
            backend_output=got[index] if index < len(got) else np.empty(0),
            reference_output=want[index] if index < len(want) else np.empty(0),
            detail=detail,
        )

    if len(got) != len(want):
        return diverge(0, None, f"count differs: {len(got)} outputs vs {len(want)}")
    for index, (a, b) in enumerate(zip(got, want, strict=True)):
        if a.size != b.size:
            return diverge(index, None, f"has {a.size} elements vs {b.size}")
        wa = np.ascontiguousarray(a).view(np.uint32).reshape(-1)
        wb = np.ascontiguousarray(b).view(np.uint32).reshape(-1)
        is_f32 = index < len(outputs) and outputs[index].dtype.value == "f32"
        if is_f32:
            nan_a = np.isnan(wa.view(np.float32))
            nan_b = np.isnan(wb.view(np.float32))
            bad = (nan_a != nan_b) | (~nan_a & ~nan_b & (wa != wb))
            if loose and bad.any():
                close = np.abs(_ulp_key(wa) - _ulp_key(wb)) <= budget
                bad &= ~(close & ~nan_a & ~nan_b)
        else:
            bad = wa != wb
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            return diverge(
                index,
                first,
                f"differs at element {first}: 0x{int(wa[first]):08x} vs 0x{int(wb[first]):08x} "
                f"({int(bad.sum())} elements differ)",
            )
    return None


def assert_conformance(
    backend: VyreBackend, reference: VyreBackend, cases: Sequence[ConformanceCase]
) -> None:
    """Run every case on both backends and raise at the first byte difference.

    Raises:
        Divergence: an output differs (transcendental F32 ops compared within
            ``ulp_budget``).
        InvalidArgument: ``cases`` holds no case (an empty list or iterator) or
            something that is not a `ConformanceCase`, or a backend argument is
            not a backend.
    """
    for name, value in (("backend", backend), ("reference", reference)):
        if not isinstance(value, VyreBackend):
            raise InvalidArgument(
                f"assert_conformance {name} must be a backend, got a {type(value).__name__}",
                fix=f'pass a backend, e.g. acquire_backend("reference") as {name}',
            )
    bad_case_fix = 'pass [ConformanceCase(label="xor", program=p, inputs=[a, b]), ...]'
    given: object = cases  # (typed loosely: callers pass anything)
    if isinstance(given, str | bytes) or not isinstance(given, Iterable):
        raise InvalidArgument(
            f"assert_conformance takes ConformanceCase items, got a {type(given).__name__}",
            fix=bad_case_fix,
        )
    cases = list(given)  # (an iterator is consumed once, here: its length counts)
    if not cases:
        raise InvalidArgument(
            "assert_conformance got no cases, so it would prove nothing",
            fix="pass at least one ConformanceCase",
        )
    for case in cases:
        if not isinstance(case, ConformanceCase):
            raise InvalidArgument(
                f"assert_conformance takes ConformanceCase items, got a {type(case).__name__}",
                fix=bad_case_fix,
            )
    for case in cases:
        got = backend.dispatch(case.program, case.inputs, case.config).result()
        want = reference.dispatch(case.program, case.inputs, case.config).result()
        budget = None if case.config is None else case.config.ulp_budget
        divergence = compare_outputs(
            case.label, case.program, case.inputs, got, want, ulp_budget=budget
        )
        if divergence is not None:
            raise divergence


@dataclass(slots=True)
class ShadowStats:
    """Counters of a `ShadowBackend`."""

    dispatches: int = 0
    sampled: int = 0
    compared: int = 0
    divergences: int = 0
    reference_errors: int = 0
    recent: deque[Divergence] = field(default_factory=lambda: deque(maxlen=32))


class _Pair:
    """One sampled dispatch: each side's outputs (None: it failed) and how many are still out."""

    __slots__ = ("left", "primary", "reference")

    def __init__(self) -> None:
        self.left = 2
        self.primary: list[np.ndarray] | None = None
        self.reference: list[np.ndarray] | None = None


def ShadowBackend(
    primary: VyreBackend,
    reference: VyreBackend,
    *,
    sample_rate: float = 0.01,
    on_divergence: Any = None,
    seed: int | None = None,
) -> VyreBackend:
    """Serve from ``primary``; re-run a sample of dispatches on ``reference`` and compare.

    Returns ``VyreBackend(ShadowExecutor(primary, reference, ...), prefetch=False)``:
    a backend like any other (``dispatch``, ``flush``, ``aclose``); its
    counters are ``backend.executor.stats``. Requests are never failed or
    delayed by the shadow: the caller gets the primary's result as soon as it
    is ready; the comparison happens when both are done. Divergences are
    logged on the ``vyre_async.shadow`` logger, counted in `ShadowStats`, and passed to
    ``on_divergence``.

    Args:
        primary: The backend that serves requests.
        reference: The oracle (usually the reference backend).
        sample_rate: Fraction of dispatches compared, 0.0 to 1.0.
        on_divergence: Called with each `Divergence` (from a worker thread).
        seed: Seed of the sampling generator, for reproducible tests.

    Raises:
        InvalidArgument: ``sample_rate`` is not a number in 0..1, a backend
            argument is not a backend, or ``on_divergence`` is not callable.
    """
    executor = ShadowExecutor(
        primary, reference, sample_rate=sample_rate, on_divergence=on_divergence, seed=seed
    )
    return VyreBackend(executor, prefetch=False)


class ShadowExecutor(Executor):
    """The executor of `ShadowBackend`: each launch runs on ``primary``, a sample also on
    ``reference``; see `ShadowBackend` for the arguments.

    Closing the shadow backend leaves the primary and the reference open: it
    does not own them.

    Attributes:
        stats: Dispatches seen, sampled, compared, divergences, reference failures.
    """

    id = "shadow"

    def __init__(
        self,
        primary: VyreBackend,
        reference: VyreBackend,
        *,
        sample_rate: float = 0.01,
        on_divergence: Any = None,
        seed: int | None = None,
    ) -> None:
        given: object = sample_rate
        if (
            isinstance(given, bool)
            or not isinstance(given, numbers.Real)
            or not 0.0 <= float(given) <= 1.0  # (False for NaN)
        ):
            raise InvalidArgument(
                f"sample_rate must be a number within 0..1, got {sample_rate!r}",
                fix="pass e.g. sample_rate=0.01 (1 % of dispatches compared)",
            )
        sample_rate = float(given)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | np.integer)):
            raise InvalidArgument(
                f"seed must be an int or None, got {seed!r}",
                fix="pass e.g. seed=7, or leave it out",
            )
        for name, value in (("primary", primary), ("reference", reference)):
            if not isinstance(value, VyreBackend):
                raise InvalidArgument(
                    f"ShadowBackend {name} must be a backend, got a {type(value).__name__}",
                    fix=f'pass a backend, e.g. acquire_backend("reference") as {name}',
                )
        if on_divergence is not None and not callable(on_divergence):
            raise InvalidArgument(
                f"on_divergence must be callable or None, got {on_divergence!r}",
                fix="pass a function taking a Divergence",
            )
        self.primary = primary
        self.reference = reference
        self.sample_rate = sample_rate
        self.on_divergence = on_divergence
        self.stats = ShadowStats()
        self._random = random.Random(None if seed is None else int(seed))
        self._lock = threading.Lock()
        #: Sampled dispatches whose comparison has not finished (`flush` waits for them).
        self._comparing: set[_Pair] = set()
        self.version = primary.version

    def capabilities(self) -> BackendCapabilities:
        """Return the primary's capabilities (without resident-buffer ordering: it has none)."""
        return dataclasses.replace(self.primary.capabilities(), ordered_resident_buffers=False)

    def supported_ops(self) -> frozenset[str]:
        """Return the primary's operations."""
        return self.primary.supported_ops()

    def enqueue(self, launch: Launch) -> None:
        """Dispatch on the primary; compare a sample against the reference in the background.

        The launch settles with the primary's outcome as soon as it is known.

        Raises:
            BackendError: whatever the primary's ``dispatch`` raises.
        """
        plan = launch.plan
        pending = self._dispatch(plan.program, list(launch.inputs), launch.config)
        completer = launch.completer

        def settle(p: PendingDispatch) -> None:
            try:
                outputs = p.result()
            except BaseException as exc:
                completer.fail(exc)
                return
            completer.resolve(outputs, device_s=p.timing.device_s if p.timing else None)

        settle_hook(pending, settle)

    def _dispatch(
        self, program: Program, inputs: list[Any], config: DispatchConfig
    ) -> PendingDispatch:
        """Dispatch on the primary and return its pending; sample it against the reference."""
        with self._lock:
            self.stats.dispatches += 1
            sampled = self._random.random() < self.sample_rate
            if sampled:
                self.stats.sampled += 1
        if not sampled:
            return self.primary.dispatch(program, inputs, config)
        primary = self.primary.dispatch(program, inputs, config)  # checks the arguments
        kept = inputs  # (private copies the driver made: nothing else writes them)
        try:
            shadow = self.reference.dispatch(program, kept, config)
        except Exception as exc:  # the shadow must never fail the request
            self._reference_failed(exc)
            return primary
        outer, completer = PendingDispatch.create(timeout=config.timeout, label=config.label)
        pair = _Pair()
        with self._lock:
            self._comparing.add(pair)  # (until compared, or one side failed: `flush` waits)

        def side_done(side: str, outputs: list[np.ndarray] | None) -> None:
            with self._lock:
                setattr(pair, side, outputs)
                pair.left -= 1
                last = pair.left == 0
            if not last:
                return
            if pair.primary is None or pair.reference is None:
                self._forget(pair)  # one side failed: nothing to compare
            else:  # (on the callback thread: never holds up the caller)
                defer_to_callbacks(outer, lambda _: self._compare(pair, program, kept, config))

        def on_primary(p: PendingDispatch) -> None:
            try:
                outputs = p.result()
            except BaseException as exc:
                completer.fail(exc)
                side_done("primary", None)
                return
            copies = [o.copy() for o in outputs]
            completer.resolve(outputs, device_s=p.timing.device_s if p.timing else None)
            side_done("primary", copies)

        def on_reference(p: PendingDispatch) -> None:
            try:
                outputs = p.result()
            except BaseException as exc:
                self._reference_failed(exc)
                side_done("reference", None)
                return
            side_done("reference", outputs)

        # Inline, before the waiters wake (short, never blocking): the caller's result
        # is handed on at once, whatever user callbacks are doing.
        settle_hook(primary, on_primary)
        settle_hook(shadow, on_reference)
        return outer

    def _compare(
        self, pair: _Pair, program: Program, inputs: list[Any], config: DispatchConfig
    ) -> None:
        """Compare one sampled dispatch's outputs; record and report a divergence."""
        try:
            assert pair.primary is not None and pair.reference is not None
            budget = config.ulp_budget
            label = config.label or program.op_id or "dispatch"
            divergence = compare_outputs(
                label, program, inputs, pair.primary, pair.reference, ulp_budget=budget
            )
            with self._lock:
                self.stats.compared += 1
                if divergence is not None:
                    self.stats.divergences += 1
                    self.stats.recent.append(divergence)
            if divergence is not None:
                _log.warning("shadow divergence on %s: %s", self.primary.id, divergence)
                if self.on_divergence is not None:
                    self.on_divergence(divergence)
        finally:
            self._forget(pair)

    def _forget(self, pair: _Pair) -> None:
        with self._lock:
            self._comparing.discard(pair)

    async def flush(self) -> None:
        """Wait until the work and the comparisons of every dispatch made so far finished.

        A sampled dispatch's result reaches its caller as soon as the primary's is
        ready; its comparison runs later, on the callback thread (behind any user
        callback queued before it). After this, ``stats`` counts every dispatch
        sampled before the call; those made meanwhile are not waited for.
        """
        with self._lock:
            waiting = set(self._comparing)
        await self.primary.flush()
        await self.reference.flush()
        await poll_until(lambda: waiting.isdisjoint(self._comparing))

    def _reference_failed(self, exc: BaseException) -> None:
        with self._lock:
            self.stats.reference_errors += 1
        _log.warning("shadow reference dispatch failed: %s", exc)
