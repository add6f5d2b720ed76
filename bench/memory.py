"""`make bench-memory`: the memory strategies on the real fixture and in the flash-attn model.

Writes bench/results/memory.json ({"real": ..., "model": ...}, each with limit_bytes, lower_bound_s and
strategies) and prints the table docs/BENCHMARKS.md quotes. `--model-only` skips the real part (it needs root,
cgroup v1 and nvcc, and takes several minutes).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from bench import model as M
from bench.offline import best_offline
from factory.memory import simulate as S

RESULTS = Path(__file__).resolve().parent / "results" / "memory.json"


OFFLINE_TRIES = 3000


class SeedNotReproduced(AssertionError):
    pass


# other hosts for the same 72 compiles: (GiB, cores)
OTHER_HOSTS = ((256, 64), (128, 64), (64, 16))
# the profiled build replayed on a machine where every compile takes this much longer than its profile says
SLOW_MACHINE = 1.3


@dataclass(frozen=True, kw_only=True)
class HostRuns:
    """The factory's builds of the 72 compiles on one host, and the best fixed MAX_JOBS there."""

    gib: int
    cores: int
    lower_bound_s: float
    cold: S.StrategyResult  # the first build, with the recipe's per-file table
    warm: S.StrategyResult  # the profiled build
    slow: S.StrategyResult  # the profiled build on a machine SLOW_MACHINE times slower than its profile
    best: S.StrategyResult

    def to_json(self) -> dict[str, object]:
        return {
            "host": f"{self.gib} GiB / {self.cores} cores",
            "lower_bound_s": round(self.lower_bound_s, 1),
            "best_fixed_s": round(self.best.makespan_s, 1),
            "best_fixed_jobs": self.best.jobs,
            "factory_cold_s": round(self.cold.makespan_s, 1),
            "factory_s": round(self.warm.makespan_s, 1),
            "factory_oom_kills": self.cold.oom_kills + self.warm.oom_kills,
            "slow_machine_s": round(self.slow.makespan_s, 1),
            "slow_machine_oom_kills": self.slow.oom_kills,
        }


def host_runs(tasks: list[S.Task], *, gib: int, cores: int) -> HostRuns:
    kw = {"limit_bytes": gib * 2**30, "cores": cores, "base_bytes": M.BASE_BYTES}
    fkw = {
        "archs": M.ARCHS,
        "nvcc_threads": M.NVCC_THREADS,
        "per_arch_bytes": M.per_arch_estimate_bytes(),
        **kw,
    }
    cold, learned = S.simulate_factory(tasks, **M.first_build_knows(), **fkw)
    warm, _ = S.simulate_factory(tasks, profile=learned, **fkw)
    slow_tasks = [
        S.Task(name=t.name, phases=tuple((d * SLOW_MACHINE, m, n) for d, m, n in t.phases)) for t in tasks
    ]
    slow, _ = S.simulate_factory(slow_tasks, profile=learned, **fkw)
    return HostRuns(
        gib=gib,
        cores=cores,
        lower_bound_s=S.lower_bound(tasks, limit_bytes=gib * 2**30, cores=cores),
        cold=cold,
        warm=warm,
        slow=slow,
        best=S.simulate_best_fixed(tasks, **kw),
    )


