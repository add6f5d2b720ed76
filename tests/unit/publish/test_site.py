"""The index site as a pure function of its state (`factory.publish.site`), and the key layout it is stored
under
(`index.PageRef`, `parse_page_key`, `parse_wheel_key`): compose and parse are each other's inverse."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from factory.core import simpleapi
from factory.publish import index, site
from factory.publish.index import FileRecord, MatrixCell, PageRef

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
VID = "cu130-torch2.14-abi1-sm80.90"
OLD = "cu128-torch2.10-abi1-sm80.90"


def rec(
    project: str = "flash_attn",
    version: str = "2.8.3",
    variant: str = "cu13.0.torch2.14.abi1.sm80.90",
    *,
    sha: str = "a" * 64,
    tag: str = "cp311-cp311-linux_x86_64",
) -> FileRecord:
    return FileRecord(
        filename=f"{project}-{version}+{variant}-{tag}.whl",
        sha256=sha,
        size=10,
        upload_time="2025-01-02T03:04:05.000000Z",
        requires_python=">=3.9",
        metadata_sha256="b" * 64,
    )


# ---------------------------------------------------------------------------------------------- key layout

SEGMENT = st.text(st.sampled_from("abz019.-_"), min_size=1, max_size=8).filter(lambda s: s not in {".", ".."})
PAGES = st.one_of(
    st.builds(index.project_page, SEGMENT, SEGMENT),
    st.builds(index.variant_page, SEGMENT),
    st.just(index.VARIANTS_PAGE),
    st.just(index.MATRIX_PAGE),
)


@given(PAGES)
def test_each_key_of_a_page_parses_back_to_it(page: PageRef) -> None:
    assert index.parse_page_key(page.state_key) == (page, "state")
    assert index.parse_page_key(page.html_key) == (page, "html")
    # the directory key a store without index documents (S3 website hosting) keeps the HTML under
    assert index.parse_page_key(page.directory) == (page, "html")


@given(
    st.lists(
        st.sampled_from(
            [
                "simple",
                "files",
                "index.json",
                "index.html",
                "variants.json",
                "matrix.json",
                VID,
                "demo-ext",
                "Demo_Ext",
                "",
            ]
        ),
        max_size=5,
    ).map("/".join)
)
def test_a_key_parses_only_to_a_page_that_composes_it(key: str) -> None:
    parsed = index.parse_page_key(key)
    if parsed is not None:
        page, form = parsed
        assert key in ((page.state_key,) if form == "state" else (page.html_key, page.directory))


@pytest.mark.parametrize(
    ("key", "parsed"),
    [
        ("simple/variants.json", (index.VARIANTS_PAGE, "state")),
        ("simple/index.html", (index.VARIANTS_PAGE, "html")),
        ("simple/", (index.VARIANTS_PAGE, "html")),
        ("matrix.json", (index.MATRIX_PAGE, "state")),
        ("index.html", (index.MATRIX_PAGE, "html")),
        (f"simple/{VID}/index.json", (index.variant_page(VID), "state")),
        (f"simple/{VID}/demo-ext/index.html", (index.project_page(VID, "demo-ext"), "html")),
        (f"simple/{VID}/demo-ext/", (index.project_page(VID, "demo-ext"), "html")),
    ],
)
def test_the_keys_of_the_layout(key: str, parsed: tuple[PageRef, str]) -> None:
    assert index.parse_page_key(key) == parsed


@pytest.mark.parametrize(
    "key",
    [
        "simple/index.json",  # the list of variant indexes has no PEP 691 twin
        "index.json",
        f"simple/{VID}/Demo_Ext/index.json",  # a project directory is written normalised, or it is no page
        f"simple/{VID}/demo-ext/extra/index.json",
        "simple//demo-ext/index.json",
        f"simple/{VID}/demo-ext/index.htm",
        f"files/{VID}/demo_ext-0.1.0-py3-none-any.whl",
        "other/index.html",
    ],
)
def test_keys_outside_the_layout_are_no_page(key: str) -> None:
    assert index.parse_page_key(key) is None


@given(SEGMENT, SEGMENT)
def test_a_wheel_key_parses_back(variant_id: str, stem: str) -> None:
    filename = f"{stem}.whl"
    assert index.parse_wheel_key(index.files_path(variant_id, filename)) == (variant_id, filename)
    assert index.parse_wheel_key(index.metadata_path(variant_id, filename)) is None


@pytest.mark.parametrize(
    "key",
    ["files/x.whl", f"files/{VID}/sub/x.whl", f"simple/{VID}/x.whl", "files//x.whl", f"files/{VID}/x.zip"],
)
def test_keys_that_are_no_wheel(key: str) -> None:
    assert index.parse_wheel_key(key) is None


def test_content_types_by_kind() -> None:
    assert site.content_type(f"simple/{VID}/demo-ext/index.json") == simpleapi.PYPI_JSON_TYPE
    assert site.content_type(f"simple/{VID}/index.json") == simpleapi.PYPI_JSON_TYPE
    assert site.content_type("simple/variants.json") == "application/json"
    assert site.content_type("matrix.json") == "application/json"
    assert site.content_type(f"simple/{VID}/") == index.HTML_TYPE
    assert site.content_type(index.files_path(VID, rec().filename)) is None


# ---------------------------------------------------------------------------------------------- the site


def test_the_site_of_a_state_is_every_page_state_first_in_write_order() -> None:
    state = site.site_state(
        {(VID, "flash-attn"): [rec()], (OLD, "flash-attn"): [rec(variant="cu12.8.torch2.10.abi1.sm80.90")]},
        [],
    )
    assert list(site.build_site(state)) == [
        f"simple/{OLD}/flash-attn/index.json",
        f"simple/{OLD}/flash-attn/index.html",
        f"simple/{VID}/flash-attn/index.json",
        f"simple/{VID}/flash-attn/index.html",
        f"simple/{OLD}/index.json",
        f"simple/{OLD}/index.html",
        f"simple/{VID}/index.json",
        f"simple/{VID}/index.html",
        "simple/variants.json",
        "simple/index.html",
        "matrix.json",
        "index.html",
    ]


def test_an_empty_project_page_stays_a_page_but_its_variant_is_not_listed() -> None:
    state = site.site_state({(OLD, "gone"): (), (VID, "demo-ext"): [rec("demo_ext", "0.1.0")]}, [])
    assert state[index.project_page(OLD, "gone")] == ()
    assert state[index.variant_page(OLD)] == ()
    assert state[index.variant_page(VID)] == ("demo-ext",)
    assert state[index.VARIANTS_PAGE] == (VID,)
    assert f"simple/{OLD}/gone/index.html" in site.build_site(state)


@given(st.permutations([(VID, "a"), (VID, "b"), (OLD, "a")]))
def test_the_site_does_not_depend_on_the_order_state_is_given_in(order: list[tuple[str, str]]) -> None:
    labels = {VID: "cu13.0.torch2.14.abi1.sm80.90", OLD: "cu12.8.torch2.10.abi1.sm80.90"}
    records = {(v, p): [rec(p, variant=labels[v])] for v, p in order}
    cell = MatrixCell(project="a", variant_id=VID, python="3.11", status="failed", detail="oom")
    built = site.build_site(site.site_state(records, [cell]))
    expected = site.build_site(site.site_state(dict(sorted(records.items())), [cell]))
    assert list(built.items()) == list(expected.items())


def test_each_kind_merges_grow_only() -> None:
    merge = site.KINDS["project"].merge
    assert [r.filename for r in merge((rec("a"),), (rec("a", "0.2.0"),)) or ()] == sorted(
        [rec("a").filename, rec("a", "0.2.0").filename]
    )
    assert merge((rec("a"),), (rec("a"),)) is None
    with pytest.raises(index.RecordConflict):
        merge((rec("a"),), (rec("a", sha="c" * 64),))
    assert site.KINDS["variant"].merge(("b",), ("a",)) == ("a", "b")
    assert site.KINDS["variants"].merge((VID,), (VID,)) is None


def test_each_kind_reads_back_what_it_writes() -> None:
    state = site.site_state(
        {(VID, "a"): [rec("a")]},
        [MatrixCell(project="a", variant_id=VID, python="3.11", status="built", detail=rec("a").filename)],
    )
    for page, items in site.pages(state):
        body = site.render_page(page, items)[page.state_key]
        assert site.KINDS[page.kind].read(body) == items


@pytest.mark.parametrize(
    "key",
    [
        "files/../x-1.0-py3-none-any.whl",
        "files/./x-1.0-py3-none-any.whl",
        "files//x-1.0-py3-none-any.whl",
        f"files/{VID}/sub/x-1.0-py3-none-any.whl",
        f"simple/{VID}/../index.json",
        f"simple/{VID}/./index.html",
        "simple/../../index.html",
        f"simple//{VID}/index.json",
    ],
)
def test_a_hostile_listing_key_is_no_wheel_and_no_page(key: str) -> None:
    """A store's listing (an S3 bucket's keys) is not trusted: a key with an empty, "." or ".." part names
    no wheel and no page, so repair and check never compose a key or path from it."""
    assert index.parse_wheel_key(key) is None
    assert index.parse_page_key(key) is None
