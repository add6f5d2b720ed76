"""`factory index audit`: every published wheel checked against what it claims to be.

A published wheel that is wrong stays wrong until someone looks: a store writer swapped its bytes, a run
published a wheel under another variant's label, a pin that lets pip swap torch under it. The audit reads
each wheel a page lists once, bounded (what a store hands back is hostile), and holds it to:

    page        its size and sha256 are those the page lists (hashed here, never the store's word)
    metadata    its PEP 658 `.metadata` file is its METADATA, with the hash the page lists; Name and Version
                are the filename's
    archive     an installer would take it (`wheelcheck.archive_problems`: RECORD, member paths)
    label       its local label names a variant whose page may list it (`publish.wheel_name_problem`)
    torch-pin   METADATA requires exactly the label's torch (`torch==X.Y.*`; a stable-ABI label `torch>=F`)
    device-code every extension module's cubins are exactly the label's archs (`wheelcheck`, `fatbin`)
    stable-abi  a stable-ABI label's modules call nothing of torch's C++ ABI (`stable_abi`)
    provenance  the in-wheel provenance is well formed and says the label's variant, torch, archs, name and
                version; the published `<wheel>.provenance.json` is the same bytes, and
                `<wheel>.sbom.cdx.json` those of the in-wheel SBOM
    matrix      with a matrix: the provenance is the planned job's (id, variant, Python)
    signature   with a public key: `<wheel>.sig.json` vouches for these bytes (a missing one is a problem)
    rebuild     N of them (chosen at random) rebuilt from their provenance and compared bit for bit
                (`rebuild.rebuild_and_compare`)

Before the wheels, the index itself is checked as `factory index check` checks it (`indexcheck.check_index`:
pages whole, every file listed). An extension module with no device code at all is taken as host-only, as
the build's check decided from its link (the audit has no build log), but a wheel must have one with
device code. Nothing is written to the store: an audit is safe beside publishers.
"""

from __future__ import annotations

import glob
import hashlib
import random
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from factory.core import bounded
from factory.core.errors import CheckError, ConfigError, FactoryError
from factory.core.tags import canonical_wheel_filename
from factory.core.urls import printable
from factory.core.variants import Arch, VariantKey, version_tuple
from factory.publish import index
from factory.publish.index import FileRecord
from factory.publish.indexcheck import check_index, resolve_target
from factory.publish.publisher import (
    MAX_METADATA_BYTES,
    check_metadata,
    published_wheel,
    read_metadata,
    wheel_name_problem,
)
from factory.publish.stores import Store, open_store
from factory.spec.stable_abi import covers_torch
from factory.spec.torchreq import torch_requirement
from factory.trust import signing
from factory.wheel import checks as wheelcheck
from factory.wheel import embedded, provenance, sbom

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from factory.plan.plan import Job

# The most one published wheel may weigh (as a wheel a build hands back: `acceptance.MAX_WHEEL_BYTES`).
MAX_WHEEL_BYTES = 16 << 30
_CHUNK = 1 << 20
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_+][A-Za-z0-9_.+-]*\.whl")  # one file name: no path, no dot first
CHECKS = (
    "index",
    "page",
    "metadata",
    "archive",
    "label",
    "torch-pin",
    "device-code",
    "stable-abi",
    "provenance",
    "matrix",
    "signature",
    "rebuild",
)
Log = Callable[[str], None]


class Rebuilt(Protocol):
    """What the rebuild of a wheel tells the audit (`factory.build.rebuild.RebuildResult` is one)."""

    @property
    def ok(self) -> bool: ...

    def line(self) -> str: ...

    def to_json(self) -> dict[str, Any]: ...


