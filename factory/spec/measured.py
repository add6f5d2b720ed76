"""What was measured of real compiles (factory/data/flash-attn-compiles.csv: the factory's own compiles of a
whole flash-attn wheel, merged in by `python -m bench.compiles_export --into`, and hand-run rows of what no
build measured) and the figures derived from it: the built-in flash-attn recipe's per-file estimates. The
benchmark model derives the same figures, by these functions, from the hand-run rows its courses belong to
(bench/data/flash-attn-hand-compiles.csv)."""

from __future__ import annotations

import csv
import itertools
import math
import re
from collections.abc import Iterator, Sequence
from functools import cache

from factory.core.resources import read_data

Rows = Sequence[dict[str, str]]


def measured_compile_gib(
    package: str = "flash-attn", *, arch_count: int = 1, rows: Rows | None = None
) -> float:
    """The worst measured single-thread peak of one kernel file for `arch_count` archs (factory/data CSV)."""
    peaks = [
        float(r["peak_gib"]) / max(1, len(r["gencodes"].split("+")))
        for r in (compile_rows() if rows is None else rows)
        if r.get("peak_gib") and package == "flash-attn"
    ]
    return round(max(peaks) * arch_count, 2) if peaks else 4.0 * arch_count


@cache
def compile_rows() -> tuple[dict[str, str], ...]:
    """The CSV's rows (one measured compile each), its comment lines left out."""
    text = read_data("flash-attn-compiles.csv")
    return parse_rows(text)


def parse_rows(text: str) -> tuple[dict[str, str], ...]:
    """Rows of a compiles CSV (the shipped one, or one `bench.compiles_export` wrote), comments left out."""
    return tuple(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))


def _is_2_8_3(version: str) -> bool:
    """flash-attn 2.8.3 and its post releases (2.8.3.post2: the same kernels, another wheel download URL)."""
    return re.fullmatch(r"2\.8\.3(\.post\d+)?", version) is not None


# Safety on top of a measured peak: the same file measured 6.34 GiB with torch 2.13's headers and 6.64 with
# 2.14's (+5%); the admission wrapper counts a running compile at its RSS when that is larger, so a few
# percent suffice here and the learned profile replaces these figures after the first build.
ESTIMATE_MARGIN = 1.03
FLASH_ATTN_HDIMS = (32, 64, 96, 128, 192, 256)


def _flash_attn_kernel_rows(rows: Rows | None = None) -> Iterator[tuple[str, int, dict[str, str]]]:
    """(file name prefix such as "flash_bwd_hdim", head dimension, row) of each measured flash-attn 2.8.3
    kernel file compiled for one arch."""
    for r in compile_rows() if rows is None else rows:
        m = re.match(r"(flash_(?:fwd_split|fwd|bwd)_hdim)(\d+)_", r["tu"])
        if m and _is_2_8_3(r["flash_attn_version"]) and "+" not in r["gencodes"]:
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


def flash_attn_file_estimates(rows: Rows | None = None) -> tuple[tuple[str, float], ...]:
    """flash-attn 2.8.3's per-file table (GiB per arch) from factory/data/flash-attn-compiles.csv.

    The measured rows are flash-attn 2.8.3 kernel files with torch 2.14.1's headers, one arch each (forward,
    backward and split-KV forward files at several head dimensions). A head dimension of a kind that was
    measured gets its own figure; one between two measured ones the larger of the two (a template instance
    of a middle size is not assumed to be smaller than both neighbours); one beyond them the largest of its
    kind. bf16 and causal files share their fp16, non-causal sibling's pattern. Each figure carries
    ESTIMATE_MARGIN, rounded up to 0.1 GiB. Files of no measured kind fall back to compile_gib_per_arch.
    """
    measured: dict[str, dict[int, float]] = {}  # file name prefix ("flash_bwd_hdim") -> head dim -> GiB
    for prefix, hdim, r in _flash_attn_kernel_rows(rows):
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


def flash_attn_file_seconds(rows: Rows | None = None) -> tuple[tuple[str, float], ...]:
    """flash-attn 2.8.3's `compile_seconds_by_file` from factory/data/flash-attn-compiles.csv: the CPU seconds
    of one arch (the wall time of rows without one), per kind and head dimension, the same patterns as
    `flash_attn_file_estimates`. Only their order and ratios count, so a head dimension between two measured
    ones is interpolated linearly and one beyond them takes the nearest one's figure."""
    measured: dict[str, dict[int, tuple[bool, float]]] = {}  # prefix -> head dim -> (has cpu_s, seconds)
    for prefix, hdim, r in _flash_attn_kernel_rows(rows):
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


def measured_after_peak(rows: Rows | None = None) -> float | None:
    """flash-attn's `compile_after_peak`: the most any measured course held after first falling to 3/4 of its
    peak (factory/data CSV, `after_peak`), with AFTER_PEAK_MARGIN, rounded up to 0.01 and at most 1."""
    seen = [float(r["after_peak"]) for r in (compile_rows() if rows is None else rows) if r.get("after_peak")]
    if not seen:
        return None
    return min(1.0, math.ceil(round(max(seen) * AFTER_PEAK_MARGIN * 100, 6)) / 100)
