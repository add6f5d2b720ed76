"""The admission decision for one nvcc compile: the single implementation used by the wrapper and the
simulator.

Standard library only: this file is copied into build containers next to the nvcc wrapper, whose Python may
not
have the factory installed.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

GIB = 1 << 30
MIB = 1 << 20

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
    # what it was admitted with and how far it is, so that `decide` can see its reservation fall later
    prediction: Prediction | None = None
    elapsed_s: float = 0.0
    seen_bytes: int = 0
    waves: int = 1

    def reserved_after(self, seconds: float) -> int:
        """Its reservation `seconds` from now (never more than now: envelopes only fall)."""
        if seconds <= 0 or self.prediction is None:
            return self.reserved_bytes
        # later is read on the slow clock even past its peak: a compile slower than its profile (a longer
        # file than its siblings, a busier machine) still holds its peak then, and `decide` cannot see it
        # yet (trusting the clock here got the model OOM-killed on a machine 15% slower than its profile)
        later = reservation(
            self.prediction,
            self.elapsed_s + seconds,
            self.seen_bytes,
            self.rss_bytes,
            waves=self.waves,
            trust_clock=False,
        )
        return min(self.reserved_bytes, later)


@dataclass(frozen=True)
class Decision:
    admit: bool
    reason: str
    committed_bytes: int
    capacity_bytes: int


def default_headroom(limit_bytes: int) -> int:
    """Memory kept free for the link step, setup.py's Python and ninja: 1/16 of the limit, 256 MiB to 2
    GiB."""
    return max(256 * MIB, min(2 * GIB, limit_bytes // 16))


def per_compile_estimate(*, per_arch_bytes: int, archs: int, nvcc_threads: int, base_bytes: int) -> int:
    """Peak of one nvcc call: each nvcc thread runs one cicc/ptxas for one arch at a time."""
    return max(1, min(max(1, nvcc_threads), max(1, archs))) * per_arch_bytes + base_bytes


def decide(
    *,
    limit_bytes: int,
    headroom_bytes: int,
    used_bytes: int,
    running: Sequence[Running],
    prediction_bytes: int,
    threads: int = 1,
    cpus: float | None = None,
    steps: Sequence[tuple[float, int]] = (),
) -> Decision:
    """Whether a compile predicted to peak at `prediction_bytes` may start now.

    `used_bytes` is the cgroup's working set, which already holds the running compiles' current RSS; each
    running compile is counted at the larger of its reservation and its RSS, the rest of the usage as
    untracked.
    `steps` is the candidate's demand over time (`timeline`, default: `prediction_bytes` from the start): a
    compile spends its first seconds in nvcc's front end far below its peak, so it may start while the
    running compiles' reservations are still too high for its peak, when their envelopes say they will have
    fallen by the time its peak comes.
    """
    capacity = max(0, limit_bytes - headroom_bytes)
    tracked_rss = sum(r.rss_bytes for r in running)
    untracked = max(0, used_bytes - tracked_rss)
    committed = untracked + sum(max(r.reserved_bytes, r.rss_bytes) for r in running)

    def verdict(admit: bool, reason: str) -> Decision:
        return Decision(admit=admit, reason=reason, committed_bytes=committed, capacity_bytes=capacity)

    if not running:
        return verdict(True, "nothing else runs")
    if cpus is not None:
        busy = sum(r.threads for r in running)
        if busy + threads > max(1.0, cpus):
            return verdict(False, f"cpu: {busy}+{threads} threads > {cpus:g}")
    steps = list(steps) or [(0.0, prediction_bytes)]

    def held(r: Running, at: float) -> int:
        # a compile above its reservation is behind its course: it is not trusted to fall
        return r.rss_bytes if r.rss_bytes > r.reserved_bytes else r.reserved_after(at)

    need = max(untracked + sum(held(r, at) for r in running) + demand for at, demand in steps)
    if need > capacity:
        return verdict(False, f"memory: {need / GIB:.2f} GiB > {capacity / GIB:.2f} GiB")
    return verdict(True, "fits" if len(steps) == 1 else "fits as the running compiles' peaks pass")


@dataclass(frozen=True)
class Waiting:
    """A compile waiting for admission: `key` names it (a wrapper's pid, a simulated task)."""

    key: str
    prediction: Prediction
    threads: int
    ticket: int  # arrival order


def choose(
    waiting: Sequence[Waiting],
    *,
    limit_bytes: int,
    headroom_bytes: int,
    used_bytes: int,
    running: Sequence[Running],
    cpus: float | None = None,
    use_rise: bool = True,
) -> tuple[Waiting | None, Decision | None]:
    """The compile to start now: the first waiter in priority order that `decide` admits, with its decision;
    else None and the decision of the first in order (why it waits).

    Greedy in priority order: a higher-priority compile that does not fit yet does not hold back one that
    does (measured: holding memory for it, with backfilling for compiles of known time, was slower in every
    configuration of the flash-attn model, cold builds most, as an unprofiled compile never backfills).
    """
    first: Decision | None = None
    for w in sorted(waiting, key=lambda w: priority(w.prediction.wall_s, w.ticket)):
        d = decide(
            limit_bytes=limit_bytes,
            headroom_bytes=headroom_bytes,
            used_bytes=used_bytes,
            running=running,
            prediction_bytes=w.prediction.peak_bytes,
            threads=w.threads,
            cpus=cpus,
            steps=timeline(w.prediction) if use_rise else (),
        )
        if d.admit:
            return w, d
        first = first or d
    return None, first


# A compile may run faster than when it was measured (less load on the machine): its rise is read on a clock
# this much faster, so its peak is never expected later than it can come.
EARLY_SLACK = 0.8


def timeline(prediction: Prediction) -> list[tuple[float, int]]:
    """(seconds from its start, the most it may hold from then on until its peak): a compile's demand as
    steps, its rise read on the early clock; without a rise, its peak from the start."""
    peak = prediction.peak_bytes
    if not prediction.rise or not prediction.rise_s or max(prediction.rise) <= 0:
        return [(0.0, peak)]
    tick = prediction.rise_s * EARLY_SLACK / len(prediction.rise)
    steps: list[tuple[float, int]] = []
    for k, value in enumerate(prediction.rise):
        top = max(min(int(value), peak), steps[-1][1] if steps else 0)
        if not steps or top > steps[-1][1]:
            steps.append((k * tick, top))
    if steps[-1][1] < peak:
        steps.append((len(prediction.rise) * tick, peak))
    return steps


def priority(predicted_s: float | None, ticket: int) -> tuple[float, int]:
    """Order of waiters: longest predicted compile first (shortens the tail), arrival order among unknowns."""
    return (-(predicted_s or 0.0), ticket)


def profile_key(source: str, archs: Sequence[str], nvcc_threads: int) -> str:
    """Key of a measured compile: paths differ between builds, so only the file name counts."""
    return f"{os.path.basename(source)}|{','.join(sorted(archs))}|{nvcc_threads}"


@dataclass(frozen=True)
class Prediction:
    """What a compile is expected to take: its peak, and from a profile its time and RSS envelope."""

    peak_bytes: int
    wall_s: float | None = None
    envelope: tuple[int, ...] = ()
    # from the recipe's estimate and the time course of measured siblings, not from this file's own profile
    inferred: bool = False
    # the most it holds by the end of each tenth of `rise_s` seconds from its start (`admission.rise`)
    rise: tuple[int, ...] = ()
    rise_s: float | None = None


def file_per_arch_bytes(source: str, by_file: Sequence[tuple[str, int]], default_bytes: int) -> int:
    """The recipe's per-arch estimate of one source file (a path or a profile key): the first glob pattern
    of `by_file` matching its base name, else `default_bytes`."""
    name = os.path.basename(source.partition("|")[0])
    for pattern, value in by_file:
        if fnmatch.fnmatchcase(name, pattern):
            return value
    return default_bytes


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


def parse_by_file(text: str | None) -> tuple[tuple[str, int], ...]:
    """FACTORY_EST_BY_FILE (a JSON list of [pattern, bytes]); anything malformed is dropped, so a bad value
    falls back to the per-arch estimate instead of breaking every compile of the build."""
    if not text:
        return ()
    try:
        value = json.loads(text)
    except ValueError:
        return ()
    if not isinstance(value, list):
        return ()
    table: list[tuple[str, int]] = []
    for item in value:
        if (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], int | float)
            and not isinstance(item[1], bool)
            and item[1] > 0
        ):
            table.append((item[0], int(item[1])))
    return tuple(table)


