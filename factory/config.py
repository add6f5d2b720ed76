"""matrix.yaml: frozen option dataclasses and the loader that validates every value with its line number.

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
from typing import Any, Literal

from packaging.utils import InvalidName, canonicalize_name
from packaging.version import InvalidVersion, Version

from factory.compat import ARCH_KEYS, RECIPE_KEYS, TOP_KEYS, TORCH_KEYS, CompatData
from factory.errors import ConfigError
from factory.imageref import NOT_AN_IMAGE, is_image_reference
from factory.urls import HTTP_SCHEMES, INDEX_SCHEMES, checked_url
from factory.variants import arch_key, parse_arch_set
from factory.yamlload import YamlDoc, load_yaml

AXES: tuple[str, ...] = ("cuda", "torch", "python", "cxx11_abi", "arch")
PYTORCH_INDEX = "https://download.pytorch.org/whl/cu{tag}"

_CUDA = re.compile(r"^\d{1,2}\.\d{1,2}$")
# what git check-ref-format allows in practice for a tag, a branch or a commit: no leading "-" or "/"
_GIT_REF = re.compile(r"^[\w.+][\w./+-]*$")
_TORCH = re.compile(r"^\d+\.\d+(\.\d+)?$")
_PYTHON = re.compile(r"^3\.\d{1,2}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)(B?)\s*$", re.IGNORECASE)


def _frozen(mapping: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


# ----------------------------------------------------------------------------------------------------
# The shared types


@dataclass(frozen=True, kw_only=True)
class Source:
    kind: Literal["pypi", "git", "path"] = "pypi"
    url: str | None = None
    ref: str | None = None
    path: Path | None = None


@dataclass(frozen=True, kw_only=True)
class PackageSpec:
    name: str
    version: str
    source: Source = field(default_factory=Source)

    @property
    def canonical_name(self) -> str:
        return canonicalize_name(self.name)


@dataclass(frozen=True, kw_only=True)
class Recipe:
    name: str
    arch_env: str = "TORCH_CUDA_ARCH_LIST"
    arch_format: Literal["flash-attn", "torch"] = "torch"
    local_version_env: str | None = None
    env: Mapping[str, str] = field(default_factory=_frozen)
    patches: tuple[Path, ...] = ()
    import_name: str = ""
    min_arch: str | None = None
    compile_gib_per_arch: float = 4.0
    # Per-file estimates, (glob on the source file's base name, GiB per arch per nvcc thread) in order: the
    # first match wins, files matching none take compile_gib_per_arch. Kernel files of one package differ by
    # nearly 2x (flash-attn: forward 3.7, backward 6.6 GiB), so one worst-case figure starves a first build.
    compile_gib_by_file: tuple[tuple[str, float], ...] = ()
    # After its peak, a compile holds at most this fraction of it (flash-attn: cicc's RSS climbs to the peak
    # in the first 10-25% of the compile, then falls to a third of it), so an unprofiled compile seen past its
    # peak no longer needs its whole estimate reserved; None: it keeps it to the end.
    compile_after_peak: float | None = None
    # How long each file takes to compile, (glob on the base name, seconds of one arch on any one machine) in
    # order: a first build, which has no profile, starts the longest first (flash-attn's split-KV files take
    # twice its shortest forward files; last in setup.py's order, they would end the build alone). Only their
    # ratios count: the wrapper scales them to the build's own measured compiles.
    compile_seconds_by_file: tuple[tuple[str, float], ...] = ()
    # Packages the build needs beyond torch (installed into the build env from the wheelhouse).
    extra_build_requires: tuple[str, ...] = ("setuptools", "wheel", "ninja", "packaging")
    # The C++ standard the package compiles as, when it hard-codes one (flash-attn 2.x: "17"); None: torch's.
    cxx_std: str | None = None


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    memory: int | None = None
    memory_budget: int | None = None
    cpus: float | None = None
    concurrency: int = 1
    flavor: Literal["devel", "pypi", "manylinux"] = "devel"
    # None: for the pypi flavor, the factory base whose Debian suite ships each job's Python
    base_image: str | None = None
    images: Mapping[str, str] = field(default_factory=_frozen)
    pids_limit: int = 4096
    max_attempts: int = 3
    offline: bool = True
    # CUDA version -> index URL for torch, or "default" for the host's pip configuration.
    torch_index: Mapping[str, str] = field(default_factory=_frozen)

    def torch_index_url(self, cuda: str) -> str | None:
        """Where torch for `cuda` comes from: a URL, or None meaning the host's own pip configuration."""
        value = self.torch_index.get(cuda)
        if value is None:
            return PYTORCH_INDEX.format(tag=cuda.replace(".", ""))
        return None if value == "default" else value


