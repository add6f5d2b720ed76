"""A wheel's provenance: `<dist-info>/factory-provenance.json`, its one format (compose, parse, check).

What built the wheel, as a pure function of the job's inputs (`BuildFacts`): the source (the sdist's name and
sha256, a git commit, a path source's tree digest) and every patch with its sha256, the recipe and its
digest, the builder image's content identity, the toolkit, host compiler and Python, the torch it was built
against, each build requirement's wheel with its sha256, the factory's version, the job (its variant and
the environment that changed the build). Nothing that differs between two builds of one job is in it: no
time, host, container, `$FACTORY_HOME` path, docker image id, nor the compile cache's setting or hit
count, which by design change no byte of the build (report.json and the build record beside a published
wheel, `factory.wheel.record`, have those), so it does not stand in the way of a byte-identical rebuild.

Its `rebuild` section is a one-job matrix document (JSON, which `factory build --matrix` reads as YAML)
that builds this job again, and what such a rebuild needs beside it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from factory.core import strictjson
from factory.core.errors import CheckError

FORMAT = 1
FILE_NAME = "factory-provenance.json"
SBOM_DIR = "sboms"  # PEP 770: <dist-info>/sboms/
MAX_BYTES = 1 << 20  # a provenance file, read from a wheel nobody here made


def _frozen(mapping: Mapping[str, str] | None = None) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True, kw_only=True)
class SourceFacts:
    """Where the built code came from."""

    kind: str  # pypi | git | path
    sdist: str | None = None  # pypi: the sdist's filename
    sha256: str | None = None  # pypi: the sdist's sha256
    git_url: str | None = None  # git: the repository, without credentials
    git_ref: str | None = None
    commit: str | None = None  # git: the commit checked out
    path: str | None = None  # path: the directory's name as the matrix file gives it
    tree_sha256: str | None = None  # path: the digest of the (patched) tree (`buildfacts.tree_digest`)
    patches: tuple[tuple[str, str], ...] = ()  # (file name, sha256), in the order they are applied


@dataclass(frozen=True, kw_only=True)
class RecipeFacts:
    name: str
    origin: str  # "built-in" (shipped with the factory, whose version is its version) or "matrix file"
    sha256: str  # of its fields, each patch by its sha256 (`buildfacts.recipe_digest`)
    document: str | Mapping[str, Any]  # what a matrix file's `recipe:` says to get it again


@dataclass(frozen=True, kw_only=True)
class BuildFacts:
    """Everything the provenance says, as the host knows it once the build has handed back its wheel."""

    package: str
    version: str  # the wheel's, with the local label
    job_id: str
    python: str
    covers: tuple[str, ...] = ()
    limited_api: str | None = None
    cuda: str
    torch: str  # the matrix's torch ("2.14")
    torch_version: str  # the torch the build ran with ("2.14.1")
    cxx11_abi: bool
    archs: tuple[str, ...]
    cxx_std: str | None = None
    env: Mapping[str, str] = field(default_factory=_frozen)  # the recipe's env for the job, then the job's
    flavor: str
    source: SourceFacts
    recipe: RecipeFacts
    # the builder image's content identity (`buildfacts.image_identity`)
    image: Mapping[str, str] = field(default_factory=_frozen)
    toolkit: str | None = None  # the CUDA release of the image's nvcc
    nvcc: str = ""  # nvcc's full release, as the build reported it
    cxx: str = ""  # the host compiler's first `--version` line
    build_requirements: tuple[tuple[str, str], ...] = ()  # (wheel file name, sha256) of the wheelhouse
    factory_version: str
    rebuild: Mapping[str, Any] = field(default_factory=_frozen)  # a one-job matrix document
    rebuild_needs: tuple[str, ...] = ()  # what a rebuild needs beside that document
    sbom: str = ""  # the SBOM's path in the .dist-info


def compose(facts: BuildFacts) -> dict[str, Any]:
    """The provenance document of `facts`: plain JSON values, the same for the same facts."""
    src = facts.source
    source: dict[str, Any] = {"kind": src.kind, "patches": [{"name": n, "sha256": h} for n, h in src.patches]}
    if src.kind == "pypi":
        source["sdist"] = {"filename": src.sdist, "sha256": src.sha256}
    elif src.kind == "git":
        source["git"] = {"url": src.git_url, "ref": src.git_ref, "commit": src.commit}
    else:
        source["path"] = {"name": src.path, "tree_sha256": src.tree_sha256}
    return {
        "format": FORMAT,
        "factory": {"version": facts.factory_version},
        "wheel": {"name": facts.package, "version": facts.version, "sbom": facts.sbom},
        "job": {
            "id": facts.job_id,
            "python": facts.python,
            "covers": list(facts.covers),
            "limited_api": facts.limited_api,
            "variant": {
                "cuda": facts.cuda,
                "torch": facts.torch,
                "cxx11_abi": facts.cxx11_abi,
                "archs": list(facts.archs),
            },
            "cxx_std": facts.cxx_std,
            "env": dict(sorted(facts.env.items())),
            "flavor": facts.flavor,
        },
        "source": source,
        "recipe": {
            "name": facts.recipe.name,
            "origin": facts.recipe.origin,
            "sha256": facts.recipe.sha256,
            "factory_version": facts.factory_version,
        },
        "image": dict(sorted(facts.image.items())),
        "toolchain": {
            "toolkit": facts.toolkit,
            "nvcc": facts.nvcc,
            "cxx": facts.cxx,
            "python": facts.python,
        },
        "torch": {"version": facts.torch_version},
        "build_requirements": [{"filename": n, "sha256": h} for n, h in sorted(facts.build_requirements)],
        "rebuild": {
            "job": facts.job_id,
            "matrix": _plain(facts.rebuild),
            "needs": list(facts.rebuild_needs),
        },
    }


def _plain(value: Any) -> Any:
    """Mappings and tuples as JSON's own types (frozen mappings are not JSON-serialisable)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def dumps(document: Mapping[str, Any]) -> bytes:
    """The file's bytes: sorted keys, two-space indent, ASCII, one final newline; stable for stable input."""
    text = json.dumps(document, sort_keys=True, indent=2, ensure_ascii=True, allow_nan=False)
    return (text + "\n").encode("ascii")


