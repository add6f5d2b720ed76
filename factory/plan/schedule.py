"""The order jobs start in: a variant's Python jobs back to back, so the later ones find the first one's
compiles in the compile cache, while different variants run side by side.

A variant's first job (its "lead", the first in plan order) starts as soon as a slot is free. The variant's
other jobs wait until the lead has finished (whatever its result), then start before any lead of a variant not
yet begun: they are mostly cache hits, quick, and finishing a variant early publishes it early. The lead runs
cold whatever the order; what waiting saves is the second cold compile of the same objects that two of its
Pythons started together would make.

A variant's jobs for another platform are a group of their own, with a lead of their own: their compilers are
other binaries (the compile cache's keys name each compiler's identity), so they would find none of the
first platform's objects and have nothing to wait for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from factory.core.errors import ConfigError
from factory.plan.plan import Job


def group(job: Job) -> tuple[object, object]:
    """The jobs that share compiles: one variant's, for one platform."""
    return job.variant, job.platform


def variant_order(jobs: Sequence[Job]) -> list[int]:
    """Indexes of `jobs` with each group's jobs consecutive (a variant's, per platform): groups in order of
    first appearance, each group's jobs in plan order."""
    groups: dict[object, list[int]] = {}
    for index, job in enumerate(jobs):
        groups.setdefault(group(job), []).append(index)
    return [index for members in groups.values() for index in members]


@dataclass(kw_only=True)
class Schedule:
    """Which of `jobs` may start now. The caller reports each start (`take`) and each end (`finish`); jobs
    are named by their index in `jobs`."""

    jobs: Sequence[Job]

    def __post_init__(self) -> None:
        self._order = variant_order(self.jobs)
        self._lead: dict[object, int] = {}
        for index in self._order:
            self._lead.setdefault(group(self.jobs[index]), index)
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
            lead = self._lead[group(self.jobs[index])]
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


@dataclass(frozen=True, kw_only=True)
class Needs:
    """One matrix of a run, as its order sees it: its package (canonical name), the projects its runtime
    requirements name, and its file, as messages name it."""

    project: str
    requires: frozenset[str]
    matrix: str


def matrix_order(matrices: Sequence[Needs]) -> list[int]:
    """The order a run builds several matrices in: each one after every matrix whose package its runtime
    requirements name (so its install check finds that wheel), otherwise in the order given. ConfigError,
    one line, for two matrices of one package or a cycle (named matrix by matrix)."""
    owner: dict[str, int] = {}
    for index, m in enumerate(matrices):
        if m.project in owner:
            first = matrices[owner[m.project]].matrix
            raise ConfigError(
                f"{first} and {m.matrix} both build {m.project}: one matrix per package in a run"
            )
        owner[m.project] = index
    after = [
        sorted({owner[name] for name in m.requires if name in owner} - {i}) for i, m in enumerate(matrices)
    ]
    order: list[int] = []
    placed: set[int] = set()
    while len(order) < len(matrices):
        ready = [i for i in range(len(matrices)) if i not in placed and all(d in placed for d in after[i])]
        if not ready:
            raise ConfigError(f"a dependency cycle between the matrices: {_cycle(matrices, after, placed)}")
        order.append(ready[0])
        placed.add(ready[0])
    return order


def _cycle(matrices: Sequence[Needs], after: Sequence[Sequence[int]], placed: set[int]) -> str:
    """One cycle among the matrices not placed: "a.yaml (pkg-a) needs pkg-b, b.yaml (pkg-b) needs pkg-a"."""
    start = min(i for i in range(len(matrices)) if i not in placed)
    path, seen = [start], {start}
    while True:
        nxt = next(d for d in after[path[-1]] if d not in placed)
        if nxt in seen:
            path = path[path.index(nxt) :]
            break
        path.append(nxt)
        seen.add(nxt)
    steps = [
        f"{matrices[i].matrix} ({matrices[i].project}) needs {matrices[path[(k + 1) % len(path)]].project}"
        for k, i in enumerate(path)
    ]
    return ", ".join(steps)
