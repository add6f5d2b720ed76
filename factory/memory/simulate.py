"""Deterministic discrete-event simulation of a ninja build of compile tasks under a memory limit.

Each task is a sequence of phases (seconds at full speed, resident bytes, busy threads); the tasks' memory
adds up, and when the sum passes the limit the container is OOM-killed. The factory strategy runs the same
dispatch round (`factory.container.admission.dispatch`) and peak grants (`admission.grant_peak`) the nvcc
wrappers run in a build container, and the same OOM-retry loop (`factory.memory.retry`) a build job runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from factory.container import admission
from factory.container.admission import Prediction
from factory.memory import retry
from factory.memory.planner import Parallelism, plan_parallelism

EPS = 1e-9


@dataclass(frozen=True, kw_only=True)
class Task:
    name: str
    phases: tuple[tuple[float, int, int], ...]  # (seconds at full speed, bytes, threads)

    @property
    def peak_bytes(self) -> int:
        return max(m for _, m, _ in self.phases)

    @property
    def time_s(self) -> float:
        return sum(d for d, _, _ in self.phases)

    @property
    def cpu_s(self) -> float:
        return sum(d * t for d, _, t in self.phases)

    def samples(self) -> list[tuple[float, int]]:
        """What the wrapper would sample of this task's RSS over a run at full speed."""
        samples: list[tuple[float, int]] = []
        t = 0.0
        for d, m, _ in self.phases:
            steps = max(1, math.ceil(d))
            # mid-step, as a sampler at an arbitrary phase sees it: never exactly on a phase boundary
            samples.extend((t + d * (i + 0.5) / steps, m) for i in range(steps))
            t += d
        return samples

    def measured(self) -> Prediction:
        """The profile entry the wrapper would record of a run at full speed (before any margin)."""
        samples = self.samples()
        return Prediction(
            peak_bytes=self.peak_bytes,
            wall_s=self.time_s,
            envelope=admission.envelope(samples, self.time_s),
            rise=admission.rise(samples, self.time_s),
        )


@dataclass(frozen=True, kw_only=True)
class AttemptResult:
    makespan_s: float
    oom: bool
    completed: frozenset[str]
    peak_bytes: int
    compiled: int  # tasks finished in this attempt


@dataclass(frozen=True, kw_only=True)
class StrategyResult:
    makespan_s: float
    oom_kills: int
    failed: bool
    peak_bytes: int
    attempts: tuple[str, ...] = ()
    jobs: int | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "makespan_s": round(self.makespan_s, 1),
            "oom_kills": self.oom_kills,
            "failed": self.failed,
            "peak_bytes": self.peak_bytes,
        }


@dataclass(frozen=True, kw_only=True)
class AdmissionModel:
    """What the wrappers know in one attempt: the limit they read, and a prediction per task."""

    limit_bytes: int
    headroom_bytes: int
    cpus: float
    predictions: Mapping[str, Prediction] = field(default_factory=lambda: MappingProxyType({}))
    default: Prediction = field(default_factory=lambda: Prediction(peak_bytes=1))
    # the wrappers read the measurements of the compiles already finished in this build (online learning)
    online: bool = True
    waves: int = 1  # ceil(archs / nvcc threads): cicc runs per compile one after the other
    # the recipe's estimate of each unprofiled task, as the wrapper computes it (admission.compile_estimate);
    # a task not named here takes `default`
    estimates: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    # a compile with a low front end starts with it, and is stopped at its rise until its peak is granted
    two_stage: bool = True
    # a compile whose peak is an estimate may start by what the running compiles hold, beside lines they
    # are stopped at (`admission.metered`)
    measured: bool = True
    poll_s: float = 1.0  # how often a waiting wrapper asks again (FACTORY_POLL_S is 0.5 s)
    after_peak: float | None = None  # the recipe's compile_after_peak (FACTORY_AFTER_PEAK)
    # the recipe's compile_seconds_by_file (FACTORY_SECONDS_BY_FILE), keyed by the tasks' names
    seconds_by_file: tuple[tuple[str, float], ...] = ()

    def predict(self, name: str, measured: Mapping[str, Mapping[str, object]]) -> Prediction:
        """What the wrapper of `name` predicts from the profile (`predictions`, also in `measured`) and, when
        online, the compiles of this build measured so far."""
        known = measured if self.online else {k: v for k, v in measured.items() if k in self.predictions}
        estimate = self.estimates.get(name, self.default.peak_bytes)
        return admission.predict_from(
            known,
            name,
            estimate_bytes=estimate,
            after_peak=self.after_peak,
            seconds_by_file=self.seconds_by_file,
        )


