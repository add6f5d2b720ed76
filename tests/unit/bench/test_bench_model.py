"""The flash-attn model built from measured compile courses, the offline reference schedule, and the course
sampler (on real processes)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # bench/ is not an installed package

from bench import compile_course as C  # noqa: E402
from bench import model as M  # noqa: E402
from bench import offline as O  # noqa: E402
from factory.memory import simulate as S  # noqa: E402
from factory.memory.profiles import Measurement  # noqa: E402
from factory.memory.simulate import Task  # noqa: E402

GIB = 2**30


def test_every_kind_of_kernel_file_was_measured() -> None:
    kinds = {(c.kind, c.hdim) for c in M.measured_courses()}
    assert {k for k, _ in kinds} == {"fwd", "bwd", "split"}
    # each course is a real compile: a front end, cicc and ptxas per arch, the host compile
    for c in M.measured_courses():
        assert len(c.per_arch) == M.PER_ARCH_CHUNKS and c.front and c.back
        per_arch = sum(d for d, _ in c.per_arch)
        assert 0.8 < per_arch / c.seconds < 0.97, c.file
        assert max(b for _, b in c.per_arch) == c.peak_bytes


def test_the_recipe_data_holds_each_course_s_after_peak_fraction() -> None:
    from factory.spec.measured import parse_rows

    hand = parse_rows(M.HAND_CSV.read_text())
    rows = {r["note"].rpartition("course: ")[2]: r for r in hand if "course: " in r["note"]}
    for path in sorted(M.COURSES.glob("*.json")):
        data = json.loads(path.read_text())
        after = C.after_peak([int(m) for _, _, m in data["samples"]])
        row = rows[f"bench/data/flash-attn-courses/{path.name}"]
        assert after is not None and float(row["after_peak"]) == round(after, 3)
    # a compile that never falls to 3/4 of its peak gives none; one that falls holds the most after the fall
    assert C.after_peak([1, 5, 10, 9, 8]) is None
    assert C.after_peak([1, 10, 7, 6, 7, 2]) == 0.7


def test_a_measured_file_keeps_its_own_figures_and_others_are_interpolated() -> None:
    c = next(c for c in M.measured_courses() if c.kind == "fwd")
    task = M.compile_task(c.file, archs=1, threads=1, scale=1.0)
    assert task.peak_bytes == c.peak_bytes
    assert task.time_s == pytest.approx(c.seconds)
    peak = {(k, h): M.file_figures(k, h)[1] for k in ("fwd", "split") for h in M.HDIMS}
    # forward hdim96 and hdim192 were not measured: each halfway between its measured neighbours
    assert peak["fwd", 96] == pytest.approx((peak["fwd", 64] + peak["fwd", 128]) / 2)
    assert peak["fwd", 192] == pytest.approx((peak["fwd", 128] + peak["fwd", 256]) / 2)
    # split-KV was measured at 128 and 256 only: below that, the hdim128 file's figures and course
    for h in (32, 64, 96):
        shape, p, seconds = M.file_figures("split", h)
        assert (shape.hdim, p) == (128, peak["split", 128])
        assert seconds == shape.seconds


def test_four_archs_at_four_threads_hold_four_cicc_at_once() -> None:
    one = M.compile_task("flash_bwd_hdim128_fp16_sm80.cu", archs=1, threads=1, scale=1.0)
    four = M.compile_task("flash_bwd_hdim128_fp16_sm80.cu", archs=4, threads=4, scale=1.0)
    two_waves = M.compile_task("flash_bwd_hdim128_fp16_sm80.cu", archs=4, threads=2, scale=1.0)
    assert four.time_s == pytest.approx(one.time_s)
    assert four.peak_bytes == pytest.approx(4 * one.peak_bytes, rel=1e-6)
    assert max(t for _, _, t in four.phases) == 4
    assert two_waves.peak_bytes == pytest.approx(2 * one.peak_bytes, rel=1e-6)
    assert two_waves.time_s > 1.8 * one.time_s
    # one job of 4 threads over 4 archs reaches roughly 15-27 GiB, as reported (flash-attention #2079)
    peaks = [t.peak_bytes / GIB for t in M.flash_attn_tasks()]
    assert 12 < min(peaks) < 16 and 22 < max(peaks) < 28


def test_the_recipe_table_covers_the_model_files() -> None:
    """The first build is graded on the recipe's table: at least each file's modelled per-arch peak."""
    table = dict(M.hand_recipe().compile_gib_by_file)
    for name in M.kernel_files():
        kind, hdim = M.file_kind(name)
        prefix = {"fwd": "flash_fwd_hdim", "bwd": "flash_bwd_hdim", "split": "flash_fwd_split_hdim"}[kind]
        _, peak, _ = M.file_figures(kind, hdim)
        assert table[f"{prefix}{hdim}_*"] * GIB >= peak, name


def test_offline_search_places_what_fits_side_by_side() -> None:
    a = Task(name="a", phases=((10.0, 6 * GIB, 1),))
    b = Task(name="b", phases=((10.0, 6 * GIB, 1),))
    c = Task(name="c", phases=((5.0, 3 * GIB, 1), (5.0, 1 * GIB, 1)))
    assert O.best_offline([a, b], limit_bytes=10 * GIB, cores=4, tries=5).makespan_s == 20.0
    assert O.best_offline([a, c], limit_bytes=10 * GIB, cores=4, tries=5).makespan_s == 10.0
    # a late low phase lets the next peak start as soon as it fits: c's 3 GiB front end beside a, then b
    assert O.best_offline([a, b, c], limit_bytes=10 * GIB, cores=2, tries=50).makespan_s == 20.0
    # cores are a hard limit: two one-thread compiles on one core run one after the other
    assert O.best_offline([c, c], limit_bytes=100 * GIB, cores=1, tries=5).makespan_s == 20.0


def test_offline_search_is_never_worse_than_longest_first() -> None:
    tasks = M.flash_attn_tasks(scale=0.5)[:24]
    kw = {"limit_bytes": 128 * GIB, "cores": 32, "base_bytes": M.BASE_BYTES}
    lpt = O.best_offline(tasks, tries=0, **kw).makespan_s
    searched = O.best_offline(tasks, tries=40, **kw).makespan_s
    assert searched <= lpt
    assert searched >= S.lower_bound(tasks, limit_bytes=kw["limit_bytes"] - M.BASE_BYTES, cores=32)


def test_course_sampler_follows_a_real_process_tree(tmp_path: Path) -> None:
    script = (
        "import subprocess, sys, time\n"
        "child = 'b = bytearray(200 << 20); b[::4096] = b\"x\" * len(b[::4096]); time.sleep(1.5)'\n"
        "subprocess.run([sys.executable, '-c', 'import time\\n' + child], check=True)\n"
    )
    course = C.measure([sys.executable, "-c", script], interval_s=0.1)
    assert course.rc == 0
    assert course.peak_bytes > 200 << 20
    assert len(course.steps) >= 2  # the parent and its child, each with its own peak
    child = max(course.steps, key=lambda s: s.peak_bytes)
    assert child.peak_bytes > 200 << 20 and child.end_s - child.start_s >= 1.0
    assert course.wall_s >= 1.5 and course.samples[-1][0] <= course.wall_s
    data = course.to_json()
    assert json.loads(json.dumps(data))["steps"][0]["tool"]


def _compile(name: str, wall: float, low: float, peak: float) -> Measurement:
    """A measured fixture compile: a low front end for 13 of its 20 rise points, then its peak."""
    rise = (int(low * GIB),) * 13 + (int(peak * GIB),) * 7
    return Measurement(key=f"{name}|compute_80|1", peak_bytes=rise[-1], wall_s=wall, rise=rise, cpu_s=wall,
                       mem_s=rise[-1] * wall / 2)  # fmt: skip


def _memext(
    *, heavy_s: float = 60.0, scale: float = 1.0, light_peak: float = 0.26
) -> tuple[Measurement, ...]:
    """The fixture's eight compiles, each `scale` times as long."""
    return (
        *(_compile(f"heavy{i}.cu", heavy_s * scale, 0.27, 1.31) for i in (1, 2)),
        *(_compile(f"medium{i}.cu", 30.0 * scale, 0.23, 0.7) for i in (1, 2)),
        *(_compile(f"light{i}.cu", 12.0 * scale, 0.2, light_peak) for i in range(1, 5)),
    )


