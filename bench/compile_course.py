"""Measure the course of one real compile: its process tree's RSS and CPU time over time, per tool.

The memory model of `bench/model.py` needs more than a compile's peak and time: when the peak comes, how long
each of nvcc's steps (host preprocessing, cudafe++, cicc, ptxas, the host compile) takes and holds, and which
of them run once per arch. This samples the tree every `interval_s` and keeps, for every process that ran,
its tool name, when it ran, its CPU time and its largest RSS.

    python -m bench.compile_course flash-attn --src flash_attn-2.8.3 --python venv/bin/python \\
        --file flash_fwd_hdim128_fp16_sm80.cu --archs 80 --threads 1 --out course.json
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from factory.container.admission import PAST_PEAK_DROP

GIB = 1 << 30


@dataclass(kw_only=True)
class Step:
    """One process of the compile's tree."""

    pid: int
    tool: str
    start_s: float
    end_s: float
    cpu_s: float
    peak_bytes: int


@dataclass(frozen=True, kw_only=True)
class Course:
    command: tuple[str, ...]
    rc: int
    wall_s: float
    cpu_s: float
    peak_bytes: int
    steps: tuple[Step, ...]
    # (seconds since start, CPU seconds of the tree so far, RSS of the tree)
    samples: tuple[tuple[float, float, int], ...]

    def to_json(self) -> dict[str, object]:
        return {
            "command": list(self.command),
            "rc": self.rc,
            "wall_s": round(self.wall_s, 2),
            "cpu_s": round(self.cpu_s, 2),
            "peak_bytes": self.peak_bytes,
            "steps": [
                asdict(s) | {"start_s": round(s.start_s, 2), "end_s": round(s.end_s, 2)} for s in self.steps
            ],
            "samples": [[round(t, 2), round(c, 2), m] for t, c, m in self.samples],
        }


