"""Strict JSON's one owner (`core.strictjson`): what `loads` refuses, and the one shape checker every format
declares its document to (`shape_problem`); no other module reading JSON with its own hooks or walking a
document's keys by hand."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import factory
from factory.core import strictjson
from factory.core.strictjson import StrictJSONError, loads, shape_problem


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\xff\xfe", r"^not UTF-8 \(invalid start byte at byte 0\)$"),
        (b'{"a": NaN}', "^NaN is not JSON$"),
        (b'{"a": -Infinity}', "^-Infinity is not JSON$"),
        (b'{"a": 1, "a": 2}', "^duplicate key 'a'$"),
        (b"[" * 100_000 + b"]" * 100_000, "^nested too deeply$"),
        (b"{", "^Expecting property name"),
        (b"", "^Expecting value"),
    ],
)
def test_loads_refuses_in_one_line(data: bytes, why: str) -> None:
    with pytest.raises(StrictJSONError, match=why) as caught:
        loads(data)
    assert "\n" not in str(caught.value)


def test_loads_reads_json() -> None:
    assert loads(b'{"a": [1, 2.5, null, true, "x"]}') == {"a": [1, 2.5, None, True, "x"]}


SHAPE: dict[str, Any] = {
    "format": int,
    "items": [{"name": str, "size?": int}],
    "note": (str, None),
    "sha": "hex",
}


def _hex(value: Any, shape: Any, where: str) -> str | None:
    assert shape == "hex"
    return None if isinstance(value, str) and value.isalnum() else f"{where} must be hex"


def doc(**changes: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "format": 1,
        "items": [{"name": "a"}, {"name": "b", "size": 3}],
        "note": None,
        "sha": "ab",
    }
    for key, value in changes.items():
        if value is KeyError:
            out.pop(key)
        else:
            out[key] = value
    return out


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (doc(), None),
        (doc(note="x"), None),
        (doc(extra=1), None),  # an open shape
        ([], "d must be a mapping"),
        (doc(format=KeyError), "d.format is missing"),
        (doc(format=True), "d.format must be int, not bool"),
        (doc(format="1"), "d.format must be int, not str"),
        (doc(items={}), "d.items must be a list"),
        (doc(items=[{"name": "a"}, {"size": 1}]), "d.items[1].name is missing"),
        (doc(items=[{"name": "a", "size": 1.5}]), "d.items[0].size must be int, not float"),
        (doc(note=3), "d.note must be str, not int"),
        (doc(sha="a-b"), "d.sha must be hex"),
    ],
)
def test_shape_problem_names_the_first_path(value: Any, problem: str | None) -> None:
    assert shape_problem(value, SHAPE, "d", leaf=_hex) == problem


def test_a_closed_shape_refuses_a_key_it_does_not_name() -> None:
    closed = "is not a field of this format"
    assert shape_problem(doc(), SHAPE, "d", leaf=_hex, closed=closed) is None
    assert shape_problem(doc(zz=1, yy=2), SHAPE, "d", leaf=_hex, closed=closed) == f"d.yy {closed}"
    hostile = doc(**{"k\x1b[31m" + "x" * 100: 1})
    problem = shape_problem(hostile, SHAPE, "d", leaf=_hex, closed=closed) or ""
    assert problem.endswith(closed) and "\x1b" not in problem and len(problem) < 120
    items = doc(items=[{"name": "a", "other": 1}])
    assert shape_problem(items, SHAPE, "d", leaf=_hex, closed=closed) == f"d.items[0].other {closed}"


def test_a_shape_of_its_own_kind_needs_a_leaf() -> None:
    with pytest.raises(TypeError, match="needs a leaf checker"):
        shape_problem("ab", "hex", "d")


def _hand_rolled(tree: ast.AST) -> list[int]:
    """Lines that read JSON with their own hooks, or walk a document's keys by hand (an f-string
    `{where}.{key} is missing`)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and any(
            k.arg in ("object_pairs_hook", "parse_constant") for k in node.keywords
        ):
            found.append(node.lineno)
        elif isinstance(node, ast.JoinedStr) and len(node.values) >= 3:
            dot, tail = node.values[-3], node.values[-1]
            if (
                isinstance(tail, ast.Constant)
                and tail.value == " is missing"
                and isinstance(dot, ast.Constant)
                and str(dot.value).endswith(".")
            ):
                found.append(node.lineno)
    return found


def test_no_other_module_checks_json_by_hand() -> None:
    root = Path(factory.__file__).parent
    owner = Path(strictjson.__file__).resolve()
    offenders = [
        f"{path.relative_to(root)}:{line}"
        for path in sorted(root.rglob("*.py"))
        if path.resolve() != owner
        for line in _hand_rolled(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert offenders == []
