"""`factory rebuild` (or `factory verify --rebuild`, its older spelling): build a wheel again from its own
provenance and compare the two, byte by byte.

A wheel's provenance (`provenance`, `<dist-info>/factory-provenance.json`) holds a `rebuild` section: the
job's id and a one-job matrix document that builds it again (`buildfacts.rebuild_matrix` writes it). This
builds the job from that document in a work directory, through the library `factory build` uses (its
progress shown as `factory build` shows it), and compares the rebuilt wheel with the given one (`wheeldiff`):
the first member that differs is named, and inside an extension module the ELF section. A rebuild whose
wheel fails its checks (no GPU for the install check, say) is still compared: both results are reported.

The wheel is the attacker: it may come from anywhere, and its document is read as untrusted input
(`plan_rebuild`), never as the user's own matrix file. It may hold only the keys the factory writes there
(`provenance.rebuild_matrix_problem`), each value then checked by the matrix loader as a user's would be;
the build's network stays off (the document cannot name it); the source is the recorded one, by hash (the
sdist's sha256, the git commit over a remote transport) or the directory the user gives with `--source`;
each patch is the wheel's own file by its sha256, taken from the user's matrix file (`--matrix`) or the
work directory, never a path the document names; and a builder image, base image or torch index that the
user's configuration does not name is shown and refused unless `--allow-foreign` names its kind.

Builds are reproducible (`reproducible`), so a difference means the wheel is not what its provenance says:
changed after it was built, or built by a runner, image or compile cache that made something else. With
`--cache` the rebuild takes its objects from a compile cache (this home's, or a store's): a cache a team no
longer trusts is checked by rebuilding a wheel it trusts from it.
"""

from __future__ import annotations

import contextlib
import glob
import json
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from factory.core import bounded
from factory.core.errors import BuildError, ConfigError
from factory.core.urls import without_credentials
from factory.core.validate import REMOTE_GIT_TRANSPORTS, git_url_problem, shown_name
from factory.spec.options import PYTORCH_INDEX
from factory.wheel import embedded, provenance, wheeldiff

if TYPE_CHECKING:
    from factory.build.report import BuildReport, JobResult
    from factory.spec.config import MatrixFile

Log = Callable[[str], None]
CACHE_LOCAL = "local"  # --cache local: this home's compile cache alone
MATRIX_NAME = "rebuild.yaml"  # JSON, which the matrix reader reads as YAML
PATCH_DIR = "patches"  # beside the document: the recipe's patches, as `buildfacts.recipe_document` names them
# --allow-foreign KIND: what a rebuild document may name that the user's own configuration does not
FOREIGN_IMAGE = "image"  # a builder image (build.images) or base image (build.base_image)
FOREIGN_TORCH_INDEX = "torch-index"  # an index torch is fetched from (build.torch_index)
FOREIGN_KINDS = (FOREIGN_IMAGE, FOREIGN_TORCH_INDEX)
# A directory or patch name the document gives: one path component, no "~" (expanded to a home), no leading
# dot (".", "..") or dash.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")
_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # a git commit's full hash (SHA-1 or SHA-256)
_ONE_VALUE_AXES = ("cuda", "torch", "cxx11_abi", "arch")


@dataclass(frozen=True, kw_only=True)
class RebuildOptions:
    """How to rebuild: `cache` "off" (the default), "local", or a store (a directory or s3:// URL);
    `source`: the directory of a path source; `matrix`: the user's own matrix file, whose patches (by
    sha256), images and torch indexes the rebuild may use (`trust_paths` as `factory build --trust-paths`
    reads it); `workdir`: where the rebuild happens and stays (else a temporary directory, removed);
    `allow_foreign`: the kinds (`FOREIGN_KINDS`) of what only the wheel names that the rebuild may use."""

    cache: str = "off"
    source: Path | None = None
    matrix: Path | None = None
    trust_paths: bool = False
    workdir: Path | None = None
    allow_foreign: frozenset[str] = frozenset()


