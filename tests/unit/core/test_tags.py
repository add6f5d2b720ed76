"""Wheel tags: the interpreter tag of a job's Python and the manylinux platform tags."""

from __future__ import annotations

import pytest

from factory.core.tags import manylinux_tag, parse_glibc, parse_manylinux, python_tag


def test_python_tag() -> None:
    assert python_tag("3.11") == "cp311"
    assert python_tag("3.13.1") == "cp313"
    assert python_tag(" 3.9 ") == "cp39"


@pytest.mark.parametrize("bad", ["py3", "3", "", "3.x", "three.eleven"])
def test_python_tag_refuses_other_versions(bad: str) -> None:
    with pytest.raises(ValueError, match=r"is not like 3\.11"):
        python_tag(bad)


@pytest.mark.parametrize(
    ("platform", "parsed"),
    [
        ("manylinux_2_34_x86_64", ((2, 34), "x86_64")),
        ("manylinux_2_28_aarch64", ((2, 28), "aarch64")),
        ("manylinux2014_x86_64", ((2, 17), "x86_64")),
        ("manylinux2010_x86_64", ((2, 12), "x86_64")),
        ("manylinux1_x86_64", ((2, 5), "x86_64")),
        ("linux_x86_64", None),
        ("musllinux_1_2_x86_64", None),
        ("manylinux2015_x86_64", None),
        ("macosx_11_0_arm64", None),
        ("any", None),
    ],
)
def test_manylinux_platforms(platform: str, parsed: tuple[tuple[int, int], str] | None) -> None:
    assert parse_manylinux(platform) == parsed


def test_manylinux_tag_round_trips() -> None:
    assert manylinux_tag((2, 34), "x86_64") == "manylinux_2_34_x86_64"
    assert parse_manylinux(manylinux_tag((2, 5), "aarch64")) == ((2, 5), "aarch64")


@pytest.mark.parametrize(
    ("text", "glibc"), [("2.36", (2, 36)), (" 2.17 ", (2, 17)), ("2.31.9", (2, 31)), ("2", None), ("", None)]
)
def test_parse_glibc(text: str, glibc: tuple[int, int] | None) -> None:
    assert parse_glibc(text) == glibc
