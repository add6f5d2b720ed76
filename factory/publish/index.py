"""Simple-repository pages (PEP 503 HTML, PEP 691 JSON with PEP 700 fields, PEP 658/714 metadata), pure.

Every page is a function of file records only, so publishing is "merge records, re-render the pages whose
records changed". Layout under an index root (all links relative, so the tree works from any base URL):

    simple/index.html                          the variant indexes
    simple/<variant-id>/index.html|json        PEP 503 root of one variant index (its projects)
    simple/<variant-id>/<project>/index.html|json
    files/<variant-id>/<wheel>                 and <wheel>.metadata beside it (<wheel>.provenance.json
                                               and <wheel>.sbom.cdx.json when it carries them,
                                               <wheel>.sig.json when signed,
                                               <wheel>.build.json when published with a report)
    index.html                                 human page: the build matrix and install commands
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal
from urllib.parse import quote

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, is_normalized_name, parse_wheel_filename
from packaging.version import Version

from factory.core import platforms
from factory.core.errors import PublishError
from factory.core.variants import is_variant_id
from factory.wheel import record as buildrecord

API_VERSION = "1.1"
HTML_TYPE = "text/html; charset=utf-8"
# Pages change on every publish; files never change once published (publish refuses different bytes).
PAGE_CACHE_CONTROL = "public, max-age=60, must-revalidate"
FILE_CACHE_CONTROL = "public, max-age=31536000, immutable"

CellStatus = Literal["built", "failed", "not built"]


class RecordConflict(ValueError):
    """Two records claim the same release (project, PEP 440 version, a tag) with different files."""


class DamagedState(PublishError):
    """A state object (a page's JSON) that this module did not write: the reader says what is wrong."""


_SHA256 = re.compile(r"[0-9a-f]{64}")
# A variant id names a directory: no "/", no dot segments (see factory.core.variants.Variant.id).


def release_of(filename: str) -> tuple[str, Version, frozenset[Tag]]:
    """What makes two wheels the same release for an installer: project, PEP 440 version (0.1.0 ==
    0.1.0.0), tags. The build tag is left out on purpose: a higher build number wins in pip, so another
    build of a published release would replace it for every installer."""
    name, version, _build, tags = parse_wheel_filename(filename)
    return str(name), version, tags


@dataclass(frozen=True, kw_only=True, order=True)
class FileRecord:
    """One published wheel as the index pages describe it."""

    filename: str
    sha256: str
    size: int
    upload_time: str  # ISO 8601 UTC with microseconds and "Z", as PEP 700 writes it
    requires_python: str | None = None
    metadata_sha256: str | None = None  # sha256 of the <wheel>.metadata file (PEP 658)

    @property
    def project(self) -> str:
        return str(parse_wheel_filename(self.filename)[0])

    @property
    def version(self) -> Version:
        return parse_wheel_filename(self.filename)[1]


@dataclass(frozen=True, kw_only=True)
class MatrixCell:
    """One combination of the build matrix, as the human page shows it."""

    project: str
    variant_id: str
    python: str  # "3.11", or the wheel's python tag ("py3") when it is not a CPython version
    status: CellStatus
    detail: str = ""  # the wheel filename, or why it failed ("oom")
    published: str = ""  # a built cell's wheel: its upload time (PEP 700's, as its project page says)
    beside: tuple[str, ...] = ()  # a built cell's wheel: the BESIDE files published next to it
    record: str = ""  # a failed cell's build record: its key (`failed_record_path`), where one was published
    # the platform its wheel is for (a `factory.core.platforms` name): each platform's wheel is a cell of its
    # own beside its siblings of the same variant and Python
    platform: str = platforms.DEFAULT_PLATFORM.name

    @property
    def key(self) -> tuple[str, str, str, str]:
        """What one cell of the grid is: no two cells of a grid share it."""
        return (self.project, self.variant_id, self.python, self.platform)


def _in_order(cells: Iterable[MatrixCell]) -> tuple[MatrixCell, ...]:
    return tuple(sorted(cells, key=lambda c: c.key))


# ---------------------------------------------------------------------------------------------- key layout
# The one owner of the store's key layout: every key is composed here, and parsed back only here.

PageKind = Literal["project", "variant", "variants", "matrix"]
# Write order: a page links only to pages of kinds before it, so each is written after what it links to.
PAGE_KINDS: tuple[PageKind, ...] = ("project", "variant", "variants", "matrix")
VARIANTS_STATE = "simple/variants.json"
MATRIX_STATE = "matrix.json"
PageForm = Literal["state", "html"]


def files_path(variant_id: str, filename: str) -> str:
    return f"files/{variant_id}/{filename}"


def metadata_path(variant_id: str, filename: str) -> str:
    """The PEP 658 core metadata file beside a wheel."""
    return f"{files_path(variant_id, filename)}.metadata"


SIGNATURE_SUFFIX = ".sig.json"


def signature_path(variant_id: str, filename: str) -> str:
    """The signature file beside a wheel (`factory.trust.signing`'s format): the wheel's URL and this
    suffix."""
    return f"{files_path(variant_id, filename)}{SIGNATURE_SUFFIX}"


PROVENANCE_SUFFIX = ".provenance.json"


def provenance_path(variant_id: str, filename: str) -> str:
    """The wheel's own provenance file (`factory.wheel.provenance`), byte for byte, beside it: a client reads
    it
    without the wheel, as PEP 658's metadata."""
    return f"{files_path(variant_id, filename)}{PROVENANCE_SUFFIX}"


SBOM_SUFFIX = ".sbom.cdx.json"


def sbom_path(variant_id: str, filename: str) -> str:
    """The wheel's own SBOM (`factory.wheel.sbom`, the file its provenance names), byte for byte, beside it: a
    client or scanner reads it without the wheel, as the provenance."""
    return f"{files_path(variant_id, filename)}{SBOM_SUFFIX}"


def build_record_path(variant_id: str, filename: str) -> str:
    """The build record beside a wheel (`factory.wheel.record`'s format): the wheel's URL and this suffix."""
    return f"{files_path(variant_id, filename)}{buildrecord.SUFFIX}"


# A failed job's build record has no wheel to sit beside: it is kept under a directory no PEP 503 page lists,
# one immutable file per failure, named by its job and a prefix of its bytes' sha256 (a later failure of the
# same job, in another run, gets its own key and never overwrites an earlier one).
FAILED_RECORDS_DIR = "_builds/"
# The compile cache's part of a publish store (`factory.cache.sync`): index code lists only files/, simple/
# and profiles/, and no project or variant name starts with "_", so nothing of the cache is taken for a
# project; `factory serve` refuses it.
COMPILE_CACHE_PREFIX = "_cache/compile"
_KEY_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,199}")
_RECORD_HASH = 16  # hex digits of the record's sha256 in its key


