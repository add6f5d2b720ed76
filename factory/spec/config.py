"""matrix.yaml: the loader that validates every value with its line number into frozen options.

All validation happens here, once; later stages (expansion, pruning, builds) can trust what they get.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from factory.core import platforms, storeurl
from factory.core.errors import ConfigError
from factory.core.tags import parse_glibc
from factory.core.units import format_size, parse_size
from factory.core.urls import INDEX_SCHEMES
from factory.core.validate import (
    container_limits,
    git_url_problem,
    is_specifier,
    library_glob_problem,
    package_name_problem,
    requirement_problem,
    runner_labels_problem,
    shown_name,
    specifier_problem,
)
from factory.core.variants import CUDA_VERSION, TORCH_VERSION, arch_key, parse_arch_set
from factory.spec.abi3 import parse_limited_api
from factory.spec.compat import ARCH_KEYS, RECIPE_KEYS, TOP_KEYS, TORCH_KEYS, CompatData
from factory.spec.imageref import NOT_AN_IMAGE, is_image_reference
from factory.spec.options import (
    FLAVORS,
    MAX_ATTEMPTS,
    MAX_COMPILE_GIB,
    MAX_COMPILE_SECONDS,
    MAX_CPUS,
    MAX_PIDS,
    MAX_SHARDS,
    MAX_SIZE,
    MIN_CPUS,
    MIN_PIDS,
    OWN_INDEX,
    BuildOptions,
    FetchLimits,
    PackageSpec,
    PublishOptions,
    Recipe,
    Source,
    frozen_mapping,
)
from factory.spec.recipes import BUILTIN_RECIPES, TORCH_EXT, default_recipe_for
from factory.spec.stable_abi import parse_stable_abi
from factory.spec.yamlcheck import Checker, kind, plain
from factory.spec.yamlload import load_yaml

AXES: tuple[str, ...] = ("cuda", "torch", "python", "cxx11_abi", "arch", "platform")
# Axes a job may leave out, and what it then is: a matrix written before the platform axis builds what it did.
DEFAULT_AXES: Mapping[str, object] = MappingProxyType({"platform": platforms.DEFAULT_PLATFORM.name})

# what git check-ref-format allows in practice for a tag, a branch or a commit: no leading "-" or "/"
_GIT_REF = re.compile(r"[\w.+][\w./+-]*")
# Versions without leading zeros, as factory.core.variants reads CUDA and torch back from a variant id or a
# local label (PEP 440 turns "12.08" into "12.8"); matched whole, so no trailing newline passes either.
_N = r"(?:0|[1-9]\d*)"
_TORCH_MINOR = re.compile(rf"{_N}\.{_N}")
_PYTHON = re.compile(r"3\.(?:0|[1-9]\d?)")
# Bounds said in the messages that enforce them. Jobs: the product of the axes' lengths, checked before
# anything is expanded (50 x 2000 x 100 values would be ten million jobs in memory); entries: include and
# exclude each, as every entry is compared with every job. (The jobs a matrix plans: not ninja's MAX_JOBS, the
# compiles one build runs side by side, which `memory.jobmemory` sets.)
MAX_PLANNED_JOBS = 4096
MAX_ENTRIES = 256
# A container below this cannot compile a CUDA extension (Docker's own minimum is 6 MB): a smaller
# build.memory, or a concurrency that leaves each container less, only gets every job OOM-killed.
MIN_CONTAINER_MEMORY = 2**30
MAX_CONCURRENCY = 256
# package: keys that bound and check fetching the sdist (source: pypi)
_FETCH_KEYS = ("sha256", "max_download", "max_unpacked", "download_deadline")
_SHA256 = re.compile(r"[0-9a-f]{64}")


# ----------------------------------------------------------------------------------------------------
# What a matrix file resolves to (the option types it holds are factory.spec.options')


@dataclass(frozen=True, kw_only=True)
class MatrixEntry:
    """One include or exclude entry: validated values (arch canonicalised) and where it was written."""

    values: Mapping[str, object]
    line: int | None = None


@dataclass(frozen=True, kw_only=True)
class MatrixSpec:
    axes: Mapping[str, tuple[object, ...]] = field(default_factory=frozen_mapping)
    include: tuple[MatrixEntry, ...] = ()
    exclude: tuple[MatrixEntry, ...] = ()
    line: int | None = None

    @property
    def defaults(self) -> Mapping[str, object]:
        """The value of each axis a job leaves out (`DEFAULT_AXES`), which exclude entries compare with."""
        return DEFAULT_AXES


@dataclass(frozen=True, kw_only=True)
class MatrixFile:
    path: Path
    package: PackageSpec
    recipe: Recipe
    build: BuildOptions = field(default_factory=BuildOptions)
    publish: PublishOptions = field(default_factory=PublishOptions)
    matrix: MatrixSpec = field(default_factory=MatrixSpec)
    compat: CompatData = field(default_factory=CompatData.load)
    display: str = ""  # the path as the user wrote it, for messages


def with_flavor(mf: MatrixFile, flavor: str | None) -> MatrixFile:
    """The matrix file built with another image flavor (`--flavor`: the same matrix on a host that reaches no
    registry, say); `mf` itself when `flavor` is None."""
    if flavor is None:
        return mf
    if flavor not in FLAVORS:
        raise ConfigError(f"--flavor {flavor!r} must be one of {', '.join(repr(f) for f in FLAVORS)}")
    return replace(mf, build=replace(mf.build, flavor=flavor))  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------------
# Small public helpers


def canonical_arch(value: str) -> str:
    """ "9.0;8.0" -> "8.0;9.0" (syntax only; known-ness is checked against compat data by the loader)."""
    return ";".join(parse_arch_set(value))


# ----------------------------------------------------------------------------------------------------
# The loader: the top level, then each section by its own rules


def load_matrix_file(path: str | Path, *, trust_paths: bool = False) -> MatrixFile:
    """Read and validate a matrix file; any problem is a ConfigError "FILE:LINE: message" (exit code 2).

    Paths in it (package.source.path, recipe.patches) must lie inside its directory unless `trust_paths`."""
    return _load(Checker(load_yaml(path), trust_paths=trust_paths))


def _load(check: Checker) -> MatrixFile:
    """The top level: its keys, then each section (compat first: the others check archs against it)."""
    root = check.doc.root
    if root is None:
        raise check.doc.error("the file is empty (it needs at least package: and matrix:)", 1)
    if not isinstance(root, Mapping):
        raise check.fail(f"the top level must be a mapping, not {kind(root)}", root)
    check.keys(root, ("package", "recipe", "matrix", "build", "publish", "compat"), "the top level")
    for required in ("package", "matrix"):
        if required not in root:
            raise check.doc.error(f"missing required key {required!r} at the top level", 1)
    compat = _compat(check, root)
    package = _package(check, root)
    recipe = _recipe(check, root, package, compat)
    matrix = _matrix(check, root, compat)
    build = _build(check, root)
    publish = _publish(check, root)
    _check_own_index(check, root, build, publish)
    mf = MatrixFile(
        path=check.doc.path,
        package=package,
        recipe=recipe,
        build=build,
        publish=publish,
        matrix=matrix,
        compat=compat,
        display=check.doc.display,
    )
    _check_complete(check, mf)
    return mf


def _check_own_index(
    check: Checker, root: Mapping[str, Any], build: BuildOptions, publish: PublishOptions
) -> None:
    """build.check_indexes' OWN_INDEX needs an index pip reads: publish.to a directory."""
    if OWN_INDEX not in build.check_indexes or publish.pip_index() is not None:
        return
    items = root["build"]["check_indexes"]
    raise check.fail(
        f"build.check_indexes item {OWN_INDEX!r} is the index publish.to names, and pip cannot read "
        f"{publish.to!r}: name its public simple/ URL (https://…/simple/) instead",
        items,
        list(items).index(OWN_INDEX),
    )


