"""`factory index check`: after a CI run's builds, show the whole matrix on the human page and check that the
published index is whole.

Every file a page lists is there with the bytes it says, every wheel file is listed, every project page is
reachable from the roots, and every HTML page is its state's rendering. Nothing is repaired here (that is
`factory index repair`, which must not run while anyone publishes); the only write is the human page's grid,
merged by compare-and-swap as publishing merges it, so a check is safe beside publishers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from packaging.utils import canonicalize_name

from factory.core.errors import ConfigError
from factory.publish import index, site
from factory.publish.index import FileRecord, MatrixCell, PageRef
from factory.publish.publisher import (
    REPAIR_HINT,
    list_page_keys,
    published_wheel,
    repair_refusals,
    stored_project_pages,
    stored_wheels,
    sync_page,
)
from factory.publish.stores import Store, open_store

if TYPE_CHECKING:
    from factory.plan.plan import Job

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class IndexCheck:
    to: str  # the index as the caller named it (`destination`: as its store describes itself)
    destination: str
    wheels: int  # listed on the project pages
    variant_ids: tuple[str, ...]
    problems: tuple[str, ...]  # one line each; none when the index is whole
    # files/ keys on no page that `index repair` would leave off every page too (each also a problem)
    unlistable: tuple[str, ...] = ()
    planned: int = 0  # the planned jobs checked against the index
    missing: tuple[str, ...]  # planned job ids with no published wheel
    pages_written: tuple[str, ...]
    # (variant id, record) of every wheel a readable project page lists: what `factory index audit` checks
    listed: tuple[tuple[str, FileRecord], ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    def advice(self) -> list[str]:
        """What makes the index whole again: repair for what it can mend; removing, by whoever owns the
        index, the files no page may list, which repair leaves where they are."""
        lines = []
        if len(self.problems) > len(self.unlistable):
            lines.append(REPAIR_HINT.format(to=self.to))
        if self.unlistable:
            lines.append(
                f"remove from the index the {len(self.unlistable)} file(s) no page may list (named above): "
                "factory index repair leaves them where they are"
            )
        return lines


def planned_cells(
    jobs: Iterable[Job], listed: Iterable[tuple[str, str, str]], *, project: str
) -> list[MatrixCell]:
    """A "not built" cell for each planned job whose (variant id, python, platform name) has no wheel in
    `listed`: each platform's wheel is a cell of its own."""
    have = set(listed)
    name = str(canonicalize_name(project))
    return [
        MatrixCell(
            project=name,
            variant_id=j.variant.id,
            python=j.python,
            status="not built",
            detail="not published",
            platform=j.platform.name,
        )
        for j in jobs
        if (j.variant.id, j.python, j.platform.name) not in have
    ]


def add_absent(existing: Iterable[MatrixCell], new: Iterable[MatrixCell]) -> tuple[MatrixCell, ...] | None:
    """`existing` plus the cells of `new` for combinations it does not show (what a report said stays)."""
    cells = {c.key: c for c in existing}
    added = False
    for cell in new:
        if cell.key not in cells:
            cells[cell.key] = cell
            added = True
    if not added:
        return None
    return tuple(sorted(cells.values(), key=lambda c: c.key))


class _Checker:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.problems: list[str] = []

    def page(self, page: PageRef, *, html_if_unreadable: bool = False) -> site.Items | None:
        """What a page's state object says, after comparing its HTML with the rendering of it; None (with a
        problem said) when the state is absent or damaged, and then the HTML is compared with the rendering
        of nothing if `html_if_unreadable`."""
        items = self._state(page)
        if items is not None or html_if_unreadable:
            html = site.render_page(page, items or ())[page.html_key]
            for key in list_page_keys(self.store, page.directory):
                blob = self.store.get(key)
                if blob is None:
                    self.problems.append(f"{key}: missing")
                elif blob.data != html:
                    self.problems.append(f"{key}: not the rendering of its state")
        return items

    def _state(self, page: PageRef) -> site.Items | None:
        blob = self.store.get(page.state_key)
        if blob is None:
            self.problems.append(f"{page.state_key}: missing")
            return None
        try:
            return site.KINDS[page.kind].read(blob.data)
        except index.DamagedState as exc:
            self.problems.append(f"{page.state_key}: damaged ({exc})")
            return None

    def record(self, variant_id: str, rec: FileRecord) -> None:
        key = index.files_path(variant_id, rec.filename)
        head = self.store.head(key)
        if head is None:
            self.problems.append(f"{key}: listed but missing")
            return
        if head.size != rec.size or self.store.sha256_of(key) != rec.sha256:
            self.problems.append(f"{key}: not the file its page lists (size or sha256 differ)")
        meta_key = index.metadata_path(variant_id, rec.filename)
        if self.store.head(meta_key) is None:
            self.problems.append(f"{meta_key}: missing")

    def pages(
        self, project_pages: Sequence[PageRef], variant_ids: Sequence[str]
    ) -> dict[PageRef, site.Items]:
        """The readable project pages, each checked with the files it lists, and each variant root that
        lists them or is listed, checked against them: every project page with files reachable from the
        roots."""
        listed: dict[PageRef, site.Items] = {}
        for page in project_pages:
            recs = self.page(page)
            if recs is None:
                continue
            listed[page] = recs
            for rec in recs:
                self.record(page.variant_id, rec)
        for variant_id in sorted({p.variant_id for p in listed} | set(variant_ids)):
            root = index.variant_page(variant_id)
            projects = self.page(root)
            if projects is None:
                continue
            for page, recs in listed.items():
                if page.variant_id == variant_id and recs and page.project not in projects:
                    self.problems.append(f"{page.directory}: not listed on {root.state_key}")
            if variant_id not in variant_ids and any(
                listed.get(index.project_page(variant_id, p)) for p in projects
            ):
                self.problems.append(f"{root.directory}: not listed on {index.VARIANTS_PAGE.state_key}")
        return listed

    def unlisted(
        self, wheels: Mapping[str, Iterable[str]], listed: Mapping[PageRef, site.Items]
    ) -> list[str]:
        """A problem for each wheel file on no page; the keys of those `index repair` would leave off every
        page too (advice to repair would not work for them)."""
        on_pages = {(p.variant_id, r.filename) for p, recs in listed.items() for r in recs}
        unlistable: list[str] = []
        for variant_id, names in sorted(wheels.items()):
            by_project: dict[str, list[str]] = {}
            for name in sorted(names):
                if (variant_id, name) not in on_pages:
                    project_name = str(canonicalize_name(name.split("-", 1)[0]))
                    by_project.setdefault(project_name, []).append(index.files_path(variant_id, name))
            for project_name, keys in sorted(by_project.items()):
                page = index.project_page(variant_id, project_name)
                refused = repair_refusals(self.store, variant_id, listed.get(page, ()), keys)
                for key in keys:
                    if key in refused:
                        unlistable.append(key)
                        self.problems.append(f"{key}: on no page, and no page may list it ({refused[key]})")
                    else:
                        self.problems.append(f"{key}: on no page")
        return unlistable


