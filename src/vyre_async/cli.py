"""The ``vyre-async`` command line."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections.abc import Sequence

import numpy as np

from vyre_async._version import __version__
from vyre_async.registry import registered_backends

__all__ = ["main"]


def _info(args: argparse.Namespace) -> int:
    backends = [
        {
            "id": r.id,
            "precedence": r.precedence,
            "dispatches": r.dispatches,
            "is_reference": r.is_reference,
        }
        for r in registered_backends()
    ]
    report = {
        "vyre_async": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "backends": backends,
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
            flags = [name for name in ("dispatches", "is_reference") if b[name]]
            print(f"  {b['id']:<12} precedence={b['precedence']:<4} {' '.join(flags)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``vyre-async`` command."""
    parser = argparse.ArgumentParser(
        prog="vyre-async", description="Async-first GPU compute driver for Python."
    )
    parser.add_argument("--version", action="version", version=f"vyre-async {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="show the version and the registered backends")
    info.add_argument("--json", action="store_true", help="print machine-readable JSON")
    info.set_defaults(run=_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the process exit status."""
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
