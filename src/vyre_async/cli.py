"""The ``vyre-async`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vyre_async._cache.disk import DiskPipelineCache
from vyre_async._calibration import CalibrationStore, calibration_for, format_calibration
from vyre_async._exports import public_dir as _public_dir
from vyre_async._registry import probe_backend, registered_backends
from vyre_async._version import __version__
from vyre_async.errors import BackendError

__all__ = ["main"]
__dir__ = _public_dir(__name__)


def _at_least_one(text: str) -> int:
    """argparse type: a whole number >= 1 (a usage error, exit 2, otherwise)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"needs a whole number >= 1, got {text!r}")
    return value


def _info(args: argparse.Namespace) -> int:
    if args.calibrate:
        from vyre_async._registry import acquire_backend

        calibration_for(acquire_backend(args.calibrate), measure=True, refresh=True)
    calibrations = CalibrationStore().entries()
    backends = []
    for r in registered_backends():
        verdict = probe_backend(r)
        backends.append(
            {
                "id": r.id,
                "precedence": r.precedence,
                "dispatches": r.dispatches,
                "is_reference": r.is_reference,
                "remote": r.remote,
                "usable": verdict.usable,
                "reason": verdict.reason,
                "fix": verdict.fix,
            }
        )
    report = {
        "vyre_async": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "backends": backends,
        "calibrations": [record.to_json() for record in calibrations],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"vyre-async {__version__} (Python {report['python']}, numpy {report['numpy']})")
    if not backends:
        print("registered backends: none")
    else:
        print("registered backends (precedence order):")
        for b in backends:
            flags = [name for name in ("dispatches", "is_reference", "remote") if b[name]]
            state = "usable" if b["usable"] else "cannot start here"
            print(f"  {b['id']:<12} {state:<18} precedence={b['precedence']:<4} {' '.join(flags)}")
            if not b["usable"]:
                reason = str(b["reason"]).replace("\n", "\n      ")
                print(f"      {reason}\n      Fix: {b['fix']}")
    if not calibrations:
        print("calibration: none cached (vyre-async info --calibrate <backend> measures one)")
    for record in calibrations:
        print(format_calibration(record))
    return 0


def _cache(args: argparse.Namespace) -> int:
    # Only files the cache owns (its entries and temp files, by name and header)
    # are counted or removed; anything else under the root is left alone.
    cache = DiskPipelineCache(args.dir)
    if args.action == "clear":
        removed = cache.clear()
        print(
            f"removed {removed} pipeline cache entr{'y' if removed == 1 else 'ies'} "
            f"from {cache.root}"
        )
        left = cache.info().temp_files
        if left:
            print(f"kept {left} temp file{'' if left == 1 else 's'} of writers still running")
        return 0
    info = cache.info()
    if args.json:
        print(
            json.dumps(
                {
                    "root": str(info.root),
                    "entries": info.entries,
                    "total_bytes": info.total_bytes,
                    "max_bytes": info.max_bytes,
                    "temp_files": info.temp_files,
                    "temp_bytes": info.temp_bytes,
                }
            )
        )
    else:
        print(f"pipeline cache: {info.root}")
        print(f"  entries: {info.entries}")
        print(f"  temp files: {info.temp_files} ({info.temp_bytes} bytes)")
        print(f"  size:    {info.total_bytes} bytes, temp files included (cap {info.max_bytes})")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from vyre_async.demo import run_demo

    provider = _tracing(args.trace)
    try:
        return run_demo(
            tasks=args.tasks, per_task=args.per_task, use_trio=args.trio, backend_id=args.backend
        )
    finally:
        if provider is not None:
            provider.shutdown()


