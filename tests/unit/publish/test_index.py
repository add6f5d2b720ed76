"""Conformance of the generated pages: PEP 503, 629, 658/714, 691 and 700, one rule per test."""

from __future__ import annotations

import json

import pytest

from factory.core import simpleapi
from factory.publish import humanpage, index
from factory.publish.index import FileRecord, MatrixCell

VID = "cu130-torch2.14-abi1-sm80.90"
FN = "flash_attn-2.8.3+cu13.0.torch2.14.abi1.sm80.90-cp311-cp311-linux_x86_64.whl"


def rec(filename: str = FN, sha: str = "a" * 64, **kw: object) -> FileRecord:
    fields: dict[str, object] = {
        "filename": filename,
        "sha256": sha,
        "size": 123,
        "upload_time": "2025-01-02T03:04:05.000000Z",
        "requires_python": ">=3.9",
        "metadata_sha256": "b" * 64,
    }
    fields.update(kw)
    return FileRecord(**fields)  # type: ignore[arg-type]


def anchors_of(page: str) -> tuple[simpleapi.Anchor, ...]:
    return simpleapi.parse_anchors(page)


def test_href_percent_encodes_plus_and_points_at_files() -> None:
    (a,) = anchors_of(index.project_html("flash-attn", [rec()], variant_id=VID))
    url, _, frag = a.href.partition("#")
    assert "+" not in url
    assert url == f"../../../files/{VID}/" + FN.replace("+", "%2B")
    assert frag == "sha256=" + "a" * 64
    assert a.text == FN


def test_requires_python_is_escaped_and_parses_back() -> None:
    page = index.project_html("x", [rec(requires_python=">=3.9,<4")], variant_id=VID)
    assert 'data-requires-python="&gt;=3.9,&lt;4"' in page
    assert anchors_of(page)[0].attrs["data-requires-python"] == ">=3.9,<4"


def test_core_metadata_and_legacy_attribute_are_equal() -> None:
    (a,) = anchors_of(index.project_html("x", [rec()], variant_id=VID))
    assert a.attrs["data-core-metadata"] == "sha256=" + "b" * 64
    assert a.attrs["data-dist-info-metadata"] == a.attrs["data-core-metadata"]


def test_no_metadata_attributes_without_metadata_file() -> None:
    (a,) = anchors_of(index.project_html("x", [rec(metadata_sha256=None)], variant_id=VID))
    assert "data-core-metadata" not in a.attrs and "data-dist-info-metadata" not in a.attrs


def test_html_declares_repository_version_and_normalised_name() -> None:
    page = index.project_html("Flash_Attn", [rec()], variant_id=VID)
    assert '<meta name="pypi:repository-version" content="1.1">' in page
    assert "<title>Links for flash-attn</title>" in page


def test_json_api_version_and_pep700_fields() -> None:
    doc = json.loads(index.project_json("Flash_Attn", [rec()], variant_id=VID))
    assert doc["meta"] == {"api-version": "1.1"}
    assert doc["name"] == "flash-attn"
    assert doc["versions"] == ["2.8.3+cu13.0.torch2.14.abi1.sm80.90"]
    (f,) = doc["files"]
    assert f["size"] == 123
    assert f["upload-time"] == "2025-01-02T03:04:05.000000Z"
    assert f["hashes"] == {"sha256": "a" * 64}
    assert f["requires-python"] == ">=3.9"
    assert "%2B" in f["url"] and "+" not in f["url"]


def test_json_has_core_metadata_never_dist_info_metadata() -> None:
    text = index.project_json(
        "x",
        [rec(), rec("x-1.0+cu13.0.torch2.14.abi1.sm80-py3-none-any.whl", metadata_sha256=None)],
        variant_id=VID,
    )
    assert "dist-info-metadata" not in text
    files = json.loads(text)["files"]
    assert [f["core-metadata"] for f in files] == [{"sha256": "b" * 64}, False]


def test_json_versions_sorted_by_pep440_and_unique() -> None:
    recs = [
        rec("p-1.10.0+cu13.0.torch2.14.abi1.sm80-py3-none-any.whl"),
        rec("p-1.9.0+cu13.0.torch2.14.abi1.sm80-py3-none-any.whl"),
        rec("p-1.9.0+cu13.0.torch2.14.abi1.sm80-py2.py3-none-any.whl", sha="c" * 64),
    ]
    doc = json.loads(index.project_json("p", recs, variant_id=VID))
    assert doc["versions"] == ["1.9.0+cu13.0.torch2.14.abi1.sm80", "1.10.0+cu13.0.torch2.14.abi1.sm80"]