def _check_complete(check: Checker, mf: MatrixFile) -> None:
    """Every job the axes and include entries make has a value for each axis."""
    from factory.spec.matrix import expand_with_origin

    spec = mf.matrix
    for combo, origin in expand_with_origin(
        spec.axes,
        [e.values for e in spec.include],
        [e.values for e in spec.exclude],
        spec.defaults,
    ):
        missing = [a for a in AXES if a not in combo and a not in DEFAULT_AXES]
        if missing:
            line = spec.include[origin].line if origin is not None else spec.line
            shown = ", ".join(f"{k}={v}" for k, v in combo.items() if k in AXES) or "(no axes)"
            raise check.doc.error(
                f"incomplete job {shown}: missing {', '.join(missing)} "
                f"(every job needs cuda, torch, python, cxx11_abi and arch)",
                line,
            )


# ----------------------------------------------------------------------------------------------------
# package:


def _package(check: Checker, root: Mapping[str, Any]) -> PackageSpec:
    """package: a valid distribution name, a PEP 440 version without a local label, where the source is."""
    node = check.mapping(root, "package", "package")
    check.keys(node, ("name", "version", "source", *_FETCH_KEYS), "package")
    for required in ("name", "version"):
        if required not in node:
            raise check.fail(f"package: missing required key {required!r}", root, "package", at_key=True)
    name = check.string(node, "name", "package.name")
    problem = package_name_problem(name)
    if problem is not None:
        raise check.fail(f"package.name {shown_name(name)!r} {problem}", node, "name")
    version = check.string(node, "version", "package.version")
    shown = shown_name(version)
    if version != version.strip():
        # packaging would read "2.8.3 " as 2.8.3, but the name of every wheel and index page is built from it
        raise check.fail(
            f"package.version {shown!r} has spaces around it; write {shown_name(version.strip())!r}",
            node,
            "version",
        )
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise check.fail(f"package.version {shown!r} is not a PEP 440 version", node, "version") from None
    if parsed.local is not None:
        raise check.fail(
            f"package.version {shown!r} must not have a local label (the factory adds its own)",
            node,
            "version",
        )
    source = _source(check, node) if "source" in node else Source()
    for key in _FETCH_KEYS:
        if key in node and source.kind != "pypi":
            raise check.fail(f"package.{key} only goes with source: pypi", node, key, at_key=True)
    sha256 = None
    if "sha256" in node:
        sha256 = check.string(node, "sha256", "package.sha256").lower()
        if not _SHA256.fullmatch(sha256):
            raise check.fail(
                f"package.sha256 {shown_name(sha256)!r} is not a sha256 (64 hex digits)", node, "sha256"
            )
    limits = FetchLimits()
    if "max_download" in node:
        limits = replace(limits, download_bytes=_size(check, node, "max_download", "package.max_download"))
    if "max_unpacked" in node:
        limits = replace(limits, unpacked_bytes=_size(check, node, "max_unpacked", "package.max_unpacked"))
    if "download_deadline" in node:
        seconds = check.number(node, "download_deadline", "package.download_deadline")
        limits = replace(limits, download_seconds=seconds)
    return PackageSpec(name=name, version=version, source=source, sha256=sha256, limits=limits)


