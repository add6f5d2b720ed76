"""`factory index check` (factory.publish.indexcheck) on a local-directory index: a whole index passes, each
kind of
damage is named, planned jobs not published show as "not built" without hiding what a report said."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from test_ci_plan import _demo, _wheel

from factory.core.errors import ConfigError
from factory.plan.plan import plan_matrix
from factory.publish import index
from factory.publish.index import MatrixCell
from factory.publish.indexcheck import add_absent, check_index, check_published
from factory.publish.publisher import publish_wheels
from factory.spec.config import load_matrix_file

Cli = Callable[[list[str]], tuple[int, str]]
TAG = "cp311-cp311-linux_x86_64"


def _published(tmp_path: Path) -> tuple[Path, list, str]:
    mf = load_matrix_file(_demo(tmp_path), trust_paths=True)
    jobs = list(plan_matrix(mf).jobs)
    wheel = _wheel(tmp_path / "w", mf.package.name, jobs[0].variant.full_version, "cp311-cp311-linux_x86_64")
    publish_wheels([wheel], to=mf.publish.to)
    return Path(mf.publish.to), jobs, mf.package.name


def test_a_whole_index_passes_and_the_grid_shows_what_is_not_built(tmp_path: Path) -> None:
    to, jobs, project = _published(tmp_path)
    result = check_index(to=str(to))
    assert result.ok and result.wheels == 1 and result.missing == () and result.pages_written == ()
    result = check_index(to=str(to), jobs=jobs, project=project)
    assert result.ok, result.problems
    assert result.missing == (jobs[1].id,)
    assert result.pages_written == ("matrix.json", "index.html")
    cells = {(c.variant_id, c.status) for c in index.cells_from_json((to / "matrix.json").read_bytes())}
    assert cells == {(jobs[0].variant.id, "built"), (jobs[1].variant.id, "not built")}
    again = check_index(to=str(to), jobs=jobs, project=project)
    assert again.ok and again.pages_written == ()


def test_each_kind_of_damage_is_named(tmp_path: Path) -> None:
    to, jobs, _project = _published(tmp_path)
    vid = jobs[0].variant.id
    (wheel,) = (to / "files" / vid).glob("*.whl")
    wheel.write_bytes(wheel.read_bytes() + b"x")
    stray = to / "files" / vid / wheel.name.replace("0.1.0", "0.0.9")
    stray.write_bytes(b"never listed")
    (to / "simple" / "index.html").write_text("<html>stale</html>")
    result = check_index(to=str(to))
    assert set(result.problems) == {
        f"files/{vid}/{wheel.name}: not the file its page lists (size or sha256 differ)",
        f"files/{vid}/{stray.name}: on no page, and no page may list it (cannot read wheel (File is not a "
        "zip file))",
        "simple/index.html: not the rendering of its state",
    }
    wheel.unlink()
    (to / "matrix.json").write_text(json.dumps({"cells": "no"}))
    problems = check_index(to=str(to)).problems
    assert f"files/{vid}/{wheel.name}: listed but missing" in problems
    assert any(p.startswith("matrix.json: damaged (") for p in problems), problems


def test_an_empty_destination_is_no_problem(tmp_path: Path) -> None:
    (tmp_path / "index").mkdir()
    result = check_index(to=str(tmp_path / "index"))
    assert result.ok and result.wheels == 0


def test_add_absent_keeps_what_a_report_said() -> None:
    failed = MatrixCell(project="p", variant_id="v", python="3.11", status="failed", detail="oom")
    planned = MatrixCell(
        project="p", variant_id="v", python="3.11", status="not built", detail="not published"
    )
    other = MatrixCell(project="p", variant_id="w", python="3.11", status="not built", detail="not published")
    assert add_absent([failed], [planned]) is None
    assert add_absent([failed], [planned, other]) == (failed, other)


def test_the_advice_for_files_repair_leaves_alone_works(tmp_path: Path, factory_cli: Cli) -> None:
    """A file repair will not list (not a wheel filename, another spelling, not a zip) is named with why, and
    the advice is to remove it, not to run a repair that leaves it there; a wheel repair can list is still
    advised to repair, which then lists it."""
    to, jobs, project = _published(tmp_path)
    vid = jobs[0].variant.id
    directory = to / "files" / vid
    (published,) = directory.glob("*.whl")
    other_spelling = published.name.replace("factory_demo_ext", "Factory_Demo_Ext")
    not_a_zip = published.name.replace("0.1.0", "0.0.9")
    strays = {
        directory / "notes.whl": (b"notes", "not a wheel filename"),
        directory / other_spelling: (published.read_bytes(), "not the canonical spelling"),
        directory / not_a_zip: (b"not a zip", "cannot read wheel"),
    }
    for stray, (data, _why) in strays.items():
        stray.write_bytes(data)
    for _attempt in range(2):  # before and after a repair: repair changes nothing about them
        code, output = factory_cli(["index", "check", "--to", str(to)])
        assert code == 1, output
        for stray, (_data, why) in strays.items():
            line = f"problem: files/{vid}/{stray.name}: on no page, and no page may list it ({why}"
            assert line in output, output
        assert "remove from the index the 3 file(s) no page may list" in output, output
        assert "factory index repair --to" not in output, output
        assert factory_cli(["index", "repair", "--to", str(to)])[0] == 0
    for stray in strays:
        stray.unlink()
    assert factory_cli(["index", "check", "--to", str(to)])[0] == 0

    newer = _wheel(tmp_path / "w2", project, jobs[0].variant.full_version.replace("0.1.0", "0.2.0"), TAG)
    (directory / newer.name).write_bytes(newer.read_bytes())
    code, output = factory_cli(["index", "check", "--to", str(to)])
    assert code == 1 and f"problem: files/{vid}/{newer.name}: on no page\n" in output, output
    assert f"factory index repair --to {to}" in output and "remove from the index" not in output, output
    assert factory_cli(["index", "repair", "--to", str(to)])[0] == 0
    assert factory_cli(["index", "check", "--to", str(to)])[0] == 0


def test_check_published_needs_an_index_to_check(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--to or --matrix names the index to check"):
        check_published(to=None)
    (tmp_path / "index").mkdir()
    result = check_published(to=str(tmp_path / "index"))
    assert result.ok and result.planned == 0 and result.to == str(tmp_path / "index")


def _two_platforms(tmp_path: Path) -> tuple[Path, list, str]:
    """The demo matrix for both platforms, only the x86_64 wheel of its first variant published."""
    text = _demo(tmp_path).read_text().replace('  arch: ["8.0", "9.0;12.0"]', '  arch: ["9.0"]')
    matrix = tmp_path / "m.yaml"
    matrix.write_text(
        text.replace("  cxx11_abi: [true]\n", "  cxx11_abi: [true]\n  platform: [x86_64, aarch64]\n")
    )
    mf = load_matrix_file(matrix, trust_paths=True)
    jobs = list(plan_matrix(mf).jobs)
    assert [j.platform.name for j in jobs] == ["x86_64", "aarch64"]
    assert jobs[0].variant.id == jobs[1].variant.id  # one variant page lists both platforms' wheels
    wheel = _wheel(tmp_path / "w", mf.package.name, jobs[0].variant.full_version, "cp311-cp311-linux_x86_64")
    publish_wheels([wheel], to=mf.publish.to)
    return Path(mf.publish.to), jobs, mf.package.name


def test_a_missing_aarch64_wheel_is_named_beside_its_published_x86_64_sibling(
    tmp_path: Path, factory_cli: Cli
) -> None:
    to, jobs, project = _two_platforms(tmp_path)
    x86, arm = jobs
    result = check_index(to=str(to), jobs=jobs, project=project)
    assert result.ok, result.problems
    assert result.missing == (arm.id,) and arm.id.endswith("-aarch64")
    # the grid: the x86_64 wheel built, the aarch64 one a cell of its own, not built
    cells = {(c.platform, c.status) for c in index.cells_from_json((to / "matrix.json").read_bytes())}
    assert cells == {("x86_64", "built"), ("aarch64", "not built")}
    code, output = factory_cli(["index", "check", "--matrix", str(tmp_path / "m.yaml"), "--trust-paths"])
    assert code == 0, output
    assert "1 of 2 planned jobs published" in output and f"not published: {arm.id}\n" in output, output
    # its own wheel published beside the x86_64 one: both are listed, nothing is missing
    wheel = _wheel(tmp_path / "w", project, arm.variant.full_version, "cp311-cp311-manylinux_2_28_aarch64")
    publish_wheels([wheel], to=str(to))
    listed = {r.filename for _vid, r in check_index(to=str(to)).listed}
    assert len(listed) == 2 and wheel.name in listed
    again = check_index(to=str(to), jobs=jobs, project=project)
    assert again.ok and again.missing == (), again
    # and the other way round: an index with only the aarch64 wheel misses the x86_64 job
    only_arm = tmp_path / "arm-only"
    publish_wheels([wheel], to=str(only_arm))
    assert check_index(to=str(only_arm), jobs=jobs, project=project).missing == (x86.id,)


@pytest.mark.parametrize(
    "listed",
    [
        "demo-1.0+l-cp311-cp311-manylinux_2_34_x86_64.whl",  # the sibling of the other platform
        "demo-1.0+l-cp311-cp311-manylinux_2_34_aarch64_x86_64.whl",  # a machine glued on: not a tag of ours
        "demo-1.0+l-cp311-cp311-evil_aarch64.whl",  # the suffix, but no Linux tag
        "demo-1.0+l-cp311-cp311-manylinux_2_34_ppc64le.whl",  # a platform the factory does not build
        "demo-1.0+l-cp311-cp311-manylinux_2_34_aarch64.whl.metadata",  # not a wheel name at all
    ],
)
def test_an_index_listing_another_platforms_file_does_not_count_as_the_aarch64_job_s_wheel(
    listed: str,
) -> None:
    """What an index lists is not trusted to stand for a job's wheel by its name alone: only a wheel whose
    platform tag is the job's own counts as published."""
    from factory.core.platforms import named
    from factory.publish.publisher import published_wheel

    aarch64 = named("aarch64")
    assert published_wheel([listed], project="demo", version="1.0+l", python="3.11", platform=aarch64) is None
    ours = "demo-1.0+l-cp311-cp311-manylinux_2_34_aarch64.whl"
    assert (
        published_wheel([listed, ours], project="demo", version="1.0+l", python="3.11", platform=aarch64)
        == ours
    )