# --- parsing -----------------------------------------------------------------------------------------------

_STR_MAP = "str-map"
_OPT_STR = (str, None)
_SHA = "sha256"
_ANY_MAP = "any-map"

# the shape of format 1: a type, a nested shape, a one-element list of an item's shape, or a marker above
_SHAPE: dict[str, Any] = {
    "format": int,
    "factory": {"version": str},
    "wheel": {"name": str, "version": str, "sbom": str},
    "job": {
        "id": str,
        "python": str,
        "covers": [str],
        "limited_api": _OPT_STR,
        "variant": {"cuda": str, "torch": str, "cxx11_abi": bool, "archs": [str]},
        "cxx_std": _OPT_STR,
        "env": _STR_MAP,
        "flavor": str,
    },
    "source": _ANY_MAP,  # by kind: checked in `_check_source`
    "recipe": {"name": str, "origin": str, "sha256": _SHA, "factory_version": str},
    "image": _STR_MAP,
    "toolchain": {"toolkit": _OPT_STR, "nvcc": str, "cxx": str, "python": str},
    "torch": {"version": str},
    "build_requirements": [{"filename": str, "sha256": _SHA}],
    "rebuild": {"job": str, "matrix": _ANY_MAP, "needs": [str]},  # matrix: `rebuild_matrix_problem`
}
_SOURCE_SHAPES: dict[str, dict[str, Any]] = {
    "pypi": {"sdist": {"filename": str, "sha256": _SHA}},
    "git": {"git": {"url": str, "ref": str, "commit": _OPT_STR}},
    "path": {"path": {"name": str, "tree_sha256": _SHA}},
}


