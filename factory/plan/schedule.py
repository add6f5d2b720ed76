"""The order jobs start in: a variant's Python jobs back to back, so the later ones find the first one's
compiles in the compile cache, while different variants run side by side.

A variant's first job (its "lead", the first in plan order) starts as soon as a slot is free. The variant's
other jobs wait until the lead has finished (whatever its result), then start before any lead of a variant not
yet begun: they are mostly cache hits, quick, and finishing a variant early publishes it early. The lead runs
cold whatever the order; what waiting saves is the second cold compile of the same objects that two of its
Pythons started together would make.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from factory.plan.plan import Job


def variant_order(jobs: Sequence[Job]) -> list[int]:
    """Indexes of `jobs` with each variant's jobs consecutive: variants in order of first appearance, each
    variant's jobs in plan order."""
    groups: dict[object, list[int]] = {}
    for index, job in enumerate(jobs):
        groups.setdefault(job.variant, []).append(index)
    return [index for group in groups.values() for index in group]


@dataclass(kw_only=True)
class Schedule:
    """Which of `jobs` may start now. The caller reports each start (`take`) and each end (`finish`); jobs
    are named by their index in `jobs`."""

    jobs: Sequence[Job]

    def __post_init__(self) -> None:
        self._order = variant_order(self.jobs)
        self._lead: dict[object, int] = {}
        for index in self._order:
            self._lead.setdefault(self.jobs[index].variant, index)
        self._waiting = list(self._order)
        self._running: set[int] = set()
        self._finished: set[int] = set()

    @property
    def waiting(self) -> tuple[int, ...]:
        """The jobs not started yet, in the order they would start."""
        return tuple(self._waiting)

    @property
    def running(self) -> frozenset[int]:
        return frozenset(self._running)

    def ready(self) -> list[int]:
        """The waiting jobs that may start now, best first: followers whose lead has finished, then leads."""
        followers, leads = [], []
        for index in self._waiting:
            lead = self._lead[self.jobs[index].variant]
            if index == lead:
                leads.append(index)
            elif lead in self._finished:
                followers.append(index)
        return followers + leads

    def take(self, slots: int) -> list[int]:
        """Start up to `slots` ready jobs; returns them, marked running."""
        started = self.ready()[: max(0, slots)]
        for index in started:
            self._waiting.remove(index)
            self._running.add(index)
        return started

    def finish(self, index: int) -> None:
        if index not in self._running:
            raise ValueError(f"job {index} is not running")
        self._running.remove(index)
        self._finished.add(index)