def failed_record_path(variant_id: str, job_id: str, sha256: str) -> str:
    """The key of a failed job's build record (`factory.wheel.record`'s format), its bytes' hash `sha256`."""
    key = f"{FAILED_RECORDS_DIR}{variant_id}/{job_id}-{sha256[:_RECORD_HASH]}{buildrecord.SUFFIX}"
    if parse_failed_record_key(key) is None:
        raise ValueError(f"{variant_id!r}, {job_id!r}: not a failed build record's key")
    return key


def parse_failed_record_key(key: str) -> tuple[str, str] | None:
    """(variant id, job id) of a key failed_record_path composes; None for any other key."""
    if not key.startswith(FAILED_RECORDS_DIR) or not key.endswith(buildrecord.SUFFIX):
        return None
    parts = key[len(FAILED_RECORDS_DIR) : -len(buildrecord.SUFFIX)].split("/")
    if len(parts) != 2 or not _KEY_PART.fullmatch(parts[0]):
        return None
    job_id, _, digest = parts[1].rpartition("-")
    if not _KEY_PART.fullmatch(job_id) or not re.fullmatch(f"[0-9a-f]{{{_RECORD_HASH}}}", digest):
        return None
    return parts[0], job_id


# What may be published beside a wheel, by the name a matrix cell gives it: the suffix of its key.
BESIDE: Mapping[str, str] = {
    "provenance": PROVENANCE_SUFFIX,
    "sbom": SBOM_SUFFIX,
    "signature": SIGNATURE_SUFFIX,
    "build-record": buildrecord.SUFFIX,
}


