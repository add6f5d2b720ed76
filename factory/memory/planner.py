"""Parallelism that fits a container: MAX_JOBS and NVCC_THREADS from its limits, and retries after an OOM
kill."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from factory.container.admission import DEFAULT_BASE_BYTES, default_headroom, per_compile_estimate
from factory.core.errors import ConfigError
from factory.core.units import format_gib

# flash-attn's setup.py default; more threads than archs buy nothing since each thread compiles one arch.
DEFAULT_NVCC_THREADS = 4
# Waiting wrappers are idle Python processes (~10 MiB each): letting ninja start more of them than there are
# cores gives admission a choice of which compile to run next, while admission itself bounds CPU and memory.
ADMISSION_OVERCOMMIT = 4


@dataclass(frozen=True, kw_only=True)
class Parallelism:
    max_jobs: int  # MAX_JOBS that fits without admission (ninja -j)
    nvcc_threads: int
    per_compile_bytes: int  # predicted peak of one nvcc call
    reason: str
    per_arch_bytes: int = 0  # the estimate behind per_compile_bytes (FACTORY_EST_PER_ARCH_BYTES)
    ninja_jobs: int = 0  # MAX_JOBS to use when the admission wrapper bounds memory instead


def plan_parallelism(
    *,
    limit_bytes: int,
    cpus: float,
    archs: int,
    per_arch_bytes: int,
    nvcc_threads: int | None = None,
    headroom_bytes: int | None = None,
    base_bytes: int = DEFAULT_BASE_BYTES,
) -> Parallelism:
    if limit_bytes <= 0 or not (math.isfinite(cpus) and cpus > 0) or archs <= 0 or per_arch_bytes <= 0:
        raise ConfigError("memory planning needs a positive limit, cpus, archs and per-arch estimate")
    headroom = default_headroom(limit_bytes) if headroom_bytes is None else headroom_bytes
    capacity = max(0, limit_bytes - headroom)
    cores = max(1, math.floor(cpus))
    # cicc processes that fit at once, bounded by memory and by cores (more than one per core only adds
    # memory)
    slots = max(1, min(cores, (capacity - base_bytes) // per_arch_bytes if capacity > base_bytes else 1))
    if nvcc_threads is None:
        threads = max(1, min(archs, DEFAULT_NVCC_THREADS, slots))
    else:
        threads = max(1, nvcc_threads)
    per_compile = per_compile_estimate(
        per_arch_bytes=per_arch_bytes, archs=archs, nvcc_threads=threads, base_bytes=base_bytes
    )
    by_memory = capacity // per_compile
    by_cpu = max(1, cores // min(threads, archs))
    jobs = max(1, min(by_memory, by_cpu))
    bound = "memory" if by_memory < by_cpu else "cpu"
    reason = (
        f"limit {format_gib(limit_bytes)} - headroom {format_gib(headroom)}; "
        f"one compile ~{format_gib(per_compile)} "
        f"({min(threads, archs)} x {format_gib(per_arch_bytes)} + {format_gib(base_bytes)}): "
        f"{jobs} jobs x {threads} nvcc threads "
        f"({bound}-bound{', even one compile may not fit' if by_memory < 1 else ''})"
    )
    return Parallelism(
        max_jobs=jobs,
        nvcc_threads=threads,
        per_compile_bytes=per_compile,
        reason=reason,
        per_arch_bytes=per_arch_bytes,
        ninja_jobs=max(jobs, ADMISSION_OVERCOMMIT * cores),
    )


# An OOM kill happens at the limit, so the usage seen then understates what the build wanted; the estimate is
# raised by this much above what was seen.
OOM_MARGIN = 1.25


def next_attempt(
    prev: Parallelism,
    *,
    oom_peak_bytes: int,
    limit_bytes: int,
    objects_done: int,
    objects_total: int,
    attempt: int = 2,
    archs: int = 1,
    headroom_bytes: int | None = None,
    base_bytes: int = DEFAULT_BASE_BYTES,
) -> Parallelism:
    """Less parallelism and a raised estimate after an OOM kill; `reason` is the report line of the
    attempt."""
    headroom = default_headroom(limit_bytes) if headroom_bytes is None else headroom_bytes
    seen_per_job = oom_peak_bytes / max(1, prev.max_jobs)
    per_compile = math.ceil(max(prev.per_compile_bytes, seen_per_job) * OOM_MARGIN)
    threads = prev.nvcc_threads
    jobs = max(1, min(prev.max_jobs - 1, (limit_bytes - headroom) // per_compile))
    if prev.max_jobs == 1 and threads > 1:
        # one compile at a time already: only fewer concurrent archs inside it can lower the peak
        threads = max(1, threads // 2)
    width = max(1, min(prev.nvcc_threads, archs))
    per_arch = max(prev.per_arch_bytes, math.ceil((per_compile - base_bytes) / width))
    line = (
        f"attempt {attempt}: OOM at {format_gib(oom_peak_bytes)}, jobs {prev.max_jobs} -> {jobs}"
        + (f", nvcc threads {prev.nvcc_threads} -> {threads}" if threads != prev.nvcc_threads else "")
        + f", {objects_done} of {objects_total} objects kept"
    )
    return replace(
        prev,
        max_jobs=jobs,
        nvcc_threads=threads,
        per_compile_bytes=per_compile,
        per_arch_bytes=per_arch,
        reason=line,
        # admission let this attempt be killed (a profile or estimate below what the compiles took): the retry
        # also bounds the compiles by count, or it would admit the same ones again and be killed the same way
        ninja_jobs=jobs,
    )