def measure(command: list[str], *, cwd: Path | None = None, interval_s: float = 0.5) -> Course:
    """Run `command` and sample its process tree until it exits.

    The tree's CPU time counts every process seen, with the last CPU time read of each: a process that ends
    between two samples loses at most one interval of CPU time, and `cpu_s` of the result comes from the
    kernel's accounting of the whole tree instead.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = psutil.Popen(command, cwd=cwd)
    steps: dict[int, Step] = {}
    samples: list[tuple[float, float, int]] = []
    while proc.poll() is None:
        now = time.monotonic() - started
        rss = 0
        try:
            tree = [proc, *proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        for p in tree:
            try:
                with p.oneshot():
                    mem = p.memory_info().rss
                    cpu = p.cpu_times()
                    name = p.name()
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
            rss += mem
            step = steps.get(p.pid)
            if step is None:
                step = steps[p.pid] = Step(
                    pid=p.pid, tool=name, start_s=now, end_s=now, cpu_s=0.0, peak_bytes=0
                )
            step.end_s = now
            step.cpu_s = cpu.user + cpu.system
            step.peak_bytes = max(step.peak_bytes, mem)
        samples.append((now, sum(s.cpu_s for s in steps.values()), rss))
        time.sleep(interval_s)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return Course(
        command=tuple(command),
        rc=proc.returncode,
        wall_s=wall,
        cpu_s=(after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        peak_bytes=max((m for _, _, m in samples), default=0),
        steps=tuple(sorted(steps.values(), key=lambda s: s.start_s)),
        samples=tuple(samples),
    )


def flash_attn_command(
    *, src: Path, python: Path, file: str, archs: list[str], threads: int, out: Path
) -> list[str]:
    """The nvcc command torch's ninja build runs for one flash-attn kernel file (flash-attn's setup.py flags,
    with -std=c++20 as torch >= 2.14's headers need; include paths and torch's own flags from `python`'s
    torch)."""
    query = (
        "import json, sysconfig; from torch.utils import cpp_extension as c; "
        "print(json.dumps({'inc': c.include_paths(device_type='cuda'), "
        "'py': sysconfig.get_paths()['include'], 'flags': c.COMMON_NVCC_FLAGS, "
        "'nvcc': c._join_cuda_home('bin', 'nvcc') if c.CUDA_HOME else None}))"
    )
    info = json.loads(
        subprocess.run([str(python), "-c", query], check=True, capture_output=True, text=True).stdout
    )
    fa = src / "csrc" / "flash_attn"
    gencodes = [f for a in archs for f in ("-gencode", f"arch=compute_{a},code=sm_{a}")]
    return [
        info["nvcc"] or "nvcc",
        "--generate-dependencies-with-compile",
        "--dependency-output",
        f"{out}.d",
        f"-I{fa}",
        f"-I{fa / 'src'}",
        f"-I{src / 'csrc' / 'cutlass' / 'include'}",
        *(arg for p in [*info["inc"], info["py"]] for arg in ("-isystem", p)),
        "-c",
        str(fa / "src" / file),
        "-o",
        str(out),
        *info["flags"],
        "--compiler-options",
        "-fPIC",
        "-O3",
        "-std=c++20",
        "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_HALF2_OPERATORS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "--expt-relaxed-constexpr",
        "--expt-extended-lambda",
        "--use_fast_math",
        *gencodes,
        "--threads",
        str(threads),
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        "-DTORCH_EXTENSION_NAME=flash_attn_2_cuda",
        "-D_GLIBCXX_USE_CXX11_ABI=1",
    ]


def after_peak(rss: Sequence[int]) -> float | None:
    """The most RSS after the compile first fell to PAST_PEAK_DROP of its peak (the wrapper's sign that its
    peak is behind it), as a fraction of the peak; None when it never fell that far."""
    peak = max(rss, default=0)
    if peak <= 0:
        return None
    top = rss.index(peak)
    fell = next((i for i in range(top, len(rss)) if rss[i] <= PAST_PEAK_DROP * peak), None)
    return None if fell is None else max(rss[fell:]) / peak


def csv_row(path: Path, *, version: str, note: str) -> str:
    """A factory/data/flash-attn-compiles.csv row for one measured course."""
    data = json.loads(path.read_text(encoding="utf-8"))
    after = after_peak([int(m) for _, _, m in data["samples"]])
    return ",".join(
        [
            version,
            data["file"],
            "+".join(f"sm_{a}" for a in data["archs"]),
            str(data["nvcc_threads"]),
            f"{data['peak_bytes'] / GIB:.2f}",
            f"{data['cpu_s']:.0f}",
            f"{data['wall_s']:.0f}",
            "" if after is None else f"{after:.3f}",
            f"{note}; course: bench/data/flash-attn-courses/{path.name}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    fa = sub.add_parser("flash-attn", help="one kernel file of a flash-attn source tree")
    fa.add_argument("--src", type=Path, required=True, help="the unpacked flash-attn sdist")
    fa.add_argument("--python", type=Path, required=True, help="a Python with torch")
    fa.add_argument("--file", required=True, help="kernel file name under csrc/flash_attn/src")
    fa.add_argument("--archs", default="80", help="comma-separated, e.g. 80,90")
    fa.add_argument("--threads", type=int, default=1)
    fa.add_argument("--out", type=Path, required=True, help="JSON file to write")
    rows = sub.add_parser("csv", help="factory/data/flash-attn-compiles.csv rows for measured courses")
    rows.add_argument("courses", type=Path, nargs="+")
    rows.add_argument("--version", default="2.8.3")
    rows.add_argument("--note", default="torch 2.14.1 headers")
    args = parser.parse_args(argv)
    if args.what == "csv":
        for path in args.courses:
            print(csv_row(path, version=args.version, note=args.note))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        command = flash_attn_command(
            src=args.src.resolve(),
            python=args.python,
            file=args.file,
            archs=args.archs.split(","),
            threads=args.threads,
            out=Path(tmp) / "kernel.o",
        )
        course = measure(command)
    result = {
        "file": args.file,
        "archs": args.archs.split(","),
        "nvcc_threads": args.threads,
        "machine": f"{platform.machine()}, {psutil.cpu_count()} CPUs, "
        f"{psutil.virtual_memory().total / GIB:.0f} GiB",
        "nvcc": subprocess.run([command[0], "--version"], capture_output=True, text=True)
        .stdout.strip()
        .splitlines()[-1],
        **course.to_json(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(
        f"{args.file}: rc {course.rc}, {course.wall_s:.0f} s wall, {course.cpu_s:.0f} s CPU, "
        f"peak {course.peak_bytes / GIB:.2f} GiB"
    )
    return course.rc


if __name__ == "__main__":
    sys.exit(main())
