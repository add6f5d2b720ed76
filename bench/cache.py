"""`make bench-cache`: the compile cache through the real factory, and in the flash-attn model.

Real part (dockerd, the forky builder image `factory-builder:cu13.0-forky-pypi`, real nvcc), per fixture (the
demo extension, kernel-dominated; memext at half scale, four translation units): one `factory build` of two
Pythons (3.13, then 3.14) of one variant from an empty `$FACTORY_HOME` and an empty directory store (the
first Python cold, the second warm), then the same matrix from another empty `$FACTORY_HOME` against the same
store (everything a hit). The cache's own overhead: memext's cold 3.13 job against the same job with
`--cache off`. Per job: the whole job's wall time (report.json: venv, build, checks, install check), the build
phase's (from the driver's `build` mark to its next mark, timed as the log grows), compiles cached/compiled.

Model part: the production matrix (4 variants x 4 Pythons) of flash-attn 2.8.3 on the seed's host, with and
without the cache (`model_matrix`).

Writes bench/results/cache.json and prints the figures docs/BENCHMARKS.md quotes. `--part model` alone runs
in seconds; `--part demo` takes 4-7 minutes on 2 busy cores, `memext` 3-4, `overhead` 1.5 per pair.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.matrices import DEMO, MEMEXT, matrix_text
from factory.container.protocol import parse_mark, parse_measurement
from factory.trust import signing
from factory.trust.cachekeys import SIGN_KEY_ENV

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "cache.json"
FACTORY = [sys.executable, "-m", "factory.cli"]
PYTHONS = ("3.13", "3.14")
MEMEXT_TUS = "heavy1,medium1,light1,light2"


def demo_matrix(pythons: tuple[str, ...]) -> str:
    return matrix_text(DEMO, matrix={"python": list(pythons), "arch": ["8.0"]}, publish=None)


def memext_matrix(pythons: tuple[str, ...]) -> str:
    env = {"MEMEXT_SCALE": "half", "MEMEXT_TUS": MEMEXT_TUS}
    return matrix_text(MEMEXT, matrix={"python": list(pythons), "include": [{"arch": "8.0", "env": env}]})


MATRICES = {"demo": demo_matrix, "memext": memext_matrix}


def fresh_home(parent: Path, name: str) -> Path:
    """An empty `$FACTORY_HOME` but for the wheelhouse cache (torch's wheels, keyed by their inputs)."""
    from factory.core.home import factory_home

    home = parent / name
    home.mkdir()
    shared = factory_home() / "wheelhouses"
    shared.mkdir(parents=True, exist_ok=True)
    (home / "wheelhouses").symlink_to(shared.resolve(), target_is_directory=True)
    return home


class PhaseClock:
    """The time each job's driver marks first appear in its log, read as the logs grow (the marks carry no
    time of their own)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.seen: dict[str, dict[str, float]] = {}
        self._offsets: dict[Path, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> PhaseClock:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._poll()

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self._poll()

    def _poll(self) -> None:
        now = time.monotonic()
        for log in self.home.glob("runs/*/logs/*.log"):
            try:
                with log.open("rb") as fh:
                    fh.seek(self._offsets.get(log, 0))
                    data = fh.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1
            self._offsets[log] = self._offsets.get(log, 0) + end
            for line in data[:end].decode(errors="replace").splitlines():
                fields = parse_mark(line)
                if fields and "phase" in fields:
                    self.seen.setdefault(log.stem, {}).setdefault(str(fields["phase"]), now)

    def build_phase_s(self, job_id: str) -> float | None:
        marks = self.seen.get(job_id, {})
        if "build" not in marks:
            return None
        later = [t for t in marks.values() if t > marks["build"]]
        return round(min(later) - marks["build"], 1) if later else None


def compile_lines(log: Path) -> list[dict[str, Any]]:
    """The job's measured compiles: tool, cache outcome, wall and CPU seconds."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = parse_measurement(line) if "::factory-compile::" in line else None
        if m is not None:
            out.append({"tool": m.tool, "cache": m.cache, "wall_s": round(m.wall_s, 2), "cpu_s": m.cpu_s})
    return out


# the store's private key (the homes stand for its trusted runners)
STORE_KEY = signing.generate_key()[0].decode()


def run_build(matrix: str, work: Path, name: str, *, store: Path | None, cache: str | None = None) -> dict:
    """One `factory build` from an empty home: per job its figures; the run's wall time."""
    home = fresh_home(work, f"home-{name}")
    path = work / f"{name}.yaml"
    path.write_text(matrix + (f"  cache: {store}\n" if store is not None else ""))
    args = [*FACTORY, "build", "--trust-paths", "--matrix", str(path), "--output", str(work / f"out-{name}")]
    if cache is not None:
        args += ["--cache", cache]
    start = time.monotonic()
    with PhaseClock(home) as clock:
        # the homes stand for trusted runners of one store: they hold its private key, as CI's do
        env = {**os.environ, "FACTORY_HOME": str(home), SIGN_KEY_ENV: STORE_KEY}
        proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env)
    wall = time.monotonic() - start
    report = work / f"out-{name}" / "report.json"
    if not report.is_file():
        raise SystemExit(f"{name}: no report.json\n{proc.stderr[-3000:]}")
    jobs = []
    for job in json.loads(report.read_text())["jobs"]:
        if job["result"] != "ok":
            raise SystemExit(f"{name}: {job['job_id']} {job['result']}: {job['reason']}\n{job['log_tail']}")
        jobs.append(
            {
                "python": job["python"],
                "wall_s": round(job["wall_s"], 1),
                "build_phase_s": clock.build_phase_s(job["job_id"]),
                "compiles_cached": job["compiles_cached"],
                "compiles_compiled": job["compiles_compiled"],
                "compiles": compile_lines(Path(job["log"])),
            }
        )
    return {"run_wall_s": round(wall, 1), "jobs": jobs}


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def fixture_runs(fixture: str, work: Path) -> dict[str, Any]:
    """Two Pythons cold then warm; the same matrix from an empty home against the same store."""
    store = work / f"store-{fixture}"
    matrix = MATRICES[fixture](PYTHONS)
    first = run_build(matrix, work, f"{fixture}-cold", store=store)
    rerun = run_build(matrix, work, f"{fixture}-store", store=store)
    one, two = first["jobs"]
    result = {
        "pythons_run": first,
        "empty_home_same_store": rerun,
        "second_over_first_wall": ratio(two["wall_s"], one["wall_s"]),
        "second_over_first_build_phase": ratio(two["build_phase_s"], one["build_phase_s"]),
        "second_python_kernels_all_hits": all(
            c["cache"] == "hit" for c in two["compiles"] if c["tool"] == "nvcc"
        ),
        "rerun_all_hits": all(j["compiles_compiled"] == 0 for j in rerun["jobs"]),
    }
    if fixture == "memext":
        off = run_build(MATRICES[fixture](PYTHONS[:1]), work, f"{fixture}-off", store=None, cache="off")
        (job,) = off["jobs"]
        result["cache_off"] = off
        result["overhead_cold_over_off_wall"] = ratio(one["wall_s"], job["wall_s"])
        result["overhead_cold_over_off_build_phase"] = ratio(one["build_phase_s"], job["build_phase_s"])
    return result


