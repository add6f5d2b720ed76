"""`factory index check`: after a CI run's builds, show the whole matrix on the human page and check that the
published index is whole.

Every file a page lists is there with the bytes it says, every wheel file is listed, every project page is
reachable from the roots, and every HTML page is its state's rendering. Nothing is repaired here (that is
`factory index repair`, which must not run while anyone publishes); the only write is the human page's grid,
merged by compare-and-swap as publishing merges it, so a check is safe beside publishers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from packaging.utils import canonicalize_name

from factory import index
from factory.index import FileRecord, MatrixCell
from factory.publish import (
    MATRIX_STATE,
    REPAIR_HINT,
    VARIANTS_STATE,
    converge_pages,
    list_page_keys,
    published_wheel,
    repair_refusals,
)
from factory.stores import Store, compare_and_swap, open_store

if TYPE_CHECKING:
    from factory.plan import Job

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class IndexCheck:
    destination: str
    wheels: int  # listed on the project pages
    variant_ids: tuple[str, ...]
    problems: tuple[str, ...]  # one line each; none when the index is whole
    # files/ keys on no page that `index repair` would leave off every page too (each also a problem)
    unlistable: tuple[str, ...] = ()
    missing: tuple[str, ...]  # planned job ids with no published wheel
    pages_written: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def advice(self, to: str) -> list[str]:
        """What makes the index whole again: repair for what it can mend; removing, by whoever owns the
        index, the files no page may list, which repair leaves where they are."""
        lines = []
        if len(self.problems) > len(self.unlistable):
            lines.append(REPAIR_HINT.format(to=to))
        if self.unlistable:
            lines.append(
                f"remove from the index the {len(self.unlistable)} file(s) no page may list (named above): "
                "factory index repair leaves them where they are"
            )
        return lines


def planned_cells(
    jobs: Iterable[Job], listed: Iterable[tuple[str, str]], *, project: str
) -> list[MatrixCell]:
    """A "not built" cell for each planned job whose (variant id, python) has no wheel in `listed`."""
    have = set(listed)
    name = str(canonicalize_name(project))
    return [
        MatrixCell(
            project=name, variant_id=j.variant.id, python=j.python, status="not built", detail="not published"
        )
        for j in jobs
        if (j.variant.id, j.python) not in have
    ]


def add_absent(existing: Iterable[MatrixCell], new: Iterable[MatrixCell]) -> tuple[MatrixCell, ...] | None:
    """`existing` plus the cells of `new` for combinations it does not show (what a report said stays)."""
    cells = {(c.project, c.variant_id, c.python): c for c in existing}
    added = False
    for cell in new:
        key = (cell.project, cell.variant_id, cell.python)
        if key not in cells:
            cells[key] = cell
            added = True
    if not added:
        return None
    return tuple(sorted(cells.values(), key=lambda c: (c.project, c.variant_id, c.python)))


class _Checker:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.problems: list[str] = []

    def state(self, key: str, reader: Callable[[bytes], tuple[T, ...]]) -> tuple[T, ...] | None:
        """What a state object says; None (with a problem said) when it is absent or damaged."""
        blob = self.store.get(key)
        if blob is None:
            self.problems.append(f"{key}: missing")
            return None
        try:
            return reader(blob.data)
        except index.DamagedState as exc:
            self.problems.append(f"{key}: damaged ({exc})")
            return None

    def html(self, directory: str, body: str) -> None:
        for key in list_page_keys(self.store, directory):
            blob = self.store.get(key)
            if blob is None:
                self.problems.append(f"{key}: missing")
            elif blob.data != body.encode():
                self.problems.append(f"{key}: not the rendering of its state")

    def record(self, variant_id: str, rec: FileRecord) -> None:
        key = index.files_path(variant_id, rec.filename)
        head = self.store.head(key)
        if head is None:
            self.problems.append(f"{key}: listed but missing")
            return
        if head.size != rec.size or self.store.sha256_of(key) != rec.sha256:
            self.problems.append(f"{key}: not the file its page lists (size or sha256 differ)")
        if self.store.head(key + ".metadata") is None:
            self.problems.append(f"{key}.metadata: missing")


def check_index(
    *,
    to: str,
    endpoint_url: str | None = None,
    store: Store | None = None,
    jobs: Sequence[Job] = (),
    project: str | None = None,
) -> IndexCheck:
    """Check the index at `to`; with the planned `jobs` of `project`, first show those not published as "not
    built" on the human page, and name them."""
    if store is None:
        store = open_store(to, endpoint_url=endpoint_url, existing=True)
    c = _Checker(store)
    files: dict[str, set[str]] = {}
    for key in store.keys("files/"):
        parts = key.split("/")
        if len(parts) == 3 and parts[2].endswith(".whl"):
            files.setdefault(parts[1], set()).add(parts[2])
    page_keys = sorted(k for k in store.keys("simple/") if k.count("/") == 3 and k.endswith("/index.json"))
    variant_ids: tuple[str, ...] = ()
    if files or page_keys or store.get(VARIANTS_STATE) is not None:
        variant_ids = c.state(VARIANTS_STATE, index.variant_ids_from_top_root_json) or ()
        c.html("simple/", index.top_root_html(variant_ids))
    listed: dict[tuple[str, str], tuple[FileRecord, ...]] = {}
    for key in page_keys:
        _simple, variant_id, project_name, _file = key.split("/")
        recs = c.state(key, index.records_from_project_json)
        if recs is None:
            continue
        listed[(variant_id, project_name)] = recs
        c.html(
            index.project_dir(variant_id, project_name),
            index.project_html(project_name, recs, variant_id=variant_id),
        )
        for rec in recs:
            c.record(variant_id, rec)
    for variant_id in sorted({v for v, _p in listed} | set(variant_ids)):
        root_key = f"{index.variant_dir(variant_id)}index.json"
        projects = c.state(root_key, index.projects_from_root_json)
        if projects is None:
            continue
        c.html(index.variant_dir(variant_id), index.variant_root_html(projects))
        for v, p in listed:
            if v == variant_id and listed[(v, p)] and p not in projects:
                c.problems.append(f"{index.project_dir(v, p)}: not listed on {root_key}")
        if variant_id not in variant_ids and any(listed.get((variant_id, p)) for p in projects):
            c.problems.append(f"simple/{variant_id}/: not listed on {VARIANTS_STATE}")
    on_pages = {(v, r.filename) for (v, _p), recs in listed.items() for r in recs}
    unlistable: list[str] = []
    for variant_id, names in sorted(files.items()):
        by_project: dict[str, list[str]] = {}
        for name in sorted(names):
            if (variant_id, name) not in on_pages:
                project_name = str(canonicalize_name(name.split("-", 1)[0]))
                by_project.setdefault(project_name, []).append(index.files_path(variant_id, name))
        for project_name, keys in sorted(by_project.items()):
            # what repair would leave off the pages too: advice to repair would not work for it
            refused = repair_refusals(store, variant_id, listed.get((variant_id, project_name), ()), keys)
            for key in keys:
                if key in refused:
                    unlistable.append(key)
                    c.problems.append(f"{key}: on no page, and no page may list it ({refused[key]})")
                else:
                    c.problems.append(f"{key}: on no page")

    written: list[str] = []
    missing: list[str] = []
    if jobs and project is not None:
        name = str(canonicalize_name(project))
        have: list[tuple[str, str]] = []
        for job in jobs:
            filenames = [r.filename for r in listed.get((job.variant.id, name), ())]
            if published_wheel(
                filenames, project=project, version=job.variant.full_version, python=job.python
            ):
                have.append((job.variant.id, job.python))
            else:
                missing.append(job.id)
        cells = planned_cells(jobs, have, project=project)

        def merge(current: bytes | None) -> bytes | None:
            merged = add_absent(index.cells_from_json(current) if current is not None else (), cells)
            return None if merged is None else index.cells_to_json(merged).encode()

        def render(state: bytes) -> bytes:
            return index.human_page(index.cells_from_json(state)).encode()

        try:
            if cells and compare_and_swap(
                store,
                MATRIX_STATE,
                merge,
                content_type="application/json",
                cache_control=index.PAGE_CACHE_CONTROL,
            ):
                written.append(MATRIX_STATE)
            pages = [(k, render) for k in list_page_keys(store, "")]
            converge_pages(store, MATRIX_STATE, pages, content_type=index.HTML_TYPE, written=written)
        except index.DamagedState:
            pass  # left as it is, and said by the check of matrix.json below
    if store.get(MATRIX_STATE) is not None or files or page_keys:
        cells_now = c.state(MATRIX_STATE, index.cells_from_json)
        if cells_now is not None:
            c.html("", index.human_page(cells_now))
    problems = tuple(c.problems)
    return IndexCheck(
        destination=store.description,
        wheels=len(on_pages),
        variant_ids=tuple(sorted({v for v, _p in listed if listed[(v, _p)]})),
        problems=problems,
        unlistable=tuple(unlistable),
        missing=tuple(missing),
        pages_written=tuple(written),
    )
