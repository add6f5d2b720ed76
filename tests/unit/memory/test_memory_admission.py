"""Admission decisions, nvcc command-line parsing and predictions (the code the wrapper and simulator
share)."""

from __future__ import annotations

import math
from dataclasses import replace

from factory.container import admission, nvcccall, protocol
from factory.container.admission import Prediction, Running, decide
from factory.container.protocol import compile_key

GIB = 2**30
LIMIT = 16 * GIB
HEAD = GIB  # headroom


def run(reserved: float, rss: float = 0, threads: int = 1) -> Running:
    return Running(pid=1, reserved_bytes=int(reserved * GIB), rss_bytes=int(rss * GIB), threads=threads)


def test_always_admits_when_nothing_runs() -> None:
    d = decide(limit_bytes=LIMIT, headroom_bytes=HEAD, used_bytes=0, running=[], prediction_bytes=100 * GIB)
    assert d.admit and d.reason == "nothing else runs"


def test_fits_and_does_not_fit() -> None:
    running = [run(6, 2), run(6, 7)]  # counted at max(reservation, rss): 6 + 7
    yes = decide(
        limit_bytes=LIMIT, headroom_bytes=HEAD, used_bytes=9 * GIB, running=running, prediction_bytes=2 * GIB
    )
    assert yes.admit and yes.committed_bytes == 13 * GIB
    no = decide(
        limit_bytes=LIMIT, headroom_bytes=HEAD, used_bytes=9 * GIB, running=running, prediction_bytes=3 * GIB
    )
    assert not no.admit and no.reason.startswith("memory")


def test_untracked_usage_counts() -> None:
    # 5 GiB used by something no wrapper tracks (the linker, Python): it reduces what compiles may take
    d = decide(
        limit_bytes=LIMIT,
        headroom_bytes=HEAD,
        used_bytes=6 * GIB,
        running=[run(4, 1)],
        prediction_bytes=7 * GIB,
    )
    assert d.committed_bytes == 5 * GIB + 4 * GIB
    assert not d.admit  # 9 + 7 > 15, while without the untracked 5 GiB it would fit


def test_cpu_bound() -> None:
    d = decide(limit_bytes=LIMIT, headroom_bytes=HEAD, used_bytes=0, running=[run(1, threads=4)],
               prediction_bytes=GIB, threads=4, cpus=6)  # fmt: skip
    assert not d.admit and d.reason.startswith("cpu")


def test_cpus_are_overcommitted_by_a_quarter_which_on_two_cpus_is_no_thread() -> None:
    def d(running: list[Running], threads: int, cpus: float) -> str:
        return decide(limit_bytes=LIMIT, headroom_bytes=HEAD, used_bytes=0, running=running,
                      prediction_bytes=1, threads=threads, cpus=cpus).reason  # fmt: skip

    four = [run(0.1, threads=4) for _ in range(4)]  # 16 busy threads on 16 CPUs
    assert d(four, 4, 16) == "fits"  # a fifth shares the cores: 20 <= 16 x 1.25
    assert d([*four, run(0.1, threads=4)], 4, 16).startswith("cpu: 20+4 threads > 16 CPUs")
    # one-thread compiles on 2 CPUs: as without overcommit, a third never starts beside two busy ones
    assert d([run(0.1)], 1, 2) == "fits" and d([run(0.1), run(0.1)], 1, 2).startswith("cpu")


def waiter(key: str, gib: float, seconds: float | None, ticket: int, threads: int = 1) -> admission.Waiting:
    return admission.Waiting(
        key=key,
        prediction=Prediction(peak_bytes=int(gib * GIB), wall_s=seconds),
        threads=threads,
        ticket=ticket,
    )


def test_choose_takes_the_first_in_priority_order_that_fits() -> None:
    kw = {"limit_bytes": LIMIT, "headroom_bytes": HEAD, "used_bytes": 0, "running": [run(8)]}  # 7 GiB free
    long_big = waiter("a", 9, 300.0, ticket=2)
    long_small = waiter("b", 6, 200.0, ticket=3)
    short_small = waiter("c", 2, 50.0, ticket=0)
    chosen, d = admission.choose([short_small, long_small, long_big], **kw)
    # the longest does not fit; the next longest that does goes first, not the one that came first
    assert chosen == long_small and d is not None and d.admit
    # nothing fits: no choice, and the reason is the first in order's
    chosen, d = admission.choose([long_big], **kw)
    assert chosen is None and d is not None and d.reason.startswith("memory")
    # when nothing runs, the first in order starts whatever its size
    chosen, _ = admission.choose([short_small, long_big], **{**kw, "running": []})
    assert chosen == long_big
    # CPU counts too: a 4-thread compile on 4 busy cores of 6 waits, a 1-thread one passes it
    busy = {**kw, "running": [run(1, threads=4)], "cpus": 6}
    chosen, _ = admission.choose([waiter("d", 1, 90.0, 0, threads=4), waiter("e", 1, 10.0, 1)], **busy)
    assert chosen is not None and chosen.key == "e"


def test_priority_longest_first_then_arrival() -> None:
    order = sorted([(admission.priority(None, 0), "a"), (admission.priority(50, 2), "b"),
                    (admission.priority(90, 3), "c"), (admission.priority(None, 1), "d")])  # fmt: skip
    assert [n for _, n in order] == ["c", "b", "a", "d"]


def test_reservation_follows_envelope() -> None:
    env = (10, 10, 10, 4, 4, 4, 2, 2, 2, 1)
    p = Prediction(peak_bytes=10, wall_s=100.0, envelope=env)
    assert admission.reservation(p, 0) == 10
    # seen at its peak, it is where the clock says
    assert admission.reservation(p, 60, seen_bytes=10) == 2
    assert admission.reservation(p, 60, seen_bytes=10, waves=2) == 4  # 48% done (slack 1.25)
    assert admission.reservation(p, 1000, seen_bytes=10) == 1
    assert admission.reservation(Prediction(peak_bytes=10), 1000) == 10  # no profile: the peak until the end