def overhead_pairs(work: Path, pairs: int) -> dict[str, Any]:
    """memext 3.13 from an empty home, cache on (an empty store: every lookup a miss) and `--cache off`,
    alternately (on first, then off first), so the machine's drift falls on both alike."""
    matrix = MATRICES["memext"](PYTHONS[:1])
    runs = []
    for i in range(pairs):
        order = ("on", "off") if i % 2 == 0 else ("off", "on")
        pair: dict[str, Any] = {}
        for mode in order:
            name = f"overhead{i}-{mode}"
            if mode == "on":
                run = run_build(matrix, work, name, store=work / f"store-{name}")
            else:
                run = run_build(matrix, work, name, store=None, cache="off")
            (job,) = run["jobs"]
            pair[mode] = {
                "wall_s": job["wall_s"],
                "build_phase_s": job["build_phase_s"],
                "nvcc_cpu_s": round(sum(c["cpu_s"] or 0 for c in job["compiles"] if c["tool"] == "nvcc"), 2),
                "load": os.getloadavg()[0],
            }
        pair["wall_ratio"] = ratio(pair["on"]["wall_s"], pair["off"]["wall_s"])
        pair["build_phase_ratio"] = ratio(pair["on"]["build_phase_s"], pair["off"]["build_phase_s"])
        pair["nvcc_cpu_ratio"] = ratio(pair["on"]["nvcc_cpu_s"], pair["off"]["nvcc_cpu_s"])
        runs.append(pair)
    return {
        "pairs": runs,
        **{
            f"median_{k}": statistics.median([p[k] for p in runs if p[k] is not None] or [0.0])
            for k in ("wall_ratio", "build_phase_ratio", "nvcc_cpu_ratio")
        },
    }


# --- the flash-attn model ----------------------------------------------------------------------------------

VARIANTS = 4
MODEL_PYTHONS = 4