@dataclass(frozen=True, kw_only=True)
class RebuildResult:
    wheel: str  # the given wheel's file name
    job_id: str
    sha256: str
    rebuilt: str | None  # the rebuilt wheel's path (gone with a temporary work directory)
    rebuilt_sha256: str | None
    difference: wheeldiff.Difference | None
    # why the rebuild made no wheel, or why the wheel it made failed its checks (then `rebuilt` is that
    # wheel, kept, and compared all the same)
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None and self.difference is None

    @property
    def identical(self) -> bool | None:
        """Whether the wheel the rebuild made is the given one, byte for byte; None when it made none."""
        return None if self.rebuilt_sha256 is None else self.difference is None

    def _compared(self) -> str:
        if self.difference is None:
            return f"rebuilt bit for bit (sha256 {self.sha256})"
        return f"the rebuild differs: {self.difference.line()}"

    def line(self) -> str:
        if self.failure is None:
            return f"{self.wheel}: {self._compared()}"
        failed = f"{self.wheel}: the rebuild of {self.job_id} failed: {self.failure}"
        if self.rebuilt_sha256 is None:
            return failed
        return f"{failed}; the wheel it built, compared all the same: {self._compared()}"

    def to_json(self) -> dict[str, Any]:
        return {
            "wheel": self.wheel,
            "job": self.job_id,
            "ok": self.ok,
            "sha256": self.sha256,
            "rebuilt_sha256": self.rebuilt_sha256,
            "identical": self.identical,
            "difference": None
            if self.difference is None
            else {"member": self.difference.member, "what": self.difference.what},
            "failure": self.failure,
        }


# --- what the user's own configuration names -------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Trusted:
    """What the user's own matrix file (`--matrix`) names, which the wheel's document may name too: its
    patches by sha256, its builder and base images, its torch indexes and its source directory."""

    patches: Mapping[str, Path] = field(default_factory=dict)
    images: frozenset[str] = frozenset()
    torch_indexes: frozenset[str] = frozenset()
    source: Path | None = None
    display: str = ""  # "--matrix FILE", for messages; "" without one

    @classmethod
    def of(cls, mf: MatrixFile | None, display: str) -> Trusted:
        if mf is None:
            return cls()
        b = mf.build
        indexes = {url for url in b.torch_index.values() if url != "default"}
        return cls(
            patches={bounded.file_sha256(p): p for p in mf.recipe.patches},
            images=frozenset([*b.images.values(), *([b.base_image] if b.base_image else [])]),
            torch_indexes=frozenset(indexes),
            source=mf.package.source.path if mf.package.source.kind == "path" else None,
            display=display,
        )

    def names(self) -> str:
        """Who names what is not foreign, as a message says it."""
        if self.display:
            return f"your configuration ({self.display})"
        return "your configuration (no --matrix given)"


@dataclass(frozen=True, kw_only=True)
class Foreign:
    """Something the document names that the user's configuration does not: `kind` one of FOREIGN_KINDS."""

    kind: str
    what: str  # "builder image 'x' (build.images.13.0)"


@dataclass(frozen=True, kw_only=True)
class RebuildPlan:
    """A document checked as untrusted input (`plan_rebuild`): what may be built from it and with what."""

    job_id: str
    document: dict[str, Any]
    source_name: PurePosixPath | None  # a path source's directory, beside the document
    patches: tuple[tuple[str, str], ...]  # (name, sha256) of each file the document needs under patches/
    foreign: tuple[Foreign, ...]  # what only the wheel names, each of a kind --allow-foreign allowed


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
    """The directory a path source's document names, beside the document; None for another source. Only a
    plain directory name is one: a path (absolute, "..", "~", which the loader would expand to a home) is
    refused."""
    source = matrix.get("package", {}).get("source") if isinstance(matrix.get("package"), Mapping) else None
    if not isinstance(source, Mapping) or "path" not in source:
        return None
    name = source["path"]
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        shown = shown_name(str(name))
        raise ConfigError(f"the rebuild's source path {shown!r} is not a directory name beside its document")
    return PurePosixPath(name)


