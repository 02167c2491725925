"""The Ray pool's program memo, field by field (issue 28, tests by method), without a cluster.

A caller ships a program's wire bytes to a worker once; after that both sides
name it by ``program.fingerprint()`` (the worker's ``programs``, the caller's
per-worker ``seen`` that steers placement). That key must change with every
field of the program — counts included, unlike the pipeline identity: the
worker dispatches the program it holds, with that program's buffer sizes — or a
worker runs another program for it. The config is not keyed: it travels with
every call. `vyre_ray.worker.Worker` is driven directly here (no Ray needed);
the pool's placement and resending run on a real cluster in ``test_ray_backend.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from tests.driver.test_keys import (
    BASE,
    BUFFER_CASES,
    PROGRAM_CASES,
    assert_outputs,
    expected,
    inputs_for,
    program,
)
from vyre_async import DispatchConfig
from vyre_async.ir import BufferDecl, Program
from vyre_ray.errors import UnknownProgram
from vyre_ray.worker import Worker

CONFIG = DispatchConfig()


def run(worker: Worker, prog: Program, wire: bytes | None, cfg: DispatchConfig = CONFIG) -> Any:
    inputs = inputs_for(prog)
    outputs = anyio.run(worker.run, prog.fingerprint(), wire, inputs, cfg, None)
    assert_outputs(outputs, expected(prog, inputs, cfg))
    return outputs


def test_every_program_field_has_a_case() -> None:
    assert set(PROGRAM_CASES) == {f.name for f in dataclasses.fields(Program) if f.init}
    assert set(BUFFER_CASES) == {f.name for f in dataclasses.fields(BufferDecl)}


def test_the_pool_names_programs_by_their_fingerprint() -> None:
    """Every program the pool ships is keyed by ``program.fingerprint()``, the key tested here.

    (Read from the source: the pool itself needs a cluster. A key such as
    ``kernel_digest()`` would ignore buffer counts, and a worker would run a
    program of other sizes for the call.)
    """
    spec = importlib.util.find_spec("vyre_ray.backend")
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    keys = [
        ast.unparse(node.args[0])
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "_Shipped"
    ]
    assert keys and set(keys) == {"program.fingerprint()"}


@pytest.mark.parametrize(
    ("field", "changed"),
    [
        pytest.param(field, changed, id=f"{field}: {name}")
        for field, cases in PROGRAM_CASES.items()
        for name, changed, _ in cases
    ],
)
def test_a_program_field_changed_alone_is_a_new_program_to_a_worker(
    field: str, changed: Program
) -> None:
    worker = Worker("reference", 0)
    run(worker, BASE, BASE.to_wire())
    assert changed.fingerprint() != BASE.fingerprint(), f"{field} is not in the key"

    with pytest.raises(UnknownProgram):  # it does not run the base program for it
        anyio.run(worker.run, changed.fingerprint(), None, inputs_for(changed), CONFIG, None)
    run(worker, changed, changed.to_wire())

    assert list(worker.programs) == [BASE.fingerprint(), changed.fingerprint()]


@pytest.mark.parametrize(
    ("prog", "cfg"),
    [
        (program(), CONFIG),
        (BASE, DispatchConfig(grid_override=(1, 1, 1))),
        (BASE, DispatchConfig(workgroup_override=(4, 1, 1))),
        (BASE, DispatchConfig(label="x", timeout=30.0)),
    ],
    ids=["an equal program", "grid_override", "workgroup_override", "label and timeout"],
)
def test_what_the_program_key_does_not_hold_hits(prog: Program, cfg: DispatchConfig) -> None:
    worker = Worker("reference", 0)
    run(worker, BASE, BASE.to_wire())

    outputs = run(worker, prog, None, cfg)  # no bytes sent: the worker's own copy runs

    assert list(worker.programs) == [BASE.fingerprint()]
    assert isinstance(outputs[0], np.ndarray)
