"""`factory verify --rebuild`: build a wheel again from its own provenance and compare the two, byte by byte.

A wheel's provenance (`provenance`, `<dist-info>/factory-provenance.json`) holds a `rebuild` section: the
job's id and a one-job matrix document that builds it again. This writes that document into a work
directory (with a path source's directory beside it, as the document names it: `--source`), builds the job
there through the library `factory build` uses, and compares the rebuilt wheel with the given one
(`wheeldiff`): the first member that differs is named, and inside an extension module the ELF section.

Builds are reproducible (`reproducible`), so a difference means the wheel is not what its provenance says:
changed after it was built, or built by a runner, image or compile cache that made something else. With
`--cache` the rebuild takes its objects from a compile cache (this home's, or a store's): a cache a team no
longer trusts is checked by rebuilding a wheel it trusts from it.
"""

from __future__ import annotations

import contextlib
import glob
import json
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from factory import provenance, wheeldiff, wheelprov
from factory.errors import BuildError, ConfigError

Log = Callable[[str], None]
CACHE_LOCAL = "local"  # --cache local: this home's compile cache alone
MATRIX_NAME = "rebuild.yaml"  # JSON, which the matrix reader reads as YAML


@dataclass(frozen=True, kw_only=True)
class RebuildOptions:
    """How to rebuild: `cache` "off" (the default), "local", or a store (a directory or s3:// URL);
    `source`: the directory of a path source; `workdir`: where the rebuild happens and stays (else a
    temporary directory, removed)."""

    cache: str = "off"
    source: Path | None = None
    workdir: Path | None = None


@dataclass(frozen=True, kw_only=True)
class RebuildResult:
    wheel: str  # the given wheel's file name
    job_id: str
    sha256: str
    rebuilt: str | None  # the rebuilt wheel's path (gone with a temporary work directory)
    rebuilt_sha256: str | None
    difference: wheeldiff.Difference | None
    failure: str | None = None  # why the rebuild made no wheel

    @property
    def ok(self) -> bool:
        return self.failure is None and self.difference is None

    def line(self) -> str:
        if self.failure is not None:
            return f"{self.wheel}: the rebuild of {self.job_id} failed: {self.failure}"
        if self.difference is None:
            return f"{self.wheel}: rebuilt bit for bit (sha256 {self.sha256})"
        return f"{self.wheel}: the rebuild differs: {self.difference.line()}"

    def to_json(self) -> dict[str, Any]:
        return {
            "wheel": self.wheel,
            "job": self.job_id,
            "ok": self.ok,
            "sha256": self.sha256,
            "rebuilt_sha256": self.rebuilt_sha256,
            "difference": None
            if self.difference is None
            else {"member": self.difference.member, "what": self.difference.what},
            "failure": self.failure,
        }


# --- the document ----------------------------------------------------------------------------------------


def rebuild_section(document: Mapping[str, Any], wheel: str) -> tuple[str, dict[str, Any]]:
    """The job id and matrix document of a parsed provenance's `rebuild` section."""
    section = document.get("rebuild")
    if not isinstance(section, Mapping):
        raise ConfigError(f"{wheel}: its provenance has no rebuild section")
    job, matrix = section.get("job"), section.get("matrix")
    if not isinstance(job, str) or not job or not isinstance(matrix, Mapping):
        raise ConfigError(f"{wheel}: its provenance's rebuild section names no job and matrix")
    return job, json.loads(json.dumps(matrix))  # a plain, mutable copy


def path_source(matrix: Mapping[str, Any]) -> PurePosixPath | None:
    """The directory a path source's document names, relative to the document; None for another source.
    A name that would leave the work directory is refused."""
    source = matrix.get("package", {}).get("source") if isinstance(matrix.get("package"), Mapping) else None
    if not isinstance(source, Mapping) or "path" not in source:
        return None
    name = source["path"]
    rel = PurePosixPath(str(name))
    if not str(name) or rel.is_absolute() or ".." in rel.parts or str(rel) == ".":
        raise ConfigError(f"the rebuild's source path {name!r} is not a directory name beside its document")
    return rel


def with_cache(matrix: dict[str, Any], cache: str) -> tuple[dict[str, Any], str | None]:
    """The document and `factory build`'s --cache for the rebuild's cache: "local" turns the document's
    build.cache on (this home's cache alone), "off" or a store is --cache's."""
    if cache != CACHE_LOCAL:
        return matrix, cache
    build = dict(matrix.get("build") or {})
    build["cache"] = True
    return {**matrix, "build": build}, None