def plan_rebuild(
    document: Mapping[str, Any], wheel: str, *, trusted: Trusted, options: RebuildOptions
) -> RebuildPlan:
    """The rebuild a wheel's parsed provenance `document` asks for, checked as input from anyone: a
    ConfigError (exit 2) of one line naming the wheel and what it asked for that a rebuild does not do."""
    job, matrix = rebuild_section(document, wheel)

    def refuse(message: str) -> ConfigError:
        return ConfigError(f"{wheel}: {message}")

    problem = provenance.rebuild_matrix_problem(matrix)
    if problem:
        raise refuse(problem)
    if job != document["job"]["id"]:
        raise refuse(
            f"its rebuild section builds job {shown_name(job)!r}, its provenance is of job "
            f"{shown_name(document['job']['id'])!r}"
        )
    name, named = matrix["package"]["name"], document["wheel"]["name"]
    if name != named:
        raise refuse(
            f"its rebuild document's package.name {shown_name(name)!r} is not {shown_name(named)!r}, the "
            "package its provenance names"
        )
    _check_axes(matrix["matrix"], cuda=document["job"]["variant"]["cuda"], refuse=refuse)
    source_name = _source(matrix["package"], document["source"], options=options, refuse=refuse)
    patches = _patches(matrix["recipe"], document["source"]["patches"], refuse=refuse)
    foreign = _foreign(
        matrix["build"], trusted=trusted, cuda=document["job"]["variant"]["cuda"], refuse=refuse
    )
    refused = [f for f in foreign if f.kind not in options.allow_foreign]
    if refused:
        kinds = list(dict.fromkeys(f.kind for f in refused))
        flags = " ".join(f"--allow-foreign {k}" for k in kinds)
        raise refuse(
            f"its rebuild would use {'; '.join(f.what for f in refused)}, which {trusted.names()} does not "
            f"name; pass {flags} to use {'it' if len(refused) == 1 else 'them'}"
        )
    return RebuildPlan(
        job_id=job, document=matrix, source_name=source_name, patches=patches, foreign=tuple(foreign)
    )


def _check_axes(axes: Mapping[str, Any], *, cuda: str, refuse: Callable[[str], ConfigError]) -> None:
    """One job's axes, as the factory writes them: one value each (Pythons: those the job covers), an
    include entry only for the job's CUDA."""
    where = "its rebuild document's matrix"
    for axis in _ONE_VALUE_AXES:
        if len(axes[axis]) != 1:
            raise refuse(f"{where}.{axis} lists {len(axes[axis])} values, not the one of its job")
    if axes["cuda"] != [cuda]:
        raise refuse(f"{where}.cuda is not its job's CUDA {cuda}")
    include = axes.get("include", [])
    if len(include) > 1 or any(entry["cuda"] != cuda for entry in include):
        raise refuse(f"{where}.include has entries other than its job's environment")


def _source(
    package: Mapping[str, Any],
    recorded: Mapping[str, Any],
    *,
    options: RebuildOptions,
    refuse: Callable[[str], ConfigError],
) -> PurePosixPath | None:
    """The document's source, when it is the one the provenance records: the sdist by its sha256, the
    commit by its hash over a remote transport, or a directory by its name (`--source` gives it)."""
    source, kind = package["source"], recorded["kind"]
    wanted = "pypi" if source == "pypi" else "git" if "git" in source else "path"
    if wanted != kind:
        raise refuse(f"its rebuild document's source is {wanted}, its provenance records a {kind} source")
    if kind != "path" and options.source is not None:
        raise ConfigError(
            f"--source applies to a wheel built from a source directory; this one's source is {kind} "
            "(the rebuild takes it as its provenance records it)"
        )
    if kind == "pypi":
        sdist = recorded["sdist"]
        if package.get("sha256") != sdist["sha256"]:
            raise refuse(
                f"its rebuild document does not pin the recorded sdist {shown_name(sdist['filename'])!r} "
                f"(sha256 {sdist['sha256']}) by its sha256"
            )
        return None
    if kind == "git":
        url, ref, git = source["git"], source["ref"], recorded["git"]
        problem = git_url_problem(url, REMOTE_GIT_TRANSPORTS)
        if problem is not None:
            raise refuse(f"its rebuild document's git source {problem}")
        if url != git["url"]:
            raise refuse("its rebuild document's git repository is not the one its provenance records")
        commit = git["commit"]
        if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
            raise refuse(
                f"its provenance records no commit of {without_credentials(url)} to check out by hash"
            )
        if ref != commit:
            raise refuse(
                f"its rebuild document checks out {shown_name(ref)!r}, not the recorded commit {commit}"
            )
        return None
    try:
        name = path_source({"package": package})
    except ConfigError as exc:
        raise refuse(str(exc)) from None
    if name is None or str(name) != recorded["path"]["name"]:
        raise refuse("its rebuild document's source directory is not the one its provenance records")
    return name