def project_dir(variant_id: str, project: str) -> str:
    return f"simple/{variant_id}/{canonicalize_name(project)}/"


def variant_dir(variant_id: str) -> str:
    return f"simple/{variant_id}/"


@dataclass(frozen=True, kw_only=True)
class PageRef:
    """One page of an index: its kind, and for project and variant pages which one (`project` normalised)."""

    kind: PageKind
    variant_id: str = ""
    project: str = ""

    @property
    def directory(self) -> str:
        """The directory the page is the index of ("" for the human page at the index root)."""
        if self.kind == "project":
            return project_dir(self.variant_id, self.project)
        if self.kind == "variant":
            return variant_dir(self.variant_id)
        return "simple/" if self.kind == "variants" else ""

    @property
    def state_key(self) -> str:
        """The JSON object publishers merge into (the PEP 691 page itself for project and variant pages)."""
        if self.kind == "variants":
            return VARIANTS_STATE
        if self.kind == "matrix":
            return MATRIX_STATE
        return f"{self.directory}index.json"

    @property
    def html_key(self) -> str:
        return f"{self.directory}index.html"

    @property
    def order(self) -> tuple[int, str, str]:
        """Sort key of the write order (PAGE_KINDS), then by variant and project."""
        return PAGE_KINDS.index(self.kind), self.variant_id, self.project


def project_page(variant_id: str, project: str) -> PageRef:
    return PageRef(kind="project", variant_id=variant_id, project=str(canonicalize_name(project)))


def variant_page(variant_id: str) -> PageRef:
    return PageRef(kind="variant", variant_id=variant_id)


VARIANTS_PAGE = PageRef(kind="variants")
MATRIX_PAGE = PageRef(kind="matrix")


def parse_page_key(key: str) -> tuple[PageRef, PageForm] | None:
    """The page a key stores and in which form: its state object, or its HTML under "dir/index.html" or the
    directory key "dir/" (where a store needs one). None for any other key, a project directory not
    spelled normalised included: exactly the keys the PageRef properties compose parse."""
    if key == VARIANTS_STATE:
        return VARIANTS_PAGE, "state"
    if key == MATRIX_STATE:
        return MATRIX_PAGE, "state"
    directory, _, name = key.rpartition("/")
    forms: dict[str, PageForm] = {"index.json": "state", "index.html": "html", "": "html"}
    form = forms.get(name)
    parts = directory.split("/") if directory else []
    if form is None or "" in parts or (parts and parts[0] != "simple"):
        return None
    page: PageRef | None = None
    if len(parts) == 3:
        page = project_page(parts[1], parts[2])
    elif len(parts) == 2:
        page = variant_page(parts[1])
    elif form == "html":
        page = VARIANTS_PAGE if parts else MATRIX_PAGE
    if page is None or key not in (page.state_key if form == "state" else page.html_key, page.directory):
        return None
    return page, form


def parse_wheel_key(key: str) -> tuple[str, str] | None:
    """(variant id, filename) of a key files_path composes for a wheel ("files/<variant>/<name>.whl")."""
    parts = key.split("/")
    if len(parts) != 3 or parts[0] != "files" or not parts[2].endswith(".whl"):
        return None
    if parts[1] in {"", ".", ".."}:  # a listing's key (an S3 bucket's) never names a way out
        return None
    return parts[1], parts[2]


