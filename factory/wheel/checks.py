"""Acceptance checks of a built wheel, and the METADATA torch pin that keeps its RECORD valid.

A wheel is accepted only when its name, tags and version say what the job built, its manylinux tag promises
no older glibc than auditwheel finds its symbols need, its METADATA pins the torch it was compiled against,
its RECORD matches its contents, it vendors none of torch's libraries, and every extension module carries
cubins for exactly the requested GPU targets, suffix included (sm_90a is not sm_90), but those the recipe
names host-only, which may carry none. All of this is read from the zip on the host (auditwheel included);
nothing here runs Docker.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from fnmatch import fnmatchcase
from pathlib import Path

from packaging.metadata import parse_email
from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag
from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from factory.core import bounded, reproducible
from factory.core.errors import CheckError
from factory.core.platforms import DEFAULT_PLATFORM, PLATFORMS, by_name
from factory.core.tags import manylinux_tag, parse_glibc, parse_manylinux, python_tag
from factory.core.variants import Arch
from factory.spec import abi3
from factory.spec.abi3 import ABI3
from factory.spec.stable_abi import module_problem as stable_abi_module_problem
from factory.spec.torchreq import TORCH as _TORCH
from factory.spec.torchreq import torch_requirement
from factory.wheel.fatbin import read_device_code
from factory.wheel.platform_tag import audit, vendored_torch_libraries

_RECORD_SIGNATURES = ("RECORD.jws", "RECORD.p7s")
_COPY_CHUNK = 1 << 20
MAX_METADATA_BYTES = 16 << 20  # a METADATA read to rewrite it (long descriptions are a few hundred KiB)
MAX_RECORD_BYTES = 64 << 20  # RECORD: a line per file, ~100 bytes each (torch's wheel: ~13,000 files)


# --- small pure helpers -------------------------------------------------------------------------------------


def record_hash(data: bytes) -> str:
    """A RECORD hash field: sha256 as urlsafe base64 without padding (wheel spec)."""
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _target_key(target: str) -> tuple[int, Arch, str]:
    """Sort exact device-code targets by arch: sm_90 before sm_90a before sm_100 (not as text)."""
    try:
        return 0, Arch.parse(target.partition("_")[2]), target
    except ValueError:
        return 1, Arch(0, 0), target


def _format_targets(values: Iterable[str]) -> str:
    return ", ".join(sorted(values, key=_target_key)) or "none"


# --- METADATA -----------------------------------------------------------------------------------------------


def _split_headers(text: str) -> tuple[list[str], str]:
    """Header lines (each with its line ending, continuation lines folded in) and the untouched body."""
    lines = text.splitlines(keepends=True)
    headers: list[str] = []
    for index, line in enumerate(lines):
        if line in ("\n", "\r\n", "\r"):
            return headers, "".join(lines[index:])
        if line[:1] in (" ", "\t") and headers:
            headers[-1] += line
        else:
            headers.append(line)
    return headers, ""


def _requirement_of(header: str) -> Requirement | None:
    name, _, value = header.partition(":")
    if name.strip().lower() != "requires-dist":
        return None
    try:
        return Requirement(" ".join(value.split()))
    except InvalidRequirement:
        return None


def _wheel_requirement(torch_version: str, stable_abi: str | None) -> Requirement:
    """`torchreq.torch_requirement`, a torch that is no version a CheckError (it came from the build)."""
    try:
        return torch_requirement(torch_version, stable_abi=stable_abi or None)
    except ValueError as exc:
        raise CheckError(str(exc)) from None


def pin_torch_in_metadata(
    text: str, torch_version: str, *, stable_abi: str | None = None, requires: Sequence[str] = ()
) -> str:
    """METADATA text with every torch requirement replaced by one unconditional `torch==X.Y.*` (a stable-ABI
    wheel's: `torch>=FLOOR`), and `requires` (the recipe's extra_requires) after it, each replacing a
    requirement of the same project the package declared.

    The extension links against that torch's C++ ABI whatever extras were chosen, hence no marker survives.
    """
    pin = _wheel_requirement(torch_version, stable_abi)
    headers, body = _split_headers(text)
    newline = "\r\n" if headers and headers[0].endswith("\r\n") else "\n"
    pin_line = "".join(f"Requires-Dist: {r}{newline}" for r in (str(pin), *requires))
    replaced = {_TORCH, *(canonicalize_name(Requirement(r).name) for r in requires)}
    kept: list[str] = []
    insert_at: int | None = None
    last_requirement: int | None = None
    for header in headers:
        requirement = _requirement_of(header)
        if requirement is not None and canonicalize_name(requirement.name) in replaced:
            if insert_at is None:
                insert_at = len(kept)
            continue
        if header.split(":", 1)[0].strip().lower() == "requires-dist":
            last_requirement = len(kept)
        kept.append(header)
    if insert_at is None:
        insert_at = len(kept) if last_requirement is None else last_requirement + 1
    if kept and not kept[-1].endswith(("\n", "\r")):
        kept[-1] += newline
    kept.insert(insert_at, pin_line)
    return "".join(kept) + body


def torch_requirements(text: str) -> list[Requirement]:
    headers, _ = _split_headers(text)
    found = [_requirement_of(h) for h in headers]
    return [r for r in found if r is not None and canonicalize_name(r.name) == _TORCH]


# --- RECORD -------------------------------------------------------------------------------------------------


def _dist_info_dirs(names: Iterable[str]) -> list[str]:
    return sorted(
        {n.split("/", 1)[0] for n in names if "/" in n and n.split("/", 1)[0].endswith(".dist-info")}
    )


_UNREADABLE = bounded.MEMBER_ERRORS


def member_path_problem(name: str) -> str | None:
    """Why a path in a wheel (a zip member or a RECORD entry) could land outside the install directory."""
    if not name:
        return "an empty path"
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return "an absolute path"
    if "\x00" in name:
        return "a NUL in the path"
    if ".." in name.replace("\\", "/").split("/"):
        return "a '..' path"
    return None


def _record_rows(archive: zipfile.ZipFile, record_path: str) -> list[list[str]] | str:
    try:
        data = bounded.read_member(archive, record_path, max_bytes=MAX_RECORD_BYTES)
        return list(csv.reader(io.StringIO(data.decode("utf-8"))))
    except (KeyError, UnicodeDecodeError, csv.Error, OSError) as exc:  # OSError: Refused, BadMember
        return f"RECORD: cannot be read ({exc})"


def _member_digest(archive: zipfile.ZipFile, info: zipfile.ZipInfo, algorithm: str) -> tuple[str, int]:
    """The urlsafe-base64 digest (no padding) and the size of a member as an installer unpacks it."""
    hasher = hashlib.new(algorithm)
    size = 0
    with archive.open(info) as handle:
        while chunk := handle.read(_COPY_CHUNK):
            hasher.update(chunk)
            size += len(chunk)
    return base64.urlsafe_b64encode(hasher.digest()).rstrip(b"=").decode("ascii"), size


def record_problems(archive: zipfile.ZipFile, record_path: str) -> list[str]:
    """Every way RECORD disagrees with the archive, as an installer checks it: each file listed once with a
    sha256 (or stronger) urlsafe-base64 digest and its size that match, RECORD's own line without either,
    no file unlisted, nothing listed that is not there, no path that leaves the install directory."""
    rows = _record_rows(archive, record_path)
    if isinstance(rows, str):
        return [rows]
    problems: list[str] = []
    listed: dict[str, tuple[str, str]] = {}
    signatures = {f"{record_path.rsplit('/', 1)[0]}/{s}" for s in _RECORD_SIGNATURES}
    for number, row in enumerate(rows, start=1):
        if not row:
            continue
        if len(row) != 3:
            problems.append(f"RECORD line {number}: expected 3 fields, got {len(row)}")
            continue
        path, digest, size = row
        why = member_path_problem(path)
        if why is not None:
            problems.append(f"RECORD line {number}: {path!r} is {why}")
            continue
        if path in listed:
            problems.append(f"RECORD: {path} is listed twice")
        listed[path] = (digest, size)
    own = listed.get(record_path)
    if own is not None and own != ("", ""):
        problems.append(f"RECORD: its own line must have no hash or size, not {','.join(own)!r}")
    members = [i for i in archive.infolist() if not i.is_dir()]
    seen: set[str] = set()
    for info in members:
        name = info.filename
        if name in seen:
            problems.append(f"zip: {name} is stored twice")
        seen.add(name)
        if name == record_path or name in signatures:
            continue
        if name not in listed:
            problems.append(f"RECORD: {name} is in the wheel but not listed")
            continue
        digest, size = listed[name]
        algorithm, _, expected = digest.partition("=")
        if algorithm not in {"sha256", "sha384", "sha512"} or not expected:
            problems.append(f"RECORD: {name} has no sha256 (or stronger) hash: {digest!r}")
            continue
        if not size.isdecimal():
            problems.append(f"RECORD: {name} has no size: {size!r}")
            continue
        try:
            actual, actual_size = _member_digest(archive, info, algorithm)
        except _UNREADABLE as exc:
            problems.append(f"zip: {name} cannot be read ({exc})")
            continue
        if actual != expected:
            problems.append(f"RECORD: {name} hash mismatch (RECORD {algorithm}={expected}, file {actual})")
        if int(size) != actual_size:
            problems.append(f"RECORD: {name} size mismatch (RECORD {size}, file {actual_size})")
    for name in sorted(set(listed) - seen - {record_path}):
        problems.append(f"RECORD: {name} is listed but not in the wheel")
    return problems


def archive_problems(archive: zipfile.ZipFile) -> list[str]:
    """Every reason an installer would refuse the wheel archive, or should: a member path that leaves the
    install directory, one .dist-info directory with a RECORD, and that RECORD (`record_problems`)."""
    problems = [
        f"zip: {info.filename!r} is {why}"
        for info in archive.infolist()
        if (why := member_path_problem(info.filename)) is not None
    ]
    dist_infos = _dist_info_dirs(archive.namelist())
    if len(dist_infos) != 1:
        return [*problems, f"zip: expected one .dist-info directory, found {', '.join(dist_infos) or 'none'}"]
    record_path = f"{dist_infos[0]}/RECORD"
    if record_path not in archive.namelist():
        return [*problems, f"{record_path}: missing"]
    return problems + record_problems(archive, record_path)


def wheel_archive_problems(wheel: Path) -> list[str]:
    """`archive_problems` of the wheel file; one problem when it is not a readable zip."""
    try:
        with bounded.open_zip(wheel) as archive:
            return archive_problems(archive)
    except (zipfile.BadZipFile, *_UNREADABLE) as exc:
        return [f"zip: cannot be opened ({exc})"]


# --- pinning ------------------------------------------------------------------------------------------------


def _open_wheel(wheel: Path) -> zipfile.ZipFile:
    try:
        return bounded.open_zip(wheel)
    except (zipfile.BadZipFile, *_UNREADABLE) as exc:
        raise CheckError(f"{wheel.name}: not a readable wheel ({exc})") from None


def _read_metadata(archive: zipfile.ZipFile, wheel: Path, dist_info: str) -> str:
    """METADATA's text, read within MAX_METADATA_BYTES (the wheel came out of a build container)."""
    path = f"{dist_info}/METADATA"
    try:
        data = bounded.read_member(archive, path, max_bytes=MAX_METADATA_BYTES)
    except KeyError:
        raise CheckError(f"{wheel.name}: {path} is missing") from None
    except bounded.Refused:
        raise CheckError(f"{wheel.name}: {path} is over {MAX_METADATA_BYTES >> 20} MiB") from None
    except bounded.BadMember as exc:
        raise CheckError(f"{wheel.name}: {path} cannot be read ({exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise CheckError(f"{wheel.name}: {path} is not UTF-8") from None


def pin_torch_requirement(
    wheel: Path,
    torch_version: str,
    *,
    stable_abi: str | None = None,
    extra: Mapping[str, bytes] | None = None,
    epoch: int = reproducible.DEFAULT_EPOCH,
    requires: Sequence[str] = (),
) -> None:
    """Rewrite the wheel in place so METADATA requires `torch==X.Y.*` (`torch>=FLOOR` for a stable-ABI
    wheel) and `requires` (`pin_torch_in_metadata`) and RECORD matches the new contents, as a canonical
    archive dated from `epoch` (`rewrite_wheel`); `extra`: files added to its .dist-info in the same rewrite
    (provenance, SBOM)."""
    with _open_wheel(wheel) as archive:
        dist_infos = _dist_info_dirs(archive.namelist())
        if len(dist_infos) != 1:
            raise CheckError(f"{wheel.name}: expected one .dist-info directory, found {len(dist_infos)}")
        dist_info = dist_infos[0]
        metadata = _read_metadata(archive, wheel, dist_info)
        pinned = pin_torch_in_metadata(metadata, torch_version, stable_abi=stable_abi, requires=requires)
        pinned_bytes = pinned.encode("utf-8")
        rewrite_wheel(archive, wheel, dist_info=dist_info, metadata=pinned_bytes, extra=extra, epoch=epoch)


def rewrite_wheel(
    archive: zipfile.ZipFile,
    target: Path,
    *,
    dist_info: str,
    metadata: bytes,
    renames: Mapping[str, str] | None = None,
    extra: Mapping[str, bytes] | None = None,
    epoch: int = reproducible.DEFAULT_EPOCH,
) -> None:
    """Write `archive` anew as `target` with `metadata` as its METADATA and each member under a prefix of
    `renames` (old -> new, directory prefixes ending in '/') renamed; RECORD is made from the bytes actually
    written and placed last, signatures over the old one dropped. `extra` (paths relative to the .dist-info
    -> bytes) are written into it, in place of any member of the same path. The archive is canonical
    (`reproducible`): members in `reproducible.canonical_order`, each dated from `epoch` (the source's
    SOURCE_DATE_EPOCH), mode 0644 or 0755, deflated at one level; RECORD's rows in the same order. Two builds
    of the same bytes give the same wheel, whenever and wherever they ran. The new zip is written beside
    `target` and renamed over it, so a failure leaves whatever was there untouched."""
    renames = renames or {}
    metadata_path = f"{dist_info}/METADATA"
    record_path = f"{dist_info}/RECORD"
    added = {_renamed(f"{dist_info}/{rel}", renames): data for rel, data in (extra or {}).items()}
    dropped = {record_path} | {f"{dist_info}/{s}" for s in _RECORD_SIGNATURES}
    kept = [i for i in archive.infolist() if i.filename not in dropped]
    members = {_renamed(i.filename, renames): i for i in kept}
    if len(members) != len(kept):
        raise CheckError(f"{target.name}: a member is in the wheel twice")
    members = {name: info for name, info in members.items() if name not in added}
    fd, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    temp = Path(temp_name)
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w") as out:
            rows: list[tuple[str, str, str]] = []
            for name in reproducible.canonical_order([*members, *added]):
                if name in added:
                    data = added[name]
                    out.writestr(reproducible.canonical_info(name, epoch=epoch, mode=0o644), data)
                    rows.append((name, record_hash(data), str(len(data))))
                    continue
                info = members[name]
                if info.is_dir():
                    out.writestr(_canonical_info(info, name, epoch), b"")
                    continue
                if info.filename == metadata_path:
                    out.writestr(_canonical_info(info, name, epoch), metadata)
                    rows.append((name, record_hash(metadata), str(len(metadata))))
                    continue
                rows.append(_copy_member(archive, info, out, name, epoch))
            new_record_path = _renamed(record_path, renames)
            rows.append((new_record_path, "", ""))
            text = io.StringIO()
            csv.writer(text, lineterminator="\n").writerows(rows)
            new_record = reproducible.canonical_info(new_record_path, epoch=epoch, mode=0o644)
            out.writestr(new_record, text.getvalue().encode("utf-8"))
            out.close()
            raw.flush()
            os.fsync(raw.fileno())
        if archive.filename:  # the old wheel's permission bits
            temp.chmod(Path(archive.filename).stat().st_mode & 0o777)
        temp.replace(target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def _renamed(path: str, renames: Mapping[str, str]) -> str:
    for old, new in renames.items():
        if path.startswith(old):
            return new + path[len(old) :]
    return path


# --- the local version label --------------------------------------------------------------------------------


def labelled_version(version: Version, label: str) -> Version | None:
    """The version a wheel should have with the variant's `label`; None when it has it already. One with
    another local version is refused: its setup.py chose that one, and which is right is not ours to say."""
    if version.local == label:
        return None
    if version.local is not None:
        raise CheckError(
            f"the wheel's version {version} carries the local version {version.local}, "
            f"not the variant's {label}"
        )
    try:
        return Version(f"{version.public}+{label}")
    except InvalidVersion:
        raise CheckError(f"{label!r} is not a PEP 440 local version label") from None


def set_metadata_version(text: str, version: Version) -> str:
    """METADATA with its one `Version:` header set to `version`; every other header, and the body, kept."""
    headers, body = _split_headers(text)
    found = [i for i, h in enumerate(headers) if h.split(":", 1)[0].strip().lower() == "version"]
    if len(found) != 1:
        raise CheckError(f"METADATA has {len(found)} Version headers, not one")
    line = headers[found[0]]
    headers[found[0]] = f"Version: {version}{line[len(line.rstrip(chr(13) + chr(10))) :] or chr(10)}"
    return "".join(headers) + body


def relabelled_name(filename: str, version: Version) -> str:
    """A wheel file name with its version field set: the name, build tag and tags kept as written."""
    parts = filename.removesuffix(".whl").split("-")
    return "-".join([parts[0], str(version), *parts[2:]]) + ".whl"


def set_local_version(wheel: Path, label: str, *, epoch: int = reproducible.DEFAULT_EPOCH) -> Path | None:
    """Give `wheel` the local version `label` (`+cu13.0.torch2.14...`) where its setup.py gave it none: in
    its file name, its .dist-info and .data directory names, METADATA's Version and RECORD (paths and
    hashes); WHEEL is copied as it is. Renaming the file alone would break pip, which checks they agree.
    Returns the new wheel, beside the old one (which is gone), or None when it carries the label already.
    The wheel came out of a build container: an archive an installer would refuse (`archive_problems`), or a
    wheel that carries another local version, is a CheckError of one line."""
    try:
        _name, version, _build, _tags = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as exc:
        raise CheckError(f"{wheel.name}: {exc}") from None
    new_version = labelled_version(version, label)
    if new_version is None:
        return None
    target = wheel.with_name(relabelled_name(wheel.name, new_version))
    set_version(wheel, target, new_version, epoch=epoch)
    if target != wheel:
        wheel.unlink()
    return target


def set_version(
    wheel: Path,
    target: Path,
    new_version: Version,
    *,
    extra: Mapping[str, bytes] | None = None,
    epoch: int = reproducible.DEFAULT_EPOCH,
) -> None:
    """Write `wheel` as `target` with the version `new_version`: its .dist-info and .data directory names,
    METADATA's Version and RECORD (paths and hashes); `extra` (paths relative to the .dist-info -> bytes)
    added in the same rewrite (`rewrite_wheel`). An archive an installer would refuse (`archive_problems`) is
    a CheckError of one line."""
    _name, version, _build, _tags = parse_wheel_filename(wheel.name)
    with _open_wheel(wheel) as archive:
        problems = archive_problems(archive)
        if problems:
            raise CheckError(f"{wheel.name}: {problems[0]}")
        (dist_info,) = _dist_info_dirs(archive.namelist())  # archive_problems: exactly one
        stem, _, written = dist_info.removesuffix(".dist-info").rpartition("-")
        if not _same_version(written, version):
            raise CheckError(f"{wheel.name}: {dist_info} does not carry the file name's version {version}")
        metadata = set_metadata_version(_read_metadata(archive, wheel, dist_info), new_version)
        renames = {
            f"{stem}-{written}.dist-info/": f"{stem}-{new_version}.dist-info/",
            f"{stem}-{written}.data/": f"{stem}-{new_version}.data/",
        }
        data = metadata.encode("utf-8")
        rewrite_wheel(
            archive, target, dist_info=dist_info, metadata=data, renames=renames, extra=extra, epoch=epoch
        )


def _canonical_info(info: zipfile.ZipInfo, name: str, epoch: int) -> zipfile.ZipInfo:
    is_dir = info.is_dir()
    mode = reproducible.canonical_mode(info.external_attr, is_dir=is_dir)
    return reproducible.canonical_info(name, epoch=epoch, mode=mode, is_dir=is_dir)


def _copy_member(
    source: zipfile.ZipFile, info: zipfile.ZipInfo, out: zipfile.ZipFile, name: str, epoch: int
) -> tuple[str, str, str]:
    """Stream one member across (extensions can be hundreds of MB) under `name`, in its canonical form,
    hashing what is written."""
    hasher = hashlib.sha256()
    size = 0
    new = _canonical_info(info, name, epoch)
    new.file_size = info.file_size
    with (
        source.open(info) as src,
        out.open(new, "w", force_zip64=info.file_size > zipfile.ZIP64_LIMIT) as dst,
    ):
        while chunk := src.read(_COPY_CHUNK):
            hasher.update(chunk)
            size += len(chunk)
            dst.write(chunk)
    digest = base64.urlsafe_b64encode(hasher.digest()).rstrip(b"=").decode("ascii")
    return new.filename, f"sha256={digest}", str(size)


# --- the acceptance check -----------------------------------------------------------------------------------


def check_wheel(
    wheel: Path,
    *,
    name: str,
    version: str,
    local_version: str,
    python: str,
    torch_version: str,
    archs: Sequence[str],
    machine: str = DEFAULT_PLATFORM.name,
    limited_api: str | None = None,
    host_only: Sequence[str] = (),
    stable_abi: str | None = None,
    glibc: str | None = None,
) -> list[str]:
    """Every reason to refuse `wheel` for the job described by the keywords, one line each; [] accepts it.

    `archs` are torch-style compute capabilities ("8.0", "9.0a", "10.0f"); each expects a cubin for exactly
    that target (sm_80, sm_90a, sm_100f). A suffix is part of the target: a generic sm_90 cubin lacks the
    arch-specific instructions (wgmma) only an sm_90a one holds, and an sm_90a cubin runs on 9.0 alone, so
    neither stands in for the other. `limited_api` ("cp311"): the job builds an abi3 wheel, which must
    carry `cp311-abi3`, name its modules for no one CPython version and keep to the stable ABI (abi3audit).
    `stable_abi` ("2.12"): the wheel requires `torch>=2.12` and its modules' undefined symbols name no C++
    function of torch (`stable_abi.module_problem`). `host_only` are the recipe's globs of extension modules
    that may carry no device code at all (`library_glob_matches`); one that does carry some is checked as
    any other. `glibc` ("2.28"): the matrix's floor (build.glibc); a manylinux tag above it is refused.
    """
    problems: list[str] = []
    expected_version = _expected_version(version, local_version)
    file_version: Version | None = None
    try:
        file_name, file_version, _build, tags = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as exc:
        problems.append(f"filename: {exc}")
        tags = frozenset()
        file_name = None
    if file_name is not None and file_name != canonicalize_name(name):
        problems.append(f"filename: project {file_name} is not {canonicalize_name(name)}")
    if file_version is not None and file_version != expected_version:
        problems.append(f"filename: version {file_version} is not the job's {expected_version}")
    if tags:
        try:
            interpreter = python_tag(python)
        except ValueError as exc:
            raise CheckError(str(exc)) from None
        problems += _check_python_tags(tags, interpreter=limited_api or interpreter, abi3=bool(limited_api))
        bad_platforms = sorted({t.platform for t in tags if _manylinux_for(t.platform, machine) is None})
        if bad_platforms:
            problems.append(
                f"filename: platform tag {', '.join(bad_platforms)} is not a manylinux tag for {machine} "
                "(auditwheel repair gives the wheel the one its symbols allow)"
            )
        problems += floor_problems({t.platform for t in tags}, machine=machine, glibc=glibc)

    try:
        archive = bounded.open_zip(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        return [*problems, f"zip: cannot be opened ({exc})"]
    with archive:
        problems += _check_contents(
            archive,
            name=name,
            file_version=file_version,
            torch_requirement=_wheel_requirement(torch_version, stable_abi),
            tags={str(t) for t in tags},
            expected=_cubin_targets(archs),
            host_only=tuple(host_only),
        )
        if limited_api:
            problems += [
                f"{member}: a module named for one CPython version in an abi3 wheel; later Pythons will not "
                "import it (its Extension needs py_limited_api=True)"
                for member in abi3.versioned_modules(archive.namelist())
            ]
        if stable_abi:
            problems += stable_abi_problems(archive)
        problems += machine_problems(archive, machine)
    if problems:
        return problems  # auditwheel's errors about a broken wheel would only repeat these
    if limited_api:
        try:
            problems += abi3.audit(wheel)
        except CheckError as exc:
            problems.append(str(exc).removeprefix(f"{wheel.name}: "))
    return problems + _check_platform(wheel, {t.platform for t in tags}, machine)


def _check_python_tags(tags: Iterable[Tag], *, interpreter: str, abi3: bool) -> list[str]:
    """The interpreter tag must be the job's (its abi3 tag for an abi3 wheel), and an abi3 job's wheel must
    carry the abi3 ABI tag and no other."""
    problems: list[str] = []
    if not any(t.interpreter == interpreter for t in tags):
        found = ", ".join(sorted({t.interpreter for t in tags}))
        problems.append(f"filename: interpreter tag {found} is not {interpreter}")
    if abi3:
        abis = sorted({t.abi for t in tags})
        if abis != [ABI3]:
            problems.append(
                f"filename: ABI tag {', '.join(abis)} is not {ABI3}: the recipe builds a limited-API wheel "
                "(the package's bdist_wheel py_limited_api)"
            )
    return problems


def floor_problems(platforms: Iterable[str], *, machine: str, glibc: str | None) -> list[str]:
    """A platform tag whose glibc is above the matrix's floor (build.glibc), one line each; [] without one."""
    floor = parse_glibc(glibc) if glibc else None
    if floor is None:
        return []
    problems = []
    for platform in sorted(platforms):
        needs = _manylinux_for(platform, machine)
        if needs is not None and needs > floor:
            problems.append(
                f"filename: platform tag {platform} needs glibc {needs[0]}.{needs[1]}, above the matrix's "
                f"floor build.glibc {glibc} ({manylinux_tag(floor, machine)}): hosts of glibc {glibc} "
                "cannot install it; build it with a flavor whose builder's glibc is not above the floor"
            )
    return problems


def _manylinux_for(platform: str, machine: str) -> tuple[int, int] | None:
    parsed = parse_manylinux(platform)
    return parsed.glibc if parsed is not None and parsed.machine == machine else None


def _check_platform(wheel: Path, platforms: set[str], machine: str) -> list[str]:
    """The manylinux tags must not promise an older glibc than auditwheel finds the extension needs."""
    try:
        verdict = audit(wheel)
    except CheckError as exc:
        return [str(exc).removeprefix(f"{wheel.name}: ")]
    problems = verdict.problems()
    for platform in sorted(platforms):
        glibc = _manylinux_for(platform, machine)
        if glibc is not None and glibc < verdict.glibc:
            problems.append(
                f"filename: platform tag {platform} promises glibc {glibc[0]}.{glibc[1]}, but the "
                f"extension's symbols need {verdict.glibc[0]}.{verdict.glibc[1]} "
                f"({manylinux_tag(verdict.glibc, machine)})"
            )
    return problems


def _cubin_targets(archs: Sequence[str]) -> frozenset[str]:
    """The exact cubin targets `archs` ask for: "9.0a" -> sm_90a, "10.0f" -> sm_100f, "8.0" -> sm_80."""
    try:
        return frozenset(Arch.parse(a).sm for a in archs)
    except ValueError as exc:
        raise CheckError(str(exc)) from None


def _expected_version(version: str, local_version: str) -> Version:
    text = f"{version}+{local_version}" if local_version else version
    try:
        return Version(text)
    except InvalidVersion:
        raise CheckError(f"job version {text!r} is not a PEP 440 version") from None


def _check_contents(
    archive: zipfile.ZipFile,
    *,
    name: str,
    file_version: Version | None,
    torch_requirement: Requirement,
    tags: set[str],
    expected: frozenset[str],
    host_only: tuple[str, ...],
) -> list[str]:
    problems: list[str] = []
    names = archive.namelist()
    dist_infos = _dist_info_dirs(names)
    if len(dist_infos) != 1:
        return [f"zip: expected one .dist-info directory, found {', '.join(dist_infos) or 'none'}"]
    dist_info = dist_infos[0]
    stem = dist_info.removesuffix(".dist-info")
    dir_name, _, dir_version = stem.partition("-")
    if canonicalize_name(dir_name) != canonicalize_name(name):
        problems.append(f"{dist_info}: project {dir_name} is not {name}")
    if file_version is not None and not _same_version(dir_version, file_version):
        problems.append(f"{dist_info}: version {dir_version} is not the filename's {file_version}")

    problems += _check_metadata(archive, f"{dist_info}/METADATA", name, file_version, torch_requirement)
    problems += _check_wheel_file(archive, f"{dist_info}/WHEEL", tags)
    problems += archive_problems(archive)
    problems += _check_extensions(archive, expected, host_only)
    problems += [
        f"{member}: a vendored copy of a library torch provides at runtime "
        "(exclude it from auditwheel repair)"
        for member in vendored_torch_libraries(names)
    ]
    return problems


def _same_version(text: str, version: Version) -> bool:
    try:
        return Version(text) == version
    except InvalidVersion:
        return False


def _check_metadata(
    archive: zipfile.ZipFile, path: str, name: str, file_version: Version | None, pin: Requirement
) -> list[str]:
    try:
        text = archive.read(path).decode("utf-8")
    except KeyError:
        return [f"{path}: missing"]
    except UnicodeDecodeError:
        return [f"{path}: not UTF-8"]
    problems: list[str] = []
    raw, _unparsed = parse_email(text)
    meta_name = raw.get("name")
    meta_version = raw.get("version")
    if meta_name is None or canonicalize_name(meta_name) != canonicalize_name(name):
        problems.append(f"METADATA: Name {meta_name!r} is not {name!r}")
    if meta_version is None:
        problems.append("METADATA: no Version")
    elif file_version is not None and not _same_version(meta_version, file_version):
        problems.append(f"METADATA: Version {meta_version} is not the filename's {file_version}")
    found = torch_requirements(text)
    if [str(r) for r in found] != [str(pin)]:
        shown = ", ".join(repr(str(r)) for r in found) or "none"
        problems.append(f"METADATA: torch requirement is {shown}, expected exactly '{pin}'")
    return problems


def _check_wheel_file(archive: zipfile.ZipFile, path: str, tags: set[str]) -> list[str]:
    try:
        text = archive.read(path).decode("utf-8")
    except KeyError:
        return [f"{path}: missing"]
    except UnicodeDecodeError:
        return [f"{path}: not UTF-8"]
    headers, _ = _split_headers(text)
    values: dict[str, list[str]] = {}
    for header in headers:
        key, _, value = header.partition(":")
        values.setdefault(key.strip().lower(), []).append(value.strip())
    problems: list[str] = []
    if values.get("root-is-purelib", ["false"])[0].lower() != "false":
        problems.append("WHEEL: Root-Is-Purelib is true for a wheel with extension modules")
    wheel_tags = set(values.get("tag", []))
    if tags and wheel_tags != tags:
        problems.append(
            f"WHEEL: Tag {', '.join(sorted(wheel_tags)) or 'none'} does not match the filename's "
            f"{', '.join(sorted(tags))}"
        )
    return problems


def is_extension_module(member: str) -> bool:
    """Python extension modules end in .so; versioned vendored libraries (libfoo.so.1) are not modules."""
    return member.endswith(".so") and not member.split("/", 1)[0].endswith(".dist-info")


def library_glob_matches(member: str, pattern: str) -> bool:
    """Whether the wheel member matches the pattern segment by segment (`*` never crosses a '/')."""
    parts, globs = member.split("/"), pattern.split("/")
    return len(parts) == len(globs) and all(fnmatchcase(p, g) for p, g in zip(parts, globs, strict=True))


def stable_abi_problems(archive: zipfile.ZipFile) -> list[str]:
    """One line per extension module of a stable-ABI wheel that uses torch's C++ ABI, naming its first
    offending symbol (`stable_abi.module_problem`)."""
    problems: list[str] = []
    for info in archive.infolist():
        if info.is_dir() or not is_extension_module(info.filename):
            continue
        with archive.open(info) as fh:
            problem = stable_abi_module_problem(info.filename, fh)
        if problem is not None:
            problems.append(problem)
    return problems


def machine_problems(archive: zipfile.ZipFile, machine: str) -> list[str]:
    """An extension module built for another machine than the wheel's platform (its ELF header's e_machine),
    one line each: an emulated or cross build that took the wrong compiler is refused, not published under a
    tag pip would install it by."""
    target = by_name(machine)
    if target is None:
        return []
    problems = []
    for info in archive.infolist():
        if info.is_dir() or not is_extension_module(info.filename):
            continue
        with archive.open(info) as member:
            header = member.read(20)
        if len(header) < 20 or header[:4] != b"\x7fELF":
            continue  # the device code's check names a module that is no ELF file
        found = int.from_bytes(header[18:20], "little")
        if found != target.elf_machine:
            named = next((p.name for p in PLATFORMS if p.elf_machine == found), f"ELF machine {found}")
            problems.append(f"{info.filename}: built for {named}, not for the wheel's {target.name}")
    return problems


def device_code_problems(
    archive: zipfile.ZipFile, archs: Sequence[str], *, host_only: Sequence[str] = ()
) -> list[str]:
    """Every extension module's cubins against exactly the targets of `archs` ("8.0", "9.0a"), as the wheel
    check reads them (`_check_extensions`): what `factory index audit` holds a published wheel's label to."""
    return _check_extensions(archive, _cubin_targets(archs), tuple(host_only))


def _check_extensions(
    archive: zipfile.ZipFile, expected: frozenset[str], host_only: tuple[str, ...] = ()
) -> list[str]:
    """Every module's cubins against the exact targets `expected` ("sm_90a"); PTX is neither needed nor
    counted against a module, since a driver JITs it only where no cubin runs."""
    modules = [i for i in archive.infolist() if not i.is_dir() and is_extension_module(i.filename)]
    if not modules:
        return ["wheel: no extension module (.so) found"]
    problems: list[str] = []
    with_device_code = 0
    with tempfile.TemporaryDirectory(prefix="factory-wheelcheck-") as scratch:
        for info in modules:
            target = Path(scratch) / "module.so"
            with archive.open(info) as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst, _COPY_CHUNK)
            try:
                code = read_device_code(target)
            except CheckError as exc:
                problems.append(f"{info.filename}: {str(exc).removeprefix(str(target) + ': ')}")
                continue
            found = code.cubin_targets
            if found or code.ptx_targets:
                with_device_code += 1
            elif any(library_glob_matches(info.filename, g) for g in host_only):
                continue  # the recipe says this module is host code only (PyG's _version_cuda.so)
            if not found:
                ptx = f" (PTX only: {_format_targets(code.ptx_targets)})" if code.ptx_targets else ""
                problems.append(f"{info.filename}: no cubins{ptx}, expected {_format_targets(expected)}")
            elif found != expected:
                detail = []
                if expected - found:
                    detail.append(f"missing {_format_targets(expected - found)}")
                if found - expected:
                    detail.append(f"unexpected {_format_targets(found - expected)}")
                problems.append(
                    f"{info.filename}: cubins for {_format_targets(found)}, "
                    f"expected {_format_targets(expected)} ({'; '.join(detail)})"
                )
    if not problems and not with_device_code:
        problems.append("wheel: no extension module with device code (all are host-only)")
    return problems