def _patches(
    recipe: str | Mapping[str, Any],
    recorded: Sequence[Mapping[str, str]],
    *,
    refuse: Callable[[str], ConfigError],
) -> tuple[tuple[str, str], ...]:
    """The patches the document needs beside it: each the wheel's own file (its name under patches/ and the
    sha256 its provenance records), never a path. A built-in recipe's come with the factory."""
    if isinstance(recipe, str):
        return ()
    files = [(p["name"], p["sha256"]) for p in recorded]
    for item in recipe.get("patches", []):
        rel = PurePosixPath(item)
        if (
            len(rel.parts) != 2
            or rel.parts[0] != PATCH_DIR
            or not _NAME.fullmatch(rel.name)
            or item != str(rel)
        ):
            raise refuse(
                f"its rebuild document names the patch {shown_name(item)!r}, not a file of its own under "
                f"{PATCH_DIR}/ (a path of this host is never read)"
            )
    if list(recipe.get("patches", [])) != [f"{PATCH_DIR}/{name}" for name, _ in files]:
        raise refuse(
            "its rebuild document's patches are not the ones its provenance records (source.patches)"
        )
    seen: dict[str, str] = {}
    for name, sha in files:
        if seen.setdefault(name, sha) != sha:
            raise refuse(f"its provenance records two patches named {shown_name(name)!r} with other contents")
    return tuple(dict.fromkeys(files))


def _foreign(
    build: Mapping[str, Any], *, trusted: Trusted, cuda: str, refuse: Callable[[str], ConfigError]
) -> list[Foreign]:
    """What the document's build options name that the user's configuration does not: a builder or base
    image, a torch index (not the factory's default, not the host's pip configuration). A compile cache or
    a torch index on this host's disk is refused outright."""
    if build["cache"] is not False:
        raise refuse("its rebuild document turns a compile cache on (build.cache); a rebuild's is --cache's")
    for key in ("torch_index", "images"):
        other = [k for k in build.get(key, {}) if k != cuda]
        if other:
            raise refuse(f"its rebuild document's build.{key} names CUDA {shown_name(other[0])}, not {cuda}")
    found: list[Foreign] = []
    index = build.get("torch_index", {}).get(cuda)
    if index is not None and index != "default":
        where = f"build.torch_index.{cuda}"
        if urlsplit(index).scheme not in ("http", "https"):
            raise refuse(
                f"its rebuild document's torch index {shown_name(index)!r} ({where}) is not an http(s) URL "
                "(a path of this host is never read)"
            )
        default = PYTORCH_INDEX.format(tag=cuda.replace(".", ""))
        if index.rstrip("/") != default and index not in trusted.torch_indexes:
            shown = shown_name(without_credentials(index), 200)
            found.append(Foreign(kind=FOREIGN_TORCH_INDEX, what=f"torch index {shown} ({where})"))
    image = build.get("images", {}).get(cuda)
    if image is not None and image not in trusted.images:
        what = f"builder image {shown_name(image, 200)!r} (build.images.{cuda})"
        found.append(Foreign(kind=FOREIGN_IMAGE, what=what))
    base = build.get("base_image")
    if base is not None and base not in trusted.images:
        found.append(
            Foreign(kind=FOREIGN_IMAGE, what=f"base image {shown_name(base, 200)!r} (build.base_image)")
        )
    return found


def check_allowed(kinds: Sequence[str]) -> frozenset[str]:
    """--allow-foreign's values, each one of FOREIGN_KINDS."""
    for kind in kinds:
        if kind not in FOREIGN_KINDS:
            allowed = " or ".join(FOREIGN_KINDS)
            raise ConfigError(f"--allow-foreign {shown_name(kind)!r} must be {allowed}")
    return frozenset(kinds)


# --- the work directory ------------------------------------------------------------------------------------


def with_cache(matrix: dict[str, Any], cache: str) -> tuple[dict[str, Any], str | None]:
    """The document and `factory build`'s --cache for the rebuild's cache: "local" turns the document's
    build.cache on (this home's cache alone), "off" or a store is --cache's."""
    if cache != CACHE_LOCAL:
        return matrix, cache
    build = dict(matrix.get("build") or {})
    build["cache"] = True
    return {**matrix, "build": build}, None


