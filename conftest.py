"""Every Python block of README.md and docs/guide.md runs under pytest, by Sybil.

- README.md: each block stands alone (a fresh namespace per block), as a reader
  copies one.
- docs/guide.md: the blocks share one namespace, in order; what a block takes
  for granted (a program, its inputs) is set up by ``invisible-code-block``
  comments beside it, which Sybil runs and readers do not see.

A block may ``await`` at top level, as in an asyncio REPL or a notebook (the
guide's ``outputs = await backend.dispatch(...)``): it then runs as a coroutine
with ``asyncio.run``. ``make package-check`` runs README.md the same way
against the installed wheel, with a copy of this file; so this file imports
nothing from the repository. Where Sybil is not installed (the GPU machine's
image), the docs are refused, never silently skipped, and everything else runs.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest

DOCS = ("README.md", "guide.md")

try:
    import sybil
except ImportError:
    sybil = None

if sybil is None:

    class _NeedsSybil(pytest.Item):
        def runtest(self) -> None:
            pytest.fail(
                f"running the Python blocks of {self.path.name} needs Sybil\n"
                "Fix: pip install sybil (it is in vyre-async[dev])",
                pytrace=False,
            )

    class _Doc(pytest.File):
        def collect(self) -> Any:
            yield _NeedsSybil.from_parent(self, name="python-blocks")

    def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> _Doc | None:
        """Without Sybil, a doc's blocks fail (never a silent skip); the rest runs."""
        if file_path.name in DOCS:
            return _Doc.from_parent(parent, path=file_path)
        return None

else:
    from sybil import Sybil
    from sybil.evaluators.python import PythonEvaluator, pad
    from sybil.parsers.markdown import CodeBlockParser, SkipParser

    class AwaitingEvaluator(PythonEvaluator):
        """Sybil's evaluator for Python blocks, plus top-level ``await`` and fresh namespaces."""

        def __init__(self, *, fresh_namespace: bool) -> None:
            super().__init__()
            self.flags |= ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
            self.fresh_namespace = fresh_namespace

        def __call__(self, example: Any) -> None:
            __tracebackhide__ = True
            namespace = example.namespace
            if self.fresh_namespace:
                namespace.clear()
            source = pad(example.parsed, example.line + example.parsed.line_offset)
            code = compile(source, example.path, "exec", flags=self.flags, dont_inherit=True)
            if code.co_flags & inspect.CO_COROUTINE:
                asyncio.run(eval(code, namespace))
            else:
                exec(code, namespace)
            namespace.pop("__builtins__", None)

    def _sybil(pattern: str, *, fresh_namespace: bool) -> Sybil:
        evaluator = AwaitingEvaluator(fresh_namespace=fresh_namespace)
        return Sybil(
            parsers=[CodeBlockParser(language="python", evaluator=evaluator), SkipParser()],
            patterns=[pattern],
        )

    pytest_collect_file = (
        _sybil("README.md", fresh_namespace=True) + _sybil("guide.md", fresh_namespace=False)
    ).pytest()
