"""The best schedule an offline search finds with full hindsight, as a reference for the online admission.

Every compile's course is known exactly (no margins, no polling, the clock trusted), compiles are never
stopped once started, and the cores are a hard limit (no two compiles share a core). A serial schedule
generator places compiles one by one, in a priority order, each at the earliest second at which its whole
course fits beside those already placed (memory and threads); a local search over orders (swaps, accepted
when not worse), started from longest-first, keeps the best. What it finds is a schedule, so an upper bound
of the best non-preemptive makespan, not a lower bound; how far the online factory is from it tells what
better admission could still buy without sharing cores.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from factory.memory.simulate import Task


@dataclass(frozen=True, kw_only=True)
class OfflineResult:
    makespan_s: float
    orders_tried: int


def _grid(task: Task, step_s: float) -> tuple[list[int], list[int]]:
    """Per step: the most bytes and threads of the task during that step."""
    n = max(1, math.ceil(task.time_s / step_s - 1e-9))
    mem = [0] * n
    cpu = [0] * n
    t = 0.0
    for d, m, threads in task.phases:
        first = int(t / step_s)
        last = min(n - 1, max(first, math.ceil((t + d) / step_s - 1e-9) - 1))
        for i in range(first, last + 1):
            mem[i] = max(mem[i], m)
            cpu[i] = max(cpu[i], threads)
        t += d
    return mem, cpu


def _place(order: Sequence[int], grids: Sequence[tuple[list[int], list[int]]], cap: int, cores: int) -> int:
    horizon = sum(len(g[0]) for g in grids) + 1
    mem = [0] * horizon
    cpu = [0] * horizon
    end = 0
    for i in order:
        m, c = grids[i]
        start = 0
        while True:
            clash = next(
                (k for k in range(len(m)) if mem[start + k] + m[k] > cap or cpu[start + k] + c[k] > cores),
                None,
            )
            if clash is None:
                break
            start += clash + 1
        for k in range(len(m)):
            mem[start + k] += m[k]
            cpu[start + k] += c[k]
        end = max(end, start + len(m))
    return end


def best_offline(
    tasks: Sequence[Task],
    *,
    limit_bytes: int,
    cores: int,
    base_bytes: int = 0,
    step_s: float = 1.0,
    tries: int = 300,
    seed: int = 1,
) -> OfflineResult:
    grids = [_grid(t, step_s) for t in tasks]
    cap = limit_bytes - base_bytes
    order = sorted(range(len(tasks)), key=lambda i: -tasks[i].time_s)
    best = current = _place(order, grids, cap, cores)
    rng = random.Random(seed)
    for _ in range(tries):
        candidate = order[:]
        for _ in range(rng.randint(1, 3)):
            a, b = rng.randrange(len(order)), rng.randrange(len(order))
            candidate[a], candidate[b] = candidate[b], candidate[a]
        value = _place(candidate, grids, cap, cores)
        if value <= current:
            order, current = candidate, value
            best = min(best, value)
    return OfflineResult(makespan_s=best * step_s, orders_tried=tries + 1)
