"""`python -m bench.flash_attn_wheel`: one whole flash-attn 2.8.3 wheel through the factory (every kernel, one
arch: examples/flash-attn/sm80-cu13.yaml), spread over shard runs that share a directory cache store, then
the final build from the cache, its checks, publishing to a local index, and an install from that index.

Hours on two cores, so every step is resumable: a shard recorded as done in
bench/results/flash-attn-wheel.json is not run again, and a shard stopped halfway loses nothing its compiles
already put in the store (a rerun finds them cached). Run it again until it says the wheel is installed;
`--shards-only` stops before the final build, `--max-shards K` after K more shards (a session's worth).
A shard counts as done only against the store it filled (an id kept beside the store): on a machine without
that store its record moves to `earlier` (its figures stay measurements) and the shard runs again.

Per shard it records the wall, the compiles (cached / compiled), the CPU seconds and peak of each compile (the
wrapper's measurement lines in the job log), the attempts and OOM kills, and the container's peak.
Needs dockerd and the pypi builder image (`make images`).
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from factory.container.protocol import parse_measurement
from factory.core.home import factory_home

ROOT = Path(__file__).resolve().parents[1]
MATRIX = ROOT / "examples" / "flash-attn" / "sm80-cu13.yaml"
RESULTS = Path(__file__).resolve().parent / "results" / "flash-attn-wheel.json"
JOB = "cu130-torch2.14-abi1-sm80-py313"
FACTORY = [sys.executable, "-m", "factory.cli"]


def load_results() -> dict[str, Any]:
    if RESULTS.is_file():
        return json.loads(RESULTS.read_text())
    return {"matrix": str(MATRIX.relative_to(ROOT)), "job": JOB, "shards": {}, "final": None}


def save_results(results: dict[str, Any]) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    tmp.replace(RESULTS)


def compiles_of(log: Path) -> list[dict[str, Any]]:
    """Each compile the job ran or was served, from the wrapper's measurement lines in its log."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = parse_measurement(line)
        if m is None:
            continue
        out.append(
            {
                "source": m.source or m.key.split("|", 1)[0],
                "tool": m.tool,
                "cache": m.cache,
                "cpu_s": m.cpu_s,
                "wall_s": m.wall_s,
                "peak_bytes": m.peak_bytes,
                "rc": m.rc,
            }
        )
    return out


def store_id(work: Path) -> str:
    """The id of the store under `work`, made with it: shard records name the store their compiles are in."""
    marker = work / "store.id"
    if not marker.is_file():
        marker.write_text(secrets.token_hex(8) + "\n")
    return marker.read_text().strip()


def forget_other_stores(results: dict[str, Any], current: str) -> list[str]:
    """Move the shard records of another store (or of none) to `earlier`: their compiles are not here."""
    moved = [key for key, rec in results["shards"].items() if rec.get("store") != current]
    for key in moved:
        results.setdefault("earlier", []).append({"shard": key, **results["shards"].pop(key)})
    return moved


def summarize(report_path: Path, wall_s: float, rc: int) -> dict[str, Any]:
    report = json.loads(report_path.read_text())
    (job,) = [j for j in report["jobs"] if j["job_id"] == JOB]
    compiles = compiles_of(Path(job["log"])) if job.get("log") and Path(job["log"]).is_file() else []
    ran = [c for c in compiles if c["cache"] != "hit"]
    return {
        "rc": rc,
        "result": job["result"],
        "reason": job.get("reason"),
        "wall_s": round(wall_s, 1),
        "attempts": len(job["attempts"]),
        "oom_kills": sum(1 for a in job["attempts"] if a["oom_killed"]),
        "container_peak_bytes": job["peak_bytes"],
        "compiles_cached": job["compiles_cached"],
        "compiles_compiled": job["compiles_compiled"],
        "cpu_s": round(sum(c["cpu_s"] or 0.0 for c in ran), 1),
        "wheel": job.get("wheel"),
        "log": job.get("log"),
        "compiles": compiles,
    }


def work_matrix(work: Path, index: Path) -> Path:
    """The example matrix, publishing to the work directory's own index."""
    path = work / "matrix.yaml"
    path.write_text(MATRIX.read_text() + f"publish:\n  to: {index}\n")
    return path


def factory_build(matrix: Path, args: list[str]) -> tuple[int, float]:
    t0 = time.monotonic()
    proc = subprocess.run([*FACTORY, "build", "--matrix", str(matrix), *args], cwd=ROOT)
    return proc.returncode, time.monotonic() - t0


def runtime_requirements(index: Path, variant: str, wheel: str) -> list[str]:
    """The published wheel's Requires-Dist (its PEP 658 metadata file on the index) for Python 3.13, as the
    factory's install check takes them (markers evaluated, torch and flash-attn itself left out)."""
    from packaging.metadata import parse_email

    from factory.build.runtimereqs import for_job

    raw, _ = parse_email((index / "files" / variant / f"{wheel}.metadata").read_text())
    return list(for_job(raw.get("requires_dist", []), package="flash-attn", python="3.13").requirements)