# A wheel rebuilt from its provenance and compared bit for bit: `factory.build.rebuild.rebuilder`, handed
# down by the CLI (publish sits below build and never starts a build itself).
Rebuild = Callable[[Path], Rebuilt]


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One thing wrong: where (a store key), which check found it, and what it found, in one line."""

    where: str
    check: str
    message: str

    def line(self) -> str:
        return printable(f"{self.where}: {self.check}: {self.message}")

    def to_json(self) -> dict[str, str]:
        return {"where": self.where, "check": self.check, "message": printable(self.message)}


@dataclass(frozen=True, kw_only=True)
class WheelAudit:
    """One wheel as one page lists it (a stable-ABI wheel is stored and listed under each page it serves)."""

    key: str
    variant_id: str
    filename: str
    sha256: str | None  # of the bytes read; None when they could not be read whole
    size: int | None
    checks: tuple[str, ...]  # the checks it went through
    problems: tuple[Problem, ...]
    job_id: str | None = None  # the matrix's job that builds it, when a matrix was given
    rebuilt: dict[str, Any] | None = None  # `RebuildResult.to_json()` when it was rebuilt

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "variant_id": self.variant_id,
            "filename": self.filename,
            "sha256": self.sha256,
            "size": self.size,
            "job": self.job_id,
            "checks": list(self.checks),
            "ok": not self.problems,
            "problems": [p.to_json() for p in self.problems],
            "rebuild": self.rebuilt,
        }


@dataclass(frozen=True, kw_only=True)
class Audit:
    to: str
    destination: str
    key_id: str | None  # the public key signatures were checked with; None: not checked
    matrix: bool  # whether wheels were checked against a matrix's jobs
    index_problems: tuple[Problem, ...]
    wheels: tuple[WheelAudit, ...]
    unplanned: tuple[str, ...] = ()  # with a matrix: keys of wheels no planned job builds (not a problem)

    @property
    def problems(self) -> tuple[Problem, ...]:
        return self.index_problems + tuple(p for w in self.wheels for p in w.problems)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def rebuilt(self) -> tuple[WheelAudit, ...]:
        return tuple(w for w in self.wheels if w.rebuilt is not None)

    def summary(self) -> str:
        signed = (
            f"signatures checked with {self.key_id}" if self.key_id else "signatures not checked (no --key)"
        )
        rebuilt = f", {len(self.rebuilt)} rebuilt" if self.rebuilt else ""
        return (
            f"audit: {self.destination}: {len(self.wheels)} wheels, {len(self.problems)} problems; "
            f"{signed}{rebuilt}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "to": self.to,
            "destination": self.destination,
            "ok": self.ok,
            "wheels": len(self.wheels),
            "signatures": {"checked": self.key_id is not None, "key": self.key_id},
            "matrix": self.matrix,
            "unplanned": list(self.unplanned),
            "rebuilt": len(self.rebuilt),
            "problems": [p.to_json() for p in self.problems],
            "index_problems": [p.to_json() for p in self.index_problems],
            "audited": [w.to_json() for w in self.wheels],
        }


# --- bounded reads from the store ---------------------------------------------------------------------------


def _read_small(store: Store, key: str, limit: int) -> bytes | None:
    """A small object of the store (a signature, .metadata, provenance or SBOM file), read at most `limit`
    + 1 bytes deep (`bounded.read_capped`); None when there is none; bounded.Refused beyond `limit`."""
    opened = store.open(key)
    if opened is None:
        return None
    fh, size = opened
    with fh:
        if size > limit:
            raise bounded.Refused(f"{size} bytes, over the {bounded.size_text(limit)} it may have")
        return bounded.read_capped(fh, max_bytes=limit, shown=key)


def _download(store: Store, key: str, rec: FileRecord, target: Path) -> tuple[str, int] | str:
    """Copy the wheel `key` to `target`, reading no further than one byte past the size its page lists (and
    never past MAX_WHEEL_BYTES): (sha256, size) of what was read, or why it could not be read."""
    opened = store.open(key)
    if opened is None:
        return "listed but not in the store"
    fh, _claimed = opened  # what the store says of its size is not the check: the bytes are
    limit = min(max(rec.size, 0), MAX_WHEEL_BYTES)
    digest = hashlib.sha256()
    read = 0
    with fh, target.open("xb") as out:
        while chunk := fh.read(min(_CHUNK, limit + 1 - read)):  # at least one byte: one past the limit
            read += len(chunk)
            digest.update(chunk)
            if read > limit:
                return f"holds more than the {rec.size} bytes its page lists"
            out.write(chunk)
    return digest.hexdigest(), read


# --- what a label and a provenance say ----------------------------------------------------------------------


def _canonical(filename: str) -> str:
    try:
        return canonical_wheel_filename(filename)
    except (InvalidWheelFilename, ValueError):
        return ""


def label_of(filename: str) -> VariantKey:
    """The variant a wheel's local label names; ValueError saying why there is none."""
    try:
        version = parse_wheel_filename(filename)[1]
    except InvalidWheelFilename as exc:
        raise ValueError(str(exc)) from None
    if version.local is None:
        raise ValueError(f"version {version} has no local label naming its variant")
    return VariantKey.parse_local_version(version.local)