@dataclass(frozen=True, kw_only=True)
class PublishOptions:
    to: str = "./index"
    endpoint_url: str | None = None


@dataclass(frozen=True, kw_only=True)
class MatrixEntry:
    """One include or exclude entry: validated values (arch canonicalised) and where it was written."""

    values: Mapping[str, object]
    line: int | None = None


@dataclass(frozen=True, kw_only=True)
class MatrixSpec:
    axes: Mapping[str, tuple[object, ...]] = field(default_factory=_frozen)
    include: tuple[MatrixEntry, ...] = ()
    exclude: tuple[MatrixEntry, ...] = ()
    line: int | None = None


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


# ----------------------------------------------------------------------------------------------------
# Small public helpers


def parse_size(value: str | int) -> int:
    """ "16GiB", "16G", "512M", "1.5GiB", 17179869184 -> bytes. K/M/G/T are binary; "GB"/"MB" are decimal."""
    if isinstance(value, bool):
        raise ValueError(f"size {value!r} is not a size like 16GiB")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"size {value} must be positive")
        return value
    match = _SIZE.match(str(value))
    if match is None:
        raise ValueError(f"size {value!r} is not a size like 16GiB, 512MiB or a byte count")
    number, unit, binary, byte = match.groups()
    power = "KMGT".find(unit.upper()) + 1 if unit else 0
    base = 1000 if (unit and byte and not binary) else 1024
    size = int(float(number) * base**power)
    if size <= 0:
        raise ValueError(f"size {value!r} must be positive")
    return size


