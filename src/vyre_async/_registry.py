"""Backend registry over the ``vyre_async.backends`` entry-point group.

Registration is side-effect free: listing backends loads only each package's
small registration record. No GPU library is imported, no device opened.
"""

from __future__ import annotations

import importlib
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vyre_async._arguments import real_number
from vyre_async._exports import public_dir as _public_dir
from vyre_async.errors import BackendError, BackendNotFound, InvalidArgument, UnsupportedFeature

if TYPE_CHECKING:
    import logging

    from vyre_async._backend import VyreBackend

__all__ = [
    "ENTRY_POINT_GROUP",
    "BackendProbe",
    "BackendRegistration",
    "acquire_backend",
    "acquire_preferred_backend",
    "probe_backend",
    "register_backend",
    "registered_backends",
]
__dir__ = _public_dir(__name__)

ENTRY_POINT_GROUP = "vyre_async.backends"


def _log() -> logging.Logger:
    """This module's logger (``logging`` is imported on the first message, not at import)."""
    import logging

    return logging.getLogger("vyre_async.registry")


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendRegistration:
    """A lightweight record naming a backend and how to build it.

    Attributes:
        id: Unique backend id (``"reference"``, ``"cupy"``).
        factory: ``"package.module:callable"`` import path, or a callable that
            imports its heavy dependencies only when called. It returns a
            `VyreBackend`, or an `vyre_async.abc.Executor`, which the registry
            wraps in ``VyreBackend(executor)`` with the default settings (so an
            executor class is a factory).
        precedence: Lower wins among equally capable backends.
        dispatches: False for backends that only compile or validate.
        is_reference: True for the exact oracle backend.
        remote: True for a backend that dispatches to other processes or machines
            (``ray``): `acquire_preferred_backend` never picks it — it is not a
            local device, and a remote worker choosing its own inner backend
            must not pick the pool it belongs to — but `acquire_backend` builds
            it by id, and the contract tests run on it.
        probe: ``"package.module:callable"`` or a callable that checks, without
            building the backend, whether it can start here: it returns when it
            can and raises `UnsupportedFeature` (with a ``Fix:``) when it cannot.
            None: the backend can start wherever its factory imports.
            `probe_backend` calls it (``vyre-async info`` shows the verdicts).
    """

    id: str
    factory: str | Callable[[], Any]
    precedence: float = 100
    dispatches: bool = True
    is_reference: bool = False
    remote: bool = False
    probe: str | Callable[[], object] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise InvalidArgument(
                f"backend id must be a non-empty str, got {self.id!r}",
                fix='name the backend, e.g. id="mybackend"',
            )
        if isinstance(self.factory, str) and ":" not in self.factory:
            raise InvalidArgument(
                f"backend {self.id!r}: factory {self.factory!r} must look like 'module:callable'",
                fix='write the factory as "package.module:callable"',
            )
        if not isinstance(self.factory, str) and not callable(self.factory):
            raise InvalidArgument(
                f"backend {self.id!r}: factory must be a 'module:callable' path or a callable, "
                f"got {self.factory!r}",
                fix="pass the backend class or a function that builds it",
            )
        precedence = real_number(self.precedence)
        if not math.isfinite(precedence):
            raise InvalidArgument(
                f"backend {self.id!r}: precedence must be a finite number, got {self.precedence!r}",
                fix="pass precedence=100 (lower wins among equally capable backends)",
            )
        # Kept as a plain int or float (numpy numbers and fractions would not print or
        # serialise as one in `vyre-async info`).
        plain = int(precedence) if precedence.is_integer() else precedence
        object.__setattr__(self, "precedence", plain)
        probe = self.probe
        if probe is not None and not (callable(probe) or (isinstance(probe, str) and ":" in probe)):
            raise InvalidArgument(
                f"backend {self.id!r}: probe must be a 'module:callable' path, a callable or "
                f"None, got {probe!r}",
                fix='write the probe as "package.module:callable", or leave it out',
            )

    def load_factory(self) -> Callable[[], Any]:
        """Return the factory callable, importing its module if given as a path."""
        return _resolve(self.id, self.factory)