def _at(document: Mapping[str, Any], *path: str) -> Any:
    value: Any = document
    for part in path:
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _archs(value: Any) -> tuple[str, ...] | None:
    try:
        return tuple(a.dotted for a in sorted({Arch.parse(str(a)) for a in value}))
    except (TypeError, ValueError):
        return None


def _same_release(found: Any, expected: str) -> bool:
    """Whether torch `found` ("2.14.1+cu130") is the release `expected` names ("2.14" or "2.14.1")."""
    try:
        release = Version(str(found)).release
        want = version_tuple(expected)
    except (InvalidVersion, ValueError):
        return False
    return release[: len(want)] == want


def _says(path: str, found: Any, expected: Any, whose: str) -> str:
    return f"{path} is {printable(repr(found))[:80]}, {whose} {printable(repr(expected))[:80]}"


def provenance_label_problems(document: Mapping[str, Any], filename: str, key: VariantKey) -> list[str]:
    """Where a wheel's provenance disagrees with its filename and the variant its label names: the wheel's
    name and version, CUDA, C++11 ABI, archs, the torch it was built for and with (a stable-ABI label: a
    torch its floor covers) and the Python of its tags."""
    name, version, _build, tags = parse_wheel_filename(filename)
    out: list[str] = []
    found_name = _at(document, "wheel", "name")
    if not isinstance(found_name, str) or canonicalize_name(found_name) != name:
        out.append(_says("wheel.name", found_name, str(name), "the filename's is"))
    try:
        same_version = Version(str(_at(document, "wheel", "version"))) == version
    except InvalidVersion:
        same_version = False
    if not same_version:
        out.append(
            _says("wheel.version", _at(document, "wheel", "version"), str(version), "the filename's is")
        )
    variant = _at(document, "job", "variant") or {}
    if _at(variant, "cuda") != key.cuda:
        out.append(_says("job.variant.cuda", _at(variant, "cuda"), key.cuda, "the label's is"))
    if _at(variant, "cxx11_abi") != key.cxx11_abi:
        out.append(_says("job.variant.cxx11_abi", _at(variant, "cxx11_abi"), key.cxx11_abi, "the label's is"))
    if _archs(_at(variant, "archs")) != key.archs:
        out.append(_says("job.variant.archs", _at(variant, "archs"), list(key.archs), "the label's is"))
    torch, built_with = _at(variant, "torch"), _at(document, "torch", "version")
    if key.stable:
        try:
            covered = isinstance(torch, str) and covers_torch(key.torch, torch)
        except (InvalidVersion, ValueError):
            covered = False
        if not covered:
            out.append(_says("job.variant.torch", torch, f">={key.torch}", "the stable-ABI label's floor is"))
    elif torch != key.torch:
        out.append(_says("job.variant.torch", torch, key.torch, "the label's is"))
    if isinstance(torch, str) and not _same_release(built_with, torch):
        out.append(_says("torch.version", built_with, torch, "the variant's torch is"))
    limited = _at(document, "job", "limited_api")
    interpreters = sorted({t.interpreter for t in tags})
    if limited is not None:
        if interpreters != [limited]:
            out.append(_says("job.limited_api", limited, ",".join(interpreters), "the filename's tag is"))
    elif interpreters != [f"cp{str(_at(document, 'job', 'python')).replace('.', '')}"]:
        out.append(
            _says(
                "job.python",
                _at(document, "job", "python"),
                index.python_of_wheel(filename),
                "the filename's is",
            )
        )
    return [f"provenance: {line}" for line in out]


