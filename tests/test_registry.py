"""Registry listing over entry points: sorted, side-effect free, robust to broken plugins."""

from __future__ import annotations

import logging
from importlib.metadata import EntryPoint
from typing import Any

import pytest

from vyre_async import registry
from vyre_async.registry import BackendRegistration, registered_backends

A = BackendRegistration(id="zeta", factory="json:loads", precedence=10)
B = BackendRegistration(id="alpha", factory="json:loads", precedence=10)
C = BackendRegistration(id="first", factory=lambda: 1, precedence=0, is_reference=True)


class _FakeEP:
    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self._value = value

    def load(self) -> Any:
        if isinstance(self._value, Exception):
            raise self._value
        return self._value


def _patch(monkeypatch: pytest.MonkeyPatch, eps: list[_FakeEP]) -> None:
    def fake(*, group: str) -> list[_FakeEP]:
        assert group == registry.ENTRY_POINT_GROUP
        return eps

    monkeypatch.setattr(registry, "entry_points", fake)


def test_sorted_by_precedence_then_id(monkeypatch: pytest.MonkeyPatch) -> None:
    _patch(monkeypatch, [_FakeEP("a", A), _FakeEP("b", B), _FakeEP("c", C)])
    assert [r.id for r in registered_backends()] == ["first", "alpha", "zeta"]


def test_broken_and_foreign_entries_are_skipped_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    eps = [
        _FakeEP("boom", ImportError("no module")),
        _FakeEP("odd", 42),
        _FakeEP("dup", A),
        _FakeEP("a", A),
    ]
    _patch(monkeypatch, eps)
    with caplog.at_level(logging.WARNING, logger="vyre_async.registry"):
        assert [r.id for r in registered_backends()] == ["zeta"]
    text = caplog.text
    assert "boom" in text and "odd" in text and "duplicate" in text


def test_factory_paths_load_lazily() -> None:
    import json

    assert A.load_factory() is json.loads
    assert C.load_factory()() == 1
    with pytest.raises(ValueError, match="module:callable"):
        BackendRegistration(id="x", factory="nocolon")
    with pytest.raises(ValueError, match="non-empty"):
        BackendRegistration(id="", factory="json:loads")
    with pytest.raises(TypeError, match="not callable"):
        BackendRegistration(id="x", factory="json:__doc__").load_factory()


def test_real_entry_point_group_is_queried() -> None:
    assert isinstance(registered_backends(), list)
    assert all(
        isinstance(ep, EntryPoint) for ep in registry.entry_points(group="vyre_async.backends")
    )