def _entry(p: Prediction) -> dict[str, object]:
    """A measurement in the profile file's form, as the wrapper reads it."""
    return {
        "peak_bytes": p.peak_bytes,
        "wall_s": p.wall_s,
        "envelope": list(p.envelope),
        "rise": list(p.rise),
    }


@dataclass
class _Run:
    task: Task
    phase: int
    left: float
    started: float
    prediction: Prediction
    seen: int = 0  # the most RSS of this run so far, as the wrapper samples it
    front: int | None = None  # admitted for its front end only: its peak is granted when it rises
    paused: bool = False  # stopped at its rise (SIGSTOP) until its peak is granted
    line: int | None = None  # admitted by measured memory: stopped once above it until its peak is granted
    paused_s: float = 0.0
    ticket: int = 0
    steady: int = 0  # the RSS it held when it last grew (`admission.STEADY_GROWTH`), and since when
    steady_at: float = 0.0

    @property
    def rss(self) -> int:
        return self.task.phases[self.phase][1]

    def sampled(self, now: float) -> None:
        """What its wrapper (and the dispatcher) record of its RSS: the most seen, and when it last grew."""
        self.seen = max(self.seen, self.rss)
        if self.rss > self.steady * admission.STEADY_GROWTH:
            self.steady, self.steady_at = self.rss, now

    @property
    def threads(self) -> int:
        return 0 if self.paused else self.task.phases[self.phase][2]


def run_attempt(
    tasks: Sequence[Task],
    *,
    limit_bytes: int,
    cores: float,
    jobs: int,
    base_bytes: int = 0,
    admit: AdmissionModel | None = None,
    done: frozenset[str] = frozenset(),
) -> AttemptResult:
    """One ninja run with -j `jobs`; with `admit`, started tasks wait for admission like wrapped nvcc
    calls."""
    pending = [t for t in tasks if t.name not in done]
    pending.reverse()  # pop() takes the next in ninja's order
    waiting: list[tuple[int, Task, Prediction]] = []  # (ticket, task, prediction)
    running: list[_Run] = []
    finished = set(done)
    now = 0.0
    peak = base_bytes
    ticket = 0
    measured: dict[str, dict[str, object]] = {}
    if admit is not None:
        measured = {n: _entry(p) for n, p in admit.predictions.items()}
    while True:
        while pending and len(waiting) + len(running) < jobs:
            task = pending.pop()
            if admit is None:
                running.append(
                    _Run(task=task, phase=0, left=task.phases[0][0], started=now, prediction=Prediction(0))
                )
            else:
                pred = admit.predict(task.name, measured)
                waiting.append((ticket, task, pred))
                ticket += 1
        if admit is not None:
            _admit(waiting, running, admit, now=now, base_bytes=base_bytes)
        used = base_bytes + sum(r.task.phases[r.phase][1] for r in running)
        peak = max(peak, used)
        if used > limit_bytes:
            return AttemptResult(
                makespan_s=now,
                oom=True,
                completed=frozenset(finished),
                peak_bytes=peak,
                compiled=len(finished) - len(done),
            )
        if not running:
            if waiting:  # cannot happen: admission always admits when nothing runs
                raise AssertionError("admission deadlock")
            return AttemptResult(
                makespan_s=now,
                oom=False,
                completed=frozenset(finished),
                peak_bytes=peak,
                compiled=len(finished) - len(done),
            )
        busy = sum(r.threads for r in running)
        speed = min(1.0, cores / busy) if busy else 1.0
        active = [r.left for r in running if not r.paused]
        if not active:
            raise AssertionError("every compile is paused")
        step = min(active) / speed
        if waiting and admit is not None:
            # reservations fall with the clock, not only at phase changes: waiting wrappers poll
            step = min(step, admit.poll_s)
        now += step
        still: list[_Run] = []
        for r in running:
            if r.paused:
                r.paused_s += step
            else:
                r.left -= step * speed
            while not r.paused and r.left <= EPS:
                after = r.task.phases[r.phase + 1][1] if r.phase + 1 < len(r.task.phases) else 0
                if r.front is not None and admission.rises(r.front, after) and r.line is not None:
                    r.front = None  # rising from its front end within its line: it goes on to its line
                if (r.front is not None and admission.rises(r.front, after)) or (
                    r.line is not None and after > r.line
                ):
                    r.paused = True  # it rises: its wrapper stops it until its peak is granted
                    r.left = 0.0
                    break
                r.phase += 1
                if r.phase == len(r.task.phases):
                    break
                r.left += r.task.phases[r.phase][0]
                r.sampled(now)
            if r.phase == len(r.task.phases):
                finished.add(r.task.name)
                if admit is not None and admit.online:
                    measured[r.task.name] = _entry(r.task.measured())
            else:
                still.append(r)
        if admit is not None and admit.online and len(still) < len(running):
            # waiting wrappers re-read the measurements and predict again; so do running ones the profile
            # does not know (`factory.container.gate.Admission.sampled`)
            for i, (arrival, task, _) in enumerate(waiting):
                waiting[i] = (arrival, task, admit.predict(task.name, measured))
            for r in still:
                if r.task.name not in admit.predictions:
                    r.prediction = admit.predict(r.task.name, measured)
        running = still