def test_envelope_is_max_from_here_on() -> None:
    samples = [(0.0, 1), (1.0, 5), (5.0, 3), (9.5, 2)]
    n = admission.ENVELOPE_POINTS
    at = [int(n * t / 10.0) for t, _ in samples]  # the point each sample falls in
    # after the last sample, what it held then: a compile holds memory until it ends
    expected = [5] * (at[1] + 1) + [3] * (at[2] - at[1]) + [2] * (at[3] - at[2]) + [2] * (n - 1 - at[3])
    assert admission.envelope(samples, 10.0) == tuple(expected)
    # a short compile sampled less often than its points: no point falls to 0 before its end
    assert min(admission.envelope([(0.05, 7), (0.25, 4)], 0.3)) == 4


def test_a_course_of_another_resolution_is_resampled_as_an_upper_bound() -> None:
    env = [10, 8, 6, 4, 2]  # most held from each fifth to the end
    assert admission.resample(env, 10) == [10, 10, 8, 8, 6, 6, 4, 4, 2, 2]
    assert admission.resample(env, 3) == [10, 8, 4]  # each from where it starts: 0, 1/3, 2/3
    rise = [1, 3, 5, 7, 9]  # most held up to the end of each fifth
    assert admission.resample(rise, 10, rising=True) == [1, 1, 3, 3, 5, 5, 7, 7, 9, 9]
    assert admission.resample(rise, 3, rising=True) == [3, 7, 9]  # each up to where it ends: 1/3, 2/3, 1
    assert admission.resample(env, 5) == env