def _show_planned(
    store: Store,
    jobs: Sequence[Job],
    listed: Mapping[PageRef, site.Items],
    *,
    project: str,
    written: list[str],
) -> list[str]:
    """Show each planned job with no published wheel as "not built" on the human page (merged as publish
    merges it, so beside publishers); the ids of those jobs. A job is published by a wheel of its own
    platform: a job whose sibling of another platform is listed is missing all the same."""
    name = str(canonicalize_name(project))
    have: list[tuple[str, str, str]] = []
    missing: list[str] = []
    for job in jobs:
        filenames = [r.filename for r in listed.get(index.project_page(job.variant.id, name), ())]
        if published_wheel(
            filenames, project=project, version=job.variant.full_version, python=job.python,
            platform=job.platform,
        ):  # fmt: skip
            have.append((job.variant.id, job.python, job.platform.name))
        else:
            missing.append(job.id)
    cells = planned_cells(jobs, have, project=project)
    read = site.KINDS["matrix"].read
    # A damaged matrix.json is left as it is, and said by the check of it.
    with contextlib.suppress(index.DamagedState):
        sync_page(
            store,
            index.MATRIX_PAGE,
            lambda existing: add_absent(existing, cells),
            read=lambda data: read(data) if data is not None else (),
            written=written,
        )
    return missing


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
    wheels = stored_wheels(store)
    project_pages = stored_project_pages(store)
    variant_ids: site.Items = ()
    if wheels or project_pages or store.get(index.VARIANTS_PAGE.state_key) is not None:
        variant_ids = c.page(index.VARIANTS_PAGE, html_if_unreadable=True) or ()
    listed = c.pages(project_pages, variant_ids)
    unlistable = c.unlisted(wheels, listed)
    written: list[str] = []
    missing: list[str] = []
    if jobs and project is not None:
        missing = _show_planned(store, jobs, listed, project=project, written=written)
    if store.get(index.MATRIX_PAGE.state_key) is not None or wheels or project_pages:
        c.page(index.MATRIX_PAGE)
    return IndexCheck(
        to=to,
        destination=store.description,
        wheels=len({(p.variant_id, r.filename) for p, recs in listed.items() for r in recs}),
        variant_ids=tuple(sorted({p.variant_id for p, recs in listed.items() if recs})),
        problems=tuple(c.problems),
        unlistable=tuple(unlistable),
        planned=len(jobs) if project is not None else 0,
        missing=tuple(missing),
        pages_written=tuple(written),
        listed=tuple(sorted((p.variant_id, r) for p, recs in listed.items() for r in recs)),
    )


def check_published(
    *,
    to: str | None,
    endpoint_url: str | None = None,
    matrix: Path | None = None,
    trust_paths: bool = False,
) -> IndexCheck:
    """`factory index check`: `check_index` of `to`, or of the matrix file's publish.to; with `matrix`, its
    planned jobs are checked against the index too (`planned`, `missing`)."""
    target = resolve_target(
        to=to, endpoint_url=endpoint_url, matrix=matrix, trust_paths=trust_paths, what="check"
    )
    return check_index(
        to=target.to, endpoint_url=target.endpoint_url, jobs=list(target.jobs or ()), project=target.project
    )


@dataclass(frozen=True, kw_only=True)
class Target:
    """The index a command looks at and, given a matrix, the jobs it plans and its project."""

    to: str
    endpoint_url: str | None
    jobs: tuple[Job, ...] | None  # None: no matrix given
    project: str | None


def resolve_target(
    *, to: str | None, endpoint_url: str | None, matrix: Path | None, trust_paths: bool, what: str
) -> Target:
    """`to`, or the matrix file's publish.to (and endpoint) when only the matrix names the index; with
    `matrix`, its planned jobs and project. ConfigError when neither names an index."""
    jobs: tuple[Job, ...] | None = None
    project = None
    if matrix is not None:
        from factory.plan.plan import plan_matrix
        from factory.spec.config import load_matrix_file

        mf = load_matrix_file(matrix, trust_paths=trust_paths)
        jobs, project = tuple(plan_matrix(mf).jobs), mf.package.name
        if to is None:
            to, endpoint_url = mf.publish.to, endpoint_url or mf.publish.endpoint_url
    if to is None:
        raise ConfigError(f"--to or --matrix names the index to {what}")
    return Target(to=to, endpoint_url=endpoint_url, jobs=jobs, project=project)