def find_patches(
    patches: Sequence[tuple[str, str]], *, trusted: Trusted, workdir: Path | None, wheel: str
) -> dict[str, Path]:
    """Each patch the document needs, as a file of the user's with its sha256: one of the user's matrix
    file's patches, else the one already in the work directory's patches/; a ConfigError naming every
    file and sha256 that none has."""
    found: dict[str, Path] = {}
    missing: list[str] = []
    for name, sha in patches:
        beside = workdir / PATCH_DIR / name if workdir is not None else None
        candidates = [trusted.patches.get(sha), beside]
        match = next((c for c in candidates if c is not None and c.is_file() and _sha256(c) == sha), None)
        if match is None:
            missing.append(f"{name} (sha256 {sha})")
        else:
            found[name] = match
    if missing:
        where = f"no patch of {trusted.display} has it" if trusted.display else "no --matrix was given"
        there = f"{workdir / PATCH_DIR}/" if workdir is not None else "--workdir DIR's patches/"
        raise ConfigError(
            f"{wheel}: its rebuild needs the patch file {', '.join(missing)}; {where}: give the matrix file "
            f"whose recipe has it with --matrix, or put it in {there}"
        )
    return found


def _sha256(path: Path) -> str | None:
    try:
        return bounded.file_sha256(path)
    except OSError:
        return None


def copy_patches(workdir: Path, found: Mapping[str, Path], patches: Sequence[tuple[str, str]]) -> None:
    """The patches under `workdir`/patches/, each checked again against its sha256 once copied (a file that
    changed since it was found is refused)."""
    target_dir = workdir / PATCH_DIR
    target_dir.mkdir(parents=True, exist_ok=True)
    for name, sha in patches:
        target = target_dir / name
        if found[name] != target:
            target.unlink(missing_ok=True)
            shutil.copyfile(found[name], target)
        if _sha256(target) != sha:
            raise ConfigError(f"{found[name]}: changed while the rebuild copied it (its sha256 is not {sha})")


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


def _ignore(_value: object) -> None:
    return None


@dataclass(frozen=True, kw_only=True)
class Hooks:
    """How the rebuild's build shows itself: `factory build`'s display callbacks (`cli.progress.BuildDisplay`:
    `on_change`, `showing`, `finished`); by default it shows nothing."""

    on_change: Callable[[JobResult], None] = _ignore
    showing: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext
    finished: Callable[[BuildReport], None] = _ignore


@dataclass(frozen=True, kw_only=True)
class Built:
    """What a rebuild made: its wheel (accepted, or kept after failing a check), and why it failed."""

    wheel: Path
    failure: str | None = None


def build_job(
    matrix: Path,
    job_id: str,
    output: Path,
    *,
    cache: str | None,
    log: Log,
    trust_paths: bool = False,
    hooks: Hooks | None = None,
) -> Built:
    """Build the one job of `matrix` into `output` as `factory build --only JOB` does: its wheel, with why
    it failed its checks when it did, or a BuildError naming why there is none. `trust_paths` only for the
    one path outside the work directory, the link to a --source DIR."""
    from factory.build.request import BuildRequest, plan_build, run_planned

    hooks = hooks or Hooks()
    request = BuildRequest(
        matrix=matrix, trust_paths=trust_paths, output=output, only=glob.escape(job_id), cache=cache
    )
    planned = plan_build(request, warn=lambda line: log(f"warning: {line}"))
    if [job.id for job in planned.jobs] != [job_id]:
        raise BuildError(f"the rebuild's document plans {[j.id for j in planned.jobs]}, not {job_id}")
    if not planned.mf.build.offline:  # `plan_rebuild` lets no document say so; and never will it be
        raise ConfigError("the rebuild's document turns the build container's network on")
    outcome = run_planned(
        planned,
        on_change=hooks.on_change,
        log=log,
        showing=hooks.showing,
        finished=hooks.finished,
    )
    jobs = outcome.report.jobs if outcome.report is not None else []
    if len(jobs) == 1 and jobs[0].result == "ok" and jobs[0].wheel:
        return Built(wheel=output / jobs[0].wheel)
    reason = jobs[0].reason if jobs and jobs[0].reason else "no wheel"
    kept = Path(jobs[0].kept_wheel) if len(jobs) == 1 and jobs[0].kept_wheel else None
    if kept is not None and kept.is_file() and not kept.is_symlink():
        return Built(wheel=kept, failure=reason)
    raise BuildError(reason)


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
    where = provenance.first_difference(docs[0], docs[1]) if len(docs) == 2 else None
    return difference if where is None else wheeldiff.Difference(member=member, what=f"{where} differs")


