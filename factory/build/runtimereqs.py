"""A package's runtime requirements, read from its source's metadata without running setup.py.

The install check installs the wheel in a fresh venv with the network off, from wheelhouses the host
downloaded: the build's (torch and the build requirements) and, made from what this module reads before the
build starts, a small one of the package's own runtime requirements (scipy for torch-cluster). So a missing
runtime dependency is a download error at the start, not a failed check after the compiles.

A requirement another matrix of the same run builds (torch-scatter for a PyG extension: `Dependency`) is
taken from that run: the wheel its job for the same variant and Python made, pinned to its exact version (a
local label, which no public index serves), or where the run built none, the index that matrix publishes
to; either with the tags the check's container accepts. Its job failed: the dependent fails at once, saying
so (`dependency_problem`).

Where they come from: an sdist's PKG-INFO (`Requires-Dist`), else pyproject.toml's static `[project]
dependencies`. Metadata that leaves them to setup.py (`Dynamic: Requires-Dist`, `dynamic = ["dependencies"]`,
a PKG-INFO older than 2.2 listing none, no metadata at all) is said to be unknown, and the check gets the
build's wheelhouse alone, as before. The source is the package's: its files are read without following a
link, bounded, and what they say is checked as any requirement the host's pip gets (by name, no URL).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import Marker
from packaging.metadata import parse_email
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from factory.build import wheelhouse
from factory.core import safefs
from factory.core.errors import FactoryError
from factory.core.platforms import DEFAULT_PLATFORM, Platform
from factory.core.urls import printable

MAX_METADATA_BYTES = 1 << 20
MAX_REQUIREMENTS = 200
# requirements the check's wheelhouse never takes from here: the build's wheelhouse has torch, pinned
_LEFT_OUT = frozenset({"torch"})


@dataclass(frozen=True, kw_only=True)
class Declared:
    """What a source's metadata says of its runtime requirements: `requirements` as written (markers and
    all) when `where` names the file they are from; `where` empty and `why` when they are not known."""

    requirements: tuple[str, ...] = ()
    where: str = ""
    why: str = ""

    @property
    def known(self) -> bool:
        return bool(self.where)


def _read(tree: Path, name: str) -> str | None:
    try:
        return safefs.read_bytes(tree, name, max_bytes=MAX_METADATA_BYTES).decode("utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{name}: cannot be read ({type(exc).__name__})") from None


def from_pkg_info(text: str) -> Declared:
    """An sdist's PKG-INFO. From Metadata-Version 2.2 on, a field not marked Dynamic is what the built wheel
    has; before it, a PKG-INFO without Requires-Dist may be one whose setup.py keeps them to itself."""
    raw, _unparsed = parse_email(text)
    dynamic = {d.strip().lower() for d in raw.get("dynamic", [])}
    if "requires-dist" in dynamic:
        return Declared(why="PKG-INFO marks Requires-Dist dynamic (only setup.py knows them)")
    listed = tuple(raw.get("requires_dist", []))
    if listed:
        return Declared(requirements=listed, where="PKG-INFO")
    try:
        version = Version(raw.get("metadata_version", "1.0"))
    except InvalidVersion:
        version = Version("1.0")
    if version >= Version("2.2"):
        return Declared(where="PKG-INFO")  # none, and said so
    return Declared(
        why=f"PKG-INFO (Metadata-Version {version}) lists no Requires-Dist; before 2.2 that may mean "
        "setup.py keeps them"
    )


def from_pyproject(text: str) -> Declared:
    """pyproject.toml's `[project]`: its `dependencies` when they are not dynamic."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return Declared(why=f"pyproject.toml cannot be read ({exc})")
    project = data.get("project")
    if not isinstance(project, dict):
        return Declared(why="pyproject.toml has no [project] table (only setup.py knows them)")
    dynamic = project.get("dynamic", [])
    if isinstance(dynamic, list) and "dependencies" in dynamic:
        return Declared(why="pyproject.toml marks dependencies dynamic (only setup.py knows them)")
    deps = project.get("dependencies", [])
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        return Declared(why="pyproject.toml's project.dependencies is not a list of strings")
    return Declared(requirements=tuple(deps), where="pyproject.toml")


def declared_requirements(tree: Path) -> Declared:
    """The runtime requirements a prepared source tree declares: PKG-INFO's (an sdist's), else
    pyproject.toml's; unknown, with the reasons, when neither says."""
    try:
        pkg_info, pyproject = _read(tree, "PKG-INFO"), _read(tree, "pyproject.toml")
    except ValueError as exc:
        return Declared(why=str(exc))
    tried: list[str] = []
    for text, parse in ((pkg_info, from_pkg_info), (pyproject, from_pyproject)):
        if text is None:
            continue
        found = parse(text)
        if found.known:
            return found
        tried.append(found.why)
    return Declared(
        why="; ".join(tried) or "the source has no PKG-INFO and no pyproject.toml (only setup.py knows them)"
    )


