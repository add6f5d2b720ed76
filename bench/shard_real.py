"""`python -m bench.shard_real`: memext (tests/fixtures/memext, all eight kernels) through the real factory,
on one "runner" with 2 CPUs against two shard "runners" with 1 CPU each, side by side, then the final build.

Every run has its own empty `$FACTORY_HOME` (the wheelhouse cache shared, as a CI cache would be) and one
directory store for the compile cache. Walls include each run's whole `factory build` (container start, venv,
compiles, link, checks). Writes bench/results/shard_real.json. Needs dockerd and the pypi builder image.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.matrices import MEMEXT, write_matrix
from factory.core.home import factory_home
from factory.trust import signing
from factory.trust.cachekeys import SIGN_KEY_ENV

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results" / "shard_real.json"


def matrix(work: Path, store: Path, scale: str) -> Path:
    return write_matrix(
        MEMEXT,
        work / "matrix.yaml",
        matrix={"include": [{"arch": "8.0", "env": {"MEMEXT_SCALE": scale}}]},
        build={"memory": "8GiB", "cpus": None, "max_attempts": 2, "cache": str(store)},
    )


def home(work: Path, name: str) -> Path:
    h = work / name
    h.mkdir()
    shared = factory_home() / "wheelhouses"
    shared.mkdir(parents=True, exist_ok=True)
    (h / "wheelhouses").symlink_to(shared.resolve(), target_is_directory=True)
    return h


STORE_KEY = signing.generate_key()[0].decode()  # the store's private key


def start(m: Path, out: Path, h: Path, *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "factory", "build", "--trust-paths", "-m", str(m), "-o", str(out), *extra]
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        # the trusted runners of one store hold its private key, as CI's do (FACTORY_CACHE_SIGN_KEY)
        env={**os.environ, "FACTORY_HOME": str(h), SIGN_KEY_ENV: STORE_KEY},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], out: Path) -> dict[str, object]:
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"bench-shard real: a build failed:\n{err[-3000:]}")
    (job,) = json.loads((out / "report.json").read_text())["jobs"]
    return job


def run_real(work: Path, scale: str) -> dict[str, object]:
    # one runner, 2 CPUs, its own store (an empty cache: it compiles everything)
    one_store = work / "store-one"
    (work / "one").mkdir()
    m1 = matrix(work / "one", one_store, scale)
    t0 = time.monotonic()
    one_job = finish(
        start(m1, work / "one" / "out", home(work, "home-one"), "--cpus", "2"), work / "one" / "out"
    )
    one_s = time.monotonic() - t0
    # two shards, 1 CPU each, side by side; one store; then the final build from an empty home
    (work / "sharded").mkdir()
    m2 = matrix(work / "sharded", work / "store-sharded", scale)
    t0 = time.monotonic()
    procs = [
        (
            start(
                m2, work / "sharded" / f"s{i}", home(work, f"home-s{i}"), "--shard", f"{i}/2", "--cpus", "1"
            ),
            i,
        )
        for i in (1, 2)
    ]
    shard_s = []
    reasons = []
    for proc, i in procs:
        job = finish(proc, work / "sharded" / f"s{i}")
        shard_s.append(time.monotonic() - t0)
        reasons.append(job["reason"])
    t1 = time.monotonic()
    final = finish(start(m2, work / "sharded" / "final", home(work, "home-final"), "--cpus", "2"),
                   work / "sharded" / "final")  # fmt: skip
    final_s = time.monotonic() - t1
    sharded_s = max(shard_s) + final_s
    return {
        "scale": scale,
        "one_runner_s": round(one_s, 1),
        "one_runner_compiled": one_job.get("compiles_compiled"),
        "shards_s": [round(s, 1) for s in shard_s],
        "shards": reasons,
        "final_s": round(final_s, 1),
        "final_compiled": final.get("compiles_compiled"),
        "final_cached": final.get("compiles_cached"),
        "sharded_s": round(sharded_s, 1),
        "ratio_to_one_runner": round(sharded_s / one_s, 3),
        "ratio_to_ideal": round(sharded_s / (one_s / 2 + final_s), 3),
        "note": "one run on a shared 2-core machine (other builds and tests ran beside it): noisy",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.shard_real")
    parser.add_argument("--scale", choices=("full", "half"), default="half")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="factory-bench-shard-"))
    try:
        result = run_real(work, args.scale)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"real": result}, indent=1, sort_keys=True) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