def test_siblings_profiled_at_another_resolution_still_shape_a_prediction() -> None:
    old = [100] * 3 + [40] * 7  # an envelope of 10 points, as profiles were written before
    entries = {"k_h64.cu|compute_80|1": {"peak_bytes": 100, "wall_s": 10.0, "envelope": old}}
    p = admission.predict_from(entries, "k_h32.cu|compute_80|1", estimate_bytes=1000)
    n = admission.ENVELOPE_POINTS
    assert p.inferred and len(p.envelope) == n
    assert p.envelope[3 * n // 10 - 1] == 1000 and p.envelope[3 * n // 10] == 400


def test_parse_torch_style_nvcc_call() -> None:
    args = ["--generate-dependencies-with-compile", "--dependency-output", "x.o.d", "-I/inc", "-c",
            "/src/csrc/flash_fwd_hdim64_fp16_sm80.cu", "-o", "x.o", "-O3",
            "-gencode", "arch=compute_80,code=sm_80",
            "-gencode=arch=compute_90,code=sm_90", "--threads", "4", "--use_fast_math"]  # fmt: skip
    call = nvcccall.parse(args)
    assert call.is_compile
    assert call.source == "/src/csrc/flash_fwd_hdim64_fp16_sm80.cu"
    assert call.archs == ("compute_80", "compute_90")
    assert call.threads == 4
    key = compile_key(call.source, call.archs, call.threads)
    assert key == "flash_fwd_hdim64_fp16_sm80.cu|compute_80,compute_90|4"


def test_parse_non_compiles() -> None:
    assert not nvcccall.parse(["--version"]).is_compile
    assert not nvcccall.parse(["a.o", "b.o", "-dlink", "-o", "dlink.o"]).is_compile
    call = nvcccall.parse(["-c", "k.cu", "-arch=sm_80", "-t", "2", "-o", "k.o"])
    assert call.is_compile and call.archs == ("compute_80",) and call.threads == 2


def test_predict_profile_then_estimate() -> None:
    entries = {"k.cu|compute_80|1": {"peak_bytes": 123, "wall_s": 4.5, "envelope": [123, 50]}}
    p = admission.predict(entries, "k.cu|compute_80|1", per_arch_bytes=GIB, archs=1, nvcc_threads=1)
    # a profiled peak carries a margin: the profile may come from other torch headers or another host
    assert p == Prediction(peak_bytes=136, wall_s=4.5, envelope=(136, 55))
    q = admission.predict(
        entries, "other.cu|compute_80|1", per_arch_bytes=GIB, archs=2, nvcc_threads=4, base_bytes=5
    )
    # the estimate, shaped by the measured sibling (its envelope of 2 points at the current resolution)
    n = admission.ENVELOPE_POINTS
    assert (q.peak_bytes, q.wall_s, q.inferred) == (2 * GIB + 5, 4.5, True)
    assert q.envelope == (2 * GIB + 5,) * (n // 2) + (math.ceil((2 * GIB + 5) * 50 / 123),) * (n - n // 2)


def test_predict_killed_only_entry_is_a_lower_bound() -> None:
    entries = {"k.cu|compute_80|1": {"peak_bytes": 100, "wall_s": None}}
    p = admission.predict(
        entries, "k.cu|compute_80|1", per_arch_bytes=GIB, archs=1, nvcc_threads=1, base_bytes=0
    )
    assert p == Prediction(peak_bytes=GIB)
    # it has no time of its own: the recipe's time of its file still places it in the queue
    q = admission.predict_from(entries, "k.cu|compute_80|1", estimate_bytes=1, seconds_by_file=(("k*", 5.0),))
    assert q.rank_s == 5.0


def test_reservation_trusts_the_clock_once_the_peak_was_seen() -> None:
    env = (10, 10, 10, 10, 4, 4, 4, 4, 4, 1)
    p = Prediction(peak_bytes=10, wall_s=100.0, envelope=env)
    assert admission.reservation(p, 45) == 10  # 45 s counts as 36% done: the peak may be ahead
    assert admission.reservation(p, 45, seen_bytes=9) == 4  # it was seen at its peak: past it now
    assert admission.reservation(p, 45, seen_bytes=8) == 10  # not near its peak yet: slack stays
    # with two waves of archs, the peak seen may be the first of two: the slack stays
    assert admission.reservation(p, 45, seen_bytes=10, waves=2) == 10


def test_a_compile_behind_its_clock_is_reserved_by_what_it_holds() -> None:
    env = (10, 10, 10, 10, 4, 4, 4, 4, 4, 1)
    p = Prediction(peak_bytes=10, wall_s=100.0, envelope=env)
    assert admission.reservation(p, 45, seen_bytes=10, rss_bytes=3) == 4  # past its peak, as the clock says
    # at 9 it is still where the envelope holds 9 or more: its peak may come again
    assert admission.reservation(p, 45, seen_bytes=10, rss_bytes=9) == 10
    assert admission.reservation(p, 95, seen_bytes=10, rss_bytes=4) == 4
    assert [admission.behind(env, b) for b in (11, 10, 5, 4, 1, 0)] == [-1, 3, 3, 8, 9, 9]


def test_inferred_reservation_scales_with_the_peak_seen_once_past_it() -> None:
    env = (100, 100, 100, 100, 40, 40, 40, 40, 40, 10)
    p = Prediction(peak_bytes=100, wall_s=100.0, envelope=env, inferred=True)
    assert admission.reservation(p, 10, seen_bytes=50, rss_bytes=50) == 100  # before its peak by the clock
    # past its peak by the clock (slack 1.25) and its RSS fell from 50 to 20: the rest scales with 50 of 100
    assert admission.reservation(p, 55, seen_bytes=50, rss_bytes=20) == 20
    # its RSS has not fallen: it may be a slow compile still rising to a higher peak, and the clock cannot
    # say it is past the points of the envelope that hold more than it does now
    assert admission.reservation(p, 55, seen_bytes=50, rss_bytes=50) == 100
    # a profiled compile's envelope is its own: never scaled, and its peak is its own, so one seen at half
    # of it may still climb to it
    q = Prediction(peak_bytes=100, wall_s=100.0, envelope=env)
    assert admission.reservation(q, 55, seen_bytes=50, rss_bytes=20) == 100
    assert admission.reservation(q, 55, seen_bytes=90, rss_bytes=20) == 40


def test_a_slow_compile_whose_peak_comes_last_keeps_its_reservation_until_it_climbs() -> None:
    """memext's heavy TU: nvcc's front end (0.23 GiB) comes and goes, cicc holds 0.15 GiB for most of the
    compile, ptxas climbs to 0.7 GiB at the end. Sharing the cores, it runs 1.5x its sibling's time: the clock
    says it is done while its climb is still ahead."""
    env = (100,) * 9 + (10,)
    for inferred in (False, True):
        p = Prediction(peak_bytes=100, wall_s=100.0, envelope=env, inferred=inferred)
        assert admission.reservation(p, 150, seen_bytes=33, rss_bytes=21) == 100
        # once it climbed and fell, the clock is right
        assert admission.reservation(p, 150, seen_bytes=95, rss_bytes=9) == 10


def test_an_unprofiled_compile_past_its_peak_holds_the_recipe_s_after_peak_fraction() -> None:
    p = Prediction(peak_bytes=100, after_peak=0.6)
    assert admission.reservation(p, 10, seen_bytes=50, rss_bytes=50) == 100  # still rising
    assert admission.reservation(p, 10, seen_bytes=95, rss_bytes=95) == 100  # at its peak
    assert admission.reservation(p, 10, seen_bytes=95, rss_bytes=71) == 57  # fell to 3/4: 0.6 of 95
    assert admission.reservation(p, 10, seen_bytes=95, rss_bytes=80) == 100  # not fallen far enough
    # it fell, but from well below its estimate: that may be an early hump before the real peak
    assert admission.reservation(p, 10, seen_bytes=80, rss_bytes=20) == 100
    # with several waves of archs, the peak seen may be the first wave's
    assert admission.reservation(p, 10, seen_bytes=95, rss_bytes=20, waves=2) == 100
    # without the recipe's fraction nothing is assumed of its course
    assert admission.reservation(Prediction(peak_bytes=100), 10, seen_bytes=95, rss_bytes=20) == 100
    # an inferred course (siblings' envelope) is lowered by it too, never raised
    env = (100, 100, 100, 100, 90, 90, 90, 90, 90, 90)
    q = Prediction(peak_bytes=100, wall_s=100.0, envelope=env, inferred=True, after_peak=0.6)
    assert admission.reservation(q, 60, seen_bytes=95, rss_bytes=40) == 57
    assert admission.reservation(q, 60, seen_bytes=95, rss_bytes=40) < admission.reservation(
        Prediction(peak_bytes=100, wall_s=100.0, envelope=env, inferred=True), 60, seen_bytes=95, rss_bytes=40
    )


def test_the_after_peak_fraction_goes_with_estimates_not_with_a_file_s_own_profile() -> None:
    entries = {
        "a.cu|compute_80|1": {"peak_bytes": 100, "wall_s": 10.0, "envelope": [100] * 10},
        "b.cu|compute_80|1": {"peak_bytes": 100, "wall_s": None},  # only ever seen killed
    }
    own = admission.predict_from(entries, "a.cu|compute_80|1", estimate_bytes=GIB, after_peak=0.6)
    assert own.after_peak is None  # its own course is known exactly
    killed = admission.predict_from(entries, "b.cu|compute_80|1", estimate_bytes=GIB, after_peak=0.6)
    sibling = admission.predict_from(entries, "a2.cu|compute_80|1", estimate_bytes=GIB, after_peak=0.6)
    unknown = admission.predict_from({}, "c.cu|compute_80|1", estimate_bytes=GIB, after_peak=0.6)
    assert killed.after_peak == sibling.after_peak == unknown.after_peak == 0.6
    assert sibling.inferred and sibling.peak_bytes == GIB


def test_family_ignores_numbers_keeps_archs_and_threads() -> None:
    a = admission.family("flash_bwd_hdim64_fp16_sm80.cu|compute_80,compute_90|4")
    assert a == admission.family("flash_bwd_hdim256_fp16_sm80.cu|compute_80,compute_90|4")
    assert a != admission.family("flash_fwd_hdim64_fp16_sm80.cu|compute_80,compute_90|4")
    assert a != admission.family("flash_bwd_hdim64_fp16_sm80.cu|compute_80|4")


def test_unmeasured_file_takes_its_siblings_time_course_not_their_peak() -> None:
    env = [8 * GIB] * 4 + [2 * GIB] * 5 + [GIB]
    entries = {
        "bwd_h64.cu|compute_80|1": {"peak_bytes": 8 * GIB, "wall_s": 100.0, "envelope": env},
        "fwd_h64.cu|compute_80|1": {"peak_bytes": 4 * GIB, "wall_s": 50.0, "envelope": [v // 2 for v in env]},
        "bwd_h64.cu|compute_90|1": {"peak_bytes": 9 * GIB, "wall_s": 900.0, "envelope": env},  # other archs
    }
    p = admission.predict_from(entries, "bwd_h128.cu|compute_80|1", estimate_bytes=16 * GIB)
    assert p.inferred and p.peak_bytes == 16 * GIB  # a larger file of the family may peak higher
    assert p.wall_s == 100.0 * admission.SIBLING_TIME_MARGIN  # its own family's time, not fwd's nor sm_90's
    # the siblings' shape, at the estimate
    assert p.envelope[0] == 16 * GIB and p.envelope[admission.ENVELOPE_POINTS // 2] == 4 * GIB
    q = admission.predict_from(entries, "other.cu|compute_80|1", estimate_bytes=16 * GIB)
    assert q.wall_s == 100.0 * admission.SIBLING_TIME_MARGIN  # no family measured: the longest of the group
    assert admission.predict_from(entries, "x.cu|compute_86|1", estimate_bytes=GIB) == Prediction(
        peak_bytes=GIB
    )
    # the file's own entry wins
    own = admission.predict_from(entries, "fwd_h64.cu|compute_80|1", estimate_bytes=16 * GIB)
    assert own.peak_bytes == math.ceil(4 * GIB * admission.PROFILE_MARGIN) and not own.inferred


def test_siblings_measured_since_the_last_prediction_change_it() -> None:
    # the simulator and a dispatching wrapper add measurements to the same dict as compiles end: the shapes
    # remembered from the last prediction must not outlive them
    flat = [GIB] * 10
    entries: dict[str, dict[str, object]] = {
        "a.cu|compute_80|1": {"peak_bytes": GIB, "wall_s": 10.0, "envelope": flat}
    }
    before = admission.predict_from(entries, "c.cu|compute_80|1", estimate_bytes=8 * GIB)
    assert before.envelope[-1] == 8 * GIB
    falling = [GIB] * 5 + [GIB // 4] * 5
    entries["a.cu|compute_80|1"] = {"peak_bytes": GIB, "wall_s": 10.0, "envelope": falling}  # measured again
    assert (
        admission.predict_from(entries, "c.cu|compute_80|1", estimate_bytes=8 * GIB).envelope[-1] == 2 * GIB
    )
    entries["b.cu|compute_80|1"] = {"peak_bytes": GIB, "wall_s": 10.0, "envelope": flat}  # a sibling more
    assert (
        admission.predict_from(entries, "c.cu|compute_80|1", estimate_bytes=8 * GIB).envelope[-1] == 8 * GIB
    )
    assert admission.predict_from(entries, "c.cu|compute_80|1", estimate_bytes=8 * GIB) == before


BY_FILE = (("flash_fwd_split_*", 3 * GIB), ("flash_fwd_*", 4 * GIB), ("flash_bwd_*", 7 * GIB))


def test_per_file_estimate_first_matching_pattern_on_the_base_name() -> None:
    assert admission.file_per_arch_bytes("/src/csrc/flash_fwd_split_hdim64.cu", BY_FILE, GIB) == 3 * GIB
    assert admission.file_per_arch_bytes("flash_fwd_hdim64.cu|compute_80|4", BY_FILE, GIB) == 4 * GIB
    assert admission.file_per_arch_bytes("/x/flash_bwd_hdim256.cu", BY_FILE, GIB) == 7 * GIB
    # the pattern is on the base name, not the path; unmatched files take the fallback
    assert admission.file_per_arch_bytes("/flash_fwd_/other.cu", BY_FILE, GIB) == GIB
    assert admission.file_per_arch_bytes("flash_bwd.cu", (), 5 * GIB) == 5 * GIB


def test_predict_uses_the_pattern_for_unprofiled_files_and_the_profile_when_present() -> None:
    kw = {"per_arch_bytes": 6 * GIB, "archs": 4, "nvcc_threads": 4, "base_bytes": 0, "by_file": BY_FILE}
    key = compile_key("/a/flash_fwd_hdim64.cu", ["compute_80"], 4)
    assert admission.predict({}, key, **kw).peak_bytes == 4 * 4 * GIB
    other = compile_key("/a/other.cu", ["compute_80"], 4)
    assert admission.predict({}, other, **kw).peak_bytes == 4 * 6 * GIB
    learned = {key: {"peak_bytes": 10 * GIB, "wall_s": 50.0, "envelope": [10 * GIB] * 10}}
    assert admission.predict(learned, key, **kw).peak_bytes == admission.with_margin(10 * GIB)


def test_compile_estimate_is_what_predict_uses() -> None:
    est = admission.compile_estimate(
        "/s/flash_bwd_x.cu", per_arch_bytes=GIB, archs=2, nvcc_threads=4, base_bytes=5, by_file=BY_FILE
    )
    assert est == 2 * 7 * GIB + 5


def test_parse_by_file_drops_what_is_malformed() -> None:
    assert protocol.parse_by_file('[["a*", 5], ["b*", 2.5]]') == (("a*", 5), ("b*", 2))
    assert protocol.parse_by_file('[["a*", -1], ["b*"], [3, 4], ["c*", true], ["d*", 7]]') == (("d*", 7),)
    assert protocol.parse_by_file("not json") == ()
    assert protocol.parse_by_file('{"a*": 5}') == ()
    assert protocol.parse_by_file(None) == ()


def test_raised_by_file_follows_a_raised_per_arch_figure() -> None:
    table = (("a*", 2.0), ("b*", 3.0))
    assert admission.raised_by_file(table, per_arch_bytes=4, fallback_bytes=4, unit=GIB) == (
        ("a*", 2 * GIB),
        ("b*", 3 * GIB),
    )
    # an OOM retry raised the fallback by 1.5x: every per-file figure rises with it, never falls
    assert admission.raised_by_file(table, per_arch_bytes=6, fallback_bytes=4, unit=GIB) == (
        ("a*", 3 * GIB),
        ("b*", math.ceil(4.5 * GIB)),
    )
    assert admission.raised_by_file(table, per_arch_bytes=2, fallback_bytes=4, unit=1) == (
        ("a*", 2),
        ("b*", 3),
    )


def test_rise_is_the_most_held_so_far() -> None:
    samples = [(0.2, 1), (1.0, 2), (3.0, 9), (9.0, 4)]
    n = admission.RISE_POINTS
    r = admission.rise(samples, 10.0)
    assert len(r) == n
    at = [int(n * t / 10.0) for t, _ in samples]  # the point each sample falls in
    # each: the most up to the end of its step
    assert (r[at[0]], r[at[1] - 1], r[at[1]], r[at[2] - 1], r[at[2]], r[-1]) == (1, 1, 2, 2, 9, 9)
    assert list(r) == sorted(r)
    assert at[0] > 0 and r[0] == 1  # before the first sample: that sample, not a front end of nothing


def test_front_end_is_the_rise_below_half_the_peak() -> None:
    rise = (2,) * 10 + (3, 3, 9, 12) + (20,) * 6
    assert admission.front_bytes(Prediction(peak_bytes=20, rise=rise)) == 9  # stopped once above it
    assert admission.front_bytes(Prediction(peak_bytes=20, rise=(15,) * 20)) is None  # rises at once
    assert admission.front_bytes(Prediction(peak_bytes=20)) is None  # no course known


def two_stage(key: str, *, front: float, peak: float, ticket: int = 0) -> admission.Waiting:
    rise = (int(front * GIB),) * 10 + (int(peak * GIB),) * 10
    p = Prediction(peak_bytes=int(peak * GIB), wall_s=100.0, rise=rise)
    return admission.Waiting(key=key, prediction=p, threads=1, ticket=ticket)


def held(*, front: float | None, peak: float, rss: float, paused: bool = False) -> Running:
    reserved = front if front is not None else peak
    return Running(
        pid=1, reserved_bytes=int(reserved * GIB), rss_bytes=int(rss * GIB), peak_bytes=int(peak * GIB),
        front_bytes=None if front is None else int(front * GIB), paused=paused,
    )  # fmt: skip


def test_a_compile_with_a_front_end_starts_when_that_fits() -> None:
    # 15 GiB for compiles, 8 held at a peak: an 8 GiB peak does not fit now, its 1 GiB front end does
    kw = {"limit_bytes": LIMIT, "headroom_bytes": HEAD, "used_bytes": 8 * GIB}
    running = [held(front=None, peak=8, rss=8)]
    chosen, d = admission.choose([two_stage("a", front=1, peak=8)], running=running, **kw)
    assert chosen is not None and d is not None and d.admit
    # without two-stage admission it waits for the peak to pass
    chosen, d = admission.choose([two_stage("a", front=1, peak=8)], running=running, two_stage=False, **kw)
    assert chosen is None and d is not None and d.reason.startswith("memory")
    # the peaks booked stay within OVERBOOK x capacity: 8 + 8 + 8 > 1.25 x 15
    running = [held(front=None, peak=8, rss=8), held(front=1, peak=8, rss=1)]
    chosen, d = admission.choose([two_stage("b", front=1, peak=8)], running=running, **kw)
    assert chosen is None and d is not None and d.reason.startswith("peaks booked")


def test_a_stopped_compile_keeps_its_peak_from_new_starts() -> None:
    kw = {"limit_bytes": LIMIT, "headroom_bytes": HEAD, "used_bytes": 9 * GIB}
    # 8 GiB at a peak, one stopped at its rise waiting for 6: a 2 GiB compile would take what it waits for
    running = [held(front=None, peak=8, rss=8), held(front=1, peak=6, rss=1, paused=True)]
    small = admission.Waiting(key="s", prediction=Prediction(peak_bytes=2 * GIB), threads=1, ticket=0)
    chosen, _ = admission.choose([small], running=running, **kw)
    assert chosen is None
    # once it runs on, the same compile fits beside it
    running = [held(front=None, peak=8, rss=8), held(front=1, peak=6, rss=1)]
    chosen, _ = admission.choose([small], running=running, **{**kw, "limit_bytes": 20 * GIB})
    assert chosen == small


def test_a_stopped_compile_keeps_its_core_from_new_starts() -> None:
    kw = {"limit_bytes": 64 * GIB, "headroom_bytes": HEAD, "cpus": 2.0}
    prediction = Prediction(peak_bytes=4 * GIB)
    now = {"elapsed_s": 5.0, "seen_bytes": GIB, "rss_bytes": GIB, "threads": 1, "waves": 1}
    busy = admission.running(1, prediction, **now)
    stopped = admission.running(2, prediction, **now, front_bytes=GIB, paused=True)
    assert stopped.threads == 0 and stopped.stopped_threads == 1  # a stopped process uses no CPU now
    # one core busy, the other waited for by the stopped compile: a third would overcommit 2 CPUs by 50%
    new = admission.Waiting(key="n", prediction=Prediction(peak_bytes=GIB), threads=1, ticket=0)
    chosen, d = admission.choose([new], used_bytes=2 * GIB, running=[busy, stopped], **kw)
    assert chosen is None and d is not None and d.reason.startswith("cpu")
    # the stopped compile itself goes on beside the busy one
    assert admission.grant_peak(stopped, used_bytes=2 * GIB, others=[busy], threads=1, **kw).admit
    # with nothing stopped, the new compile takes the free core
    chosen, _ = admission.choose([new], used_bytes=GIB, running=[busy], **kw)
    assert chosen == new


def test_a_peak_is_granted_when_it_fits_or_when_every_other_compile_waits() -> None:
    kw = {"limit_bytes": LIMIT, "headroom_bytes": HEAD}
    own = held(front=1, peak=8, rss=1.2, paused=True)
    at_peak = held(front=None, peak=8, rss=8)
    # 8 held + its 8 > 15: it stays stopped; its own RSS is not counted twice
    assert not admission.grant_peak(own, used_bytes=int(9.2 * GIB), others=[at_peak], threads=1, **kw).admit
    past = Running(pid=2, reserved_bytes=2 * GIB, rss_bytes=2 * GIB, peak_bytes=8 * GIB)
    assert admission.grant_peak(own, used_bytes=int(3.2 * GIB), others=[past], threads=1, **kw).admit
    # every other compile stopped too: one must go on
    other = held(front=1, peak=8, rss=1.1, paused=True)
    assert admission.grant_peak(own, used_bytes=int(2.3 * GIB), others=[other], threads=1, **kw).admit


def test_unmeasured_file_takes_its_siblings_rise() -> None:
    env = [8 * GIB] * 4 + [2 * GIB] * 6
    rise = [GIB] * 2 + [8 * GIB] * 18
    entries = {
        "k_h64.cu|compute_80|1": {"peak_bytes": 8 * GIB, "wall_s": 100.0, "envelope": env, "rise": rise},
        "k_h32.cu|compute_80|1": {"peak_bytes": 8 * GIB, "wall_s": 60.0, "envelope": env, "rise": rise},
    }
    p = admission.predict_from(entries, "k_h128.cu|compute_80|1", estimate_bytes=16 * GIB)
    assert p.inferred and p.rise[0] == 2 * GIB and p.rise[-1] == 16 * GIB
    assert admission.front_bytes(p) == 2 * GIB  # its front end at the siblings' share of the estimate
    # a sibling without a rise (an older profile) leaves the compile to one-stage admission
    del entries["k_h32.cu|compute_80|1"]["rise"]
    q = admission.predict_from(entries, "k_h128.cu|compute_80|1", estimate_bytes=16 * GIB)
    assert q.rise == () and admission.front_bytes(q) is None


def test_the_recipe_s_seconds_order_unprofiled_compiles_in_this_build_s_seconds() -> None:
    seconds = (("long_*", 400.0), ("mid_*", 200.0), ("short_*", 100.0))
    # nothing measured yet: the table's own figures, one unit for every waiter
    assert admission.order_seconds({}, "long_a.cu|compute_80|4", seconds) == 400.0
    assert admission.order_seconds({}, "other.cu|compute_80|4", seconds) is None
    # measured compiles of the same arch set and threads scale the table (median ratio); others do not count
    entries = {
        "short_a.cu|compute_80|4": {"peak_bytes": GIB, "wall_s": 30.0, "envelope": [GIB]},
        "mid_a.cu|compute_80|4": {"peak_bytes": GIB, "wall_s": 50.0, "envelope": [GIB]},
        "mid_b.cu|compute_80|4": {"peak_bytes": GIB, "wall_s": 80.0, "envelope": [GIB]},
        "short_b.cu|compute_90|1": {"peak_bytes": GIB, "wall_s": 900.0, "envelope": [GIB]},
    }
    assert admission.order_seconds(entries, "long_a.cu|compute_80|4", seconds) == 400.0 * 0.3
    p = admission.predict_from(entries, "long_a.cu|compute_80|4", estimate_bytes=GIB, seconds_by_file=seconds)
    # the siblings give its reservation a time course; the table, more specific, its place in the queue
    assert p.inferred and p.wall_s == 80.0 * admission.SIBLING_TIME_MARGIN and p.rank_s == 120.0
    # a file's own profile orders it by its own time
    own = admission.predict_from(entries, "mid_b.cu|compute_80|4", estimate_bytes=1, seconds_by_file=seconds)
    assert own.order_s is None and own.rank_s == 80.0


def test_waiters_start_longest_first_by_the_recipe_s_seconds() -> None:
    def waiter(key: str, ticket: int) -> admission.Waiting:
        p = admission.predict_from({}, key, estimate_bytes=GIB, seconds_by_file=(("long_*", 9.0),))
        return admission.Waiting(key=key, prediction=p, threads=1, ticket=ticket)

    chosen, _ = admission.choose(
        [waiter("short.cu|compute_80|1", 0), waiter("long_k.cu|compute_80|1", 1)],
        limit_bytes=8 * GIB, headroom_bytes=0, used_bytes=0, running=[],
    )  # fmt: skip
    assert chosen is not None and chosen.key == "long_k.cu|compute_80|1"


def test_a_malformed_seconds_table_is_dropped_item_by_item() -> None:
    text = '[["a*", 2.5], ["b*", 0], ["c*", "x"], ["d*", true], "e", ["f*", 1e999], ["g*", 3]]'
    assert protocol.parse_seconds_by_file(text) == (("a*", 2.5), ("g*", 3))
    assert protocol.parse_seconds_by_file("not json") == ()
    assert protocol.parse_by_file('[["a*", 2.5]]') == (("a*", 2),)


def test_a_compile_rises_once_past_its_front_end_by_the_slack() -> None:
    front = GIB
    assert not admission.rises(front, front)
    assert not admission.rises(front, int(front * admission.FRONT_SLACK))  # a front end that holds more
    assert admission.rises(front, int(front * admission.FRONT_SLACK) + 1)


# A first build: the memext fixture under 2.25 GiB (2 GiB for compiles), no profile; the recipe estimates a
# heavy file at 1.75 GiB (1.3 GiB measured) and a light one at 0.6 GiB (0.26 measured).
FIRST = {"limit_bytes": int(2.25 * GIB), "headroom_bytes": GIB // 4, "cpus": 2.0}
UNTRACKED = 0.1  # ninja, setup.py's Python, the wrappers


def heavy(*, rss: float, seen: float, steady_s: float, pid: int = 1, peak: float = 1.75) -> Running:
    return admission.running(
        pid, Prediction(peak_bytes=int(peak * GIB)), elapsed_s=20.0, seen_bytes=int(seen * GIB),
        rss_bytes=int(rss * GIB), threads=1, waves=1, steady_s=steady_s,
    )  # fmt: skip


def light(key: str = "l", peak: float = 0.6) -> admission.Waiting:
    return admission.Waiting(key=key, prediction=Prediction(peak_bytes=int(peak * GIB)), threads=1, ticket=0)


def used(*running: Running) -> int:
    return sum(r.rss_bytes for r in running) + int(UNTRACKED * GIB)


def test_a_first_build_starts_a_light_compile_beside_a_heavy_one_past_its_peak() -> None:
    h = heavy(rss=0.45, seen=1.3, steady_s=0.0)  # fell from 1.3 GiB: its peak is behind it
    assert h.estimated and h.held_bytes == int(1.75 * GIB)  # booked at its estimate: 0.6 more do not fit
    chosen, d = admission.choose([light()], used_bytes=used(h), running=[h], measured=False, **FIRST)
    assert chosen is None and d is not None and d.reason.startswith("memory")
    chosen, d = admission.choose([light()], used_bytes=used(h), running=[h], **FIRST)
    assert chosen is not None and d is not None and d.admit and d.reason.startswith("measured")
    # the heavy one keeps a line at the most it was seen at or above; the light one's own line is at least
    # LINE_FLOOR of its estimate; lines, the untracked usage and nothing else add up to the capacity
    ((pid, line),) = d.lines
    assert pid == 1 and int(1.3 * GIB) <= line < int(1.75 * GIB)
    assert d.line_bytes is not None and d.line_bytes >= admission.LINE_FLOOR * 0.6 * GIB
    assert int(UNTRACKED * GIB) + line + d.line_bytes <= FIRST["limit_bytes"] - FIRST["headroom_bytes"]
    # once cut, the heavy one counts at its line, and its wrapper stops it above it
    cut = admission.running(
        1, Prediction(peak_bytes=int(1.75 * GIB)), elapsed_s=20.0, seen_bytes=int(1.3 * GIB),
        rss_bytes=int(0.45 * GIB), threads=1, waves=1, line_bytes=line,
    )  # fmt: skip
    assert cut.held_bytes == line


def test_a_compile_on_a_plateau_below_its_estimate_gets_a_line() -> None:
    # causal-conv1d's backward kernel: 2.45 GiB for minutes, the recipe's estimate 4.25; 7.5 GiB for compiles
    kw = {"limit_bytes": 8 * GIB, "headroom_bytes": GIB // 2, "cpus": 2.0}
    bwd = heavy(rss=2.45, seen=2.45, steady_s=admission.PLATEAU_S, peak=4.25)
    chosen, d = admission.choose([light(peak=4.25)], used_bytes=used(bwd), running=[bwd], **kw)
    assert chosen is not None and d is not None and d.admit
    ((_, line),) = d.lines
    assert line >= 2.45 * admission.LINE_MARGIN * GIB  # room above what it holds
    # not yet steady for PLATEAU_S: it may still climb, and waits are cheaper than stops at its peak
    climbing = heavy(rss=2.45, seen=2.45, steady_s=admission.PLATEAU_S / 2, peak=4.25)
    chosen, _ = admission.choose([light(peak=4.25)], used_bytes=used(climbing), running=[climbing], **kw)
    assert chosen is None


def test_a_light_compile_starts_beside_one_in_its_front_end_and_a_heavier_one_waits() -> None:
    # the memext heavy TU holds 0.26 GiB for 70% of its time, then climbs to 1.3 at its end
    h = heavy(rss=0.26, seen=0.26, steady_s=1.0)
    chosen, d = admission.choose([light()], used_bytes=used(h), running=[h], **FIRST)
    assert chosen is not None and d is not None
    ((_, line),) = d.lines
    assert line >= 0.26 * admission.LINE_MARGIN * GIB and d.line_bytes is not None
    # a compile of more than LIGHT_FRACTION of its estimate may well be running when it climbs, and would
    # stop it: it waits, however long the running one has held steady below half its estimate
    for steady_s in (1.0, 60.0):
        h = heavy(rss=0.26, seen=0.26, steady_s=steady_s)
        chosen, _ = admission.choose([light(peak=1.2)], used_bytes=used(h), running=[h], **FIRST)
        assert chosen is None


def test_a_compile_with_its_own_profile_is_not_cut() -> None:
    # past a profiled peak its envelope already tells what it holds: no line
    course = Prediction(peak_bytes=int(1.75 * GIB), wall_s=30.0, envelope=(int(1.75 * GIB),) * 80)
    profiled = admission.running(
        1, course, elapsed_s=1.0, seen_bytes=int(1.3 * GIB), rss_bytes=int(0.45 * GIB), threads=1, waves=1,
        steady_s=60.0,
    )  # fmt: skip
    assert not profiled.estimated
    chosen, _ = admission.choose([light()], used_bytes=used(profiled), running=[profiled], **FIRST)
    assert chosen is None


def test_the_started_compile_s_line_is_not_below_what_the_estimates_proved_worth() -> None:
    # a heavy one seen at 1.7 of its 1.75 GiB estimate: the recipe's estimates are near the mark, so the
    # light one's line is near its whole estimate, and the two do not fit
    h = heavy(rss=0.45, seen=1.7, steady_s=0.0)
    chosen, _ = admission.choose([light()], used_bytes=used(h), running=[h], **FIRST)
    assert chosen is None
    # a smaller one fits, and gets its estimate's worth
    chosen, d = admission.choose([light(peak=0.2)], used_bytes=used(h), running=[h], **FIRST)
    assert chosen is not None and d is not None
    assert d.line_bytes is None or d.line_bytes >= 1.7 / 1.75 * 0.2 * GIB


def test_a_compile_stopped_at_its_line_books_its_estimate_until_granted() -> None:
    p = Prediction(peak_bytes=int(1.75 * GIB))
    now = {
        "elapsed_s": 20.0,
        "seen_bytes": int(1.4 * GIB),
        "rss_bytes": int(1.4 * GIB),
        "threads": 1,
        "waves": 1,
    }
    stopped = admission.running(1, p, **now, line_bytes=int(1.35 * GIB), paused=True)
    assert stopped.booked_bytes == int(1.75 * GIB)  # a new compile does not take what it waits for
    small = admission.running(
        2, Prediction(peak_bytes=int(0.6 * GIB)), **{**now, "rss_bytes": int(0.25 * GIB)}
    )
    # its peak does not fit beside the light one: it stays stopped until that one ends
    d = admission.grant_peak(stopped, used_bytes=used(stopped, small), others=[small], threads=1, **FIRST)
    assert not d.admit
    assert admission.grant_peak(stopped, used_bytes=used(stopped), others=[], threads=1, **FIRST).admit
    # rising from its front end below its line, it goes on to its line: the lines were made to fit
    front = admission.running(
        1, p, **{**now, "rss_bytes": int(0.4 * GIB)}, front_bytes=int(0.26 * GIB), line_bytes=int(1.35 * GIB)
    )
    assert front.held_bytes == int(1.35 * GIB)  # it may grow to its line without asking
    d = admission.grant_peak(front, used_bytes=used(front, small), others=[small], threads=1, **FIRST)
    assert d.admit and d.reason == "within its line"


def test_a_line_s_peak_stays_booked_for_a_front_end() -> None:
    """A line stops a compile until its peak is granted: a front end that bets on the peaks booked passing
    first counts the lined compile at its peak, not at its line (two memext heavy TUs, one lined beside a
    light one, the other started for its front end on the strength of that line, climbed together)."""
    kw = {"limit_bytes": LIMIT, "headroom_bytes": HEAD, "used_bytes": 9 * GIB}
    at_peak = held(front=None, peak=8, rss=8)
    lined = Running(pid=2, reserved_bytes=2 * GIB, rss_bytes=GIB, peak_bytes=8 * GIB, line_bytes=2 * GIB,
                    estimated=True)  # fmt: skip
    assert lined.booked_bytes == 2 * GIB and lined.peak_booked_bytes == 8 * GIB
    chosen, d = admission.choose([two_stage("c", front=1, peak=8)], running=[at_peak, lined], **kw)
    assert chosen is None and d is not None and d.reason.startswith("peaks booked")
    # the same compile without a line, past its peak and holding 2 GiB, leaves room for the bet
    past = replace(lined, line_bytes=None, estimated=False)
    chosen, _ = admission.choose([two_stage("c", front=1, peak=8)], running=[at_peak, past], **kw)
    assert chosen is not None


def test_of_compiles_all_stopped_only_one_goes_on() -> None:
    a = Running(pid=10, reserved_bytes=GIB, rss_bytes=GIB, peak_bytes=8 * GIB, front_bytes=GIB, paused=True)
    b = Running(pid=11, reserved_bytes=GIB, rss_bytes=int(1.5 * GIB), peak_bytes=8 * GIB, paused=True,
                line_bytes=GIB)  # fmt: skip

    def goes(capacity_gib: float) -> list[int]:
        kw = {"limit_bytes": int(capacity_gib * GIB), "headroom_bytes": 0, "threads": 1}
        used = a.rss_bytes + b.rss_bytes
        return [
            r.pid
            for r, other in ((a, b), (b, a))
            if admission.grant_peak(r, used_bytes=used, others=[other], **kw).admit
        ]

    assert goes(15) == [10]  # both fit beside the other's front end: the lower pid, and only it
    assert goes(9) == [11]  # only b's peak fits beside what a holds (2.5 - 1.5 + 8 <= 9)
    assert goes(8) == [11]  # none fits: the one that needs least above what it holds
    d = admission.grant_peak(a, used_bytes=int(2.5 * GIB), others=[b], limit_bytes=9 * GIB, headroom_bytes=0,
                             threads=1)  # fmt: skip
    assert not d.admit and d.reason == "another stopped compile goes on first"