MATRIX_JOBS = "the matrix job's is"


def provenance_job_problems(document: Mapping[str, Any], job: Job) -> list[str]:
    """Where a wheel's provenance says another job than the matrix's that builds it: its id, variant (a
    stable-ABI job's torch aside: a newer torch in the matrix builds it now) and Python."""
    v = job.variant
    expected: list[tuple[tuple[str, ...], Any]] = [
        (("job", "id"), job.id),
        (("job", "python"), job.python),
        (("job", "limited_api"), job.limited_api),
        (("job", "variant", "cuda"), v.cuda),
        (("job", "variant", "cxx11_abi"), v.cxx11_abi),
        (("job", "variant", "archs"), list(v.archs)),
    ]
    if v.stable_abi is None:
        expected.append((("job", "variant", "torch"), v.torch))
    return [
        f"provenance: {_says('.'.join(path), _at(document, *path), want, MATRIX_JOBS)}"
        for path, want in expected
        if _at(document, *path) != want
    ]


def torch_pin_problem(metadata: str, key: VariantKey) -> str | None:
    """Why METADATA's torch requirement is not exactly the one the label's torch asks for; None when it is."""
    want = torch_requirement(key.torch, stable_abi=key.torch if key.stable else None)
    found = wheelcheck.torch_requirements(metadata)
    if [str(r) for r in found] == [str(want)]:
        return None
    shown = ", ".join(repr(str(r)) for r in found) or "none"
    whose = f"its stable-ABI label (torch {key.torch} on)" if key.stable else f"its label (torch {key.torch})"
    return f"METADATA requires torch {shown}; {whose} needs exactly '{want}'"


def plan_index(jobs: Sequence[Job]) -> dict[str, list[Job]]:
    """The planned jobs by the variant id their wheels' labels name."""
    out: dict[str, list[Job]] = {}
    for job in jobs:
        out.setdefault(job.variant.id, []).append(job)
    return out


def planned_job(
    filename: str, key: VariantKey, jobs: Mapping[str, Sequence[Job]], project: str
) -> Job | None:
    """The planned job whose wheel `filename` is (`publish.published_wheel`, of the job's own platform);
    None when none builds it."""
    for job in jobs.get(key.id, ()):
        if published_wheel(
            [filename], project=project, version=job.variant.full_version, python=job.python,
            limited_api=job.limited_api, platform=job.platform,
        ):  # fmt: skip
            return job
    return None


# --- one wheel ----------------------------------------------------------------------------------------------


@dataclass
class _Found:
    """A wheel's checks as they run: what was checked, and the problems."""

    key: str
    checks: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def add(self, check: str, lines: Sequence[str] | str | None) -> None:
        if check not in self.checks:
            self.checks.append(check)
        for line in [lines] if isinstance(lines, str) else lines or ():
            self.problems.append(Problem(where=self.key, check=check, message=line))


@dataclass(frozen=True, kw_only=True)
class Content:
    found: _Found
    document: dict[str, Any] | None  # the wheel's provenance, when it has a readable one


