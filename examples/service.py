"""A real async service on vyre-async: Starlette, served by uvicorn.

    .venv/bin/python examples/service.py --port 8000          # or:
    .venv/bin/uvicorn service:app --app-dir examples --port 8000

The backend is acquired once, in the app's lifespan (``VYRE_BACKEND``, else
``acquire_preferred_backend(allow_reference=True)``), and closed at shutdown,
after the requests in flight finished. Endpoints:

- ``POST /v1/run/{program}`` (``xor``: two u32 arrays; ``saxpy``: two f32
  arrays and ``alpha``) runs the standard program on the request's data and
  returns its output. JSON for small arrays: ``{"inputs": [[...], [...]]}``
  (saxpy: ``{"inputs": [x, y], "alpha": 2.0}``) gives ``{"outputs": [[...]]}``.
  Raw little-endian bytes for large ones: ``Content-Type:
  application/octet-stream``, the inputs concatenated, ``X-Vyre-Counts: N,N``
  (elements per input) and ``X-Vyre-Dtypes: u32,u32``; the answer is the
  output's bytes with the same headers.
- ``POST /v1/numpy/{program}``: the same answer computed with numpy in the
  handler (the benchmark's baseline, ``benchmarks/service.py``).
- ``GET /health``: the backend id and device.
- ``GET /metrics``: the Prometheus text of vyre-async's metrics (with the
  OpenTelemetry SDK installed).

Bad requests (malformed or absurdly nested body, NaN or Infinity, ``true`` for
a number, empty arrays, wrong dtype or count, an array over
``VYRE_SERVICE_MAX_ELEMENTS`` (default 4 194 304) or a body over
``VYRE_SERVICE_MAX_BODY_BYTES``; an unknown route or method) get 4xx with a
message and a Fix as JSON, as do requests the driver refuses (its own message
and Fix); driver faults get 5xx (504 for a timeout); nothing crashes the
server. Each setting must be a whole number >= 1, else the service does not
start (a message and a Fix, exit status 1). The HTTP metrics keep only labels
of bounded cardinality (method, status, scheme, protocol, route, port): no
client can add series through its ``Host`` header. A JSON answer
that would hold Infinity (an f32 overflow) is a 422: ask for raw bytes.
``VYRE_SERVICE_TRACE`` (``otlp``, ``console``, ``file:PATH``) installs the
tracing SDK; every request is then an HTTP server span (OpenTelemetry's ASGI
middleware) and the parent of its ``vyre.dispatch`` span. Needs the
``service`` extra: ``pip install 'vyre-async[service]'``.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from opentelemetry import context as otel_context
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from vyre_async import (
    BackendClosed,
    BackendError,
    DeviceLost,
    DeviceOutOfMemory,
    DispatchTimeout,
    InvalidProgram,
    Program,
    UnsupportedFeature,
    acquire_backend,
    acquire_preferred_backend,
    telemetry,
)
from vyre_async.programs import elementwise_xor, saxpy


def _setting(name: str, default: int) -> int:
    """A whole-number setting >= 1 from the environment; a bad one stops the start, clearly."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise SystemExit(
            f"vyre-service: {name} must be a whole number >= 1, got {raw!r}\n"
            f"Fix: set {name}={default} (the default) or unset it"
        )
    return value


