"""Publishing wheels into per-variant simple indexes, safe under concurrent and interrupted publishers.

Order of writes: wheel -> <wheel>.metadata (-> <wheel>.provenance.json and <wheel>.sbom.cdx.json, the ones
it carries) (-> <wheel>.sig.json, signing) (-> <wheel>.build.json, with a build report) -> project page ->
variant root -> root of variant indexes -> human page, so at every instant a page lists only files that
exist, and rerunning an interrupted publish completes it.

The pages are those of `site.site_state` of the new files, each merged into the store's by `sync_page`
with the reader, merge and renderers of its kind (`site.KINDS`). Each page has a JSON "state" object (the
PEP 691 page itself for project and variant pages) updated by compare-and-swap: read it with its etag, merge
the new items in, write it back only if nobody changed it in the meantime (If-Match / If-None-Match),
otherwise retry. Merges are grow-only unions, so no publisher's files are lost. The HTML pages rendered from
a state are then brought up to date by `converge_pages`, which repeats until the state it rendered from is
still the current one after its write: whoever changed the state last also leaves the HTML right.

`repair_index` rebuilds the whole state from the wheel files and writes `site.build_site` of it, where it
differs.

With `variants` (experimental), `publish_variants` then writes the wheel variant channel under `variants/`
(`factory.publish.wheelvariants`) in the same order: the variant wheels, each project page's state, what it
makes.
"""

from __future__ import annotations

import email.parser
import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal, NoReturn, TypeVar

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from factory.core import bounded, storeurl
from factory.core.errors import CheckError, ConfigError, PublishError
from factory.core.platforms import NAMES, Platform, by_name
from factory.core.tags import canonical_wheel_filename, python_tag
from factory.publish import index, site, wheelvariants
from factory.publish.index import FileRecord, PageRef
from factory.publish.stores import (
    CONFLICT_ATTEMPTS,
    PreconditionFailed,
    Store,
    backoff,
    compare_and_swap,
    open_store,
)
from factory.wheel import checkrecord
from factory.wheel.checks import wheel_archive_problems

if TYPE_CHECKING:
    from factory.trust.signing import Signer

T = TypeVar("T")
Progress = Callable[[str, str], None]
"""progress(event, key): event is "file", "metadata", "provenance", "sbom", "signature", "build-record",
"unchanged" (a file's key), "page" or "skip" (whether anything of a page was written; its HTML key)."""


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
    provenance: bytes | None = None  # its .dist-info/factory-provenance.json, when it has a valid one
    sbom: bytes | None = None  # the .dist-info/sboms/ file that provenance names, when it is a valid one

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
    signed_by: str | None = None  # the key id of the signer, when publishing signed
    signatures_written: int = 0  # of `files`, those whose signature file this publish wrote
    # the wheel variant channel (publish.variants, --variants): its files (`variant_id`: the variant index,
    # `wheelvariants.group_of`), and "<wheel>: why it is not on the variant index"
    variant_files: tuple[PublishedFile, ...] = ()
    variant_notes: tuple[str, ...] = ()

    @property
    def variant_ids(self) -> tuple[str, ...]:
        return tuple(sorted({f.variant_id for f in self.files}))


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# A wheel's core metadata is a few KB; a bigger one is a mistake or an attack on whoever reads the index.
MAX_METADATA_BYTES = 1 << 20
REPAIR_HINT = "rebuild the index pages from the wheel files with: factory index repair --to {to}"


def read_metadata(source: Path | IO[bytes], shown: str) -> bytes:
    """The *.dist-info/METADATA of a wheel, read at most MAX_METADATA_BYTES + 1 bytes deep (never
    inflated whole); ConfigError naming `shown` for anything but one such file of at most that size."""
    try:
        with bounded.open_zip(source) as zf:
            candidates = [i for i in zf.infolist() if i.filename.count("/") == 1]
            candidates = [i for i in candidates if i.filename.endswith(".dist-info/METADATA")]
            if len(candidates) != 1:
                raise ConfigError(f"{shown}: expected one *.dist-info/METADATA, found {len(candidates)}")
            try:
                return bounded.read_member(zf, candidates[0], max_bytes=MAX_METADATA_BYTES)
            except bounded.Refused:
                raise ConfigError(
                    f"{shown}: METADATA is larger than {MAX_METADATA_BYTES // (1 << 20)} MiB, the most this "
                    "index publishes (core metadata is normally a few KB)"
                ) from None
    except bounded.MEMBER_ERRORS as exc:
        raise ConfigError(f"{shown}: cannot read wheel ({exc})") from None


def check_metadata(metadata: bytes, *, name: str, version: Version, shown: str) -> str | None:
    """Requires-Python of a METADATA whose Name and Version are the filename's (pip refuses a wheel whose
    metadata disagrees with its name: "inconsistent version"); ConfigError otherwise."""
    parsed = email.parser.BytesHeaderParser().parsebytes(metadata)
    meta_name = parsed.get("Name")
    if meta_name is None or canonicalize_name(str(meta_name)) != name:
        raise ConfigError(f"{shown}: METADATA Name {meta_name!r} does not match the filename's {name!r}")
    meta_version = parsed.get("Version")
    try:
        same = meta_version is not None and Version(str(meta_version)) == version
    except InvalidVersion:
        same = False
    if not same:
        raise ConfigError(
            f"{shown}: METADATA Version {meta_version!r} does not match the filename's {str(version)!r} "
            "(pip refuses such a wheel as inconsistent)"
        )
    requires_python = parsed.get("Requires-Python")
    return str(requires_python).strip() if requires_python else None


