"""flash-attn 2.8.3 at the seed's scale: 72 kernel files x 4 archs, NVCC_THREADS=4, a 432 GiB / 128-core host.

Every compile is built from a measured one (`bench/data/flash-attn-courses/`, written by
`python -m bench.compile_course flash-attn`): the real course of a kernel file compiled for one arch with one
nvcc thread, sampled every 0.5 s, per tool. Ten files were measured (forward hdim 32/64/128/256, backward
32/64/128/256, split-KV forward 128/256); each goes through
  host preprocessing and cudafe++   4-6% of its CPU time, < 0.9 GiB, once per compile
  cicc                              69-87%: its RSS climbs steadily to the peak, reached at 10-25% of the
                                    compile (cicc's front end instantiating the templates), then falls to
                                    29-54% of it at most through the optimizer and code generation
  ptxas                             7-23%, < 0.8 GiB
  the host compile (cc1plus)        2-6%, 0.5-0.6 GiB, once per compile
cicc and ptxas run once per arch; nvcc's --threads runs up to that many archs side by side, each holding its
own cicc (two archs at two threads measured 12.3 GiB = two cicc at 6.3 GiB; the hand-run rows these courses
belong to: bench/data/flash-attn-hand-compiles.csv). A file that was not measured takes the course of the
nearest measured head dimension of its kind, with its peak and time interpolated linearly in the head
dimension between the measured ones (beyond them, the nearest one's).
bf16 and causal files take their fp16, non-causal sibling's figures (not measured). Times are on each
course's CPU-time axis (the compiles were measured two at a time), then scaled by one factor so that
MAX_JOBS=20 takes the seed's 9m46s (the seed's machine is faster per core than the 2-vCPU machine that
measured the courses).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from factory.container import admission
from factory.memory.simulate import Task
from factory.spec import measured
from factory.spec.measured import interpolate
from factory.spec.options import Recipe

GIB = 1 << 30
HOST_BYTES = 432 * GIB
CORES = 128
ARCHS = 4
NVCC_THREADS = 4
SEED_PASS_JOBS = 20
SEED_OOM_JOBS = 32
SEED_MAKESPAN_S = 9 * 60 + 46
# the OS, ninja and setup.py's Python on the seed's host
BASE_BYTES = 4 * GIB
HDIMS = (32, 64, 96, 128, 192, 256)
DTYPES = ("fp16", "bf16")
COURSES = Path(__file__).resolve().parent / "data" / "flash-attn-courses"
PER_ARCH_TOOLS = frozenset({"cicc", "ptxas"})
# phases a measured course is cut into: the shared steps before and after, and the per-arch part
SHARED_CHUNKS = 2
PER_ARCH_CHUNKS = 40


@dataclass(frozen=True, kw_only=True)
class Course:
    """One measured compile (one arch, one nvcc thread), cut into phases of (seconds, bytes)."""

    file: str
    kind: str  # fwd, bwd or split
    hdim: int
    seconds: float  # its CPU time: the time of the compile alone on a core
    peak_bytes: int
    front: tuple[tuple[float, int], ...]  # before the first cicc: once per compile
    per_arch: tuple[tuple[float, int], ...]  # cicc and ptxas: once per arch
    back: tuple[tuple[float, int], ...]  # after the last ptxas: once per compile


def file_kind(name: str) -> tuple[str, int]:
    m = re.match(r"flash_(fwd_split|fwd|bwd)_hdim(\d+)_", name)
    if not m:
        raise ValueError(f"not a flash-attn kernel file: {name}")
    return {"fwd_split": "split", "fwd": "fwd", "bwd": "bwd"}[m.group(1)], int(m.group(2))


def _chunks(
    samples: list[tuple[float, int]], start: float, end: float, n: int
) -> tuple[tuple[float, int], ...]:
    """[start, end) in n equal phases, each at the most RSS sampled in it (or next to it, when none was)."""
    if end <= start:
        return ()
    out = []
    width = (end - start) / n
    for i in range(n):
        a, b = start + i * width, start + (i + 1) * width
        inside = [m for t, m in samples if a <= t < b]
        if not inside:
            inside = [min(samples, key=lambda s: abs(s[0] - (a + b) / 2))[1]]
        out.append((width, max(inside)))
    return tuple(out)


def load_course(path: Path) -> Course:
    """A measured course on its CPU-time axis: the compile is single-threaded (one arch, one nvcc thread), so
    its CPU time is its wall time on an idle core, whatever else shared the machine while it was measured."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if data["archs"] != ["80"] or data["nvcc_threads"] != 1 or data["rc"] != 0:
        raise ValueError(f"{path}: not a successful one-arch, one-thread compile")
    raw = [(float(t), float(c), int(m)) for t, c, m in data["samples"]]

    def cpu_at(wall: float) -> float:
        return next((c for t, c, _ in raw if t >= wall), raw[-1][1])

    samples = [(c, m) for _, c, m in raw]
    per_arch = [s for s in data["steps"] if s["tool"] in PER_ARCH_TOOLS]
    first = cpu_at(min(s["start_s"] for s in per_arch))
    last = cpu_at(max(s["end_s"] for s in per_arch))
    total = max(float(data["cpu_s"]), raw[-1][1])
    kind, hdim = file_kind(data["file"])
    return Course(
        file=data["file"],
        kind=kind,
        hdim=hdim,
        seconds=total,
        peak_bytes=int(data["peak_bytes"]),
        front=_chunks(samples, 0.0, first, SHARED_CHUNKS),
        per_arch=_chunks(samples, first, last, PER_ARCH_CHUNKS),
        back=_chunks(samples, last, total, SHARED_CHUNKS),
    )