def _source(check: Checker, node: Mapping[str, Any]) -> Source:
    """package.source: pypi, {git: URL, ref: REF} or {path: DIR} (relative to the matrix file)."""
    value = node["source"]
    if value is None or value == "pypi":
        return Source(kind="pypi")
    if isinstance(value, str):
        raise check.fail(
            f"package.source {shown_name(value)!r}: write pypi, {{git: URL, ref: REF}} or {{path: DIR}}",
            node,
            "source",
        )
    if not isinstance(value, Mapping):
        raise check.fail(f"package.source must be pypi or a mapping, not {kind(value)}", node, "source")
    check.keys(value, ("git", "ref", "path"), "package.source")
    if "git" in value and "path" in value:
        raise check.fail("package.source: give either git: or path:, not both", node, "source")
    if "git" in value:
        url = check.string(value, "git", "package.source.git")
        if "ref" not in value:
            raise check.fail(
                "package.source.git needs a ref: (a tag or commit) so builds are reproducible",
                value,
                "git",
            )
        if url.startswith("-"):
            raise check.fail(f"package.source.git {shown_name(url)!r} is not a repository URL", value, "git")
        problem = git_url_problem(url)
        if problem is not None:
            raise check.fail(f"package.source.git {problem}", value, "git")
        ref = check.string(value, "ref", "package.source.ref")
        if not _GIT_REF.fullmatch(ref) or ".." in ref:
            raise check.fail(
                f"package.source.ref {shown_name(ref)!r} is not a tag, branch or commit", value, "ref"
            )
        return Source(kind="git", url=url, ref=ref)
    if "path" in value:
        if "ref" in value:
            raise check.fail("package.source.ref only goes with git:", value, "ref", at_key=True)
        return Source(kind="path", path=check.rel_path(value, "path", "package.source.path", directory=True))
    raise check.fail("package.source needs git: or path:", node, "source")


# ----------------------------------------------------------------------------------------------------
# recipe:


def _recipe(check: Checker, root: Mapping[str, Any], package: PackageSpec, compat: CompatData) -> Recipe:
    """recipe: a built-in name, or a mapping that names its own and starts from a built-in `base` (by
    default `torch-ext`)."""
    if "recipe" not in root:
        return default_recipe_for(package)
    value = root["recipe"]
    if isinstance(value, str):
        if value not in BUILTIN_RECIPES:
            raise check.fail(
                f"unknown recipe {value!r} (built in: {', '.join(BUILTIN_RECIPES)}; or a mapping)",
                root,
                "recipe",
            )
        return _with_import_name(BUILTIN_RECIPES[value], package)
    if not isinstance(value, Mapping):
        raise check.fail(f"recipe must be a name or a mapping, not {kind(value)}", root, "recipe")
    allowed = (
        "name",
        "base",
        "arch_env",
        "arch_format",
        "local_version_env",
        "env",
        "patches",
        "import_name",
        "min_arch",
        "compile_gib_per_arch",
        "compile_gib_by_file",
        "compile_after_peak",
        "compile_seconds_by_file",
        "extra_build_requires",
        "cxx_std",
        "py_limited_api",
        "stable_abi",
        "host_only_libraries",
        "extra_requires",
    )
    check.keys(value, allowed, "recipe")
    if "name" not in value:
        raise check.fail("recipe: missing required key 'name'", root, "recipe", at_key=True)
    name = check.string(value, "name", "recipe.name")
    # Without `base:`, the generic torch extension's keys (FORCE_CUDA=1 among them), as docs/MATRIX.md says:
    # a package that compiles its CUDA code only under FORCE_CUDA when no GPU is visible would otherwise
    # build host code alone for as long as it takes (issue 42 §3).
    base = replace(TORCH_EXT, name=name)
    if "base" in value:
        base_name = check.string(value, "base", "recipe.base")
        if base_name not in BUILTIN_RECIPES:
            raise check.fail(
                f"recipe.base {base_name!r} is not a built-in recipe ({', '.join(BUILTIN_RECIPES)})",
                value,
                "base",
            )
        base = replace(BUILTIN_RECIPES[base_name], name=name)
    changes = _recipe_fields(check, value, base, compat, package=package.name)
    return _with_import_name(replace(base, **changes), package)