def file_href(variant_id: str, filename: str) -> str:
    """The link from a project page to a file; "+" must be "%2B" or S3 and some proxies read it as a space."""
    return f"../../../files/{quote(variant_id, safe='')}/{quote(filename, safe='')}"


def platform_of_wheel(filename: str) -> str:
    """The matrix's platform of a wheel (a `factory.core.platforms` name): the one its platform tags are for;
    the default platform's for a pure wheel (it serves them all) or a tag of no platform the table knows."""
    found = {p.name for t in parse_wheel_filename(filename)[3] if (p := platforms.of_tag(t.platform))}
    return found.pop() if len(found) == 1 else platforms.DEFAULT_PLATFORM.name


def job_platform(job: Mapping[str, object]) -> str:
    """The platform of a build report's job: its wheel's (`platform_of_wheel`), else the one it names
    (`platform`, written for every job since the platform axis; an older report's jobs are the default
    platform's)."""
    wheel = job.get("wheel")
    if isinstance(wheel, str) and wheel:
        return platform_of_wheel(wheel)
    named = platforms.by_name(str(job.get("platform") or ""))
    return (named or platforms.DEFAULT_PLATFORM).name


def python_of_wheel(filename: str) -> str:
    """The matrix column of a wheel: "cp311" -> "3.11"; other tags ("py3") as written."""
    tags = sorted({t.interpreter for t in parse_wheel_filename(filename)[3]})
    match = re.fullmatch(r"cp(\d)(\d+)", tags[0]) if len(tags) == 1 else None
    if match:
        return f"{match.group(1)}.{match.group(2)}"
    return ".".join(tags)


# ---------------------------------------------------------------------------------------------- merging


def merge_records(existing: Iterable[FileRecord], new: Iterable[FileRecord]) -> tuple[FileRecord, ...] | None:
    """The union of two record sets, or None when `new` adds nothing (so the page need not be rewritten).

    A record already published wins (it keeps its upload time). A published release never changes, so
    RecordConflict for the same filename with another hash, and for another filename of the same release
    (project, PEP 440 version, a shared tag: `demo_ext-0.1.0.0+l-py3-none-any.whl` beside
    `demo_ext-0.1.0+l-py3-none-any.whl`), which installers could pick instead of the published one.
    """
    by_name: dict[str, FileRecord] = {}
    by_release: dict[tuple[str, Version, Tag], str] = {}

    def claim(rec: FileRecord, *, published: bool = False) -> None:
        name, version, tags = release_of(rec.filename)
        for tag in tags:
            other = by_release.setdefault((name, version, tag), rec.filename)
            # Pages written before this rule may list two spellings already; they stay listed.
            if other != rec.filename and not published:
                raise RecordConflict(
                    f"{rec.filename} is the same release as {other} (project {name}, version {version}, "
                    f"tag {tag}), which is already published"
                )

    for rec in existing:
        by_name[rec.filename] = rec
        claim(rec, published=True)
    changed = False
    for rec in new:
        old = by_name.get(rec.filename)
        if old is None:
            claim(rec)
            by_name[rec.filename] = rec
            changed = True
        elif old.sha256 != rec.sha256:
            raise RecordConflict(
                f"{rec.filename} is already listed with sha256 {old.sha256}, not {rec.sha256}"
            )
    if not changed:
        return None
    return tuple(sorted(by_name.values(), key=lambda r: r.filename))


def changed_projects(
    existing: Mapping[str, Sequence[FileRecord]], new: Iterable[FileRecord]
) -> dict[str, tuple[FileRecord, ...]]:
    """Incremental index generation: the new record set of each project page that must be rewritten."""
    grouped: dict[str, list[FileRecord]] = {}
    for rec in new:
        grouped.setdefault(rec.project, []).append(rec)
    out: dict[str, tuple[FileRecord, ...]] = {}
    for project, recs in sorted(grouped.items()):
        merged = merge_records(existing.get(project, ()), recs)
        if merged is not None:
            out[project] = merged
    return out


