"""A build job's view of memory: its first parallelism, the wrappers' environment, learned profiles.

The factory sets a build's MAX_JOBS and NVCC_THREADS here (`wrapper_env`) and nowhere else; a matrix's own env
for a job may still set them, and wins.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from factory.container import NVCC_LAUNCHER
from factory.container.admission import DEFAULT_BASE_BYTES, GIB, raised_by_file
from factory.container.protocol import WrapperEnv
from factory.core.validate import container_limits
from factory.memory import profiles
from factory.memory.planner import Parallelism, plan_parallelism
from factory.spec.options import Recipe

__all__ = [
    "PROFILE_DIR",
    "Parallelism",
    "container_limits",
    "file_estimate_bytes",
    "initial_parallelism",
    "record_profiles",
    "wrapper_env",
]

# Above this, the inline profile would press against the kernel's 128 KiB limit on one environment string
# (a flash-attn profile of 72 compiles, each course at 2 x 80 points, is about 130 KB): a larger one goes in a
# file.
INLINE_PROFILE_MAX = 100_000
# Where a job mounts its profile snapshot directory (read-only) in a build container.
PROFILE_DIR = "/opt/factory-profile"
PROFILE_FILE = "profile.json"
# Where in the job directory the wrappers append their measurements (FACTORY_PROFILE_OUT).
MEASUREMENTS_FILE = "compile-measurements.jsonl"


def initial_parallelism(
    *, recipe: Recipe, archs: int, limit_bytes: int, cpus: float, package: str, version: str,
    nvcc_threads: int | None = None, home: Path | None = None,
) -> Parallelism:  # fmt: skip
    """The plan for attempt 1: the recipe's estimate, raised to the worst per-arch peak learned so far."""
    per_arch = int(recipe.compile_gib_per_arch * GIB)
    learned = profiles.load_profile(profiles.profile_path(package, version, home=home))
    per_arch = profiles.raised_per_arch(per_arch, learned, base_bytes=DEFAULT_BASE_BYTES)
    return plan_parallelism(
        limit_bytes=limit_bytes, cpus=cpus, archs=archs, per_arch_bytes=per_arch, nvcc_threads=nvcc_threads
    )


def wrapper_env(
    parallel: Parallelism, *, recipe: Recipe, job_dir: str, memory_limit: int,
    package: str | None = None, version: str | None = None, home: Path | None = None,
    profile_dir: Path | None = None,
) -> dict[str, str]:  # fmt: skip
    """Environment of the build container that routes every nvcc call through the admission wrapper.

    MAX_JOBS becomes `parallel.ninja_jobs`: admission, not ninja, bounds how many compiles run. The real nvcc
    is found by the wrapper as $CUDA_HOME/bin/nvcc (or FACTORY_REAL_NVCC when set). The learned
    profile of `package` `version` is written into `profile_dir` (the host side of PROFILE_DIR) when given,
    else inlined when small enough.
    """
    per_arch = parallel.per_arch_bytes or int(recipe.compile_gib_per_arch * GIB)
    learned = None
    if package and version:
        learned = profiles.load_profile(profiles.profile_path(package, version, home=home))
    wrapper = WrapperEnv(
        state_dir=f"{job_dir}/memory-state",
        profile_out=f"{job_dir}/{MEASUREMENTS_FILE}",
        mem_limit=memory_limit,
        est_per_arch_bytes=per_arch,
        est_by_file=file_estimate_bytes(recipe, per_arch_bytes=per_arch),
        after_peak=recipe.compile_after_peak,
        seconds_by_file=recipe.compile_seconds_by_file,
    )
    if learned is not None and learned.entries:
        wrapper = with_profile(wrapper, learned, profile_dir)
    return {
        "PYTORCH_NVCC": NVCC_LAUNCHER,
        "MAX_JOBS": str(parallel.ninja_jobs or parallel.max_jobs),
        "NVCC_THREADS": str(parallel.nvcc_threads),
        **wrapper.to_env(),
    }


def with_profile(wrapper: WrapperEnv, learned: profiles.Profile, profile_dir: Path | None) -> WrapperEnv:
    """How the wrappers get the learned profile: a snapshot in `profile_dir`, readable by the container's
    unprivileged user (FACTORY_PROFILE_IN); without one, inline (FACTORY_PROFILE_JSON) when it fits in one
    environment string, else not at all."""
    if profile_dir is not None:
        path = profile_dir / PROFILE_FILE
        profiles.save_profile(learned, path)
        path.chmod(0o644)
        return dataclasses.replace(wrapper, profile_in=f"{PROFILE_DIR}/{PROFILE_FILE}")
    text = json.dumps(learned.to_json(), separators=(",", ":"))
    return dataclasses.replace(wrapper, profile_json=text) if len(text) <= INLINE_PROFILE_MAX else wrapper


def file_estimate_bytes(recipe: Recipe, *, per_arch_bytes: int | None = None) -> tuple[tuple[str, int], ...]:
    """The recipe's per-file table in bytes, raised with the plan's per-arch figure
    (`admission.raised_by_file`)."""
    fallback = int(recipe.compile_gib_per_arch * GIB)
    return raised_by_file(
        recipe.compile_gib_by_file,
        per_arch_bytes=per_arch_bytes or fallback,
        fallback_bytes=fallback,
        unit=GIB,
    )


def record_profiles(
    *, package: str, version: str, log_path: Path | None = None, job_dir_host: Path | None = None,
    home: Path | None = None,
) -> profiles.Profile | None:  # fmt: skip
    """Merge the compiles measured by one attempt (from the measurements file, else the build log)."""
    source: Path | None = None
    if job_dir_host is not None and (Path(job_dir_host) / MEASUREMENTS_FILE).exists():
        source = Path(job_dir_host) / MEASUREMENTS_FILE
    elif log_path is not None and Path(log_path).exists():
        source = Path(log_path)
    if source is None:
        return None
    return profiles.record(package, version, source, home=home)