def test_the_real_benchmark_replays_its_measured_compiles_through_admission() -> None:
    from bench import real

    heavy = [_compile(f"heavy{i}.cu", 60.0, 0.27, 1.31) for i in (1, 2)]
    light = [_compile(f"light{i}.cu", 12.0, 0.2, 0.26) for i in range(1, 5)]
    limit = real.DEFAULT_LIMIT
    replay = real.replayed((*heavy, *light), limit_bytes=limit, cores=2)
    # the heavy TUs never peak together (2 x 1.31 GiB plus the margin do not fit), so they take 120 s of one
    # core at least; the lights fit beside them on the other
    assert 120.0 <= replay < 130.0
    assert replay == real.replayed((*heavy, *light), limit_bytes=limit, cores=2)  # deterministic
    # with room for both peaks, the heavy TUs run side by side
    assert real.replayed((*heavy, *light), limit_bytes=8 * GIB, cores=2) < 90.0
    # knowing every course, a schedule may start the second heavy TU's front end beside the first one's, so
    # that its peak comes after the first one ends: the reference is below the replay, above the CPU bound
    run = real.RealRun(wall_s=0.0, rc=0, oom_kills=0, peak_bytes=0, objects_kept=0, objects_total=0,
                       measurements=(*heavy, *light))  # fmt: skip
    assert 84.0 <= real.own_best_offline(run, limit, 2) < replay