def _check_choices() -> None:
    """``VYRE_BACKEND`` and ``VYRE_SERVICE_TRACE`` are checked before the server starts.

    A backend that is not installed or cannot start here, or a trace spec that
    is not one (or a trace file that cannot be written), stops the start with
    the reason and a Fix (exit status 1), not a traceback from the lifespan.
    """
    chosen = os.environ.get("VYRE_BACKEND")
    if chosen:
        from vyre_async import probe_backend, registered_backends

        found = {r.id: r for r in registered_backends()}
        if chosen not in found:
            raise SystemExit(
                f"vyre-service: VYRE_BACKEND={chosen!r} is not an installed backend "
                f"(installed: {', '.join(sorted(found)) or 'none'})\n"
                "Fix: set VYRE_BACKEND to one of them, or unset it for the best one here"
            )
        verdict = probe_backend(found[chosen])
        if not verdict.usable:
            raise SystemExit(f"vyre-service: {verdict.reason}\nFix: {verdict.fix}")
    spec = os.environ.get("VYRE_SERVICE_TRACE", "none")
    if spec != "none":
        if spec not in ("console", "otlp") and not (spec.startswith("file:") and len(spec) > 5):
            raise SystemExit(
                f"vyre-service: VYRE_SERVICE_TRACE={spec!r} is not a trace spec\n"
                "Fix: set it to none, console, otlp or file:PATH"
            )
        if spec.startswith("file:"):
            from vyre_async.tracing import OtlpJsonFileExporter

            try:
                OtlpJsonFileExporter(spec[5:])
            except BackendError as exc:
                raise SystemExit(f"vyre-service: {exc}") from None


_check_choices()
MAX_ELEMENTS = _setting("VYRE_SERVICE_MAX_ELEMENTS", 1 << 22)
#: A body over this many bytes is refused before it is read whole (JSON numbers
#: take up to about 12 bytes each).
MAX_BODY_BYTES = _setting("VYRE_SERVICE_MAX_BODY_BYTES", 24 * MAX_ELEMENTS + 4096)
RAW = "application/octet-stream"
_DTYPES = {"u32": np.dtype("<u4"), "f32": np.dtype("<f4")}


@dataclass(frozen=True)
class Spec:
    """A program the service runs: how to build it for ``n`` elements, its inputs, numpy."""

    build: Callable[[int], Program]
    dtypes: tuple[str, ...]  # of the array inputs
    scalar: str | None  # a JSON field given as a one-element input (saxpy's alpha)
    numpy: Callable[[Sequence[np.ndarray]], np.ndarray]


PROGRAMS = {
    "xor": Spec(elementwise_xor, ("u32", "u32"), None, lambda v: v[0] ^ v[1]),
    "saxpy": Spec(
        saxpy,
        ("f32", "f32"),
        "alpha",
        lambda v: (np.float32(v[2][0]) * v[0] + v[1]).astype(np.float32),
    ),
}


class BadRequest(Exception):
    """A request the service refuses (4xx), with the reason and what to do."""

    def __init__(self, status: int, message: str, fix: str) -> None:
        super().__init__(message)
        self.status, self.message, self.fix = status, message, fix


def _error(status: int, kind: str, message: str, fix: str, code: int | None = None) -> Response:
    body: dict[str, Any] = {"error": kind, "message": message, "fix": fix}
    if code is not None:
        body["code"] = code
    return JSONResponse(body, status_code=status)


def _driver_error(exc: BackendError) -> Response:
    message, _, fix = exc.message.rpartition("\nFix: ")
    if isinstance(exc, InvalidProgram | UnsupportedFeature):
        status = 422 if isinstance(exc, UnsupportedFeature) else 400
    elif isinstance(exc, DispatchTimeout):
        status = 504
    elif isinstance(exc, DeviceLost | BackendClosed | DeviceOutOfMemory):
        status = 503
    else:
        status = 500
    return _error(status, type(exc).__name__, message or exc.message, fix, int(exc.code))


def _checked(values: np.ndarray, what: str) -> np.ndarray:
    if values.ndim != 1:
        raise BadRequest(400, f"{what} must be a flat array", "send a list of numbers")
    if values.size == 0:
        raise BadRequest(400, f"{what} is empty", "send at least one element")
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        raise BadRequest(
            400, f"{what} holds NaN or Infinity", "send finite numbers (f32: |x| < 3.4e38)"
        )
    if values.size > MAX_ELEMENTS:
        raise BadRequest(
            413,
            f"{what} has {values.size} elements, over this service's limit of {MAX_ELEMENTS}",
            "split the work into smaller requests",
        )
    return values