@contextlib.contextmanager
def _workdir(chosen: Path | None) -> Iterator[Path]:
    if chosen is not None:
        yield chosen
        return
    with tempfile.TemporaryDirectory(prefix="factory-rebuild-") as tmp:
        yield Path(tmp)


def _user_matrix(options: RebuildOptions) -> Trusted:
    if options.matrix is None:
        return Trusted()
    from factory.spec.config import load_matrix_file

    mf = load_matrix_file(options.matrix, trust_paths=options.trust_paths)
    return Trusted.of(mf, f"--matrix {options.matrix}")


def _source_dir(plan: RebuildPlan, options: RebuildOptions, trusted: Trusted, log: Log) -> Path | None:
    """The directory of a path source: --source, else the user's matrix file's source of the same name."""
    if options.source is not None or plan.source_name is None:
        return options.source
    if trusted.source is not None and trusted.source.name == plan.source_name.name:
        log(f"the source directory: {trusted.source} ({trusted.display}'s)")
        return trusted.source
    return None


def rebuilder(*, matrix: Path | None, trust_paths: bool, log: Log) -> Callable[[Path], RebuildResult]:
    """`factory rebuild` of a wheel, with the user's own matrix file (what it names the wheel's
    document may use: patches by sha256, images, torch indexes, its source directory) when there is one: the
    rebuilder `factory index audit --rebuild` hands to `indexaudit.audit_published`."""
    options = RebuildOptions(matrix=matrix, trust_paths=trust_paths)

    def rebuild(path: Path) -> RebuildResult:
        return rebuild_and_compare(str(path), options, log=log)

    return rebuild


def rebuild_and_compare(
    wheel_or_url: str, options: RebuildOptions, *, log: Log, hooks: Hooks | None = None
) -> RebuildResult:
    """Rebuild a wheel (a file or an http(s) URL) from its provenance and compare the two. ConfigError (exit
    2) for a wheel without a usable rebuild section, one whose document asks for what a rebuild does not do
    (`plan_rebuild`), a missing --source or patch; a rebuild that makes no wheel is a result with its
    `failure`, as is a difference, and a wheel that failed its checks is a result with both. `hooks` show
    the build's progress."""
    trusted = _user_matrix(options)
    with embedded._local(wheel_or_url) as given:
        found = embedded.read(given)
        plan = plan_rebuild(found.provenance, given.name, trusted=trusted, options=options)
        for foreign in plan.foreign:
            log(
                f"the rebuild uses what only the wheel names (--allow-foreign {foreign.kind}): {foreign.what}"
            )
        source = _source_dir(plan, options, trusted, log)
        patches = find_patches(plan.patches, trusted=trusted, workdir=options.workdir, wheel=given.name)
        matrix, cache = with_cache(plan.document, options.cache)
        sha = bounded.file_sha256(given)
        with _workdir(options.workdir) as work:
            document = write_workdir(work, matrix, source=source, source_name=plan.source_name)
            copy_patches(work, patches, plan.patches)
            output = work / "out"
            log(f"rebuilding {plan.job_id} from {given.name}'s provenance in {work}")
            try:
                built = build_job(
                    document, plan.job_id, output, cache=cache, log=log,
                    trust_paths=plan.source_name is not None, hooks=hooks,
                )  # fmt: skip
            except BuildError as exc:
                return RebuildResult(
                    wheel=given.name, job_id=plan.job_id, sha256=sha, rebuilt=None, rebuilt_sha256=None,
                    difference=None, failure=str(exc),
                )  # fmt: skip
            difference = wheeldiff.compare_wheels(given, built.wheel)
            if difference is not None:
                difference = explain(difference, given, built.wheel)
            return RebuildResult(
                wheel=given.name, job_id=plan.job_id, sha256=sha, rebuilt=str(built.wheel),
                rebuilt_sha256=bounded.file_sha256(built.wheel), difference=difference,
                failure=built.failure,
            )  # fmt: skip