def content_checks(wheel: Path, filename: str, label: VariantKey | None) -> Content:
    """The checks that follow from the wheel's bytes and its filename alone (so a stable-ABI wheel stored
    under several pages is read for them once), and its provenance document."""
    found = _Found(key=filename)
    try:
        name, version, _build, _tags = parse_wheel_filename(filename)
        metadata: bytes | None = read_metadata(wheel, filename)
        check_metadata(metadata or b"", name=str(name), version=version, shown="METADATA")
        found.add("metadata", None)
    except ConfigError as exc:
        found.add("metadata", str(exc).removeprefix(f"{filename}: "))
        metadata = None
    try:
        archive = bounded.open_zip(wheel)  # a central directory of a million entries is refused unread
    except (OSError, zipfile.BadZipFile) as exc:
        found.add("archive", f"not a readable zip ({exc})")
        return Content(found=found, document=None)
    with archive:
        found.add("archive", wheelcheck.archive_problems(archive))
        if label is not None:
            if metadata is not None:
                try:
                    found.add("torch-pin", torch_pin_problem(metadata.decode("utf-8"), label))
                except UnicodeDecodeError:
                    found.add("torch-pin", "METADATA is not UTF-8")
            modules = [n for n in archive.namelist() if wheelcheck.is_extension_module(n)]
            # a module with no device code at all is host-only, as the build's check decided from its link
            host_only = [glob.escape(m) for m in modules]
            found.add(
                "device-code", wheelcheck.device_code_problems(archive, label.archs, host_only=host_only)
            )
            if label.stable:
                found.add("stable-abi", wheelcheck.stable_abi_problems(archive))
    try:
        document = embedded.read(wheel).provenance
    except CheckError as exc:
        found.add("provenance", str(exc).removeprefix(f"{wheel.name}: "))
        return Content(found=found, document=None)
    found.add(
        "provenance", provenance_label_problems(document, filename, label) if label is not None else None
    )
    return Content(found=found, document=document)


@dataclass(frozen=True, kw_only=True)
class _Context:
    store: Store
    key: Ed25519PublicKey | None
    jobs: Mapping[str, Sequence[Job]] | None
    project: str | None
    scratch: Path


def audit_wheel(
    ctx: _Context, variant_id: str, rec: FileRecord, slot: int, seen: dict[tuple[str, str], Content]
) -> tuple[WheelAudit, Path | None]:
    """Every check of one listed wheel, read into the scratch directory's `slot`; that copy when its bytes
    are the page's (for a rebuild), else None. `seen`: the content checks of files read before."""
    key = index.files_path(variant_id, rec.filename)
    found = _Found(key=key)

    def done(sha256: str | None, size: int | None, job_id: str | None = None) -> WheelAudit:
        return WheelAudit(
            key=key, variant_id=variant_id, filename=rec.filename, sha256=sha256, size=size,
            checks=tuple(found.checks), problems=tuple(found.problems), job_id=job_id,
        )  # fmt: skip

    if not _PLAIN_NAME.fullmatch(rec.filename) or _canonical(rec.filename) != rec.filename:
        # never a path made of what a page says: the scratch copy and the keys beside it are named by it
        found.add("page", "lists a name that is no canonical wheel filename; not read")
        return done(None, None), None
    target = ctx.scratch / str(slot) / rec.filename
    target.parent.mkdir()
    got = _download(ctx.store, key, rec, target)
    if isinstance(got, str):
        found.add("page", got)
        return done(None, None), None
    sha256, size = got
    page = []
    if size != rec.size:
        page.append(f"{size} bytes, its page lists {rec.size}")
    if sha256 != rec.sha256:
        page.append(f"sha256 {sha256}, its page lists {rec.sha256}: not the file published")
    found.add("page", page)
    if ctx.key is not None:
        _signature(ctx, variant_id, rec.filename, sha256, found)
    if page:  # the bytes are not what was published: nothing they say is the published wheel's
        return done(sha256, size), None
    label: VariantKey | None = None
    try:
        label = label_of(rec.filename)
    except ValueError as exc:
        found.add("label", str(exc))
    else:
        found.add("label", wheel_name_problem(rec.filename, variant_id))
    _metadata_file(ctx.store, variant_id, rec, target, found)
    content = seen.get((rec.filename, sha256))
    if content is None:
        content = seen[(rec.filename, sha256)] = content_checks(target, rec.filename, label)
    for check in content.found.checks:
        found.add(check, [p.message for p in content.found.problems if p.check == check])
    _published_beside(
        ctx.store,
        index.provenance_path(variant_id, rec.filename),
        limit=provenance.MAX_BYTES,
        inside=embedded.provenance_bytes(target),
        what="provenance",
        found=found,
    )
    _published_beside(
        ctx.store,
        index.sbom_path(variant_id, rec.filename),
        limit=sbom.MAX_BYTES,
        inside=embedded.sbom_bytes(target),
        what="SBOM",
        found=found,
    )
    job = None
    if ctx.jobs is not None and ctx.project is not None and label is not None and content.document:
        job = planned_job(rec.filename, label, ctx.jobs, ctx.project)
        if job is not None:
            found.add("matrix", provenance_job_problems(content.document, job))
    return done(sha256, size, job.id if job is not None else None), target