def predict(
    entries: Mapping[str, Mapping[str, Any]],
    key: str,
    *,
    per_arch_bytes: int,
    archs: int,
    nvcc_threads: int,
    base_bytes: int = DEFAULT_BASE_BYTES,
    by_file: Sequence[tuple[str, int]] = (),
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
    return predict_from(entries, key, estimate_bytes=estimate)


def predict_from(entries: Mapping[str, Mapping[str, Any]], key: str, *, estimate_bytes: int) -> Prediction:
    """`predict` once the estimate of an unmeasured compile is known; `entries` may hold this build's own
    measurements, so the predictions of files still waiting tighten as their siblings finish."""
    entry = entries.get(key)
    if entry is not None and entry.get("peak_bytes"):
        wall = entry.get("wall_s")
        if not wall:
            # only ever seen killed: its peak is a lower bound, never below the estimate
            return Prediction(peak_bytes=max(int(entry["peak_bytes"]), estimate_bytes))
        return Prediction(
            peak_bytes=with_margin(int(entry["peak_bytes"])),
            wall_s=float(wall),
            envelope=tuple(with_margin(int(v)) for v in entry.get("envelope") or ()),
            rise=tuple(with_margin(int(v)) for v in entry.get("rise") or ()),
            rise_s=float(wall) if entry.get("rise") else None,
        )
    return from_siblings(entries, key, estimate_bytes=estimate_bytes)


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
    threads; of its own family when any was measured), so that its reservation drops once its peak is
    behind it, as a profiled compile's does.
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
    walls = [float(e["wall_s"]) for k, e in measured if family(k) == mine] or [
        float(e["wall_s"]) for _, e in measured
    ]
    shape = _shape((e.get("envelope") for _, e in measured), ENVELOPE_POINTS)
    if not any(shape):
        return Prediction(peak_bytes=estimate_bytes)
    # the rise only counts when every sibling has one: it is read as the earliest each level may come
    rises = [e.get("rise") for _, e in measured]
    rising = _shape(rises, RISE_POINTS) if all(rises) else []

    def scaled(fractions: Sequence[float]) -> tuple[int, ...]:
        return tuple(min(estimate_bytes, math.ceil(estimate_bytes * f)) for f in fractions)

    return Prediction(
        peak_bytes=estimate_bytes,
        wall_s=max(walls) * SIBLING_TIME_MARGIN,
        envelope=scaled(shape),
        inferred=True,
        rise=scaled(rising) if any(rising) else (),
        # a smaller file of the family may be faster than any sibling: the earliest its peak can come
        rise_s=min(walls) if any(rising) else None,
    )


