"""Built-in recipes (how to drive a package's setup.py) and the build environment of one job."""

from __future__ import annotations

import csv
import itertools
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import replace
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import TYPE_CHECKING

from packaging.utils import canonicalize_name

from factory.config import PackageSpec, Recipe
from factory.variants import format_arch_list

if TYPE_CHECKING:
    from factory.variants import Variant


def measured_compile_gib(package: str = "flash-attn", *, arch_count: int = 1) -> float:
    """The worst measured single-thread peak of one kernel file for `arch_count` archs (factory/data CSV)."""
    peaks = [
        float(r["peak_gib"]) / max(1, len(r["gencodes"].split("+")))
        for r in _csv_rows()
        if r.get("peak_gib") and package == "flash-attn"
    ]
    return round(max(peaks) * arch_count, 2) if peaks else 4.0 * arch_count


@cache
def _csv_rows() -> tuple[dict[str, str], ...]:
    text = resources.files("factory").joinpath("data/flash-attn-compiles.csv").read_text(encoding="utf-8")
    return tuple(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))


# Safety on top of a measured peak: the same file measured 6.34 GiB with torch 2.13's headers and 6.64 with
# 2.14's (+5%); the admission wrapper counts a running compile at its RSS when that is larger, so a few
# percent suffice here and the learned profile replaces these figures after the first build.
ESTIMATE_MARGIN = 1.03
FLASH_ATTN_HDIMS = (32, 64, 96, 128, 192, 256)


def _flash_attn_kernel_rows() -> Iterator[tuple[str, int, dict[str, str]]]:
    """(file name prefix such as "flash_bwd_hdim", head dimension, row) of each measured flash-attn 2.8.3
    kernel file compiled for one arch."""
    for r in _csv_rows():
        m = re.match(r"(flash_(?:fwd_split|fwd|bwd)_hdim)(\d+)_", r["tu"])
        if m and r["flash_attn_version"] == "2.8.3" and "+" not in r["gencodes"]:
            yield m.group(1), int(m.group(2)), r


def interpolate(points: Sequence[tuple[int, float]], x: int) -> float:
    """Linear in x between the measured points; beyond them, the nearest measured value."""
    points = sorted(points)
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def flash_attn_file_estimates() -> tuple[tuple[str, float], ...]:
    """flash-attn 2.8.3's per-file table (GiB per arch) from factory/data/flash-attn-compiles.csv.

    The measured rows are flash-attn 2.8.3 kernel files with torch 2.14.1's headers, one arch each (forward,
    backward and split-KV forward files at several head dimensions). A head dimension of a kind that was
    measured gets its own figure; one between two measured ones the larger of the two (a template instance
    of a middle size is not assumed to be smaller than both neighbours); one beyond them the largest of its
    kind. bf16 and causal files share their fp16, non-causal sibling's pattern. Each figure carries
    ESTIMATE_MARGIN, rounded up to 0.1 GiB. Files of no measured kind fall back to compile_gib_per_arch.
    """
    measured: dict[str, dict[int, float]] = {}  # file name prefix ("flash_bwd_hdim") -> head dim -> GiB
    for prefix, hdim, r in _flash_attn_kernel_rows():
        if r.get("peak_gib"):
            points = measured.setdefault(prefix, {})
            points[hdim] = max(points.get(hdim, 0.0), float(r["peak_gib"]))

    def safe(gib: float) -> float:
        return math.ceil(round(gib * ESTIMATE_MARGIN * 10, 6)) / 10

    table: list[tuple[str, float]] = []
    for prefix, points in sorted(measured.items()):
        for hdim in FLASH_ATTN_HDIMS:
            lower = max((h for h in points if h <= hdim), default=None)
            upper = min((h for h in points if h >= hdim), default=None)
            if lower is None or upper is None:
                gib = max(points.values())
            else:
                gib = max(points[lower], points[upper])  # a measured head dimension: its own figure
            table.append((f"{prefix}{hdim}_*", safe(gib)))
    return tuple(table)


def flash_attn_file_seconds() -> tuple[tuple[str, float], ...]:
    """flash-attn 2.8.3's `compile_seconds_by_file` from factory/data/flash-attn-compiles.csv: the CPU seconds
    of one arch (the wall time of rows without one), per kind and head dimension, the same patterns as
    `flash_attn_file_estimates`. Only their order and ratios count, so a head dimension between two measured
    ones is interpolated linearly and one beyond them takes the nearest one's figure."""
    measured: dict[str, dict[int, tuple[bool, float]]] = {}  # prefix -> head dim -> (has cpu_s, seconds)
    for prefix, hdim, r in _flash_attn_kernel_rows():
        figure = (True, float(r["cpu_s"])) if r.get("cpu_s") else (False, float(r["wall_s"] or 0))
        points = measured.setdefault(prefix, {})
        points[hdim] = max(points.get(hdim, (False, 0.0)), figure)
    table: list[tuple[str, float]] = []
    for prefix, points in sorted(measured.items()):
        known = [(h, s) for h, (_, s) in points.items() if s > 0]
        for hdim in FLASH_ATTN_HDIMS:
            table.append((f"{prefix}{hdim}_*", round(interpolate(known, hdim), 1)))
    return tuple(table)


# The after-peak fraction is a few measured courses' worst: a file not measured may hold a little more.
AFTER_PEAK_MARGIN = 1.1


def measured_after_peak() -> float | None:
    """flash-attn's `compile_after_peak`: the most any measured course held after first falling to 3/4 of its
    peak (factory/data CSV, `after_peak`), with AFTER_PEAK_MARGIN, rounded up to 0.01 and at most 1."""
    seen = [float(r["after_peak"]) for r in _csv_rows() if r.get("after_peak")]
    if not seen:
        return None
    return min(1.0, math.ceil(round(max(seen) * AFTER_PEAK_MARGIN * 100, 6)) / 100)


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