def _signature(ctx: _Context, variant_id: str, filename: str, sha256: str, found: _Found) -> None:
    assert ctx.key is not None
    sig_key = index.signature_path(variant_id, filename)
    try:
        data = _read_small(ctx.store, sig_key, signing.MAX_SIGNATURE_BYTES)
    except bounded.Refused as exc:
        found.add("signature", f"{sig_key}: {exc}")
        return
    if data is None:
        found.add("signature", f"no signature ({sig_key} is missing)")
        return
    try:
        signing.check(data, filename=filename, sha256=sha256, key=ctx.key)
    except signing.SignatureError as exc:
        found.add("signature", str(exc))
    else:
        found.add("signature", None)


def _metadata_file(store: Store, variant_id: str, rec: FileRecord, wheel: Path, found: _Found) -> None:
    """The PEP 658 file beside the wheel is its METADATA, with the hash the page lists (a missing one is
    the index check's problem)."""
    meta_key = index.metadata_path(variant_id, rec.filename)
    try:
        data = _read_small(store, meta_key, MAX_METADATA_BYTES)
    except bounded.Refused as exc:
        found.add("metadata", f"{meta_key}: {exc}")
        return
    if data is None:
        return
    problems = []
    try:
        if data != read_metadata(wheel, rec.filename):
            problems.append(f"{meta_key} is not the wheel's METADATA")
    except ConfigError:
        pass  # the wheel's own METADATA is said by the content checks
    if rec.metadata_sha256 is not None and hashlib.sha256(data).hexdigest() != rec.metadata_sha256:
        problems.append(f"{meta_key} does not have the sha256 its page lists")
    found.add("metadata", problems)


def _published_beside(
    store: Store, key: str, *, limit: int, inside: bytes | None, what: str, found: _Found
) -> None:
    """A file published beside the wheel (its provenance, its SBOM) is the in-wheel file's bytes: publishing
    writes it for every wheel that carries a valid one; neither without the other. Problems of the
    provenance check (the provenance names the SBOM, and both are published from a valid pair)."""
    try:
        data = _read_small(store, key, limit)
    except bounded.Refused as exc:
        found.add("provenance", f"{key}: {exc}")
        return
    if data is None and inside is not None:
        found.add("provenance", f"{key} is missing (publishing writes the wheel's {what} beside it)")
    elif data is not None and inside is None:
        found.add("provenance", f"{key} is published, but the wheel carries no valid {what}")
    elif data != inside:
        found.add("provenance", f"{key} is not the {what} inside the wheel")


# --- the index ----------------------------------------------------------------------------------------------


def _index_problems(lines: Sequence[str]) -> list[Problem]:
    out = []
    for line in lines:
        where, sep, message = line.partition(": ")
        out.append(Problem(where=where if sep else "index", check="index", message=message if sep else line))
    return out


@contextmanager
def _scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="factory-audit-") as tmp:
        yield Path(tmp)


