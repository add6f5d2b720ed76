"""One job's compiles split over N runners (`factory build --shard I/N`), pure.

A shard compiles its share of the job's nvcc compiles into the compile cache and makes no wheel; the job's
final build then finds every compile in the cache. The share is a partition of the prepared source's CUDA
files, longest first (LPT greedy) into the least-loaded shard, by weights from, in order:
  profile  the learned profile's wall time of each file (one arch set and nvcc thread count for all), only
           when it knows every file: a shard run teaches the profile its own files, and a partition that
           moved with that would let the next shard run of the job skip files (or compile them twice)
  recipe   the recipe's compile_seconds_by_file (a file matching no glob weighs the median)
  count    1 each
Which files a build compiles only its setup.py knows; the host takes every `.cu` file outside test, example,
benchmark and documentation directories. A file wrongly included costs balance only, one wrongly left out is
compiled by the final build: either way the wheel is the same.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from factory.container import admission, protocol
from factory.container.protocol import ProfileEntry
from factory.plan.ci import github_matrix
from factory.spec.options import MAX_MATRIX_JOBS, MAX_SHARDS

UNIT_SUFFIXES = (".cu",)
# directories whose CUDA files a package's extension does not build (vendored libraries' own tests, examples)
SKIPPED_DIRS = frozenset(
    {"test", "tests", "example", "examples", "benchmark", "benchmarks", "bench", "doc", "docs", "build"}
)
_SHARD_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")

Basis = Literal["profile", "recipe", "count"]


@dataclass(frozen=True, kw_only=True, order=True)
class Shard:
    index: int  # 1-based
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """ "2/4" -> Shard(index=2, count=4); ValueError saying what is wrong for anything else."""
    match = _SHARD_RE.fullmatch(text)
    if not match:
        raise ValueError(f"{text!r} is not I/N (e.g. 2/4)")
    index, count = int(match.group(1)), int(match.group(2))
    if not 1 <= count <= MAX_SHARDS:
        raise ValueError(f"{text!r}: N must be 1 to {MAX_SHARDS}")
    if not 1 <= index <= count:
        raise ValueError(f"{text!r}: I must be 1 to {count}")
    return Shard(index=index, count=count)


def compile_units(tree: Path) -> tuple[str, ...]:
    """The CUDA sources of a prepared source tree, as sorted POSIX paths relative to it."""
    found = []
    for path in tree.rglob("*"):
        rel = path.relative_to(tree)
        if path.suffix not in UNIT_SUFFIXES or not path.is_file():
            continue
        if any(part in SKIPPED_DIRS or part.startswith(".") for part in rel.parts[:-1]):
            continue
        found.append(rel.as_posix())
    return tuple(sorted(found))


@dataclass(frozen=True, kw_only=True)
class Weights:
    basis: Basis
    by_unit: Mapping[str, float]


def _name(unit: str) -> str:
    return unit.rsplit("/", 1)[-1]


def profile_walls(units: Sequence[str], entries: Mapping[str, ProfileEntry]) -> dict[str, float]:
    """The wall times, by file name, of the profile's group (arch set and nvcc threads) that names the most
    units; empty when no group names any."""
    groups: dict[str, dict[str, float]] = {}
    for key, entry in entries.items():
        parsed = protocol.parse_compile_key(key)
        if parsed is None or not entry.wall_s:
            continue
        groups.setdefault(key.partition("|")[2], {})[parsed[0]] = float(entry.wall_s)
    names = {_name(u) for u in units}
    best = min(
        groups.items(),
        key=lambda g: (-len(names & g[1].keys()), g[0]),
        default=None,
    )
    if best is None or not names & best[1].keys():
        return {}
    return {n: w for n, w in best[1].items() if n in names}


def profile_weights(units: Sequence[str], entries: Mapping[str, ProfileEntry]) -> dict[str, float] | None:
    """Each unit's wall time in the profile's group (arch set and nvcc threads) that names the most units,
    when that group names every unit; None otherwise."""
    walls = profile_walls(units, entries)
    if not walls or not {_name(u) for u in units} <= walls.keys():
        return None
    return {u: walls[_name(u)] for u in units}


def recipe_weights(
    units: Sequence[str], seconds_by_file: Sequence[tuple[str, float]]
) -> dict[str, float] | None:
    """Each unit's seconds by the recipe's table; None when the table names none of them."""
    named = {u: admission.file_value(u, seconds_by_file) for u in units}
    known = [float(v) for v in named.values() if v is not None]
    if not known:
        return None
    median = statistics.median(known)
    return {u: median if v is None else float(v) for u, v in named.items()}


def unit_weights(
    units: Sequence[str],
    *,
    entries: Mapping[str, ProfileEntry] | None = None,
    seconds_by_file: Sequence[tuple[str, float]] = (),
) -> Weights:
    """The units' weights by the best basis there is: the learned profile, the recipe, else the count."""
    by_profile = profile_weights(units, entries or {})
    if by_profile is not None:
        return Weights(basis="profile", by_unit=by_profile)
    by_recipe = recipe_weights(units, seconds_by_file)
    if by_recipe is not None:
        return Weights(basis="recipe", by_unit=by_recipe)
    return Weights(basis="count", by_unit=dict.fromkeys(units, 1.0))