def inspect_wheel(path: Path) -> WheelInfo:
    """Name, variant, hashes and core metadata of a wheel; ConfigError for anything but a factory wheel,
    PublishError for one an installer would refuse (`wheelcheck.archive_problems`).

    `filename` is the canonical spelling (`tags.canonical_wheel_filename`), whatever the file is called."""
    from factory.core.variants import variant_id_from_local_version

    try:
        name, version, _build, _tags = parse_wheel_filename(path.name)
        filename = canonical_wheel_filename(path.name)
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
        with bounded.open_file(path, max_bytes=None) as fh:  # a FIFO is refused, never waited on
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
                size += len(chunk)
    except bounded.Refused as exc:
        raise ConfigError(f"{exc}; not a wheel") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read wheel ({exc.strerror})") from None
    metadata = read_metadata(path, str(path))
    requires_python = check_metadata(metadata, name=str(name), version=version, shown=str(path))
    # Checked as an installer checks it, since a published file can never be replaced: a wheel pip or uv
    # refuses (a RECORD that does not match) or unpacks outside its directory ("../") must never get in.
    problems = wheel_archive_problems(path)
    if problems:
        raise PublishError(f"{path}: {problems[0]}; not published")
    from factory.wheel.embedded import provenance_bytes, sbom_bytes

    return WheelInfo(
        path=path,
        filename=filename,
        project=str(name),
        variant_id=variant_id,
        sha256=digest.hexdigest(),
        size=size,
        metadata=metadata,
        requires_python=requires_python,
        provenance=provenance_bytes(path),
        sbom=sbom_bytes(path),
    )


SBOM_TYPE = "application/vnd.cyclonedx+json"  # CycloneDX's registered media type

# A build report of the largest matrix (config.MAX_PLANNED_JOBS jobs of a few KiB each) is a few MiB; more is
# not one.
MAX_REPORT_BYTES = 64 << 20

# The fields of a build report's job (factory.build.runner.JobResult) that publishing reads, and their types.
_JOB_FIELDS: Mapping[str, tuple[type, ...]] = {
    "variant_id": (str,),
    "python": (str,),
    "result": (str,),
    "package": (str, type(None)),
    "wheel": (str, type(None)),
    "platform": (str, type(None)),  # absent in a report older than the platform axis: the default platform
}


