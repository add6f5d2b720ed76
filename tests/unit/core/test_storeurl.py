"""The store URL's one owner (`core.storeurl`): S3 URLs and directories by their spelling, the messages of a
misspelt one, a store under another; and no other module testing a store's scheme."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import factory
from factory.core import storeurl
from factory.core.errors import ConfigError
from factory.core.storeurl import StoreURL, join, parse, parse_s3, s3_url


@pytest.mark.parametrize(
    "url",
    [
        "s3://wheels/../../etc",
        "s3://wheels/a/../b",
        "s3://wheels/./x",
        "s3://wheels/a//b",
        "s3://wheels/a?b=c",
        "s3://wheels/a#b",
        "s3://wheels/a\x00b",
    ],
)
def test_s3_prefixes_that_leave_their_prefix_are_refused(url: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_s3(url)
    assert exc.value.exit_code == 2 and "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("bucket", "why"),
    [
        ("Bad_Bucket!", "lower-case"),
        ("ab", "3 to 63"),
        ("a" * 64, "3 to 63"),
        ("-wheels", "begins and ends"),
        ("wheels.", "begins and ends"),
        ("a..b", "two dots"),
        ("192.168.1.10", "IP address"),
        ("xn--wheels", "reserved"),
        ("wheels-s3alias", "reserved"),
        ("user:SECRET@wheels", "no credentials"),
        ("wheels:9000", "lower-case"),
    ],
)
def test_bucket_names_follow_s3_rules(bucket: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as exc:
        parse_s3(f"s3://{bucket}/x?token=SECRET")
    assert "\n" not in str(exc.value) and "SECRET" not in str(exc.value)


def test_good_s3_urls() -> None:
    assert parse_s3("s3://wheels/team/idx/") == ("wheels", "team/idx")
    assert parse_s3("s3://my.wheels-1") == ("my.wheels-1", "")


def test_parse_s3() -> None:
    assert parse_s3("s3://bucket/a/b/") == ("bucket", "a/b")
    assert parse_s3("s3://bucket") == ("bucket", "")
    with pytest.raises(ConfigError):
        parse_s3("s3:///nobucket")


def test_parse_tells_the_kinds_apart() -> None:
    assert parse("s3://wheels/team/idx/") == StoreURL(
        spelling="s3://wheels/team/idx/", bucket="wheels", prefix="team/idx"
    )
    assert parse("s3://wheels").kind == "s3" and parse("s3://wheels").is_s3
    for directory in ("idx", "./s3:x", "/srv/index", "~/idx"):
        assert parse(directory) == StoreURL(spelling=directory) and parse(directory).kind == "directory"


@pytest.mark.parametrize(
    ("to", "why"),
    [
        ("https://host/idx", "'https://host/idx': use a directory or s3://bucket/prefix"),
        ("s3:/wheels", "'s3:/wheels': an S3 index is s3://bucket/prefix (a directory: ./s3:/wheels)"),
        ("S3:wheels", "'S3:wheels': an S3 index is s3://bucket/prefix"),
        ("s3://Bad_Bucket/x", "s3://bad_bucket/x: bucket 'Bad_Bucket': a bucket name has only lower-case"),
    ],
)
def test_a_misspelt_store_names_the_option(to: str, why: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse(to, what="publish.to")
    assert str(exc.value).startswith(f"publish.to {why}")


def test_a_store_under_another() -> None:
    assert s3_url("wheels") == "s3://wheels" and s3_url("wheels", "p/q") == "s3://wheels/p/q"
    assert join("s3://wheels/p/", "_cache/compile") == "s3://wheels/p/_cache/compile"
    assert join("s3://wheels", "_cache/compile") == "s3://wheels/_cache/compile"
    assert join("./idx/", "_cache/compile") == "idx/_cache/compile"
    assert join("~/idx", "c") == str(Path.home() / "idx" / "c")


def _scheme_tests(tree: ast.AST) -> list[int]:
    """Lines that test a string for a store's scheme: `x.startswith("s3...")`, `== "s3"`, `"s3://" in x`, or
    compose an S3 URL (an f-string beginning `s3://`)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("startswith", "removeprefix") and any(
                isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.lower().startswith("s3")
                for a in node.args
            ):
                found.append(node.lineno)
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Constant) and o.value in ("s3", "s3://", "s3:") for o in operands):
                found.append(node.lineno)
        elif isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and str(first.value).startswith("s3://"):
                found.append(node.lineno)
    return found


def test_no_other_module_tests_a_store_scheme() -> None:
    root = Path(factory.__file__).parent
    owner = Path(storeurl.__file__).resolve()
    offenders = [
        f"{path.relative_to(root)}:{line}"
        for path in sorted(root.rglob("*.py"))
        if path.resolve() != owner
        for line in _scheme_tests(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert offenders == []
