"""The pages of an index as one pure function of its state (as dumb-pypi's build_repo): state -> {key: bytes}.

The state of an index is what each page lists: a project page its file records, a variant index root its
projects, the list of variant indexes its variant ids, the human page its build matrix cells. A page is stored
as its state object (JSON; the PEP 691 page itself for project and variant pages) and the HTML rendered from
it. KINDS says for each kind of page how its state is read, merged and rendered; publish merges a state into
the store page by page with it, repair writes `build_site` of the state it rebuilds from the wheel files, and
check compares the store with the same rendering. Keys are `index.PageRef`'s (the key layout's owner).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from factory.core import simpleapi
from factory.publish import humanpage, index
from factory.publish.index import FileRecord, MatrixCell, PageKind, PageRef

Items = tuple[Any, ...]
"""What one page lists: FileRecords, project names, variant ids or MatrixCells, by its kind."""

SiteState = Mapping[PageRef, Items]


@dataclass(frozen=True, kw_only=True)
class Kind:
    """One kind of page: its state object's content type, and the pure functions over its items."""

    state_type: str
    read: Callable[[bytes], Items]  # the items of a state object; index.DamagedState for one not written here
    merge: Callable[[Items, Items], Items | None]  # grow-only union; None when nothing is new
    state: Callable[[PageRef, Items], str]
    html: Callable[[PageRef, Items], str]


KINDS: Mapping[PageKind, Kind] = {
    "project": Kind(
        state_type=simpleapi.PYPI_JSON_TYPE,
        read=index.records_from_project_json,
        merge=index.merge_records,
        state=lambda page, recs: index.project_json(page.project, recs, variant_id=page.variant_id),
        html=lambda page, recs: index.project_html(page.project, recs, variant_id=page.variant_id),
    ),
    "variant": Kind(
        state_type=simpleapi.PYPI_JSON_TYPE,
        read=index.projects_from_root_json,
        merge=index.merge_names,
        state=lambda _page, projects: index.variant_root_json(projects),
        html=lambda _page, projects: index.variant_root_html(projects),
    ),
    "variants": Kind(
        state_type="application/json",
        read=index.variant_ids_from_top_root_json,
        merge=index.merge_names,
        state=lambda _page, ids: index.top_root_json(ids),
        html=lambda _page, ids: index.top_root_html(ids),
    ),
    "matrix": Kind(
        state_type="application/json",
        read=index.cells_from_json,
        merge=index.merge_cells,
        state=lambda _page, cells: index.cells_to_json(cells),
        html=lambda _page, cells: humanpage.human_page(cells),
    ),
}


def site_state(
    records: Mapping[tuple[str, str], Sequence[FileRecord]], cells: Iterable[MatrixCell]
) -> dict[PageRef, Items]:
    """The state of an index whose project pages, by (variant id, project), list `records`: each variant's
    root lists its projects that have files, the list of variant indexes the variants that have any, and the
    human page shows `cells`. A project page with no records stays a page (listing nothing), and so does its
    variant's root."""
    state: dict[PageRef, Items] = {}
    projects: dict[str, set[str]] = {}
    for (variant_id, project), recs in records.items():
        page = index.project_page(variant_id, project)
        state[page] = tuple(recs)
        names = projects.setdefault(variant_id, set())
        if recs:
            names.add(page.project)
    for variant_id, names in projects.items():
        state[index.variant_page(variant_id)] = tuple(sorted(names))
    state[index.VARIANTS_PAGE] = tuple(sorted(v for v, names in projects.items() if names))
    state[index.MATRIX_PAGE] = tuple(cells)
    return state


def pages(state: SiteState) -> Iterator[tuple[PageRef, Items]]:
    """The pages of a state in write order (index.PAGE_KINDS): each after the pages it links to."""
    for page in sorted(state, key=lambda p: p.order):
        yield page, state[page]


def render_page(page: PageRef, items: Items) -> dict[str, bytes]:
    """A page's state object and its HTML, by key, in that order."""
    kind = KINDS[page.kind]
    return {
        page.state_key: kind.state(page, items).encode(),
        page.html_key: kind.html(page, items).encode(),
    }


def build_site(state: SiteState) -> dict[str, bytes]:
    """Every page object of an index in this state, by key, in write order."""
    return {key: body for page, items in pages(state) for key, body in render_page(page, items).items()}


def content_type(key: str) -> str | None:
    """The Content-Type of a page object's key (a state object or an HTML page); None for other keys."""
    parsed = index.parse_page_key(key)
    if parsed is None:
        return None
    page, form = parsed
    return KINDS[page.kind].state_type if form == "state" else index.HTML_TYPE