def load_report(path: Path) -> list[Mapping[str, object]]:
    """The jobs of a build report (a list of jobs, or an object with a "jobs" list), every one checked
    before anything is published."""
    try:
        doc = json.loads(bounded.read_file(path, max_bytes=MAX_REPORT_BYTES))
    except bounded.Refused as exc:
        raise ConfigError(f"{exc}; not a build report") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read build report ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a build report (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    jobs = doc.get("jobs") if isinstance(doc, dict) else doc
    if not isinstance(jobs, list) or not all(isinstance(j, dict) for j in jobs):
        raise ConfigError(
            f"{path}: a build report is a list of jobs (objects with variant_id, python, result)"
        )
    for n, job in enumerate(jobs, 1):
        for key, types in _JOB_FIELDS.items():
            value = job.get(key)
            if value is None and type(None) not in types:
                raise ConfigError(f"{path}: job {n} has no {key!r}")
            if not isinstance(value, types):
                raise ConfigError(f"{path}: job {n}: {key!r} is {json.dumps(value)[:60]}, not a string")
        platform = job.get("platform")
        if platform is not None and by_name(str(platform)) is None:
            raise ConfigError(
                f"{path}: job {n}: platform {json.dumps(platform)[:60]} is not one of {', '.join(NAMES)}"
            )
        wheel = job.get("wheel")
        if wheel:
            try:
                parse_wheel_filename(str(wheel))
            except InvalidWheelFilename:
                raise ConfigError(
                    f"{path}: job {n}: wheel {str(wheel)[:80]!r} is not a wheel filename"
                ) from None
    return jobs


def _refuse_overwrite(store: Store, key: str, published: str, new: str) -> NoReturn:
    raise PublishError(
        f"refusing to overwrite {key} in {store.description}: a different file of that name is "
        f"already published (sha256 {published[:12]}…, this one {new[:12]}…); bump the version"
    )


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
                _refuse_overwrite(store, key, existing, sha256)
            return False
    raise PublishError(f"could not write {key} in {store.description}: too many conflicting writers")


def converge_pages(
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


def _state(
    store: Store, key: str, reader: Callable[[bytes], tuple[T, ...]], data: bytes | None, *, mend: str
) -> tuple[T, ...]:
    """What a state object says (nothing when it is absent); a damaged one is a PublishError naming it
    and what mends it (`mend`)."""
    if data is None:
        return ()
    try:
        return reader(data)
    except index.DamagedState as exc:
        raise PublishError(f"{key} in {store.description} is damaged ({exc}); {mend}") from None


# `factory index repair` does not cover the wheel variant channel
CHANNEL_MEND = f"remove {wheelvariants.PREFIX} there and publish the wheels again with --variants"


def state_reader(store: Store, page: PageRef, *, to: str) -> Callable[[bytes | None], site.Items]:
    """The items of `page`'s state object as publishing reads them: () when absent, PublishError (naming the
    repair) when damaged."""
    read = site.KINDS[page.kind].read
    return lambda data: _state(store, page.state_key, read, data, mend=REPAIR_HINT.format(to=to))


def _merged(page: PageRef, existing: site.Items, new: site.Items) -> site.Items | None:
    try:
        return site.KINDS[page.kind].merge(existing, new)
    except index.RecordConflict as exc:
        raise PublishError(f"{page.directory}: {exc}; bump the version") from None


def _merge_with(page: PageRef, new: site.Items) -> Callable[[site.Items], site.Items | None]:
    return lambda existing: _merged(page, existing, new)


def list_page_keys(store: Store, directory: str) -> list[str]:
    """The keys one HTML page is stored under: dir/index.html, plus "dir/" itself where the store needs it."""
    keys = [f"{directory}index.html"]
    if store.wants_directory_keys and (directory or getattr(store, "prefix", "")):
        keys.append(directory)
    return keys


def store_keys(store: Store, key: str) -> list[str]:
    """The keys a page object of the site (`site.build_site`'s) is stored under in `store`."""
    parsed = index.parse_page_key(key)
    if parsed is not None and parsed[1] == "html":
        return list_page_keys(store, parsed[0].directory)
    return [key]


def sync_page(
    store: Store,
    page: PageRef,
    update: Callable[[site.Items], site.Items | None],
    *,
    read: Callable[[bytes | None], site.Items],
    written: list[str],
) -> bool:
    """Merge into `page`'s state object by compare-and-swap (`update(items)`, None: nothing new), then bring
    its HTML up to date with whatever the state is now; True if anything was written."""
    kind = site.KINDS[page.kind]
    before = len(written)

    def swap(current: bytes | None) -> bytes | None:
        merged = update(read(current))
        return None if merged is None else kind.state(page, merged).encode()

    if compare_and_swap(
        store, page.state_key, swap, content_type=kind.state_type, cache_control=index.PAGE_CACHE_CONTROL
    ):
        written.append(page.state_key)
    converge_pages(
        store,
        page.state_key,
        [
            (key, lambda data: kind.html(page, read(data)).encode())
            for key in list_page_keys(store, page.directory)
        ],
        content_type=index.HTML_TYPE,
        written=written,
    )
    return len(written) > before


def _check_before_writing(store: Store, new: site.SiteState, *, to: str) -> None:
    """Refuse before the first write what the page merges would refuse after the files: a damaged state
    object, another spelling of a published release, a published filename with other bytes."""
    for page, items in site.pages(new):
        current = store.get(page.state_key)
        existing = state_reader(store, page, to=to)(current.data if current else None)
        if page.kind == "project":
            listed = {r.filename: r.sha256 for r in existing}
            for rec in items:
                if listed.get(rec.filename, rec.sha256) != rec.sha256:
                    key = index.files_path(page.variant_id, rec.filename)
                    _refuse_overwrite(store, key, listed[rec.filename], rec.sha256)
        _merged(page, existing, items)


def _inspect_all(wheels: Sequence[Path]) -> dict[str, WheelInfo]:
    """The wheels to publish by canonical filename; ConfigError for two different files of one name."""
    if not wheels:
        raise ConfigError("no wheels to publish")
    infos: dict[str, WheelInfo] = {}
    for path in wheels:
        info = inspect_wheel(Path(path))
        seen = infos.get(info.filename)
        if seen is not None and seen.sha256 != info.sha256:
            raise ConfigError(
                f"{seen.path} and {info.path}: both are {info.filename} (canonical spelling), "
                "different contents"
            )
        infos[info.filename] = info
    return infos


def _put_once(store: Store, key: str, body: bytes, *, content_type: str) -> bool:
    """Create `key` with these bytes unless it exists, whatever it holds; True if written. For a file that
    may differ each time it is made but must never change once published (a signature by another key)."""
    try:
        store.put(
            key,
            body,
            content_type=content_type,
            cache_control=index.FILE_CACHE_CONTROL,
            if_none_match=True,
            sha256=hashlib.sha256(body).hexdigest(),
        )
    except PreconditionFailed:
        return False
    return True


def stable_pages(info: WheelInfo, jobs: Sequence[Mapping[str, object]]) -> tuple[str, ...]:
    """The variant pages a stable-ABI wheel is listed on: the torch variant of every torch its build report's
    job covers (`torches`), each one its label covers; ConfigError where the report does not say."""
    from factory.core.variants import VariantKey

    key = VariantKey.parse_id(info.variant_id)
    torches = [
        job.get("torches")
        for job in jobs
        if isinstance(job.get("wheel"), str) and canonical_wheel_filename(str(job["wheel"])) == info.filename
    ]
    listed = next((t for t in torches if isinstance(t, list) and t), None)
    if listed is None:
        raise ConfigError(
            f"{info.path}: a stable-ABI wheel is listed on the page of each torch its build covers; "
            "publish it with its build's report (--report), whose job names them (torches)"
        )
    pages = []
    for torch in listed:
        try:
            page = key.with_torch(str(torch))
        except ValueError as exc:
            raise ConfigError(f"{info.path}: the report's torches: {exc}") from None
        if not key.covers(page):
            raise ConfigError(
                f"{info.path}: its label's stable ABI (torch {key.torch}) does not cover torch {torch}"
            )
        pages.append(page.id)
    return tuple(dict.fromkeys(pages))


def placements(
    infos: Iterable[WheelInfo], jobs: Sequence[Mapping[str, object]]
) -> list[tuple[str, WheelInfo]]:
    """(variant id, wheel) of every page listing of the wheels: a wheel's own variant, or each torch variant a
    stable-ABI wheel covers (`stable_pages`); the file is stored under each, as every page links its own."""
    from factory.core.variants import VariantKey

    out: list[tuple[str, WheelInfo]] = []
    for info in infos:
        if VariantKey.parse_id(info.variant_id).stable:
            out += [(page, info) for page in stable_pages(info, jobs)]
        else:
            out.append((info.variant_id, info))
    return sorted(out, key=lambda p: (p[0], p[1].filename))


def build_records(
    report: Path, jobs: Sequence[Mapping[str, object]], infos: Mapping[str, WheelInfo]
) -> dict[str, bytes]:
    """The build record (`factory.wheel.record`) of each wheel of `infos` that a job of the report built:
    its canonical filename -> the record's bytes."""
    from factory.wheel import embedded
    from factory.wheel import record as buildrecord

    try:
        doc = json.loads(bounded.read_file(report, max_bytes=MAX_REPORT_BYTES))
    except (OSError, ValueError):  # load_report has read it once: a report changed under us has no records
        return {}
    top: Mapping[str, object] = doc if isinstance(doc, dict) else {}
    out: dict[str, bytes] = {}
    for job in jobs:
        wheel = job.get("wheel")
        if job.get("result") != "ok" or not isinstance(wheel, str):
            continue
        info = infos.get(canonical_wheel_filename(wheel))
        if info is None:
            continue
        record = buildrecord.from_report(
            top, job, filename=info.filename, sha256=info.sha256,
            provenance_sha256=embedded.provenance_sha256(info.path),
        )  # fmt: skip
        out[info.filename] = buildrecord.dumps(record)
    return out


def failed_records(report: Path, jobs: Sequence[Mapping[str, object]]) -> dict[str, tuple[str, bytes]]:
    """The build record (`factory.wheel.record`) of each job of the report that failed: its job id -> the
    record's key under the index (`index.failed_record_path`, named by a hash of its bytes) and bytes. A
    job whose id or variant cannot name a key has none (its cell still shows the failure)."""
    from factory.wheel import record as buildrecord

    try:
        doc = json.loads(bounded.read_file(report, max_bytes=MAX_REPORT_BYTES))
    except (OSError, ValueError):  # as build_records: a report changed under us has no records
        return {}
    top: Mapping[str, object] = doc if isinstance(doc, dict) else {}
    out: dict[str, tuple[str, bytes]] = {}
    for job in jobs:
        if job.get("result") not in buildrecord.FAILED_RESULTS:
            continue
        try:
            record = buildrecord.from_report(top, job, filename=None, sha256=None, provenance_sha256=None)
            data = buildrecord.dumps(record)
            key = index.failed_record_path(
                str(job.get("variant_id")), str(job.get("job_id")), hashlib.sha256(data).hexdigest()
            )
        except (CheckError, ValueError):
            continue
        out[str(job["job_id"])] = (key, data)
    return out


def _beside(info: WheelInfo, signer: Signer | None, records: Mapping[str, bytes]) -> list[str]:
    """What `_put_files` publishes beside a wheel (index.BESIDE's names), for the human page."""
    return [
        name
        for name, there in (
            ("provenance", info.provenance is not None),
            ("sbom", info.sbom is not None),
            ("signature", signer is not None),
            ("build-record", info.filename in records),
        )
        if there
    ]


def _put_files(
    store: Store,
    placed: Iterable[tuple[str, WheelInfo]],
    notify: Progress,
    signer: Signer | None = None,
    records: Mapping[str, bytes] | None = None,
) -> list[PublishedFile]:
    """Each wheel, then its .metadata, its provenance and SBOM (the in-wheel files' bytes, when it has valid
    ones), its signature when `signer` and its build record when `records` has one, immutable: a page may
    only ever point at complete files. A wheel published before, unsigned, gets its signature file now; one
    signed before keeps the signature it has; so does a build record."""
    results = []
    for variant_id, info in placed:
        key = index.files_path(variant_id, info.filename)
        wrote = _put_immutable(store, key, info.path, info.sha256, content_type="application/octet-stream")
        notify("file" if wrote else "unchanged", key)
        meta_key = index.metadata_path(variant_id, info.filename)
        wrote_meta = _put_immutable(
            store, meta_key, info.metadata, info.metadata_sha256, content_type="text/plain; charset=utf-8"
        )
        notify("metadata" if wrote_meta else "unchanged", meta_key)
        if info.provenance is not None:
            prov_key = index.provenance_path(variant_id, info.filename)
            prov_sha = hashlib.sha256(info.provenance).hexdigest()
            wrote_prov = _put_immutable(
                store, prov_key, info.provenance, prov_sha, content_type="application/json"
            )
            notify("provenance" if wrote_prov else "unchanged", prov_key)
        if info.sbom is not None:
            sbom_key = index.sbom_path(variant_id, info.filename)
            sbom_sha = hashlib.sha256(info.sbom).hexdigest()
            wrote_sbom = _put_immutable(store, sbom_key, info.sbom, sbom_sha, content_type=SBOM_TYPE)
            notify("sbom" if wrote_sbom else "unchanged", sbom_key)
        if signer is not None:
            sig_key = index.signature_path(variant_id, info.filename)
            body = signer.sign(info.filename, info.sha256)
            wrote_sig = _put_once(store, sig_key, body, content_type="application/json")
            notify("signature" if wrote_sig else "unchanged", sig_key)
        record = (records or {}).get(info.filename)
        if record is not None:
            record_key = index.build_record_path(variant_id, info.filename)
            wrote_record = _put_once(store, record_key, record, content_type="application/json")
            notify("build-record" if wrote_record else "unchanged", record_key)
        status: Literal["published", "unchanged"] = "published" if wrote else "unchanged"
        results.append(
            PublishedFile(filename=info.filename, project=info.project, variant_id=variant_id, status=status)
        )
    return results


def publish_wheels(
    wheels: Sequence[Path],
    *,
    to: str,
    endpoint_url: str | None = None,
    report: Path | None = None,
    progress: Progress | None = None,
    store: Store | None = None,
    signer: Signer | None = None,
    force_failed: bool = False,
    variants: bool = False,
) -> PublishResult:
    """Publish wheels (and the build report's matrix, if given) to a local directory or s3://bucket/prefix:
    the files first, then each page of `site.site_state` of what they add, merged into the store's in
    write order (project pages, variant roots, the list of variant indexes, the human page). With `signer`
    (made on this host: `signing.signer_from`), each wheel gets a signature file beside it; with `report`,
    each wheel a job of it built gets its build record (`factory.wheel.record`) beside it. A wheel that
    failed its checks (`checkrecord.failure_of`) is refused before anything is written, unless
    `force_failed`. With `variants`, the wheels are then published as variant wheels too
    (`publish_variants`, experimental)."""
    infos = _inspect_all(wheels)
    jobs = load_report(report) if report is not None else []
    if not force_failed:
        refuse_failed(wheels, jobs)
    if store is None:
        store = open_store(to, endpoint_url=endpoint_url)
    told: Progress = progress or (lambda _event, _key: None)
    signatures: list[str] = []

    def notify(event: str, key: str) -> None:
        if event == "signature":
            signatures.append(key)
        told(event, key)

    records: dict[tuple[str, str], list[FileRecord]] = {}
    upload_time = _now()
    placed = placements(infos.values(), jobs)
    for variant_id, info in placed:
        records.setdefault((variant_id, info.project), []).append(
            FileRecord(
                filename=info.filename,
                sha256=info.sha256,
                size=info.size,
                upload_time=upload_time,
                requires_python=info.requires_python,
                metadata_sha256=info.metadata_sha256,
            )
        )
    # The human page: the matrix as the reports and the published files describe it.
    published = [(variant_id, rec) for (variant_id, _p), recs in records.items() for rec in recs]
    projects = {info.project for info in infos.values()}
    beside = build_records(report, jobs, infos) if report is not None else {}
    failures = failed_records(report, jobs) if report is not None else {}
    cells = index.matrix_cells(
        jobs,
        published,
        project_hint=next(iter(projects)) if len(projects) == 1 else None,
        beside={(variant_id, info.filename): _beside(info, signer, beside) for variant_id, info in placed},
        failed_records={job_id: key for job_id, (key, _data) in failures.items()},
    )
    new = site.site_state(records, cells)
    _check_before_writing(store, new, to=to)

    results = _put_files(store, placed, notify, signer, beside)
    for key, data in failures.values():  # immutable, and before the grid that links it
        wrote = _put_once(store, key, data, content_type="application/json")
        notify("build-record" if wrote else "unchanged", key)
    written: list[str] = []
    for page, items in site.pages(new):
        read = state_reader(store, page, to=to)
        wrote = sync_page(store, page, _merge_with(page, items), read=read, written=written)
        notify("page" if wrote else "skip", page.html_key)
    variant_files, variant_notes = publish_variants(store, infos.values(), notify) if variants else ((), ())
    return PublishResult(
        destination=store.description,
        files=tuple(results),
        pages_written=tuple(written),
        signed_by=signer.key_id if signer is not None else None,
        signatures_written=len(signatures),
        variant_files=variant_files,
        variant_notes=variant_notes,
    )


@dataclass(frozen=True, kw_only=True)
class _Planned:
    group: str
    info: WheelInfo
    path: Path  # the variant wheel, in a temporary directory
    file: wheelvariants.VariantFile


def _plan_variants(infos: Iterable[WheelInfo], tmp: Path) -> tuple[list[_Planned], list[str]]:
    """Each wheel's variant wheel, made in `tmp`, or the note saying why it has none. Two wheels that would
    make one variant file (the same properties: {8.0} and {8.0, 9.0a}) give it to the first by variant id."""
    from factory.core.variants import VariantKey

    planned: dict[tuple[str, str], _Planned] = {}
    notes = []
    for info in sorted(infos, key=lambda i: (i.variant_id, i.filename)):
        key = VariantKey.parse_id(info.variant_id)
        try:
            props = wheelvariants.nvidia_properties(key)
        except ValueError as exc:
            notes.append(f"{info.filename}: {exc}")
            continue
        group = wheelvariants.group_of(key)
        name = wheelvariants.variant_filename(info.filename, props.label)
        other = planned.get((group, name))
        if other is not None:
            notes.append(f"{info.filename}: the same variant ({name}) as {other.info.filename}")
            continue
        path = wheelvariants.make_variant_wheel(info.path, info.filename, key, tmp)
        metadata = read_metadata(path, str(path))
        file = wheelvariants.VariantFile(
            filename=name,
            sha256=bounded.file_sha256(path),
            size=path.stat().st_size,
            properties=props,
            metadata_sha256=hashlib.sha256(metadata).hexdigest(),
            requires_python=info.requires_python,
        )
        planned[(group, name)] = _Planned(group=group, info=info, path=path, file=file)
    return list(planned.values()), notes


def _variant_state(store: Store, key: str) -> tuple[wheelvariants.VariantFile, ...]:
    current = store.get(key)
    return _state(
        store, key, wheelvariants.files_from_state, current.data if current else None, mend=CHANNEL_MEND
    )


def publish_variants(
    store: Store, infos: Iterable[WheelInfo], notify: Progress
) -> tuple[tuple[PublishedFile, ...], tuple[str, ...]]:
    """The experimental wheel variant channel (`factory.publish.wheelvariants`): each wheel rewritten as a
    variant wheel and published under `variants/<group>/files/` (immutable, with its .metadata), then each
    project page's state merged by compare-and-swap and the pages made from it (`variant_site`: each release's
    variants.json, the project page, the group's root, the list of groups) brought up to date. A variant file
    already published with other bytes (the same properties from another arch set) keeps its place and the
    wheel gets a note; one whose core metadata differs from its release's other variants is refused
    (PublishError) before anything of the channel is written. Returns (files, notes)."""
    with tempfile.TemporaryDirectory(prefix="factory-variants-") as tmp:
        planned, notes = _plan_variants(infos, Path(tmp))
        kept = []
        for p in planned:
            existing = store.sha256_of(wheelvariants.files_key(p.group, p.file.filename))
            if existing is not None and existing != p.file.sha256:
                notes.append(
                    f"{p.info.filename}: {p.group}/{p.file.filename} is published from another wheel"
                )
                continue
            kept.append(p)
        pages: dict[tuple[str, str], list[wheelvariants.VariantFile]] = {}
        for p in kept:
            pages.setdefault((p.group, p.info.project), []).append(p.file)
        for (group, project), files in pages.items():  # refused before the first write, as the pages are
            key = wheelvariants.state_key(group, project)
            try:
                wheelvariants.merge_files(_variant_state(store, key), files)
            except index.RecordConflict as exc:
                raise PublishError(f"{wheelvariants.project_dir(group, project)}: {exc}") from None
        done: list[PublishedFile] = []
        for p in kept:
            key = wheelvariants.files_key(p.group, p.file.filename)
            wrote = _put_immutable(store, key, p.path, p.file.sha256, content_type="application/octet-stream")
            notify("file" if wrote else "unchanged", key)
            metadata = read_metadata(p.path, str(p.path))
            _put_immutable(
                store,
                f"{key}.metadata",
                metadata,
                p.file.metadata_sha256,
                content_type="text/plain; charset=utf-8",
            )
            status: Literal["published", "unchanged"] = "published" if wrote else "unchanged"
            done.append(
                PublishedFile(
                    filename=p.file.filename, project=p.info.project, variant_id=p.group, status=status
                )
            )
    for (group, project), files in sorted(pages.items()):
        _sync_variant_page(store, group, project, files, notify)
    if pages:
        _sync_variant_roots(store, pages, notify)
    return tuple(done), tuple(notes)


def _sync_variant_page(
    store: Store,
    group: str,
    project: str,
    files: Sequence[wheelvariants.VariantFile],
    notify: Progress,
) -> None:
    """Merge `files` into the project page's state, then write what the state makes: each release's
    variants.json before the page that links it."""
    key = wheelvariants.state_key(group, project)

    def swap(current: bytes | None) -> bytes | None:
        existing = _state(store, key, wheelvariants.files_from_state, current, mend=CHANNEL_MEND)
        try:
            merged = wheelvariants.merge_files(existing, files)
        except index.RecordConflict as exc:
            raise PublishError(f"{wheelvariants.project_dir(group, project)}: {exc}") from None
        return None if merged is None else wheelvariants.state_json(project, merged).encode()

    written: list[str] = []
    if compare_and_swap(
        store, key, swap, content_type="application/json", cache_control=index.PAGE_CACHE_CONTROL
    ):
        written.append(key)

    def render(out_key: str) -> Callable[[bytes], bytes]:
        def one(data: bytes) -> bytes:
            files = wheelvariants.files_from_state(data)
            return wheelvariants.variant_site({(group, project): files})[out_key]

        return one

    current = store.get(key)
    outputs = wheelvariants.variant_site(
        {(group, project): wheelvariants.files_from_state(current.data) if current else ()}
    )
    documents = [(k, render(k)) for k in outputs if k.endswith("-variants.json")]
    page_dir = wheelvariants.project_dir(group, project)
    html = [(k, render(f"{page_dir}index.html")) for k in list_page_keys(store, page_dir)]
    for pages, content_type in ((documents, "application/json"), (html, index.HTML_TYPE)):
        converge_pages(store, key, pages, content_type=content_type, written=written)
    notify("page" if written else "skip", f"{page_dir}index.html")


def _sync_names(
    store: Store,
    state: str,
    page_dir: str,
    new: Iterable[str],
    *,
    read: Callable[[bytes], tuple[str, ...]],
    dump: Callable[[Iterable[str]], str],
    html: Callable[[Iterable[str]], str],
    notify: Progress,
) -> None:
    """Grow the list `state` (`read`/`dump`) by `new` (compare-and-swap), then its HTML page in `page_dir`."""
    names = tuple(new)
    written: list[str] = []

    def swap(current: bytes | None) -> bytes | None:
        merged = index.merge_names(_state(store, state, read, current, mend=CHANNEL_MEND), names)
        return None if merged is None else dump(merged).encode()

    if compare_and_swap(
        store, state, swap, content_type="application/json", cache_control=index.PAGE_CACHE_CONTROL
    ):
        written.append(state)
    pages = [(k, lambda data: html(read(data)).encode()) for k in list_page_keys(store, page_dir)]
    converge_pages(store, state, pages, content_type=index.HTML_TYPE, written=written)
    notify("page" if written else "skip", f"{page_dir}index.html")


def _sync_variant_roots(store: Store, pages: Iterable[tuple[str, str]], notify: Progress) -> None:
    """Each group's root gains its projects, the list of groups (`variants/`) its groups."""
    by_group: dict[str, list[str]] = {}
    for group, project in pages:
        by_group.setdefault(group, []).append(project)
    for group, projects in sorted(by_group.items()):
        _sync_names(
            store, wheelvariants.projects_key(group), wheelvariants.root_dir(group), projects,
            read=index.projects_from_root_json, dump=index.variant_root_json, html=wheelvariants.root_html,
            notify=notify,
        )  # fmt: skip
    _sync_names(
        store, wheelvariants.GROUPS_STATE, wheelvariants.PREFIX, by_group,
        read=wheelvariants.groups_from_json, dump=wheelvariants.groups_json, html=wheelvariants.groups_html,
        notify=notify,
    )  # fmt: skip


def published_files(store: Store, *, project: str, variant_id: str) -> tuple[str, ...]:
    """The files the variant's project page lists; () when there is no page, or one this factory did not
    write (publishing will say what is wrong with it)."""
    page = store.get(index.project_page(variant_id, project).state_key)
    try:
        return tuple(r.filename for r in index.records_from_project_json(page.data)) if page else ()
    except index.DamagedState:
        return ()


def published_wheel(
    filenames: Iterable[str],
    *,
    project: str,
    version: str,
    python: str,
    limited_api: str | None = None,
    platform: Platform | None = None,
) -> str | None:
    """The one of `filenames` that is this project's wheel of `version` for CPython `python` ("3.11"); for
    an abi3 job (`limited_api`, its tag "cp311"), the `cp311-abi3` wheel. With `platform`, only a wheel for
    that platform (or a pure one) counts: a job's wheel is not its sibling of another platform, which has
    the same name but for its platform tag; None: whatever platform it is for."""
    interpreter = limited_api or python_tag(python)
    for filename in filenames:
        try:
            name, found, _build, tags = parse_wheel_filename(filename)
        except InvalidWheelFilename:
            continue
        if (
            name == canonicalize_name(project)
            and found == Version(version)
            and any(
                t.interpreter == interpreter
                and (t.abi == "abi3") == bool(limited_api)
                and (platform is None or t.platform == "any" or platform.owns_tag(t.platform))
                for t in tags
            )
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


def refuse_failed(wheels: Sequence[Path], jobs: Sequence[Mapping[str, object]]) -> None:
    """A PublishError naming the first wheel that failed its checks (its failure record beside it, or the
    report's job that kept it), and how many others did."""
    failed = [(wheel, why) for wheel in wheels if (why := checkrecord.failure_of(wheel, jobs)) is not None]
    if not failed:
        return
    wheel, why = failed[0]
    more = f" (and {len(failed) - 1} other wheel(s) that did)" if len(failed) > 1 else ""
    raise PublishError(
        f"{wheel}: failed its checks ({why}){more}; nothing published: mend and rebuild it, or "
        "--force-failed publishes it anyway"
    )


def publish_directory(
    wheel_dir: Path,
    *,
    to: str,
    endpoint_url: str | None = None,
    report: Path | None = None,
    signer: Signer | None = None,
    force_failed: bool = False,
    variants: bool = False,
) -> PublishResult:
    """`factory publish`: the wheels of a build's output directory (`wheels_in`), with its report.json when
    no `report` is given and it has one (`publish_wheels`). A misspelt `to` fails before the wheels
    are read."""
    storeurl.parse(to)
    wheels = wheels_in(wheel_dir)
    if report is None and (wheel_dir / "report.json").is_file():
        report = wheel_dir / "report.json"
    return publish_wheels(
        wheels,
        to=to,
        endpoint_url=endpoint_url,
        report=report,
        signer=signer,
        force_failed=force_failed,
        variants=variants,
    )


def describe(result: PublishResult) -> Iterable[str]:
    """Human summary lines of a publish."""
    for f in result.files:
        yield f"{f.status:9} {f.variant_id}/{f.filename}"
    for f in result.variant_files:
        yield f"{f.status:9} {wheelvariants.PREFIX}{f.variant_id}/{f.filename}"
    for note in result.variant_notes:
        yield f"not on the variant index: {note}"
    if result.signed_by is not None:
        yield (
            f"signed with key {result.signed_by}: {result.signatures_written} signature file(s) written, "
            f"{len(result.files) - result.signatures_written} already there"
        )
    yield f"index: {result.destination} ({len(result.pages_written)} page objects written)"


@dataclass(frozen=True, kw_only=True)
class RepairResult:
    destination: str
    wheels: int
    variant_ids: tuple[str, ...]
    skipped: tuple[str, ...]  # "files/<variant>/<name>: why", for files no page may list
    pages_written: tuple[str, ...]


def _wheel_metadata(store: Store, variant_id: str, filename: str, *, keep: bool = True) -> bytes:
    """The wheel's METADATA, from its .metadata file or else from the wheel itself (re-published unless not
    `keep`)."""
    key = index.files_path(variant_id, filename)
    meta_key = index.metadata_path(variant_id, filename)
    blob = store.get(meta_key)
    if blob is not None and len(blob.data) <= MAX_METADATA_BYTES:
        return blob.data
    opened = store.open(key)
    if opened is None:
        raise ConfigError(f"{key}: vanished while repairing")
    stream, _size = opened
    with tempfile.TemporaryFile() as tmp:
        with stream:
            shutil.copyfileobj(stream, tmp, 1 << 20)
        tmp.seek(0)
        metadata = read_metadata(tmp, key)
    if not keep:
        return metadata
    _put_immutable(
        store,
        meta_key,
        metadata,
        hashlib.sha256(metadata).hexdigest(),
        content_type="text/plain; charset=utf-8",
    )
    return metadata


def wheel_name_problem(filename: str, variant_id: str) -> str | None:
    """Why no page of variant `variant_id` may list a wheel file called `filename` (None: one may): its
    label names that variant, or a stable-ABI variant that covers it."""
    from factory.core.variants import VariantKey

    try:
        _name, version, _build, _tags = parse_wheel_filename(filename)
        canonical = canonical_wheel_filename(filename)
    except InvalidWheelFilename:
        return "not a wheel filename"
    if canonical != filename:
        return f"not the canonical spelling {canonical}"
    try:
        label_key: VariantKey | None = VariantKey.parse_local_version(version.local or "")
        page_key = VariantKey.parse_id(variant_id)
    except ValueError:
        label_key = page_key = None
    if label_key is None or page_key is None or not label_key.covers(page_key):
        return f"its local label names variant {label_key.id if label_key else None}, not {variant_id}"
    return None


def _repair_record(
    store: Store, variant_id: str, filename: str, old: Mapping[str, FileRecord], *, keep: bool = True
) -> FileRecord:
    """The record of one stored wheel; ConfigError when no page may list it. Not `keep`: write nothing (a
    wheel without its .metadata file is not given one)."""
    key = index.files_path(variant_id, filename)
    problem = wheel_name_problem(filename, variant_id)
    if problem is not None:
        raise ConfigError(problem)
    name, version, _build, _tags = parse_wheel_filename(filename)
    head = store.head(key)
    sha256 = store.sha256_of(key)
    if head is None or sha256 is None:
        raise ConfigError("vanished while repairing")
    metadata = _wheel_metadata(store, variant_id, filename, keep=keep)
    requires_python = check_metadata(metadata, name=str(name), version=version, shown=key)
    known = old.get(filename)
    return FileRecord(
        filename=filename,
        sha256=sha256,
        size=head.size,
        # the only thing a page says that the file does not: kept from a readable page that listed it
        upload_time=known.upload_time if known and known.sha256 == sha256 else _now(),
        requires_python=requires_python,
        metadata_sha256=hashlib.sha256(metadata).hexdigest(),
    )


def repair_refusals(
    store: Store, variant_id: str, listed: Sequence[FileRecord], unlisted: Iterable[str]
) -> dict[str, str]:
    """Of the stored wheels `unlisted` (keys under files/<variant_id>/, all of one project whose page lists
    `listed`), those `repair_index` would leave off the page, each with why; reads only. The same rules in
    the same order as repair: a name and METADATA a page may list, then no other spelling of a release
    already listed or kept before it by name."""
    refused: dict[str, str] = {}
    kept = tuple(listed)
    for key in sorted(unlisted):
        parsed = index.parse_wheel_key(key)
        if parsed is None or parsed[0] != variant_id:
            raise ValueError(f"{key} is not a wheel of variant {variant_id}")
        try:
            rec = _repair_record(store, variant_id, parsed[1], {}, keep=False)
            kept = index.merge_records(kept, [rec]) or kept
        except ConfigError as exc:
            refused[key] = str(exc).removeprefix(f"{key}: ")
        except index.RecordConflict as exc:
            refused[key] = str(exc)
    return refused


def _replace(store: Store, key: str, body: bytes, *, written: list[str]) -> bool:
    """Make the page object `key` (under each key the store keeps it) these bytes, writing only where it
    differs; True if anything was written."""
    content_type = site.content_type(key) or index.HTML_TYPE
    before = len(written)
    for stored in store_keys(store, key):

        def replace(current: bytes | None) -> bytes | None:
            return None if current == body else body

        if compare_and_swap(
            store, stored, replace, content_type=content_type, cache_control=index.PAGE_CACHE_CONTROL
        ):
            written.append(stored)
    return len(written) > before


def write_site(store: Store, state: site.SiteState, *, written: list[str], notify: Progress) -> None:
    """Make the store's page objects those of `site.build_site(state)`, in its order, writing what differs."""
    wrote = False
    for key, body in site.build_site(state).items():
        wrote = _replace(store, key, body, written=written) or wrote
        parsed = index.parse_page_key(key)
        if parsed is not None and parsed[1] == "html":
            notify("page" if wrote else "skip", key)
            wrote = False


def _readable(store: Store, page: PageRef) -> site.Items:
    """What a page's state object says, nothing when it is absent or damaged (repair rebuilds it anyway)."""
    blob = store.get(page.state_key)
    try:
        return site.KINDS[page.kind].read(blob.data) if blob is not None else ()
    except index.DamagedState:
        return ()


def _repair_records(
    store: Store, variant_id: str, filenames: Iterable[str], skipped: list[str]
) -> dict[str, tuple[FileRecord, ...]]:
    """The records of a variant's project pages, by project, from its wheel files under the rules publish
    applies; each file no page may list is added to `skipped` with why."""
    old_pages: dict[str, dict[str, FileRecord]] = {}

    def old_page(project: str) -> dict[str, FileRecord]:
        if project not in old_pages:
            recs = _readable(store, index.project_page(variant_id, project))
            old_pages[project] = {r.filename: r for r in recs}
        return old_pages[project]

    by_project: dict[str, list[FileRecord]] = {}
    for filename in sorted(filenames):
        try:
            project = str(canonicalize_name(filename.split("-", 1)[0]))
            rec = _repair_record(store, variant_id, filename, old_page(project))
        except ConfigError as exc:
            skipped.append(f"{index.files_path(variant_id, filename)}: {exc}")
            continue
        by_project.setdefault(rec.project, []).append(rec)
    out: dict[str, tuple[FileRecord, ...]] = {}
    for project, recs in by_project.items():
        listed = old_page(project)
        # Of two spellings of one release, the one the page listed stays; else the first by name.
        kept: tuple[FileRecord, ...] = ()
        for rec in sorted(recs, key=lambda r: (r.filename not in listed, r.filename)):
            try:
                kept = index.merge_records(kept, [rec]) or kept
            except index.RecordConflict as exc:
                skipped.append(f"{index.files_path(variant_id, rec.filename)}: {exc}")
        if kept:
            out[project] = kept
    return out


def stored_wheels(store: Store) -> dict[str, list[str]]:
    """The wheel files of an index (files/<variant>/<name>.whl), filenames by variant id."""
    wheels: dict[str, list[str]] = {}
    for key in store.keys("files/"):
        parsed = index.parse_wheel_key(key)
        if parsed is not None:
            wheels.setdefault(parsed[0], []).append(parsed[1])
    return wheels


def stored_project_pages(store: Store) -> list[PageRef]:
    """The project pages of an index that have a state object, sorted."""
    found = {index.parse_page_key(key) for key in store.keys("simple/")}
    return sorted(
        (p[0] for p in found if p and p[0].kind == "project" and p[1] == "state"), key=lambda p: p.order
    )


def repair_index(
    *, to: str, endpoint_url: str | None = None, store: Store | None = None, progress: Progress | None = None
) -> RepairResult:
    """Rewrite every page and state object of an index from the wheel files in it (files/<variant>/*.whl),
    under the rules publish applies: canonical filenames, one file per release. Run it while nobody
    publishes to the index: a publish in between may be left off the pages until it is rerun."""
    if store is None:
        store = open_store(to, endpoint_url=endpoint_url, existing=True)
    wheels = stored_wheels(store)
    page_refs = stored_project_pages(store)
    if not wheels and not page_refs:
        raise ConfigError(f"--to {to}: not a published index (no wheel files or pages in it)")
    skipped: list[str] = []
    records: dict[tuple[str, str], tuple[FileRecord, ...]] = {}
    for variant_id, filenames in sorted(wheels.items()):
        for project, recs in _repair_records(store, variant_id, filenames, skipped).items():
            records[(variant_id, project)] = recs
    # Project pages with no wheel left are rewritten empty rather than left listing what is not there.
    for page in page_refs:
        records.setdefault((page.variant_id, page.project), ())
    # The grid: every listed wheel is built; what older reports said about the rest (failed, not built) stays.
    published = [(v, rec) for (v, _p), recs in records.items() for rec in recs]
    beside = {
        (v, rec.filename): [
            name
            for name, suffix in index.BESIDE.items()
            if store.head(index.files_path(v, rec.filename) + suffix) is not None
        ]
        for v, rec in published
    }
    reported = [c for c in _readable(store, index.MATRIX_PAGE) if c.status != "built"]
    cells = index.merge_cells(reported, index.matrix_cells([], published, beside=beside)) or tuple(reported)
    state = site.site_state(records, cells)
    written: list[str] = []
    write_site(store, state, written=written, notify=progress or (lambda _event, _key: None))
    return RepairResult(
        destination=store.description,
        wheels=len(published),
        variant_ids=state[index.VARIANTS_PAGE],
        skipped=tuple(skipped),
        pages_written=tuple(written),
    )
