"""A wheel's provenance and SBOM as files in its .dist-info: made for a job, read back, checked, shown.

`files` gives what acceptance adds to the wheel (in the rewrite that pins its torch, so RECORD lists them);
`wheel_problems` is the wheel check's part: the provenance present, of its format, agreeing with the job's,
and the SBOM a CycloneDX document its library accepts; `inspect` is `factory inspect`'s library call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
import tempfile
import urllib.error
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlsplit

from factory.core import bounded
from factory.core.errors import CheckError, ConfigError, FactoryError
from factory.core.urls import printable, without_credentials
from factory.wheel import provenance, sbom
from factory.wheel import record as buildrecord

MAX_DOWNLOAD = 16 << 30  # a wheel `factory inspect` fetches
DOWNLOAD_DEADLINE_S = bounded.WHEEL_DEADLINE_S  # docs/PUBLISH.md: "within ten minutes"
RECORD_DEADLINE_S = 60.0  # the build record beside it, 64 KiB at most


def files(facts: provenance.BuildFacts, needed: Mapping[str, Any]) -> dict[str, bytes]:
    """The files the wheel of `facts` carries in its .dist-info (relative paths -> bytes)."""
    return {
        provenance.FILE_NAME: provenance.dumps(provenance.compose(facts)),
        facts.sbom: sbom.compose(facts, needed),
    }


@dataclass(frozen=True, kw_only=True)
class Found:
    """A wheel's provenance (parsed and checked) and its SBOM's summary."""

    wheel: str
    provenance: dict[str, Any]
    sbom_path: str
    sbom: sbom.Summary
    # the build record beside the wheel (`factory inspect` alone looks for one), or why it is not shown
    record: buildrecord.BuildRecord | None = None
    record_problem: str | None = None


def _dist_info(archive: zipfile.ZipFile, wheel: str) -> str:
    tops = {n.split("/", 1)[0] for n in archive.namelist()}
    dirs = sorted(t for t in tops if t.endswith(".dist-info"))
    if len(dirs) != 1:
        raise CheckError(f"{wheel}: expected one .dist-info directory, found {len(dirs)}")
    return dirs[0]


def _member(archive: zipfile.ZipFile, name: str, limit: int, wheel: str) -> bytes:
    try:
        return bounded.read_member(archive, name, max_bytes=limit)
    except KeyError:
        raise CheckError(f"{wheel}: has no {name}") from None
    except bounded.Refused as exc:
        raise CheckError(f"{wheel}: {exc}") from None
    except bounded.BadMember as exc:
        raise CheckError(f"{wheel}: {name} cannot be read ({exc})") from None


def read(wheel: Path) -> Found:
    """The provenance and SBOM a wheel carries; whatever is missing, too large or malformed is a CheckError
    of one line naming the wheel and the file."""
    return _read(wheel)[0]


def _read(wheel: Path) -> tuple[Found, bytes]:
    """`read`, and the SBOM's bytes as they are in the archive."""
    name = wheel.name
    try:
        archive = bounded.open_zip(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise CheckError(f"{name}: cannot be opened as a zip ({exc})") from None
    with archive:
        dist_info = _dist_info(archive, name)
        path = f"{dist_info}/{provenance.FILE_NAME}"
        data = _member(archive, path, provenance.MAX_BYTES, name)
        document = provenance.parse(data, where=f"{name}: {path}")
        rel = document["wheel"]["sbom"]
        parts = PurePosixPath(rel).parts
        if not rel or rel.startswith("/") or ".." in parts or not rel.startswith(f"{provenance.SBOM_DIR}/"):
            raise CheckError(f"{name}: {path}: wheel.sbom {rel!r} is not a file under {provenance.SBOM_DIR}/")
        sbom_path = f"{dist_info}/{rel}"
        sbom_data = _member(archive, sbom_path, sbom.MAX_BYTES, name)
        summary = sbom.parse(sbom_data, where=f"{name}: {sbom_path}")
    return Found(wheel=name, provenance=document, sbom_path=sbom_path, sbom=summary), sbom_data


def _raw_provenance(wheel: Path) -> tuple[str, bytes] | None:
    try:
        with bounded.open_zip(wheel) as archive:
            path = f"{_dist_info(archive, wheel.name)}/{provenance.FILE_NAME}"
            return path, _member(archive, path, provenance.MAX_BYTES, wheel.name)
    except (CheckError, OSError, zipfile.BadZipFile):
        return None


def provenance_bytes(wheel: Path) -> bytes | None:
    """The wheel's provenance file as it is in the archive, when it is a valid one (published beside the
    wheel); None when the wheel has none or it cannot be read or parsed (the wheel check says why)."""
    found = _raw_provenance(wheel)
    if found is None:
        return None
    path, data = found
    try:
        provenance.parse(data, where=f"{wheel.name}: {path}")
    except CheckError:
        return None
    return data


def sbom_bytes(wheel: Path) -> bytes | None:
    """The wheel's SBOM file (the one its valid provenance names) as it is in the archive, when it is a valid
    CycloneDX document (published beside the wheel); None when it has none or either cannot be read or
    parsed (the wheel check says why)."""
    try:
        return _read(wheel)[1]
    except CheckError:
        return None


def provenance_sha256(wheel: Path) -> str | None:
    """The sha256 of the wheel's provenance file as it is in the archive (what a build record names);
    None when the wheel has none or it cannot be read (the wheel check says why)."""
    found = _raw_provenance(wheel)
    return None if found is None else hashlib.sha256(found[1]).hexdigest()


def wheel_problems(wheel: Path, expected: Mapping[str, Any]) -> list[str]:
    """The wheel check's part: one line per way the wheel's provenance or SBOM fails the job (`expected`:
    the job's provenance document); [] when both are there, well formed and the provenance is the job's."""
    try:
        found = read(wheel)
    except CheckError as exc:
        return [str(exc).removeprefix(f"{wheel.name}: ")]
    return provenance.mismatches(found.provenance, expected)


# --- factory inspect ----------------------------------------------------------------------------------------


def _http_error(exc: urllib.error.HTTPError) -> str:
    """An HTTP error as one line; a redirect names where it pointed, which is not followed."""
    if 300 <= exc.code < 400:
        location = exc.headers.get("Location", "") if exc.headers else ""
        return (
            f"HTTP {exc.code}: a redirect to {printable(without_credentials(location))[:200]}, not followed"
        )
    return f"HTTP {exc.code}"


@contextmanager
def _local(wheel_or_url: str) -> Iterator[Path]:
    """The wheel as a local file: a path as it is, an http(s) URL downloaded (bounded in size and time)
    into a temporary directory removed afterwards."""
    scheme = urlsplit(wheel_or_url).scheme
    if scheme not in ("http", "https"):
        path = Path(wheel_or_url)
        if not path.is_file():
            raise ConfigError(f"{wheel_or_url}: no such wheel file")
        yield path
        return
    name = PurePosixPath(unquote(urlsplit(wheel_or_url).path)).name
    if not name.endswith(".whl") or "/" in name or not name.isprintable():
        raise ConfigError(f"{without_credentials(wheel_or_url)}: does not name a .whl file")
    shown = without_credentials(wheel_or_url)
    with tempfile.TemporaryDirectory(prefix="factory-inspect-") as tmp:
        target = Path(tmp) / name
        try:
            # at most MAX_DOWNLOAD within DOWNLOAD_DEADLINE_S in all, however the server paces it
            with (
                bounded.open_url(
                    bounded.request(wheel_or_url),
                    seconds=DOWNLOAD_DEADLINE_S,
                    max_bytes=MAX_DOWNLOAD,
                    shown=shown,
                    follow_redirects=False,
                ) as resp,
                target.open("wb") as out,
            ):
                while block := resp.read(1 << 20):
                    out.write(block)
        except bounded.Refused as exc:
            raise FactoryError(str(exc)) from None
        except urllib.error.HTTPError as exc:
            raise FactoryError(f"{shown}: {_http_error(exc)}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise FactoryError(f"{shown}: {getattr(exc, 'reason', exc)}") from None
        yield target


def _record_bytes(wheel_or_url: str, local: Path) -> bytes | None:
    """The build record beside the wheel: the file `<wheel>.build.json` next to a local wheel (a regular
    file, never a link followed), or that URL next to a wheel's URL; None where there is none. Bounded."""
    limit = buildrecord.MAX_BYTES
    parts = urlsplit(wheel_or_url)
    if parts.scheme not in ("http", "https"):
        beside = local.with_name(local.name + buildrecord.SUFFIX)
        try:
            fd = os.open(beside, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as exc:  # a link (ELOOP), unreadable
            raise CheckError(f"cannot be read ({exc.strerror})") from None
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise CheckError("is not a regular file")
            return fh.read(limit + 1)
    url = parts._replace(path=parts.path + buildrecord.SUFFIX).geturl()
    shown = without_credentials(url)
    try:
        with bounded.open_url(
            bounded.request(url),
            seconds=RECORD_DEADLINE_S,
            max_bytes=limit + 1,
            shown=shown,
            follow_redirects=False,
        ) as resp:
            return resp.read_all()
    except bounded.Refused as exc:
        raise CheckError(str(exc).removeprefix(f"{shown}: ")) from None
    except urllib.error.HTTPError as exc:
        if exc.code in (403, 404):  # S3 answers 403 for a missing key without list permission
            return None
        raise CheckError(_http_error(exc)) from None
    except (urllib.error.URLError, OSError) as exc:
        raise CheckError(str(getattr(exc, "reason", exc))) from None


def _with_record(found: Found, wheel_or_url: str, local: Path) -> Found:
    """`found` with the build record beside the wheel, checked to name this wheel and its provenance; a
    record that is malformed or names another wheel is not shown, and why is (it is informational)."""
    where = f"{found.wheel}{buildrecord.SUFFIX}"
    try:
        data = _record_bytes(wheel_or_url, local)
        if data is None:
            return found
        record = buildrecord.parse(data, where=where)
    except CheckError as exc:
        problem = str(exc) if str(exc).startswith(where) else f"{where}: {exc}"
        return dataclasses.replace(found, record_problem=problem)
    digest = hashlib.sha256()
    with local.open("rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    if record.sha256 != digest.hexdigest():
        return dataclasses.replace(found, record_problem=f"{where}: names another wheel (its sha256 differs)")
    if record.provenance_sha256 not in (None, provenance_sha256(local)):
        return dataclasses.replace(found, record_problem=f"{where}: names another provenance file")
    return dataclasses.replace(found, record=record)


def inspect(wheel_or_url: str) -> Found:
    """`factory inspect`: a wheel's provenance and SBOM, from a file or an http(s) URL, and the build
    record beside it when there is one."""
    with _local(wheel_or_url) as path:
        return _with_record(read(path), wheel_or_url, path)


def describe(found: Found) -> list[str]:
    """What `factory inspect` prints for a person, one fact a line."""
    p = found.provenance
    job, src, variant = p["job"], p["source"], p["job"]["variant"]
    lines = [
        f"wheel       {found.wheel}",
        f"built by    wheel-factory {p['factory']['version']}, job {job['id']}",
    ]
    if src["kind"] == "pypi":
        lines.append(f"source      sdist {src['sdist']['filename']} sha256:{src['sdist']['sha256']}")
    elif src["kind"] == "git":
        git = src["git"]
        lines.append(f"source      git {git['url']} {git['ref']} commit {git['commit'] or 'unknown'}")
    else:
        lines.append(f"source      directory {src['path']['name']} tree sha256:{src['path']['tree_sha256']}")
    lines += [f"patch       {x['name']} sha256:{x['sha256']}" for x in src["patches"]]
    recipe = p["recipe"]
    lines.append(
        f"recipe      {recipe['name']} ({recipe['origin']}, factory {recipe['factory_version']}) "
        f"sha256:{recipe['sha256']}"
    )
    lines.append(
        f"variant     CUDA {variant['cuda']}, torch {variant['torch']}, "
        f"archs {';'.join(variant['archs'])}, cxx11_abi {variant['cxx11_abi']}"
    )
    tc = p["toolchain"]
    nvcc, cxx = tc["nvcc"] or "?", tc["cxx"] or "c++ ?"
    lines.append(f"toolchain   toolkit {tc['toolkit'] or '?'} (nvcc {nvcc}), {cxx}, Python {tc['python']}")
    lines.append(f"torch       {p['torch']['version']}")
    image = p["image"]
    lines.append("image       " + ", ".join(f"{k}={v}" for k, v in sorted(image.items())))
    if job["cxx_std"]:
        lines.append(f"C++         {job['cxx_std']}")
    lines += [f"env         {k}={v}" for k, v in sorted(job["env"].items())]
    lines += [f"requires    {r['filename']} sha256:{r['sha256']}" for r in p["build_requirements"]]
    needs = "; ".join(p["rebuild"]["needs"]) or "nothing else"
    lines.append(f"rebuild     job {p['rebuild']['job']} (needs: {needs})")
    s = found.sbom
    count = len(s.components)
    lines.append(f"sbom        {found.sbom_path}: CycloneDX {s.spec}, {count} components, {s.serial}")
    lines += [f"  {kind:<11} {name} {version}".rstrip() for kind, name, version in s.components]
    if found.record is not None:
        lines.append("build record (beside the wheel, informational: not signed)")
        lines += [f"  {line}" for line in buildrecord.describe(found.record)]
    elif found.record_problem is not None:
        lines.append(f"build record not shown: {found.record_problem}")
    return [printable(line) for line in lines]  # the wheel's text, shown on a terminal


def to_json(found: Found) -> dict[str, Any]:
    """What `factory inspect --json` prints."""
    s = found.sbom
    return {
        "wheel": found.wheel,
        "provenance": found.provenance,
        "sbom": {
            "path": found.sbom_path,
            "spec": s.spec,
            "serial": s.serial,
            "subject": s.subject,
            "components": [{"type": t, "name": n, "version": v} for t, n, v in s.components],
        },
        "build_record": buildrecord.compose(found.record) if found.record is not None else None,
        "build_record_problem": found.record_problem,
    }
