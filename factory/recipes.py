"""Built-in recipes (how to drive a package's setup.py) and the build environment of one job."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from packaging.utils import canonicalize_name

from factory.measured import (
    flash_attn_file_estimates,
    flash_attn_file_seconds,
    measured_after_peak,
    measured_compile_gib,
)
from factory.options import PackageSpec, Recipe
from factory.variants import format_arch_list

if TYPE_CHECKING:
    from factory.variants import Variant


# flash-attn 2.8.3's setup.py: FLASH_ATTN_CUDA_ARCHS="80;90;100;120" selects the gencodes,
# FLASH_ATTN_LOCAL_VERSION becomes the +local label, FLASH_ATTENTION_FORCE_BUILD stops it from downloading a
# prebuilt wheel from GitHub (which also would need network). Its flags hard-code -std=c++17.
FLASH_ATTN = Recipe(
    name="flash-attn",
    arch_env="FLASH_ATTN_CUDA_ARCHS",
    arch_format="flash-attn",
    local_version_env="FLASH_ATTN_LOCAL_VERSION",
    env=MappingProxyType({"FLASH_ATTENTION_FORCE_BUILD": "TRUE"}),
    import_name="flash_attn",
    min_arch="8.0",
    # Measured: the heaviest kernel file (flash_bwd_hdim256) peaks at ~6.6 GiB per arch per nvcc thread.
    compile_gib_per_arch=measured_compile_gib("flash-attn"),
    compile_gib_by_file=flash_attn_file_estimates(),
    compile_after_peak=measured_after_peak(),
    compile_seconds_by_file=flash_attn_file_seconds(),
    extra_build_requires=("setuptools", "wheel", "ninja", "packaging", "psutil", "einops"),
    cxx_std="17",
)

TORCH_EXT = Recipe(
    name="torch-ext",
    arch_env="TORCH_CUDA_ARCH_LIST",
    arch_format="torch",
    local_version_env=None,
    env=MappingProxyType({"FORCE_CUDA": "1"}),
    compile_gib_per_arch=4.0,
    extra_build_requires=("setuptools", "wheel", "ninja", "packaging"),
)

BUILTIN_RECIPES: dict[str, Recipe] = {r.name: r for r in (FLASH_ATTN, TORCH_EXT)}


def default_recipe_for(package: PackageSpec) -> Recipe:
    """flash-attn gets its own recipe; anything else is a generic torch extension."""
    if canonicalize_name(package.name) == "flash-attn":
        return FLASH_ATTN
    return replace(TORCH_EXT, import_name=canonicalize_name(package.name).replace("-", "_"))


def recipe_env(recipe: Recipe, variant: Variant) -> dict[str, str]:
    """Environment for one build: the arch list in the recipe's format, TORCH_CUDA_ARCH_LIST (torch's
    cpp_extension reads it even when the package has its own variable), the local version label, the
    recipe's env."""
    env: dict[str, str] = {"TORCH_CUDA_ARCH_LIST": format_arch_list(variant.archs, "torch")}
    env[recipe.arch_env] = format_arch_list(variant.archs, recipe.arch_format)
    if recipe.local_version_env:
        env[recipe.local_version_env] = variant.local_version
    env.update(recipe.env)
    return env