@cache
def measured_courses() -> tuple[Course, ...]:
    return tuple(load_course(p) for p in sorted(COURSES.glob("*.json")))


def file_figures(kind: str, hdim: int) -> tuple[Course, float, float]:
    """(the course to shape it on, its per-arch peak bytes, its seconds) for one kernel file."""
    courses = [c for c in measured_courses() if c.kind == kind] or [
        c for c in measured_courses() if c.kind == "fwd"
    ]
    if not courses:
        raise FileNotFoundError(f"no measured flash-attn course in {COURSES}")
    shape = min(courses, key=lambda c: (abs(c.hdim - hdim), c.hdim))
    by_hdim: dict[int, Course] = {}
    for c in courses:
        by_hdim.setdefault(c.hdim, c)
    peak = interpolate([(h, c.peak_bytes) for h, c in by_hdim.items()], hdim)
    seconds = interpolate([(h, c.seconds) for h, c in by_hdim.items()], hdim)
    return shape, peak, seconds


def compile_task(name: str, *, archs: int, threads: int, scale: float) -> Task:
    """One kernel file compiled for `archs` archs with `threads` nvcc threads: the shared steps once, the
    per-arch part once per wave of min(threads, archs left) archs side by side."""
    shape, peak, seconds = file_figures(*file_kind(name))
    t = scale * seconds / shape.seconds
    m = peak / shape.peak_bytes
    phases: list[tuple[float, int, int]] = [(d * t, b, 1) for d, b in shape.front]
    left = archs
    while left > 0:
        n = min(threads, left)
        phases += [(d * t, int(n * b * m), n) for d, b in shape.per_arch]
        left -= n
    phases += [(d * t, b, 1) for d, b in shape.back]
    return Task(name=name, phases=tuple(phases))


def kernel_files() -> list[str]:
    """The kernel files in the order of flash-attn 2.8.3's setup.py sources, which ninja follows."""
    files: list[str] = []
    for prefix in ("flash_fwd", "flash_bwd", "flash_fwd_split"):
        for causal in ("", "_causal"):
            for hdim in HDIMS:
                for dtype in DTYPES:
                    files.append(f"{prefix}_hdim{hdim}_{dtype}{causal}_sm80.cu")
    return files


def flash_attn_tasks(*, scale: float = 1.0, archs: int = ARCHS, threads: int = NVCC_THREADS) -> list[Task]:
    return [compile_task(name, archs=archs, threads=threads, scale=scale) for name in kernel_files()]


def time_scale() -> float:
    """The factor that makes MAX_JOBS=20 take the seed's 9m46s (makespans scale linearly with it)."""
    from factory.memory.simulate import simulate_fixed

    r = simulate_fixed(
        flash_attn_tasks(scale=1.0),
        limit_bytes=HOST_BYTES,
        cores=CORES,
        jobs=SEED_PASS_JOBS,
        base_bytes=BASE_BYTES,
    )
    return SEED_MAKESPAN_S / r.makespan_s if r.makespan_s > 0 else 1.0


HAND_CSV = Path(__file__).resolve().parent / "data" / "flash-attn-hand-compiles.csv"


@cache
def hand_recipe() -> Recipe:
    """The built-in flash-attn recipe with its tables derived, by the recipe's own rules, from the hand-run
    measurements these courses belong to (bench/data/flash-attn-hand-compiles.csv: what the recipe shipped
    before the factory measured a whole wheel). The model replays those courses, so a first build in it knows
    what a first build knew of them: the shipped recipe's tables now come from the factory's own compiles,
    whose peaks read a few percent lower than the hand runs' for the same files."""
    from factory.spec.recipes import FLASH_ATTN

    rows = measured.parse_rows(HAND_CSV.read_text(encoding="utf-8"))
    return replace(
        FLASH_ATTN,
        compile_gib_per_arch=measured.measured_compile_gib(rows=rows),
        compile_gib_by_file=measured.flash_attn_file_estimates(rows),
        compile_after_peak=measured.measured_after_peak(rows),
        compile_seconds_by_file=measured.flash_attn_file_seconds(rows),
    )


def per_arch_estimate_bytes() -> int:
    """The flash-attn recipe's estimate: the worst measured per-arch peak (what the factory knows before
    profiling)."""
    return math.ceil(hand_recipe().compile_gib_per_arch * GIB)


def per_file_estimate_bytes() -> tuple[tuple[str, int], ...]:
    """The flash-attn recipe's per-file table in bytes (what a first build knows per file)."""
    return admission.raised_by_file(
        hand_recipe().compile_gib_by_file,
        per_arch_bytes=per_arch_estimate_bytes(),
        fallback_bytes=per_arch_estimate_bytes(),
        unit=GIB,
    )


def per_file_seconds() -> tuple[tuple[str, float], ...]:
    """The flash-attn recipe's compile_seconds_by_file (the order a first build starts files in)."""
    return hand_recipe().compile_seconds_by_file


def first_build_knows() -> dict[str, Any]:
    """What the flash-attn recipe tells a first build (`simulate_factory`'s keyword arguments)."""
    return {
        "by_file": per_file_estimate_bytes(),
        "after_peak": after_peak(),
        "seconds_by_file": per_file_seconds(),
    }


def after_peak() -> float | None:
    """The flash-attn recipe's compile_after_peak (what a first build knows of a course)."""
    return hand_recipe().compile_after_peak