def test_json_round_trips_records() -> None:
    recs = (
        rec(),
        rec("flash_attn-2.8.3+cu13.0.torch2.14.abi1.sm80.90-cp312-cp312-linux_x86_64.whl", sha="d" * 64),
    )
    back = index.records_from_project_json(index.project_json("flash-attn", recs, variant_id=VID))
    assert sorted(back) == sorted(recs)


def test_merge_records_union_and_noop() -> None:
    a, b = (
        rec(),
        rec("flash_attn-2.8.3+cu13.0.torch2.14.abi1.sm80.90-cp312-cp312-linux_x86_64.whl", sha="d" * 64),
    )
    assert index.merge_records([a], [b]) == (a, b)
    assert index.merge_records([a, b], [b]) is None
    # the published record keeps its upload time
    assert index.merge_records([a], [b, rec(upload_time="2030-01-01T00:00:00.000000Z")]) == (a, b)


def test_merge_records_refuses_same_name_other_hash() -> None:
    with pytest.raises(index.RecordConflict, match="already listed"):
        index.merge_records([rec()], [rec(sha="f" * 64)])


def test_changed_projects_is_incremental() -> None:
    other = rec("other-1.0+cu13.0.torch2.14.abi1.sm80-py3-none-any.whl")
    existing = {"flash-attn": (rec(),), "other": (other,)}
    new_fa = rec("flash_attn-2.8.3+cu13.0.torch2.14.abi1.sm80.90-cp312-cp312-linux_x86_64.whl", sha="d" * 64)
    changed = index.changed_projects(existing, [rec(), other, new_fa])
    assert list(changed) == ["flash-attn"]
    assert len(changed["flash-attn"]) == 2
    assert index.changed_projects(existing, [rec(), other]) == {}


def test_variant_root_lists_normalised_projects_with_dir_links() -> None:
    page = index.variant_root_html(["Flash_Attn", "flash-attn", "b"])
    assert [(a.href, a.text) for a in anchors_of(page)] == [("b/", "b"), ("flash-attn/", "flash-attn")]
    doc = json.loads(index.variant_root_json(["Flash_Attn"]))
    assert doc == {"meta": {"api-version": "1.1"}, "projects": [{"name": "flash-attn"}]}


def test_top_root_lists_variant_indexes() -> None:
    page = index.top_root_html([VID, "cu128-torch2.10-abi0-sm80"])
    assert [a.href for a in anchors_of(page)] == ["cu128-torch2.10-abi0-sm80/", f"{VID}/"]
    assert index.variant_ids_from_top_root_json(index.top_root_json([VID])) == (VID,)


def test_merge_names() -> None:
    assert index.merge_names(["a"], ["a"]) is None
    assert index.merge_names(["b"], ["a"]) == ("a", "b")


def test_python_of_wheel() -> None:
    assert index.python_of_wheel(FN) == "3.11"
    assert index.python_of_wheel("x-1.0-py3-none-any.whl") == "py3"


def test_matrix_cells_statuses() -> None:
    jobs = [
        {"job_id": f"{VID}-py311", "variant_id": VID, "python": "3.11", "result": "ok", "wheel": FN},
        {"job_id": "j2", "variant_id": VID, "python": "3.12", "result": "oom", "wheel": None},
        {
            "job_id": "j3",
            "variant_id": "cu128-torch2.10-abi1-sm80",
            "python": "3.11",
            "result": "skipped",
            "wheel": None,
        },
    ]
    cells = index.matrix_cells(jobs, [(VID, rec())])
    by = {(c.variant_id, c.python): c for c in cells}
    assert by[(VID, "3.11")].status == "built"
    assert by[(VID, "3.12")] == MatrixCell(
        project="flash-attn", variant_id=VID, python="3.12", status="failed", detail="oom"
    )
    assert by[("cu128-torch2.10-abi1-sm80", "3.11")].status == "not built"


def test_a_failed_cell_keeps_its_build_records_key() -> None:
    key = index.failed_record_path(VID, "j2", "ab" * 32)
    assert key == f"_builds/{VID}/j2-{'ab' * 8}.build.json"
    assert index.parse_failed_record_key(key) == (VID, "j2")
    assert index.parse_page_key(key) is None and index.parse_wheel_key(key) is None  # on no PEP 503 page
    jobs = [
        {"job_id": "j2", "variant_id": VID, "python": "3.12", "result": "oom", "wheel": None},
        {"job_id": "j3", "variant_id": VID, "python": "3.13", "result": "skipped", "wheel": None},
    ]
    cells = index.matrix_cells(jobs, [], project_hint="p", failed_records={"j2": key, "j3": key})
    assert [(c.status, c.record) for c in cells] == [("failed", key), ("not built", "")]
    assert index.cells_from_json(index.cells_to_json(cells)) == cells
    page = humanpage.human_page(cells)
    assert f'failed: oom <a href="{key}">build record</a></td>' in page