def merge_names(existing: Iterable[str], new: Iterable[str]) -> tuple[str, ...] | None:
    """Grow-only union of names (projects, variant ids); None when nothing is new."""
    old = set(existing)
    union = old | set(new)
    return None if union == old else tuple(sorted(union))


# ---------------------------------------------------------------------------------------------- project pages


def _page(title: str, body_lines: Sequence[str]) -> str:
    lines = [
        "<!DOCTYPE html>",
        "<html>",
        "  <head>",
        f'    <meta name="pypi:repository-version" content="{API_VERSION}">',
        f"    <title>{html.escape(title)}</title>",
        "  </head>",
        "  <body>",
        f"    <h1>{html.escape(title)}</h1>",
        *(f"    {line}" for line in body_lines),
        "  </body>",
        "</html>",
        "",
    ]
    return "\n".join(lines)


def project_html(project: str, records: Iterable[FileRecord], *, variant_id: str) -> str:
    """PEP 503 project page with PEP 658/714 metadata attributes (both spellings, equal values)."""
    name = canonicalize_name(project)
    links = []
    for rec in sorted(records, key=lambda r: r.filename):
        attrs = [f'href="{html.escape(file_href(variant_id, rec.filename))}#sha256={rec.sha256}"']
        if rec.requires_python:
            attrs.append(f'data-requires-python="{html.escape(rec.requires_python)}"')
        if rec.metadata_sha256:
            attrs.append(f'data-dist-info-metadata="sha256={rec.metadata_sha256}"')
            attrs.append(f'data-core-metadata="sha256={rec.metadata_sha256}"')
        links.append(f"<a {' '.join(attrs)}>{html.escape(rec.filename)}</a><br>")
    return _page(f"Links for {name}", links)


def project_json(project: str, records: Iterable[FileRecord], *, variant_id: str) -> str:
    """PEP 691 project page, api-version 1.1 (PEP 700: versions, size, upload-time).

    Only the "core-metadata" key: PEP 714 forbids servers to emit the old "dist-info-metadata" JSON key.
    """
    recs = sorted(records, key=lambda r: r.filename)
    files = []
    for rec in recs:
        entry: dict[str, object] = {
            "filename": rec.filename,
            "url": file_href(variant_id, rec.filename),
            "hashes": {"sha256": rec.sha256},
        }
        if rec.requires_python:
            entry["requires-python"] = rec.requires_python
        entry["core-metadata"] = {"sha256": rec.metadata_sha256} if rec.metadata_sha256 else False
        entry["size"] = rec.size
        entry["upload-time"] = rec.upload_time
        files.append(entry)
    versions = sorted({rec.version for rec in recs})
    doc = {
        "meta": {"api-version": API_VERSION},
        "name": str(canonicalize_name(project)),
        "versions": [str(v) for v in versions],
        "files": files,
    }
    return json.dumps(doc, indent=2) + "\n"


def _state_doc(text: str | bytes, *, what: str) -> dict[str, object]:
    """The JSON object of a state file, or DamagedState saying why it is not one."""
    try:
        doc = json.loads(text)
    except UnicodeDecodeError:
        raise DamagedState(f"not UTF-8 text, not {what}") from None
    except json.JSONDecodeError as exc:
        raise DamagedState(f"line {exc.lineno}: not JSON ({exc.msg}), not {what}") from None
    except RecursionError:
        raise DamagedState(f"JSON nested too deep, not {what}") from None
    if not isinstance(doc, dict):
        raise DamagedState(f"a JSON {type(doc).__name__}, not {what} (an object)")
    return doc


def _state_list(doc: Mapping[str, object], key: str, *, what: str) -> list[dict[str, object]]:
    items = doc.get(key, [])
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise DamagedState(f'"{key}" is not a list of objects, not {what}')
    return items


