"""The OOM-retry loop on its own, with fake attempts: when it retries, with what plan, and why it stops."""

from __future__ import annotations

from dataclasses import replace

import pytest

from factory.memory import retry
from factory.memory.planner import Parallelism, next_attempt, plan_parallelism

GIB = 2**30
LIMIT = 16 * GIB


def first() -> Parallelism:
    return plan_parallelism(limit_bytes=LIMIT, cpus=8, archs=2, per_arch_bytes=GIB)


def outcome(*, ok: bool = False, oom: bool = False, peak: int = LIMIT, done: int = 0) -> retry.Outcome:
    return retry.Outcome(ok=ok, oom=oom, peak_bytes=peak, objects_done=done, objects_total=10)


class Script:
    """Attempts that end as scripted, recording the plan each one was given."""

    def __init__(self, *outcomes: retry.Outcome) -> None:
        self.outcomes = list(outcomes)
        self.plans: list[tuple[int, Parallelism]] = []

    def __call__(self, number: int, plan: Parallelism) -> retry.Outcome:
        self.plans.append((number, plan))
        return self.outcomes.pop(0)


def run(script: Script, *, max_attempts: int = 4, **kw: object) -> retry.Retries:
    return retry.run_attempts(first(), script, max_attempts=max_attempts, limit_bytes=LIMIT, archs=2, **kw)


def test_a_first_success_is_the_only_attempt() -> None:
    script = Script(outcome(ok=True, peak=GIB))
    retries = run(script)
    assert retries.stop == retry.STOP_OK
    assert [t.number for t in retries.tried] == [1]
    assert script.plans == [(1, first())]
    assert retries.last.next_plan is None


def test_each_oom_retries_with_the_planner_s_next_plan_from_the_objects_done() -> None:
    script = Script(outcome(oom=True, peak=15 * GIB, done=3), outcome(oom=True, peak=14 * GIB, done=6),
                    outcome(ok=True, peak=9 * GIB))  # fmt: skip
    retries = run(script)
    assert retries.stop == retry.STOP_OK
    kw = {"limit_bytes": LIMIT, "objects_total": 10, "archs": 2}
    second = next_attempt(first(), oom_peak_bytes=15 * GIB, objects_done=3, attempt=2, **kw)
    third = next_attempt(second, oom_peak_bytes=14 * GIB, objects_done=6, attempt=3, **kw)
    assert script.plans == [(1, first()), (2, second), (3, third)]
    assert [t.next_plan for t in retries.tried] == [second, third, None]
    assert second.reason == "attempt 2: OOM at 15.0 GiB, jobs 4 -> 3, 3 of 10 objects kept"
    assert retries.last.plan.max_jobs < first().max_jobs


def test_a_failure_that_is_no_oom_is_final() -> None:
    script = Script(outcome(oom=True), outcome(ok=False, oom=False), outcome(ok=True))
    retries = run(script)
    assert retries.stop == retry.STOP_FAILED
    assert [t.number for t in retries.tried] == [1, 2]
    assert retries.last.next_plan is None


def test_the_last_attempt_s_oom_ends_the_loop_without_a_next_plan() -> None:
    script = Script(*(outcome(oom=True) for _ in range(3)))
    retries = run(script, max_attempts=3)
    assert retries.stop == retry.STOP_NO_ATTEMPTS
    assert [n for n, _ in script.plans] == [1, 2, 3]
    assert retries.last.next_plan is None and all(t.next_plan for t in retries.tried[:-1])


def test_an_oom_after_which_nothing_would_change_stops_instead_of_repeating_it() -> None:
    def stuck(prev: Parallelism, **_: object) -> Parallelism:
        return replace(prev, reason="attempt 2: nothing left to lower")  # the same limits, a new reason

    script = Script(outcome(oom=True), outcome(ok=True))
    retries = run(script, plan_next=stuck)
    assert retries.stop == retry.STOP_UNCHANGED
    assert [n for n, _ in script.plans] == [1]
    assert retries.last.next_plan is not None and retry.same_plan(retries.last.next_plan, first())
    assert retries.last.next_plan.reason == "attempt 2: nothing left to lower"


def test_an_unknown_total_counts_the_objects_done() -> None:
    script = Script(retry.Outcome(ok=False, oom=True, peak_bytes=LIMIT, objects_done=4, objects_total=None),
                    outcome(ok=True))  # fmt: skip
    retries = run(script)
    assert retries.tried[0].next_plan is not None
    assert retries.tried[0].next_plan.reason.endswith("4 of 4 objects kept")


def test_max_attempts_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_attempts must be at least 1, not 0"):
        run(Script(), max_attempts=0)