def _is_sha256(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _leaf_problem(value: Any, shape: Any, where: str) -> str | None:
    """This format's own kinds of value (`strictjson.shape_problem`'s leaves)."""
    if shape == _STR_MAP:
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            return f"{where} must be a mapping of strings"
        return None
    if shape == _ANY_MAP:
        return None if isinstance(value, dict) else f"{where} must be a mapping"
    if shape == _SHA:
        return None if _is_sha256(value) else f"{where} must be a sha256 (64 lowercase hex digits)"
    if shape == _EITHER:
        return None
    if shape == _NUMBER:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        return None if ok else f"{where} must be a number"
    if shape == _NUMBER_MAP:
        if not isinstance(value, dict):
            return f"{where} must be a mapping of numbers"
        return next((p for k, v in value.items() if (p := _leaf_problem(v, _NUMBER, f"{where}.{k}"))), None)
    raise TypeError(f"{where}: no such shape {shape!r}")


def _shape_problem(value: Any, shape: Any, where: str) -> str | None:
    """The first way `value` is not of `shape`, naming its path; None when it is."""
    return strictjson.shape_problem(value, shape, where, leaf=_leaf_problem)


def parse(data: bytes, *, where: str = FILE_NAME) -> dict[str, Any]:
    """A provenance file's document, checked against its format; anything else is a CheckError of one line
    naming `where` (too large, not UTF-8 JSON, another format, a value of the wrong type)."""
    if len(data) > MAX_BYTES:
        raise CheckError(f"{where}: {len(data)} bytes, over the {MAX_BYTES >> 20} MiB provenance may have")
    try:
        document = strictjson.loads(data)
    except strictjson.StrictJSONError as exc:
        raise CheckError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(document, dict):
        raise CheckError(f"{where}: must be a JSON object, not {type(document).__name__}")
    fmt = document.get("format")
    if fmt != FORMAT or isinstance(fmt, bool):
        raise CheckError(f"{where}: format {fmt!r} is not {FORMAT}, the one this factory reads")
    problem = (
        _shape_problem(document, _SHAPE, "provenance")
        or _source_problem(document["source"])
        or rebuild_matrix_problem(document["rebuild"]["matrix"])
    )
    if problem:
        raise CheckError(f"{where}: {problem}")
    return document


# --- the rebuild section's matrix document ------------------------------------------------------------------

# What `buildfacts.rebuild_matrix` writes, and nothing else: a wheel from anywhere carries this document and
# `factory rebuild` builds from it, so a key the factory does not write (build.offline, publish,
# compat, a recipe's base, a package's fetch bounds) is refused, not read. A key ending in "?" may be left
# out. Its values are the matrix loader's to check (`config`), and what a rebuild may use of them (source,
# patches, images, indexes) is `rebuild.plan_rebuild`'s.
_NUMBER = "number"
_NUMBER_MAP = "number-map"
_EITHER = "either"  # checked by `rebuild_matrix_problem`
_RECIPE_DOCUMENT: dict[str, Any] = {
    # `buildfacts.recipe_document`: each field of `options.Recipe` but the package and versions it is for
    "name": str,
    "arch_env?": str,
    "arch_format?": str,
    "local_version_env?": str,
    "env?": _STR_MAP,
    "patches?": [str],
    "import_name?": str,
    "min_arch?": str,
    "compile_gib_per_arch?": _NUMBER,
    "compile_gib_by_file?": _NUMBER_MAP,
    "compile_after_peak?": _NUMBER,
    "compile_seconds_by_file?": _NUMBER_MAP,
    "extra_build_requires?": [str],
    "cxx_std?": str,
    "py_limited_api?": str,
    "stable_abi?": str,
    "host_only_libraries?": [str],
    "extra_requires?": [str],
}
_REBUILD_MATRIX: dict[str, Any] = {
    "package": {"name": str, "version": str, "source": _EITHER, "sha256?": _SHA},
    "recipe": _EITHER,  # a built-in recipe's name, or `_RECIPE_DOCUMENT`
    "matrix": {
        "cuda": [str],
        "torch": [str],
        "python": [str],
        "cxx11_abi": [bool],
        "arch": [str],
        "include?": [{"cuda": str, "env": _STR_MAP}],
    },
    "build": {
        "flavor": str,
        "cache": bool,
        "torch_index?": _STR_MAP,
        "images?": _STR_MAP,
        "base_image?": str,
        "glibc?": str,
    },
}
_REBUILD_SOURCES: dict[str, dict[str, Any]] = {"git": {"git": str, "ref": str}, "path": {"path": str}}


def _exact_problem(value: Any, shape: Any, where: str) -> str | None:
    """`_shape_problem` of a document that must hold no key its shape does not name; a key ending in "?" in
    the shape may be left out."""
    return strictjson.shape_problem(
        value, shape, where, leaf=_leaf_problem, closed="is not a key the factory writes there"
    )


def rebuild_matrix_problem(matrix: Any, where: str = "provenance.rebuild.matrix") -> str | None:
    """The first way the rebuild section's matrix document is not one the factory writes (a key it does not
    write, a value of another type), naming its path; None when it is one."""
    problem = _exact_problem(matrix, _REBUILD_MATRIX, where)
    if problem:
        return problem
    source, recipe = matrix["package"]["source"], matrix["recipe"]
    if source != "pypi":
        kind = next((k for k in _REBUILD_SOURCES if isinstance(source, dict) and k in source), None)
        if kind is None:
            return f"{where}.package.source must be pypi, {{git: URL, ref: COMMIT}} or {{path: NAME}}"
        problem = _exact_problem(source, _REBUILD_SOURCES[kind], f"{where}.package.source")
        if problem:
            return problem
    if not isinstance(recipe, str):
        return _exact_problem(recipe, _RECIPE_DOCUMENT, f"{where}.recipe")
    return None


def _source_problem(source: dict[str, Any]) -> str | None:
    kind = source.get("kind")
    if not isinstance(kind, str) or kind not in _SOURCE_SHAPES:
        return f"provenance.source.kind {kind!r} is not one of {', '.join(_SOURCE_SHAPES)}"
    shape = {"patches": [{"name": str, "sha256": _SHA}], **_SOURCE_SHAPES[kind]}
    return _shape_problem(source, shape, "provenance.source")


# --- checking against a job --------------------------------------------------------------------------------

# what must agree with the job, in the order a mismatch is reported
CHECKED: tuple[tuple[str, ...], ...] = (
    ("job", "id"),
    ("wheel", "name"),
    ("wheel", "version"),
    ("source",),
    ("recipe", "sha256"),
    ("torch", "version"),
    ("job", "variant", "archs"),
    ("job", "variant", "cuda"),
    ("job", "cxx_std"),
    ("job", "env"),
)


def _at(document: Mapping[str, Any], path: Sequence[str]) -> Any:
    value: Any = document
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def first_difference(found: Any, expected: Any, where: str = "provenance") -> str | None:
    """The path of the first place two documents differ (keys in sorted order); None when they agree."""
    if isinstance(found, dict) and isinstance(expected, dict):
        for key in sorted(set(found) | set(expected)):
            if key not in found or key not in expected:
                return f"{where}.{key}"
            inner = first_difference(found[key], expected[key], f"{where}.{key}")
            if inner:
                return inner
        return None
    if isinstance(found, list) and isinstance(expected, list) and len(found) == len(expected):
        for i, (a, b) in enumerate(zip(found, expected, strict=True)):
            inner = first_difference(a, b, f"{where}[{i}]")
            if inner:
                return inner
        return None
    same = type(found) is type(expected) and found == expected
    return None if same and not (isinstance(found, float) and math.isnan(found)) else where


def mismatches(found: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    """Where a wheel's provenance disagrees with the job's, one line each: the fields a reader checks
    first (the job, the source, the recipe, torch, the archs), then the first other difference."""
    problems = []
    for path in CHECKED:
        a, b = _at(found, path), _at(expected, path)
        if first_difference(a, b) is not None:
            name = ".".join(path)
            problems.append(f"provenance: {name} is {_short(a)}, the job's is {_short(b)}")
    if not problems:
        other = first_difference(dict(found), dict(expected))
        if other is not None:
            problems.append(f"provenance: {other} differs from the job's")
    return problems
