"""factory.core.home: where the factory keeps its state."""

from __future__ import annotations

from pathlib import Path

import pytest

from factory.core.home import factory_home


def test_factory_home_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "state"))
    assert factory_home() == tmp_path / "state"


def test_factory_home_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("FACTORY_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert factory_home() == tmp_path / ".cache" / "wheel-factory"