def _resolve(backend_id: str, target: str | Callable[[], Any]) -> Callable[[], Any]:
    """The callable ``target`` names (``"module:attr.path"``), imported on demand."""
    if callable(target):
        return target
    module_name, _, attr = target.partition(":")
    found: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        found = getattr(found, part)
    if not callable(found):
        raise TypeError(f"backend {backend_id!r}: {target!r} is not callable")
    return found  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendProbe:
    """Whether a registered backend can start on this machine (`probe_backend`).

    Attributes:
        id: The backend id.
        usable: True when it can start here.
        reason: Why it cannot (None when usable).
        fix: What to do about it (None when usable).
    """

    id: str
    usable: bool
    reason: str | None = None
    fix: str | None = None


def probe_backend(registration: BackendRegistration) -> BackendProbe:
    """Check, without building it, whether ``registration``'s backend can start here.

    Runs the registration's ``probe`` (or, without one, imports its factory).
    Never raises for a backend that cannot start: the verdict says why, with
    the error's ``Fix``.
    """
    try:
        if registration.probe is None:
            registration.load_factory()
        else:
            _resolve(registration.id, registration.probe)()
    except BackendError as exc:
        text = str(exc)
        reason, _, fix = text.rpartition("\nFix: ")
        return BackendProbe(id=registration.id, usable=False, reason=reason or text, fix=fix)
    except Exception as exc:  # a broken package: say what broke
        return BackendProbe(
            id=registration.id,
            usable=False,
            reason=f"{type(exc).__name__}: {exc}",
            fix=f"reinstall the package that provides the {registration.id!r} backend",
        )
    return BackendProbe(id=registration.id, usable=True)


_local: dict[str, BackendRegistration] = {}
_instances: dict[str, VyreBackend] = {}
_lock = threading.RLock()


def register_backend(registration: BackendRegistration, *, replace: bool = False) -> None:
    """Register a backend in this process, without an entry point (tests, embedding).

    Raises:
        InvalidArgument: ``registration`` is not a `BackendRegistration`, or its id
            is already registered in-process and ``replace`` is False.
    """
    if not isinstance(registration, BackendRegistration):
        raise InvalidArgument(
            f"register_backend expects a BackendRegistration, got {registration!r}",
            fix='pass BackendRegistration(id="...", factory=...)',
        )
    with _lock:
        if registration.id in _local and not replace:
            raise InvalidArgument(
                f"backend {registration.id!r} is already registered",
                fix="pass replace=True to replace it, or register under another id",
            )
        _local[registration.id] = registration
        _instances.pop(registration.id, None)


def entry_points(*, group: str) -> Any:
    """``importlib.metadata.entry_points(group=...)``, imported on the first listing.

    (Importing ``importlib.metadata`` costs ~35 ms: paid by the first listing,
    not by every ``import vyre_async``.)
    """
    from importlib.metadata import entry_points as lookup

    return lookup(group=group)


def registered_backends() -> list[BackendRegistration]:
    """Return every installed backend registration, sorted by ``(precedence, id)``.

    Sources: the ``vyre_async.backends`` entry points, then `register_backend`
    calls (which win on a shared id). Entry points that fail to load or do not
    name a `BackendRegistration` are skipped with a warning in the
    ``vyre_async.registry`` log. Nothing is instantiated.
    """
    found: dict[str, BackendRegistration] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            record = ep.load()
        except Exception as exc:  # a broken third-party package must not break listing
            _log().warning("skipping backend entry point %r: %s", ep.name, exc)
            continue
        if not isinstance(record, BackendRegistration):
            _log().warning(
                "skipping backend entry point %r: it names %r, not a BackendRegistration",
                ep.name,
                type(record).__name__,
            )
            continue
        if record.id in found:
            _log().warning(
                "duplicate backend id %r from entry point %r ignored", record.id, ep.name
            )
            continue
        found[record.id] = record
    with _lock:
        found.update(_local)
    return sorted(found.values(), key=lambda r: (r.precedence, r.id))


def acquire_backend(backend_id: str) -> VyreBackend:
    """Return the backend ``backend_id``, building it on first use (once per process).

    The instance is shared by every caller until it is closed (``aclose``, the
    end of ``async with``); the next call after that builds a fresh one.

    Raises:
        BackendNotFound: no installed backend has that id; the message lists the ids.
        UnsupportedFeature: the backend cannot start here (no device, no driver);
            the message names the cause and a fix.
        InvalidArgument: ``backend_id`` is not a string.
    """
    if not isinstance(backend_id, str):
        raise InvalidArgument(
            f"a backend id is a str, got {backend_id!r}",
            fix='pass one id, e.g. acquire_backend("reference") (vyre-async info lists them)',
        )
    with _lock:
        backend = _instances.get(backend_id)
        if backend is not None and not backend.closed:
            return backend
        registrations = {r.id: r for r in registered_backends()}
        registration = registrations.get(backend_id)
        if registration is None:
            installed = ", ".join(sorted(registrations)) or "none"
            raise BackendNotFound(
                f"no backend {backend_id!r} is installed (installed: {installed})",
                fix="install the package that provides it (e.g. vyre-async[cuda] for 'cupy') "
                "or use one of the installed ids",
                backend_id=backend_id,
            )
        backend = _build(registration)
        _instances[backend_id] = backend
        return backend


