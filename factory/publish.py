"""Publishing wheels into per-variant simple indexes, safe under concurrent and interrupted publishers.

Order of writes: wheel -> <wheel>.metadata -> project page -> variant root -> root of variant indexes ->
human page, so at every instant a page lists only files that exist, and rerunning an interrupted publish
completes it.

Each page has a JSON "state" object (the PEP 691 page itself for project and variant pages) updated by
compare-and-swap: read it with its etag, merge the new records in, write it back only if nobody changed it
in the meantime (If-Match / If-None-Match), otherwise retry. Merges are grow-only unions, so no publisher's
files are lost. The HTML pages rendered from a state are then brought up to date by `_converge`, which
repeats until the state it rendered from is still the current one after its write: whoever changed the
state last also leaves the HTML right.
"""

from __future__ import annotations

import email.parser
import hashlib
import json
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from factory import index
from factory.errors import ConfigError, PublishError
from factory.index import FileRecord
from factory.stores import CONFLICT_ATTEMPTS, PreconditionFailed, Store, backoff, compare_and_swap, open_store
from factory.tags import python_tag

Progress = Callable[[str, str], None]
"""progress(event, key): event is "file", "metadata", "unchanged", "page" or "skip"."""


@dataclass(frozen=True, kw_only=True)
class WheelInfo:
    """What publishing needs to know about one wheel file, read from the file alone."""

    path: Path
    filename: str
    project: str
    variant_id: str
    sha256: str
    size: int
    metadata: bytes
    requires_python: str | None

    @property
    def metadata_sha256(self) -> str:
        return hashlib.sha256(self.metadata).hexdigest()


@dataclass(frozen=True, kw_only=True)
class PublishedFile:
    filename: str
    project: str
    variant_id: str
    status: Literal["published", "unchanged"]


@dataclass(frozen=True, kw_only=True)
class PublishResult:
    destination: str
    files: tuple[PublishedFile, ...]
    pages_written: tuple[str, ...]

    @property
    def variant_ids(self) -> tuple[str, ...]:
        return tuple(sorted({f.variant_id for f in self.files}))


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def inspect_wheel(path: Path) -> WheelInfo:
    """Name, variant, hashes and core metadata of a wheel; ConfigError for anything but a factory wheel."""
    from factory.variants import variant_id_from_local_version

    filename = path.name
    try:
        name, version, _build, _tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        raise ConfigError(f"{path}: not a wheel filename ({exc})") from None
    if version.local is None:
        raise ConfigError(
            f"{path}: version {version} has no local label naming its variant (like +cu13.0...)"
        )
    try:
        variant_id = variant_id_from_local_version(version.local)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    digest = hashlib.sha256()
    size = 0
    try:
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
                size += len(chunk)
        with zipfile.ZipFile(path) as zf:
            candidates = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
            if len(candidates) != 1:
                raise ConfigError(f"{path}: expected one *.dist-info/METADATA, found {len(candidates)}")
            metadata = zf.read(candidates[0])
    except (OSError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"{path}: cannot read wheel ({exc})") from None
    parsed = email.parser.BytesHeaderParser().parsebytes(metadata)
    meta_name = parsed.get("Name")
    if meta_name is None or canonicalize_name(meta_name) != name:
        raise ConfigError(f"{path}: METADATA Name {meta_name!r} does not match the filename")
    requires_python = parsed.get("Requires-Python")
    return WheelInfo(
        path=path,
        filename=filename,
        project=str(name),
        variant_id=variant_id,
        sha256=digest.hexdigest(),
        size=size,
        metadata=metadata,
        requires_python=str(requires_python).strip() if requires_python else None,
    )


def load_report(path: Path) -> list[Mapping[str, object]]:
    """The jobs of a build report (a list of jobs, or an object with a "jobs" list)."""
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read build report ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    jobs = doc.get("jobs") if isinstance(doc, dict) else doc
    if not isinstance(jobs, list) or not all(isinstance(j, dict) for j in jobs):
        raise ConfigError(
            f"{path}: a build report is a list of jobs (objects with variant_id, python, result)"
        )
    return jobs


def _put_immutable(store: Store, key: str, source: bytes | Path, sha256: str, *, content_type: str) -> bool:
    """Create `key` with these bytes; True if written, False if already there with the same bytes."""
    for attempt in range(CONFLICT_ATTEMPTS):
        try:
            store.put(
                key,
                source,
                content_type=content_type,
                cache_control=index.FILE_CACHE_CONTROL,
                if_none_match=True,
                sha256=sha256,
            )
            return True
        except PreconditionFailed:
            existing = store.sha256_of(key)
            if existing is None:  # a concurrent conflicting write that did not complete
                backoff(attempt)
                continue
            if existing != sha256:
                raise PublishError(
                    f"refusing to overwrite {key} in {store.description}: a different file of that name is "
                    f"already published (sha256 {existing[:12]}…, this one {sha256[:12]}…); bump the version"
                ) from None
            return False
    raise PublishError(f"could not write {key} in {store.description}: too many conflicting writers")