async def _body(request: Request) -> bytes:
    """The request body, refused (413) past `MAX_BODY_BYTES` before it is read whole."""
    declared = request.headers.get("content-length")
    too_big = BadRequest(
        413,
        f"the body is over this service's limit of {MAX_BODY_BYTES} bytes",
        "split the work into smaller requests (raw bytes are the compact form)",
    )
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


async def _inputs(request: Request, spec: Spec) -> tuple[list[np.ndarray], bool]:
    """The request's inputs, one array per program input, and whether it came raw."""
    body = await _body(request)
    if request.headers.get("content-type", "").startswith(RAW):
        counts_header = request.headers.get("x-vyre-counts", "")
        try:
            counts = [int(c) for c in counts_header.split(",")]
        except ValueError:
            raise BadRequest(
                400,
                f"X-Vyre-Counts must list the element count of each input, got {counts_header!r}",
                "send X-Vyre-Counts: N,N with the raw inputs concatenated",
            ) from None
        dtypes = [d.strip() for d in request.headers.get("x-vyre-dtypes", "").split(",") if d]
        expected = list(spec.dtypes) + ([_scalar_dtype(spec)] if spec.scalar else [])
        if len(counts) != len(expected) or (dtypes and dtypes != expected):
            raise BadRequest(
                400,
                f"this program takes {len(expected)} inputs of dtypes {','.join(expected)}; "
                f"got counts {counts} and dtypes {dtypes or 'unstated'}",
                f"send X-Vyre-Dtypes: {','.join(expected)} and one count per input",
            )
        if spec.scalar is not None and counts[-1] != 1:
            raise BadRequest(
                400,
                f"{spec.scalar} is one value, got {counts[-1]}",
                f"send {spec.scalar} as one element (count 1)",
            )
        arrays, offset = [], 0
        for count, dtype in zip(counts, expected, strict=True):
            size = count * _DTYPES[dtype].itemsize
            if count < 0 or offset + size > len(body):
                raise BadRequest(
                    400,
                    f"the body has {len(body)} bytes, fewer than the counts say",
                    "send exactly the bytes of every input, little-endian, concatenated",
                )
            arrays.append(_checked(np.frombuffer(body, _DTYPES[dtype], count, offset), "input"))
            offset += size
        if offset != len(body):
            raise BadRequest(
                400,
                f"the body has {len(body)} bytes, more than the counts say ({offset})",
                "send exactly the bytes of every input, little-endian, concatenated",
            )
        return arrays, True
    try:
        document = json.loads(body, parse_constant=_no_constant)  # no NaN, no Infinity
        raw_inputs = document["inputs"]
        if not isinstance(raw_inputs, list) or len(raw_inputs) != len(spec.dtypes):
            raise TypeError
    except (ValueError, KeyError, TypeError, RecursionError):  # (nested past any use)
        raise BadRequest(
            400,
            f"the body must be JSON {{'inputs': [...]}} with {len(spec.dtypes)} arrays",
            'send {"inputs": [[1, 2], [3, 4]]}, or raw bytes with X-Vyre-Counts',
        ) from None
    arrays = []
    for values, dtype in zip(raw_inputs, spec.dtypes, strict=True):
        arrays.append(_checked(_typed(values, dtype), "input"))
    if spec.scalar is not None:
        scalar = document.get(spec.scalar)
        if isinstance(scalar, bool) or not isinstance(scalar, int | float):
            raise BadRequest(400, f"{spec.scalar} must be a number", f'send "{spec.scalar}": 2.0')
        arrays.append(_checked(_typed([scalar], _scalar_dtype(spec)), spec.scalar))
    return arrays, False


def _scalar_dtype(spec: Spec) -> str:
    return spec.dtypes[0]