def _build(registration: BackendRegistration) -> VyreBackend:
    try:
        backend = registration.load_factory()()
    except BackendError:
        raise
    except Exception as exc:
        raise UnsupportedFeature(
            f"backend {registration.id!r} failed to start: {type(exc).__name__}: {exc}",
            fix=f"check that {registration.id!r} and its runtime are installed correctly",
            backend_id=registration.id,
        ) from exc
    from vyre_async._executor import Executor  # (with the first backend built, not at import)

    if isinstance(backend, Executor):
        from vyre_async._backend import VyreBackend

        backend = VyreBackend(backend)
    if getattr(backend, "id", None) != registration.id:
        raise UnsupportedFeature(
            f"backend factory for {registration.id!r} built {backend!r} with another id",
            fix="make the registration id match the executor class id",
            backend_id=registration.id,
        )
    return backend  # type: ignore[no-any-return]


def acquire_preferred_backend(*, allow_reference: bool = False) -> VyreBackend:
    """Return the best usable dispatching backend of this machine.

    Every dispatching, non-reference, local backend is tried; the ones that
    start on a GPU are ranked by capabilities, then precedence, then id. The
    reference backend is never chosen implicitly, a remote one (``ray``) never,
    nor one whose device is a CPU (``BackendCapabilities.cpu_device``: ``wgpu``
    on lavapipe), which ``acquire_backend`` still returns when asked by id.

    Args:
        allow_reference: When no other backend starts, return the reference
            backend instead of raising (a log line on the ``vyre_async.registry`` logger says so).

    Raises:
        UnsupportedFeature: no backend could start; the message lists each
            backend's failure and how to fix it.
    """
    registrations = registered_backends()
    failures: list[str] = []
    started: list[tuple[BackendRegistration, VyreBackend]] = []
    for reg in registrations:
        if not reg.dispatches or reg.is_reference or reg.remote:
            continue
        try:
            backend = acquire_backend(reg.id)
        except BackendError as exc:
            _log().debug("backend %r unavailable: %s", reg.id, exc)
            failures.append(f"- {reg.id}: " + str(exc).replace("\n", "\n    "))
            continue
        if backend.capabilities().cpu_device:  # a software driver is never taken for a GPU
            name = backend.capabilities().device_name
            _log().debug("backend %r runs on a CPU device (%s): not preferred", reg.id, name)
            failures.append(
                f"- {reg.id}: runs on a CPU device here ({name}); "
                f'acquire_backend("{reg.id}") uses it when asked for by id'
            )
            continue
        started.append((reg, backend))
    if started:
        reg, backend = min(
            started, key=lambda rb: (-rb[1].capabilities().score(), rb[0].precedence, rb[0].id)
        )
        return backend
    references = [r for r in registrations if r.is_reference and r.dispatches]
    details = "\n".join(failures) or "- no GPU dispatch backend is installed"
    if allow_reference and references:
        _log().warning(
            "no GPU backend can start here; dispatching on the CPU with the numpy reference "
            "backend %r instead. Why each GPU backend did not start:\n%s",
            references[0].id,
            details,
        )
        return acquire_backend(references[0].id)
    if failures:
        fix = (
            "apply the Fix listed above for the GPU backend you want, or pass "
            "allow_reference=True to run on the numpy reference backend (CPU)"
        )
    else:
        fix = (
            "install a GPU backend, e.g. pip install 'vyre-async[cuda]' for NVIDIA GPUs, or "
            "pass allow_reference=True to run on the numpy reference backend (CPU)"
        )
    raise UnsupportedFeature(
        f"no usable GPU dispatch backend is available:\n{details}",
        fix=fix,
        failures=tuple(failures),
    )


def _forget_instances() -> None:
    """Drop built backends (tests only)."""
    with _lock:
        _instances.clear()