def _shape(courses: Iterable[Any], points: int) -> list[float]:
    """The most, at each point, of several courses each scaled to its own peak (1.0)."""
    shape = [0.0] * points
    for course in courses:
        values = [int(v) for v in course or ()]
        if len(values) != points or max(values) <= 0:
            continue
        for i, v in enumerate(values):
            shape[i] = max(shape[i], v / max(values))
    return shape


ENVELOPE_POINTS = 10
# A compile may run slower than when it was measured; assuming less progress than the clock says keeps its
# reservation at the larger, earlier part of its envelope.
PROGRESS_SLACK = 1.25
# A compile whose RSS was already seen this close to its predicted peak (which carries PROFILE_MARGIN) has
# had its peak: the clock may then be read without slack (a slower compile still at its peak is counted at its
# RSS, which `decide` takes when larger).
PEAK_SEEN_FRACTION = 0.85


# The rise is finer than the envelope: what it buys is the front end, a few percent of a compile's time.
RISE_POINTS = 20


def rise(samples: Sequence[tuple[float, int]], wall_s: float) -> tuple[int, ...]:
    """Point k: the most RSS seen from the compile's start to the end of the (k+1)-th twentieth of its time
    (non-decreasing)."""
    points = [0] * RISE_POINTS
    for t, rss in samples:
        k = min(RISE_POINTS - 1, int(RISE_POINTS * t / wall_s)) if wall_s > 0 else 0
        points[k] = max(points[k], rss)
    for k in range(1, RISE_POINTS):
        points[k] = max(points[k], points[k - 1])
    return tuple(points)