def _typed(values: Any, dtype: str) -> np.ndarray:
    """A JSON list as an array of ``dtype``, refusing values that do not fit it exactly.

    ``true``/``false`` are not numbers here, and an empty list is empty whatever
    its dtype (`_checked` says so, as for raw bytes).
    """
    if isinstance(values, list) and not values:
        return np.zeros(0, _DTYPES[dtype])
    try:
        if not isinstance(values, list) or any(isinstance(v, bool) for v in values):
            raise ValueError
        array = np.asarray(values)
        if dtype == "u32":
            if array.dtype.kind not in "iu" or (
                array.size and (array.min() < 0 or array.max() > 0xFFFF_FFFF)
            ):
                raise ValueError
            return array.astype(np.uint32)
        if array.dtype.kind == "O":  # ints beyond int64: as floats, like 1.2e21 is
            array = np.asarray([float(v) for v in values])
        if array.dtype.kind not in "iuf":
            raise ValueError
        with np.errstate(over="ignore"):  # (past f32's range: Infinity, refused as such)
            return array.astype(np.float32)
    except (ValueError, TypeError, OverflowError, RecursionError):
        raise BadRequest(
            400,
            f"an input is not an array of {dtype} values",
            "send whole numbers in 0..4294967295 for u32, numbers for f32",
        ) from None


_built: OrderedDict[tuple[str, int], Program] = OrderedDict()


def _program(name: str, spec: Spec, n: int) -> Program:
    """The program for ``n`` elements, built once (the driver caches its pipeline)."""
    key = (name, n)
    program = _built.get(key)
    if program is None:
        program = _built[key] = spec.build(n)
        if len(_built) > 256:
            _built.popitem(last=False)
    return program


def _answer(output: np.ndarray, raw: bool) -> Response:
    if not raw and output.dtype.kind == "f" and not np.isfinite(output).all():
        return _error(
            422,
            "NotRepresentable",
            "the result holds Infinity or NaN (f32 overflow), which JSON cannot carry",
            "ask for raw bytes (Content-Type: application/octet-stream), or scale the inputs",
        )
    if raw:
        kind = "u32" if output.dtype == np.uint32 else "f32"
        return Response(
            output.astype(_DTYPES[kind], copy=False).tobytes(),
            media_type=RAW,
            headers={"X-Vyre-Counts": str(output.size), "X-Vyre-Dtypes": kind},
        )
    return JSONResponse({"outputs": [output.tolist()]})


async def _request(request: Request) -> tuple[str, Spec, list[np.ndarray], bool] | Response:
    """The program named in the path and the request's inputs; or the 4xx answer."""
    name = request.path_params["program"]
    spec = PROGRAMS.get(name)
    if spec is None:
        return _error(404, "NotFound", f"no program {name!r}", f"use one of {sorted(PROGRAMS)}")
    try:
        inputs, raw = await _inputs(request, spec)
        if len({a.size for a in inputs[: len(spec.dtypes)]}) != 1:  # (the driver would read
            # a shorter array's missing elements as 0: the programs' inputs are unsized)
            raise BadRequest(400, "the arrays differ in length", "send arrays of one length")
    except BadRequest as exc:
        return _error(exc.status, "BadRequest", exc.message, exc.fix)
    return name, spec, inputs, raw


async def run(request: Request) -> Response:
    parsed = await _request(request)
    if isinstance(parsed, Response):
        return parsed
    name, spec, inputs, raw = parsed
    try:
        program = _program(name, spec, inputs[0].size)
        (output,) = await request.app.state.backend.dispatch(program, inputs)
    except BackendError as exc:
        return _driver_error(exc)
    except Exception as exc:  # a bug: still an answer, with what happened
        return _error(500, type(exc).__name__, str(exc), "report it with this message")
    return _answer(output, raw)


async def run_numpy(request: Request) -> Response:
    """The same answer with numpy in the handler: the benchmark's baseline."""
    parsed = await _request(request)
    if isinstance(parsed, Response):
        return parsed
    _, spec, inputs, raw = parsed
    return _answer(spec.numpy(inputs), raw)


