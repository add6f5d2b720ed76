"""flash-attn 2.8.3 at the seed's scale: 72 kernel files x 4 archs, NVCC_THREADS=4, a 432 GiB / 128-core host.

Per-file memory and time come from the measured compiles in factory/data/flash-attn-compiles.csv (one arch,
one
nvcc thread): forward hdim64 peaks at 3.68 GiB in 445 s, backward hdim256 at 6.64 GiB in ~800 s. Other
files are
interpolated linearly in the head dimension with the same slope for forward and backward; split-KV forward
files
are taken as forward files. Times are then scaled by one factor so that MAX_JOBS=20 takes the seed's 9m46s
(the
seed's 128-core machine is faster per core than the 2-vCPU machine that measured the CSV).

The shape of one compile (per-arch work happens in nvcc threads, one arch per thread):
  front end (cudafe++, host preprocessing of the torch headers)  10% of the time, 1.2 GiB, 1 thread
  per wave of min(threads, archs) archs: cicc's optimizer        30%, n x peak-per-arch + 0.3 GiB
                                         ptxas and the rest      50%, n x 35% of it + 0.3 GiB
  host compile of the stub                                        10%, 1.5 GiB, 1 thread
so a compile's peak comes early ("the peak comes in the first ~2 minutes", flash-attention #2079).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from importlib import resources

from factory.memory import admission
from factory.memory.simulate import Task

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
SLOPE_GIB_PER_HDIM = 0.01


@dataclass(frozen=True, kw_only=True)
class Calibration:
    fwd_hdim64_gib: float
    fwd_hdim64_s: float
    bwd_hdim256_gib: float
    bwd_hdim256_s: float


def calibration_from_csv() -> Calibration:
    text = resources.files("factory").joinpath("data/flash-attn-compiles.csv").read_text(encoding="utf-8")
    rows = [r for r in csv.DictReader(line for line in text.splitlines() if not line.startswith("#"))]
    mine = [r for r in rows if r["flash_attn_version"] == "2.8.3" and r["nvcc_threads"] == "1"]
    fwd = next(r for r in mine if r["tu"].startswith("flash_fwd_hdim64"))
    bwd = next(r for r in mine if r["tu"].startswith("flash_bwd_hdim256"))
    # the 2.8.3 backward row shared its 2 cores with another compile: take the CPU time of the same file
    # measured
    # alone with a sibling version, scaled by the forward files' ratio of wall to CPU time
    alone = [r for r in rows if r["tu"] == bwd["tu"] and r["cpu_s"] and "shared" not in r["note"]]
    fwd_alone = [r for r in rows if r["tu"] == fwd["tu"] and r["cpu_s"]]
    bwd_s = float(bwd["wall_s"])
    if alone and fwd_alone:
        bwd_s = float(alone[0]["cpu_s"]) * float(fwd_alone[0]["wall_s"]) / float(fwd_alone[0]["cpu_s"])
    return Calibration(
        fwd_hdim64_gib=float(fwd["peak_gib"]),
        fwd_hdim64_s=float(fwd["wall_s"]),
        bwd_hdim256_gib=float(bwd["peak_gib"]),
        bwd_hdim256_s=bwd_s,
    )


def per_arch(kind: str, hdim: int, cal: Calibration) -> tuple[float, float]:
    """(peak GiB, seconds) of one arch of one file with one nvcc thread."""
    if kind == "bwd":
        gib = cal.bwd_hdim256_gib + SLOPE_GIB_PER_HDIM * (hdim - 256)
        return gib, cal.bwd_hdim256_s * gib / cal.bwd_hdim256_gib
    gib = cal.fwd_hdim64_gib + SLOPE_GIB_PER_HDIM * (hdim - 64)
    return gib, cal.fwd_hdim64_s * gib / cal.fwd_hdim64_gib


def compile_task(name: str, gib: float, seconds: float, *, archs: int, threads: int, scale: float) -> Task:
    t = seconds * scale
    phases: list[tuple[float, int, int]] = [(0.10 * t, int(1.2 * GIB), 1)]
    left = archs
    while left > 0:
        n = min(threads, left)
        phases.append((0.30 * t, int((n * gib + 0.3) * GIB), n))
        phases.append((0.50 * t, int((n * gib * 0.35 + 0.3) * GIB), n))
        left -= n
    phases.append((0.10 * t, int(1.5 * GIB), 1))
    return Task(name=name, phases=tuple(phases))


def kernel_files() -> list[tuple[str, str, int]]:
    """(file, kind, hdim) in the order of flash-attn 2.8.3's setup.py sources, which ninja follows."""
    files: list[tuple[str, str, int]] = []
    for prefix, kind in (("flash_fwd", "fwd"), ("flash_bwd", "bwd"), ("flash_fwd_split", "fwd")):
        for causal in ("", "_causal"):
            for hdim in HDIMS:
                for dtype in DTYPES:
                    files.append((f"{prefix}_hdim{hdim}_{dtype}{causal}_sm80.cu", kind, hdim))
    return files


def flash_attn_tasks(*, scale: float = 1.0, archs: int = ARCHS, threads: int = NVCC_THREADS) -> list[Task]:
    cal = calibration_from_csv()
    tasks = []
    for name, kind, hdim in kernel_files():
        gib, seconds = per_arch(kind, hdim, cal)
        tasks.append(compile_task(name, gib, seconds, archs=archs, threads=threads, scale=scale))
    return tasks


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


def per_arch_estimate_bytes() -> int:
    """The flash-attn recipe's estimate: the worst measured per-arch peak (what the factory knows before
    profiling)."""
    return math.ceil(calibration_from_csv().bwd_hdim256_gib * GIB)


def per_file_estimate_bytes() -> tuple[tuple[str, int], ...]:
    """The built-in flash-attn recipe's per-file table in bytes (what a first build knows per file)."""
    from factory.recipes import FLASH_ATTN

    return admission.raised_by_file(
        FLASH_ATTN.compile_gib_by_file,
        per_arch_bytes=per_arch_estimate_bytes(),
        fallback_bytes=per_arch_estimate_bytes(),
        unit=GIB,
    )