def _converge(
    store: Store,
    state_key: str,
    pages: Sequence[tuple[str, Callable[[bytes], bytes]]],
    *,
    content_type: str,
    written: list[str],
) -> None:
    """Make each derived page equal render(current state), robust against publishers doing the same."""
    for attempt in range(CONFLICT_ATTEMPTS):
        state = store.get(state_key)
        if state is None:
            return
        lost = False
        for key, render in pages:
            body = render(state.data)
            current = store.get(key)
            if current is not None and current.data == body:
                continue
            try:
                store.put(
                    key,
                    body,
                    content_type=content_type,
                    cache_control=index.PAGE_CACHE_CONTROL,
                    if_match=current.etag if current else None,
                    if_none_match=current is None,
                )
                written.append(key)
            except PreconditionFailed:
                lost = True
                break
        if not lost:
            after = store.get(state_key)
            if after is not None and after.etag == state.etag:
                return
        backoff(attempt)
    raise PublishError(f"could not update the pages of {state_key}: too many concurrent publishers")


def _page_keys(store: Store, directory: str) -> list[str]:
    """The keys one HTML page is stored under: dir/index.html, plus "dir/" itself where the store needs it."""
    keys = [f"{directory}index.html"]
    if store.wants_directory_keys and (directory or getattr(store, "prefix", "")):
        keys.append(directory)
    return keys


def publish_wheels(
    wheels: Sequence[Path],
    *,
    to: str,
    endpoint_url: str | None = None,
    report: Path | None = None,
    progress: Progress | None = None,
    store: Store | None = None,
) -> PublishResult:
    """Publish wheels (and the build report's matrix, if given) to a local directory or s3://bucket/prefix."""
    if not wheels:
        raise ConfigError("no wheels to publish")
    infos: dict[str, WheelInfo] = {}
    for path in wheels:
        info = inspect_wheel(Path(path))
        seen = infos.get(info.filename)
        if seen is not None and seen.sha256 != info.sha256:
            raise ConfigError(f"{seen.path} and {info.path}: same filename, different contents")
        infos[info.filename] = info
    jobs = load_report(report) if report is not None else []
    if store is None:
        store = open_store(to, endpoint_url=endpoint_url)
    notify: Progress = progress or (lambda _event, _key: None)
    written: list[str] = []
    results: list[PublishedFile] = []

    # 1-2. Files first, each immutable: a page may only ever point at complete files.
    records: dict[tuple[str, str], list[FileRecord]] = {}
    upload_time = _now()
    for info in sorted(infos.values(), key=lambda i: (i.variant_id, i.filename)):
        key = index.files_path(info.variant_id, info.filename)
        wrote = _put_immutable(store, key, info.path, info.sha256, content_type="application/octet-stream")
        notify("file" if wrote else "unchanged", key)
        wrote_meta = _put_immutable(
            store,
            key + ".metadata",
            info.metadata,
            info.metadata_sha256,
            content_type="text/plain; charset=utf-8",
        )
        notify("metadata" if wrote_meta else "unchanged", key + ".metadata")
        results.append(
            PublishedFile(
                filename=info.filename,
                project=info.project,
                variant_id=info.variant_id,
                status="published" if wrote else "unchanged",
            )
        )
        records.setdefault((info.variant_id, info.project), []).append(
            FileRecord(
                filename=info.filename,
                sha256=info.sha256,
                size=info.size,
                upload_time=upload_time,
                requires_python=info.requires_python,
                metadata_sha256=info.metadata_sha256,
            )
        )

    # 3. Project pages.
    for (variant_id, project), recs in sorted(records.items()):
        directory = index.project_dir(variant_id, project)

        def merge(
            current: bytes | None,
            recs: list[FileRecord] = recs,
            project: str = project,
            variant_id: str = variant_id,
            directory: str = directory,
        ) -> bytes | None:
            existing = index.records_from_project_json(current) if current else ()
            try:
                merged = index.merge_records(existing, recs)
            except index.RecordConflict as exc:
                raise PublishError(f"{directory}: {exc}") from None
            if merged is None:
                return None
            return index.project_json(project, merged, variant_id=variant_id).encode()

        state_key = f"{directory}index.json"
        changed = compare_and_swap(
            store, state_key, merge, content_type=index.PYPI_JSON_TYPE, cache_control=index.PAGE_CACHE_CONTROL
        )
        notify("page" if changed else "skip", state_key)
        if changed:
            written.append(state_key)

        def render(state: bytes, project: str = project, variant_id: str = variant_id) -> bytes:
            recs = index.records_from_project_json(state)
            return index.project_html(project, recs, variant_id=variant_id).encode()

        _converge(
            store,
            state_key,
            [(k, render) for k in _page_keys(store, directory)],
            content_type=index.HTML_TYPE,
            written=written,
        )

    # 4. The root page of each variant index.
    projects_by_variant: dict[str, set[str]] = {}
    for variant_id, project in records:
        projects_by_variant.setdefault(variant_id, set()).add(str(canonicalize_name(project)))
    for variant_id, projects in sorted(projects_by_variant.items()):
        directory = index.variant_dir(variant_id)
        state_key = f"{directory}index.json"

        def merge_projects(current: bytes | None, projects: set[str] = projects) -> bytes | None:
            existing = index.projects_from_root_json(current) if current else ()
            merged = index.merge_names(existing, projects)
            return None if merged is None else index.variant_root_json(merged).encode()

        if compare_and_swap(
            store,
            state_key,
            merge_projects,
            content_type=index.PYPI_JSON_TYPE,
            cache_control=index.PAGE_CACHE_CONTROL,
        ):
            written.append(state_key)
        _converge(
            store,
            state_key,
            [
                (k, lambda s: index.variant_root_html(index.projects_from_root_json(s)).encode())
                for k in _page_keys(store, directory)
            ],
            content_type=index.HTML_TYPE,
            written=written,
        )
        notify("page", f"{directory}index.html")

    # 5. The list of variant indexes.
    def merge_variants(current: bytes | None) -> bytes | None:
        existing = index.variant_ids_from_top_root_json(current) if current else ()
        merged = index.merge_names(existing, projects_by_variant)
        return None if merged is None else index.top_root_json(merged).encode()

    if compare_and_swap(
        store,
        "simple/variants.json",
        merge_variants,
        content_type="application/json",
        cache_control=index.PAGE_CACHE_CONTROL,
    ):
        written.append("simple/variants.json")
    _converge(
        store,
        "simple/variants.json",
        [
            (k, lambda s: index.top_root_html(index.variant_ids_from_top_root_json(s)).encode())
            for k in _page_keys(store, "simple/")
        ],
        content_type=index.HTML_TYPE,
        written=written,
    )
    notify("page", "simple/index.html")

    # 6. The human page: the matrix as the reports and the published files describe it.
    published = [(variant_id, rec) for (variant_id, _p), recs in records.items() for rec in recs]
    projects = {info.project for info in infos.values()}
    cells = index.matrix_cells(
        jobs, published, project_hint=next(iter(projects)) if len(projects) == 1 else None
    )

    def merge_matrix(current: bytes | None) -> bytes | None:
        existing = index.cells_from_json(current) if current else ()
        merged = index.merge_cells(existing, cells)
        return None if merged is None else index.cells_to_json(merged).encode()

    if compare_and_swap(
        store,
        "matrix.json",
        merge_matrix,
        content_type="application/json",
        cache_control=index.PAGE_CACHE_CONTROL,
    ):
        written.append("matrix.json")
    _converge(
        store,
        "matrix.json",
        [(k, lambda s: index.human_page(index.cells_from_json(s)).encode()) for k in _page_keys(store, "")],
        content_type=index.HTML_TYPE,
        written=written,
    )
    notify("page", "index.html")
    return PublishResult(destination=store.description, files=tuple(results), pages_written=tuple(written))