def _recipe_fields(
    check: Checker, value: Mapping[str, Any], base: Recipe, compat: CompatData, *, package: str = ""
) -> dict[str, Any]:
    """The fields a recipe mapping sets over its base; `env` adds to the base's."""
    changes: dict[str, Any] = {}
    if "arch_env" in value:
        changes["arch_env"] = check.env_name(value, "arch_env", "recipe.arch_env")
    if "arch_format" in value:
        fmt = check.string(value, "arch_format", "recipe.arch_format")
        if fmt not in ("flash-attn", "torch"):
            raise check.fail(
                f"recipe.arch_format {fmt!r} must be 'flash-attn' (80;90) or 'torch' (8.0;9.0)",
                value,
                "arch_format",
            )
        changes["arch_format"] = fmt
    if "local_version_env" in value:
        if value["local_version_env"] is None:
            changes["local_version_env"] = None
        else:
            changes["local_version_env"] = check.env_name(
                value, "local_version_env", "recipe.local_version_env"
            )
    if "env" in value:
        changes["env"] = frozen_mapping({**base.env, **check.env(value, "env", "recipe.env")})
    if "patches" in value:
        patches = value["patches"]
        if not isinstance(patches, list):
            raise check.fail(f"recipe.patches must be a list of files, not {kind(patches)}", value, "patches")
        # applied after the base recipe's: `factory source diff` writes them against its patched tree
        changes["patches"] = base.patches + tuple(
            check.rel_path(patches, i, "recipe.patches item", directory=False) for i in range(len(patches))
        )
    if "import_name" in value:
        imp = check.string(value, "import_name", "recipe.import_name")
        if not all(part.isidentifier() for part in imp.split(".")):
            raise check.fail(f"recipe.import_name {imp!r} is not a Python module name", value, "import_name")
        changes["import_name"] = imp
    if "min_arch" in value:
        changes["min_arch"] = _single_arch(check, value, "min_arch", "recipe.min_arch", compat.known_archs)
    if "compile_gib_per_arch" in value:
        changes["compile_gib_per_arch"] = check.number(
            value, "compile_gib_per_arch", "recipe.compile_gib_per_arch", maximum=MAX_COMPILE_GIB
        )
    if "compile_gib_by_file" in value:
        changes["compile_gib_by_file"] = _by_file(check, value, "compile_gib_by_file", MAX_COMPILE_GIB)
    if "compile_after_peak" in value:
        after = value["compile_after_peak"]
        if after is not None:
            after = check.number(value, "compile_after_peak", "recipe.compile_after_peak")
            if after > 1:
                raise check.fail(
                    f"recipe.compile_after_peak is a fraction of the peak, at most 1, not {after:g}",
                    value,
                    "compile_after_peak",
                )
        changes["compile_after_peak"] = after
    if "compile_seconds_by_file" in value:
        changes["compile_seconds_by_file"] = _by_file(
            check, value, "compile_seconds_by_file", MAX_COMPILE_SECONDS
        )
    if "extra_build_requires" in value:
        changes["extra_build_requires"] = _requirements(check, value, "extra_build_requires")
    if "cxx_std" in value:
        changes["cxx_std"] = (
            None if value["cxx_std"] is None else _cxx_std(check, value, "cxx_std", "recipe.cxx_std")
        )
    if "py_limited_api" in value:
        try:
            changes["py_limited_api"] = parse_limited_api(value["py_limited_api"])
        except ValueError as exc:
            raise check.fail(f"recipe.py_limited_api {exc}", value, "py_limited_api") from None
    if "stable_abi" in value:
        try:
            changes["stable_abi"] = parse_stable_abi(value["stable_abi"])
        except ValueError as exc:
            raise check.fail(f"recipe.stable_abi {exc}", value, "stable_abi") from None
    if "host_only_libraries" in value:
        changes["host_only_libraries"] = _library_globs(check, value, "host_only_libraries")
    if "extra_requires" in value:
        changes["extra_requires"] = _runtime_requirements(check, value, package)
    return changes


def _runtime_requirements(check: Checker, node: Mapping[str, Any], package: str) -> tuple[str, ...]:
    """recipe.extra_requires: requirements by name (`_requirements`), never torch (the factory pins it to the
    build's) nor the package itself, each project once."""
    items = _requirements(check, node, "extra_requires")
    seen: set[str] = set()
    for i, text in enumerate(items):
        name = canonicalize_name(Requirement(text).name)
        if name == "torch" or name == canonicalize_name(package):
            what = "torch, which the factory pins to the build's" if name == "torch" else "the package itself"
            raise check.fail(f"recipe.extra_requires item {text!r} names {what}", node["extra_requires"], i)
        if name in seen:
            raise check.fail(f"recipe.extra_requires names {name} twice", node["extra_requires"], i)
        seen.add(name)
    return items


def _library_globs(check: Checker, node: Mapping[str, Any], key: str) -> tuple[str, ...]:
    """Globs on extension modules' paths in a wheel (`validate.library_glob_problem` says which may be)."""
    what = f"recipe.{key}"
    items = check.str_list(node, key, what)
    for i, text in enumerate(items):
        problem = library_glob_problem(text)
        if problem is not None:
            raise check.fail(f"{what} item {text!r} {problem}", node[key], i)
    return items


def _cxx_std(check: Checker, node: Any, key: object, what: str) -> str:
    """A C++ standard, 17 or "17"."""
    value = node[key]
    is_int = isinstance(value, int) and not isinstance(value, bool)
    std = str(value) if is_int else check.string(node, key, what)
    if std not in ("14", "17", "20", "23"):
        raise check.fail(f"{what} {std!r} must be one of 14, 17, 20, 23", node, key)
    return std


def _requirements(check: Checker, node: Mapping[str, Any], key: str) -> tuple[str, ...]:
    """Requirements the host's pip downloads (`validate.requirement_problem` says which may be)."""
    what = f"recipe.{key}"
    items = check.str_list(node, key, what)
    for i, text in enumerate(items):
        problem = requirement_problem(text)
        if problem is not None:
            raise check.fail(f"{what} item {text!r} {problem}", node[key], i)
    return items


def _by_file(
    check: Checker, node: Mapping[str, Any], key: str, maximum: float
) -> tuple[tuple[str, float], ...]:
    """Ordered glob -> number table (GiB, seconds); it replaces the base recipe's table (an empty mapping
    clears it)."""
    what = f"recipe.{key}"
    table = check.mapping(node, key, what)
    out: list[tuple[str, float]] = []
    for pattern in table:
        if not isinstance(pattern, str) or not pattern.strip():
            raise check.fail(
                f"{what}: a pattern must be a non-empty string (a glob on the file name), "
                f"not {kind(pattern)} {pattern!r}",
                table,
                pattern,
                at_key=True,
            )
        if "/" in pattern:
            raise check.fail(
                f"{what}: pattern {pattern!r} matches base names only; drop the directory",
                table,
                pattern,
                at_key=True,
            )
        out.append((str(pattern), check.number(table, pattern, f"{what}[{pattern!r}]", maximum=maximum)))
    return tuple(out)


def _with_import_name(recipe: Recipe, package: PackageSpec) -> Recipe:
    if recipe.import_name:
        return recipe
    return replace(recipe, import_name=canonicalize_name(package.name).replace("-", "_"))


# ----------------------------------------------------------------------------------------------------
# matrix:


