"""`factory rebuild`, its pure parts: the rebuild section, the work directory, the verdict."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from factory.build import rebuild
from factory.core.errors import CheckError, ConfigError
from factory.wheel import wheeldiff

MATRIX: dict[str, Any] = {
    "package": {"name": "demo", "version": "1.0", "source": {"path": "demo-ext"}},
    "recipe": "demo",
    "matrix": {"cuda": ["13.0"], "torch": ["2.14"], "python": ["3.11"], "cxx11_abi": [True], "arch": ["8.0"]},
    "build": {"flavor": "pypi", "cache": False},
}


def test_the_rebuild_section_gives_the_job_and_a_copy_of_its_document() -> None:
    job, matrix = rebuild.rebuild_section({"rebuild": {"job": "j", "matrix": MATRIX, "needs": []}}, "w.whl")
    assert job == "j" and matrix == MATRIX and matrix is not MATRIX


@pytest.mark.parametrize(
    "document",
    [{}, {"rebuild": []}, {"rebuild": {"job": "", "matrix": {}}}, {"rebuild": {"job": "j", "matrix": "x"}}],
)
def test_a_provenance_without_a_usable_rebuild_section_is_a_config_error(document: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"w\.whl"):
        rebuild.rebuild_section(document, "w.whl")


def test_a_path_source_is_a_name_beside_the_document() -> None:
    assert rebuild.path_source(MATRIX) == PurePosixPath("demo-ext")
    assert rebuild.path_source({**MATRIX, "package": {"source": "pypi"}}) is None
    for hostile in ("/etc", "../up", "a/../../b", ".", ""):
        with pytest.raises(ConfigError, match="not a directory name"):
            rebuild.path_source({"package": {"source": {"path": hostile}}})


def test_the_cache_option() -> None:
    assert rebuild.with_cache(MATRIX, "off") == (MATRIX, "off")
    assert rebuild.with_cache(MATRIX, "/srv/cache") == (MATRIX, "/srv/cache")
    local, override = rebuild.with_cache(MATRIX, "local")
    assert override is None and local["build"] == {"flavor": "pypi", "cache": True}
    assert MATRIX["build"]["cache"] is False  # the given document is left as it is


def test_the_work_directory_holds_the_document_and_a_link_to_the_source(tmp_path: Path) -> None:
    src = tmp_path / "elsewhere"
    (src / "csrc").mkdir(parents=True)
    (src / "csrc" / "a.cu").write_text("//\n")
    work = tmp_path / "work"
    path = rebuild.write_workdir(work, MATRIX, source=src, source_name=PurePosixPath("demo-ext"))
    assert json.loads(path.read_text()) == MATRIX
    assert (work / "demo-ext").resolve() == src.resolve()  # the compile cache's domain of that directory
    rebuild.write_workdir(work, MATRIX, source=src, source_name=PurePosixPath("demo-ext"))  # again: kept
    (work / "demo-ext").unlink()
    (work / "demo-ext").mkdir()
    with pytest.raises(ConfigError, match="no link"):
        rebuild.write_workdir(work, MATRIX, source=src, source_name=PurePosixPath("demo-ext"))
    with pytest.raises(ConfigError, match="--source DIR"):
        rebuild.write_workdir(work, MATRIX, source=None, source_name=PurePosixPath("demo-ext"))
    with pytest.raises(ConfigError, match="not a directory"):
        rebuild.write_workdir(work, MATRIX, source=tmp_path / "none", source_name=PurePosixPath("demo-ext"))


def wheel_with(path: Path, provenance: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as out:
        out.writestr("demo-1.0.dist-info/factory-provenance.json", json.dumps(provenance))
    return path


def test_a_provenance_difference_is_named_by_its_field(tmp_path: Path) -> None:
    a = wheel_with(
        tmp_path / "a" / "w.whl", {"format": 1, "job": {"id": "j"}, "cache": {"compile_cache": "off"}}
    )
    b = wheel_with(
        tmp_path / "b" / "w.whl", {"format": 1, "job": {"id": "j"}, "cache": {"compile_cache": "local"}}
    )
    found = wheeldiff.compare_wheels(a, b)
    assert found is not None
    explained = rebuild.explain(found, a, b)
    assert (
        explained.line()
        == "demo-1.0.dist-info/factory-provenance.json: provenance.cache.compile_cache differs"
    )
    other = wheeldiff.Difference(member="demo/_C.so", what="ELF section .text differs at byte 3 of 9")
    assert rebuild.explain(other, a, b) is other


def test_the_verdict_in_one_line_and_json() -> None:
    same = rebuild.RebuildResult(
        wheel="w.whl", job_id="j", sha256="ab", rebuilt="/x/w.whl", rebuilt_sha256="ab", difference=None
    )
    assert same.ok and same.line() == "w.whl: rebuilt bit for bit (sha256 ab)"
    differs = rebuild.RebuildResult(
        wheel="w.whl", job_id="j", sha256="ab", rebuilt="/x/w.whl", rebuilt_sha256="cd",
        difference=wheeldiff.Difference(member="demo/_C.so", what="content differs at byte 7"),
    )  # fmt: skip
    assert not differs.ok
    assert differs.line() == "w.whl: the rebuild differs: demo/_C.so: content differs at byte 7"
    assert differs.to_json()["difference"] == {"member": "demo/_C.so", "what": "content differs at byte 7"}
    failed = rebuild.RebuildResult(
        wheel="w.whl",
        job_id="j",
        sha256="ab",
        rebuilt=None,
        rebuilt_sha256=None,
        difference=None,
        failure="x",
    )
    assert not failed.ok and failed.line() == "w.whl: the rebuild of j failed: x"


def test_rebuild_of_a_wheel_without_provenance_is_one_line(tmp_path: Path) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as out:
        out.writestr("demo-1.0.dist-info/RECORD", "")
    with pytest.raises(CheckError, match=r"factory-provenance\.json") as info:
        rebuild.rebuild_and_compare(str(wheel), rebuild.RebuildOptions(), log=lambda _line: None)
    assert "\n" not in str(info.value)