async def health(request: Request) -> Response:
    backend = request.app.state.backend
    return JSONResponse(
        {"status": "ok", "backend": backend.id, "device": backend.device_fingerprint()}
    )


async def metrics(request: Request) -> Response:
    reader = request.app.state.reader
    if reader is None:
        return PlainTextResponse("# no OpenTelemetry SDK installed: no metrics\n")
    return PlainTextResponse(telemetry.prometheus_text(reader.get_metrics_data()))


def _install_telemetry() -> tuple[Any, Any]:
    """The tracing SDK as ``VYRE_SERVICE_TRACE`` says, and a metric reader for /metrics."""
    provider = reader = None
    spec = os.environ.get("VYRE_SERVICE_TRACE", "none")
    if spec != "none":
        from vyre_async.tracing import configure_tracing

        provider = configure_tracing(spec, service_name="vyre-service")
    try:
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    except ImportError:  # no SDK: /metrics says so
        return provider, None
    from opentelemetry.sdk.metrics.view import View

    reader = InMemoryMetricReader()
    # The ASGI middleware labels its HTTP metrics with what the client sent (the Host
    # header, the target path): every new value would be a new series, so any client
    # could grow /metrics at will. Keep only labels of bounded cardinality.
    bounded = View(instrument_name="http.server.*", attribute_keys=HTTP_METRIC_LABELS)
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader], views=[bounded]))
    return provider, reader


#: The HTTP metric labels kept: method (unknown ones are "_OTHER"), status, scheme,
#: protocol version, the route template, the server's port.
HTTP_METRIC_LABELS = {
    "http.method",
    "http.request.method",
    "http.status_code",
    "http.response.status_code",
    "http.scheme",
    "url.scheme",
    "http.flavor",
    "network.protocol.version",
    "http.route",
    "net.host.port",
    "server.port",
}


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    provider, app.state.reader = _install_telemetry()
    chosen = os.environ.get("VYRE_BACKEND")
    backend = acquire_backend(chosen) if chosen else acquire_preferred_backend(allow_reference=True)
    app.state.backend = backend
    try:
        yield  # (uvicorn lets the requests in flight finish before this resumes)
    finally:
        await backend.aclose()
        if provider is not None:
            provider.shutdown()  # export the last spans


ROUTES = [
    Route("/v1/run/{program}", run, methods=["POST"]),
    Route("/v1/numpy/{program}", run_numpy, methods=["POST"]),
    Route("/health", health),
    Route("/metrics", metrics),
]


async def _no_route(request: Request, exc: Exception) -> Response:
    """Unknown paths and methods: JSON with a Fix, like every other refusal."""
    status = getattr(exc, "status_code", 404)
    known = ", ".join(f"{sorted(r.methods or ())} {r.path}" for r in ROUTES)
    if status == 405:
        return _error(
            405, "MethodNotAllowed", f"{request.method} is not served at {request.url.path}",
            f"use one of: {known}",
        )  # fmt: skip
    return _error(404, "NotFound", f"no route {request.url.path}", f"use one of: {known}")


_traced = OpenTelemetryMiddleware(
    Starlette(
        routes=ROUTES,
        lifespan=lifespan,
        exception_handlers={404: _no_route, 405: _no_route},
    )
)


async def app(scope: Any, receive: Any, send: Any) -> None:
    """The service: each request starts from an empty trace context.

    uvicorn may start the next request on a keep-alive connection from inside
    the previous one's ``send`` or ``receive``, and the new task inherits that
    context, span and all: the next request's span would become a child of the
    previous request's. Starting empty makes every request span a root (or the
    child of the ``traceparent`` the client sent).
    """
    token = otel_context.attach(otel_context.Context())
    try:
        await _traced(scope, receive, send)
    finally:
        otel_context.detach(token)


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port, timeout_graceful_shutdown=30)


if __name__ == "__main__":
    main()
