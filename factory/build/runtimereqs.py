"""A package's runtime requirements, read from its source's metadata without running setup.py.

The install check installs the wheel in a fresh venv with the network off, from wheelhouses the host
downloaded: the build's (torch and the build requirements) and, made from what this module reads before the
build starts, a small one of the package's own runtime requirements (scipy for torch-cluster). So a missing
runtime dependency is a download error at the start, not a failed check after the compiles.

Where they come from: an sdist's PKG-INFO (`Requires-Dist`), else pyproject.toml's static `[project]
dependencies`. Metadata that leaves them to setup.py (`Dynamic: Requires-Dist`, `dynamic = ["dependencies"]`,
a PKG-INFO older than 2.2 listing none, no metadata at all) is said to be unknown, and the check gets the
build's wheelhouse alone, as before. The source is the package's: its files are read without following a
link, bounded, and what they say is checked as any requirement the host's pip gets (by name, no URL).
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker
from packaging.metadata import parse_email
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
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
) -> CheckWheelhouse:
    """Download the runtime requirements `declared` for `python` with the host's pip configuration into a
    wheelhouse of their own (keyed by them: changing them never downloads torch again). A requirement no
    index serves fails here, before anything compiles (FactoryError). `platform`: the newest manylinux tag
    the check's container takes (None: manylinux_2_28, `wheelhouse.DEFAULT_PLATFORM`)."""
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
    try:
        path = wheelhouse.download_wheelhouse(
            list(job.requirements),
            dest,
            python=python,
            extra_index_urls=extra_index_urls,
            platform=platform or target.wheelhouse_tag,
        )
    except FactoryError as exc:
        raise FactoryError(f"runtime requirements ({declared.where}: {printable(listed)}): {exc}") from None
    return CheckWheelhouse(
        path=path,
        requirements=job.requirements,
        note=f"runtime requirements ({declared.where}): {printable(listed)}, for the install check{skipped}",
    )