def with_recipe(declared: Declared, extra_requires: Sequence[str]) -> Declared:
    """What the source declares with the recipe's `extra_requires` added (a requirement of the same project
    the source declares is replaced by the recipe's: the recipe is the correction). Where the source's own
    are not known, the recipe's are all that is: the check gets them, and the reason stays in `where`."""
    if not extra_requires:
        return declared
    names = {canonicalize_name(Requirement(text).name) for text in extra_requires}
    if not declared.known:
        return Declared(
            requirements=tuple(extra_requires),
            where=f"recipe.extra_requires; the source's own not known: {declared.why}",
        )
    kept = []
    for text in declared.requirements:
        try:
            if canonicalize_name(Requirement(text).name) in names:
                continue
        except InvalidRequirement:
            pass  # `for_job` says it is no requirement
        kept.append(text)
    return Declared(
        requirements=(*kept, *extra_requires), where=f"{declared.where} and recipe.extra_requires"
    )


def target_environment(python: str, *, machine: str = DEFAULT_PLATFORM.name) -> dict[str, str]:
    """The marker environment of a job's wheel: its Python on Linux, no extra asked for."""
    return {
        "implementation_name": "cpython",
        "implementation_version": f"{python}.0",
        "os_name": "posix",
        "platform_machine": machine,
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": f"{python}.0",
        "python_version": python,
        "sys_platform": "linux",
        "extra": "",
    }


@dataclass(frozen=True, kw_only=True)
class ForJob:
    requirements: tuple[str, ...]  # for the host's pip: by name, no marker, no URL
    left_out: tuple[str, ...]  # what was dropped and why, one line each


def for_job(
    declared: Sequence[str], *, package: str, python: str, platform: Platform = DEFAULT_PLATFORM
) -> ForJob:
    """The requirements the check's wheelhouse needs for a job's Python: markers evaluated (extras are not
    installed), torch (the build's wheelhouse has it) and the package itself left out, a direct URL or a
    line that is no requirement refused by name."""
    env = target_environment(python, machine=platform.name)
    wanted: list[str] = []
    left_out: list[str] = []
    own = canonicalize_name(package)
    for text in declared[:MAX_REQUIREMENTS]:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            left_out.append(f"{printable(text)!r}: not a requirement")
            continue
        name = canonicalize_name(req.name)
        if req.url is not None:
            left_out.append(f"{name}: a direct URL, which the host does not fetch")
            continue
        if req.marker is not None and not _applies(req.marker, env):
            continue
        if name in _LEFT_OUT or name == own:
            continue
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        wanted.append(f"{name}{extras}{req.specifier}")
    if len(declared) > MAX_REQUIREMENTS:
        left_out.append(f"{len(declared) - MAX_REQUIREMENTS} more past the first {MAX_REQUIREMENTS}")
    return ForJob(requirements=tuple(dict.fromkeys(wanted)), left_out=tuple(left_out))


def _applies(marker: Marker, env: dict[str, str]) -> bool:
    try:
        return marker.evaluate(env)
    except Exception:  # an undefined comparison in the package's marker: not for this job
        return False


@dataclass(frozen=True, kw_only=True)
class CheckWheelhouse:
    """The install check's own wheelhouse of a job's Python (None: the build's serves alone), the
    requirements it holds, and what the log says of them."""

    path: Path | None
    requirements: tuple[str, ...]
    note: str