def _state(r: _Run, now: float, admit: AdmissionModel) -> admission.Running:
    """What the wrappers see of a running task (`admission.running`): its ticket is its pid."""
    return admission.running(
        r.ticket,
        r.prediction,
        elapsed_s=now - r.started - r.paused_s,
        seen_bytes=r.seen,
        rss_bytes=r.rss,
        threads=r.task.phases[r.phase][2],
        waves=admit.waves,
        front_bytes=r.front,
        paused=r.paused,
        line_bytes=r.line,
        steady_s=now - r.steady_at,
    )


def _admit(
    waiting: list[tuple[int, Task, Prediction]],
    running: list[_Run],
    admit: AdmissionModel,
    *,
    now: float,
    base_bytes: int,
) -> None:
    """Grant the peaks of stopped tasks (longest first), then start waiting tasks, as the wrappers would."""
    limits: dict[str, Any] = {
        "limit_bytes": admit.limit_bytes,
        "headroom_bytes": admit.headroom_bytes,
        "cpus": admit.cpus,
    }
    for r in sorted(
        (r for r in running if r.paused), key=lambda r: admission.priority(r.prediction.rank_s, r.ticket)
    ):
        state = [_state(o, now, admit) for o in running]
        mine = state[running.index(r)]
        # its wrapper asks once it has sampled its RSS above its front end or line: the next phase's
        own = replace(mine, rss_bytes=max(mine.rss_bytes, r.task.phases[r.phase + 1][1]))
        grant = admission.grant_peak(
            own,
            used_bytes=base_bytes + sum(x.rss_bytes for x in state if x is not mine) + own.rss_bytes,
            others=[x for x in state if x is not mine],
            threads=max(t for _, _, t in r.task.phases),
            **limits,
        )
        if grant.admit:
            r.paused = False
            r.front = None
            r.line = grant.line_bytes
            r.phase += 1
            r.left = r.task.phases[r.phase][0]
            r.sampled(now)
    if not waiting:
        return
    state = [_state(r, now, admit) for r in running]
    decided = admission.dispatch(
        [
            admission.Waiting(
                key=str(ticket),
                prediction=pred,
                threads=max(t for _, _, t in task.phases),
                ticket=ticket,
                pid=ticket,
                waves=admit.waves,
            )
            for ticket, task, pred in waiting
        ],
        used_bytes=base_bytes + sum(x.rss_bytes for x in state),
        running=state,
        two_stage=admit.two_stage,
        measured=admit.measured,
        **limits,
    )
    by_ticket = {r.ticket: r for r in running}
    for start in decided.starts:
        for pid, line in start.decision.lines:
            by_ticket[pid].line = line
        at = next(i for i, (ticket, _, _) in enumerate(waiting) if ticket == start.waiting.ticket)
        ticket, task, pred = waiting.pop(at)
        run = _Run(
            task=task,
            phase=0,
            left=task.phases[0][0],
            started=now,
            prediction=pred,
            seen=task.phases[0][1],
            steady=task.phases[0][1],
            steady_at=now,
            front=start.front_bytes,
            line=start.decision.line_bytes,
            ticket=ticket,
        )
        running.append(run)
        by_ticket[ticket] = run


