"""`python -m bench.preflight` (`make preflight-here`): what of the production matrix this host can preflight,
run through `factory build --preflight`, and its figures recorded in bench/results/preflight.json.

Two sets, each one `factory build` run:

- `cuda13`: matrix.yaml's CUDA 13 variants (torch 2.11-2.14) with the pypi flavor (nvcc 13.0, forky's
  Python 3.13);
- `cuda12`: examples/flash-attn/cu12-debian.yaml, torch 2.9 and 2.10 (CUDA 12.8 builds) with the debian
  flavor's toolkit (Debian's nvidia-cuda-toolkit 12.4: sm_80 and sm_90 of matrix.yaml's set; sm_100/sm_120
  need a 12.8 toolkit, which only nvidia/cuda:12.8-devel gives).

Per set it records the run's wall, and per variant (from report.json) the preflight's result, its first error
line, the toolkit, the job's wall and its container's peak. `--set NAME` runs one set; `--record NAME=REPORT
--wall S` records a run made by hand with that command instead of running it (its wall as timed).
Needs dockerd and the images (`make images debian-image`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from factory.core.variants import VariantKey

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "preflight.json"
FACTORY = [sys.executable, "-m", "factory.cli"]
GIB = 2**30

SETS: dict[str, dict[str, Any]] = {
    "cuda13": {
        "what": "`matrix.yaml`'s CUDA 13 variants "
        "(flash-attn 2.8.3.post2; `--flavor pypi --only 'cu130-*-py313'`)",
        "args": ["--matrix", "matrix.yaml", "--flavor", "pypi", "--only", "cu130-*-py313"],
    },
    "cuda12": {
        "what": "`examples/flash-attn/cu12-debian.yaml` (flash-attn 2.8.3.post2, "
        "torch 2.9/2.10 CUDA 12.8 builds, debian flavor: "
        "Debian's nvidia-cuda-toolkit 12.4, g++-13; sm_80;sm_90)",
        "args": ["--matrix", "examples/flash-attn/cu12-debian.yaml"],
    },
}


def command(name: str, output: Path) -> list[str]:
    return [*FACTORY, "build", *SETS[name]["args"], "--preflight", "--keep-going", "--output", str(output)]


def summarize(name: str, report_path: Path, wall_s: float) -> dict[str, Any]:
    report = json.loads(report_path.read_text())
    variants = []
    for job in report["jobs"]:
        pre = job.get("preflight") or {}
        variants.append(
            {
                "job": job["job_id"],
                "torch": VariantKey.parse_id(job["variant_id"]).torch,
                "result": pre.get("result", job["result"]),
                "line": pre["line"] if pre else job.get("reason"),
                "device": pre.get("device"),
                "arch": pre.get("arch"),
                "toolkit": job.get("toolkit"),
                "wall_s": job.get("wall_s"),
                "peak_gib": round(job["peak_bytes"] / GIB, 1) if job.get("peak_bytes") else None,
            }
        )
    return {
        "what": SETS[name]["what"],
        "command": " ".join(["factory", *command(name, Path("OUT"))[len(FACTORY) :]]),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "wall_s": round(wall_s),
        "variants": variants,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=sorted(SETS), action="append", help="Run this set (default: all).")
    parser.add_argument("--record", metavar="NAME=REPORT", help="Record a run made by hand instead.")
    parser.add_argument("--wall", type=float, help="With --record: that run's wall, in seconds.")
    parser.add_argument("--output", type=Path, default=ROOT / "wheelhouse" / "preflight")
    opts = parser.parse_args(argv)
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    sets = results.setdefault("sets", {})
    failed = 0
    if opts.record:
        name, _, report = opts.record.partition("=")
        if name not in SETS or not report or opts.wall is None:
            parser.error("--record NAME=REPORT needs a set name, a report.json and --wall")
        sets[name] = summarize(name, Path(report), opts.wall)
    else:
        for name in opts.set or sorted(SETS):
            out = opts.output / name
            t0 = time.monotonic()
            rc = subprocess.run(command(name, out), cwd=ROOT).returncode
            sets[name] = summarize(name, out / "report.json", time.monotonic() - t0)
            failed += rc != 0
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    for name, data in sets.items():
        passed = sum(v["result"] == "pass" for v in data["variants"])
        print(f"{name}: {passed} of {len(data['variants'])} pass in {data['wall_s']} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
