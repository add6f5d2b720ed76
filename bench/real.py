"""The real benchmark: the memext fixture compiled by the real nvcc under a real cgroup v1 memory limit.

Each build runs in a fresh memory cgroup (`/sys/fs/cgroup/memory/factory-memext-*`, root needed) with the
host's nvcc, so a limit overrun is a real kernel OOM kill. Every strategy compiles through the nvcc wrapper,
which measures each compile; only the factory's runs let it admit (FACTORY_ADMISSION=off for the others).
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.offline import best_offline
from factory.container.admission import Prediction, raised_by_file
from factory.container.protocol import Measurement, format_by_file
from factory.memory import profiles, retry
from factory.memory import simulate as S
from factory.memory.planner import Parallelism, plan_parallelism
from factory.memory.simulate import StrategyResult

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "memext"
WRAPPER = ROOT / "factory" / "container" / "nvcc"
CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
MIB = 1 << 20
GIB = 1 << 30
# Two heavy TUs (~1.3 GiB each) together overrun it; one heavy with a light one fits beside the headroom.
DEFAULT_LIMIT = 2 * GIB + 256 * MIB
# what the memext "recipe" assumes per arch before anything was measured: the heaviest TU, rounded up
EST_PER_ARCH = int(1.5 * GIB)
# its per-file table, as a recipe's author would write it from the kernels' lengths (26, 14 and 5 thousand
# steps at ~50 KiB of cicc each, heavy.cuh), rounded up: what the first build knows per file
EST_BY_FILE = (("heavy*", int(1.5 * GIB)), ("medium*", int(0.8 * GIB)), ("light*", int(0.35 * GIB)))
# the limit of the side-by-side reference: every TU of the fixture at its peak at once fits, so nothing waits
# for memory and nothing is killed
NO_LIMIT = 8 * GIB
OBJECTS = 8


def host_nvcc() -> str | None:
    for candidate in (
        os.environ.get("FACTORY_REAL_NVCC"),
        "/usr/local/cuda-13.0/bin/nvcc",
        shutil.which("nvcc"),
    ):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def cgroup_v1_available() -> bool:
    return (CGROUP_ROOT / "memory.limit_in_bytes").exists() and os.access(CGROUP_ROOT, os.W_OK)


@dataclass(frozen=True, kw_only=True)
class RealRun:
    wall_s: float
    rc: int
    oom_kills: int
    peak_bytes: int
    objects_kept: int
    objects_total: int
    measurements: tuple[Measurement, ...] = ()
    cpu_s: float = 0.0  # of the whole build: ninja, the wrappers, the compiles, the link
    # CPU time the hypervisor gave other guests while this build ran (all CPUs of this machine)
    steal_s: float = 0.0

    @property
    def cpu_outside_compiles_s(self) -> float:
        return self.cpu_s - sum(m.cpu_s or 0.0 for m in self.measurements)

    @property
    def compiled(self) -> int:
        return self.objects_total - self.objects_kept

    @property
    def ok(self) -> bool:
        return self.rc == 0 and self.oom_kills == 0


def _marker(text: str, name: str) -> int:
    value = 0
    for line in text.splitlines():
        if line.startswith("::memext::"):
            for part in line.split()[1:]:
                key, _, val = part.partition("=")
                if key == name:
                    value = int(val)
    return value


def cgroup_build(
    build_dir: Path,
    *,
    limit_bytes: int,
    max_jobs: int,
    work: Path,
    admission_on: bool,
    est_per_arch: int = EST_PER_ARCH,
    profile: profiles.Profile | None = None,
    order: str = "",
    log: Path | None = None,
    cpus: float | None = None,
    keep_going: bool = False,
    by_file: tuple[tuple[str, int], ...] = (),
) -> RealRun:
    """One `ninja -j max_jobs` of the fixture inside a new memory cgroup of `limit_bytes`."""
    nvcc = host_nvcc()
    if nvcc is None:
        raise RuntimeError("no nvcc on this host")
    work.mkdir(parents=True, exist_ok=True)
    out = work / f"measure-{time.monotonic_ns()}.jsonl"
    state = work / f"state-{time.monotonic_ns()}"
    group = CGROUP_ROOT / f"factory-memext-{os.getpid()}-{time.monotonic_ns()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
        memsw = group / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            memsw.write_text(str(limit_bytes))  # no swap: an overrun is an OOM kill, not a slowdown
        env = dict(os.environ)
        # the wrapper runs as `env python3`, as in a build container, where that is the image's own Python;
        # on a host whose python3 on PATH is a version manager's shim (pyenv: a bash script that forks
        # several times), each wrapper would start twice as slowly as the build container's: this Python's
        # own directory comes first instead
        env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
        env.update(
            PYTORCH_NVCC=str(WRAPPER), FACTORY_REAL_NVCC=nvcc, FACTORY_STATE_DIR=str(state),
            FACTORY_PROFILE_OUT=str(out), FACTORY_EST_PER_ARCH_BYTES=str(est_per_arch),
            FACTORY_ADMISSION="on" if admission_on else "off", MAX_JOBS=str(max_jobs), FACTORY_POLL_S="0.25",
            CUDA_HOME=str(Path(nvcc).parent.parent), MEMEXT_ORDER=order,
            MEMEXT_KEEP_GOING="1" if keep_going else "0",
        )  # fmt: skip
        env.pop("FACTORY_EST_BY_FILE", None)
        if by_file:
            env["FACTORY_EST_BY_FILE"] = format_by_file(by_file)
        env.pop("FACTORY_MEM_LIMIT", None)  # the wrapper must find the limit in its cgroup
        env.pop("FACTORY_CPUS", None)
        if cpus is not None:
            env["FACTORY_CPUS"] = str(cpus)
        if profile is not None and profile.entries:
            env["FACTORY_PROFILE_JSON"] = json.dumps(profile.to_json())
        else:
            env.pop("FACTORY_PROFILE_JSON", None)
        procs = str(group / "cgroup.procs")

        def enter() -> None:
            with open(procs, "w") as fh:
                fh.write(str(os.getpid()))

        t0 = time.monotonic()
        cpu0 = _children_cpu_s()
        steal0 = steal_s()
        proc = subprocess.run(
            [sys.executable, str(FIXTURE / "build.py"), str(build_dir)],
            env=env, preexec_fn=enter, capture_output=True, text=True,
        )  # fmt: skip
        wall = time.monotonic() - t0
        cpu = _children_cpu_s() - cpu0
        steal = steal_s() - steal0
        text = proc.stdout + proc.stderr
        if log is not None:
            with log.open("a") as fh:
                fh.write(text)
        oom = 0
        for line in (group / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                oom = int(line.split()[1])
        peak = int((group / "memory.max_usage_in_bytes").read_text())
    finally:
        _remove_group(group)
    return RealRun(
        wall_s=wall, rc=proc.returncode, oom_kills=oom, peak_bytes=peak,
        objects_kept=_marker(text, "objects_kept"), objects_total=_marker(text, "objects_total"),
        measurements=tuple(profiles.read_measurements(out)), cpu_s=cpu, steal_s=steal,
    )  # fmt: skip


def steal_s(stat: str | None = None) -> float:
    """Seconds of steal time of all CPUs so far, from /proc/stat (`stat`: its text); 0 where it has none."""
    if stat is None:
        try:
            stat = Path("/proc/stat").read_text()
        except OSError:
            return 0.0
    for line in stat.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu" and len(fields) > 8:
            return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    return 0.0


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _remove_group(group: Path) -> None:
    for _ in range(50):
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.1)  # the last killed processes are still leaving it


@dataclass(frozen=True, kw_only=True)
class FactoryBuild:
    result: StrategyResult
    runs: tuple[RealRun, ...]
    profile: profiles.Profile
    lines: tuple[str, ...]


def factory_build(
    build_dir: Path,
    *,
    limit_bytes: int,
    cpus: float,
    work: Path,
    est_per_arch: int = EST_PER_ARCH,
    profile: profiles.Profile | None = None,
    max_attempts: int = 4,
    order: str = "",
    log: Path | None = None,
    keep_going: bool = False,
    ninja_jobs: int | None = None,
    by_file: tuple[tuple[str, int], ...] = (),
) -> FactoryBuild:
    """Planner + admission + resume (`retry.run_attempts`): what a factory job does, against a cgroup instead
    of a container."""
    learned = profile or profiles.Profile(package="memext", version="0")
    first = plan_parallelism(
        limit_bytes=limit_bytes, cpus=cpus, archs=1, per_arch_bytes=est_per_arch, nvcc_threads=1
    )
    runs: list[RealRun] = []

    def attempt(_number: int, par: Parallelism) -> retry.Outcome:
        nonlocal learned
        run = cgroup_build(
            build_dir, limit_bytes=limit_bytes, max_jobs=ninja_jobs or par.ninja_jobs, work=work,
            admission_on=True,
            est_per_arch=par.per_arch_bytes, profile=learned, order=order, log=log, cpus=cpus,
            keep_going=keep_going,
            # raised with the plan after an OOM, as a job raises it
            by_file=raised_by_file(by_file, per_arch_bytes=par.per_arch_bytes, fallback_bytes=est_per_arch),
        )  # fmt: skip
        runs.append(run)
        learned = profiles.merge(learned, run.measurements)
        return retry.Outcome(
            ok=run.ok, oom=run.oom_kills > 0, peak_bytes=run.peak_bytes, objects_done=run.objects_total,
            objects_total=OBJECTS,
        )  # fmt: skip

    retries = retry.run_attempts(first, attempt, max_attempts=max_attempts, limit_bytes=limit_bytes, archs=1)
    lines = [f"attempt 1: {first.reason}"] + [
        t.next_plan.reason for t in retries.tried[:-1] if t.next_plan is not None
    ]
    last = runs[-1]
    result = StrategyResult(
        makespan_s=sum(r.wall_s for r in runs), oom_kills=sum(1 for r in runs if r.oom_kills),
        failed=not last.ok, peak_bytes=max(r.peak_bytes for r in runs), attempts=tuple(lines),
        jobs=retries.last.plan.ninja_jobs,
    )  # fmt: skip
    return FactoryBuild(result=result, runs=tuple(runs), profile=learned, lines=tuple(lines))


def _fixed(run: RealRun, jobs: int, *, wall_s: float | None = None) -> StrategyResult:
    return StrategyResult(
        makespan_s=run.wall_s if wall_s is None else wall_s, oom_kills=int(run.oom_kills > 0),
        failed=not run.ok, peak_bytes=run.peak_bytes,
        attempts=(f"MAX_JOBS={jobs}: {'ok' if run.ok else 'OOM' if run.oom_kills else f'rc {run.rc}'}",),
        jobs=jobs,
    )  # fmt: skip


def compiles_bound(runs: tuple[RealRun, ...], *, cores: int, limit_bytes: int) -> float | None:
    """The issue's lower bound, max(sum of CPU / cores, longest compile, sum of memory x time / limit), from
    the compiles these runs finished (a file compiled again in a later run counts once, as its last).

    A compile's time is its CPU time where that is less than its wall time: a compile that waited for a core
    behind another one did not need that wait, and its memory x time shrinks with it. On a shared machine
    whose speed drifts by a third within minutes, the bound from a build's own compiles is the one that
    separates its schedule from the machine."""
    last = {m.key: m for run in runs for m in run.measurements if m.rc == 0}
    if not last:
        return None
    times = {k: m.wall_s if m.cpu_s is None else min(m.wall_s, m.cpu_s) for k, m in last.items()}
    mem_s = sum(m.mem_s * times[k] / m.wall_s for k, m in last.items() if m.wall_s > 0)
    return max(sum(times.values()) / cores, max(times.values()), mem_s / limit_bytes)


def side_by_side_reference(
    before: RealRun,
    after: RealRun,
    *,
    serial: RealRun,
    serial_after: RealRun | None,
    cores: int,
    limit_bytes: int,
) -> dict[str, object] | None:
    """The lower bound under `limit_bytes` from compiles that ran `cores` at a time with no memory limit
    (`before` and `after` the profiled build, `bracketed`), and what those compiles took in CPU against the
    same compiles one at a time.

    The one-at-a-time reference leaves out what compiles running together cost each other, which any build
    that fills the cores pays: 1-3% of CPU one night here, 8% another. This bound carries that cost, as the
    factory's build does; the one-at-a-time reference stays the strict one. None when the run before
    failed."""
    first = compiles_bound((before,), cores=cores, limit_bytes=limit_bytes) if before.ok else None
    if first is None:
        return None
    second = compiles_bound((after,), cores=cores, limit_bytes=limit_bytes) if after.ok else None
    pairs = [(before, serial)] + ([(after, serial_after)] if after.ok and serial_after is not None else [])

    def cpu(run: RealRun) -> float:
        return sum(m.cpu_s or 0.0 for m in run.measurements if m.rc == 0)

    return {
        "jobs": cores,
        "makespan_before_after_s": [round(before.wall_s, 1), round(after.wall_s, 1) if after.ok else None],
        "lower_bound_before_after_s": [round(first, 1), None if second is None else round(second, 1)],
        "lower_bound_s": round(bracketed(first, second), 1),
        "compiles_cpu_x_one_at_a_time": [round(cpu(side) / cpu(alone), 3) for side, alone in pairs
                                         if cpu(alone) > 0],
    }  # fmt: skip


def bracketed(before_s: float, after_s: float | None) -> float:
    """The reference bound of a build measured between two one-at-a-time runs: the mean of their bounds
    (the build ran between them, on a machine whose speed drifts within minutes); the first alone when the
    second failed."""
    return before_s if after_s is None else (before_s + after_s) / 2


def _courses(measurements: tuple[Measurement, ...]) -> list[S.Task]:
    """Each compile as a task of steps at its measured rise, which for a compile whose RSS only grows, as
    the fixture's do, is its course."""
    return [
        S.Task(name=m.key, phases=tuple((m.wall_s / len(m.rise), rss, 1) for rss in m.rise))
        for m in measurements
        if m.rise and m.rc == 0
    ]