def test_the_real_benchmark_s_reference_brackets_the_build() -> None:
    from bench import real

    assert real.bracketed(110.0, 130.0) == 120.0  # measured before and after it: a steady drift cancels
    assert real.bracketed(110.0, None) == 110.0  # the run after it failed: the one before alone


def test_the_real_benchmark_reads_steal_time_from_proc_stat() -> None:
    import os

    from bench import real

    hz = os.sysconf("SC_CLK_TCK")
    stat = "cpu  4390263 16490 316040 8826368 40379 0 14028 181377 0 0\ncpu0 1 2 3 4 5 6 7 99 0 0\n"
    assert real.steal_s(stat) == 181377 / hz  # the machine's line, not one CPU's
    assert real.steal_s("cpu  1 2 3 4\n") == 0.0  # a kernel without the column
    assert real.steal_s() >= 0.0  # this machine's own


def test_the_real_benchmark_bounds_a_build_by_its_own_compiles() -> None:
    from bench import real

    def run(*ms: Measurement) -> real.RealRun:
        return real.RealRun(wall_s=0.0, rc=0, oom_kills=0, peak_bytes=0, objects_kept=0, objects_total=0,
                            measurements=ms)  # fmt: skip

    def m(name: str, wall: float, cpu: float | None, gib: float, rc: int = 0) -> Measurement:
        return Measurement(key=f"{name}|compute_80|1", peak_bytes=int(gib * GIB), wall_s=wall, cpu_s=cpu,
                           rc=rc, mem_s=gib * GIB * wall)  # fmt: skip

    limit = 2 * GIB
    # CPU work: 100 + 60 + 40 s over 2 cores
    first = run(m("a.cu", 100.0, 100.0, 0.5), m("b.cu", 60.0, 60.0, 0.5), m("c.cu", 40.0, 40.0, 0.5))
    assert real.compiles_bound((first,), cores=2, limit_bytes=limit) == 100.0
    # a compile that waited behind another for a core counts its CPU time, and its memory x time shrinks
    waited = run(m("a.cu", 100.0, 100.0, 0.5), m("b.cu", 90.0, 60.0, 0.5), m("c.cu", 40.0, 40.0, 0.5))
    assert real.compiles_bound((waited,), cores=2, limit_bytes=limit) == 100.0
    # memory-bound: 1.5 GiB for 100 s and 1.5 GiB for 60 s cannot overlap under 2 GiB
    heavy = run(m("a.cu", 100.0, 100.0, 1.5), m("b.cu", 60.0, 60.0, 1.5))
    assert real.compiles_bound((heavy,), cores=2, limit_bytes=limit) == 120.0
    # a resumed build: what an OOM-killed attempt finished counts, a killed compile does not, and a file
    # compiled again counts once
    killed = run(m("a.cu", 100.0, 100.0, 0.5), m("b.cu", 30.0, 30.0, 0.5, rc=137))
    again = run(m("a.cu", 80.0, 80.0, 0.5), m("b.cu", 60.0, 60.0, 0.5))
    assert real.compiles_bound((killed, again), cores=2, limit_bytes=limit) == 80.0
    # lines of an older wrapper, without CPU time, count their wall time
    assert real.compiles_bound((run(m("a.cu", 50.0, None, 0.5)),), cores=2, limit_bytes=limit) == 50.0
    assert real.compiles_bound((run(),), cores=2, limit_bytes=limit) is None