def _state_str(entry: Mapping[str, object], key: str, *, where: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str):
        raise DamagedState(f'{where}: "{key}" is {json.dumps(value)[:40]}, not a string')
    try:
        value.encode()
    except UnicodeEncodeError:  # a lone surrogate ("\ud800" in the JSON): no page could be written with it
        raise DamagedState(f'{where}: "{key}" is not Unicode text') from None
    return value


def _state_optional_str(entry: Mapping[str, object], key: str, *, where: str) -> str | None:
    return None if entry.get(key) is None else _state_str(entry, key, where=where)


def records_from_project_json(text: str | bytes) -> tuple[FileRecord, ...]:
    """The records of a page written by project_json (the page is the state that publishers merge into);
    DamagedState for anything else."""
    what = "a project page"
    doc = _state_doc(text, what=what)
    out = []
    for n, f in enumerate(_state_list(doc, "files", what=what)):
        where = f"file {n + 1}"
        filename = _state_str(f, "filename", where=where)
        try:
            parse_wheel_filename(filename)
        except InvalidWheelFilename:
            raise DamagedState(f"{where}: {filename[:80]!r} is not a wheel filename") from None
        hashes = f.get("hashes")
        sha256 = hashes.get("sha256") if isinstance(hashes, dict) else None
        if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
            raise DamagedState(f"{where} ({filename}): no sha256 hash")
        size = f.get("size", 0)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise DamagedState(f"{where} ({filename}): size {json.dumps(size)[:40]} is not a byte count")
        meta = f.get("core-metadata")
        metadata_sha256 = meta.get("sha256") if isinstance(meta, dict) else None
        if metadata_sha256 is not None and (
            not isinstance(metadata_sha256, str) or not _SHA256.fullmatch(metadata_sha256)
        ):
            raise DamagedState(f"{where} ({filename}): core-metadata has no sha256 hash")
        out.append(
            FileRecord(
                filename=filename,
                sha256=sha256,
                size=size,
                upload_time=_state_optional_str(f, "upload-time", where=where) or "",
                requires_python=_state_optional_str(f, "requires-python", where=where),
                metadata_sha256=metadata_sha256,
            )
        )
    return tuple(out)


# ---------------------------------------------------------------------------------------------- roots


def variant_root_html(projects: Iterable[str]) -> str:
    """PEP 503 root of one variant index."""
    names = sorted({canonicalize_name(p) for p in projects})
    return _page("Simple index", [f'<a href="{quote(n)}/">{html.escape(n)}</a><br>' for n in names])


def variant_root_json(projects: Iterable[str]) -> str:
    names = sorted({canonicalize_name(p) for p in projects})
    doc = {"meta": {"api-version": API_VERSION}, "projects": [{"name": n} for n in names]}
    return json.dumps(doc, indent=2) + "\n"


def projects_from_root_json(text: str | bytes) -> tuple[str, ...]:
    """The projects of a page written by variant_root_json; DamagedState for anything else."""
    what = "a variant index root page"
    names = []
    for n, p in enumerate(_state_list(_state_doc(text, what=what), "projects", what=what)):
        name = _state_str(p, "name", where=f"project {n + 1}")
        if not is_normalized_name(name):
            raise DamagedState(f"project {n + 1}: {name!r} is not a normalised project name")
        names.append(name)
    return tuple(names)


def top_root_html(variant_ids: Iterable[str]) -> str:
    """simple/index.html: one link per variant index (each is a complete PEP 503 index of its own)."""
    ids = sorted(set(variant_ids))
    return _page(
        "Variant indexes",
        [f'<a href="{quote(v, safe="")}/">{html.escape(v)}</a><br>' for v in ids],
    )


def top_root_json(variant_ids: Iterable[str]) -> str:
    """simple/variants.json, the state behind simple/index.html (not a PEP 691 page: it lists indexes)."""
    ids = sorted(set(variant_ids))
    return json.dumps({"variants": [{"id": v, "url": f"{v}/"} for v in ids]}, indent=2) + "\n"