def run_model() -> dict[str, object]:
    scale = M.time_scale()
    tasks = M.flash_attn_tasks(scale=scale)
    kw = {"limit_bytes": M.HOST_BYTES, "cores": M.CORES, "base_bytes": M.BASE_BYTES}
    f32 = S.simulate_fixed(tasks, jobs=M.SEED_OOM_JOBS, **kw)
    f20 = S.simulate_fixed(tasks, jobs=M.SEED_PASS_JOBS, **kw)
    # the model only counts if it reproduces the seed: MAX_JOBS=32 OOM-killed, 20 passed
    if not (f32.failed and not f20.failed):
        raise SeedNotReproduced(
            f"model does not reproduce the seed: 32 failed={f32.failed}, 20 failed={f20.failed}"
        )
    fkw = {
        "archs": M.ARCHS,
        "nvcc_threads": M.NVCC_THREADS,
        "per_arch_bytes": M.per_arch_estimate_bytes(),
        **kw,
    }
    # the first build knows the recipe's per-file table; the steady state, the profile learned by it
    main = host_runs(tasks, gib=M.HOST_BYTES >> 30, cores=M.CORES)
    cold, warm, best = main.cold, main.warm, main.best
    # the first build with only the recipe's single per-arch figure (before per-file estimates), and without
    # the recipe's after-peak fraction
    knows = M.first_build_knows()
    cold_single, _ = S.simulate_factory(tasks, **{**knows, "by_file": ()}, **fkw)
    cold_no_after, _ = S.simulate_factory(tasks, **{**knows, "after_peak": None}, **fkw)
    cold_no_order, _ = S.simulate_factory(tasks, **{**knows, "seconds_by_file": ()}, **fkw)
    heuristic_jobs = S.flash_attn_heuristic_jobs(cores=M.CORES, free_bytes=M.HOST_BYTES - M.BASE_BYTES)
    seed = S.simulate_seed_halving(tasks, **kw)
    # the reference: the best schedule an offline search finds knowing every course, cores not shared
    offline = best_offline(
        tasks, limit_bytes=M.HOST_BYTES, cores=M.CORES, base_bytes=M.BASE_BYTES, tries=OFFLINE_TRIES
    )
    strategies = {
        "factory": warm,
        "factory_cold": cold,
        "fixed_cores": S.simulate_fixed(tasks, jobs=M.CORES, **kw),
        "best_fixed": best,
        "seed_halving": seed,
        "flash_attn_heuristic": S.simulate_fixed(tasks, jobs=heuristic_jobs, **kw),
        "fixed_32": f32,
        "fixed_20": f20,
    }
    return {
        "limit_bytes": M.HOST_BYTES,
        "lower_bound_s": round(main.lower_bound_s, 1),
        "strategies": {k: v.to_json() for k, v in strategies.items()},
        "cores": M.CORES,
        "notes": {
            "time_scale": round(scale, 4),
            "best_fixed_jobs": best.jobs,
            "flash_attn_heuristic_jobs": heuristic_jobs,
            "seed_halving": list(seed.attempts),
            "factory_attempts": list(warm.attempts),
            "factory_cold_attempts": list(cold.attempts),
            "factory_cold_single_estimate": cold_single.to_json(),
            "factory_cold_without_after_peak": cold_no_after.to_json(),
            "factory_cold_without_seconds_by_file": cold_no_order.to_json(),
            "after_peak": M.after_peak(),
            "best_offline_s": offline.makespan_s,
            "best_offline_orders": offline.orders_tried,
            "measured_courses": [c.file for c in M.measured_courses()],
            "hosts": [
                h.to_json() for h in (main, *(host_runs(tasks, gib=g, cores=c) for g, c in OTHER_HOSTS))
            ],
        },
    }


def table(name: str, part: dict[str, object]) -> str:
    lb = float(part["lower_bound_s"])  # type: ignore[arg-type]
    # the real part's bounds from each build's own compiles (bench.real.compiles_bound)
    own: dict[str, float] = part.get("notes", {}).get("own_lower_bound_s", {})  # type: ignore[attr-defined]
    rows = [
        f"{name}: limit {int(part['limit_bytes']) / 2**30:.2f} GiB, lower bound {lb:.0f} s",  # type: ignore[call-overload]
        "| strategy | makespan s | x lower bound | OOM kills | failed | peak GiB |"
        + (" own bound s | x own bound |" if own else ""),
        "|---|---|---|---|---|---|" + ("---|---|" if own else ""),
    ]
    for key, r in part["strategies"].items():  # type: ignore[attr-defined]
        # a failed build has no makespan to compare: its time is only how long it ran until it failed
        ratio = "—" if r["failed"] else f"{r['makespan_s'] / lb:.2f}"
        row = (
            f"| {key} | {r['makespan_s']:.0f} | {ratio} | {r['oom_kills']} | "
            f"{'yes' if r['failed'] else 'no'} | {r['peak_bytes'] / 2**30:.2f} |"
        )
        if own:
            row += f" {own[key]:.0f} | {r['makespan_s'] / own[key]:.2f} |" if key in own else " — | — |"
        rows.append(row)
    side = part.get("notes", {}).get("side_by_side_reference")  # type: ignore[attr-defined]
    if side:
        factory = float(part["strategies"]["factory"]["makespan_s"])  # type: ignore[index]
        bound = float(side["lower_bound_s"])
        rows.append(
            f"side-by-side reference ({side['jobs']} jobs, no limit): lower bound {bound:.1f} s,"
            f" factory {factory / bound:.3f}x; its compiles' CPU"
            f" {' / '.join(f'{x:.3f}' for x in side['compiles_cpu_x_one_at_a_time'])}x one at a time"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory")
    parser.add_argument("--model-only", action="store_true")
    parser.add_argument("--work", type=Path, default=Path("/tmp/factory-bench-memory"))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    results: dict[str, object] = {}
    if not args.model_only:
        from bench import real

        if real.host_nvcc() is None or not real.cgroup_v1_available():
            print(
                "bench-memory: the real part needs nvcc and a writable cgroup v1 memory controller",
                file=sys.stderr,
            )
            return 2
        results["real"] = real.run_real(work=args.work)
    elif args.out.exists():
        # keep the figures of the last real run, marked as such, rather than dropping them
        try:
            previous = json.loads(args.out.read_text()).get("real")
        except (ValueError, AttributeError):
            previous = None
        if isinstance(previous, dict):
            previous.setdefault("notes", {})["from_previous_run"] = True
            results["real"] = previous
    results["model"] = run_model()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    for name, part in results.items():
        print(table(name, part))  # type: ignore[arg-type]
        print()
    for h in results["model"]["notes"]["hosts"]:  # type: ignore[index]
        print(h)
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