def install_from_index(index: Path, wheel: str) -> dict[str, Any]:
    """pip in a fresh Python 3.13 venv (the forky base: this host's Python is 3.11) installs flash-attn from
    the published variant index as a consumer would (`--index-url .../simple/<variant>/`), with no network:
    torch from the build's wheelhouse, flash-attn's other requirements (einops) downloaded on the host."""
    from factory.build.jobspec import requirements
    from factory.build.wheelhouse import download_wheelhouse
    from factory.plan.plan import plan_matrix
    from factory.spec.config import load_matrix_file

    mf = load_matrix_file(MATRIX)
    (job,) = plan_matrix(mf).jobs
    variant = job.variant.id
    wheelhouses = factory_home() / "wheelhouses"
    build = download_wheelhouse(requirements(mf, job), wheelhouses, python="3.13")
    others = runtime_requirements(index, variant, wheel)
    deps = download_wheelhouse(others, wheelhouses, python="3.13") if others else build
    script = (
        "set -e; python3.13 -m venv /tmp/venv; "
        "/tmp/venv/bin/pip install -q --disable-pip-version-check "
        f"--index-url file:///index/simple/{variant}/ "
        "--find-links /wheelhouse --find-links /deps flash-attn; "
        "cd /tmp; /tmp/venv/bin/python -I -c "
        '"import importlib.metadata as m, torch, flash_attn, flash_attn_2_cuda; '
        "from flash_attn import flash_attn_func; "
        "print(m.version('flash-attn'), torch.__version__, flash_attn_2_cuda.__file__)\""
    )
    proc = subprocess.run(
        [
            "docker", "run", "--rm", "--network", "none",
            "-v", f"{build}:/wheelhouse:ro", "-v", f"{deps}:/deps:ro", "-v", f"{index}:/index:ro",
            "factory-base:forky", "sh", "-c", script,
        ],
        capture_output=True,
        text=True,
    )  # fmt: skip
    return {
        "rc": proc.returncode,
        "requirements": others,
        "stdout": proc.stdout.strip()[-2000:],
        "stderr": proc.stderr[-2000:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--cpus", type=float, default=None, help="CPUs per container (default: the host's)")
    parser.add_argument("--work", type=Path, default=factory_home() / "flash-attn-wheel")
    parser.add_argument("--max-shards", type=int, default=None, help="Run at most this many more shards.")
    parser.add_argument("--shards-only", action="store_true", help="Stop before the final build.")
    opts = parser.parse_args()
    store, index = opts.work / "store", opts.work / "index"
    fresh = not store.is_dir()
    store.mkdir(parents=True, exist_ok=True)
    if fresh:
        (opts.work / "store.id").unlink(missing_ok=True)
    results = load_results()
    current = store_id(opts.work)
    for key in forget_other_stores(results, current):
        print(f"shard {key}: recorded against another store; running it again")
    results["shard_count"] = opts.shards
    matrix = work_matrix(opts.work, index)
    cpus = [] if opts.cpus is None else ["--cpus", str(opts.cpus)]
    ran = 0
    for i in range(1, opts.shards + 1):
        key = f"{i}/{opts.shards}"
        if results["shards"].get(key, {}).get("result") == "ok":
            continue
        if opts.max_shards is not None and ran >= opts.max_shards:
            print(f"stopping after {ran} shards (--max-shards)")
            return 0
        out = opts.work / f"shard-{i}-of-{opts.shards}"
        rc, wall = factory_build(matrix, ["--shard", key, "--cache", str(store), "--output", str(out), *cpus])
        results["shards"][key] = {
            **summarize(out / "report.json", wall, rc),
            "store": current,
            "finished": time.time(),
        }
        save_results(results)
        ran += 1
        print(f"shard {key}: {results['shards'][key]['result']} in {wall:.0f}s")
    if opts.shards_only:
        return 0
    final = results.get("final")
    if not (final and final["result"] == "ok" and final["wheel"] and final.get("store") == current):
        # The wheel is built (and published) once per store; a failed install alone is tried again.
        out = opts.work / "final"
        rc, wall = factory_build(matrix, ["--cache", str(store), "--output", str(out), "--publish", *cpus])
        final = {
            **summarize(out / "report.json", wall, rc),
            "store": current,
            "finished": time.time(),
        }
    if final["result"] == "ok" and final["wheel"]:
        final["install"] = install_from_index(index, final["wheel"])
    results["final"] = final
    save_results(results)
    print(json.dumps({k: v for k, v in final.items() if k != "compiles"}, indent=2))
    return 0 if final["result"] == "ok" and final.get("install", {}).get("rc") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
