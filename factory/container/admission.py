"""The admission decision for one nvcc compile: the single implementation used by the wrapper and the
host's simulator and planner.

Standard library only, like the whole of its package: it runs in build containers, whose Python has nothing
of the factory's dependencies.
"""

from __future__ import annotations

import bisect
import fnmatch
import functools
import math
import operator
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

GIB = 1 << 30
MIB = 1 << 20
_V = TypeVar("_V")

# nvcc's own front end (cudafe++, the host preprocessor) before any cicc starts; measured ~180 MiB on small
# TUs.
DEFAULT_BASE_BYTES = 256 * MIB


@dataclass(frozen=True)
class Running:
    """A compile holding a reservation: what it was promised and what its process tree holds now."""

    pid: int
    reserved_bytes: int
    rss_bytes: int
    threads: int = 1  # busy threads now (cicc/ptxas running side by side), not the most it may use
    # admitted for its front end only (`front_bytes`): its predicted peak is still to be granted
    front_bytes: int | None = None
    peak_bytes: int = 0
    paused: bool = False  # stopped at its rise until its peak is granted
    stopped_threads: int = 0  # a stopped compile's threads, busy again once its peak is granted
    # its peak is the recipe's estimate (no profile of its own): its reservation may be cut to a line
    estimated: bool = False
    # admitted beside others by measured memory (`metered`): it is stopped once its RSS passes this line,
    # until its peak is granted
    line_bytes: int | None = None
    seen_bytes: int = 0  # the most RSS seen of it so far
    steady_s: float = 0.0  # seconds since its RSS last grew (by more than STEADY_GROWTH)

    @property
    def held_bytes(self) -> int:
        return max(self.reserved_bytes, self.rss_bytes)

    @property
    def booked_bytes(self) -> int:
        """What it will hold at most: its peak when that is still to be granted (a front end, or a stopped
        line)."""
        if self.paused or (self.front_bytes is not None and self.line_bytes is None):
            return max(self.held_bytes, self.peak_bytes)
        return self.held_bytes

    @property
    def peak_booked_bytes(self) -> int:
        """What it will hold at most by the end: a line only stops a compile until its peak is granted, so a
        compile with a line books its peak too."""
        return max(self.booked_bytes, self.peak_bytes) if self.line_bytes is not None else self.booked_bytes


def running(
    pid: int,
    prediction: Prediction,
    *,
    elapsed_s: float,
    seen_bytes: int,
    rss_bytes: int,
    threads: int,
    waves: int,
    front_bytes: int | None = None,
    paused: bool = False,
    line_bytes: int | None = None,
    steady_s: float = 0.0,
) -> Running:
    """A running compile as admission sees it: admitted for its front end, it holds that; else what is left
    of its envelope (`reservation`), at most its line. A stopped compile uses no CPU."""
    reserved = (
        front_bytes
        if front_bytes is not None
        else reservation(prediction, elapsed_s, seen_bytes, rss_bytes, waves=waves)
    )
    if line_bytes is not None:
        # it may grow to its line without asking, from its front end too
        reserved = line_bytes if front_bytes is not None else min(reserved, line_bytes)
    return Running(
        pid=pid,
        reserved_bytes=reserved,
        rss_bytes=rss_bytes,
        threads=0 if paused else threads,
        stopped_threads=threads if paused else 0,
        front_bytes=front_bytes,
        peak_bytes=prediction.peak_bytes,
        paused=paused,
        estimated=is_estimated(prediction),
        line_bytes=line_bytes,
        seen_bytes=seen_bytes,
        steady_s=steady_s,
    )


_running = running  # for the functions whose `running` argument (the compiles that run) hides it


def is_estimated(prediction: Prediction) -> bool:
    """Whether a prediction's peak is the recipe's estimate, not the compile's own profile."""
    return prediction.wall_s is None or prediction.inferred


@dataclass(frozen=True)
class Decision:
    admit: bool
    reason: str
    committed_bytes: int
    capacity_bytes: int
    # a metered start (`metered`): the lines of running compiles (pid -> bytes) and the started one's own;
    # a peak granted (`grant_peak`): the line the compile keeps, None when it may go on to its peak
    lines: tuple[tuple[int, int], ...] = ()
    line_bytes: int | None = None