def variant_ids_from_top_root_json(text: str | bytes) -> tuple[str, ...]:
    """The variant ids of a list written by top_root_json; DamagedState for anything else."""
    what = "a list of variant indexes"
    ids = []
    for n, v in enumerate(_state_list(_state_doc(text, what=what), "variants", what=what)):
        vid = _state_str(v, "id", where=f"variant {n + 1}")
        if not is_variant_id(vid):
            raise DamagedState(f"variant {n + 1}: {vid!r} is not a variant id")
        ids.append(vid)
    return tuple(ids)


# ---------------------------------------------------------------------------------------------- human page


def matrix_cells(
    report_jobs: Iterable[Mapping[str, object]],
    published: Iterable[tuple[str, FileRecord]],
    *,
    project_hint: str | None = None,
    beside: Mapping[tuple[str, str], Iterable[str]] | None = None,
    failed_records: Mapping[str, str] | None = None,
) -> tuple[MatrixCell, ...]:
    """The cells a build report and the published (variant id, record) pairs say something about; `beside`
    names, by (variant id, filename), the files (BESIDE's names) published next to a wheel, and
    `failed_records`, by job id, the key of a failed job's build record (`failed_record_path`).

    A published wheel is "built" whatever an older report said; a job that failed or ran out of memory is
    "failed"; any other job result (and "ok" whose wheel did not reach the index) is "not built".
    """
    beside = beside or {}
    built: dict[str, MatrixCell] = {}
    cells: dict[tuple[str, str, str, str], MatrixCell] = {}
    jobs = list(report_jobs)
    project = project_hint
    for job in jobs:
        wheel = job.get("wheel")
        if project is None and isinstance(wheel, str) and wheel:
            project = str(parse_wheel_filename(wheel)[0])
    published_names = set()
    for variant_id, rec in published:
        published_names.add(rec.filename)
        cell = built[rec.filename] = MatrixCell(
            project=rec.project,
            variant_id=variant_id,
            python=python_of_wheel(rec.filename),
            status="built",
            detail=rec.filename,
            published=rec.upload_time,
            beside=tuple(sorted(set(beside.get((variant_id, rec.filename), ())) & set(BESIDE))),
            platform=platform_of_wheel(rec.filename),
        )
        cells[cell.key] = cell
    for job in jobs:
        variant_id = str(job.get("variant_id", ""))
        wheel = job.get("wheel")
        job_project = str(job.get("package") or project or "unknown")
        if isinstance(wheel, str) and wheel:
            job_project = str(parse_wheel_filename(wheel)[0])
        python = str(job.get("python", ""))
        platform = job_platform(job)
        key = (str(canonicalize_name(job_project)), variant_id, python, platform)
        result = str(job.get("result", ""))
        if isinstance(wheel, str) and wheel in published_names:
            # an abi3 job's one wheel is the built wheel of every Python it covers
            for covered in _covered(job):
                cells[(key[0], variant_id, covered, platform)] = replace(built[wheel], python=covered)
            continue
        record = ""
        if result in buildrecord.FAILED_RESULTS:
            status: CellStatus = "failed"
            detail = _failure(result, job.get("reason"))
            record = (failed_records or {}).get(str(job.get("job_id", "")), "")
        else:
            status, detail = "not built", result if result != "ok" else "not published"
        existing = cells.get(key)
        if existing is None or existing.status != "built":
            cells[key] = MatrixCell(
                project=key[0], variant_id=variant_id, python=python, status=status, detail=detail,
                record=record, platform=platform,
            )  # fmt: skip
    return _in_order(cells.values())


MAX_REASON = 200  # characters of a failed job's reason the grid shows (the build log has the rest)


