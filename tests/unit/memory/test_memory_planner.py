"""Planner arithmetic, container limits against a budget, and the OOM retry policy."""

from __future__ import annotations

import math

import pytest

from factory.container.admission import DEFAULT_BASE_BYTES, default_headroom, per_compile_estimate
from factory.core.errors import ConfigError
from factory.core.validate import container_limits
from factory.memory.planner import Parallelism, next_attempt, plan_parallelism

GIB = 2**30


def test_per_compile_estimate_counts_concurrent_archs() -> None:
    # each nvcc thread compiles one arch at a time: 4 threads over 2 archs run only 2 cicc
    assert per_compile_estimate(per_arch_bytes=GIB, archs=2, nvcc_threads=4, base_bytes=0) == 2 * GIB
    assert per_compile_estimate(per_arch_bytes=GIB, archs=4, nvcc_threads=2, base_bytes=7) == 2 * GIB + 7
    assert per_compile_estimate(per_arch_bytes=GIB, archs=4, nvcc_threads=1, base_bytes=0) == GIB


def test_plan_memory_bound() -> None:
    # 64 GiB, 32 cores, 4 archs x 4 threads at 6.6 GiB: one compile ~26.6 GiB, two fit, cores would allow 8
    p = plan_parallelism(
        limit_bytes=64 * GIB, cpus=32, archs=4, per_arch_bytes=int(6.6 * GIB), nvcc_threads=4
    )
    headroom = default_headroom(64 * GIB)
    per = 4 * int(6.6 * GIB) + DEFAULT_BASE_BYTES
    assert p.per_compile_bytes == per
    assert p.max_jobs == (64 * GIB - headroom) // per == 2
    assert p.nvcc_threads == 4
    assert "memory-bound" in p.reason
    assert (
        p.ninja_jobs >= 32
    )  # admission, not ninja, bounds memory: ninja may start a waiter per core and more


def test_plan_cpu_bound() -> None:
    p = plan_parallelism(limit_bytes=400 * GIB, cpus=8, archs=4, per_arch_bytes=GIB, nvcc_threads=4)
    assert p.max_jobs == 2  # 8 cores / 4 threads
    assert "cpu-bound" in p.reason


def test_plan_always_one_job_and_threads_follow_memory() -> None:
    p = plan_parallelism(limit_bytes=4 * GIB, cpus=16, archs=4, per_arch_bytes=3 * GIB)
    assert p.max_jobs == 1
    assert p.nvcc_threads == 1  # only one cicc fits: more threads would only raise the peak


@pytest.mark.parametrize(
    ("limit", "cpus", "archs", "per_arch"),
    [
        (0, 1, 1, 1),
        (GIB, 0, 1, 1),
        (GIB, -1, 1, 1),
        (GIB, math.nan, 1, 1),
        (GIB, math.inf, 1, 1),
        (GIB, 1, 0, 1),
        (GIB, 1, 1, 0),
    ],
)
def test_plan_rejects_nonsense(limit: int, cpus: float, archs: int, per_arch: int) -> None:
    with pytest.raises(ConfigError, match="needs a positive limit"):
        plan_parallelism(limit_bytes=limit, cpus=cpus, archs=archs, per_arch_bytes=per_arch)


def test_container_limits_sum_to_budget() -> None:
    limits = container_limits(budget_bytes=100 * GIB, concurrency=3)
    assert limits == [100 * GIB // 3] * 3
    assert sum(limits) <= 100 * GIB
    assert container_limits(budget_bytes=100 * GIB, concurrency=2, per_job_bytes=40 * GIB) == [40 * GIB] * 2
    with pytest.raises(ConfigError, match="exceed the memory budget"):
        container_limits(budget_bytes=100 * GIB, concurrency=3, per_job_bytes=40 * GIB)


def test_container_limits_default_budget_is_fraction_of_host() -> None:
    assert container_limits(concurrency=2, host_bytes=64 * GIB) == [24 * GIB, 24 * GIB]
    with pytest.raises(ConfigError):
        container_limits(concurrency=0, budget_bytes=GIB)


def test_next_attempt_reduces_jobs_and_raises_estimate() -> None:
    prev = Parallelism(
        max_jobs=8, nvcc_threads=4, per_compile_bytes=2 * GIB, reason="", per_arch_bytes=GIB // 2
    )
    nxt = next_attempt(prev, oom_peak_bytes=int(23.8 * GIB), limit_bytes=24 * GIB, objects_done=41,
                       objects_total=73, archs=4)  # fmt: skip
    assert nxt.max_jobs < 8
    assert nxt.per_compile_bytes > 23.8 * GIB / 8  # above what was seen per job: the OOM cut the usage short
    assert nxt.per_arch_bytes > prev.per_arch_bytes
    assert nxt.reason == f"attempt 2: OOM at 23.8 GiB, jobs 8 -> {nxt.max_jobs}, 41 of 73 objects kept"


def test_next_attempt_bounds_ninja_too() -> None:
    # admission let attempt 1 be killed: with ninja still at -j 32 the retry would admit the same compiles
    prev = Parallelism(
        max_jobs=8,
        nvcc_threads=4,
        per_compile_bytes=2 * GIB,
        reason="",
        per_arch_bytes=GIB // 2,
        ninja_jobs=32,
    )
    nxt = next_attempt(prev, oom_peak_bytes=24 * GIB, limit_bytes=24 * GIB, objects_done=0, objects_total=9)
    assert nxt.ninja_jobs == nxt.max_jobs < 8


def test_next_attempt_at_one_job_halves_threads() -> None:
    prev = Parallelism(max_jobs=1, nvcc_threads=4, per_compile_bytes=10 * GIB, reason="", per_arch_bytes=GIB)
    nxt = next_attempt(prev, oom_peak_bytes=16 * GIB, limit_bytes=16 * GIB, objects_done=0, objects_total=9,
                       attempt=3, archs=4)  # fmt: skip
    assert (nxt.max_jobs, nxt.nvcc_threads) == (1, 2)
    assert nxt.reason.startswith("attempt 3: OOM at 16.0 GiB, jobs 1 -> 1, nvcc threads 4 -> 2")