@pytest.mark.parametrize(
    "key",
    [
        "_builds/v/j.build.json",  # no hash
        "_builds/v/j-ABABABABABABABAB.build.json",
        "_builds/../j-abababababababab.build.json",
        "_builds/v/x/j-abababababababab.build.json",
        "files/v/j-abababababababab.build.json",
        "_builds/v/j-abababababababab.json",
        "javascript:alert(1)//_builds/v/j-abababababababab.build.json",
    ],
)
def test_only_failed_record_keys_parse_and_a_cell_takes_no_other(key: str) -> None:
    assert index.parse_failed_record_key(key) is None
    cell = MatrixCell(project="p", variant_id=VID, python="3.12", status="failed", detail="oom", record=key)
    with pytest.raises(index.DamagedState, match="is not a failed job's build record key"):
        index.cells_from_json(index.cells_to_json([cell]))


def test_failed_record_path_refuses_what_cannot_be_a_key() -> None:
    for variant_id, job_id in (("..", "j"), (VID, "../j"), (VID, ""), ("a/b", "j")):
        with pytest.raises(ValueError):
            index.failed_record_path(variant_id, job_id, "ab" * 32)


def test_matrix_ok_but_unpublished_is_not_built() -> None:
    jobs = [{"variant_id": VID, "python": "3.11", "result": "ok", "wheel": FN}]
    (cell,) = index.matrix_cells(jobs, [])
    assert (cell.status, cell.detail) == ("not built", "not published")


def test_merge_cells_built_is_sticky_and_later_reports_win() -> None:
    built = MatrixCell(project="p", variant_id=VID, python="3.11", status="built", detail=FN)
    failed = MatrixCell(project="p", variant_id=VID, python="3.11", status="failed", detail="oom")
    other = MatrixCell(project="p", variant_id=VID, python="3.12", status="failed", detail="failed")
    assert index.merge_cells([built], [failed]) is None
    assert index.merge_cells([failed], [built]) == (built,)
    assert index.merge_cells([built], [other]) == (built, other)
    assert index.cells_from_json(index.cells_to_json([built, other])) == (built, other)


def test_human_page_grid_and_install_commands() -> None:
    cells = [
        MatrixCell(project="flash-attn", variant_id=VID, python="3.11", status="built", detail=FN),
        MatrixCell(project="flash-attn", variant_id=VID, python="3.12", status="failed", detail="oom"),
        MatrixCell(
            project="flash-attn",
            variant_id="cu128-torch2.10-abi1-sm80",
            python="3.12",
            status="failed",
            detail="failed",
        ),
    ]
    page = humanpage.human_page(cells)
    assert page.count('class="built"') == 1
    assert page.count('class="failed"') == 2
    assert page.count('class="not-built"') == 1  # cu128 x 3.11: in the grid, never built
    # the project pinned to the release built, from its variant index alone; torch pinned beside it
    version = FN.split("-")[1]
    assert (
        f"pip install --only-binary flash-attn --index-url simple/{VID}/ --extra-index-url "
        "https://download.pytorch.org/whl/cu130 --extra-index-url https://pypi.org/simple "
        f"&#x27;torch==2.14.*&#x27; flash-attn=={version}</code>" in page
    )
    assert (
        f"uv pip install --only-binary flash-attn --index-strategy first-index --index simple/{VID}/ "
        "--index https://download.pytorch.org/whl/cu130 --default-index https://pypi.org/simple "
        f"&#x27;torch==2.14.*&#x27; flash-attn=={version}</code>" in page
    )
    # a variant with nothing built gets no install command
    assert "simple/cu128-torch2.10-abi1-sm80/" not in page
    # the newest release built of a variant is the one pinned; a detail that is no wheel name pins nothing
    newer = MatrixCell(
        project="flash-attn",
        variant_id=VID,
        python="3.12",
        status="built",
        detail=FN.replace("2.8.3", "2.8.4"),
    )
    assert f"flash-attn=={version.replace('2.8.3', '2.8.4')}</code>" in humanpage.human_page([*cells, newer])
    junk = humanpage.human_page(
        [MatrixCell(project="x", variant_id=VID, python="3.11", status="built", detail="$(x)")]
    )
    assert "<code data-index" not in junk