def own_best_offline(run: RealRun, limit_bytes: int, cores: int) -> float:
    return best_offline(_courses(run.measurements), limit_bytes=limit_bytes, cores=cores, step_s=0.5,
                        tries=3000).makespan_s  # fmt: skip


def replayed(measurements: tuple[Measurement, ...], *, limit_bytes: int, cores: int) -> float:
    """The profiled factory build replayed by the simulator on these compiles' measured courses
    (`_courses`): what the same admission gives without the machine's noise."""
    tasks = _courses(measurements)
    return _replay(tasks, _profile(tasks), limit_bytes=limit_bytes, cores=cores)


def _profile(tasks: list[S.Task]) -> dict[str, Prediction]:
    return {t.name: t.measured() for t in tasks}


def _replay(tasks: list[S.Task], profile: dict[str, Prediction], *, limit_bytes: int, cores: int) -> float:
    result, _ = S.simulate_factory(
        tasks, limit_bytes=limit_bytes, cores=cores, archs=1, nvcc_threads=1, per_arch_bytes=EST_PER_ARCH,
        profile=profile,
    )  # fmt: skip
    return result.makespan_s


def cross_replayed(
    runs: Mapping[str, RealRun], *, limit_bytes: int, cores: int
) -> dict[tuple[str, str], float]:
    """Every complete run's compiles replayed (`replayed`) with the profile of every other one, as a ratio
    to the lower bound of the compiles replayed: (profile's run, compiles' run) -> ratio.

    The runs of one benchmark compile the same files minutes apart, and on a shared machine a file takes 10%
    to twice as long in one as in another; this is how the admission does when its profile is that far off,
    with the machine's drift during the build taken out (each replay is measured against its own
    compiles)."""
    courses = {n: _courses(run.measurements) for n, run in runs.items() if run.ok}
    complete = {n: tasks for n, tasks in courses.items() if len(tasks) == OBJECTS}
    bounds = {n: S.lower_bound(tasks, limit_bytes=limit_bytes, cores=cores) for n, tasks in complete.items()}
    learned = {n: _profile(tasks) for n, tasks in complete.items()}
    return {
        (known, name): _replay(complete[name], learned[known], limit_bytes=limit_bytes, cores=cores)
        / bounds[name]
        for known, name in itertools.permutations(complete, 2)
    }


