"""Do two compiles side by side cost each other CPU time here, and how far does one compile drift alone?

The real part of `make bench-memory` compares a build with a lower bound measured on the same compiles run
one at a time, minutes before and after it. Its ratio then mixes two things: what running compiles side by
side costs them (shared caches and memory bandwidth, or two vCPUs on one physical core), which any parallel
schedule pays, and how much the machine's speed moved between the runs, which no schedule controls. This
separates them: in each round one TU of the memext fixture compiles alone and, in alternating order, beside
another TU started with it, with the fixture's own nvcc flags. The ratio of the medians of its CPU times
(side by side / alone) is the first; the spread of its alone times across rounds is the second.

    python -m bench.side_by_side --first heavy1 --second heavy2 --rounds 4
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.real import FIXTURE, host_nvcc

RESULTS = Path(__file__).resolve().parent / "results" / "side_by_side.json"


@dataclass(frozen=True, kw_only=True)
class Compile:
    cpu_s: float
    wall_s: float


@dataclass(frozen=True, kw_only=True)
class Round:
    alone_first: bool
    alone: Compile
    side_by_side: Compile  # the first TU's compile, the second TU started with it
    other: Compile  # the second TU's compile


@dataclass(frozen=True, kw_only=True)
class Summary:
    rounds: int
    alone_median_cpu_s: float
    side_by_side_median_cpu_s: float
    # side by side / alone, medians: what a second compile running at the same time costs this one
    side_by_side_x_alone: float
    # the median of each round's own side by side / alone: the same, with the drift between rounds out
    paired_x: float
    # slowest / fastest alone: how far the machine's speed moved during the measurement
    alone_spread: float


def summarize(rounds: Sequence[Round]) -> Summary:
    alone = [r.alone.cpu_s for r in rounds]
    side = [r.side_by_side.cpu_s for r in rounds]
    return Summary(
        rounds=len(rounds),
        alone_median_cpu_s=round(statistics.median(alone), 3),
        side_by_side_median_cpu_s=round(statistics.median(side), 3),
        side_by_side_x_alone=round(statistics.median(side) / statistics.median(alone), 3),
        paired_x=round(statistics.median(s / a for s, a in zip(side, alone, strict=True)), 3),
        alone_spread=round(max(alone) / min(alone), 3),
    )


def _fixture_flags() -> tuple[str, ...]:
    spec = importlib.util.spec_from_file_location("memext_build", FIXTURE / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tuple(module.CFLAGS)


def _start(nvcc: str, flags: Sequence[str], name: str, out: Path) -> tuple[subprocess.Popen[bytes], float]:
    source = FIXTURE / "src" / f"{name}.cu"
    return subprocess.Popen([nvcc, *flags, "-c", str(source), "-o", str(out)]), time.monotonic()


def _wait(started: tuple[subprocess.Popen[bytes], float]) -> Compile:
    """nvcc waits for its cicc, ptxas and host compiler, so its rusage holds theirs."""
    proc, t0 = started
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"nvcc failed ({proc.returncode}): {' '.join(map(str, proc.args))}")
    return Compile(cpu_s=round(usage.ru_utime + usage.ru_stime, 3), wall_s=round(wall, 3))


def measure(first: str, second: str, rounds: int, *, nvcc: str, work: Path) -> list[Round]:
    """`rounds` rounds; even ones compile `first` alone first, odd ones side by side first, so that a drift
    of the machine during the measurement falls on both alike."""
    flags = _fixture_flags()
    found: list[Round] = []
    for n in range(rounds):
        alone_first = n % 2 == 0
        results: dict[str, Compile] = {}
        for mode in ("alone", "side") if alone_first else ("side", "alone"):
            a = _start(nvcc, flags, first, work / "a.o")
            if mode == "alone":
                results["alone"] = _wait(a)
            else:
                b = _start(nvcc, flags, second, work / "b.o")
                results["side"], results["other"] = _wait(a), _wait(b)
        found.append(
            Round(
                alone_first=alone_first,
                alone=results["alone"],
                side_by_side=results["side"],
                other=results["other"],
            )
        )
        r = found[-1]
        print(
            f"round {n + 1}: {first} alone {r.alone.cpu_s:.1f} CPU s, beside {second} "
            f"{r.side_by_side.cpu_s:.1f} CPU s",
            flush=True,
        )
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.side_by_side", description=__doc__.splitlines()[0])
    parser.add_argument("--first", default="heavy1", help="fixture TU measured (default heavy1)")
    parser.add_argument("--second", default="heavy2", help="fixture TU started beside it (default heavy2)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    names = {p.stem for p in (FIXTURE / "src").glob("*.cu")}
    for name in (args.first, args.second):
        if name not in names:
            parser.error(f"no fixture TU {name!r}; there are {', '.join(sorted(names))}")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, not {args.rounds}")
    nvcc = host_nvcc()
    if nvcc is None:
        print("bench.side_by_side: no nvcc on this host", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="factory-side-by-side-") as tmp:
        rounds = measure(args.first, args.second, args.rounds, nvcc=nvcc, work=Path(tmp))
    summary = summarize(rounds)
    result = {
        "first": args.first,
        "second": args.second,
        "nvcc": nvcc,
        "cpus": os.cpu_count(),
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "summary": asdict(summary),
        "rounds": [asdict(r) for r in rounds],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(args.out.read_text()) if args.out.exists() else {}
    previous[f"{args.first}+{args.second}"] = result
    args.out.write_text(json.dumps(previous, indent=2) + "\n")
    print(
        f"{args.first}: median {summary.alone_median_cpu_s:.2f} CPU s alone, "
        f"{summary.side_by_side_median_cpu_s:.2f} beside {args.second} "
        f"({summary.side_by_side_x_alone:.3f}x; per round, median {summary.paired_x:.3f}x); alone, slowest / "
        f"fastest round: {summary.alone_spread:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
