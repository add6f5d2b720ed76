"""Index pages and publishing read manylinux wheel filenames, compressed tag sets included."""

from __future__ import annotations

from packaging.version import Version

from factory.core import simpleapi
from factory.publish import index
from factory.publish.publisher import published_wheel

LABEL = "cu13.0.torch2.14.abi1.sm80.90"
VARIANT = "cu130-torch2.14-abi1-sm80.90"
ALIASED = f"factory_demo_ext-0.1.0+{LABEL}-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
MODERN = f"factory_demo_ext-0.1.0+{LABEL}-cp312-cp312-manylinux_2_34_x86_64.whl"


def record(filename: str) -> index.FileRecord:
    return index.FileRecord(
        filename=filename, sha256="0" * 64, size=1, upload_time="2026-01-01T00:00:00.000000Z"
    )


def test_records_and_matrix_columns_of_manylinux_wheels() -> None:
    assert record(ALIASED).project == "factory-demo-ext"
    assert record(ALIASED).version == Version(f"0.1.0+{LABEL}")
    assert (index.python_of_wheel(ALIASED), index.python_of_wheel(MODERN)) == ("3.11", "3.12")


def test_project_pages_link_the_full_filename() -> None:
    page = index.project_html("factory-demo-ext", [record(ALIASED)], variant_id=VARIANT)
    (anchor,) = simpleapi.parse_anchors(page)
    assert anchor.text == ALIASED
    assert anchor.href.startswith(
        f"../../../files/{VARIANT}/factory_demo_ext-0.1.0%2B{LABEL}-cp311-cp311-"
        "manylinux_2_17_x86_64.manylinux2014_x86_64.whl#sha256="
    )


def test_a_published_wheel_is_found_whatever_its_platform_tag() -> None:
    job = {"project": "factory-demo-ext", "version": f"0.1.0+{LABEL}"}
    assert published_wheel([MODERN, ALIASED], **job, python="3.11") == ALIASED
    assert published_wheel([MODERN, ALIASED], **job, python="3.12") == MODERN
    older = ALIASED.replace("manylinux_2_17_x86_64.manylinux2014_x86_64", "linux_x86_64")
    assert published_wheel([older], **job, python="3.11") == older
