"""The human page (factory.publish.humanpage): the install selector's data in the grid, its size, hostile
cells."""

from __future__ import annotations

import re

import pytest

from factory.core import gpus
from factory.core.variants import Arch
from factory.publish import humanpage, index
from factory.publish.index import MatrixCell

VID = "cu130-torch2.14-abi1-sm80.90"
FN = "flash_attn-2.8.3+cu13.0.torch2.14.abi1.sm80.90-cp311-cp311-manylinux_2_28_x86_64.whl"


def built(vid: str, python: str, filename: str, **kw: object) -> MatrixCell:
    return MatrixCell(
        project="flash-attn", variant_id=vid, python=python, status="built", detail=filename, **kw
    )  # type: ignore[arg-type]


def matrix_300() -> list[MatrixCell]:
    """A 300-job matrix, every wheel built, signed, with provenance, SBOM and a build record: 2 CUDA x
    6 torch x 5 arch sets x 5 Pythons."""
    cells = []
    for cuda in ("12.8", "13.0"):
        for torch in ("2.9", "2.10", "2.11", "2.12", "2.13", "2.14"):
            for sm in ("sm80", "sm90", "sm80.90", "sm80.90.100.120", "sm90.100.120"):
                label = f"cu{cuda}.torch{torch}.abi1.{sm}"
                vid = f"cu{cuda.replace('.', '')}-torch{torch}-abi1-{sm}"
                for minor in range(10, 15):
                    cp = f"cp3{minor}"
                    filename = f"flash_attn-2.8.3.post2+{label}-{cp}-{cp}-manylinux_2_28_x86_64.whl"
                    cells.append(
                        built(
                            vid,
                            f"3.{minor}",
                            filename,
                            published="2026-12-07T10:11:12.123456Z",
                            beside=("build-record", "provenance", "sbom", "signature"),
                        )
                    )
    return cells


def test_a_300_job_matrix_stays_under_100_kb() -> None:
    cells = matrix_300()
    assert len(cells) == 300
    page = humanpage.human_page(cells).encode()
    assert len(page) < 100_000, len(page)
    text = page.decode()
    # everything is there: every cell, every variant's two commands, every wheel's link data
    assert text.count('class="built"') == 300
    assert text.count("<details>") == 60 and text.count("uv pip install") == 60
    assert text.count('data-s="bpcs"') == 300


def test_the_page_is_static_and_self_contained() -> None:
    page = humanpage.human_page(matrix_300())
    assert "<script src" not in page and "<link" not in page and "@import" not in page and "url(" not in page
    assert "//" not in re.sub(
        r"https://(download\.pytorch\.org|pypi\.org)/[^ <]*", "", page.split("<script>")[0]
    )


def test_rows_carry_what_the_variant_id_says_and_cells_their_wheel() -> None:
    other = FN.replace("cp311-cp311", "cp312-cp312")
    page = humanpage.human_page(
        [
            built(VID, "3.11", FN, published="2026-01-02T00:00:00Z", beside=("signature",)),
            built(VID, "3.12", other),
            MatrixCell(project="flash-attn", variant_id=VID, python="3.13", status="failed", detail="oom"),
        ]
    )
    row = re.search(r'<tr data-w="files/cu130-torch2.14-abi1-sm80.90/[^>]*>', page)
    assert row is not None
    assert 'data-cu="13.0" data-t="2.14" data-abi="1" data-a="8.0 9.0"' in row.group()
    # the shared start and end of the row's filenames (and machine) on the row, the rest on each cell
    start = f"files/{VID}/" + FN.split("-cp311")[0].replace("+", "%2B") + "-cp31"
    assert f'data-w="{start}" data-x="-manylinux_2_28_x86_64.whl" data-m="x86_64"' in row.group()
    assert '<td class="built" data-f="1-cp311" data-s="s">built 2026-01-02</td>' in page
    assert '<td class="built" data-f="2-cp312">built</td>' in page
    assert '<td class="failed">failed: oom</td>' in page
    # the selector offers what the grid has
    assert '<option value="t:13.0">13.0</option>' in page and '<option value="3.12">3.12</option>' in page
    assert '<option value="H100" label="9.0">' in page


