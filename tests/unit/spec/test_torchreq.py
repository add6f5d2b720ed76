"""The torch requirement's one owner (`torchreq.torch_requirement`): a wheel's, a stable-ABI wheel's, the
torch installed for a variant; and no other module spelling one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import factory
from factory.spec import torchreq
from factory.spec.torchreq import torch_requirement


@pytest.mark.parametrize(
    ("torch", "pin"),
    [
        ("2.14.1", "torch==2.14.*"),
        ("2.14.1+cu130", "torch==2.14.*"),
        ("2.10", "torch==2.10.*"),
        ("3", "torch==3.0.*"),
    ],
)
def test_a_wheel_requires_every_patch_of_its_minor(torch: str, pin: str) -> None:
    assert str(torch_requirement(torch)) == pin


def test_a_stable_abi_wheel_requires_its_floor_on() -> None:
    assert str(torch_requirement("2.14.1+cu130", stable_abi="2.12")) == "torch>=2.12"


@pytest.mark.parametrize(
    ("torch", "req"),
    [
        ("2.14", "torch==2.14.*"),
        ("2.10", "torch==2.10.*"),
        ("2.14.1", "torch==2.14.1"),
        ("2.10.3", "torch==2.10.3"),
    ],
)
def test_the_torch_installed_is_the_release_as_named(torch: str, req: str) -> None:
    assert str(torch_requirement(torch, exact=True)) == req


@pytest.mark.parametrize(
    "bad", [{"torch": "latest"}, {"torch": "2.10 x", "exact": True}, {"torch": "2", "stable_abi": "x"}]
)
def test_no_version_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="not a PEP 440 version"):
        torch_requirement(**bad)  # type: ignore[arg-type]


def test_a_floor_is_no_torch_to_install() -> None:
    with pytest.raises(ValueError, match="stable-ABI"):
        torch_requirement("2.14", stable_abi="2.12", exact=True)


def _spelled_requirements(tree: ast.AST) -> list[int]:
    """Lines that compose a torch requirement: an f-string or a constant beginning `torch==`/`torch>=`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            text = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else ""
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            continue
        if text.startswith(("torch==", "torch>=", "torch>")):
            found.append(node.lineno)
    return found


def test_no_other_module_spells_a_torch_requirement() -> None:
    root = Path(factory.__file__).parent
    owner = Path(torchreq.__file__).resolve()
    offenders = [
        f"{path.relative_to(root)}:{line}"
        for path in sorted(root.rglob("*.py"))
        if path.resolve() != owner
        for line in _spelled_requirements(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert offenders == []
