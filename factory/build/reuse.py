"""Reusing a published stable-ABI wheel when a torch appears after it was published.

A stable-ABI job's one wheel is listed on the page of every torch its label covers. When the index gains a
newer torch, the matrix (a specifier like ">=2.12") covers it and the job's wheel is missing from its page
alone: building again would make other bytes under the same filename, which the pages that list the first
build refuse (nothing published changes). So the job takes the published file instead (`decide` says which
and from where, `fetch` copies it, bounded and checked against the sha256 its page lists), checks it
(`acceptance.accept_reused`: the wheel check, its provenance, install and import with each torch whose page
lacks it) and publishing lists the same bytes on the pages that lack them; the pages that list it stay as
they are.

A store writer can swap the file and rewrite its page to match: the page's sha256 then vouches for nothing.
When the run signs what it publishes, the file is taken only with its signature (`<wheel>.sig.json` beside
it on its page) checking with the signing key's public half, since publishing signs it afresh for the new
pages; its provenance must be the job's too (`accept_reused`). A file that fails either fails the job, with
the reason, and nothing is published: building it instead would make other bytes under the filename the
older pages list (publishing refuses them), and a swapped file is for a person to look at, not to paper over.
Without signing, the page's sha256 and the provenance are all there is to check.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from factory.core.tags import canonical_wheel_filename
from factory.core.variants import VariantKey
from factory.publish import index
from factory.publish.index import FileRecord
from factory.publish.publisher import published_wheel
from factory.trust import signing

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from factory.plan.plan import Job
    from factory.publish.stores import Store
    from factory.spec.config import MatrixFile

# The most a reused wheel may weigh (as a wheel a build hands back: `acceptance.MAX_WHEEL_BYTES`).
MAX_WHEEL_BYTES = 16 << 30
_CHUNK = 1 << 20
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_+][A-Za-z0-9_.+-]*\.whl")  # one file name: no path, no dot first
Log = Callable[[str], None]


class ReuseError(Exception):
    """Why a published file cannot be reused: one line, the job's failure reason."""


@dataclass(frozen=True, kw_only=True)
class Reuse:
    """A stable-ABI job that takes its wheel from the store: `filename` as the page `source` lists it
    (`sha256`, `size`), onto the pages `missing` (the torches `torches`, whose install checks it gets).
    `wheel`: the fetched copy; `problem`: why it cannot be reused (the job then fails, nothing published)."""

    job_id: str
    filename: str
    source: str
    sha256: str
    size: int
    listed: tuple[str, ...]
    missing: tuple[str, ...]
    torches: tuple[str, ...]
    wheel: Path | None = None
    problem: str | None = None


def job_pages(job: Job) -> tuple[tuple[str, str], ...]:
    """(torch, variant page) of every torch a stable-ABI job covers, oldest first."""
    key = job.variant.key
    return tuple((torch, key.with_torch(torch).id) for torch in job.torches)


def label_problem(filename: str, pages: Sequence[str]) -> str | None:
    """Why a wheel named `filename` may not be listed on `pages`: its local label names no stable-ABI variant
    that covers each of them (`VariantKey.covers`); None when it may."""
    try:
        version = parse_wheel_filename(filename)[1]
        if version.local is None:
            return f"{filename}: its version has no local label naming its variant"
        key = VariantKey.parse_local_version(version.local)
    except (InvalidWheelFilename, ValueError) as exc:
        return f"{filename}: {exc}"
    if not key.stable:
        return f"{filename}: its label names no stable-ABI variant"
    for page in pages:
        try:
            covered = key.covers(VariantKey.parse_id(page))
        except ValueError:
            covered = False
        if not covered:
            return f"{filename}: its label ({version.local}) does not cover the page {page}"
    return None


