"""Pure parts of factory.wheelhouse: platform expansion, the pip command line, cache keys, error lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from factory import wheelhouse
from factory.errors import ConfigError


def test_compatible_platforms_manylinux_2_28() -> None:
    tags = wheelhouse.compatible_platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64"
    for tag in (
        "manylinux_2_27_x86_64",  # triton, numpy
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",  # nvidia-* wheels
        "manylinux2010_x86_64",
        "manylinux_2_5_x86_64",
        "manylinux1_x86_64",
    ):
        assert tag in tags
    assert "manylinux_2_29_x86_64" not in tags
    assert "linux_x86_64" not in tags
    assert len(tags) == len(set(tags))


def test_compatible_platforms_legacy_alias_and_arch() -> None:
    tags = wheelhouse.compatible_platforms("manylinux2014_aarch64")
    assert tags[0] == "manylinux_2_17_aarch64"
    assert "manylinux2014_aarch64" in tags
    assert all(t.endswith("_aarch64") for t in tags)


def test_compatible_platforms_other_platform_is_kept() -> None:
    assert wheelhouse.compatible_platforms("linux_x86_64") == ("linux_x86_64",)


@pytest.mark.parametrize("bad", ["manylinux_2_x_x86_64", "manylinux_3_1_x86_64", "manylinux_2_28"])
def test_compatible_platforms_rejects_bad_tags(bad: str) -> None:
    with pytest.raises(ConfigError):
        wheelhouse.compatible_platforms(bad)


def test_pip_download_args() -> None:
    args = wheelhouse.pip_download_args(
        ["torch==2.14.1", "ninja"],
        Path("/w"),
        python="3.11",
        index_url="https://idx/simple",
        extra_index_urls=["https://more/simple"],
    )
    assert args[:3] == ["-m", "pip", "download"]
    assert args[args.index("--dest") + 1] == "/w"
    assert args[args.index("--python-version") + 1] == "3.11"
    assert "--only-binary=:all:" in args
    platforms = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    assert platforms == list(wheelhouse.compatible_platforms("manylinux_2_28_x86_64"))
    assert args[args.index("--index-url") + 1] == "https://idx/simple"
    assert args[args.index("--extra-index-url") + 1] == "https://more/simple"
    assert args[-2:] == ["torch==2.14.1", "ninja"]


def test_pip_download_args_without_only_binary_targets_the_host() -> None:
    args = wheelhouse.pip_download_args(["x"], Path("/w"), python="3.11", only_binary=False)
    assert "--platform" not in args and "--python-version" not in args
    assert "--index-url" not in args


def test_wheelhouse_key() -> None:
    base = wheelhouse.wheelhouse_key(["a", "b"], python="3.11")
    assert base == wheelhouse.wheelhouse_key(["b", "a"], python="3.11")
    assert base != wheelhouse.wheelhouse_key(["a", "b"], python="3.12")
    assert base != wheelhouse.wheelhouse_key(["a", "b", "c"], python="3.11")
    assert base != wheelhouse.wheelhouse_key(["a", "b"], python="3.11", platform="manylinux_2_17_x86_64")
    assert base != wheelhouse.wheelhouse_key(["a", "b"], python="3.11", index_url="https://x/simple")
    assert base != wheelhouse.wheelhouse_key(["a", "b"], python="3.11", only_binary=False)


def test_last_error_line() -> None:
    out = (
        "Looking in indexes: x\n"
        "ERROR: Could not find a version that satisfies the requirement nope (from versions: none)\n"
        "ERROR: No matching distribution found for nope\n"
        "\n"
    )
    assert wheelhouse.last_error_line(out) == "ERROR: No matching distribution found for nope"
    assert wheelhouse.last_error_line("a\nlast words\n\n") == "last words"
    assert wheelhouse.last_error_line("") == "pip gave no output"


def test_wheel_files_ignores_other_files(tmp_path: Path) -> None:
    (tmp_path / "ninja-1.13.2-py3-none-manylinux2014_x86_64.whl").write_bytes(b"")
    (tmp_path / "broken.whl").write_bytes(b"")
    (tmp_path / "pkg-1.0.tar.gz").write_bytes(b"")
    (tmp_path / "inputs.json").write_text("{}")
    assert [p.name for p in wheelhouse.wheel_files(tmp_path)] == [
        "ninja-1.13.2-py3-none-manylinux2014_x86_64.whl"
    ]


def test_download_wheelhouse_needs_requirements(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        wheelhouse.download_wheelhouse([], tmp_path, python="3.11")
