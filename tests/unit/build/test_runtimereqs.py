"""A package's runtime requirements from its source's metadata (`factory.build.runtimereqs`), without
setup.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from factory.build import runtimereqs

TORCH_CLUSTER_PKG_INFO = """\
Metadata-Version: 2.1
Name: torch_cluster
Version: 1.6.3
Summary: PyTorch Extension Library of Optimized Graph Cluster Algorithms
Requires-Python: >=3.8
Description-Content-Type: text/markdown
Requires-Dist: scipy
Provides-Extra: test
Requires-Dist: pytest; extra == "test"
Requires-Dist: pytest-cov; extra == "test"
Requires-Dist: tomli; python_version < "3.11"

[![PyPI Version][pypi-image]][pypi-url]
Requires-Dist: body-text-is-not-a-header
"""


def tree(tmp_path: Path, **files: str) -> Path:
    for name, text in files.items():
        (tmp_path / ("PKG-INFO" if name == "PKG_INFO" else name)).write_text(text)
    return tmp_path


def test_requirements_come_from_pkg_info_with_markers_and_extras_evaluated(tmp_path: Path) -> None:
    declared = runtimereqs.declared_requirements(tree(tmp_path, PKG_INFO=TORCH_CLUSTER_PKG_INFO))
    assert declared.where == "PKG-INFO"
    assert declared.requirements == (
        "scipy", 'pytest; extra == "test"', 'pytest-cov; extra == "test"', 'tomli; python_version < "3.11"',
    )  # fmt: skip
    assert runtimereqs.for_job(
        declared.requirements, package="torch-cluster", python="3.13"
    ).requirements == ("scipy",)
    older = runtimereqs.for_job(declared.requirements, package="torch-cluster", python="3.10")
    assert older.requirements == ("scipy", "tomli")


def test_torch_the_package_itself_and_urls_are_left_out() -> None:
    job = runtimereqs.for_job(
        [
            "Torch>=2.0",
            "numpy[extra]>=1.20,<3",
            "torch-cluster[test]",
            "evil @ https://x.example/e.whl",
            "a b c",
        ],
        package="torch_cluster",
        python="3.13",
    )
    assert job.requirements == ("numpy[extra]<3,>=1.20",)
    assert job.left_out == ("evil: a direct URL, which the host does not fetch", "'a b c': not a requirement")


@pytest.mark.parametrize(
    ("files", "why"),
    [
        ({"PKG_INFO": "Metadata-Version: 2.2\nName: x\nVersion: 1\nDynamic: Requires-Dist\n"}, "dynamic"),
        ({"PKG_INFO": "Metadata-Version: 2.1\nName: x\nVersion: 1\n"}, "before 2.2 that may mean setup.py"),
        ({"pyproject.toml": '[project]\nname = "x"\ndynamic = ["dependencies", "version"]\n'}, "dynamic"),
        ({"pyproject.toml": '[build-system]\nrequires = ["setuptools", "torch"]\n'}, "no [project] table"),
        ({}, "no PKG-INFO and no pyproject.toml"),
    ],
)
def test_metadata_that_leaves_them_to_setup_py_says_so(
    tmp_path: Path, files: dict[str, str], why: str
) -> None:
    declared = runtimereqs.declared_requirements(tree(tmp_path, **files))
    assert not declared.known and why in declared.why
    check = runtimereqs.check_wheelhouse(declared, package="x", python="3.13", dest=tmp_path / "wh")
    assert check.path is None and check.requirements == ()
    assert (
        check.note.startswith("runtime requirements not known (") and "build's wheelhouse only" in check.note
    )
    assert not (tmp_path / "wh").exists()  # nothing downloaded


def test_metadata_2_2_without_requires_dist_has_none(tmp_path: Path) -> None:
    declared = runtimereqs.declared_requirements(tree(tmp_path, PKG_INFO="Metadata-Version: 2.2\nName: x\n"))
    assert declared.known and declared.requirements == ()
    check = runtimereqs.check_wheelhouse(declared, package="x", python="3.13", dest=tmp_path / "wh")
    assert check.path is None and check.note == "runtime requirements (PKG-INFO): none"


def test_static_pyproject_dependencies_count_when_there_is_no_pkg_info(tmp_path: Path) -> None:
    text = '[project]\nname = "x"\nversion = "1"\ndependencies = ["six>=1.16", "torch"]\n'
    declared = runtimereqs.declared_requirements(tree(tmp_path, **{"pyproject.toml": text}))
    assert (declared.where, declared.requirements) == ("pyproject.toml", ("six>=1.16", "torch"))


def test_a_pkg_info_that_is_a_link_or_too_big_is_not_read(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("Metadata-Version: 2.2\nRequires-Dist: planted\n")
    src = tmp_path / "src"
    src.mkdir()
    os.symlink(outside, src / "PKG-INFO")
    declared = runtimereqs.declared_requirements(src)
    assert not declared.known and "PKG-INFO: cannot be read" in declared.why
    (src / "PKG-INFO").unlink()
    (src / "PKG-INFO").write_text("Requires-Dist: x\n" * (runtimereqs.MAX_METADATA_BYTES // 10))
    assert "cannot be read" in runtimereqs.declared_requirements(src).why


def test_the_recipes_extra_requires_join_what_the_source_declares() -> None:
    declared = runtimereqs.Declared(requirements=("numpy", "torch-scatter<2", "bad line!"), where="PKG-INFO")
    joined = runtimereqs.with_recipe(declared, ("Torch_Scatter>=2.1", "six"))
    assert joined.requirements == ("numpy", "bad line!", "Torch_Scatter>=2.1", "six")
    assert joined.where == "PKG-INFO and recipe.extra_requires"
    assert runtimereqs.for_job(joined.requirements, package="demo", python="3.13").requirements == (
        "numpy",
        "torch-scatter>=2.1",
        "six",
    )
    assert runtimereqs.with_recipe(declared, ()) is declared
    unknown = runtimereqs.Declared(why="PKG-INFO: Dynamic: Requires-Dist")
    alone = runtimereqs.with_recipe(unknown, ("six",))
    assert alone.known and alone.requirements == ("six",)
    assert (
        alone.where == "recipe.extra_requires; the source's own not known: PKG-INFO: Dynamic: Requires-Dist"
    )
    assert runtimereqs.with_recipe(unknown, ()) is unknown
