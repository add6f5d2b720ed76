"""Wheel tags: the interpreter tag of a job's Python and the platform tags a factory wheel may carry."""

from __future__ import annotations

import pytest

from factory.tags import is_linux_platform, python_tag


def test_python_tag() -> None:
    assert python_tag("3.11") == "cp311"
    assert python_tag("3.13.1") == "cp313"
    assert python_tag(" 3.9 ") == "cp39"


@pytest.mark.parametrize("bad", ["py3", "3", "", "3.x", "three.eleven"])
def test_python_tag_refuses_other_versions(bad: str) -> None:
    with pytest.raises(ValueError, match=r"is not like 3\.11"):
        python_tag(bad)


@pytest.mark.parametrize(
    ("platform", "ok"),
    [
        ("linux_x86_64", True),
        ("manylinux_2_28_x86_64", True),
        ("manylinux2014_x86_64", True),
        ("manylinux_2_28_aarch64", False),
        ("linux_aarch64", False),
        ("musllinux_1_2_x86_64", False),
        ("macosx_11_0_arm64", False),
        ("any", False),
    ],
)
def test_linux_platforms(platform: str, ok: bool) -> None:
    assert is_linux_platform(platform) is ok


def test_other_machines() -> None:
    assert is_linux_platform("manylinux_2_28_aarch64", "aarch64")
    assert not is_linux_platform("linux_x86_64", "aarch64")