def simulate_fixed(
    tasks: Sequence[Task], *, limit_bytes: int, cores: float, jobs: int, base_bytes: int = 0
) -> StrategyResult:
    r = run_attempt(tasks, limit_bytes=limit_bytes, cores=cores, jobs=jobs, base_bytes=base_bytes)
    return StrategyResult(
        makespan_s=r.makespan_s,
        oom_kills=int(r.oom),
        failed=r.oom,
        peak_bytes=r.peak_bytes,
        attempts=(f"MAX_JOBS={jobs}: {'OOM' if r.oom else 'ok'} at {r.makespan_s:.0f} s",),
        jobs=jobs,
    )


def simulate_best_fixed(
    tasks: Sequence[Task], *, limit_bytes: int, cores: float, base_bytes: int = 0, max_jobs: int | None = None
) -> StrategyResult:
    """The MAX_JOBS with the shortest successful build, known only in hindsight."""
    best: StrategyResult | None = None
    for jobs in range(1, (max_jobs or max(1, math.floor(cores))) + 1):
        r = simulate_fixed(tasks, limit_bytes=limit_bytes, cores=cores, jobs=jobs, base_bytes=base_bytes)
        if not r.failed and (best is None or r.makespan_s < best.makespan_s - EPS):
            best = r
    if best is None:
        return simulate_fixed(tasks, limit_bytes=limit_bytes, cores=cores, jobs=1, base_bytes=base_bytes)
    return best