def _matrix(check: Checker, root: Mapping[str, Any], compat: CompatData) -> MatrixSpec:
    """matrix: lists of axis values, each value once, and include/exclude entries."""
    node = check.mapping(root, "matrix", "matrix")
    known = compat.known_archs
    axes: dict[str, tuple[object, ...]] = {}
    include: tuple[MatrixEntry, ...] = ()
    exclude: tuple[MatrixEntry, ...] = ()
    check.keys(node, (*AXES, "include", "exclude"), "matrix")
    for key in node:
        if key in ("include", "exclude"):
            continue
        values = node[key]
        if not isinstance(values, list):
            raise check.fail(f"matrix.{key} must be a list, not {kind(values)}", node, key)
        if not values:
            raise check.fail(f"matrix.{key} is empty: give at least one value", node, key)
        # Report the lossy float first: in [2.9, 2.10] the dangerous one is 2.10, which YAML read as 2.1.
        order = sorted(range(len(values)), key=lambda i: not check.lossy(values, i))
        for i in order:
            _axis_value(check, values, i, key, known)
        parsed = tuple(_axis_value(check, values, i, key, known) for i in range(len(values)))
        for i, item in enumerate(parsed):
            if item in parsed[:i]:
                raise check.fail(f"matrix.{key} lists {item!r} twice", values, i)
        axes[key] = parsed
    jobs = math.prod(len(v) for v in axes.values()) if axes else 0
    if jobs > MAX_PLANNED_JOBS:
        sizes = " x ".join(f"{len(v)} {k}" for k, v in axes.items())
        raise check.fail(
            f"matrix: {sizes} make {jobs} jobs; at most {MAX_PLANNED_JOBS}", root, "matrix", at_key=True
        )
    if "exclude" in node:
        exclude = _entries(check, node, "exclude", known, axes_only=True, axes=axes)
    if "include" in node:
        include = _entries(check, node, "include", known, axes_only=False, axes=axes)
    if not axes and not include:
        raise check.fail("matrix has no axes and no include entries", root, "matrix", at_key=True)
    return MatrixSpec(
        axes=frozen_mapping(axes),
        include=include,
        exclude=exclude,
        line=check.doc.key_line(root, "matrix"),
    )


def _axis_value(check: Checker, node: Any, key: object, axis: str, known: Sequence[str]) -> object:
    """One value of one axis, in that axis's form."""
    what = {"cuda": "cuda version", "torch": "torch version", "python": "python version"}.get(axis, axis)
    if axis in ("torch", "python") and is_specifier(node[key]):
        # a PEP 440 specifier: only its syntax here; factory.plan.specs resolves it against the index at plan
        # time
        problem = specifier_problem(node[key])
        if problem is not None:
            raise check.fail(f"{what} {node[key]!r} is not a PEP 440 specifier: {problem}", node, key)
        return str(node[key]).strip()
    if axis == "cuda":
        return check.pattern(node, key, what, CUDA_VERSION, "12.8")
    if axis == "torch":
        return check.pattern(node, key, what, TORCH_VERSION, "2.10")
    if axis == "python":
        return check.pattern(node, key, what, _PYTHON, "3.11")
    if axis == "cxx11_abi":
        return check.boolean(node, key, "cxx11_abi")
    if axis == "platform":
        return _platform(check, node, key)
    return _arch(check, node, key, "arch", known)


def _platform(check: Checker, node: Any, key: object) -> str:
    """A platform of the table (`factory.core.platforms`) that the factory builds today."""
    value = check.string(node, key, "platform")
    found = platforms.by_name(value)
    if found is None:
        raise check.fail(
            f"unknown platform {value!r}: expected one of {', '.join(platforms.NAMES)}", node, key
        )
    problem = platforms.build_problem(found)
    if problem is not None:
        raise check.fail(problem, node, key)
    return value