def decide(
    job: Job, *, project: str, pages: Mapping[str, Sequence[FileRecord]], max_bytes: int = MAX_WHEEL_BYTES
) -> Reuse | None:
    """Whether a stable-ABI job reuses its published wheel (of its own platform: a page lists every
    platform's wheels), from the records each of its pages lists (`pages`, by variant id; an absent page
    lists nothing): None when no page lists the job's wheel (it is
    built) or every page does (it is published); else a Reuse from the oldest torch's page that lists it,
    onto the others, with a `problem` when the store's word cannot be trusted (two pages list the filename
    with different hashes, a size over `max_bytes`, a label that does not cover a page)."""
    if not job.variant.key.stable or not job.torches:
        return None
    found: dict[str, FileRecord] = {}
    missing: list[tuple[str, str]] = []
    for torch, page in job_pages(job):
        records = {r.filename: r for r in pages.get(page, ())}
        name = published_wheel(
            records, project=project, version=job.variant.full_version, python=job.python,
            limited_api=job.limited_api, platform=job.platform,
        )  # fmt: skip
        if name is None:
            missing.append((torch, page))
        else:
            found[page] = records[name]
    if not found or not missing:
        return None
    source, record = next(iter(found.items()))
    reuse = Reuse(
        job_id=job.id,
        filename=record.filename,
        source=source,
        sha256=record.sha256,
        size=record.size,
        listed=tuple(found),
        missing=tuple(page for _torch, page in missing),
        # the newest first: the torch that brought the job back
        torches=tuple(torch for torch, _page in reversed(missing)),
    )
    problem = _record_problem(reuse, found, max_bytes) or label_problem(record.filename, reuse.missing)
    return replace(reuse, problem=problem) if problem else reuse


def _record_problem(reuse: Reuse, found: Mapping[str, FileRecord], max_bytes: int) -> str | None:
    for page, rec in found.items():
        if rec.filename != reuse.filename or rec.sha256 != reuse.sha256 or rec.size != reuse.size:
            return (
                f"the pages {reuse.source} and {page} list {rec.filename} with different contents "
                f"(sha256 {reuse.sha256[:12]}… and {rec.sha256[:12]}…); the published index is damaged"
            )
    if reuse.size > max_bytes or reuse.size <= 0:
        return f"{reuse.source} lists {reuse.filename} as {reuse.size} bytes, not a size a wheel may have"
    if len(reuse.sha256) != 64 or any(c not in "0123456789abcdef" for c in reuse.sha256):
        return f"{reuse.source} lists {reuse.filename} with no sha256 to check it by"
    return None


def page_records(store: Store, *, project: str, variant_id: str) -> tuple[FileRecord, ...]:
    """The records the variant's project page lists, as `publish.published_files` reads them: () when
    there is no page or one this factory did not write."""
    page = store.get(index.project_page(variant_id, project).state_key)
    try:
        return index.records_from_project_json(page.data) if page else ()
    except index.DamagedState:
        return ()


def plan_reuse(store: Store, mf: MatrixFile, jobs: Sequence[Job], log: Log) -> dict[str, Reuse]:
    """The jobs (by id) that reuse their published wheel (`decide`), each said through `log`."""
    project = mf.package.name
    read: dict[str, tuple[FileRecord, ...]] = {}
    out: dict[str, Reuse] = {}
    for job in jobs:
        if not job.variant.key.stable:
            continue
        for _torch, page in job_pages(job):
            if page not in read:
                read[page] = page_records(store, project=project, variant_id=page)
        reuse = decide(job, project=project, pages=read)
        if reuse is None:
            continue
        out[job.id] = reuse
        log(
            f"{job.id}: {reuse.filename} is published on {', '.join(reuse.listed)}; reused for "
            f"{', '.join(reuse.missing)} after its check with torch {', '.join(reuse.torches)} (no compile)"
        )
    return out


def signature_problem(store: Store, reuse: Reuse, *, sha256: str, key: Ed25519PublicKey) -> str | None:
    """Why the signature beside the published file does not vouch, with `key`, for the wheel `reuse` names
    with these bytes (`sha256`, as read): missing, too large, malformed, another key's, another wheel's;
    None when it does."""
    sig_key = index.signature_path(reuse.source, reuse.filename)
    opened = store.open(sig_key)
    if opened is None:
        return (
            f"{sig_key} is not in {store.description}: published unsigned, and this run signs what it "
            "publishes; a wheel no key vouches for is not signed afresh"
        )
    fh, _size = opened
    data = b""
    with fh:  # one byte past the bound tells a file that is not a signature (refused by its size)
        while len(data) <= signing.MAX_SIGNATURE_BYTES and (
            chunk := fh.read(signing.MAX_SIGNATURE_BYTES + 1 - len(data))
        ):
            data += chunk
    try:
        signing.check(data, filename=reuse.filename, sha256=sha256, key=key)
    except signing.SignatureError as exc:
        return f"{sig_key}: {exc}"
    return None