def write_workdir(
    workdir: Path, matrix: Mapping[str, Any], *, source: Path | None, source_name: PurePosixPath | None
) -> Path:
    """The rebuild's matrix file in `workdir`, and a path source's directory beside it: a link to `source`,
    so that the build copies the same tree and its compiles are in the compile cache's domain of that
    directory (`cache.trust_domain`: a path source's is its real path)."""
    workdir.mkdir(parents=True, exist_ok=True)
    if source_name is not None:
        if source is None:
            raise ConfigError(
                f"the wheel was built from a source directory ({source_name}): give it with --source DIR"
            )
        if not source.is_dir():
            raise ConfigError(f"--source {source}: not a directory")
        target = workdir / source_name
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():
            target.unlink()
        if target.exists():
            raise ConfigError(f"--workdir {workdir}: {source_name} is there already and is no link")
        target.symlink_to(source.resolve(), target_is_directory=True)
    path = workdir / MATRIX_NAME
    path.write_text(json.dumps(matrix, indent=2, sort_keys=True) + "\n")
    return path


# --- the rebuild ------------------------------------------------------------------------------------------


def build_job(matrix: Path, job_id: str, output: Path, *, cache: str | None, log: Log) -> Path:
    """Build the one job of `matrix` into `output` as `factory build --only JOB` does; its wheel, or a
    BuildError naming why there is none."""
    from factory.buildplan import BuildRequest, plan_build, run_planned

    # trusted paths: the one path outside the work directory is the link to the --source DIR it was given
    request = BuildRequest(
        matrix=matrix, trust_paths=True, output=output, only=glob.escape(job_id), cache=cache
    )
    planned = plan_build(request, warn=lambda line: log(f"warning: {line}"))
    if [job.id for job in planned.jobs] != [job_id]:
        raise BuildError(f"the rebuild's document plans {[j.id for j in planned.jobs]}, not {job_id}")
    outcome = run_planned(
        planned,
        on_change=lambda _result: None,
        log=log,
        showing=contextlib.nullcontext,
        finished=lambda _report: None,
    )
    jobs = outcome.report.jobs if outcome.report is not None else []
    if len(jobs) != 1 or jobs[0].result != "ok" or not jobs[0].wheel:
        reason = jobs[0].reason if jobs and jobs[0].reason else "no wheel"
        raise BuildError(reason)
    return output / jobs[0].wheel


def explain(difference: wheeldiff.Difference, given: Path, rebuilt: Path) -> wheeldiff.Difference:
    """A difference in the provenance file named down to its first differing field."""
    member = difference.member
    if member is None or not member.endswith(f".dist-info/{provenance.FILE_NAME}"):
        return difference
    try:
        with zipfile.ZipFile(given) as za, zipfile.ZipFile(rebuilt) as zb:
            limit = provenance.MAX_BYTES
            docs = [json.loads(z.read(member)) for z in (za, zb) if z.getinfo(member).file_size < limit]
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return difference
    field = provenance.first_difference(docs[0], docs[1]) if len(docs) == 2 else None
    return difference if field is None else wheeldiff.Difference(member=member, what=f"{field} differs")


@contextlib.contextmanager
def _workdir(chosen: Path | None) -> Iterator[Path]:
    if chosen is not None:
        yield chosen
        return
    with tempfile.TemporaryDirectory(prefix="factory-rebuild-") as tmp:
        yield Path(tmp)


def verify_rebuild(wheel_or_url: str, options: RebuildOptions, *, log: Log) -> RebuildResult:
    """Rebuild a wheel (a file or an http(s) URL) from its provenance and compare the two. ConfigError (exit
    2) for a wheel without a usable rebuild section or a missing --source; a rebuild that makes no wheel is
    a result with its `failure`, as is a difference."""
    with wheelprov._local(wheel_or_url) as given:
        found = wheelprov.read(given)
        job_id, matrix = rebuild_section(found.provenance, given.name)
        source_name = path_source(matrix)
        matrix, cache = with_cache(matrix, options.cache)
        sha = wheeldiff.file_sha256(given)
        with _workdir(options.workdir) as work:
            document = write_workdir(work, matrix, source=options.source, source_name=source_name)
            output = work / "out"
            log(f"rebuilding {job_id} from {given.name}'s provenance in {work}")
            try:
                rebuilt = build_job(document, job_id, output, cache=cache, log=log)
            except BuildError as exc:
                return RebuildResult(
                    wheel=given.name, job_id=job_id, sha256=sha, rebuilt=None, rebuilt_sha256=None,
                    difference=None, failure=str(exc),
                )  # fmt: skip
            difference = wheeldiff.compare_wheels(given, rebuilt)
            if difference is not None:
                difference = explain(difference, given, rebuilt)
            return RebuildResult(
                wheel=given.name, job_id=job_id, sha256=sha, rebuilt=str(rebuilt),
                rebuilt_sha256=wheeldiff.file_sha256(rebuilt), difference=difference,
            )  # fmt: skip