def test_hostile_cells_are_text_and_unparsed_rows_are_not_offered() -> None:
    evil = '"><script>alert(1)</script>.whl'
    page = humanpage.human_page(
        [
            MatrixCell(
                project="<b>x</b>", variant_id="../../etc", python="3.11", status="built", detail=evil
            ),
            MatrixCell(project="y", variant_id=VID, python='"3', status="failed", detail="<img src=x>"),
        ]
    )
    assert "<script>alert" not in page and "<img" not in page and "<b>x" not in page
    # no data-cu: not offered
    assert (
        '<tr data-w="files/..%2F..%2Fetc/" data-x="" data-m="x86_64"><td>../../etc</td><td>x86_64</td>'
        in page
    )
    assert "<details>" not in page  # no wheel name parses: no command


def test_nothing_published() -> None:
    page = humanpage.human_page([])
    assert "Nothing published yet." in page and 'id="pick"' not in page


@pytest.mark.parametrize(
    ("typed", "cc"),
    [("H100", "9.0"), ("rtx5090", "12.0"), ("RTX 5090", "12.0"), ("A100", "8.0"), ("  a100 ", "8.0"),
     ("9.0", "9.0"), ("sm_90", "9.0"), ("120", "12.0"), ("B200", "10.0")],
)  # fmt: skip
def test_gpu_names_and_capabilities(typed: str, cc: str) -> None:
    assert gpus.capability(typed) == Arch.parse(cc)


@pytest.mark.parametrize("typed", ["", "H1000", "9.0a", "sm_100f", "nine"])
def test_not_a_gpu(typed: str) -> None:
    assert gpus.capability(typed) is None


def test_the_gpu_table_is_one_capability_per_name() -> None:
    names = [name.replace(" ", "").lower() for name, _cc in gpus.GPUS]
    assert len(names) == len(set(names))
    for _name, cc in gpus.GPUS:
        assert Arch.parse_dotted(cc).dotted == cc


def test_cells_carry_publication_and_what_is_beside_both_ways() -> None:
    cell = built(VID, "3.11", FN, published="2026-01-02T00:00:00.000000Z", beside=("provenance", "signature"))
    plain = built(VID, "3.12", FN.replace("cp311-cp311", "cp312-cp312"))
    text = index.cells_to_json([cell, plain])
    assert index.cells_from_json(text) == (cell, plain)
    assert text.count('"published"') == 1 and text.count('"beside"') == 1  # written only where known
    bad = text.replace('"signature"', '"../../x"')
    with pytest.raises(index.DamagedState, match="beside"):
        index.cells_from_json(bad)


def test_the_same_wheel_again_keeps_its_date_and_gains_what_is_beside() -> None:
    first = built(VID, "3.11", FN, published="2026-01-01T00:00:00Z", beside=("provenance",))
    again = built(VID, "3.11", FN, published="2026-02-02T00:00:00Z", beside=("signature",))
    merged = index.merge_cells([first], [again])
    assert merged == (
        built(VID, "3.11", FN, published="2026-01-01T00:00:00Z", beside=("provenance", "signature")),
    )
    assert index.merge_cells(merged, [again]) is None


def test_matrix_cells_take_the_upload_time_and_the_files_beside() -> None:
    rec = index.FileRecord(filename=FN, sha256="0" * 64, size=1, upload_time="2026-03-04T05:06:07.000000Z")
    (cell,) = index.matrix_cells(
        [], [(VID, rec)], beside={(VID, FN): ["signature", "nonsense", "sbom", "provenance"]}
    )
    assert (cell.published, cell.beside) == (rec.upload_time, ("provenance", "sbom", "signature"))
    jobs = [{"variant_id": VID, "python": "3.11", "result": "ok", "wheel": FN, "covers": ["3.12"]}]
    cells = index.matrix_cells(jobs, [(VID, rec)], beside={(VID, FN): ["signature"]})
    assert [(c.python, c.beside, c.published) for c in cells] == [
        ("3.11", ("signature",), rec.upload_time),
        ("3.12", ("signature",), rec.upload_time),
    ]


def test_every_file_beside_a_wheel_has_its_link() -> None:
    """The grid's script links each of index.BESIDE's files (the SBOM too) by its suffix."""
    page = humanpage.human_page([built(VID, "3.11", FN, beside=("provenance", "sbom"))])
    assert set(humanpage._BESIDE_LETTERS) == set(index.BESIDE)
    assert 'data-s="pc"' in page and '"c":[".sbom.cdx.json","SBOM"]' in page


def test_the_module_owns_no_command_format() -> None:
    """The script shows a row's commands; it composes none (installcmd's are the only ones on the page)."""
    assert "pip install" not in humanpage._SCRIPT and "--index" not in humanpage._SCRIPT


