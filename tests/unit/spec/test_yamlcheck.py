"""factory.spec.yamlcheck: typed checks of YAML values, each failure one FILE:LINE line at the value."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from factory.core.errors import ConfigError
from factory.spec.yamlcheck import Checker, kind, plain
from factory.spec.yamlload import load_yaml

TEXT = """\
name: demo
count: 0
ratio: .nan
flag: "yes"
version: 2.10
env: {GOOD: 1, 9BAD: x}
items: [a, 3]
data: {sub: [1, 2.5, true]}
"""


@pytest.fixture
def check(tmp_path: Path) -> Checker:
    path = tmp_path / "doc.yaml"
    path.write_text(TEXT)
    return Checker(load_yaml(path))


@pytest.mark.parametrize(
    ("call", "line", "message"),
    [
        (lambda c, r: c.integer(r, "count", "count"), 2, "count must be at least 1, not 0"),
        (lambda c, r: c.number(r, "ratio", "ratio"), 3, "ratio must be a finite number, not nan"),
        (lambda c, r: c.boolean(r, "flag", "flag"), 4, "flag must be true or false, not a string 'yes'"),
        (
            lambda c, r: c.string(r, "version", "version"),
            5,
            'version 2.1 must be a quoted string (write "2.10")',
        ),
        (lambda c, r: c.env(r, "env", "env"), 6, "env: '9BAD' is not an environment variable name"),
        (lambda c, r: c.str_list(r, "items", "items"), 7, "items item 3 must be a quoted string"),
        (lambda c, r: c.keys(r, ("name", "count"), "doc"), 3, "unknown key 'ratio' in doc"),
        (lambda c, r: c.mapping(r, "items", "items"), 7, "items must be a mapping, not a list"),
    ],
)
def test_a_bad_value_is_one_line_at_its_line(
    check: Checker, call: Callable[[Checker, Any], object], line: int, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        call(check, check.doc.root)
    assert str(info.value).startswith(f"{check.doc.display}:{line}: {message}"), str(info.value)


def test_good_values_come_back_typed(check: Checker) -> None:
    root = check.doc.root
    assert check.string(root, "name", "name") == "demo"
    assert dict(check.env({"env": {"A": "1"}}, "env", "env")) == {"A": "1"}
    assert plain(root["data"]) == {"sub": [1, 2.5, True]}
    assert [kind(v) for v in (None, True, 1, 1.5, "s", {}, [])] == [
        "null", "a boolean", "an integer", "a number", "a string", "a mapping", "a list",
    ]  # fmt: skip