def fetch(
    store: Store,
    reuse: Reuse,
    directory: Path,
    *,
    key: Ed25519PublicKey | None = None,
    max_bytes: int = MAX_WHEEL_BYTES,
) -> Path:
    """Copy the published file into `directory`: at most the size its page lists (never over `max_bytes`),
    its sha256 the page's and, with `key` (the run signs what it publishes), its signature checking with
    it (`signature_problem`); ReuseError otherwise, and nothing is left behind."""
    if reuse.problem is not None:
        raise ReuseError(reuse.problem)
    try:
        canonical = canonical_wheel_filename(reuse.filename)
    except (InvalidWheelFilename, ValueError):
        canonical = ""
    if canonical != reuse.filename or not _PLAIN_NAME.fullmatch(canonical):
        raise ReuseError(f"{reuse.source} lists {reuse.filename!r}, not a wheel filename this factory writes")
    stored = index.files_path(reuse.source, reuse.filename)
    opened = store.open(stored)
    if opened is None:
        raise ReuseError(f"{reuse.source} lists {reuse.filename}, and {stored} is not in {store.description}")
    fh, size = opened
    target = directory / reuse.filename
    limit = min(reuse.size, max_bytes)
    try:
        if size != reuse.size:
            raise ReuseError(f"{stored} is {size} bytes, its page lists {reuse.size}")
        digest = hashlib.sha256()
        read = 0
        with fh, target.open("xb") as out:
            while chunk := fh.read(min(_CHUNK, limit + 1 - read)):
                read += len(chunk)
                if read > limit:
                    raise ReuseError(f"{stored} holds more than the {reuse.size} bytes its page lists")
                digest.update(chunk)
                out.write(chunk)
        if read != reuse.size:
            raise ReuseError(f"{stored} is {read} bytes, its page lists {reuse.size}")
        if digest.hexdigest() != reuse.sha256:
            raise ReuseError(
                f"{stored} has sha256 {digest.hexdigest()}, its page lists {reuse.sha256}; not reused"
            )
        if key is not None:
            unsigned = signature_problem(store, reuse, sha256=digest.hexdigest(), key=key)
            if unsigned is not None:
                raise ReuseError(f"{unsigned}; not reused")
    except BaseException:
        target.unlink(missing_ok=True)
        fh.close()
        raise
    return target


def fetch_all(
    store: Store,
    planned: Mapping[str, Reuse],
    directory: Path,
    log: Log,
    *,
    key: Ed25519PublicKey | None = None,
) -> dict[str, Reuse]:
    """Every planned reuse with its fetched wheel (its signature checked with `key` when given: `fetch`), or
    the `problem` that fails its job."""
    out: dict[str, Reuse] = {}
    for job_id, reuse in planned.items():
        where = directory / job_id
        try:
            where.mkdir(parents=True)
            out[job_id] = replace(reuse, wheel=fetch(store, reuse, where, key=key))
        except (ReuseError, OSError) as exc:
            problem = str(exc) if isinstance(exc, ReuseError) else f"{reuse.filename}: {exc}"
            log(f"{job_id}: the published wheel cannot be reused: {problem}")
            out[job_id] = replace(reuse, problem=problem)
    return out


# The provenance fields a reused wheel must share with the job: what it is and what it was built from
# (its torch, image and toolchain were the first build's).
SAME_AS_JOB: tuple[tuple[str, ...], ...] = (
    ("job", "id"),
    ("wheel", "name"),
    ("wheel", "version"),
    ("source",),
    ("recipe", "sha256"),
    ("job", "variant", "archs"),
    ("job", "variant", "cuda"),
    ("job", "variant", "cxx11_abi"),
    ("job", "cxx_std"),
    ("job", "env"),
)


def _at(document: Mapping[str, Any], path: Sequence[str]) -> Any:
    value: Any = document
    for part in path:
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def provenance_problems(found: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    """Where a reused wheel's provenance says it is another job's or another source's (`SAME_AS_JOB`)."""
    return [
        f"provenance: {'.'.join(path)} is {_at(found, path)!r:.80}, the job's is {_at(expected, path)!r:.80}"
        for path in SAME_AS_JOB
        if _at(found, path) != _at(expected, path)
    ]


def reused_torch(document: Mapping[str, Any]) -> str | None:
    """The torch a published wheel's provenance says it was built with."""
    torch = document.get("torch")
    found = torch.get("version") if isinstance(torch, Mapping) else None
    return found if isinstance(found, str) else None