def test_the_real_benchmark_replays_each_run_with_the_profile_of_another() -> None:
    from bench import real

    def run(heavy_s: float, *, light_peak: float = 0.26, ok: bool = True, files: int = 8) -> real.RealRun:
        compiles = _memext(heavy_s=heavy_s, light_peak=light_peak)[:files]
        return real.RealRun(wall_s=0.0, rc=0 if ok else 1, oom_kills=0, peak_bytes=0, objects_kept=0,
                            objects_total=0, measurements=compiles)  # fmt: skip

    runs = {"fast": run(50.0), "slow": run(70.0), "failed": run(60.0, ok=False), "cut": run(60.0, files=5)}
    cross = real.cross_replayed(runs, limit_bytes=real.DEFAULT_LIMIT, cores=2)
    # only complete, successful runs, never a run with its own profile
    assert set(cross) == {("fast", "slow"), ("slow", "fast")}
    for ratio in cross.values():
        assert 1.0 <= ratio < 1.5  # no schedule beats the bound of the compiles it ran
    # the profile is the other run's: one that saw the light TUs peak at 1 GiB keeps them from running
    # beside a heavy one
    high = real.cross_replayed({"fast": run(50.0), "high": run(50.0, light_peak=1.0)},
                               limit_bytes=real.DEFAULT_LIMIT, cores=2)  # fmt: skip
    assert high[("high", "fast")] > cross[("slow", "fast")] + 0.1
    assert cross == real.cross_replayed(runs, limit_bytes=real.DEFAULT_LIMIT, cores=2)  # deterministic


def test_the_real_benchmark_compares_every_strategy_with_runs_around_the_profiled_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import real

    built: list[str] = []

    def cgroup_build(
        build_dir: Path, *, max_jobs: int, admission_on: bool, limit_bytes: int, **_: object
    ) -> real.RealRun:
        built.append(build_dir.name)
        if not admission_on and max_jobs > 1 and limit_bytes < real.NO_LIMIT:  # every TU at once: killed
            return real.RealRun(wall_s=50.0, rc=1, oom_kills=1, peak_bytes=real.DEFAULT_LIMIT, objects_kept=0,
                                objects_total=real.OBJECTS)  # fmt: skip
        # the machine slows down by a fifth between the one-at-a-time runs around the profiled build
        # (the side-by-side reference's compiles take a twentieth more CPU than one at a time)
        scale = {"fixed-1": 1.0, "fixed-1-after": 1.2, "no-limit": 1.05, "no-limit-after": 1.26}.get(
            build_dir.name, 1.1
        )
        wall = (264.0 if max_jobs == 1 else 140.0) * scale
        return real.RealRun(wall_s=wall, rc=0, oom_kills=0, peak_bytes=GIB, objects_kept=0,
                            objects_total=real.OBJECTS, measurements=_memext(scale=scale))  # fmt: skip

    monkeypatch.setattr(real, "cgroup_build", cgroup_build)
    monkeypatch.setattr(real.os, "sched_getaffinity", lambda _: {0, 1})
    result = real.run_real(work=tmp_path / "work")
    # the reference runs one at a time right before the profiled build, and again right after it
    # with the side-by-side reference (every TU may run at once) between them and the build
    assert built == ["factory-cold", "factory-cold-single", "fixed-2", "fixed-1", "no-limit", "factory-warm",
                     "no-limit-after", "fixed-1-after"]  # fmt: skip
    strategies, notes = result["strategies"], result["notes"]
    assert isinstance(strategies, dict) and isinstance(notes, dict)
    # the strategies that ran one at a time take the mean of the two runs, as the bound does
    assert strategies["best_fixed"]["makespan_s"] == round(264.0 * 1.1, 1)
    assert strategies["seed_halving"] == {"makespan_s": round(50.0 + 264.0 * 1.1, 1), "oom_kills": 1,
                                          "failed": False, "peak_bytes": real.DEFAULT_LIMIT}  # fmt: skip
    assert notes["one_at_a_time_before_after_s"] == [264.0, round(264.0 * 1.2, 1)]
    before, after = notes["lower_bound_before_after_s"]
    assert after == pytest.approx(before * 1.2, abs=0.1)
    assert result["lower_bound_s"] == pytest.approx((before + after) / 2, abs=0.1)
    assert notes["own_lower_bound_s"]["best_fixed"] == result["lower_bound_s"]
    assert notes["own_lower_bound_s"]["factory"] == pytest.approx(before * 1.1, abs=0.1)
    side = notes["side_by_side_reference"]
    assert side["makespan_before_after_s"] == [round(140.0 * 1.05, 1), round(140.0 * 1.26, 1)]
    assert side["lower_bound_before_after_s"] == [pytest.approx(before * 1.05, abs=0.1),
                                                  pytest.approx(before * 1.26, abs=0.1)]  # fmt: skip
    assert side["lower_bound_s"] == pytest.approx(before * (1.05 + 1.26) / 2, abs=0.1)
    assert side["compiles_cpu_x_one_at_a_time"] == [1.05, 1.05]
    # five complete runs, each replayed with the profile of the four others
    assert notes["cross_replay_x_bound"]["pairs"] == 20
    assert 1.0 <= notes["cross_replay_x_bound"]["median"] <= notes["cross_replay_x_bound"]["max"]
