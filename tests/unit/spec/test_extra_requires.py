"""Issue 42 section 2 in the matrix file: recipe.extra_requires (runtime requirements a package's metadata
forgets, added without a patch) and build.check_indexes (the factory's own indexes as a source of the install
check's requirements); checked where the matrix file is read, each refusal one line naming its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from factory.core.errors import ConfigError
from factory.spec.config import load_matrix_file


def recipe_matrix(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(
        'package: {name: torch-spline-conv, version: "1.2.2"}\n'
        "recipe:\n"
        "  name: mine\n"
        "  base: torch-ext\n"
        f"  extra_requires: {extra}\n"
        'matrix: {cuda: ["13.0"], torch: ["2.14"], python: ["3.13"], cxx11_abi: [true], arch: ["8.0"]}\n'
    )
    return path


def test_recipe_extra_requires_loads(tmp_path: Path) -> None:
    mf = load_matrix_file(
        recipe_matrix(tmp_path, '["torch-scatter>=2.1", "six ; python_version >= \'3.9\'"]')
    )
    assert mf.recipe.extra_requires == ("torch-scatter>=2.1", "six ; python_version >= '3.9'")
    assert mf.recipe.env["FORCE_CUDA"] == "1"  # the base's, kept


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('["torch>=2"]', "recipe.extra_requires item 'torch>=2' names torch, which the factory pins"),
        ('["Torch_Spline.Conv"]', "recipe.extra_requires item 'Torch_Spline.Conv' names the package itself"),
        ('["six", "Six>1"]', "recipe.extra_requires names six twice"),
        ('["x @ https://h/x.whl"]', "recipe.extra_requires item 'x @ https://h/x.whl' is a direct URL"),
        (
            '["--index-url=https://h"]',
            "recipe.extra_requires item '--index-url=https://h' is not a requirement",
        ),
        ("six", "recipe.extra_requires must be a list"),
    ],
)
def test_recipe_extra_requires_refusals_name_the_line(tmp_path: Path, extra: str, message: str) -> None:
    path = recipe_matrix(tmp_path, extra)
    with pytest.raises(ConfigError) as exc:
        load_matrix_file(path)
    assert str(exc.value).startswith(f"{path}:5: {message}"), exc.value


def index_matrix(tmp_path: Path, value: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(
        'package: {name: torch-spline-conv, version: "1.2.2"}\n'
        'matrix: {cuda: ["13.0"], torch: ["2.14"], python: ["3.13"], cxx11_abi: [true], arch: ["8.0"]}\n'
        "build:\n"
        f"  check_indexes: {value}\n"
    )
    return path


def test_check_indexes_load_as_simple_urls(tmp_path: Path) -> None:
    mf = load_matrix_file(index_matrix(tmp_path, '["file:///srv/idx/simple", "https://h/idx/simple/"]'))
    assert mf.build.check_indexes == ("file:///srv/idx/simple/", "https://h/idx/simple/")
    assert mf.build.check_index_urls("cu130-torch2.14-abi1-sm80") == (
        "file:///srv/idx/simple/cu130-torch2.14-abi1-sm80/",
        "https://h/idx/simple/cu130-torch2.14-abi1-sm80/",
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('["https://h/idx/"]', "build.check_indexes item 'https://h/idx/' is not an index's simple/ URL"),
        ('["ftp://h/simple/"]', "build.check_indexes item"),
        ('"https://h/simple/"', "build.check_indexes must be a list"),
        ("[" + ", ".join(['"https://h/simple/"'] * 9) + "]", "build.check_indexes: at most 8 indexes"),
    ],
)
def test_bad_check_indexes_are_one_line(tmp_path: Path, value: str, message: str) -> None:
    path = index_matrix(tmp_path, value)
    with pytest.raises(ConfigError) as exc:
        load_matrix_file(path)
    assert str(exc.value).startswith(f"{path}:4: {message}"), exc.value