def _failure(result: str, reason: object) -> str:
    """A failed cell's detail: the job's result and, where the report gives one, the first line of its
    reason (`buildrecord.reason_line`, cut at MAX_REASON)."""
    line = buildrecord.reason_line(reason, MAX_REASON)
    if not line or line == result:
        return result
    return f"{result}: {line}"


def _covered(job: Mapping[str, object]) -> list[str]:
    """The later Pythons a report's abi3 job covers (its `covers`), as strings."""
    covers = job.get("covers")
    return [str(p) for p in covers] if isinstance(covers, list) else []


def merge_cells(existing: Iterable[MatrixCell], new: Iterable[MatrixCell]) -> tuple[MatrixCell, ...] | None:
    """Later reports override earlier ones, except that nothing overrides a built (published) cell. The
    same wheel published again keeps its first upload time and gains what is now published beside it."""
    cells = {c.key: c for c in existing}
    before = dict(cells)
    for cell in new:
        key = cell.key
        old = cells.get(key)
        if old is not None and old.status == "built" and cell.status != "built":
            continue
        if old is not None and old.status == "built" and cell.detail == old.detail:
            cell = replace(
                old,
                published=old.published or cell.published,
                beside=tuple(sorted({*old.beside, *cell.beside})),
            )
        cells[key] = cell
    if cells == before:
        return None
    return _in_order(cells.values())


def cells_to_json(cells: Iterable[MatrixCell]) -> str:
    rows = []
    for c in cells:
        row: dict[str, object] = {
            "project": c.project,
            "variant_id": c.variant_id,
            "python": c.python,
            "status": c.status,
            "detail": c.detail,
        }
        # Written only where known, so a grid written before they were is written back the same.
        if c.published:
            row["published"] = c.published
        if c.beside:
            row["beside"] = list(c.beside)
        if c.record:
            row["record"] = c.record
        if c.platform != platforms.DEFAULT_PLATFORM.name:
            row["platform"] = c.platform
        rows.append(row)
    return json.dumps({"cells": rows}, indent=2) + "\n"


_STATUSES: tuple[CellStatus, ...] = ("built", "failed", "not built")


def cells_from_json(text: str | bytes) -> tuple[MatrixCell, ...]:
    """The cells of a grid written by cells_to_json; DamagedState for anything else."""
    what = "a build matrix"
    cells = []
    for n, r in enumerate(_state_list(_state_doc(text, what=what), "cells", what=what)):
        where = f"cell {n + 1}"
        fields = {k: _state_str(r, k, where=where) for k in ("project", "variant_id", "python", "status")}
        status = next((s for s in _STATUSES if s == fields["status"]), None)
        if status is None:
            raise DamagedState(f"{where}: status {fields['status']!r} is not one of {', '.join(_STATUSES)}")
        beside = r.get("beside", [])
        if not isinstance(beside, list) or not all(isinstance(b, str) and b in BESIDE for b in beside):
            raise DamagedState(
                f"{where}: beside {json.dumps(beside)[:60]} is not a list of {', '.join(BESIDE)}"
            )
        record = _state_optional_str(r, "record", where=where) or ""
        if record and (status != "failed" or parse_failed_record_key(record) is None):
            raise DamagedState(f"{where}: record {record[:80]!r} is not a failed job's build record key")
        platform = _state_optional_str(r, "platform", where=where) or platforms.DEFAULT_PLATFORM.name
        if platforms.by_name(platform) is None:
            known = ", ".join(platforms.NAMES)
            raise DamagedState(f"{where}: platform {platform[:40]!r} is not one of {known}")
        cells.append(
            MatrixCell(
                project=fields["project"],
                variant_id=fields["variant_id"],
                python=fields["python"],
                status=status,
                detail=_state_optional_str(r, "detail", where=where) or "",
                published=_state_optional_str(r, "published", where=where) or "",
                beside=tuple(sorted(set(beside))),
                record=record,
                platform=platform,
            )
        )
    return tuple(cells)
