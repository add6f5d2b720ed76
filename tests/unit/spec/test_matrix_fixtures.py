"""The demo and memext matrices the benchmarks and integration tests write, from one fixture file each
(`bench.matrices`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.matrices import DEMO, MEMEXT, matrix_text, write_matrix
from factory.spec.config import load_matrix_file


@pytest.mark.parametrize("fixture", [DEMO, MEMEXT])
def test_each_fixture_is_a_matrix_file(fixture: Path) -> None:
    mf = load_matrix_file(fixture)
    assert mf.package.source.path is not None and mf.package.source.path.is_dir()


def test_a_written_matrix_has_its_changes_and_the_fixture_s_rest(tmp_path: Path) -> None:
    include = [{"arch": "8.0", "env": {"MEMEXT_SCALE": "half"}}]
    path = write_matrix(
        MEMEXT,
        tmp_path / "m.yaml",
        matrix={"python": ["3.13", "3.14"], "include": include},
        build={"memory": "8GiB", "cpus": None, "max_attempts": 2, "cache": str(tmp_path / "store")},
    )
    mf = load_matrix_file(path, trust_paths=True)
    fixture = load_matrix_file(MEMEXT)
    assert (
        mf.matrix.axes["python"] == ("3.13", "3.14") and mf.matrix.axes["arch"] == fixture.matrix.axes["arch"]
    )
    assert [dict(e.values) for e in mf.matrix.include] == [{"arch": "8.0", "env": {"MEMEXT_SCALE": "half"}}]
    assert (mf.build.memory, mf.build.max_attempts, mf.build.cache) == (8 * 2**30, 2, str(tmp_path / "store"))
    assert mf.build.cpus is None and fixture.build.cpus == 2
    assert mf.recipe == fixture.recipe and mf.package.source == fixture.package.source


def test_a_section_given_none_is_left_out(tmp_path: Path) -> None:
    assert "publish:" in DEMO.read_text() and "publish:" not in matrix_text(DEMO, publish=None)
    mf = load_matrix_file(write_matrix(DEMO, tmp_path / "m.yaml", publish=None), trust_paths=True)
    assert mf.publish == type(mf.publish)()
    elsewhere = write_matrix(DEMO, tmp_path / "e.yaml", publish={"to": str(tmp_path / "idx")})
    assert load_matrix_file(elsewhere, trust_paths=True).publish.to == str(tmp_path / "idx")


def test_the_source_is_absolute_unless_kept_or_given(tmp_path: Path) -> None:
    assert f"path: {DEMO.parent / 'demo-ext'}" in matrix_text(DEMO)
    assert "{path: demo-ext}" in matrix_text(DEMO, absolute_source=False)
    assert f"path: {tmp_path}" in matrix_text(DEMO, source=tmp_path)