def _timeline(args: argparse.Namespace) -> int:
    from vyre_async.timeline import convert

    source = Path(args.trace)
    if not source.is_file():
        print(
            f"vyre-async: no trace file {str(source)!r}\n"
            "Fix: write one first, e.g. vyre-async demo --trace file:traces.jsonl",
            file=sys.stderr,
        )
        return 2
    if Path(args.output).resolve() == source.resolve():
        print(
            "vyre-async: -o names the trace file itself; writing it would erase the trace\n"
            "Fix: choose another path for -o, e.g. timeline.json",
            file=sys.stderr,
        )
        return 2
    try:
        source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(
            f"vyre-async: cannot read {str(source)!r}: {exc}\n"
            "Fix: pass the OTLP-JSON text file written by --trace file:PATH",
            file=sys.stderr,
        )
        return 2
    try:
        report = convert(source, args.output)
    except OSError as exc:
        print(
            f"vyre-async: cannot write {args.output!r}: {exc}\nFix: choose a writable path for -o",
            file=sys.stderr,
        )
        return 2
    if report.skipped_lines:
        shown = ", ".join(str(n) for n in report.skipped_lines[:10])
        more = (
            "" if len(report.skipped_lines) <= 10 else f" and {len(report.skipped_lines) - 10} more"
        )
        print(
            f"vyre-async: skipped {len(report.skipped_lines)} line(s) that are not OTLP-JSON "
            f"span batches: {shown}{more} (a file cut short keeps its other lines)",
            file=sys.stderr,
        )
    if report.cyclic_spans:
        shown = ", ".join(report.cyclic_spans[:5])
        more = "" if len(report.cyclic_spans) <= 5 else f" and {len(report.cyclic_spans) - 5} more"
        print(
            f"vyre-async: {len(report.cyclic_spans)} span(s) name a parent chain that loops "
            f"back to them ({shown}{more}); they are shown as top-level slices",
            file=sys.stderr,
        )
    if not report.spans:
        print(
            f"vyre-async: {str(source)!r} holds no spans\n"
            "Fix: pass a file written by --trace file:PATH (OTLP-JSON, one batch per line)",
            file=sys.stderr,
        )
        return 1
    print(
        f"{report.spans} spans -> {report.events} slices on {report.tracks} tracks: "
        f"{args.output} (open it in https://ui.perfetto.dev or chrome://tracing)"
    )
    return 0


def _tracing(spec: str) -> Any:
    if spec == "none":
        return None
    from vyre_async.tracing import configure_tracing

    return configure_tracing(spec)


def _trace_spec(value: str) -> str:
    if value in ("none", "console", "otlp") or (value.startswith("file:") and len(value) > 5):
        return value
    raise argparse.ArgumentTypeError("choose none, console, otlp or file:PATH")


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``vyre-async`` command."""
    parser = argparse.ArgumentParser(
        prog="vyre-async", description="Async-first GPU compute driver for Python."
    )
    parser.add_argument("--version", action="version", version=f"vyre-async {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="show the version and the registered backends")
    info.add_argument("--json", action="store_true", help="print machine-readable JSON")
    info.add_argument(
        "--calibrate",
        metavar="BACKEND",
        default=None,
        help="measure BACKEND's launch/transfer/compile costs now and cache them",
    )
    info.set_defaults(run=_info)
    cache = commands.add_parser(
        "cache",
        help="inspect or clear the on-disk pipeline cache (only the files it wrote)",
    )
    cache.add_argument("action", choices=("info", "clear"))
    cache.add_argument(
        "--dir", default=None, help="cache root (default: $VYRE_CACHE_DIR or the user cache dir)"
    )
    cache.add_argument("--json", action="store_true", help="print machine-readable JSON (info)")
    cache.set_defaults(run=_cache)
    demo = commands.add_parser(
        "demo", help="run concurrent tasks dispatching the standard programs, checked exactly"
    )
    demo.add_argument(
        "--tasks", type=_at_least_one, default=64, help="concurrent tasks (default 64)"
    )
    demo.add_argument(
        "--per-task", type=_at_least_one, default=30, help="dispatches per task (default 30)"
    )
    demo.add_argument("--trio", action="store_true", help="run on trio instead of asyncio")
    demo.add_argument("--backend", default=None, help="backend id (default: the best available)")
    demo.add_argument(
        "--trace",
        type=_trace_spec,
        default="none",
        metavar="{none,console,otlp,file:PATH}",
        help="export a span per dispatch (otlp honours OTEL_EXPORTER_OTLP_ENDPOINT, "
        "default http://localhost:4318; OTEL_SERVICE_NAME names the service)",
    )
    demo.set_defaults(run=_demo)
    traces = commands.add_parser("trace", help="work with trace files written by --trace file:PATH")
    trace_commands = traces.add_subparsers(dest="trace_command", required=True)
    timeline = trace_commands.add_parser(
        "timeline",
        help="turn an OTLP-JSON trace file into Chrome trace-event JSON (ui.perfetto.dev)",
    )
    timeline.add_argument("trace", help="the OTLP-JSON lines file (--trace file:PATH)")
    timeline.add_argument(
        "-o", "--output", required=True, help="where to write the trace-event JSON"
    )
    timeline.set_defaults(run=_timeline)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the process exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.run(args))
    except BackendError as exc:
        print(f"vyre-async: {type(exc).__name__} ({int(exc.code)}): {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