def audit_index(
    *,
    to: str,
    store: Store,
    key: Ed25519PublicKey | None = None,
    jobs: Sequence[Job] | None = None,
    project: str | None = None,
    rebuild: int = 0,
    rebuilder: Rebuild | None = None,
    rng: random.Random | None = None,
    log: Log = lambda _line: None,
) -> Audit:
    """Audit every wheel the pages of `store` list (module docstring): with `key`, their signatures; with
    the planned `jobs` of `project`, their provenance against the job that builds each; `rebuild` of them
    (distinct files, chosen by `rng`) rebuilt by `rebuilder` (`factory.build.rebuild.rebuilder`), which
    a rebuild needs."""
    if rebuild > 0 and rebuilder is None:
        raise ValueError("auditing with a rebuild needs a rebuilder")
    checked = check_index(to=to, store=store)
    listed = checked.listed
    by_file: dict[tuple[str, str], list[int]] = {}
    for n, (_variant, rec) in enumerate(listed):
        by_file.setdefault((rec.filename, rec.sha256), []).append(n)
    chooser = rng or random.SystemRandom()
    chosen = {ns[0] for ns in chooser.sample(sorted(by_file.values()), min(max(rebuild, 0), len(by_file)))}
    planned = plan_index(jobs) if jobs is not None else None
    audits: list[WheelAudit] = []
    unplanned: list[str] = []
    seen: dict[tuple[str, str], Content] = {}
    with _scratch() as scratch:
        ctx = _Context(store=store, key=key, jobs=planned, project=project, scratch=scratch)
        for n, (variant_id, rec) in enumerate(listed):
            log(f"auditing {index.files_path(variant_id, rec.filename)}")
            audited, local = audit_wheel(ctx, variant_id, rec, n, seen)
            if planned is not None and audited.job_id is None and local is not None:
                unplanned.append(audited.key)
            if n in chosen and rebuilder is not None:
                audited = _rebuilt(audited, local, rebuilder)
            shutil.rmtree(scratch / str(n), ignore_errors=True)
            audits.append(audited)
    page_problems = {a.key for a in audits if any(p.check == "page" for p in a.problems)}
    # a file not its page's bytes is said once, by the audit that hashed it
    index_problems = [p for p in _index_problems(checked.problems) if p.where not in page_problems]
    return Audit(
        to=to,
        destination=store.description,
        key_id=signing.key_id(key) if key is not None else None,
        matrix=jobs is not None,
        index_problems=tuple(index_problems),
        wheels=tuple(audits),
        unplanned=tuple(unplanned),
    )


def _rebuilt(audited: WheelAudit, local: Path | None, rebuilder: Rebuild) -> WheelAudit:
    """The audit with the rebuild of its wheel compared bit for bit; a wheel whose bytes are not its page's
    is not rebuilt (that is its problem already)."""
    if local is None:
        return audited
    try:
        result = rebuilder(local)
    except FactoryError as exc:
        failed = f"cannot be rebuilt: {exc}"
        return _with(audited, failed, {"wheel": audited.filename, "ok": False, "failure": str(exc)})
    return _with(audited, None if result.ok else result.line(), result.to_json())


def _with(audited: WheelAudit, problem: str | None, rebuilt: dict[str, Any]) -> WheelAudit:
    found = (Problem(where=audited.key, check="rebuild", message=problem),) if problem else ()
    return replace(
        audited, checks=(*audited.checks, "rebuild"), problems=audited.problems + found, rebuilt=rebuilt
    )


def audit_published(
    *,
    to: str | None,
    endpoint_url: str | None = None,
    key: Path | None = None,
    matrix: Path | None = None,
    trust_paths: bool = False,
    rebuild: int = 0,
    rebuilder: Rebuild | None = None,
    log: Log = lambda _line: None,
) -> Audit:
    """`factory index audit`: `audit_index` of `to`, or of the matrix file's publish.to; with `matrix`, each
    wheel's provenance against its planned job; `key`: the public key every wheel must be signed with;
    `rebuild` of the wheels rebuilt by `rebuilder`."""
    if rebuild < 0:
        raise ConfigError(f"--rebuild {rebuild}: the number of wheels to rebuild is 0 or more")
    public = signing.public_key_file(key) if key is not None else None
    target = resolve_target(
        to=to, endpoint_url=endpoint_url, matrix=matrix, trust_paths=trust_paths, what="audit"
    )
    store = open_store(target.to, endpoint_url=target.endpoint_url, existing=True)
    return audit_index(
        to=target.to,
        store=store,
        key=public,
        jobs=list(target.jobs) if target.jobs is not None else None,
        project=target.project,
        rebuild=rebuild,
        rebuilder=rebuilder,
        log=log,
    )