def simulate_seed_halving(
    tasks: Sequence[Task],
    *,
    limit_bytes: int,
    cores: float,
    start_jobs: int | None = None,
    base_bytes: int = 0,
) -> StrategyResult:
    """The seed's loop: MAX_JOBS = cores, and after each OOM kill half of it, restarting from scratch."""
    jobs = start_jobs or max(1, math.floor(cores))
    total = 0.0
    kills = 0
    peak = 0
    lines: list[str] = []
    while True:
        r = run_attempt(tasks, limit_bytes=limit_bytes, cores=cores, jobs=jobs, base_bytes=base_bytes)
        total += r.makespan_s
        peak = max(peak, r.peak_bytes)
        lines.append(f"MAX_JOBS={jobs}: {'OOM' if r.oom else 'ok'} after {r.makespan_s:.0f} s")
        if not r.oom:
            return StrategyResult(
                makespan_s=total,
                oom_kills=kills,
                failed=False,
                peak_bytes=peak,
                attempts=tuple(lines),
                jobs=jobs,
            )
        kills += 1
        if jobs == 1:
            return StrategyResult(
                makespan_s=total,
                oom_kills=kills,
                failed=True,
                peak_bytes=peak,
                attempts=tuple(lines),
                jobs=jobs,
            )
        jobs = max(1, jobs // 2)


def flash_attn_heuristic_jobs(*, cores: int, free_bytes: int) -> int:
    """flash-attn's setup.py default: min(cores/2, free GB/9), from the host's free memory."""
    return max(1, min(max(1, cores // 2), int(free_bytes / 2**30 / 9)))


def simulate_factory(
    tasks: Sequence[Task],
    *,
    limit_bytes: int,
    cores: float,
    archs: int,
    nvcc_threads: int,
    per_arch_bytes: int,
    est_base_bytes: int = admission.DEFAULT_BASE_BYTES,
    base_bytes: int = 0,
    profile: Mapping[str, Prediction] | None = None,
    max_attempts: int = 5,
    by_file: Sequence[tuple[str, int]] = (),
    after_peak: float | None = None,
    seconds_by_file: Sequence[tuple[str, float]] = (),
    measured: bool = True,
) -> tuple[StrategyResult, dict[str, Prediction]]:
    """Planner + per-compile admission + resume after OOM (`retry.run_attempts`, the runner's loop); returns
    the result and the profile it learned.

    `by_file` is the recipe's per-file table in bytes (jobmemory.file_estimate_bytes), raised with the plan's
    per-arch figure after an OOM as a job raises it; `after_peak` is the recipe's compile_after_peak,
    `seconds_by_file` its compile_seconds_by_file; `measured` lets a compile start by what the others hold
    (`admission.metered`)."""
    first = plan_parallelism(
        limit_bytes=limit_bytes,
        cpus=cores,
        archs=archs,
        per_arch_bytes=per_arch_bytes,
        nvcc_threads=nvcc_threads,
        base_bytes=est_base_bytes,
    )
    headroom = admission.default_headroom(limit_bytes)
    learned: dict[str, Prediction] = dict(profile or {})
    done: frozenset[str] = frozenset()
    runs: list[AttemptResult] = []
    by_name = {t.name: t for t in tasks}

    def attempt(_number: int, par: Parallelism) -> retry.Outcome:
        nonlocal done
        estimate = admission.per_compile_estimate(
            per_arch_bytes=par.per_arch_bytes,
            archs=archs,
            nvcc_threads=par.nvcc_threads,
            base_bytes=est_base_bytes,
        )
        table = admission.raised_by_file(
            by_file, per_arch_bytes=par.per_arch_bytes, fallback_bytes=per_arch_bytes
        )
        estimates = {
            t.name: admission.compile_estimate(
                t.name,
                per_arch_bytes=par.per_arch_bytes,
                archs=archs,
                nvcc_threads=par.nvcc_threads,
                base_bytes=est_base_bytes,
                by_file=table,
            )
            for t in tasks
        }
        model = AdmissionModel(
            limit_bytes=limit_bytes,
            headroom_bytes=headroom,
            cpus=cores,
            predictions=MappingProxyType(learned),
            default=Prediction(peak_bytes=estimate),
            estimates=MappingProxyType(estimates),
            waves=-(-max(1, archs) // max(1, min(par.nvcc_threads, archs))),
            after_peak=after_peak,
            seconds_by_file=tuple(seconds_by_file),
            measured=measured,
        )
        r = run_attempt(
            tasks,
            limit_bytes=limit_bytes,
            cores=cores,
            jobs=par.ninja_jobs,
            base_bytes=base_bytes,
            admit=model,
            done=done,
        )
        runs.append(r)
        for name in r.completed - done:
            learned[name] = by_name[name].measured()
        done = r.completed
        return retry.Outcome(
            ok=not r.oom,
            oom=r.oom,
            peak_bytes=r.peak_bytes,
            objects_done=len(done),
            objects_total=len(tasks),
        )

    retries = retry.run_attempts(
        first,
        attempt,
        max_attempts=max_attempts,
        limit_bytes=limit_bytes,
        archs=archs,
        base_bytes=est_base_bytes,
    )
    lines = [
        f"attempt {t.number}: ok after {r.makespan_s:.0f} s, {r.compiled} objects compiled"
        if t.outcome.ok
        else t.next_plan.reason
        if t.next_plan is not None
        else f"attempt {t.number}: OOM at {r.peak_bytes / admission.GIB:.1f} GiB; no attempts left"
        for t, r in zip(retries.tried, runs, strict=True)
    ]
    return StrategyResult(
        makespan_s=sum(r.makespan_s for r in runs),
        oom_kills=sum(1 for r in runs if r.oom),
        failed=retries.stop != retry.STOP_OK,
        peak_bytes=max(r.peak_bytes for r in runs),
        attempts=tuple(lines),
        jobs=retries.last.plan.ninja_jobs,
    ), learned


def lower_bound(tasks: Sequence[Task], *, limit_bytes: int, cores: float) -> float:
    """max(Σcpu/cores, longest compile, Σ∫mem dt / limit): no schedule that stays under the limit is
    faster."""
    return max(
        sum(t.cpu_s for t in tasks) / cores,
        max(t.time_s for t in tasks),
        sum(d * m for t in tasks for d, m, _ in t.phases) / limit_bytes,
    )