def model_matrix(host_compile_s: float, link_s: float) -> dict[str, Any]:
    """flash-attn 2.8.3's production matrix on the seed's host, one job at a time (as `build.concurrency: 1`),
    with and without the cache. Without: 16 full builds (72 kernel files x 4 archs each, the factory's
    profiled schedule of bench/model.py, plus flash_api.cpp and the link). With: per variant one full build,
    then 3 builds that compile only flash_api.cpp (it includes torch/python.h) and link: the 72 kernel files
    include no Python header, so their objects are hits. Venv creation, the checks and the install check are
    the same in both and left out."""
    from bench import model as M
    from factory.memory import simulate as S

    tasks = M.flash_attn_tasks(scale=M.time_scale())
    kw = {"limit_bytes": M.HOST_BYTES, "cores": M.CORES, "base_bytes": M.BASE_BYTES}
    fkw = {
        "archs": M.ARCHS,
        "nvcc_threads": M.NVCC_THREADS,
        "per_arch_bytes": M.per_arch_estimate_bytes(),
        **kw,
    }
    _, learned = S.simulate_factory(tasks, **M.first_build_knows(), **fkw)
    kernels, _ = S.simulate_factory(tasks, profile=learned, **fkw)
    kernel_cpu_s = sum(t.cpu_s for t in tasks)
    # flash_api.cpp alone after the kernels (ninja starts it among them; the makespan is bound by the kernels)
    full_s = kernels.makespan_s + link_s
    python_only_s = host_compile_s + link_s
    jobs = VARIANTS * MODEL_PYTHONS
    full_cpu_s = kernel_cpu_s + host_compile_s + link_s
    without = {"makespan_s": round(jobs * full_s, 1), "cpu_s": round(jobs * full_cpu_s, 1)}
    with_cache = {
        "makespan_s": round(VARIANTS * (full_s + (MODEL_PYTHONS - 1) * python_only_s), 1),
        "cpu_s": round(VARIANTS * (full_cpu_s + (MODEL_PYTHONS - 1) * python_only_s), 1),
    }
    return {
        "jobs": jobs,
        "kernel_files": len(tasks),
        "full_build_kernels_makespan_s": round(kernels.makespan_s, 1),
        "full_build_kernels_cpu_s": round(kernel_cpu_s, 1),
        "host_compile_s": round(host_compile_s, 1),
        "link_s": round(link_s, 1),
        "without_cache": without,
        "with_cache": with_cache,
        "makespan_ratio": ratio(with_cache["makespan_s"], without["makespan_s"]),
        "cpu_ratio": ratio(with_cache["cpu_s"], without["cpu_s"]),
    }


def seed_host_seconds(measured_cpu_s: float) -> float:
    """CPU seconds measured on this 2-core machine, on the seed's faster cores (bench/model.py's scale)."""
    from bench import model as M

    return measured_cpu_s * M.time_scale()


def save(results: dict[str, Any], path: Path) -> dict[str, Any]:
    """Merged into what the file holds (the parts may run one at a time, or side by side)."""
    merged = json.loads(path.read_text()) if path.is_file() else {}
    merged.update(results)
    path.write_text(json.dumps(merged, indent=2) + "\n")
    return merged


def brief(value: Any) -> Any:
    if isinstance(value, dict) and isinstance(value.get("jobs"), list):
        return {**value, "jobs": [{k: v for k, v in j.items() if k != "compiles"} for j in value["jobs"]]}
    return value


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """The figures docs/BENCHMARKS.md quotes (no per-compile lines)."""
    out: dict[str, Any] = {}
    for name, value in results.items():
        if isinstance(value, dict):
            out[name] = {k: brief(v) for k, v in value.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("demo", "memext", "overhead", "model", "all"), default="all")
    parser.add_argument("--work", type=Path, default=None, help="where homes, stores and wheels go")
    parser.add_argument(
        "--host-compile-cpu-s",
        type=float,
        default=None,
        help="the measured CPU seconds of one host compile of a torch/extension.h binding (default: the demo "
        "run's bindings.cpp, from cache.json)",
    )
    parser.add_argument("--pairs", type=int, default=2, help="cache on/off pairs of the overhead part")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the JSON file (a repetition's own)")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-cache-"))
    work.mkdir(parents=True, exist_ok=True)
    for fixture in ("demo", "memext"):
        if args.part in (fixture, "all"):
            start, load = time.monotonic(), os.getloadavg()
            results[fixture] = fixture_runs(fixture, work)
            results[fixture]["load_before"] = load
            results[fixture]["load_after"] = os.getloadavg()
            results[fixture]["bench_wall_s"] = round(time.monotonic() - start, 1)
            results = save(results, args.results)
    if args.part in ("overhead", "all"):
        results["overhead"] = overhead_pairs(work, args.pairs)
        results = save(results, args.results)
    if args.part in ("model", "all"):
        cpu = args.host_compile_cpu_s
        known = {**(json.loads(args.results.read_text()) if args.results.is_file() else {}), **results}
        if cpu is None:
            cxx = [
                c["cpu_s"]
                for c in known["demo"]["pythons_run"]["jobs"][0]["compiles"]
                if c["tool"] == "cxx" and c["cpu_s"]
            ]
            cpu = max(cxx)
        # the link and setup.py around it: the build phase of the demo's all-hit job (lookups, link, the
        # build_ext steps), wall seconds on this machine taken as CPU seconds: an upper bound
        link = max(j["build_phase_s"] for j in known["demo"]["empty_home_same_store"]["jobs"])
        results["model"] = {
            "host_compile_measured_cpu_s": cpu,
            "link_measured_s": link,
            **model_matrix(seed_host_seconds(cpu), seed_host_seconds(link)),
            # flash_api.cpp includes more of torch than the demo's binding (torch/nn/functional.h too)
            "host_compile_doubled": model_matrix(2 * seed_host_seconds(cpu), seed_host_seconds(link)),
        }
    print(json.dumps(summary(save(results, args.results)), indent=1))


if __name__ == "__main__":
    main()