def envelope(samples: Sequence[tuple[float, int]], wall_s: float) -> tuple[int, ...]:
    """Point k: the most RSS seen from k/N of the compile's time to its end (non-increasing)."""
    points = [0] * ENVELOPE_POINTS
    for t, rss in samples:
        k = min(ENVELOPE_POINTS - 1, int(ENVELOPE_POINTS * t / wall_s)) if wall_s > 0 else 0
        points[k] = max(points[k], rss)
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
    trust_clock: bool = True,
) -> int:
    """Memory a running compile may still claim: its peak, or once profiled, what is left of its envelope.

    Compiles peak early (cicc's optimizer) and then hold far less (ptxas, fatbinary), so a profiled compile
    stops holding its peak once it is past it. `seen_bytes` is the most RSS seen of this run so far: once a
    compile of one wave of archs (`waves`: ceil(archs / nvcc threads)) reached its predicted peak, that peak
    is behind it (or now), and the clock is trusted as it is; with several waves the seen peak may be an
    earlier one. `rss_bytes` is its RSS now. Without `trust_clock` the slack always applies.
    """
    if not prediction.envelope or not prediction.wall_s:
        return prediction.peak_bytes
    had_peak = trust_clock and waves <= 1 and seen_bytes >= PEAK_SEEN_FRACTION * prediction.peak_bytes
    slack = 1.0 if had_peak else PROGRESS_SLACK
    progress = elapsed_s / (prediction.wall_s * slack)
    k = min(len(prediction.envelope) - 1, int(len(prediction.envelope) * progress))
    left = prediction.envelope[k]
    if (
        prediction.inferred
        and left < prediction.peak_bytes
        and rss_bytes is not None
        and 0 < rss_bytes <= PAST_PEAK_DROP * seen_bytes
    ):
        # past its peak by the clock and by its own RSS: the estimate was for the worst file of the recipe,
        # this one's peak is what it was seen at, and the rest of its course scales with it
        return min(left, math.ceil(left * seen_bytes / prediction.peak_bytes))
    return left


@dataclass(frozen=True)
class NvccCall:
    """What admission needs to know about one nvcc command line."""

    is_compile: bool
    source: str | None
    archs: tuple[str, ...]
    threads: int


_SOURCE_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx", ".c")
_ARCH_RE = re.compile(r"(?:arch|code)=\[?([a-z_0-9,]+)\]?")


def _archs_of(value: str) -> list[str]:
    """Virtual architectures of one -gencode/-arch value; each one is a cicc run."""
    found: list[str] = []
    match = re.search(r"arch=([a-z_0-9]+)", value)
    if match:
        found.append(match.group(1).replace("sm_", "compute_"))
        return found
    for part in value.split(","):
        part = part.strip("[] ")
        if part.startswith(("sm_", "compute_")):
            found.append(part.replace("sm_", "compute_"))
    return found


def parse_nvcc_args(args: Sequence[str]) -> NvccCall:
    """Source, virtual archs and --threads of an nvcc call; anything but `-c` of a source is not a compile."""
    source: str | None = None
    archs: list[str] = []
    threads = 1
    is_compile = False
    i = 0
    while i < len(args):
        arg = args[i]
        nxt = args[i + 1] if i + 1 < len(args) else ""
        if arg in ("-c", "--compile"):
            is_compile = True
        elif arg in ("-gencode", "--generate-code", "-arch", "--gpu-architecture"):
            archs.extend(_archs_of(nxt))
            i += 1
        elif arg.startswith(("-gencode=", "--generate-code=", "-arch=", "--gpu-architecture=")):
            archs.extend(_archs_of(arg.split("=", 1)[1]))
        elif arg in ("-t", "--threads"):
            threads = _threads(nxt)
            i += 1
        elif arg.startswith("--threads="):
            threads = _threads(arg.split("=", 1)[1])
        elif arg in (
            "-o",
            "-I",
            "-D",
            "-x",
            "-ccbin",
            "--dependency-output",
            "-MF",
            "-Xcompiler",
            "-include",
        ):
            i += 1
        elif not arg.startswith("-") and arg.endswith(_SOURCE_SUFFIXES):
            source = arg
        i += 1
    unique = tuple(sorted(set(archs))) or ("default",)
    return NvccCall(
        is_compile=is_compile and source is not None, source=source, archs=unique, threads=threads
    )


def _threads(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        return 1
    # nvcc reads 0 as "as many as there are CPUs"; per compile that means one thread per arch.
    return value if value > 0 else 64
