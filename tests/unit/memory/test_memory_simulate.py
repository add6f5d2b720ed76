"""The discrete-event simulation: OOM accounting, determinism, the factory strategy, and the seed's
outcome."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # bench/ is not an installed package

from bench import model as M  # noqa: E402
from factory.container import admission  # noqa: E402
from factory.container.admission import Prediction  # noqa: E402
from factory.memory import simulate as S  # noqa: E402
from factory.memory.simulate import Task  # noqa: E402

GIB = 2**30


def task(name: str, gib: float, seconds: float) -> Task:
    return Task(name=name, phases=((seconds, int(gib * GIB), 1),))


TASKS = [task("h1", 6, 100), task("h2", 6, 100), task("m1", 3, 50), task("l1", 1, 20), task("l2", 1, 20)]


def test_fixed_oom_when_running_peaks_exceed_limit() -> None:
    r = S.simulate_fixed(TASKS, limit_bytes=10 * GIB, cores=8, jobs=2)
    assert r.failed and r.oom_kills == 1 and r.makespan_s == 0.0
    ok = S.simulate_fixed(TASKS, limit_bytes=10 * GIB, cores=8, jobs=1)
    assert not ok.failed and ok.makespan_s == 290.0 and ok.peak_bytes == 6 * GIB


def test_cpu_sharing_stretches_time() -> None:
    r = S.simulate_fixed([task("a", 1, 10), task("b", 1, 10)], limit_bytes=10 * GIB, cores=1, jobs=2)
    assert r.makespan_s == 20.0


def test_seed_halving_restarts_from_scratch() -> None:
    r = S.simulate_seed_halving(TASKS, limit_bytes=10 * GIB, cores=4)
    assert not r.failed
    assert r.oom_kills == 2  # 4 and 2 jobs OOM, 1 passes
    assert r.attempts[-1].startswith("MAX_JOBS=1: ok")


def test_factory_never_ooms_and_beats_serial() -> None:
    kw = {"limit_bytes": 10 * GIB, "cores": 4, "archs": 1, "nvcc_threads": 1, "est_base_bytes": 0}
    cold, learned = S.simulate_factory(TASKS, per_arch_bytes=6 * GIB, **kw)
    assert not cold.failed and cold.oom_kills == 0
    warm, _ = S.simulate_factory(TASKS, per_arch_bytes=6 * GIB, profile=learned, **kw)
    assert not warm.failed and warm.oom_kills == 0
    assert warm.makespan_s < 290.0  # pairs a heavy compile with the light ones
    assert warm.peak_bytes <= 10 * GIB


def test_factory_recovers_from_a_low_estimate_with_resume() -> None:
    kw = {"limit_bytes": 10 * GIB, "cores": 2, "archs": 1, "nvcc_threads": 1, "est_base_bytes": 0}
    order = [task("l1", 1, 20), task("l2", 1, 20), task("h1", 6, 100), task("h2", 6, 100)]
    r, _ = S.simulate_factory(order, per_arch_bytes=GIB // 2, **kw)
    assert r.oom_kills == 1 and not r.failed
    assert "attempt 2: OOM" in r.attempts[0]
    assert "2 of 4 objects kept" in r.attempts[0]
    assert r.attempts[1] == "attempt 2: ok after 200 s, 2 objects compiled"  # resumed: only the heavy two


def test_simulation_is_deterministic() -> None:
    tasks = M.flash_attn_tasks(scale=0.3)
    kw = {"limit_bytes": M.HOST_BYTES, "cores": M.CORES, "base_bytes": M.BASE_BYTES}
    a = S.simulate_factory(tasks, archs=4, nvcc_threads=4, per_arch_bytes=M.per_arch_estimate_bytes(), **kw)
    b = S.simulate_factory(tasks, archs=4, nvcc_threads=4, per_arch_bytes=M.per_arch_estimate_bytes(), **kw)
    assert a == b
    assert S.simulate_fixed(tasks, jobs=24, **kw) == S.simulate_fixed(tasks, jobs=24, **kw)


def test_model_reproduces_the_seed() -> None:
    tasks = M.flash_attn_tasks(scale=M.time_scale())
    assert len(tasks) == 72
    kw = {"limit_bytes": M.HOST_BYTES, "cores": M.CORES, "base_bytes": M.BASE_BYTES}
    for jobs in (128, 64, 48, 32):
        assert S.simulate_fixed(tasks, jobs=jobs, **kw).failed, jobs
    passed = S.simulate_fixed(tasks, jobs=20, **kw)
    assert not passed.failed
    assert abs(passed.makespan_s - M.SEED_MAKESPAN_S) < 1.0


def test_flash_attn_heuristic() -> None:
    assert S.flash_attn_heuristic_jobs(cores=128, free_bytes=420 * GIB) == 46
    assert S.flash_attn_heuristic_jobs(cores=2, free_bytes=20 * GIB) == 1


def test_lower_bound() -> None:
    assert S.lower_bound(TASKS, limit_bytes=10 * GIB, cores=1) == 290.0
    assert S.lower_bound(TASKS, limit_bytes=10 * GIB, cores=100) == (600 + 600 + 150 + 20 + 20) / 10


def phased(name: str, peak_gib: float, seconds: float) -> Task:
    """Front end, the peak (cicc), a long tail at a third of it (ptxas)."""
    return Task(
        name=name,
        phases=(
            (0.1 * seconds, GIB, 1),
            (0.3 * seconds, int(peak_gib * GIB), 1),
            (0.6 * seconds, int(peak_gib * GIB / 3), 1),
        ),
    )


def test_cold_build_learns_the_time_course_of_finished_compiles() -> None:
    tasks = [phased(f"k_h{i}", 6, 100) for i in range(8)]
    kw = {"limit_bytes": 16 * GIB, "cores": 8, "jobs": 8}

    def model(online: bool) -> S.AdmissionModel:
        return S.AdmissionModel(
            limit_bytes=16 * GIB,
            headroom_bytes=0,
            cpus=8,
            default=Prediction(peak_bytes=6 * GIB),
            online=online,
        )

    offline = S.run_attempt(tasks, admit=model(False), **kw)
    online = S.run_attempt(tasks, admit=model(True), **kw)
    assert not offline.oom and not online.oom
    # without learning, 2 compiles at a time for their whole run; with it, the third starts once the first two
    # are known to be past their peaks
    assert offline.makespan_s == 400.0
    assert online.makespan_s < offline.makespan_s


def test_cpu_admission_counts_busy_threads_not_the_most_a_compile_may_use() -> None:
    # each compile uses 2 threads for half its time: on 4 cores a third starts while two are single-threaded
    two = Task(name="a", phases=((50.0, GIB, 1), (50.0, GIB, 2)))
    tasks = [two, Task(name="b", phases=two.phases), Task(name="c", phases=two.phases)]
    admit = S.AdmissionModel(
        limit_bytes=64 * GIB, headroom_bytes=0, cpus=4, default=Prediction(peak_bytes=GIB)
    )
    r = S.run_attempt(tasks, limit_bytes=64 * GIB, cores=4, jobs=3, admit=admit)
    assert r.makespan_s < 200.0  # counting 2 threads each, c would wait for a or b to finish


def test_model_factory_meets_the_seed_targets() -> None:
    tasks = M.flash_attn_tasks(scale=M.time_scale())
    kw = {"limit_bytes": M.HOST_BYTES, "cores": M.CORES, "base_bytes": M.BASE_BYTES}
    fkw = {
        "archs": M.ARCHS,
        "nvcc_threads": M.NVCC_THREADS,
        "per_arch_bytes": M.per_arch_estimate_bytes(),
        **kw,
    }
    cold, learned = S.simulate_factory(tasks, **fkw)
    warm, _ = S.simulate_factory(tasks, profile=learned, **fkw)
    assert cold.oom_kills == 0 and warm.oom_kills == 0
    assert warm.makespan_s < S.simulate_best_fixed(tasks, **kw).makespan_s
    assert S.simulate_seed_halving(tasks, **kw).makespan_s >= 2 * warm.makespan_s
    assert warm.makespan_s >= S.lower_bound(tasks, limit_bytes=M.HOST_BYTES, cores=M.CORES)


def test_the_recipe_s_per_file_tables_and_after_peak_fraction_speed_up_the_first_build_of_the_model() -> None:
    tasks = M.flash_attn_tasks(scale=M.time_scale())
    kw = {
        "limit_bytes": M.HOST_BYTES, "cores": M.CORES, "base_bytes": M.BASE_BYTES, "archs": M.ARCHS,
        "nvcc_threads": M.NVCC_THREADS, "per_arch_bytes": M.per_arch_estimate_bytes(),
    }  # fmt: skip
    single, _ = S.simulate_factory(tasks, **kw)
    per_file, _ = S.simulate_factory(tasks, by_file=M.per_file_estimate_bytes(), **kw)
    after, _ = S.simulate_factory(tasks, by_file=M.per_file_estimate_bytes(), after_peak=M.after_peak(), **kw)
    ordered, _ = S.simulate_factory(tasks, **M.first_build_knows(), **kw)
    for r in (single, per_file, after, ordered):
        assert r.oom_kills == 0 and not r.failed
    # the per-file table speeds it up; the after-peak fraction on top of it moves it within 2%, either way
    # (its lower reservations past a peak let more front ends start, which then wait for their peaks)
    assert per_file.makespan_s < single.makespan_s and after.makespan_s < single.makespan_s
    assert abs(after.makespan_s / per_file.makespan_s - 1) < 0.03
    assert ordered.makespan_s < min(after.makespan_s, per_file.makespan_s)
    # the table and the fraction are the built-in recipe's, not copies: a forward file gets less than the
    # worst-file fallback
    table = M.per_file_estimate_bytes()
    fwd = admission.file_per_arch_bytes("flash_fwd_hdim64_fp16_sm80.cu", table, 0)
    assert 0 < fwd < M.per_arch_estimate_bytes()
    assert M.after_peak() == 0.71
    # split-KV files, last in setup.py's order, are the longest by the recipe's times
    seconds = M.per_file_seconds()
    split = admission.file_value("flash_fwd_split_hdim64_bf16_sm80.cu", seconds)
    assert split is not None and split > max(v for p, v in seconds if not p.startswith("flash_fwd_split"))


def test_an_estimate_below_the_real_peaks_is_caught_by_the_oom_retry() -> None:
    # per-file figures too low (every file at 40% of its real peak) must not fail the build: the OOM retry
    # raises the plan, and the table with it
    tasks = [
        Task(name=f"k{i}.cu", phases=((2.0, GIB, 1), (10.0, 10 * GIB, 1), (5.0, GIB, 1))) for i in range(8)
    ]
    r, _ = S.simulate_factory(
        tasks, limit_bytes=40 * GIB, cores=8, archs=1, nvcc_threads=1, per_arch_bytes=10 * GIB,
        est_base_bytes=0, by_file=(("k*", 4 * GIB),),
    )  # fmt: skip
    assert not r.failed and r.oom_kills >= 1


def test_two_stage_admission_runs_front_ends_beside_a_peak() -> None:
    # 40 s front end at 1 GiB, 30 s at 8 GiB, 30 s at 2 GiB: two peaks (each planned with its 10% margin)
    # never fit under 15 GiB
    shape = ((40.0, GIB, 1), (30.0, 8 * GIB, 1), (30.0, 2 * GIB, 1))
    tasks = [Task(name=f"k{i}", phases=shape) for i in range(4)]
    profile = {t.name: t.measured() for t in tasks}

    def attempt(two_stage: bool) -> S.AttemptResult:
        admit = S.AdmissionModel(
            limit_bytes=15 * GIB, headroom_bytes=0, cpus=8, predictions=profile, two_stage=two_stage,
            default=Prediction(peak_bytes=8 * GIB),
        )  # fmt: skip
        return S.run_attempt(tasks, limit_bytes=15 * GIB, cores=8, jobs=4, admit=admit)

    one, two = attempt(False), attempt(True)
    assert not one.oom and not two.oom
    assert two.peak_bytes <= 15 * GIB
    # one stage: each compile starts when the running peak has passed (70 s in); two: the next one's front
    # end runs beside it, and it is stopped at its rise only if the running peak has not passed yet
    assert one.makespan_s == 310.0
    assert two.makespan_s < 250.0


def test_a_machine_slower_than_the_profile_is_not_oom_killed() -> None:
    # the profile was learned on a faster machine (or a quieter one): every compile now takes 1.3x as long,
    # so running compiles hold their peaks past the time their profiles say
    tasks = M.flash_attn_tasks(scale=M.time_scale())
    profile = {t.name: t.measured() for t in tasks}
    slow = [Task(name=t.name, phases=tuple((d * 1.3, m, n) for d, m, n in t.phases)) for t in tasks]
    r, _ = S.simulate_factory(
        slow, limit_bytes=128 * GIB, cores=64, base_bytes=M.BASE_BYTES, archs=M.ARCHS,
        nvcc_threads=M.NVCC_THREADS, per_arch_bytes=M.per_arch_estimate_bytes(), profile=profile,
    )  # fmt: skip
    assert r.oom_kills == 0 and not r.failed


def test_a_front_end_holding_more_than_its_profile_s_does_not_take_its_peak_early(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # memext's medium TUs held 0.18 GB before their climb in one build and 0.24 GB in the next. A medium TU
    # that asked for its peak at 0.24 GB (above its profiled front end) was granted it at once and booked it
    # for the rest of its run, so the heavy TU rising beside it waited stopped on the build's longest path
    heavy = Task(name="heavy", phases=((15.0, int(0.28 * GIB), 1), (5.0, int(1.3 * GIB), 1)))
    medium = ((0.5, int(0.01 * GIB), 1), (6.5, int(0.24 * GIB), 1), (3.0, int(0.7 * GIB), 1))
    tasks = [heavy, Task(name="m1", phases=medium), Task(name="m2", phases=medium)]
    learned = (
        (0.5, int(0.01 * GIB), 1),
        (6.5, int(0.18 * GIB), 1),
        (3.0, int(0.7 * GIB), 1),
    )  # the build the profile comes from
    profile = {t.name: (t if t is heavy else Task(name=t.name, phases=learned)).measured() for t in tasks}

    def makespan() -> float:
        admit = S.AdmissionModel(
            limit_bytes=2 * GIB, headroom_bytes=0, cpus=2, predictions=profile, two_stage=True,
            default=Prediction(peak_bytes=2 * GIB),
        )  # fmt: skip
        r = S.run_attempt(tasks, limit_bytes=2 * GIB, cores=2, jobs=3, admit=admit)
        assert not r.oom
        return r.makespan_s

    # m2 starts beside the heavy TU's front end when m1 ends; its peak comes when the heavy TU rises
    now = makespan()
    assert now == pytest.approx(23.0, abs=0.6)  # the heavy TU goes on; m2 waits 3 s for its peak
    monkeypatch.setattr(admission, "FRONT_SLACK", 1.0)  # rises at the first byte above its front end
    assert makespan() == pytest.approx(25.0, abs=0.6)  # m2 took its peak at once, the heavy TU waited 5 s


def climbing(name: str, *, seconds: float, front: float, peak: float) -> Task:
    """A compile as the memext fixture's measured ones: its front end for 70% of its time, a climb over
    15%, its peak to the end."""
    steps = 6
    phases = [(0.7 * seconds, int(front * GIB), 1)]
    phases += [
        (0.15 * seconds / steps, int((front + (peak - front) * (i + 1) / steps) * GIB), 1)
        for i in range(steps)
    ]
    phases.append((0.15 * seconds, int(peak * GIB), 1))
    return Task(name=name, phases=tuple(phases))


MEMEXT = [
    *(climbing(f"heavy{i}.cu", seconds=30, front=0.26, peak=1.305) for i in (1, 2)),
    *(climbing(f"medium{i}.cu", seconds=15.5, front=0.2, peak=0.7) for i in (1, 2)),
    *(climbing(f"light{i}.cu", seconds=6.5, front=0.12, peak=0.255) for i in (1, 2, 3, 4)),
]
# bench.real's recipe for it: heavy 1.5 GiB per arch, medium 0.8, light 0.35 (each + 0.25 GiB of nvcc)
MEMEXT_RECIPE = {
    "limit_bytes": int(2.25 * GIB), "cores": 2, "archs": 1, "nvcc_threads": 1,
    "per_arch_bytes": int(1.5 * GIB), "base_bytes": GIB // 10,
    "by_file": (("heavy*", int(1.5 * GIB)), ("medium*", int(0.8 * GIB)), ("light*", int(0.35 * GIB))),
}  # fmt: skip


def test_a_first_build_starts_light_compiles_beside_a_heavy_one_by_measured_memory() -> None:
    bound = S.lower_bound(MEMEXT, limit_bytes=int(2.25 * GIB), cores=2)
    booked, _ = S.simulate_factory(MEMEXT, measured=False, **MEMEXT_RECIPE)
    measured, _ = S.simulate_factory(MEMEXT, **MEMEXT_RECIPE)
    assert booked.oom_kills == 0 and measured.oom_kills == 0
    # by the estimates nothing fits beside a heavy compile (1.75 + 0.6 GiB > 2 GiB); by what it holds in
    # its front end (0.26 GiB) the light and medium ones run beside it
    assert booked.makespan_s > 1.25 * bound
    assert measured.makespan_s < 1.2 * bound
    assert measured.peak_bytes <= int(2.25 * GIB) - GIB // 4


def test_a_compile_that_rises_past_its_line_is_stopped_until_the_memory_is_there() -> None:
    # a heavy compile falls from 1.0 GiB and climbs again to 1.8 (a second arch's cicc): its line, set when a
    # light one started beside it, stops it until the light one ends; without the stop, 1.8 + 0.4 + 0.1 GiB
    # of untracked usage pass the 2.25 GiB limit
    rises_again = Task(
        name="heavy.cu",
        phases=((1.0, GIB // 5, 1), (4.0, GIB, 1), (10.0, int(0.4 * GIB), 1), (5.0, int(1.8 * GIB), 1),
                (10.0, int(0.4 * GIB), 1)),
    )  # fmt: skip
    lights = [Task(name=f"light{i}.cu", phases=((8.0, int(0.4 * GIB), 1),)) for i in (1, 2)]
    admit = S.AdmissionModel(
        limit_bytes=int(2.25 * GIB), headroom_bytes=GIB // 4, cpus=2, online=False,
        estimates={"heavy.cu": 2 * GIB, "light1.cu": int(0.6 * GIB), "light2.cu": int(0.6 * GIB)},
    )  # fmt: skip
    kw = {"limit_bytes": int(2.25 * GIB), "cores": 2, "jobs": 3, "base_bytes": GIB // 10}
    r = S.run_attempt([rises_again, *lights], admit=admit, **kw)
    assert not r.oom and r.peak_bytes <= int(2.25 * GIB) - GIB // 4
    alone = S.run_attempt([rises_again, *lights], admit=replace(admit, measured=False), **kw)
    # the lights started beside it: sooner done than one after the other, for all the stops
    assert not alone.oom and r.makespan_s < alone.makespan_s


def test_no_oom_kill_in_first_builds_of_the_measured_courses() -> None:
    # the flash-attn compiles measured in bench/data, first builds at every host the benchmark models, with
    # the recipe's per-file table and with its single per-arch figure (where estimates are furthest off and
    # measured admission cuts the most)
    tasks = M.flash_attn_tasks(scale=M.time_scale())
    kw = {"archs": M.ARCHS, "nvcc_threads": M.NVCC_THREADS, "per_arch_bytes": M.per_arch_estimate_bytes()}
    for gib, cores in ((M.HOST_BYTES >> 30, M.CORES), (256, 64), (128, 64), (64, 16)):
        host = {"limit_bytes": gib * GIB, "cores": cores, "base_bytes": M.BASE_BYTES}
        for knows in (M.first_build_knows(), {}):
            r, _ = S.simulate_factory(tasks, **knows, **host, **kw)
            assert r.oom_kills == 0 and not r.failed, (gib, cores, knows.keys())
