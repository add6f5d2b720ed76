"""Golden pages: the exact bytes clients read.

After an intended change, UPDATE_GOLDEN=1 rewrites the pages that differ and fails on each of them, so a
regenerating run never passes: review `git diff tests/golden`, then run again without it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from factory.publish import humanpage, index, site
from factory.publish.index import FileRecord, MatrixCell

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
VID = "cu130-torch2.14-abi1-sm80.90"
RECORDS = (
    FileRecord(
        filename="flash_attn-2.8.3+cu13.0.torch2.14.abi1.sm80.90-cp311-cp311-linux_x86_64.whl",
        sha256="0123456789abcdef" * 4,
        size=123456789,
        upload_time="2025-01-02T03:04:05.123456Z",
        requires_python=">=3.9",
        metadata_sha256="fedcba9876543210" * 4,
    ),
    FileRecord(
        filename="flash_attn-2.8.3+cu13.0.torch2.14.abi1.sm80.90-cp312-cp312-linux_x86_64.whl",
        sha256="1111111111111111" * 4,
        size=987,
        upload_time="2025-01-03T00:00:00.000000Z",
        requires_python=None,
        metadata_sha256=None,
    ),
)

PAGES = {
    "project.html": lambda: index.project_html("Flash_Attn", RECORDS, variant_id=VID),
    "project.json": lambda: index.project_json("Flash_Attn", RECORDS, variant_id=VID),
    "variant_root.html": lambda: index.variant_root_html(["flash-attn", "causal_conv1d"]),
    "variant_root.json": lambda: index.variant_root_json(["flash-attn", "causal_conv1d"]),
    "top_root.html": lambda: index.top_root_html([VID, "cu128-torch2.10-abi0-sm80.90.100.120"]),
    "human.html": lambda: humanpage.human_page(
        [
            MatrixCell(
                project="flash-attn",
                variant_id=VID,
                python="3.11",
                status="built",
                detail=RECORDS[0].filename,
                published=RECORDS[0].upload_time,
                beside=("build-record", "provenance", "sbom", "signature"),
            ),
            MatrixCell(
                project="flash-attn",
                variant_id=VID,
                python="3.13",
                status="built",
                detail=RECORDS[0].filename.replace("cp311", "cp313"),
                published=RECORDS[1].upload_time,
            ),
            MatrixCell(project="flash-attn", variant_id=VID, python="3.12", status="failed", detail="oom"),
            MatrixCell(
                project="flash-attn",
                variant_id="cu128-torch2.10-abi0-sm80.90.100.120",
                python="3.11",
                status="not built",
                detail="skipped",
            ),
        ]
    ),
}


@pytest.mark.parametrize("name", sorted(PAGES))
def test_golden_page(name: str) -> None:
    rendered = PAGES[name]()
    path = GOLDEN / name
    stored = path.read_text() if path.is_file() else None
    if stored != rendered and os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rendered)
        pytest.fail(
            f"{path} regenerated: review the diff, then run again without UPDATE_GOLDEN", pytrace=False
        )
    assert stored == rendered


def test_the_site_renders_the_published_bytes() -> None:
    """The golden project page, through the site: nothing published changes by going through it."""
    built = site.build_site(site.site_state({(VID, "Flash_Attn"): RECORDS[::-1]}, []))
    assert built[f"simple/{VID}/flash-attn/index.json"] == (GOLDEN / "project.json").read_bytes()
    assert built[f"simple/{VID}/flash-attn/index.html"] == (GOLDEN / "project.html").read_bytes()
    assert built[f"simple/{VID}/index.json"] == index.variant_root_json(["flash-attn"]).encode()
    assert built["simple/index.html"] == index.top_root_html([VID]).encode()
    assert built["index.html"] == humanpage.human_page([]).encode()
