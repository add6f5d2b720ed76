"""Built-in recipes (how to drive a package's setup.py) and the build environment of one job.

The built-in recipes are data: factory/data/recipes/<name>/recipe.toml (Recipe's fields, plus the package and
versions its patches were made for) and patches/*.patch, unified diffs applied with -p1 in the listed order.
"""

from __future__ import annotations

import tomllib
from dataclasses import fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from factory.core.resources import data_path
from factory.core.validate import library_glob_problem, shown_name
from factory.core.variants import format_arch_list
from factory.spec.abi3 import parse_limited_api
from factory.spec.measured import (
    flash_attn_file_estimates,
    flash_attn_file_seconds,
    measured_after_peak,
    measured_compile_gib,
)
from factory.spec.options import PackageSpec, Recipe
from factory.spec.stable_abi import parse_stable_abi, target_version

if TYPE_CHECKING:
    from factory.core.variants import Variant

RECIPE_FILE = "recipe.toml"
# Keys of recipe.toml beyond Recipe's own fields: `measured = true` takes the compile figures from the
# measured compiles (factory/data/flash-attn-compiles.csv).
_DATA_ONLY_KEYS = ("measured",)
_TUPLE_FIELDS = ("patches", "extra_build_requires", "host_only_libraries", "extra_requires")
_BY_FILE_FIELDS = ("compile_gib_by_file", "compile_seconds_by_file")


def recipes_dir() -> Path:
    """factory/data/recipes/: one directory per built-in recipe, its recipe.toml and patches/."""
    return data_path("recipes")


def load_recipe_dir(directory: Path) -> Recipe:
    """The recipe a directory declares (named after it); a malformed file is a ValueError naming it."""
    path = directory / RECIPE_FILE
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    known = {f.name for f in fields(Recipe)} - {"name"}
    unknown = sorted(set(data) - known - set(_DATA_ONLY_KEYS))
    if unknown:
        raise ValueError(f"{path}: unknown keys {', '.join(unknown)}")
    values: dict[str, Any] = {k: v for k, v in data.items() if k in known}
    for key in _BY_FILE_FIELDS:
        if key in values:
            # a TOML table keeps its order: the first glob that matches wins
            values[key] = tuple((str(glob), float(n)) for glob, n in values[key].items())
    if data.get("measured"):
        values.update(
            compile_gib_per_arch=measured_compile_gib(directory.name),
            compile_gib_by_file=flash_attn_file_estimates(),
            compile_after_peak=measured_after_peak(),
            compile_seconds_by_file=flash_attn_file_seconds(),
        )
    for key in _TUPLE_FIELDS:
        if key in values:
            if not isinstance(values[key], list):
                raise ValueError(f"{path}: {key} must be a list")
            values[key] = tuple(values[key])
    for pattern in values.get("host_only_libraries", ()):
        problem = library_glob_problem(pattern)
        if problem is not None:
            raise ValueError(f"{path}: host_only_libraries item {pattern!r} {problem}")
    values["patches"] = tuple(directory / "patches" / str(p) for p in values.get("patches", ()))
    for patch in values["patches"]:
        if not patch.is_file():
            raise ValueError(f"{path}: patch {patch.name} is not in {patch.parent}")
    if "env" in values:
        values["env"] = MappingProxyType({str(k): str(v) for k, v in values["env"].items()})
    if "package" in values:
        values["package"] = canonicalize_name(values["package"])
    if "versions" in values:
        try:
            SpecifierSet(values["versions"])
        except InvalidSpecifier:
            raise ValueError(f"{path}: versions {values['versions']!r} is not a PEP 440 specifier") from None
    if "py_limited_api" in values:
        try:
            values["py_limited_api"] = parse_limited_api(values["py_limited_api"])
        except ValueError as exc:
            raise ValueError(f"{path}: py_limited_api {exc}") from None
    if "stable_abi" in values:
        try:
            values["stable_abi"] = parse_stable_abi(values["stable_abi"])
        except ValueError as exc:
            raise ValueError(f"{path}: stable_abi {exc}") from None
    try:
        return Recipe(name=directory.name, **values)
    except TypeError as exc:
        raise ValueError(f"{path}: {exc}") from None


def _builtin_recipes() -> MappingProxyType[str, Recipe]:
    found = sorted(d for d in recipes_dir().iterdir() if (d / RECIPE_FILE).is_file())
    return MappingProxyType({d.name: load_recipe_dir(d) for d in found})


# every recipe shipped in factory/data/recipes/, by name
BUILTIN_RECIPES = _builtin_recipes()
FLASH_ATTN = BUILTIN_RECIPES["flash-attn"]
TORCH_EXT = BUILTIN_RECIPES["torch-ext"]


def default_recipe_for(package: PackageSpec) -> Recipe:
    """The built-in recipe made for the package, if there is one; else a generic torch extension."""
    name = canonicalize_name(package.name)
    for recipe in BUILTIN_RECIPES.values():
        if recipe.package == name:
            return recipe
    return replace(TORCH_EXT, import_name=name.replace("-", "_"))


def recipe_warnings(recipe: Recipe, package: PackageSpec) -> list[str]:
    """One line per way the recipe's patches were not made for this package: another package, a version
    outside the ones they were made for. `factory matrix --check` then tries them against its source."""
    if not recipe.patches:
        return []
    name = canonicalize_name(package.name)
    where = f"recipe {recipe.name}'s patches"
    try_it = "`factory matrix --check` tries them against its source"
    if recipe.package is not None and recipe.package != name:
        return [f"{where} were made for {recipe.package}, not {shown_name(package.name)}; {try_it}"]
    if recipe.versions is None:
        return []
    try:
        known = Version(package.version) in SpecifierSet(recipe.versions)
    except InvalidVersion:
        known = False
    if known:
        return []
    made_for = f"{recipe.package or shown_name(package.name)} {recipe.versions}"
    return [f"{where} were made for {made_for}, not {package.version}; {try_it}"]


def recipe_env(recipe: Recipe, variant: Variant) -> dict[str, str]:
    """Environment for one build: the arch list in the recipe's format, TORCH_CUDA_ARCH_LIST (torch's
    cpp_extension reads it even when the package has its own variable), the local version label, a stable-ABI
    variant's TORCH_TARGET_VERSION, the recipe's env."""
    env: dict[str, str] = {"TORCH_CUDA_ARCH_LIST": format_arch_list(variant.archs, "torch")}
    env[recipe.arch_env] = format_arch_list(variant.archs, recipe.arch_format)
    if recipe.local_version_env:
        env[recipe.local_version_env] = variant.local_version
    if variant.stable_abi is not None:
        # the package's setup.py passes it to its compilers (-DTORCH_TARGET_VERSION=...), as FA3's does
        env["TORCH_TARGET_VERSION"] = target_version(variant.stable_abi)
    env.update(recipe.env)
    return env