def default_headroom(limit_bytes: int) -> int:
    """Memory kept free for the link step, setup.py's Python and ninja: 1/16 of the limit, 256 MiB to 2
    GiB."""
    return max(256 * MIB, min(2 * GIB, limit_bytes // 16))


def per_compile_estimate(*, per_arch_bytes: int, archs: int, nvcc_threads: int, base_bytes: int) -> int:
    """Peak of one nvcc call: each nvcc thread runs one cicc/ptxas for one arch at a time."""
    return max(1, min(max(1, nvcc_threads), max(1, archs))) * per_arch_bytes + base_bytes


# Busy threads may exceed the CPUs by this factor. Admission in whole compiles of several threads each fills
# the cores in rounds; the last compiles, too few to fill them, would run alone after the previous round, and
# sharing the cores with it instead ends them together. With a few CPUs a quarter is less than one thread, so
# one-thread compiles on 2 CPUs are admitted as before. Measured on the flash-attn model (4-thread compiles on
# 128 CPUs): 1.0 -> 370 s, 1.1 -> 364, 1.2 -> 329, 1.25 -> 330, 1.3 -> 327, 1.5 -> 336, 2.0 -> 346; 1.5 and
# more slowed the memext fixture's heavy compiles in simulation (96 -> 112 s) by sharing their cores with
# light ones.
CPU_OVERCOMMIT = 1.25


def decide(
    *,
    limit_bytes: int,
    headroom_bytes: int,
    used_bytes: int,
    running: Sequence[Running],
    prediction_bytes: int,
    threads: int = 1,
    cpus: float | None = None,
) -> Decision:
    """Whether a compile that needs `prediction_bytes` may go on now (start, or be granted its peak).

    `used_bytes` is the cgroup's working set, which already holds the running compiles' current RSS; each
    running compile is counted at the larger of its reservation and its RSS, the rest of the usage as
    untracked.
    """
    capacity = max(0, limit_bytes - headroom_bytes)
    tracked_rss = sum(r.rss_bytes for r in running)
    untracked = max(0, used_bytes - tracked_rss)
    committed = untracked + sum(r.held_bytes for r in running)

    def verdict(admit: bool, reason: str) -> Decision:
        return Decision(admit=admit, reason=reason, committed_bytes=committed, capacity_bytes=capacity)

    if not running:
        return verdict(True, "nothing else runs")
    if cpus is not None:
        busy = sum(r.threads for r in running)
        if busy + threads > max(1.0, cpus * CPU_OVERCOMMIT):
            return verdict(False, f"cpu: {busy}+{threads} threads > {cpus:g} CPUs + {CPU_OVERCOMMIT - 1:.0%}")
    if committed + prediction_bytes > capacity:
        return verdict(
            False, f"memory: {(committed + prediction_bytes) / GIB:.2f} GiB > {capacity / GIB:.2f} GiB"
        )
    return verdict(True, "fits")


@dataclass(frozen=True)
class Waiting:
    """A compile waiting for admission: `key` names it (a wrapper's pid, a simulated task), and `pid` is how
    the compiles beside it know it once it runs (`Running.pid`, the pids of `Decision.lines`)."""

    key: str
    prediction: Prediction
    threads: int
    ticket: int  # the order ninja started the compiles in
    pid: int = 0
    waves: int = 1  # ceil(archs / nvcc threads): its cicc runs one after the other


def choose(
    waiting: Sequence[Waiting],
    *,
    limit_bytes: int,
    headroom_bytes: int,
    used_bytes: int,
    running: Sequence[Running],
    cpus: float | None = None,
    two_stage: bool = True,
    measured: bool = True,
) -> tuple[Waiting | None, Decision | None]:
    """The compile to start now: the first waiter in priority order that may start, with its decision; else
    None and the decision of the first in order (why it waits).

    A compile with a low front end (`front_bytes`) starts when its front end fits, as long as the peaks booked
    by the running compiles (theirs, or what they hold) and its own stay within OVERBOOK times the capacity;
    its peak is granted when it rises (`grant_peak`). Other compiles start when their peak fits now. A paused
    compile counts at its peak and its threads here: a new compile never takes the memory or the cores one
    already half done waits for (its own wrapper asks for its grant at its next poll, after the dispatcher may
    have started others).

    Greedy in priority order: a higher-priority compile that does not fit yet does not hold back one that
    does (measured on the flash-attn model at four host sizes: holding memory for it, with backfilling for
    compiles of known time, was within 1% for profiled builds and 2-5% slower for first builds, as an
    unprofiled compile never backfills).

    With `measured`, a compile whose peak is an estimate that does not fit beside the running compiles'
    reservations may still start by what they hold now (`metered`).
    """
    capacity = max(0, limit_bytes - headroom_bytes)
    untracked = max(0, used_bytes - sum(r.rss_bytes for r in running))
    view = [
        replace(r, reserved_bytes=r.booked_bytes, threads=r.stopped_threads) if r.paused else r
        for r in running
    ]
    # the peaks a new front end bets will pass before its own comes: a line's peak is still to come
    booked = sum(r.peak_booked_bytes for r in running)
    first: Decision | None = None
    for w in sorted(waiting, key=lambda w: priority(w.prediction.rank_s, w.ticket)):
        front = front_bytes(w.prediction) if two_stage else None
        if front is not None and running and booked + w.prediction.peak_bytes > OVERBOOK * capacity:
            d = Decision(False, "peaks booked: wait for one to pass", booked, capacity)
            for_memory = _cpu_free(view, w.threads, cpus)
        else:
            d = decide(
                limit_bytes=limit_bytes,
                headroom_bytes=headroom_bytes,
                used_bytes=used_bytes,
                running=view,
                prediction_bytes=w.prediction.peak_bytes if front is None else front,
                threads=w.threads,
                cpus=cpus,
            )
            if d.admit:
                return w, d
            for_memory = d.reason.startswith("memory")
        if measured and for_memory and is_estimated(w.prediction):
            m = metered(w, capacity_bytes=capacity, untracked_bytes=untracked, running=view)
            if m is not None:
                return w, m
        first = first or d
    return None, first


# A compile whose peak is the recipe's estimate may start beside others by what they hold now, not by what
# they reserve (`metered`). A recipe's estimate is its author's rounded-up guess (memext: heavy files 1.5 GiB
# per arch for 1.3 GiB measured, light files 0.35 for 0.26; causal-conv1d: 4 GiB for 2.45), and a first
# build that books it whole runs its heaviest compile alone. Running compiles whose peaks are estimates get
# lines: a wrapper stops its compile (SIGSTOP) once its RSS passes its line, until its peak is granted
# (`grant_peak`), so the reservations and lines still add up to the capacity whatever the estimates were
# worth: a wrong bet costs a stop, never an OOM kill. Which compiles get lines, and how low:
# - one that has shown where its peak is: it holds at least FRONT_FRACTION of its estimate and has either
#   fallen from the most it was seen at (PAST_PEAK_DROP) or not grown for PLATEAU_S; its line is at least
#   that most, and LINE_MARGIN above what it holds now;
# - any other, beside a compile started of at most LIGHT_FRACTION of its estimate: its line is at least
#   LINE_MARGIN above what it holds now. The bet is that the lighter one ends, or the line holds, before it
#   climbs (memext's TUs hold their front end, 0.26 GiB for a heavy one, for 70% of their time and climb at
#   the end);
# - the compile started: at least LINE_FLOOR of its estimate, and not below what those that showed their
#   peak proved the estimates worth (their peak seen of their estimate).
# A compile still climbing beside one as heavy is never cut: flash-attn's cicc climbs to its peak (near the
# recipe's per-file estimate) in steps of a few seconds, longer when the cores are shared (3.4 s seen in the
# model), and a line below its peak would stop it there for the time of the compile that took its memory.
# Measured on the flash-attn model's first build (432 GiB / 128 cores; 326.3 s before) and a model of the
# memext first build (2.25 GiB / 2 cores, its measured course shape, bound 58.5 s; 79.5 s before):
# LIGHT_FRACTION 0.5 -> 326.3 and 75.5 s, 0.65 -> 337.6 and 67.0 s (the first build of the real fixture
# needs the medium TUs beside the heavy ones, 0.6 of their estimate); with the recipe's single per-arch figure
# the model's first build 452 -> 394 s. PLATEAU_S from 6 to 40 s gave the same; 3 s, or no FRONT_FRACTION
# condition, cut the model's compiles mid-climb (362 and 384 s).
LINE_FLOOR = 0.75
LINE_MARGIN = 1.25
PLATEAU_S = 10.0
LIGHT_FRACTION = 0.65
# RSS growth below this factor of the level it held does not count as growing (allocator noise).
STEADY_GROWTH = 1.05


def metered(
    w: Waiting, *, capacity_bytes: int, untracked_bytes: int, running: Sequence[Running]
) -> Decision | None:
    """A start by measured memory for `w`, whose peak (an estimate) does not fit beside the running
    compiles' bookings: the running compiles that may get lines (not stopped, their peaks estimates; see
    LIGHT_FRACTION) and `w` itself get lines, each at least its lowest, the room left shared in proportion
    to what each line is below its booking; the others count at what they book. None when no running
    compile may get a line, or even the lowest lines do not fit."""
    fixed = untracked_bytes
    flexible: list[tuple[int | None, int, int]] = []  # (pid, lowest line, reservation)
    worth = 0.0  # the most a compile that showed its peak was seen at, of its estimate
    peak = w.prediction.peak_bytes
    for r in running:
        low = max(math.ceil(r.rss_bytes * LINE_MARGIN), r.seen_bytes)
        cuttable = r.estimated and not r.paused
        shown = (
            cuttable
            and r.seen_bytes >= FRONT_FRACTION * r.peak_bytes
            and (r.steady_s >= PLATEAU_S or r.rss_bytes <= PAST_PEAK_DROP * r.seen_bytes)
        )
        if shown:
            worth = max(worth, r.seen_bytes / max(1, r.peak_bytes))
        # one whose peak may still come gets a line only beside a light compile
        lined = shown or (cuttable and peak <= LIGHT_FRACTION * r.peak_bytes)
        if lined and low < r.booked_bytes:
            flexible.append((r.pid, low, r.booked_bytes))
        else:
            fixed += r.booked_bytes
    if not flexible:
        return None
    flexible.append((None, min(peak, math.ceil(max(LINE_FLOOR, worth) * peak)), peak))
    spare = capacity_bytes - fixed - sum(low for _, low, _ in flexible)
    if spare < 0:
        return None
    wanted = sum(top - low for _, low, top in flexible)
    share = 1.0 if wanted <= spare else spare / wanted
    lines = {pid: (min(top, low + int((top - low) * share)), top) for pid, low, top in flexible}
    own, _ = lines.pop(None)
    committed = fixed + sum(line for line, _ in lines.values())
    return Decision(
        admit=True,
        reason=f"measured: {(committed + own) / GIB:.2f} GiB of lines <= {capacity_bytes / GIB:.2f} GiB",
        committed_bytes=committed,
        capacity_bytes=capacity_bytes,
        lines=tuple((pid, line) for pid, (line, top) in lines.items() if pid is not None and line < top),
        line_bytes=None if own >= peak else own,
    )


def _cpu_free(running: Sequence[Running], threads: int, cpus: float | None) -> bool:
    """Whether `threads` more busy threads stay within the CPUs and CPU_OVERCOMMIT (as `decide` checks)."""
    busy = sum(r.threads for r in running)
    return cpus is None or busy + threads <= max(1.0, cpus * CPU_OVERCOMMIT)


@dataclass(frozen=True, kw_only=True)
class Start:
    """A compile a dispatch round starts: for its front end (`front_bytes`, its peak granted when it rises),
    else for its peak; `decision.line_bytes` is the line it starts with."""

    waiting: Waiting
    decision: Decision
    front_bytes: int | None


@dataclass(frozen=True, kw_only=True)
class Round:
    """What one dispatch round decided: the compiles it starts, in order, each with the lines it sets on the
    compiles it starts beside (`Decision.lines`: they apply before it starts); those left waiting, and why
    the first of them waits."""

    starts: tuple[Start, ...]
    left: tuple[Waiting, ...]
    why: Decision | None


def with_line(r: Running, line_bytes: int) -> Running:
    """A running compile given a line (`metered`), as `running` sees one with that line: from its front end
    it may grow to its line without asking, else it holds at most its line."""
    reserved = line_bytes if r.front_bytes is not None else min(r.reserved_bytes, line_bytes)
    return replace(r, reserved_bytes=reserved, line_bytes=line_bytes)


def dispatch(
    waiting: Sequence[Waiting],
    *,
    limit_bytes: int,
    headroom_bytes: int,
    used_bytes: int,
    running: Sequence[Running],
    cpus: float | None = None,
    two_stage: bool = True,
    measured: bool = True,
) -> Round:
    """One round of the build's dispatcher: start every waiting compile that may start now, in priority order
    (`choose`). Each start's lines apply to the compiles it was started beside before the next choice, and
    it runs beside the next as a compile that has just started: nothing seen of it yet, and the cgroup's
    usage (`used_bytes`, read once for the round) holds nothing of it. The nvcc wrapper's dispatcher
    (`gate.Admission.dispatch`) and the build simulator (`factory.memory.simulate`) both run this."""
    view = list(running)
    left = list(waiting)
    starts: list[Start] = []
    decision: Decision | None = None
    while left:
        chosen, decision = choose(
            left,
            limit_bytes=limit_bytes,
            headroom_bytes=headroom_bytes,
            used_bytes=used_bytes,
            running=view,
            cpus=cpus,
            two_stage=two_stage,
            measured=measured,
        )
        if chosen is None or decision is None:
            break
        for pid, line in decision.lines:
            view = [with_line(r, line) if r.pid == pid else r for r in view]
        left.remove(chosen)
        front = front_bytes(chosen.prediction) if two_stage else None
        starts.append(Start(waiting=chosen, decision=decision, front_bytes=front))
        view.append(
            _running(
                chosen.pid,
                chosen.prediction,
                elapsed_s=0.0,
                seen_bytes=0,
                rss_bytes=0,
                threads=chosen.threads,
                waves=chosen.waves,
                front_bytes=front,
                line_bytes=decision.line_bytes,
            )
        )
    return Round(starts=tuple(starts), left=tuple(left), why=decision if left else None)


def grant_peak(
    own: Running,
    *,
    limit_bytes: int,
    headroom_bytes: int,
    used_bytes: int,
    others: Sequence[Running],
    threads: int,
    cpus: float | None = None,
) -> Decision:
    """Whether a compile stopped at its rise may go on to its peak: when it fits beside what the others hold,
    or when every other compile is stopped too (`next_of_the_stopped`: one of them must go on). A compile
    with a line (`metered`) rising from its front end goes on up to its line: the lines were made to fit;
    once past its line it needs its peak."""
    if own.line_bytes is not None and own.rss_bytes <= own.line_bytes:
        return Decision(True, "within its line", 0, limit_bytes - headroom_bytes, line_bytes=own.line_bytes)
    if others and all(o.paused for o in others):
        untracked = max(0, used_bytes - own.rss_bytes - sum(o.rss_bytes for o in others))
        capacity = max(0, limit_bytes - headroom_bytes)
        if next_of_the_stopped([own, *others], untracked_bytes=untracked, capacity_bytes=capacity) == own.pid:
            return Decision(True, "every other compile waits", 0, capacity)
        return Decision(False, "another stopped compile goes on first", 0, capacity)
    if not others:
        return Decision(True, "nothing else runs", 0, limit_bytes - headroom_bytes)
    return decide(
        limit_bytes=limit_bytes,
        headroom_bytes=headroom_bytes,
        used_bytes=used_bytes - own.rss_bytes,
        running=others,
        prediction_bytes=max(own.peak_bytes, own.rss_bytes),
        threads=threads,
        cpus=cpus,
    )


def next_of_the_stopped(stopped: Sequence[Running], *, untracked_bytes: int, capacity_bytes: int) -> int:
    """Which of the compiles all stopped at their rises goes on: the first (by pid, so that every wrapper
    picks the same one) whose peak fits beside what the others hold now; when none does, the one that needs
    least above what it holds. Granting each its peak because the others wait would let two climb together
    (two memext heavy TUs, one stopped at its line and one at its rise, were both let go and OOM-killed)."""
    held = sum(r.rss_bytes for r in stopped)

    def fits(r: Running) -> bool:
        return untracked_bytes + held - r.rss_bytes + max(r.peak_bytes, r.rss_bytes) <= capacity_bytes

    ordered = sorted(stopped, key=lambda r: r.pid)
    fitting = [r for r in ordered if fits(r)]
    if fitting:
        return fitting[0].pid
    return min(ordered, key=lambda r: (r.peak_bytes - r.rss_bytes, r.pid)).pid


# A compile whose course starts this far below its peak is admitted in two stages: its front end (nvcc's
# preprocessing, cicc's parsing) when that fits, its peak when it rises; the wrapper stops it at its rise
# until its peak is granted.
FRONT_FRACTION = 0.5
# The peaks booked by running compiles (granted or not) may exceed the capacity by this factor: a compile
# whose peak comes before another's has passed waits stopped, holding its front end. Measured on the model
# and the memext fixture: 1.25 -> 363 s and 98 s, 1.5 -> 352 s and 106 s, 3.0 -> 345 s and 106 s.
OVERBOOK = 1.25


# A compile admitted for its front end rises (asks for its peak, `rises`) once its RSS passes its profiled
# front end by this factor, not at the first byte above it. The same file's front end holds more in one build
# than in another: a memext medium TU held 0.18 GB before its climb in one build and 0.24 GB minutes later.
# Asking for its peak then, it was granted at once and booked it for the rest of its run, beside a heavy TU
# whose rise came next: the heavy one waited 4.5 s stopped, its build took 41.9 s against 36.6 s replayed
# (`make bench-memory`, run 11). Replays of the fixture's 20 measured builds, each with every other one's
# profile (380 pairs): worst 1.268x the bound at 1.0, 1.241x at 1.2, 1.069x at 1.3-1.5 (each with its own
# profile: at most 1.069x). The flash-attn model's profiled build at 432 GiB / 128 cores moves by seconds with
# any change: 320.0 s at 1.0, 326.4 s at 1.3 (over its 1.10x target), 321.2 s at 1.4, 322.0 s at 1.5. No OOM
# kill at any host.
FRONT_SLACK = 1.4


def rises(front: int, rss: int) -> bool:
    """Whether a compile admitted for its `front` end is rising to its peak, holding `rss` now."""
    return rss > front * FRONT_SLACK


def front_bytes(prediction: Prediction) -> int | None:
    """What a compile holds before its rise (the highest point of its rise below FRONT_FRACTION of its
    peak), for two-stage admission; None for a compile without a profiled course or one that rises at once."""
    below = [v for v in prediction.rise if 0 < v <= FRONT_FRACTION * prediction.peak_bytes]
    if not prediction.rise or not below or prediction.rise[0] != below[0]:
        return None
    return max(below)


def priority(predicted_s: float | None, ticket: int) -> tuple[float, int]:
    """Order of waiters: longest predicted compile first (shortens the tail), ninja's order among unknowns."""
    return (-(predicted_s or 0.0), ticket)


@dataclass(frozen=True)
class Prediction:
    """What a compile is expected to take: its peak, and from a profile its time and RSS envelope."""

    peak_bytes: int
    wall_s: float | None = None
    envelope: tuple[int, ...] = ()
    # from the recipe's estimate and the time course of measured siblings, not from this file's own profile
    inferred: bool = False
    # the most it holds by the end of each of RISE_POINTS parts of its time (`admission.rise`)
    rise: tuple[int, ...] = ()
    # for a compile not profiled itself: the recipe's `compile_after_peak` (`past_peak_bytes`)
    after_peak: float | None = None
    # for a compile not profiled itself: its file's time by the recipe's `compile_seconds_by_file`, in this
    # build's seconds once a file of that table was measured (`order_seconds`); it only orders waiters
    order_s: float | None = None

    @property
    def rank_s(self) -> float | None:
        """How long it is expected to take, for the order of waiters: its own profile's time, else the
        recipe's time of its file, else its measured siblings' time."""
        return self.order_s if self.order_s is not None else self.wall_s


def file_value(source: str, by_file: Sequence[tuple[str, _V]]) -> _V | None:
    """The value of one source file (a path or a profile key) in a recipe's per-file table: the first glob
    pattern matching its base name; None when none does."""
    name = os.path.basename(source.partition("|")[0])
    index = _first_match(name, tuple(pattern for pattern, _ in by_file))
    return None if index is None else by_file[index][1]


@functools.lru_cache(maxsize=4096)
def _first_match(name: str, patterns: tuple[str, ...]) -> int | None:
    # cached: the same files are looked up for every waiting compile at every prediction (`order_seconds`)
    for i, pattern in enumerate(patterns):
        if fnmatch.fnmatchcase(name, pattern):
            return i
    return None


def file_per_arch_bytes(source: str, by_file: Sequence[tuple[str, int]], default_bytes: int) -> int:
    """The recipe's per-arch estimate of one source file: its entry in `by_file`, else `default_bytes`."""
    value = file_value(source, by_file)
    return default_bytes if value is None else value


def compile_estimate(
    source: str,
    *,
    per_arch_bytes: int,
    archs: int,
    nvcc_threads: int,
    base_bytes: int = DEFAULT_BASE_BYTES,
    by_file: Sequence[tuple[str, int]] = (),
) -> int:
    """Peak of one unprofiled nvcc call of `source` by the recipe: its per-file estimate, else
    `per_arch_bytes`."""
    return per_compile_estimate(
        per_arch_bytes=file_per_arch_bytes(source, by_file, per_arch_bytes),
        archs=archs,
        nvcc_threads=nvcc_threads,
        base_bytes=base_bytes,
    )


def raised_by_file(
    by_file: Sequence[tuple[str, float]], *, per_arch_bytes: int, fallback_bytes: int, unit: int = 1
) -> tuple[tuple[str, int], ...]:
    """The per-file table in bytes (`unit`: bytes per table unit, GIB for a recipe's GiB), raised by the
    factor the plan's per-arch figure has over the recipe's fallback: a learned peak or an OOM retry showed
    the recipe's figures too low, and the files behind that need not be profiled yet."""
    factor = max(1.0, per_arch_bytes / fallback_bytes) if fallback_bytes > 0 else 1.0
    return tuple((pattern, math.ceil(round(value * unit * factor, 3))) for pattern, value in by_file)


def predict(
    entries: Mapping[str, Mapping[str, Any]],
    key: str,
    *,
    per_arch_bytes: int,
    archs: int,
    nvcc_threads: int,
    base_bytes: int = DEFAULT_BASE_BYTES,
    by_file: Sequence[tuple[str, int]] = (),
    after_peak: float | None = None,
    seconds_by_file: Sequence[tuple[str, float]] = (),
) -> Prediction:
    """The learned profile entry of a compile, else the recipe's estimate for its file (`by_file`, else
    `per_arch_bytes`), shaped by measured siblings."""
    estimate = compile_estimate(
        key,
        per_arch_bytes=per_arch_bytes,
        archs=archs,
        nvcc_threads=nvcc_threads,
        base_bytes=base_bytes,
        by_file=by_file,
    )
    return predict_from(
        entries, key, estimate_bytes=estimate, after_peak=after_peak, seconds_by_file=seconds_by_file
    )


def predict_from(
    entries: Mapping[str, Mapping[str, Any]],
    key: str,
    *,
    estimate_bytes: int,
    after_peak: float | None = None,
    seconds_by_file: Sequence[tuple[str, float]] = (),
) -> Prediction:
    """`predict` once the estimate of an unmeasured compile is known; `entries` may hold this build's own
    measurements, so the predictions of files still waiting tighten as their siblings finish. `after_peak`
    (the recipe's `compile_after_peak`) and the file's time by `seconds_by_file` (`order_seconds`) go with
    every prediction but one from the file's own profile."""
    entry = entries.get(key)
    if entry is not None and entry.get("peak_bytes"):
        wall = entry.get("wall_s")
        if not wall:
            # only ever seen killed: its peak is a lower bound, never below the estimate
            return Prediction(
                peak_bytes=max(int(entry["peak_bytes"]), estimate_bytes),
                after_peak=after_peak,
                order_s=order_seconds(entries, key, seconds_by_file),
            )
        return Prediction(
            peak_bytes=with_margin(int(entry["peak_bytes"])),
            wall_s=float(wall),
            envelope=tuple(with_margin(int(v)) for v in entry.get("envelope") or ()),
            rise=tuple(with_margin(int(v)) for v in entry.get("rise") or ()),
        )
    return replace(
        from_siblings(entries, key, estimate_bytes=estimate_bytes),
        after_peak=after_peak,
        order_s=order_seconds(entries, key, seconds_by_file),
    )


def order_seconds(
    entries: Mapping[str, Mapping[str, Any]], key: str, seconds_by_file: Sequence[tuple[str, float]]
) -> float | None:
    """The recipe's time of a file (`compile_seconds_by_file`, seconds of one arch on the machine that
    measured them), in this build's seconds: scaled by the median ratio of measured time to table time over
    the measured compiles of the same arch set and nvcc threads. Before any was measured the table's own
    figures order the waiters, all in one unit. None for a file the table does not name."""
    own = file_value(key, seconds_by_file)
    if own is None:
        return None
    group = key.partition("|")[2]
    ratios = sorted(
        float(e["wall_s"]) / table_s
        for k, e in entries.items()
        if k.partition("|")[2] == group
        and e.get("wall_s")
        and (table_s := file_value(k, seconds_by_file)) is not None
    )
    if not ratios:
        return float(own)
    return own * ratios[len(ratios) // 2]


# A profile is kept per package version, not per torch version or host compiler, and its peaks are sampled
# (every 0.2 s): the same file measured 6.34 GiB with torch 2.13's headers and 6.64 GiB with 2.14's. Dozens
# of compiles at their peaks together share one headroom, so each profiled peak carries this margin.
PROFILE_MARGIN = 1.1


def with_margin(n: int) -> int:
    return math.ceil(round(n * PROFILE_MARGIN, 3))


# An unmeasured file may take longer than its measured siblings (a larger template instance). Its predicted
# time, which decides when its reservation may drop below the peak, is the longest sibling's times this;
# PROGRESS_SLACK already covers a file up to 1.25x longer, and one still at its peak is counted at its RSS.
SIBLING_TIME_MARGIN = 1.0


def family(key: str) -> str:
    """Files that differ only in numbers (head dimension, arch, tile size) are one family; so are the arch
    set and nvcc threads, which shape the compile."""
    name, _, rest = key.partition("|")
    return f"{re.sub(r'[0-9]+', '#', name)}|{rest}"


def from_siblings(entries: Mapping[str, Mapping[str, Any]], key: str, *, estimate_bytes: int) -> Prediction:
    """An unmeasured compile: the estimate as its peak (measured siblings never lower it: a larger file of the
    family may peak higher than any seen), but the time course of its siblings (same arch set and nvcc
    threads; only those of its own family when any was measured), so that its reservation drops once its
    peak is behind it, as a profiled compile's does.
    """
    group = key.partition("|")[2]
    measured = [
        (k, e)
        for k, e in entries.items()
        if k.partition("|")[2] == group and e.get("wall_s") and e.get("peak_bytes") and e.get("envelope")
    ]
    if not measured:
        return Prediction(peak_bytes=estimate_bytes)
    mine = family(key)
    # its own family's courses when any was measured: a light file's peak is nvcc's front end, early, and
    # taken with a heavy file's course it would put the heavy one's front end, where it may start and where
    # it is stopped at its rise, below that front end
    kin = [e for k, e in measured if family(k) == mine] or [e for _, e in measured]
    walls = [float(e["wall_s"]) for e in kin]
    shape, rising = _sibling_shapes(kin)
    if not any(shape):
        return Prediction(peak_bytes=estimate_bytes)

    def scaled(fractions: Sequence[float]) -> tuple[int, ...]:
        return tuple(min(estimate_bytes, math.ceil(estimate_bytes * f)) for f in fractions)

    return Prediction(
        peak_bytes=estimate_bytes,
        wall_s=max(walls) * SIBLING_TIME_MARGIN,
        envelope=scaled(shape),
        inferred=True,
        rise=scaled(rising) if any(rising) else (),
    )


# The last siblings' shapes and the courses they were made of (held, so that their ids stay theirs): every
# waiting compile of a group has the same siblings, and a dispatching wrapper predicts all of them (288 in a
# flash-attn first build, ~7 ms each without this) after each compile that ends.
_last_shapes: list[Any] = [(), [], ([], [])]


def _sibling_shapes(measured: Sequence[Mapping[str, Any]]) -> tuple[list[float], list[float]]:
    """The envelope and rise shapes of these siblings (`_shape`); the rise only counts when every sibling has
    one: its first point is the front end a compile may start with."""
    courses = [(e.get("envelope"), e.get("rise")) for e in measured]
    ids = tuple((id(envelope), id(rise)) for envelope, rise in courses)
    if ids != _last_shapes[0]:
        shape = _shape((envelope for envelope, _ in courses), ENVELOPE_POINTS)
        rises = [rise for _, rise in courses]
        rising = _shape(rises, RISE_POINTS, rising=True) if all(rises) else []
        _last_shapes[:] = [ids, courses, (shape, rising)]
    shapes: tuple[list[float], list[float]] = _last_shapes[2]
    return shapes


def _shape(courses: Iterable[Any], points: int, *, rising: bool = False) -> list[float]:
    """The most, at each point, of several courses each scaled to its own peak (1.0); a course of another
    resolution (a profile written by another version) is resampled to `points`."""
    shape = [0.0] * points
    for course in courses:
        values = [int(v) for v in course or ()]
        top = max(values, default=0)
        if top <= 0:
            continue
        for i, v in enumerate(resample(values, points, rising=rising)):
            shape[i] = max(shape[i], v / top)
    return shape


def resample(values: Sequence[int], points: int, *, rising: bool = False) -> list[int]:
    """An envelope (`rising`: a rise) at another resolution, still an upper bound of the course: point k of
    an envelope holds from its start to the end, so it takes the coarse point it starts in; point k of a rise
    holds up to its end, so it takes the coarse point it ends in."""
    n = len(values)
    if n == points:
        return list(values)
    if rising:
        return [values[min(n - 1, math.ceil((k + 1) * n / points) - 1)] for k in range(points)]
    return [values[k * n // points] for k in range(points)]


# Points of a profiled course (its envelope and its rise), each a fraction of its time: a compile's
# reservation falls by the envelope's steps, and a 200 s compile's peak passes within a few seconds, so
# coarse steps hold memory long after the peak. Measured on the flash-attn model (profiled build, 432 GiB /
# 128 cores; envelope/rise points): 10/20 -> 330 s, 20/20 328, 40/40 316, 60/60 325, 80/80 320, 160/160 320;
# at 128 GiB / 64 cores 920 -> 806 s. The wrapper samples every 0.2 s, finer than a point of any compile that
# matters.
ENVELOPE_POINTS = 80
# A compile may run slower than when it was measured; assuming less progress than the clock says keeps its
# reservation at the larger, earlier part of its envelope.
PROGRESS_SLACK = 1.25
# A compile whose RSS was already seen this close to its predicted peak (which carries PROFILE_MARGIN) has
# had its peak: the clock may then be read without slack (a slower compile still at its peak is counted at its
# RSS, which `decide` takes when larger).
PEAK_SEEN_FRACTION = 0.85


RISE_POINTS = 80


def _point(t: float, wall_s: float, points: int) -> int:
    """The part of a compile's time, of `points` equal ones, that a sample at `t` s falls in."""
    return min(points - 1, int(points * t / wall_s)) if wall_s > 0 else 0


def rise(samples: Sequence[tuple[float, int]], wall_s: float) -> tuple[int, ...]:
    """Point k: the most RSS seen from the compile's start to the end of the (k+1)-th of RISE_POINTS parts of
    its time (non-decreasing). Points before the first sample (a short compile's first parts are shorter
    than the sampling step) take that sample: 0 would read as a front end of nothing."""
    points = [0] * RISE_POINTS
    for t, rss in samples:
        k = _point(t, wall_s, RISE_POINTS)
        points[k] = max(points[k], rss)
    if samples:
        t, rss = min(samples)
        for k in range(_point(t, wall_s, RISE_POINTS)):
            points[k] = rss
    for k in range(1, RISE_POINTS):
        points[k] = max(points[k], points[k - 1])
    return tuple(points)


def envelope(samples: Sequence[tuple[float, int]], wall_s: float) -> tuple[int, ...]:
    """Point k: the most RSS seen from k/N of the compile's time to its end (non-increasing). Points after
    the last sample take that sample: the compile held memory until it ended, not nothing."""
    points = [0] * ENVELOPE_POINTS
    for t, rss in samples:
        k = _point(t, wall_s, ENVELOPE_POINTS)
        points[k] = max(points[k], rss)
    if samples:
        t, rss = max(samples)
        for k in range(_point(t, wall_s, ENVELOPE_POINTS) + 1, ENVELOPE_POINTS):
            points[k] = rss
    for k in range(ENVELOPE_POINTS - 2, -1, -1):
        points[k] = max(points[k], points[k + 1])
    return tuple(points)


# An inferred compile's RSS must have fallen this far below the most it was seen at before that most is
# taken as its peak: a compile still before its peak (slower than its siblings) has not fallen at all.
PAST_PEAK_DROP = 0.75


def reservation(
    prediction: Prediction,
    elapsed_s: float,
    seen_bytes: int = 0,
    rss_bytes: int | None = None,
    *,
    waves: int = 1,
) -> int:
    """Memory a running compile may still claim: its peak, or once profiled, what is left of its envelope.

    Compiles peak early (cicc's optimizer) and then hold far less (ptxas, fatbinary), so a profiled compile
    stops holding its peak once it is past it. `seen_bytes` is the most RSS seen of this run so far: once a
    compile of one wave of archs (`waves`: ceil(archs / nvcc threads)) reached its predicted peak, that peak
    is behind it (or now), and the clock is trusted as it is; with several waves the seen peak may be an
    earlier one. `rss_bytes` is its RSS now.
    """
    past = past_peak_bytes(prediction, seen_bytes, rss_bytes, waves=waves)
    if not prediction.envelope or not prediction.wall_s:
        return prediction.peak_bytes if past is None else min(prediction.peak_bytes, past)
    seen_peak = seen_bytes >= PEAK_SEEN_FRACTION * prediction.peak_bytes
    if not (seen_peak or fell_from_peak(prediction, seen_bytes, rss_bytes)):
        # Not seen near its peak: however late the clock says it is, its peak may be ahead. A compile runs
        # slower than its profile or its siblings when it shares the cores or was stopped at its rise, and
        # one whose peak comes last (memext's heavy TUs: ptxas after a long front end) would otherwise have
        # its reservation fall to its envelope's tail just before it climbs.
        return prediction.peak_bytes if past is None else min(prediction.peak_bytes, past)
    slack = 1.0 if seen_peak and waves <= 1 else PROGRESS_SLACK
    progress = elapsed_s / (prediction.wall_s * slack)
    k = min(len(prediction.envelope) - 1, int(len(prediction.envelope) * progress))
    if rss_bytes:
        # a compile holding more than its envelope leaves by the clock is behind its clock (a slower
        # machine, a phase that took longer): it is at most as far as the last point that still holds this
        k = min(k, max(0, behind(prediction.envelope, rss_bytes)))
    left = prediction.envelope[k]
    if left < prediction.peak_bytes and fell_from_peak(prediction, seen_bytes, rss_bytes):
        # past its peak by the clock and by its own RSS: the estimate was for the worst file of the recipe,
        # this one's peak is what it was seen at, and the rest of its course scales with it
        left = min(left, math.ceil(left * seen_bytes / prediction.peak_bytes))
    return left if past is None else min(left, past)


def fell_from_peak(prediction: Prediction, seen_bytes: int, rss_bytes: int | None) -> bool:
    """Whether a compile whose peak is an estimate (`inferred`) shows that its own peak is behind it: it was
    seen at FRONT_FRACTION of the estimate or more (nvcc's front end, which comes and goes before cicc,
    holds less) and has since fallen to PAST_PEAK_DROP of that."""
    return (
        prediction.inferred
        and rss_bytes is not None
        and seen_bytes >= FRONT_FRACTION * prediction.peak_bytes
        and 0 < rss_bytes <= PAST_PEAK_DROP * seen_bytes
    )


def behind(envelope: Sequence[int], rss_bytes: int) -> int:
    """The last point of a (non-increasing) envelope that holds at least `rss_bytes`; -1 when none does."""
    return bisect.bisect_right(envelope, -rss_bytes, key=operator.neg) - 1


def past_peak_bytes(
    prediction: Prediction, seen_bytes: int, rss_bytes: int | None, *, waves: int = 1
) -> int | None:
    """What a compile without its own profile may still hold once its peak is behind it, by the recipe's
    `compile_after_peak` (`Prediction.after_peak`); None while that is not known.

    Its peak is behind it when it reached its predicted peak (PEAK_SEEN_FRACTION of it) and has since fallen
    to PAST_PEAK_DROP of the most it was seen at; with several waves of archs the seen peak may be an earlier
    wave's. A compile that rises again is counted at its RSS, which `decide` takes when larger.
    """
    if (
        prediction.after_peak is None
        or waves > 1
        or rss_bytes is None
        or seen_bytes < PEAK_SEEN_FRACTION * prediction.peak_bytes
        or not 0 < rss_bytes <= PAST_PEAK_DROP * seen_bytes
    ):
        return None
    return math.ceil(prediction.after_peak * seen_bytes)
