"""`make bench-shard`: one 4-arch flash-attn wheel's compiles sharded over 1, 4 and 8 runners, in the model.

The 72 kernel compiles of `bench.model` (measured courses, the seed's time scale) on runners of RUNNER_GIB /
RUNNER_CORES each, under the factory's own admission and OOM retries (`simulate_factory`), as
`factory build --shard I/N` runs them: every shard is one runner compiling its share, balanced by
`factory.plan.shard.partition` on the weights a shard job has, then one final job links from the cache.

  one runner     the profiled build of all 72 compiles on one runner (its profile learned by a first build)
  sharded        setup + the slowest shard + the final job (setup, link, package, check: FINAL_S)
  target         sharded <= 1.25 x ((one runner + setup) / N + setup + FINAL_S)

The model is deterministic: one run gives the figures. Writes bench/results/shard.json and prints the table
docs/BENCHMARKS.md quotes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench import model as M
from factory.memory import simulate as S
from factory.plan import shard as sharding

RESULTS = Path(__file__).resolve().parent / "results" / "shard.json"
GIB = 1 << 30
RUNNER_GIB = 24  # like the project's own CI runners (2 CPUs / 24 GiB)
RUNNER_CORES = 2
RUNNER_THREADS = 2  # NVCC_THREADS on a 2-CPU runner: one arch per core
RUNNERS = (1, 4, 8)
# each job's fixed part before its compiles: the venv from the wheelhouse, the cache's sync, the C++ file
SETUP_S = 180.0
# the final job after its setup: every nvcc compile a cache hit, then the link, the wheel, its checks
FINAL_S = 240.0
TARGET = 1.25


def runner_kw() -> dict[str, object]:
    return {
        "limit_bytes": RUNNER_GIB * GIB,
        "cores": RUNNER_CORES,
        "base_bytes": M.BASE_BYTES,
        "archs": M.ARCHS,
        "nvcc_threads": RUNNER_THREADS,
        "per_arch_bytes": M.per_arch_estimate_bytes(),
    }


def weights_by(basis: str, tasks: Sequence[S.Task], learned: Mapping[str, object]) -> dict[str, float]:
    """What a shard job balances on: the learned profile's times, the recipe's per-file seconds, or 1 each
    (`factory.plan.shard.unit_weights` with the same inputs)."""
    names = [t.name for t in tasks]
    if basis == "profile":
        return {n: float(learned[n].wall_s or 0.0) for n in names}  # type: ignore[attr-defined]
    if basis == "recipe":
        w = sharding.recipe_weights(names, M.per_file_seconds())
        assert w is not None
        return w
    return dict.fromkeys(names, 1.0)


def sharded_run(
    tasks: Sequence[S.Task], learned: Mapping[str, object], *, runners: int, basis: str
) -> dict[str, object]:
    by_name = {t.name: t for t in tasks}
    shards = sharding.partition(weights_by(basis, tasks, learned), runners)
    spans = []
    kills = 0
    for names in shards:
        if not names:
            spans.append(0.0)
            continue
        r, _ = S.simulate_factory([by_name[n] for n in names], profile=learned, **runner_kw())  # type: ignore[arg-type]
        if r.failed:
            raise AssertionError(f"a shard of {runners} failed in the model")
        spans.append(r.makespan_s)
        kills += r.oom_kills
    return {
        "shard_makespans_s": [round(s, 1) for s in spans],
        "slowest_s": round(max(spans), 1),
        "oom_kills": kills,
    }


def run_model() -> dict[str, object]:
    tasks = M.flash_attn_tasks(scale=M.time_scale(), threads=RUNNER_THREADS)
    # the first build on one runner learns the profile the shards balance on
    cold, learned = S.simulate_factory(tasks, **M.first_build_knows(), **runner_kw())  # type: ignore[arg-type]
    one, _ = S.simulate_factory(tasks, profile=learned, **runner_kw())  # type: ignore[arg-type]
    rows = []
    for n in RUNNERS:
        row: dict[str, object] = {"runners": n}
        for basis in ("profile", "recipe", "count"):
            run = sharded_run(tasks, learned, runners=n, basis=basis)
            sharded = SETUP_S + float(run["slowest_s"]) + SETUP_S + FINAL_S  # type: ignore[arg-type]
            bound = (one.makespan_s + SETUP_S) / n + SETUP_S + FINAL_S
            row[basis] = {
                **run,
                "sharded_makespan_s": round(sharded, 1),
                "ideal_s": round(bound, 1),
                "ratio": round(sharded / bound, 3),
                # the formula on compiles alone: slowest shard + link against one runner / N + link
                "ratio_compiles_only": round(
                    (float(run["slowest_s"]) + FINAL_S) / (one.makespan_s / n + FINAL_S),  # type: ignore[arg-type]
                    3,
                ),
            }
        rows.append(row)
    return {
        "runner": f"{RUNNER_GIB} GiB / {RUNNER_CORES} CPUs, NVCC_THREADS={RUNNER_THREADS}",
        "compiles": len(tasks),
        "archs": M.ARCHS,
        "setup_s": SETUP_S,
        "final_s": FINAL_S,
        "target": TARGET,
        "first_build_s": round(cold.makespan_s, 1),
        "one_runner_s": round(one.makespan_s, 1),
        "one_runner_oom_kills": one.oom_kills,
        "rows": rows,
        "deterministic": True,
    }


def table(result: Mapping[str, object]) -> str:
    lines = [
        f"flash-attn 2.8.3, {result['compiles']} compiles x {result['archs']} archs, "
        f"runners of {result['runner']}; one runner: "
        f"{float(result['one_runner_s']) / 3600:.2f} h of compiles (profiled)",  # type: ignore[arg-type]
        "| runners | balanced by | slowest shard | sharded makespan | (one runner + setup) / N + final "
        "| ratio |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:  # type: ignore[attr-defined]
        for basis in ("profile", "recipe", "count"):
            r = row[basis]
            lines.append(
                f"| {row['runners']} | {basis} | {r['slowest_s'] / 60:.1f} min "
                f"| {r['sharded_makespan_s'] / 60:.1f} min | {r['ideal_s'] / 60:.1f} min | {r['ratio']:.2f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.shard")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    result = run_model()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": result}, indent=1, sort_keys=True) + "\n")
    print(table(result))
    worst = max(row[b]["ratio"] for row in result["rows"] for b in ("profile",))  # type: ignore[index,union-attr]
    print(f"worst ratio balanced by the profile: {worst:.2f} (target <= {TARGET})")
    print(f"written {args.out}")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