def format_size(n: int) -> str:
    """Bytes for people: 8224690176 -> "7.7 GiB", 734003200 -> "700 MiB"."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def canonical_arch(value: str) -> str:
    """ "9.0;8.0" -> "8.0;9.0" (syntax only; known-ness is checked against compat data by the loader)."""
    return ";".join(parse_arch_set(value))


# ----------------------------------------------------------------------------------------------------
# The loader


class _Loader:
    def __init__(self, doc: YamlDoc) -> None:
        self.doc = doc
        self.base_dir = doc.path.resolve().parent

    # -- generic checks

    def fail(
        self, message: str, node: Any = None, key: object = None, *, at_key: bool = False
    ) -> ConfigError:
        if node is None:
            return self.doc.error(message, None)
        line = self.doc.key_line(node, key) if at_key else self.doc.line_of(node, key)
        if line is None:
            line = self.doc.line_of(node)
        return self.doc.error(message, line)

    def mapping(self, parent: Any, key: object, what: str) -> Mapping[str, Any]:
        value = parent[key]
        if not isinstance(value, Mapping):
            raise self.fail(f"{what} must be a mapping, not {_kind(value)}", parent, key)
        return value

    def keys(self, node: Mapping[str, Any], allowed: Sequence[str], what: str) -> None:
        for key in node:
            if not isinstance(key, str):
                raise self.fail(
                    f"{what}: keys must be strings, not {_kind(key)} {key!r}", node, key, at_key=True
                )
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f" (allowed: {', '.join(allowed)})"
                raise self.fail(f"unknown key {key!r} in {what}{hint}", node, key, at_key=True)

    def string(self, node: Any, key: object, what: str, *, allow_empty: bool = False) -> str:
        value = node[key]
        if isinstance(value, bool) or not isinstance(value, str):
            if isinstance(value, int | float) and not isinstance(value, bool):
                written = self.doc.source_text(node, key) or str(value)
                raise self.fail(f'{what} {value} must be a quoted string (write "{written}")', node, key)
            raise self.fail(f"{what} must be a string, not {_kind(value)}", node, key)
        if not allow_empty and not value.strip():
            raise self.fail(f"{what} must not be empty", node, key)
        return str(value)

    def url(self, node: Any, key: object, what: str, *, schemes: tuple[str, ...], besides: str = "") -> str:
        """A URL with a host (`urls.checked_url`), or the one other word `besides` allows; a bad one is said
        without the credentials it may carry."""
        value = self.string(node, key, what)
        if besides and value == besides:
            return value
        try:
            checked_url(value, schemes=schemes, what=what)
        except ConfigError as exc:
            raise self.fail(f"{exc} (or '{besides}')" if besides else str(exc), node, key) from None
        return value

    def pattern(self, node: Any, key: object, what: str, regex: re.Pattern[str], example: str) -> str:
        value = self.string(node, key, what)
        if not regex.match(value):
            raise self.fail(f"{what} {value!r} is not a version like {example}", node, key)
        return value

    def boolean(self, node: Any, key: object, what: str) -> bool:
        value = node[key]
        if not isinstance(value, bool):
            raise self.fail(f"{what} must be true or false, not {_kind(value)} {value!r}", node, key)
        return value

    def integer(self, node: Any, key: object, what: str, *, minimum: int = 1) -> int:
        value = node[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(f"{what} must be an integer, not {_kind(value)} {value!r}", node, key)
        if value < minimum:
            raise self.fail(f"{what} must be at least {minimum}, not {value}", node, key)
        return int(value)

    def number(self, node: Any, key: object, what: str) -> float:
        value = node[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(f"{what} must be a number, not {_kind(value)} {value!r}", node, key)
        if not math.isfinite(value):  # YAML's .nan and .inf are floats too
            raise self.fail(f"{what} must be a finite number, not {value}", node, key)
        if value <= 0:
            raise self.fail(f"{what} must be positive, not {value}", node, key)
        return float(value)

    def size(self, node: Any, key: object, what: str) -> int:
        value = node[key]
        if isinstance(value, float) or not isinstance(value, str | int):
            raise self.fail(f"{what} must be a size like 16GiB, not {_kind(value)} {value!r}", node, key)
        try:
            return parse_size(value)
        except ValueError as exc:
            raise self.fail(f"{what}: {exc}", node, key) from None

    def str_list(self, node: Any, key: object, what: str) -> tuple[str, ...]:
        value = node[key]
        if not isinstance(value, list):
            raise self.fail(f"{what} must be a list, not {_kind(value)}", node, key)
        return tuple(self.string(value, i, f"{what} item") for i in range(len(value)))

    def env(self, node: Any, key: object, what: str) -> Mapping[str, str]:
        value = node[key]
        if value is None:
            return _frozen()
        if not isinstance(value, Mapping):
            raise self.fail(f"{what} must be a mapping of NAME: value, not {_kind(value)}", node, key)
        out: dict[str, str] = {}
        for name, item in value.items():
            if not isinstance(name, str) or not _ENV_NAME.match(name):
                raise self.fail(
                    f"{what}: {name!r} is not an environment variable name", value, name, at_key=True
                )
            if isinstance(item, bool):
                raise self.fail(
                    f'{what}.{name} must be a string (write "TRUE" or "1", YAML booleans are ambiguous)',
                    value,
                    name,
                )
            if isinstance(item, int | float):
                item = self.doc.source_text(value, name) or str(item)
            elif not isinstance(item, str):
                raise self.fail(f"{what}.{name} must be a string, not {_kind(item)}", value, name)
            out[name] = str(item)
        return _frozen(out)

    def env_name(self, node: Any, key: object, what: str) -> str:
        value = self.string(node, key, what)
        if not _ENV_NAME.match(value):
            raise self.fail(f"{what} {value!r} is not an environment variable name", node, key)
        return value

    def arch(self, node: Any, key: object, what: str, known: Sequence[str]) -> str:
        value = node[key]
        if isinstance(value, int | float) and not isinstance(value, bool):
            written = self.doc.source_text(node, key) or str(value)
            raise self.fail(f'{what} {value} must be a quoted string (write "{written}")', node, key)
        text = self.string(node, key, what)
        try:
            archs = parse_arch_set(text)
        except ValueError as exc:
            raise self.fail(f"{what} {text!r}: {exc}", node, key) from None
        for a in archs:
            if a not in known:
                raise self.fail(
                    f"{what} {text!r}: unknown arch {a!r} (known: {', '.join(known)})",
                    node,
                    key,
                )
        return ";".join(archs)

    def single_arch(self, node: Any, key: object, what: str, known: Sequence[str]) -> str:
        value = self.arch(node, key, what, known)
        if ";" in value:
            raise self.fail(f"{what} must be one arch, not the set {value!r}", node, key)
        return value

    def rel_path(self, node: Any, key: object, what: str, *, directory: bool) -> Path:
        text = self.string(node, key, what)
        path = Path(text).expanduser()
        if not path.is_absolute():
            path = (self.base_dir / path).resolve()
        if directory and not path.is_dir():
            raise self.fail(f"{what} {text!r}: no such directory ({path})", node, key)
        if not directory and not path.is_file():
            raise self.fail(f"{what} {text!r}: no such file ({path})", node, key)
        return path

    # -- sections

    def load(self) -> MatrixFile:
        root = self.doc.root
        if root is None:
            raise self.doc.error("the file is empty (it needs at least package: and matrix:)", 1)
        if not isinstance(root, Mapping):
            raise self.fail(f"the top level must be a mapping, not {_kind(root)}", root)
        self.keys(root, ("package", "recipe", "matrix", "build", "publish", "compat"), "the top level")
        for required in ("package", "matrix"):
            if required not in root:
                raise self.doc.error(f"missing required key {required!r} at the top level", 1)
        compat = self.compat(root)
        package = self.package(root)
        recipe = self.recipe(root, package, compat)
        matrix = self.matrix(root, compat)
        build = self.build(root)
        publish = self.publish(root)
        mf = MatrixFile(
            path=self.doc.path,
            package=package,
            recipe=recipe,
            build=build,
            publish=publish,
            matrix=matrix,
            compat=compat,
            display=self.doc.display,
        )
        self.check_complete(mf)
        return mf

    def package(self, root: Mapping[str, Any]) -> PackageSpec:
        node = self.mapping(root, "package", "package")
        self.keys(node, ("name", "version", "source"), "package")
        for required in ("name", "version"):
            if required not in node:
                raise self.fail(f"package: missing required key {required!r}", root, "package", at_key=True)
        name = self.string(node, "name", "package.name")
        try:
            canonicalize_name(name, validate=True)
        except InvalidName:
            raise self.fail(f"package.name {name!r} is not a valid distribution name", node, "name") from None
        version = self.string(node, "version", "package.version")
        try:
            parsed = Version(version)
        except InvalidVersion:
            raise self.fail(
                f"package.version {version!r} is not a PEP 440 version", node, "version"
            ) from None
        if parsed.local is not None:
            raise self.fail(
                f"package.version {version!r} must not have a local label (the factory adds its own)",
                node,
                "version",
            )
        source = self.source(node) if "source" in node else Source()
        return PackageSpec(name=name, version=version, source=source)

    def source(self, node: Mapping[str, Any]) -> Source:
        value = node["source"]
        if value is None or value == "pypi":
            return Source(kind="pypi")
        if isinstance(value, str):
            raise self.fail(
                f"package.source {value!r}: write pypi, {{git: URL, ref: REF}} or {{path: DIR}}",
                node,
                "source",
            )
        if not isinstance(value, Mapping):
            raise self.fail(f"package.source must be pypi or a mapping, not {_kind(value)}", node, "source")
        self.keys(value, ("git", "ref", "path"), "package.source")
        if "git" in value and "path" in value:
            raise self.fail("package.source: give either git: or path:, not both", node, "source")
        if "git" in value:
            url = self.string(value, "git", "package.source.git")
            if "ref" not in value:
                raise self.fail(
                    "package.source.git needs a ref: (a tag or commit) so builds are reproducible",
                    value,
                    "git",
                )
            if url.startswith("-"):
                raise self.fail(f"package.source.git {url!r} is not a repository URL", value, "git")
            ref = self.string(value, "ref", "package.source.ref")
            if not _GIT_REF.match(ref) or ".." in ref:
                raise self.fail(f"package.source.ref {ref!r} is not a tag, branch or commit", value, "ref")
            return Source(kind="git", url=url, ref=ref)
        if "path" in value:
            if "ref" in value:
                raise self.fail("package.source.ref only goes with git:", value, "ref", at_key=True)
            return Source(
                kind="path", path=self.rel_path(value, "path", "package.source.path", directory=True)
            )
        raise self.fail("package.source needs git: or path:", node, "source")

    def recipe(self, root: Mapping[str, Any], package: PackageSpec, compat: CompatData) -> Recipe:
        from factory.recipes import BUILTIN_RECIPES, default_recipe_for

        if "recipe" not in root:
            return default_recipe_for(package)
        value = root["recipe"]
        if isinstance(value, str):
            if value not in BUILTIN_RECIPES:
                raise self.fail(
                    f"unknown recipe {value!r} (built in: {', '.join(BUILTIN_RECIPES)}; or a mapping)",
                    root,
                    "recipe",
                )
            return _with_import_name(BUILTIN_RECIPES[value], package)
        if not isinstance(value, Mapping):
            raise self.fail(f"recipe must be a name or a mapping, not {_kind(value)}", root, "recipe")
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
        )
        self.keys(value, allowed, "recipe")
        if "name" not in value:
            raise self.fail("recipe: missing required key 'name'", root, "recipe", at_key=True)
        name = self.string(value, "name", "recipe.name")
        base = Recipe(name=name)
        if "base" in value:
            base_name = self.string(value, "base", "recipe.base")
            if base_name not in BUILTIN_RECIPES:
                raise self.fail(
                    f"recipe.base {base_name!r} is not a built-in recipe ({', '.join(BUILTIN_RECIPES)})",
                    value,
                    "base",
                )
            base = replace(BUILTIN_RECIPES[base_name], name=name)
        changes: dict[str, Any] = {}
        if "arch_env" in value:
            changes["arch_env"] = self.env_name(value, "arch_env", "recipe.arch_env")
        if "arch_format" in value:
            fmt = self.string(value, "arch_format", "recipe.arch_format")
            if fmt not in ("flash-attn", "torch"):
                raise self.fail(
                    f"recipe.arch_format {fmt!r} must be 'flash-attn' (80;90) or 'torch' (8.0;9.0)",
                    value,
                    "arch_format",
                )
            changes["arch_format"] = fmt
        if "local_version_env" in value:
            if value["local_version_env"] is None:
                changes["local_version_env"] = None
            else:
                changes["local_version_env"] = self.env_name(
                    value, "local_version_env", "recipe.local_version_env"
                )
        if "env" in value:
            changes["env"] = _frozen({**base.env, **self.env(value, "env", "recipe.env")})
        if "patches" in value:
            patches = value["patches"]
            if not isinstance(patches, list):
                raise self.fail(
                    f"recipe.patches must be a list of files, not {_kind(patches)}", value, "patches"
                )
            changes["patches"] = tuple(
                self.rel_path(patches, i, "recipe.patches item", directory=False) for i in range(len(patches))
            )
        if "import_name" in value:
            imp = self.string(value, "import_name", "recipe.import_name")
            if not all(part.isidentifier() for part in imp.split(".")):
                raise self.fail(
                    f"recipe.import_name {imp!r} is not a Python module name", value, "import_name"
                )
            changes["import_name"] = imp
        if "min_arch" in value:
            changes["min_arch"] = self.single_arch(value, "min_arch", "recipe.min_arch", compat.known_archs)
        if "compile_gib_per_arch" in value:
            changes["compile_gib_per_arch"] = self.number(
                value, "compile_gib_per_arch", "recipe.compile_gib_per_arch"
            )
        if "compile_gib_by_file" in value:
            changes["compile_gib_by_file"] = self.by_file(value, "compile_gib_by_file")
        if "compile_after_peak" in value:
            after = value["compile_after_peak"]
            if after is not None:
                after = self.number(value, "compile_after_peak", "recipe.compile_after_peak")
                if after > 1:
                    raise self.fail(
                        f"recipe.compile_after_peak is a fraction of the peak, at most 1, not {after:g}",
                        value,
                        "compile_after_peak",
                    )
            changes["compile_after_peak"] = after
        if "compile_seconds_by_file" in value:
            changes["compile_seconds_by_file"] = self.by_file(value, "compile_seconds_by_file")
        if "extra_build_requires" in value:
            changes["extra_build_requires"] = self.str_list(
                value, "extra_build_requires", "recipe.extra_build_requires"
            )
        if "cxx_std" in value:
            std = value["cxx_std"]
            if isinstance(std, int) and not isinstance(std, bool):
                std = str(std)
            elif std is not None:
                std = self.string(value, "cxx_std", "recipe.cxx_std")
            if std is not None and std not in ("14", "17", "20", "23"):
                raise self.fail(f"recipe.cxx_std {std!r} must be one of 14, 17, 20, 23", value, "cxx_std")
            changes["cxx_std"] = std
        return _with_import_name(replace(base, **changes), package)

    def by_file(self, node: Mapping[str, Any], key: str) -> tuple[tuple[str, float], ...]:
        """Ordered glob -> number table (GiB, seconds); it replaces the base recipe's table (an empty mapping
        clears it)."""
        what = f"recipe.{key}"
        table = self.mapping(node, key, what)
        out: list[tuple[str, float]] = []
        for pattern in table:
            if not isinstance(pattern, str) or not pattern.strip():
                raise self.fail(
                    f"{what}: a pattern must be a non-empty string (a glob on the file name), "
                    f"not {_kind(pattern)} {pattern!r}",
                    table,
                    pattern,
                    at_key=True,
                )
            if "/" in pattern:
                raise self.fail(
                    f"{what}: pattern {pattern!r} matches base names only; drop the directory",
                    table,
                    pattern,
                    at_key=True,
                )
            out.append((str(pattern), self.number(table, pattern, f"{what}[{pattern!r}]")))
        return tuple(out)

    def matrix(self, root: Mapping[str, Any], compat: CompatData) -> MatrixSpec:
        node = self.mapping(root, "matrix", "matrix")
        known = compat.known_archs
        axes: dict[str, tuple[object, ...]] = {}
        include: tuple[MatrixEntry, ...] = ()
        exclude: tuple[MatrixEntry, ...] = ()
        self.keys(node, (*AXES, "include", "exclude"), "matrix")
        for key in node:
            if key in ("include", "exclude"):
                continue
            values = node[key]
            if not isinstance(values, list):
                raise self.fail(f"matrix.{key} must be a list, not {_kind(values)}", node, key)
            if not values:
                raise self.fail(f"matrix.{key} is empty: give at least one value", node, key)
            # Report the lossy float first: in [2.9, 2.10] the dangerous one is 2.10, which YAML read as 2.1.
            order = sorted(range(len(values)), key=lambda i: not self._lossy(values, i))
            for i in order:
                self.axis_value(values, i, key, known)
            parsed = tuple(self.axis_value(values, i, key, known) for i in range(len(values)))
            for i, item in enumerate(parsed):
                if item in parsed[:i]:
                    raise self.fail(f"matrix.{key} lists {item!r} twice", values, i)
            axes[key] = parsed
        if "exclude" in node:
            exclude = self.entries(node, "exclude", known, axes_only=True, axes=axes)
        if "include" in node:
            include = self.entries(node, "include", known, axes_only=False, axes=axes)
        if not axes and not include:
            raise self.fail("matrix has no axes and no include entries", root, "matrix", at_key=True)
        return MatrixSpec(
            axes=_frozen(axes), include=include, exclude=exclude, line=self.doc.key_line(root, "matrix")
        )

    def _lossy(self, node: Any, key: object) -> bool:
        value = node[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        return self.doc.source_text(node, key) not in (None, str(value))

    def axis_value(self, node: Any, key: object, axis: str, known: Sequence[str]) -> object:
        what = {"cuda": "cuda version", "torch": "torch version", "python": "python version"}.get(axis, axis)
        if axis == "cuda":
            return self.pattern(node, key, what, _CUDA, "12.8")
        if axis == "torch":
            return self.pattern(node, key, what, _TORCH, "2.10")
        if axis == "python":
            return self.pattern(node, key, what, _PYTHON, "3.11")
        if axis == "cxx11_abi":
            return self.boolean(node, key, "cxx11_abi")
        return self.arch(node, key, "arch", known)

    def entries(
        self,
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
            raise self.fail(f"matrix.{key} must be a list of mappings, not {_kind(items)}", node, key)
        out: list[MatrixEntry] = []
        for i, item in enumerate(items):
            line = self.doc.line_of(items, i)
            if not isinstance(item, Mapping) or not item:
                raise self.doc.error(
                    f"matrix.{key}[{i}] must be a non-empty mapping, not {_kind(item)}", line
                )
            values: dict[str, object] = {}
            for k in item:
                if not isinstance(k, str):
                    raise self.fail(f"matrix.{key}[{i}]: keys must be strings", item, k, at_key=True)
                if k in AXES:
                    values[k] = self.axis_value(item, k, k, known)
                elif axes_only:
                    close = difflib.get_close_matches(k, AXES, n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else f" (axes: {', '.join(AXES)})"
                    raise self.fail(
                        f"matrix.exclude[{i}]: {k!r} is not a matrix axis{hint}", item, k, at_key=True
                    )
                elif k == "env":
                    values[k] = self.env(item, k, f"matrix.include[{i}].env")
                elif k in ("id", "job_id", "package", "version", "local_version", "verified"):
                    raise self.fail(
                        f"matrix.include[{i}]: {k!r} is computed by the factory and cannot be set",
                        item,
                        k,
                        at_key=True,
                    )
                else:
                    values[k] = _plain(item[k])
            out.append(MatrixEntry(values=_frozen(values), line=line))
        return tuple(out)

    def build(self, root: Mapping[str, Any]) -> BuildOptions:
        if "build" not in root or root["build"] is None:
            return BuildOptions()
        node = self.mapping(root, "build", "build")
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
        )
        self.keys(node, allowed, "build")
        c: dict[str, Any] = {}
        if "memory" in node:
            c["memory"] = self.size(node, "memory", "build.memory")
        if "memory_budget" in node:
            c["memory_budget"] = self.size(node, "memory_budget", "build.memory_budget")
        if "cpus" in node:
            c["cpus"] = self.number(node, "cpus", "build.cpus")
        if "concurrency" in node:
            c["concurrency"] = self.integer(node, "concurrency", "build.concurrency")
        if "flavor" in node:
            flavor = self.string(node, "flavor", "build.flavor")
            if flavor not in ("devel", "pypi", "manylinux"):
                raise self.fail(
                    f"build.flavor {flavor!r} must be 'devel', 'pypi' or 'manylinux'", node, "flavor"
                )
            c["flavor"] = flavor
        if "base_image" in node:
            c["base_image"] = self.string(node, "base_image", "build.base_image")
            if not is_image_reference(c["base_image"]):
                raise self.fail(f"build.base_image {c['base_image']!r} {NOT_AN_IMAGE}", node, "base_image")
        if "images" in node:
            c["images"] = self.cuda_map(node, "images", "build.images")
            for cuda, image in c["images"].items():
                if not is_image_reference(image):
                    raise self.fail(f"build.images.{cuda} {image!r} {NOT_AN_IMAGE}", node["images"], cuda)
        if "pids_limit" in node:
            c["pids_limit"] = self.integer(node, "pids_limit", "build.pids_limit", minimum=64)
        if "max_attempts" in node:
            c["max_attempts"] = self.integer(node, "max_attempts", "build.max_attempts")
        if "offline" in node:
            c["offline"] = self.boolean(node, "offline", "build.offline")
        if "torch_index" in node:
            mapping = self.cuda_map(node, "torch_index", "build.torch_index")
            for cuda in mapping:
                what = f"build.torch_index.{cuda}"
                self.url(node["torch_index"], cuda, what, schemes=INDEX_SCHEMES, besides="default")
            c["torch_index"] = mapping
        return BuildOptions(**c)

    def cuda_map(self, node: Mapping[str, Any], key: str, what: str) -> Mapping[str, str]:
        value = node[key]
        if not isinstance(value, Mapping):
            raise self.fail(
                f"{what} must be a mapping of CUDA version to a string, not {_kind(value)}", node, key
            )
        out: dict[str, str] = {}
        for cuda in value:
            if not isinstance(cuda, str):
                written = self.doc.key_text(value, cuda) or str(cuda)
                raise self.fail(
                    f'{what}: CUDA version {cuda} must be a quoted string (write "{written}")',
                    value,
                    cuda,
                    at_key=True,
                )
            if not _CUDA.match(cuda):
                raise self.fail(f"{what}: {cuda!r} is not a CUDA version like 12.8", value, cuda, at_key=True)
            out[cuda] = self.string(value, cuda, f"{what}.{cuda}")
        return _frozen(out)

    def publish(self, root: Mapping[str, Any]) -> PublishOptions:
        if "publish" not in root or root["publish"] is None:
            return PublishOptions()
        node = self.mapping(root, "publish", "publish")
        self.keys(node, ("to", "endpoint_url"), "publish")
        c: dict[str, Any] = {}
        if "to" in node:
            c["to"] = self.string(node, "to", "publish.to")
        if "endpoint_url" in node:
            c["endpoint_url"] = self.url(node, "endpoint_url", "publish.endpoint_url", schemes=HTTP_SCHEMES)
        opts = PublishOptions(**c)
        if opts.endpoint_url and not opts.to.startswith("s3://"):
            raise self.fail("publish.endpoint_url only applies to an s3:// destination", node, "endpoint_url")
        return opts

    def compat(self, root: Mapping[str, Any]) -> CompatData:
        if "compat" not in root or root["compat"] is None:
            return CompatData.load()
        node = self.mapping(root, "compat", "compat")
        self.keys(node, TOP_KEYS, "compat")
        out: dict[str, Any] = {}
        if "cuda_versions" in node:
            vals = self.str_list(node, "cuda_versions", "compat.cuda_versions")
            out["cuda_versions"] = sorted(
                set(vals) | set(CompatData.load().data.get("cuda_versions", [])), key=_vkey
            )
        if "archs" in node:
            archs = self.mapping(node, "archs", "compat.archs")
            out["archs"] = {}
            for arch in archs:
                a = str(arch)
                try:
                    arch_key(a)
                except ValueError:
                    raise self.fail(
                        f"compat.archs: {arch!r} is not an arch like 10.0", archs, arch, at_key=True
                    ) from None
                r = self.mapping(archs, arch, f"compat.archs.{a}")
                self.keys(r, ARCH_KEYS, f"compat.archs.{a}")
                out["archs"][a] = {
                    k: self.pattern(r, k, f"compat.archs.{a}.{k}", _CUDA, "12.8")
                    if k != "why"
                    else self.string(r, k, "why")
                    for k in r
                }
        if "torch" in node:
            torches = self.mapping(node, "torch", "compat.torch")
            out["torch"] = {}
            for tv in torches:
                if not isinstance(tv, str) or not re.match(r"^\d+\.\d+$", tv):
                    raise self.fail(
                        f'compat.torch: {tv!r} must be a quoted torch minor version like "2.10"',
                        torches,
                        tv,
                        at_key=True,
                    )
                e = self.mapping(torches, tv, f"compat.torch.{tv}")
                self.keys(e, TORCH_KEYS, f"compat.torch.{tv}")
                d: dict[str, Any] = {}
                for k in e:
                    w = f"compat.torch.{tv}.{k}"
                    if k == "cuda":
                        d[k] = [
                            self.pattern(e[k], i, w, _CUDA, "12.8") for i in range(len(self._list(e, k, w)))
                        ]
                    elif k == "python":
                        d[k] = [
                            self.pattern(e[k], i, w, _PYTHON, "3.11") for i in range(len(self._list(e, k, w)))
                        ]
                    elif k == "cxx11_abi":
                        d[k] = [self.boolean(e[k], i, w) for i in range(len(self._list(e, k, w)))]
                    elif k == "complete":
                        d[k] = self.boolean(e, k, w)
                    else:
                        d[k] = str(e[k]) if isinstance(e[k], int) else self.string(e, k, w)
                out["torch"][tv] = d
        if "recipes" in node:
            recipes = self.mapping(node, "recipes", "compat.recipes")
            out["recipes"] = {}
            for name in recipes:
                r = self.mapping(recipes, name, f"compat.recipes.{name}")
                self.keys(r, RECIPE_KEYS, f"compat.recipes.{name}")
                out["recipes"][str(name)] = {
                    k: str(r[k]) if isinstance(r[k], int) else self.string(r, k, k) for k in r
                }
        return CompatData.load(out)

    def _list(self, node: Any, key: str, what: str) -> list[Any]:
        value = node[key]
        if not isinstance(value, list):
            raise self.fail(f"{what} must be a list, not {_kind(value)}", node, key)
        return value

    def check_complete(self, mf: MatrixFile) -> None:
        from factory.matrix import expand_with_origin

        spec = mf.matrix
        for combo, origin in expand_with_origin(
            spec.axes,
            [e.values for e in spec.include],
            [e.values for e in spec.exclude],
        ):
            missing = [a for a in AXES if a not in combo]
            if missing:
                line = spec.include[origin].line if origin is not None else spec.line
                shown = ", ".join(f"{k}={v}" for k, v in combo.items() if k in AXES) or "(no axes)"
                raise self.doc.error(
                    f"incomplete job {shown}: missing {', '.join(missing)} "
                    f"(every job needs cuda, torch, python, cxx11_abi and arch)",
                    line,
                )


def _with_import_name(recipe: Recipe, package: PackageSpec) -> Recipe:
    if recipe.import_name:
        return recipe
    return replace(recipe, import_name=canonicalize_name(package.name).replace("-", "_"))


def _vkey(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split(".")) if re.match(r"^\d+(\.\d+)*$", v) else (0,)


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _plain(value: Any) -> object:
    """ruamel's commented containers and scalar subclasses -> plain JSON-able Python values."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return str(value)


def load_matrix_file(path: str | Path) -> MatrixFile:
    """Read and validate a matrix file; any problem is a ConfigError "FILE:LINE: message" (exit code 2)."""
    doc = load_yaml(path)
    return _Loader(doc).load()
