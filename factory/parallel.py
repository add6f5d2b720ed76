"""The runner's view of memory: how parallel a job's build may be, and what to change after an OOM kill.

The planning arithmetic and admission control live in `factory.memory`; this module adapts them to a job.
"""

from __future__ import annotations

from dataclasses import dataclass

from factory.config import Recipe

GIB = 2**30
# Linking, Python and the build backend need memory that no compile may take.
HEADROOM_BYTES = int(1.5 * GIB)


@dataclass(frozen=True, kw_only=True)
class Parallelism:
    max_jobs: int
    nvcc_threads: int
    per_compile_bytes: int
    reason: str = ""


def container_limits(*, budget_bytes: int, concurrency: int) -> list[int]:
    """Equal shares of the host budget: the containers' limits never sum to more than it."""
    share = budget_bytes // max(1, concurrency)
    return [share] * max(1, concurrency)


def initial_parallelism(
    *,
    recipe: Recipe,
    archs: int,
    limit_bytes: int,
    cpus: float,
    package: str,
    version: str,
) -> Parallelism:
    threads = max(1, min(archs, 4))
    per_compile = int(recipe.compile_gib_per_arch * GIB * threads)
    by_memory = max(1, (limit_bytes - HEADROOM_BYTES) // max(1, per_compile))
    jobs = max(1, min(int(cpus), by_memory))
    return Parallelism(
        max_jobs=jobs,
        nvcc_threads=threads,
        per_compile_bytes=per_compile,
        reason=f"{jobs} jobs x {threads} nvcc threads at ~{per_compile / GIB:.1f} GiB per compile",
    )


def wrapper_env(parallel: Parallelism, *, recipe: Recipe, job_dir: str, memory_limit: int) -> dict[str, str]:
    return {}


def next_attempt(
    prev: Parallelism,
    *,
    oom_peak_bytes: int,
    limit_bytes: int,
    objects_done: int,
    objects_total: int | None,
) -> Parallelism:
    jobs = max(1, prev.max_jobs // 2)
    threads = prev.nvcc_threads if jobs < prev.max_jobs else max(1, prev.nvcc_threads // 2)
    kept = f", {objects_done} objects kept" if objects_done else ""
    return Parallelism(
        max_jobs=jobs,
        nvcc_threads=threads,
        per_compile_bytes=prev.per_compile_bytes,
        reason=(
            f"OOM at {oom_peak_bytes / GIB:.1f} GiB, jobs {prev.max_jobs} -> {jobs}, "
            f"nvcc threads {prev.nvcc_threads} -> {threads}{kept}"
        ),
    )


def record_profiles(**_: object) -> None:
    return None