def check_wheelhouse(
    declared: Declared,
    *,
    package: str,
    python: str,
    dest: Path,
    extra_index_urls: Sequence[str] = (),
    platform: str | None = None,
    target: Platform = DEFAULT_PLATFORM,
    built: Sequence[Path] = (),
    find_links: Sequence[Path] = (),
) -> CheckWheelhouse:
    """Download the runtime requirements `declared` for `python` with the host's pip configuration into a
    wheelhouse of their own (keyed by them: changing them never downloads torch again). A requirement no
    index serves fails here, before anything compiles (FactoryError). `platform`: the newest manylinux tag
    the check's container takes (None: manylinux_2_28, `wheelhouse.DEFAULT_PLATFORM`). `built`: wheels of
    other projects this run built (`Dependency`), each requirement of theirs pinned to the wheel (`pinned`);
    `find_links`: wheelhouses pip may take the rest from (the build's, whose torch a dependency's pin
    names)."""
    if not declared.known:
        return CheckWheelhouse(
            path=None,
            requirements=(),
            note=f"runtime requirements not known ({declared.why}): the install check has the build's "
            "wheelhouse only",
        )
    job = for_job(declared.requirements, package=package, python=python, platform=target)
    skipped = f"; left out: {'; '.join(job.left_out)}" if job.left_out else ""
    if not job.requirements:
        return CheckWheelhouse(
            path=None, requirements=(), note=f"runtime requirements ({declared.where}): none{skipped}"
        )
    listed = " ".join(job.requirements)
    wanted = pinned(job.requirements, built)
    try:
        path = wheelhouse.download_wheelhouse(
            list(wanted),
            dest,
            python=python,
            extra_index_urls=extra_index_urls,
            platform=platform or target.wheelhouse_tag,
            wheels=built,
            find_links=find_links if built else (),
        )
    except FactoryError as exc:
        raise FactoryError(f"runtime requirements ({declared.where}: {printable(listed)}): {exc}") from None
    taken = f"; built in this run: {', '.join(w.name for w in built)}" if built else ""
    return CheckWheelhouse(
        path=path,
        requirements=job.requirements,
        note=f"runtime requirements ({declared.where}): {printable(listed)}, for the install check"
        f"{taken}{skipped}",
    )


def project_names(declared: Declared) -> frozenset[str]:
    """The projects `declared` names (canonical names, whatever their markers: for ordering a run's
    matrices, a requirement of any job counts); lines that are no requirement left out."""
    names = set()
    for text in declared.requirements[:MAX_REQUIREMENTS]:
        try:
            names.add(canonicalize_name(Requirement(text).name))
        except InvalidRequirement:
            continue
    return frozenset(names)


@dataclass(frozen=True, kw_only=True)
class Dependency:
    """A project another matrix of this run builds, as the install checks of the later matrices see it:
    the wheel each of its jobs made, by (variant id, Python), in this run's output; the jobs that failed,
    with their reason; and the index it publishes to (a pip URL, its `simple/` root), None where pip cannot
    read it (an S3 store) or it publishes nowhere in this run."""

    project: str  # canonical
    matrix: str  # its matrix file, as messages name it
    wheels: Mapping[tuple[str, str], Path] = field(default_factory=dict)
    failed: Mapping[tuple[str, str], str] = field(default_factory=dict)
    index: str | None = None

    def index_url(self, variant_id: str) -> str | None:
        """Its variant index of `variant_id` (`<simple/>/<variant id>/`), None where it has none."""
        return None if self.index is None else f"{self.index.rstrip('/')}/{variant_id}/"


def needed(
    dependencies: Sequence[Dependency], declared: Declared, *, package: str, python: str, platform: Platform
) -> tuple[Dependency, ...]:
    """The `dependencies` a job's runtime requirements name (markers evaluated for its Python)."""
    if not dependencies or not declared.known:
        return ()
    job = for_job(declared.requirements, package=package, python=python, platform=platform)
    names = {canonicalize_name(Requirement(text).name) for text in job.requirements}
    return tuple(d for d in dependencies if d.project in names)


def dependency_problem(dependencies: Sequence[Dependency], *, variant_id: str, python: str) -> str | None:
    """Why a job cannot build: the job of a dependency it needs, for its variant and Python, failed in this
    run (one line naming the dependency, its matrix and its job's reason); None otherwise."""
    for dep in dependencies:
        reason = dep.failed.get((variant_id, python))
        if reason is not None:
            return (
                f"runtime requirement {dep.project} ({dep.matrix}) was not built in this run: {reason}; "
                "its install check would have nothing to take it from"
            )
    return None


def pinned(requirements: Sequence[str], wheels: Sequence[Path]) -> tuple[str, ...]:
    """`requirements` (`for_job`'s) with each project this run built pinned to its wheel's exact version, so
    pip takes that wheel whatever another index offers beside it; FactoryError where the requirement's own
    specifier refuses the version built."""
    built = {}
    for wheel in wheels:
        name, made, _build, _tags = parse_wheel_filename(wheel.name)
        built[canonicalize_name(name)] = made
    out = []
    for text in requirements:
        req = Requirement(text)
        version = built.get(canonicalize_name(req.name))
        if version is None:
            out.append(text)
            continue
        if not req.specifier.contains(version, prereleases=True):
            raise FactoryError(
                f"runtime requirement {printable(text)}: this run built {req.name} {version}, "
                "which it refuses"
            )
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        out.append(f"{canonicalize_name(req.name)}{extras}=={version}")
    return tuple(out)
