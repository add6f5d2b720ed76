"""`factory index check` (factory.indexcheck) on a local-directory index: a whole index passes, each kind of
damage is named, planned jobs not published show as "not built" without hiding what a report said."""

from __future__ import annotations

import json
from pathlib import Path

from test_ci_plan import _demo, _wheel

from factory import index
from factory.config import load_matrix_file
from factory.index import MatrixCell
from factory.indexcheck import add_absent, check_index
from factory.plan import plan_matrix
from factory.publish import publish_wheels


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
        f"files/{vid}/{stray.name}: on no page",
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