def published_files(store: Store, *, project: str, variant_id: str) -> tuple[str, ...]:
    """The files the variant's project page lists; () when there is no page, or one this factory did not
    write (publishing will say what is wrong with it)."""
    page = store.get(f"{index.project_dir(variant_id, project)}index.json")
    try:
        return tuple(r.filename for r in index.records_from_project_json(page.data)) if page else ()
    except (ValueError, KeyError, TypeError):
        return ()


def published_wheel(filenames: Iterable[str], *, project: str, version: str, python: str) -> str | None:
    """The one of `filenames` that is this project's wheel of `version` for CPython `python` ("3.11")."""
    interpreter = python_tag(python)
    for filename in filenames:
        try:
            name, found, _build, tags = parse_wheel_filename(filename)
        except InvalidWheelFilename:
            continue
        if (
            name == canonicalize_name(project)
            and found == Version(version)
            and any(t.interpreter == interpreter for t in tags)
        ):
            return filename
    return None


def wheels_in(directory: Path) -> list[Path]:
    """The wheels directly inside a wheel directory (what `factory build` leaves there)."""
    if not directory.is_dir():
        raise ConfigError(f"{directory}: no such directory")
    wheels = sorted(p for p in directory.iterdir() if p.suffix == ".whl" and p.is_file())
    if not wheels:
        raise ConfigError(f"{directory}: no .whl files to publish")
    return wheels


def describe(result: PublishResult) -> Iterable[str]:
    """Human summary lines of a publish."""
    for f in result.files:
        yield f"{f.status:9} {f.variant_id}/{f.filename}"
    yield f"index: {result.destination} ({len(result.pages_written)} page objects written)"