def run_real(*, limit_bytes: int = DEFAULT_LIMIT, work: Path) -> dict[str, object]:
    """All strategies on the fixture; runs of the same fixed MAX_JOBS are shared between strategies.

    The factory's first builds run first and the one-at-a-time run (MAX_JOBS=1, the reference the lower
    bound is measured on) right before the profiled factory build and once more right after it, so that the
    reference brackets the build it is compared with (`bracketed`). Between those and the profiled build,
    the side-by-side reference: MAX_JOBS = cores with no memory limit that matters (`NO_LIMIT`), whose
    compiles run together as the factory's do."""
    import psutil

    cores = max(1, len(os.sched_getaffinity(0)))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log = work / "build.log"
    fixed: dict[int, RealRun] = {}

    def fixed_build(jobs: int, name: str, *, limit: int = limit_bytes) -> RealRun:
        return cgroup_build(work / name, limit_bytes=limit, max_jobs=jobs, work=work, admission_on=False,
                         log=log)  # fmt: skip

    def fixed_run(jobs: int) -> RealRun:
        if jobs not in fixed:
            fixed[jobs] = fixed_build(jobs, f"fixed-{jobs}")
        return fixed[jobs]

    # the first build knows the recipe's per-file table (as the model's does); the steady state, the profile
    # learned by it
    cold = factory_build(work / "factory-cold", limit_bytes=limit_bytes, cpus=cores, work=work, log=log,
                         by_file=EST_BY_FILE)  # fmt: skip
    cold_single = factory_build(work / "factory-cold-single", limit_bytes=limit_bytes, cpus=cores, work=work,
                                log=log)  # fmt: skip
    # every fixed MAX_JOBS, the one-at-a-time run last: the lower bound is measured on its compiles (no
    # contention), right before the profiled factory build, and once more right after it
    for jobs in range(cores, 0, -1):
        fixed_run(jobs)
    serial = fixed_run(1)
    side = fixed_build(cores, "no-limit", limit=NO_LIMIT)
    warm = factory_build(work / "factory-warm", limit_bytes=limit_bytes, cpus=cores, work=work,
                         profile=cold.profile, log=log)  # fmt: skip
    side_after = fixed_build(cores, "no-limit-after", limit=NO_LIMIT)
    serial_after = fixed_build(1, "fixed-1-after")
    after_ok = serial_after if serial_after.ok else None

    def wall(run: RealRun) -> float:
        # the one-at-a-time run's makespan, as the bound measured on it, is the mean of the runs before and
        # after the profiled build: the strategies it stands for are compared with that build
        if run is serial:
            return bracketed(run.wall_s, None if after_ok is None else after_ok.wall_s)
        return run.wall_s

    def own_bound(runs: tuple[RealRun, ...]) -> float | None:
        own = compiles_bound(runs, cores=cores, limit_bytes=limit_bytes)
        if own is None or after_ok is None or serial not in runs:
            return own
        again = compiles_bound(tuple(after_ok if r is serial else r for r in runs), cores=cores,
                               limit_bytes=limit_bytes)  # fmt: skip
        return bracketed(own, again)

    def fixed_result(jobs: int) -> StrategyResult:
        return _fixed(fixed_run(jobs), jobs, wall_s=wall(fixed_run(jobs)))

    strategies: dict[str, dict[str, object]] = {}
    runs_of: dict[str, tuple[RealRun, ...]] = {}  # what each strategy ran, for the bound of its own compiles
    notes: dict[str, object] = {}
    strategies["fixed_cores"] = fixed_result(cores).to_json()
    runs_of["fixed_cores"] = (fixed_run(cores),)
    best: StrategyResult | None = None
    for jobs in range(cores, 0, -1):
        r = fixed_result(jobs)
        if not r.failed and (best is None or r.makespan_s < best.makespan_s):
            best = r
    assert best is not None  # MAX_JOBS=1 runs one compile at a time, the heaviest TU fits alone
    strategies["best_fixed"] = best.to_json()
    runs_of["best_fixed"] = (fixed_run(best.jobs),)
    notes["best_fixed_jobs"] = best.jobs
    # the seed's loop: cores, then halve after each OOM kill, each attempt from scratch
    total, kills, peak, jobs, seq = 0.0, 0, 0, cores, []
    while True:
        run = fixed_run(jobs)
        total += wall(run)
        peak = max(peak, run.peak_bytes)
        seq.append(jobs)
        if run.ok or jobs == 1:
            break
        kills += 1
        jobs //= 2
    strategies["seed_halving"] = {"makespan_s": round(total, 1), "oom_kills": kills, "failed": not run.ok,
                                  "peak_bytes": peak}  # fmt: skip
    runs_of["seed_halving"] = tuple(fixed_run(j) for j in seq)
    notes["seed_halving_jobs"] = seq
    heuristic = S.flash_attn_heuristic_jobs(cores=cores, free_bytes=int(psutil.virtual_memory().available))
    strategies["flash_attn_heuristic"] = fixed_result(heuristic).to_json()
    runs_of["flash_attn_heuristic"] = (fixed_run(heuristic),)
    notes["flash_attn_heuristic_jobs"] = heuristic
    notes["one_at_a_time_before_after_s"] = [
        round(serial.wall_s, 1),
        None if after_ok is None else round(after_ok.wall_s, 1),
    ]

    strategies["factory"] = warm.result.to_json()
    strategies["factory_cold"] = cold.result.to_json()
    runs_of["factory"], runs_of["factory_cold"] = warm.runs, cold.runs
    notes["factory_attempts"] = list(warm.lines)
    notes["factory_cold_attempts"] = list(cold.lines)
    notes["factory_cold_single_estimate"] = cold_single.result.to_json()

    before = compiles_bound((serial,), cores=cores, limit_bytes=limit_bytes)
    assert before is not None  # the serial run succeeded: it is best_fixed's or worse than it
    after = None if after_ok is None else compiles_bound((after_ok,), cores=cores, limit_bytes=limit_bytes)
    lower = bracketed(before, after)
    notes["lower_bound_before_after_s"] = [round(before, 1), None if after is None else round(after, 1)]
    notes["side_by_side_reference"] = side_by_side_reference(
        side, side_after, serial=serial, serial_after=after_ok, cores=cores, limit_bytes=limit_bytes
    )
    # the same bound from each build's own compiles, as long as they took in that run: what its schedule
    # lost, apart from the machine being slower or faster than when the reference was measured
    notes["own_lower_bound_s"] = {
        name: round(own, 1)
        for name, runs in runs_of.items()
        if not strategies[name]["failed"] and (own := own_bound(runs)) is not None
    }
    # what admission itself costs: the CPU the build used besides its compiles (ninja, the wrappers' polls
    # and samples, the link step)
    notes["cpu_outside_compiles_s"] = {
        "factory": round(sum(r.cpu_outside_compiles_s for r in warm.runs), 1),
        "one_at_a_time": round(serial.cpu_outside_compiles_s, 1),
    }
    # the machine's own noise: what other guests took of its CPUs during the runs the target compares
    notes["steal_s"] = {
        "factory": round(sum(r.steal_s for r in warm.runs), 1),
        "one_at_a_time": round(serial.steal_s, 1),
        "one_at_a_time_after": round(serial_after.steal_s, 1),
    }
    notes["factory_compiles_s"] = {
        m.key.split("|")[0]: {"wall_s": round(m.wall_s, 1), "cpu_s": m.cpu_s}
        for run in warm.runs for m in run.measurements
    }  # fmt: skip
    replay = replayed(serial.measurements, limit_bytes=limit_bytes, cores=cores)
    notes["factory_replayed_s"] = round(replay, 1)
    cross = cross_replayed(
        {"one_at_a_time": serial, "one_at_a_time_after": serial_after, "factory": warm.runs[-1],
         "factory_cold": cold.runs[-1], "factory_cold_single": cold_single.runs[-1]},
        limit_bytes=limit_bytes, cores=cores,
    )  # fmt: skip
    if cross:
        ratios = sorted(cross.values())
        worst = max(cross, key=cross.__getitem__)
        notes["cross_replay_x_bound"] = {
            "pairs": len(ratios), "median": round(ratios[len(ratios) // 2], 3), "max": round(ratios[-1], 3),
            "worst": {"profile": worst[0], "compiles": worst[1]},
        }  # fmt: skip
    # the best schedule a search finds knowing every course of the profiled build's own compiles (as the
    # model's offline reference): what any admission could have made of those compiles on this machine then
    if len(warm.runs) == 1:
        notes["factory_own_best_offline_s"] = round(own_best_offline(warm.runs[0], limit_bytes, cores), 1)
    per_tu = {
        m.key.split("|")[0]: {"peak_bytes": m.peak_bytes, "wall_s": m.wall_s, "cpu_s": m.cpu_s}
        for m in serial.measurements
    }
    return {
        "limit_bytes": limit_bytes,
        "lower_bound_s": round(lower, 1),
        "strategies": strategies,
        "cores": cores,
        "notes": notes,
        "compiles": per_tu,
        "nvcc": host_nvcc(),
    }