def partition(weights: Mapping[str, float], count: int) -> tuple[tuple[str, ...], ...]:
    """`count` shards: longest first, each into the least-loaded shard (the lowest-numbered of equals);
    ties between units broken by name, so the same input always gives the same shards. Each shard's units
    sorted; with more shards than units the last ones are empty."""
    if count < 1:
        raise ValueError("a partition needs at least one shard")
    loads = [0.0] * count
    shards: list[list[str]] = [[] for _ in range(count)]
    for unit, weight in sorted(weights.items(), key=lambda uw: (-uw[1], uw[0])):
        i = min(range(count), key=lambda k: (loads[k], k))
        shards[i].append(unit)
        loads[i] += weight
    return tuple(tuple(sorted(s)) for s in shards)


def shard_loads(weights: Mapping[str, float], shards: Sequence[Sequence[str]]) -> tuple[float, ...]:
    return tuple(sum(weights[u] for u in s) for s in shards)


def shard_sources(
    tree: Path,
    shard: Shard,
    *,
    entries: Mapping[str, ProfileEntry] | None = None,
    seconds_by_file: Sequence[tuple[str, float]] = (),
) -> tuple[tuple[str, ...], Basis]:
    """Shard I's source paths (relative to the tree) and the basis they were balanced on."""
    weights = unit_weights(compile_units(tree), entries=entries, seconds_by_file=seconds_by_file)
    return partition(weights.by_unit, shard.count)[shard.index - 1], weights.basis


# --- what a shard did, from its build log ------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CompileCounts:
    compiled: int = 0
    cached: int = 0
    skipped: int = 0
    failed: int = 0


def count_compiles(lines: Iterable[str]) -> CompileCounts:
    """The nvcc wrapper's measurement lines of a log by their "cache" field: served from the cache, skipped
    (another shard's), or run (a miss, or the cache off); a compile that failed counts as failed."""
    counts = {"compiled": 0, "cached": 0, "skipped": 0, "failed": 0}
    for line in lines:
        if protocol.MEASUREMENT_MARK not in line:
            continue
        try:
            raw = json.loads(line.split(protocol.MEASUREMENT_MARK, 1)[1])
        except ValueError:
            continue
        if not isinstance(raw, dict):
            continue
        served = raw.get("cache")
        if served == protocol.CACHE_SKIPPED:
            counts["skipped"] += 1
        elif raw.get("rc", 0) != 0:
            counts["failed"] += 1
        elif served == protocol.CACHE_HIT:
            counts["cached"] += 1
        else:
            counts["compiled"] += 1
    return CompileCounts(**counts)


def summary(shard: Shard, counts: CompileCounts) -> str:
    return f"shard {shard}: {counts.compiled} compiled, {counts.cached} cached"


# --- CI matrices -------------------------------------------------------------------------------------------


def github_matrices(jobs: Sequence[Mapping[str, object]], count: int) -> dict[str, object]:
    """Two GitHub Actions matrices for `factory matrix --format github --shards N`: "shards", N entries per
    job (its fields, "job" and "shard": "I/N"; a job's own `shards` from its include entry wins, 1 is
    none), run first; then "finals", one entry per job (its fields and "job"), whose workflow job `needs:`
    the shards' and finds every compile in the cache."""
    finals = [{**job, "job": job["job_id"]} for job in jobs]
    shards = []
    for final in finals:
        n = int(final.get("shards", count))  # type: ignore[call-overload]
        if n > 1:
            shards += [{**final, "shard": str(Shard(index=i, count=n))} for i in range(1, n + 1)]
    return {"shards": {"include": shards}, "finals": {"include": finals}}


def github_shard_outputs(matrices: Mapping[str, object]) -> str:
    """The $GITHUB_OUTPUT lines of the shards' matrix, beside the finals' `matrix=` and `count=`: a shard
    job with an empty matrix must be skipped by its `if:`, not fail the run."""
    entries = matrices["shards"]["include"]  # type: ignore[index]
    return f"shards={github_matrix(entries)}\nshard_count={len(entries)}\n"


def over_limit(matrices: Mapping[str, object]) -> list[str]:
    """Which of the matrices GitHub would refuse (more than 256 entries), said in a line each."""
    out = []
    for name, matrix in matrices.items():
        size = len(matrix["include"])  # type: ignore[index]
        if size > MAX_MATRIX_JOBS:
            out.append(
                f"the {name} matrix has {size} entries, above GitHub's {MAX_MATRIX_JOBS}: "
                "plan fewer jobs at a time with --chunk I/K, or fewer --shards"
            )
    return out