def _entries(
    check: Checker,
    node: Mapping[str, Any],
    key: str,
    known: Sequence[str],
    *,
    axes_only: bool,
    axes: Mapping[str, tuple[object, ...]],
) -> tuple[MatrixEntry, ...]:
    items = node[key]
    if items is None:
        return ()
    if not isinstance(items, list):
        raise check.fail(f"matrix.{key} must be a list of mappings, not {kind(items)}", node, key)
    if len(items) > MAX_ENTRIES:
        raise check.fail(
            f"matrix.{key} has {len(items)} entries; at most {MAX_ENTRIES}", node, key, at_key=True
        )
    out: list[MatrixEntry] = []
    for i, item in enumerate(items):
        line = check.doc.line_of(items, i)
        if not isinstance(item, Mapping) or not item:
            raise check.doc.error(f"matrix.{key}[{i}] must be a non-empty mapping, not {kind(item)}", line)
        values: dict[str, object] = {}
        for k in item:
            if not isinstance(k, str):
                raise check.fail(f"matrix.{key}[{i}]: keys must be strings", item, k, at_key=True)
            if k in AXES:
                values[k] = _axis_value(check, item, k, k, known)
            elif axes_only:
                close = difflib.get_close_matches(k, AXES, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f" (axes: {', '.join(AXES)})"
                raise check.fail(
                    f"matrix.exclude[{i}]: {k!r} is not a matrix axis{hint}", item, k, at_key=True
                )
            elif k == "env":
                values[k] = check.env(item, k, f"matrix.include[{i}].env")
            elif k == "shards":
                # `factory matrix --format github --shards N`: this entry's jobs in this many shards instead
                value = item[k]
                if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SHARDS:
                    raise check.fail(
                        f"matrix.include[{i}].shards must be 1 to {MAX_SHARDS}, not {value!r}", item, k
                    )
                values[k] = value
            elif k == "runs_on":
                # `factory matrix --format github`: the runner labels of this entry's jobs, instead of their
                # platform's (`--runner`)
                problem = runner_labels_problem(plain(item[k]))
                if problem is not None:
                    raise check.fail(f"matrix.include[{i}].runs_on: {problem}", item, k)
                values[k] = plain(item[k])
            elif k in (
                "id",
                "job_id",
                "package",
                "version",
                "local_version",
                "known",
                "verified",  # the older name of "known"
                "abi",
                "covers",
                "stable_abi",
                "torches",
            ):
                raise check.fail(
                    f"matrix.include[{i}]: {k!r} is computed by the factory and cannot be set",
                    item,
                    k,
                    at_key=True,
                )
            else:
                values[k] = plain(item[k])
        out.append(MatrixEntry(values=frozen_mapping(values), line=line))
    return tuple(out)


# ----------------------------------------------------------------------------------------------------
# build:


def _build(check: Checker, root: Mapping[str, Any]) -> BuildOptions:
    """build: limits, flavor, images and where torch comes from."""
    if "build" not in root or root["build"] is None:
        return BuildOptions()
    node = check.mapping(root, "build", "build")
    allowed = (
        "memory",
        "memory_budget",
        "cpus",
        "concurrency",
        "flavor",
        "base_image",
        "images",
        "pids_limit",
        "max_attempts",
        "offline",
        "torch_index",
        "cache",
        "cache_max",
        "glibc",
        "check_indexes",
    )
    check.keys(node, allowed, "build")
    c: dict[str, Any] = {}
    for key in ("memory", "memory_budget"):
        if key in node:
            c[key] = _size(check, node, key, f"build.{key}")
            if c[key] < MIN_CONTAINER_MEMORY:
                raise check.fail(
                    f"build.{key} {format_size(c[key])} is below {format_size(MIN_CONTAINER_MEMORY)}, "
                    "too little for a container that compiles CUDA",
                    node,
                    key,
                )
    if "cpus" in node:
        c["cpus"] = check.number(node, "cpus", "build.cpus", minimum=MIN_CPUS, maximum=MAX_CPUS)
    if "concurrency" in node:
        c["concurrency"] = check.integer(node, "concurrency", "build.concurrency")
        if c["concurrency"] > MAX_CONCURRENCY:
            raise check.fail(
                f"build.concurrency {c['concurrency']} is above {MAX_CONCURRENCY}", node, "concurrency"
            )
    if "flavor" in node:
        flavor = check.string(node, "flavor", "build.flavor")
        if flavor not in FLAVORS:
            raise check.fail(
                f"build.flavor {flavor!r} must be one of {', '.join(repr(f) for f in FLAVORS)}",
                node,
                "flavor",
            )
        c["flavor"] = flavor
    if "base_image" in node:
        c["base_image"] = check.string(node, "base_image", "build.base_image")
        if not is_image_reference(c["base_image"]):
            raise check.fail(f"build.base_image {c['base_image']!r} {NOT_AN_IMAGE}", node, "base_image")
    if "images" in node:
        c["images"] = _cuda_map(check, node, "images", "build.images")
        for cuda, image in c["images"].items():
            if not is_image_reference(image):
                raise check.fail(f"build.images.{cuda} {image!r} {NOT_AN_IMAGE}", node["images"], cuda)
    if "pids_limit" in node:
        c["pids_limit"] = check.integer(
            node, "pids_limit", "build.pids_limit", minimum=MIN_PIDS, maximum=MAX_PIDS
        )
    if "max_attempts" in node:
        c["max_attempts"] = check.integer(node, "max_attempts", "build.max_attempts", maximum=MAX_ATTEMPTS)
    if "offline" in node:
        c["offline"] = check.boolean(node, "offline", "build.offline")
    if "torch_index" in node:
        mapping = _cuda_map(check, node, "torch_index", "build.torch_index")
        for cuda in mapping:
            what = f"build.torch_index.{cuda}"
            check.url(node["torch_index"], cuda, what, schemes=INDEX_SCHEMES, besides="default")
        c["torch_index"] = mapping
    if "cache" in node:
        c["cache"] = _cache_store(check, node)
    if "cache_max" in node:
        c["cache_max"] = _size(check, node, "cache_max", "build.cache_max")
    if "glibc" in node:
        c["glibc"] = _glibc_floor(check, node)
    if "check_indexes" in node:
        c["check_indexes"] = _check_indexes(check, node)
    opts = BuildOptions(**c)
    _check_container_memory(check, node, opts)
    return opts


MAX_CHECK_INDEXES = 8


def _check_indexes(check: Checker, node: Mapping[str, Any]) -> tuple[str, ...]:
    """build.check_indexes: the simple/ URLs (file:, http:, https:) of indexes the factory published, or
    OWN_INDEX, the one this matrix publishes to (a directory: `_check_own_index`)."""
    items = check.items(node, "check_indexes", "build.check_indexes")
    if len(items) > MAX_CHECK_INDEXES:
        raise check.fail(f"build.check_indexes: at most {MAX_CHECK_INDEXES} indexes", node, "check_indexes")
    urls = []
    for i in range(len(items)):
        if items[i] == OWN_INDEX:
            urls.append(OWN_INDEX)
            continue
        url = check.url(items, i, "build.check_indexes item", schemes=INDEX_SCHEMES)
        if not url.rstrip("/").endswith("/simple"):
            raise check.fail(
                f"build.check_indexes item {url!r} is not an index's simple/ URL (the variant is added)",
                items,
                i,
            )
        urls.append(url.rstrip("/") + "/")
    return tuple(urls)


_GLIBC = re.compile(r"^2\.\d{1,3}$")

# build.glibc's words besides a version: each torch's own floor, or none declared (`factory.plan.glibcfloor`)
GLIBC_BUILDER = "builder"
GLIBC_TORCH = "torch"
# manylinux_2_5 (manylinux1) is the oldest platform tag there is
GLIBC_OLDEST = (2, 5)


def parse_glibc_floor(value: str) -> str | None:
    """build.glibc's value: "2.28" -> "2.28", "torch" -> "torch", "builder" -> None (no floor declared);
    ConfigError for anything else."""
    text = value.strip()
    if text == GLIBC_BUILDER:
        return None
    if text == GLIBC_TORCH:
        return GLIBC_TORCH
    parsed = parse_glibc(text) if text.count(".") == 1 else None
    if parsed is None or parsed[0] != 2 or parsed < GLIBC_OLDEST:
        raise ConfigError(
            f'{value!r} is not a glibc version like 2.28 (2.5 or newer; quote it: "2.30" is not 2.3), '
            f"{GLIBC_TORCH} or {GLIBC_BUILDER}"
        )
    return f"{parsed[0]}.{parsed[1]}"


def _glibc_floor(check: Checker, node: Mapping[str, Any]) -> str | None:
    """build.glibc: a glibc version ("2.28"; YAML may read 2.28 as a number), `torch` or `builder`."""
    value = node["glibc"]
    if isinstance(value, float | int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise check.fail(
            f'build.glibc must be a glibc version like "2.28", torch or builder, not {kind(value)} {value!r}',
            node,
            "glibc",
        )
    try:
        return parse_glibc_floor(value)
    except ConfigError as exc:
        raise check.fail(f"build.glibc: {exc}", node, "glibc") from None


def _cache_store(check: Checker, node: Mapping[str, Any]) -> bool | str:
    """build.cache: true, false, or the store the compile cache is synced with (like publish.to)."""
    value = node["cache"]
    if isinstance(value, bool):
        return value
    if not isinstance(value, str) or not value.strip():
        raise check.fail(
            "build.cache must be true, false, s3://bucket/prefix or a directory, "
            f"not {kind(value)} {value!r}",
            node,
            "cache",
        )
    try:
        storeurl.parse(value, what="build.cache")
    except ConfigError as exc:
        raise check.fail(str(exc), node, "cache") from None
    return value


def _check_container_memory(check: Checker, node: Mapping[str, Any], opts: BuildOptions) -> None:
    """What the file says alone must fit (`memory` x `concurrency` within `memory_budget`), and without a
    `memory` each of `concurrency` containers gets at least MIN_CONTAINER_MEMORY of the budget (by default
    this host's: 1000 containers on a 24 GiB host would get 18 MiB each). A `memory` with no budget is
    checked against the host by the build, not here, so a file for a larger machine still passes --check;
    so is the default concurrency of 1."""
    if opts.memory_budget is None and (opts.memory is not None or "concurrency" not in node):
        return
    try:
        limits = container_limits(
            budget_bytes=opts.memory_budget, concurrency=opts.concurrency, per_job_bytes=opts.memory
        )
    except ConfigError as exc:
        raise check.fail(
            f"build: {exc}", node, "concurrency" if "concurrency" in node else "memory"
        ) from None
    if limits[0] < MIN_CONTAINER_MEMORY:
        budget = "build.memory_budget" if opts.memory_budget else "3/4 of this host's memory"
        raise check.fail(
            f"build.concurrency {opts.concurrency} leaves each container {format_size(limits[0])} of "
            f"{budget}, below {format_size(MIN_CONTAINER_MEMORY)}; lower the concurrency",
            node,
            "concurrency",
        )


def _cuda_map(check: Checker, node: Mapping[str, Any], key: str, what: str) -> Mapping[str, str]:
    """A mapping of quoted CUDA versions to strings (build.images, build.torch_index)."""
    value = node[key]
    if not isinstance(value, Mapping):
        raise check.fail(
            f"{what} must be a mapping of CUDA version to a string, not {kind(value)}", node, key
        )
    out: dict[str, str] = {}
    for cuda in value:
        if not isinstance(cuda, str):
            written = check.doc.key_text(value, cuda) or str(cuda)
            raise check.fail(
                f'{what}: CUDA version {cuda} must be a quoted string (write "{written}")',
                value,
                cuda,
                at_key=True,
            )
        if not CUDA_VERSION.fullmatch(cuda):
            raise check.fail(f"{what}: {cuda!r} is not a CUDA version like 12.8", value, cuda, at_key=True)
        out[cuda] = check.string(value, cuda, f"{what}.{cuda}")
    return frozen_mapping(out)


def _size(check: Checker, node: Any, key: object, what: str) -> int:
    value = node[key]
    if isinstance(value, float) or not isinstance(value, str | int):
        raise check.fail(f"{what} must be a size like 16GiB, not {kind(value)} {value!r}", node, key)
    try:
        size = parse_size(value)
    except ValueError as exc:
        raise check.fail(f"{what}: {exc}", node, key) from None
    if size > MAX_SIZE:
        raise check.fail(f"{what} {value} is above {format_size(MAX_SIZE)}", node, key)
    return size


# ----------------------------------------------------------------------------------------------------
# publish:


def _publish(check: Checker, root: Mapping[str, Any]) -> PublishOptions:
    """publish: a destination the stores can open (by its spelling) and an S3 endpoint only with s3://."""
    if "publish" not in root or root["publish"] is None:
        return PublishOptions()
    node = check.mapping(root, "publish", "publish")
    check.keys(node, ("to", "endpoint_url", "variants"), "publish")
    c: dict[str, Any] = {}
    if "to" in node:
        c["to"] = check.string(node, "to", "publish.to")
        try:
            to = storeurl.parse(c["to"], what="publish.to")
        except ConfigError as exc:
            raise check.fail(str(exc), node, "to") from None
        # like factory.publish.stores.open_store, which is where a relative one is resolved (against the cwd)
        local = None if to.is_s3 else Path(c["to"]).expanduser()
        if local is not None and local.exists() and not local.is_dir():
            raise check.fail(f"publish.to {c['to']!r} exists and is not a directory", node, "to")
    if "endpoint_url" in node:
        c["endpoint_url"] = check.string(node, "endpoint_url", "publish.endpoint_url")
        try:
            storeurl.check_endpoint_url(c["endpoint_url"], what="publish.endpoint_url")
        except ConfigError as exc:
            raise check.fail(str(exc), node, "endpoint_url") from None
    if "variants" in node:
        c["variants"] = check.boolean(node, "variants", "publish.variants")
    opts = PublishOptions(**c)
    if opts.endpoint_url and not storeurl.parse(opts.to, what="publish.to").is_s3:
        raise check.fail("publish.endpoint_url only applies to an s3:// destination", node, "endpoint_url")
    return opts


# ----------------------------------------------------------------------------------------------------
# compat:


def _compat(check: Checker, root: Mapping[str, Any]) -> CompatData:
    """compat: additions to the shipped compatibility data, in its own shape."""
    if "compat" not in root or root["compat"] is None:
        return CompatData.load()
    node = check.mapping(root, "compat", "compat")
    check.keys(node, TOP_KEYS, "compat")
    out: dict[str, Any] = {}
    if "cuda_versions" in node:
        listed = check.items(node, "cuda_versions", "compat.cuda_versions")
        vals = [
            check.pattern(listed, i, "compat.cuda_versions item", CUDA_VERSION, "12.8")
            for i in range(len(listed))
        ]
        out["cuda_versions"] = sorted(
            set(vals) | set(CompatData.load().data.get("cuda_versions", [])), key=_vkey
        )
    if "archs" in node:
        archs = check.mapping(node, "archs", "compat.archs")
        out["archs"] = {}
        for arch in archs:
            a = str(arch)
            try:
                arch_key(a)
            except ValueError:
                raise check.fail(
                    f"compat.archs: {arch!r} is not an arch like 10.0", archs, arch, at_key=True
                ) from None
            r = check.mapping(archs, arch, f"compat.archs.{a}")
            check.keys(r, ARCH_KEYS, f"compat.archs.{a}")
            out["archs"][a] = {
                k: check.pattern(r, k, f"compat.archs.{a}.{k}", CUDA_VERSION, "12.8")
                if k != "why"
                else check.string(r, k, "why")
                for k in r
            }
    if "torch" in node:
        torches = check.mapping(node, "torch", "compat.torch")
        out["torch"] = {}
        for tv in torches:
            if not isinstance(tv, str) or not _TORCH_MINOR.fullmatch(tv):
                raise check.fail(
                    f'compat.torch: {tv!r} must be a quoted torch minor version like "2.10"',
                    torches,
                    tv,
                    at_key=True,
                )
            e = check.mapping(torches, tv, f"compat.torch.{tv}")
            check.keys(e, TORCH_KEYS, f"compat.torch.{tv}")
            d: dict[str, Any] = {}
            for k in e:
                w = f"compat.torch.{tv}.{k}"
                if k == "cuda":
                    d[k] = [
                        check.pattern(e[k], i, w, CUDA_VERSION, "12.8")
                        for i in range(len(check.items(e, k, w)))
                    ]
                elif k == "python":
                    d[k] = [
                        check.pattern(e[k], i, w, _PYTHON, "3.11") for i in range(len(check.items(e, k, w)))
                    ]
                elif k == "cxx11_abi":
                    d[k] = [check.boolean(e[k], i, w) for i in range(len(check.items(e, k, w)))]
                elif k == "default_cuda":
                    d[k] = check.pattern(e, k, w, CUDA_VERSION, "12.8")
                elif k == "complete":
                    d[k] = check.boolean(e, k, w)
                elif k == "cxx_std":
                    d[k] = _cxx_std(check, e, k, w)
                elif k == "glibc":
                    d[k] = check.pattern(e, k, w, _GLIBC, "2.28")
                else:
                    d[k] = str(e[k]) if isinstance(e[k], int) else check.string(e, k, w)
            out["torch"][tv] = d
    if "recipes" in node:
        # min_arch is checked against the archs known with this file's additions
        known = CompatData.load(out).known_archs
        recipes = check.mapping(node, "recipes", "compat.recipes")
        out["recipes"] = {}
        for name in recipes:
            w = f"compat.recipes.{name}"
            r = check.mapping(recipes, name, w)
            check.keys(r, RECIPE_KEYS, w)
            out["recipes"][str(name)] = {
                k: _single_arch(check, r, k, f"{w}.{k}", known)
                if k == "min_arch"
                else _cxx_std(check, r, k, f"{w}.{k}")
                for k in r
            }
    return CompatData.load(out)


def _vkey(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split(".")) if re.fullmatch(r"\d+(\.\d+)*", v) else (0,)


# ----------------------------------------------------------------------------------------------------
# Arch values, in matrix: and recipe:


def _arch(check: Checker, node: Any, key: object, what: str, known: Sequence[str]) -> str:
    """A quoted arch set ("8.0;9.0") of archs the compat data knows, canonicalised."""
    value = node[key]
    if isinstance(value, int | float) and not isinstance(value, bool):
        written = check.doc.source_text(node, key) or str(value)
        raise check.fail(f'{what} {value} must be a quoted string (write "{written}")', node, key)
    text = check.string(node, key, what)
    try:
        archs = parse_arch_set(text)
    except ValueError as exc:
        raise check.fail(f"{what} {text!r}: {exc}", node, key) from None
    for a in archs:
        if a not in known:
            raise check.fail(
                f"{what} {text!r}: unknown arch {a!r} (known: {', '.join(known)})",
                node,
                key,
            )
    return ";".join(archs)


def _single_arch(check: Checker, node: Any, key: object, what: str, known: Sequence[str]) -> str:
    value = _arch(check, node, key, what, known)
    if ";" in value:
        raise check.fail(f"{what} must be one arch, not the set {value!r}", node, key)
    return value