def test_a_failed_cell_shows_the_jobs_reason_bounded() -> None:
    jobs = [
        {"variant_id": VID, "python": "3.11", "result": "oom", "reason": "killed at 23 GiB\nsecond line"},
        {"variant_id": VID, "python": "3.12", "result": "failed", "reason": "x" * 500 + "\x1b[31m"},
        {"variant_id": VID, "python": "3.13", "result": "failed", "reason": 7},
    ]
    details = [c.detail for c in index.matrix_cells(jobs, [], project_hint="p")]
    assert details == ["oom: killed at 23 GiB", "failed: " + "x" * index.MAX_REASON + "…", "failed"]


ARM = FN.replace("manylinux_2_28_x86_64", "manylinux_2_28_aarch64")


def test_an_aarch64_wheel_is_a_cell_of_its_own_beside_its_x86_64_sibling() -> None:
    """Published beside the x86_64 wheel of the same variant and Python, the aarch64 one loses nothing: each
    is a built cell of its platform, the report's failed aarch64 job (no wheel) a cell of its own too, and
    the grid keeps them all through JSON and merges."""
    recs = [index.FileRecord(filename=f, sha256="0" * 64, size=1, upload_time="t") for f in (FN, ARM)]
    jobs = [
        {"variant_id": VID, "python": "3.11", "result": "ok", "wheel": FN},
        {"variant_id": VID, "python": "3.11", "result": "ok", "wheel": ARM},
        {"variant_id": VID, "python": "3.12", "result": "ok", "wheel": None},  # an older report: x86_64
        {"variant_id": VID, "python": "3.12", "result": "oom", "platform": "aarch64"},
    ]
    cells = index.matrix_cells(jobs, [(VID, r) for r in recs], project_hint="flash-attn")
    assert [(c.python, c.platform, c.status, c.detail) for c in cells] == [
        ("3.11", "aarch64", "built", ARM),
        ("3.11", "x86_64", "built", FN),
        ("3.12", "aarch64", "failed", "oom"),
        ("3.12", "x86_64", "not built", "not published"),
    ]
    text = index.cells_to_json(cells)
    assert text.count('"platform": "aarch64"') == 2 and '"platform": "x86_64"' not in text  # as before
    assert index.cells_from_json(text) == cells
    with pytest.raises(index.DamagedState, match="cell 1: platform 'sparc' is not one of x86_64, aarch64"):
        index.cells_from_json(text.replace('"aarch64"', '"sparc"', 1))
    # a later x86_64-only publish overrides nothing of the aarch64 cells
    again = index.matrix_cells([], [(VID, recs[0])])
    assert index.merge_cells(cells, again) is None
    assert index.merge_cells(cells[2:], again) == (cells[1], cells[2], cells[3])


def test_the_grid_shows_each_platform_and_its_rows_commands_install_its_wheel() -> None:
    """One row per platform, saying which; the aarch64 row's commands pin the newest release built for
    aarch64 (here an older one than x86_64's), which only an aarch64 wheel carries."""
    older_arm = ARM.replace("2.8.3+", "2.8.2+")
    page = humanpage.human_page([built(VID, "3.11", FN), built(VID, "3.11", older_arm, platform="aarch64")])
    assert "<th>variant</th><th>platform</th><th>3.11</th>" in page
    rows = re.findall(r"<tr data-w=[^>]*>.*?</tr>", page)
    assert len(rows) == 2
    x86, arm = rows  # the default platform's row first
    assert 'data-m="x86_64"' in x86 and f"<td>{VID}</td><td>x86_64</td>" in x86
    assert 'data-m="aarch64"' in arm and f"<td>{VID}</td><td>aarch64</td>" in arm
    assert "flash-attn==2.8.3+cu13.0" in x86 and "2.8.2" not in x86
    assert "flash-attn==2.8.2+cu13.0" in arm and "2.8.3" not in arm
    # the selector offers both platforms
    assert '<option value="aarch64">Linux aarch64</option>' in page
    assert '<option value="x86_64">Linux x86_64</option>' in page


def test_the_picker_offers_every_platform_the_factory_builds() -> None:
    """A page of x86_64 wheels only still offers aarch64: a GH200's owner picks it and is told nothing fits,
    with the matrix lines for aarch64, rather than being given an x86_64 wheel's command."""
    page = humanpage.human_page([built(VID, "3.11", FN)])
    options = re.search(r'<select id="platform">(.*?)</select>', page)
    assert options is not None
    assert re.findall(r'value="([^"]*)"', options.group(1)) == ["", "aarch64", "x86_64"]
