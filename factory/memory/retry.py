"""The OOM-retry loop: attempts of one build, each with less parallelism than the one an OOM kill ended.

The runner, the simulator and the real benchmark all go through `run_attempts`; each hands in how one
attempt runs (a container, a simulated ninja, a cgroup) and gets back what was tried and why it stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from factory.container.admission import DEFAULT_BASE_BYTES
from factory.memory.planner import Parallelism, next_attempt


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What the loop needs of one attempt."""

    ok: bool
    oom: bool  # the attempt was OOM-killed; a failure without it is final
    peak_bytes: int
    objects_done: int  # objects present when it ended: a retry resumes from them
    objects_total: int | None  # None: unknown, taken as `objects_done`


@dataclass(frozen=True, kw_only=True)
class Tried:
    number: int
    plan: Parallelism
    outcome: Outcome
    next_plan: Parallelism | None = None  # the plan an OOM kill led to, also when it was not run


STOP_OK = "ok"
STOP_FAILED = "failed"  # a failure that was no OOM kill: a retry would fail the same way
STOP_NO_ATTEMPTS = "no attempts left"
STOP_UNCHANGED = "nothing to change"  # the next plan equals this one: a retry would repeat the same OOM


@dataclass(frozen=True, kw_only=True)
class Retries:
    tried: tuple[Tried, ...]
    stop: str  # one of the STOP_* reasons

    @property
    def last(self) -> Tried:
        return self.tried[-1]


def same_plan(a: Parallelism, b: Parallelism) -> bool:
    return (a.max_jobs, a.nvcc_threads, a.per_compile_bytes) == (
        b.max_jobs,
        b.nvcc_threads,
        b.per_compile_bytes,
    )


def run_attempts(
    first: Parallelism,
    attempt: Callable[[int, Parallelism], Outcome],
    *,
    max_attempts: int,
    limit_bytes: int,
    archs: int,
    base_bytes: int = DEFAULT_BASE_BYTES,
    plan_next: Callable[..., Parallelism] = next_attempt,
) -> Retries:
    """`attempt(number, plan)` from `first` until success, a failure that is no OOM kill, the last attempt,
    or an OOM after which the next plan would change nothing. A retry's plan is `plan_next`'s
    (`planner.next_attempt`, called with its keywords)."""
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, not {max_attempts}")
    plan = first
    tried: list[Tried] = []
    for number in range(1, max_attempts + 1):
        outcome = attempt(number, plan)
        if outcome.ok:
            return Retries(tried=(*tried, Tried(number=number, plan=plan, outcome=outcome)), stop=STOP_OK)
        if not outcome.oom:
            return Retries(tried=(*tried, Tried(number=number, plan=plan, outcome=outcome)), stop=STOP_FAILED)
        if number == max_attempts:
            tried.append(Tried(number=number, plan=plan, outcome=outcome))
            break
        nxt = plan_next(
            plan,
            oom_peak_bytes=outcome.peak_bytes,
            limit_bytes=limit_bytes,
            objects_done=outcome.objects_done,
            objects_total=outcome.objects_done if outcome.objects_total is None else outcome.objects_total,
            attempt=number + 1,
            archs=archs,
            base_bytes=base_bytes,
        )
        tried.append(Tried(number=number, plan=plan, outcome=outcome, next_plan=nxt))
        if same_plan(nxt, plan):
            return Retries(tried=tuple(tried), stop=STOP_UNCHANGED)
        plan = nxt
    return Retries(tried=tuple(tried), stop=STOP_NO_ATTEMPTS)
