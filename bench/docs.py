"""docs/BENCHMARKS.md's tables, rendered from bench/results/*.json.

Each generated table sits between two marker comments, `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`;
`python -m bench.docs` (`make bench-docs`) rewrites what is between them from the results files and leaves the
prose around them alone. `--check` rewrites nothing and exits 1 when the file is not what the results render
(tests/unit/bench/test_bench_docs.py runs the same check in CI).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "BENCHMARKS.md"
RESULTS = ROOT / "bench" / "results"

GIB = 2**30
MARKER = re.compile(r"<!-- (/?)bench:([a-z0-9-]+) -->")


class DocsError(Exception):
    """A marker, or a results file a table needs, that is missing or malformed."""


Json = dict[str, Any]


def load(results: Path, name: str) -> Json:
    path = results / name
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise DocsError(f"{path}: {e.strerror}") from None
    except ValueError as e:
        raise DocsError(f"{path}: not JSON: {e}") from None
    if not isinstance(data, dict):
        raise DocsError(f"{path}: not a JSON object")
    return data


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table; an empty cell is written `| |`."""

    def line(cells: Sequence[object]) -> str:
        return "|" + "".join(f" {c} |" if c != "" else " |" for c in cells)

    return "\n".join([line(header), "|" + "---|" * len(header), *(line(row) for row in rows)])


def fixed(x: float, digits: int) -> str:
    """`x` to `digits` decimals, halves rounded up as by hand (1026.5 -> 1027; format() gives 1026)."""
    return str(Decimal(repr(x)).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def num(x: float) -> str:
    """One or two decimals: 41.15, 32.1, 31.0."""
    text = fixed(x, 2)
    return text[:-1] if text.endswith("0") else text


def spread(values: Sequence[float], digits: int) -> str:
    return f"{fixed(min(values), digits)}-{fixed(max(values), digits)}"


# --- Memory: the model at the seed's scale (memory.json "model") ---


def _jobs_of(attempts: Sequence[str]) -> list[int]:
    """[128, 64] from the seed loop's notes, "MAX_JOBS=128: OOM after 10 s", ..."""
    return [int(m.group(1)) for a in attempts if (m := re.match(r"MAX_JOBS=(\d+)", a))]


def memory_model(results: Path) -> str:
    model = load(results, "memory.json")["model"]
    lb = float(model["lower_bound_s"])
    notes = model["notes"]
    strategies = model["strategies"]
    labels = {
        "best_fixed": f"best_fixed ({notes['best_fixed_jobs']} jobs)",
        "seed_halving": f"seed_halving ({', '.join(map(str, _jobs_of(notes['seed_halving'])))})",
        "flash_attn_heuristic": f"flash_attn_heuristic ({notes['flash_attn_heuristic_jobs']} jobs)",
    }
    order = ["factory", "factory_cold", "fixed_cores", "best_fixed", "seed_halving", "flash_attn_heuristic"]
    order += sorted((k for k in strategies if k not in order), key=lambda k: -int(k.rpartition("_")[2]))
    rows: list[list[object]] = []
    for key in order:
        r = strategies[key]
        rows.append(
            [
                labels.get(key, key),
                fixed(r["makespan_s"], 0),
                "—" if r["failed"] else fixed(r["makespan_s"] / lb, 2),
                r["oom_kills"],
                "yes" if r["failed"] else "no",
                fixed(r["peak_bytes"] / GIB, 2),
            ]
        )
    offline = float(notes["best_offline_s"])
    rows.append(
        ["*offline reference (not a strategy)*", fixed(offline, 0), fixed(offline / lb, 2), "—", "—", "—"]
    )
    head = f"limit {fixed(int(model['limit_bytes']) / GIB, 0)} GiB, lower bound {fixed(lb, 0)} s:\n\n"
    return head + table(["strategy", "makespan s", "x lower bound", "OOM kills", "failed", "peak GiB"], rows)


def memory_targets(results: Path) -> str:
    model = load(results, "memory.json")["model"]
    lb = float(model["lower_bound_s"])
    s = model["strategies"]
    seed = float(s["seed_halving"]["makespan_s"])
    best = float(s["best_fixed"]["makespan_s"])

    def mark(ok: bool) -> str:
        return "✓" if ok else "✗"

    cols = [s["factory"], s["factory_cold"]]
    rows = [
        ["0 OOM-failed builds", *(f"{mark(c['oom_kills'] == 0)} {c['oom_kills']} kills" for c in cols)],
        [
            "≥ 2x faster than the seed's loop",
            *(
                f"{mark(seed / c['makespan_s'] >= 2)} {fixed(seed / c['makespan_s'], 2)}x "
                f"({fixed(seed, 0)} / {fixed(c['makespan_s'], 0)})"
                for c in cols
            ),
        ],
        [
            "never slower than the best fixed `MAX_JOBS`",
            *(
                f"{mark(c['makespan_s'] <= best)} {fixed(c['makespan_s'], 0)} s vs {fixed(best, 0)} s"
                for c in cols
            ),
        ],
        [
            "makespan ≤ 1.10x the lower bound",
            *(
                f"{mark(c['makespan_s'] / lb <= 1.10)} {fixed(c['makespan_s'] / lb, 3)}x "
                f"({c['makespan_s']} / {lb})"
                for c in cols
            ),
        ],
    ]
    return table(["target", "factory (profiled)", "factory_cold (first build)"], rows)


def memory_hosts(results: Path) -> str:
    hosts = load(results, "memory.json")["model"]["notes"]["hosts"]
    rows = [
        [
            h["host"],
            fixed(h["lower_bound_s"], 0),
            f"{fixed(h['best_fixed_s'], 0)} ({h['best_fixed_jobs']})",
            fixed(h["factory_cold_s"], 0),
            fixed(h["factory_s"], 0),
            fixed(h["factory_s"] / h["lower_bound_s"], 2),
            f"{fixed(h['slow_machine_s'], 0)}, {h['slow_machine_oom_kills']}",
        ]
        for h in hosts
    ]
    return table(
        [
            "host",
            "lower bound s",
            "best fixed s (jobs)",
            "first build s",
            "factory s",
            "x bound",
            "profile 1.3x too fast: s, OOM",
        ],
        rows,
    )


def _cold_variants(model: Json) -> list[tuple[str, float]]:
    notes = model["notes"]
    return [
        ("recipe's per-file table, 432 GiB / 128 cores", model["strategies"]["factory_cold"]["makespan_s"]),
        ("single per-arch figure", notes["factory_cold_single_estimate"]["makespan_s"]),
        ("without the after-peak fraction", notes["factory_cold_without_after_peak"]["makespan_s"]),
        ("without the per-file times", notes["factory_cold_without_seconds_by_file"]["makespan_s"]),
        *((h["host"], h["factory_cold_s"]) for h in notes["hosts"][1:]),
    ]


def memory_metered_model(results: Path) -> str:
    """The model's first builds before metered starts (run 17's file) and with them (memory_metered.json)."""
    before = _cold_variants(load(results, "memory_run17.json")["model"])
    after = _cold_variants(load(results, "memory_metered.json")["model"])
    rows = [[name, fixed(b, 1), fixed(a, 1)] for (name, b), (_, a) in zip(before, after, strict=True)]
    return table(["first build", "before", "metered"], rows)


# The "after the peak" column: the most RSS once the compile has fallen to this fraction of its peak (cicc's
# front end done; any threshold from 0.35 to 0.45 gives the same figures for the ten courses).
COURSE_FELL = 0.4


def flash_attn_courses(results: Path) -> str:
    """The measured flash-attn compiles (bench/data/flash-attn-courses, beside bench/results)."""
    order = {"fwd": 0, "bwd": 1, "fwd_split": 2}
    rows: list[tuple[tuple[int, int], list[object]]] = []
    for path in sorted((results.parent / "data" / "flash-attn-courses").glob("*.json")):
        data = load(path.parent, path.name)
        m = re.match(r"(flash_(fwd_split|fwd|bwd)_hdim(\d+))_", data["file"])
        if m is None:
            raise DocsError(f"{path}: not a flash-attn kernel file: {data['file']}")
        samples = data["samples"]
        total = max(float(data["cpu_s"]), float(samples[-1][1]))
        rss = [int(s[2]) for s in samples]
        peak = max(rss)
        top = rss.index(peak)
        fell = next((i for i in range(top, len(rss)) if rss[i] <= COURSE_FELL * peak), None)
        if fell is None:
            raise DocsError(f"{path}: the compile never fell to {COURSE_FELL:.0%} of its peak")
        rows.append(
            (
                (order[m.group(2)], int(m.group(3))),
                [
                    m.group(1),
                    fixed(data["cpu_s"], 0),
                    fixed(data["peak_bytes"] / GIB, 2),
                    f"{fixed(100 * samples[top][1] / total, 0)}%",
                    f"{fixed(100 * max(rss[fell:]) / peak, 0)}%",
                ],
            )
        )
    rows.sort(key=lambda r: r[0])
    cells = [r for _, r in rows]
    if cells:
        cells[0][-1] = f"{cells[0][-1]} of it"
    return table(["file (fp16, sm_80)", "CPU s", "peak GiB", "peak at", "after the peak, at most"], cells)


# --- Memory: the real part (memext under a cgroup limit) ---


def memory_real(results: Path, name: str) -> str:
    real = load(results, name)["real"]
    notes = real["notes"]
    lb = float(real["lower_bound_s"])
    own: Mapping[str, float] = notes.get("own_lower_bound_s", {})
    strategies = real["strategies"]
    before_after = notes.get("one_at_a_time_before_after_s")
    labels = {
        "fixed_cores": f"fixed_cores ({real['cores']} jobs)",
        "best_fixed": f"best_fixed ({notes['best_fixed_jobs']} job"
        + ("s" if notes["best_fixed_jobs"] != 1 else "")
        + (f"; {before_after[0]} s before, {before_after[1]} s after" if before_after else "")
        + ")",
        "seed_halving": f"seed_halving ({', '.join(map(str, notes['seed_halving_jobs']))})",
        "factory": "factory (profiled)",
    }
    rows: list[list[object]] = []
    for key in ("fixed_cores", "best_fixed", "seed_halving", "factory", "factory_cold"):
        if key not in strategies:
            continue
        r = strategies[key]
        digits = 3 if key == "factory" else 2
        ratio = "failed" if r["failed"] else fixed(r["makespan_s"] / lb, digits)
        own_s = own.get(key)
        rows.append(
            [
                labels.get(key, key),
                fixed(r["makespan_s"], 1),
                f"**{ratio}**" if key == "factory" else ratio,
                r["oom_kills"],
                fixed(r["peak_bytes"] / GIB, 2),
                "—" if own_s is None or r["failed"] else fixed(own_s, 1),
                "—" if own_s is None or r["failed"] else fixed(r["makespan_s"] / own_s, digits),
            ]
        )
    single = notes.get("factory_cold_single_estimate")
    if single:
        rows.append(
            [
                "factory_cold, single per-arch figure",
                fixed(single["makespan_s"], 1),
                "—",
                single["oom_kills"],
                fixed(single["peak_bytes"] / GIB, 2),
                "—",
                "—",
            ]
        )
    head = f"limit {fixed(int(real['limit_bytes']) / GIB, 2)} GiB; reference bound {fixed(lb, 1)} s"
    bounds = notes.get("lower_bound_before_after_s")
    if bounds:
        head += f" ({fixed(bounds[0], 1)} s before, {fixed(bounds[1], 1)} s after)"
    return (
        head
        + ":\n\n"
        + table(
            [
                "strategy",
                "makespan s",
                "x reference bound",
                "OOM kills",
                "peak GiB",
                "own bound s",
                "x own bound",
            ],
            rows,
        )
    )


def memory_metered_runs(results: Path) -> str:
    rows = []
    for run in (1, 2, 3):
        real = load(results, f"memory_metered_run{run}.json")["real"]
        lb = float(real["lower_bound_s"])
        s = real["strategies"]
        cold = s["factory_cold"]
        rows.append(
            [
                run,
                fixed(lb, 1),
                fixed(cold["makespan_s"], 1),
                fixed(cold["makespan_s"] / lb, 2),
                cold["oom_kills"],
                fixed(cold["peak_bytes"] / GIB, 2),
                fixed(s["factory"]["makespan_s"] / lb, 2),
                fixed(s["best_fixed"]["makespan_s"] / lb, 2),
                fixed(real["notes"]["factory_cold_single_estimate"]["makespan_s"], 1),
            ]
        )
    return table(
        [
            "run",
            "lower bound s",
            "factory_cold s",
            "x bound",
            "OOM kills",
            "peak GiB",
            "factory (profiled) x",
            "best fixed x",
            "single per-arch figure s",
        ],
        rows,
    )


def side_by_side(results: Path) -> str:
    data = load(results, "side_by_side.json")
    rows = []
    for entry in data.values():
        s = entry["summary"]
        rows.append(
            [
                f"{entry['first']} ({entry['second']})",
                s["rounds"],
                fixed(s["alone_median_cpu_s"], 2),
                fixed(s["side_by_side_median_cpu_s"], 2),
                f"{fixed(s['paired_x'], 3)}x",
                f"{fixed(s['alone_spread'], 2)}x",
            ]
        )
    return table(
        [
            "TU (started beside it)",
            "rounds",
            "alone, median CPU s",
            "beside, median CPU s",
            "per round, median",
            "alone, slowest / fastest round",
        ],
        rows,
    )


# --- Serve under load ---


def _seconds(x: float) -> str:
    if x >= 1:
        return fixed(x, 1)
    return fixed(x, 2) if x >= 0.01 else fixed(x, 3)


def _serve_cell(figure: Mapping[str, float], fmt: Callable[[float], str], unit: str, bold: bool) -> str:
    median = fmt(figure["median"]) + unit
    if bold:
        median = f"**{median}**"
    if "min" not in figure:
        return median
    return f"{median} [{fmt(figure['min'])}-{fmt(figure['max'])}]"


def serve(results: Path) -> str:
    rows = []
    for name, label, current in (
        ("serve-before.json", "before (listen backlog 5)", False),
        ("serve.json", "now", True),
        ("serve-keep-alive.json", "now, `--keep-alive` (a connection per client)", False),
    ):
        s = load(results, name)["summary"]
        rows.append(
            [
                label,
                _serve_cell(s["errors"], lambda x: fixed(x, 0), "", current),
                _serve_cell(s["p50_s"], _seconds, " s", False),
                _serve_cell(s["p99_s"], _seconds, " s", current),
                _serve_cell(s["max_s"], _seconds, " s", False),
                _serve_cell(s["requests_per_s"], lambda x: fixed(x, 0), "", False),
            ]
        )
    return table(["server", "errors", "p50", "p99", "max", "requests/s"], rows)


# --- Preflight (hand-recorded) ---


def _minutes(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s} s"


def preflight(results: Path) -> str:
    data = load(results, "preflight.json")
    rows = []
    for name, run in data["sets"].items():
        variants = run["variants"]
        measured = [v["peak_gib"] for v in variants if v.get("peak_gib") is not None]
        peaks = measured or run["container_peak_gib"]
        toolkits = sorted({v["toolkit"] for v in variants})
        passed = sum(v["result"] == "pass" for v in variants)
        failed = [f"{v['job']}: {v['line']}" for v in variants if v["result"] != "pass"]
        rows.append(
            [
                f"`{name}` ({run['date']}): {run['what']}",
                ", ".join(f"torch {v['torch']} {_minutes(v['wall_s'])}" for v in variants)
                + f"; nvcc {', '.join(toolkits)}; container peaks {min(peaks)}–{max(peaks)} GiB",
                f"{_minutes(run['wall_s'])}; {passed} of {len(variants)} pass"
                + "".join(f"; {line}" for line in failed),
            ]
        )
    test = data["integration_test"]
    rows.append([test["what"], f"{fixed(test['wall_s'] / 60, 1)} min", ""])
    return table(["what", "per variant", "in all"], rows)


# --- Shards ---


def shard(results: Path) -> str:
    model = load(results, "shard.json")["model"]
    rows = []
    for row in model["rows"]:
        for basis in ("profile", "recipe", "count") if row["runners"] > 1 else ("profile",):
            r = row[basis]
            rows.append(
                [
                    row["runners"],
                    basis,
                    f"{fixed(r['slowest_s'] / 60, 1)} min",
                    f"{fixed(r['sharded_makespan_s'] / 60, 1)} min",
                    f"{fixed(r['ideal_s'] / 60, 1)} min",
                    fixed(r["ratio"], 2),
                ]
            )
    return table(
        [
            "runners",
            "balanced by",
            "slowest shard",
            "sharded makespan",
            "ideal: (one + setup) / N + setup + final",
            "ratio",
        ],
        rows,
    )


def shard_real(results: Path) -> str:
    r = load(results, "shard_real.json")["real"]
    compiled = sorted({int(m.group(1)) for s in r["shards"] if (m := re.search(r"(\d+) compiled", s))})
    each = (
        f"{compiled[0]} compiled each" if len(compiled) == 1 else "compiled " + ", ".join(map(str, compiled))
    )
    rows = [
        [f"one runner, 2 CPUs ({r['one_runner_compiled']} compiled)", f"{fixed(r['one_runner_s'], 1)} s"],
        [
            f"shard 1/2 and 2/2, 1 CPU each, side by side ({each})",
            ", ".join(f"{fixed(s, 1)} s" for s in r["shards_s"]),
        ],
        [
            f"final build ({r['final_compiled']} compiled, {r['final_cached']} cached; link, wheel, checks)",
            f"{fixed(r['final_s'], 1)} s",
        ],
        ["sharded: slowest shard + final", f"{fixed(r['sharded_s'], 1)} s"],
        [
            "ratio to one runner / to (one runner / 2 + final)",
            f"{fixed(r['ratio_to_one_runner'], 2)} / {fixed(r['ratio_to_ideal'], 2)}",
        ],
    ]
    return table(["", "wall"], rows)


# --- Compile cache ---


def _jobs(part: Json) -> list[Json]:
    jobs: list[Json] = part["jobs"]
    return jobs


def _hits(part: Json) -> str:
    return ", ".join(f"{j['compiles_cached']}/{j['compiles_compiled']}" for j in _jobs(part))


def cache_run(results: Path) -> str:
    data = load(results, "cache.json")
    rows: list[list[object]] = []
    for fixture in ("demo", "memext"):
        f = data[fixture]
        for part, label in (
            ("pythons_run", "cold home, empty store"),
            ("empty_home_same_store", "empty home, same store"),
        ):
            for i, j in enumerate(_jobs(f[part])):
                rows.append(
                    [
                        fixture,
                        label if i == 0 else "same run",
                        j["python"],
                        fixed(j["wall_s"], 1),
                        fixed(j["build_phase_s"], 1),
                        f"{j['compiles_cached']} / {j['compiles_compiled']}",
                    ]
                )
        if "cache_off" in f:
            j = _jobs(f["cache_off"])[0]
            rows.append(
                [
                    fixture,
                    f"`--cache off`, {j['python']} alone",
                    j["python"],
                    fixed(j["wall_s"], 1),
                    fixed(j["build_phase_s"], 1),
                    f"{j['compiles_compiled']} nvcc compiles, cache off",
                ]
            )
    return table(["fixture", "build", "job", "whole job s", "build phase s", "cached / compiled"], rows)


def _whole_build(job: Json) -> str:
    return f"{fixed(job['wall_s'], 1)} / {fixed(job['build_phase_s'], 1)}"


def _median_spread(values: Sequence[float]) -> str:
    return f"**{fixed(statistics.median(values), 3)}** ({spread(values, 2)})"


def cache_repeats(results: Path) -> str:
    runs = [load(results, name) for name in ("cache.json", "cache-repeat2.json", "cache-repeat3.json")]
    rows: list[list[object]] = []
    for fixture in ("memext", "demo"):
        mine = [r[fixture] for r in runs if fixture in r]
        for n, f in enumerate(mine, 1):
            first, second = _jobs(f["pythons_run"])
            rows.append(
                [
                    fixture,
                    n,
                    _whole_build(first),
                    _whole_build(second),
                    fixed(f["second_over_first_wall"], 3)
                    if fixture == "memext"
                    else fixed(f["second_over_first_wall"], 2),
                    fixed(f["second_over_first_build_phase"], 3)
                    if fixture == "memext"
                    else fixed(f["second_over_first_build_phase"], 2),
                    _hits(f["empty_home_same_store"]),
                ]
            )
        if fixture == "memext":
            all_hits = all(f["rerun_all_hits"] for f in mine)
            rows.append(
                [
                    fixture,
                    "median (spread)",
                    "",
                    "",
                    _median_spread([f["second_over_first_wall"] for f in mine]),
                    _median_spread([f["second_over_first_build_phase"] for f in mine]),
                    "all hits" if all_hits else "not all hits",
                ]
            )
    return table(
        [
            "fixture",
            "run",
            "3.13 whole / build s",
            "3.14 whole / build s",
            "3.14 / 3.13 whole",
            "3.14 / 3.13 build phase",
            "empty home, same store",
        ],
        rows,
    )


def _overhead(pairs: Sequence[Json]) -> str:
    rows: list[list[object]] = []
    for n, p in enumerate(pairs, 1):
        rows.append(
            [
                f"{n} ({next(k for k in p if k in ('on', 'off'))} first)",
                _whole_build(p["on"]),
                _whole_build(p["off"]),
                fixed(p["wall_ratio"], 3),
                fixed(p["build_phase_ratio"], 3),
                fixed(p["nvcc_cpu_ratio"], 3),
            ]
        )

    def med(side: str, key: str) -> str:
        return num(statistics.median(p[side][key] for p in pairs))

    def ratio(key: str) -> str:
        values = [p[key] for p in pairs]
        return f"{fixed(statistics.median(values), 3)} ({spread(values, 2)})"

    rows.append(
        [
            "median",
            f"{med('on', 'wall_s')} / {med('on', 'build_phase_s')}",
            f"{med('off', 'wall_s')} / {med('off', 'build_phase_s')}",
            ratio("wall_ratio"),
            ratio("build_phase_ratio"),
            fixed(statistics.median(p["nvcc_cpu_ratio"] for p in pairs), 3),
        ]
    )
    return table(
        [
            "pair",
            "on: whole / build s",
            "off: whole / build s",
            "on / off whole",
            "on / off build phase",
            "on / off nvcc CPU s",
        ],
        rows,
    )


def cache_overhead(results: Path) -> str:
    pairs = [
        p for name in ("cache.json", "cache-repeat3.json") for p in load(results, name)["overhead"]["pairs"]
    ]
    return _overhead(pairs)


def cache_trust(results: Path) -> str:
    rows: list[list[object]] = []
    for code, names in (
        ("new", [f"cache-trust-run{n}.json" for n in range(1, 6)]),
        ("before", [f"cache-trust-base{n}.json" for n in range(1, 4)]),
    ):
        runs = [load(results, name)["memext"] for name in names]
        floors: list[float] = []
        for n, f in enumerate(runs, 1):
            first, second = _jobs(f["pythons_run"])
            rerun = [j["build_phase_s"] for j in _jobs(f["empty_home_same_store"])]
            floors += rerun
            rows.append(
                [
                    code,
                    n,
                    _whole_build(first),
                    _whole_build(second),
                    fixed(f["second_over_first_build_phase"], 3),
                    ", ".join(fixed(x, 1) for x in rerun),
                ]
            )
        rows.append(
            [
                code,
                "median (spread)",
                "",
                "",
                _median_spread([f["second_over_first_build_phase"] for f in runs]),
                f"{fixed(statistics.median(floors), 1)} ({spread(floors, 1)})",
            ]
        )
    return table(
        [
            "code",
            "run",
            "3.13 whole / build s",
            "3.14 whole / build s",
            "3.14 / 3.13 build phase",
            "all-hit rerun build s",
        ],
        rows,
    )


def cache_trust_overhead(results: Path) -> str:
    return _overhead(load(results, "cache-trust-overhead.json")["overhead"]["pairs"])


def cache_model(results: Path) -> str:
    model = load(results, "cache.json")["model"]
    jobs = model["jobs"]
    variants = jobs // 4

    def row(label: str, m: Json, base: Json | None) -> list[object]:
        cpu_h = m["cpu_s"] / 3600
        minutes = m["makespan_s"] / 60
        if base is None:
            return [label, fixed(cpu_h, 1), f"{fixed(minutes, 1)} min"]
        return [
            label,
            f"{fixed(cpu_h, 1)} ({fixed(m['cpu_s'] / base['cpu_s'], 2)}x)",
            f"{fixed(minutes, 1)} min ({fixed(m['makespan_s'] / base['makespan_s'], 2)}x)",
        ]

    doubled = model["host_compile_doubled"]
    return table(
        [f"production matrix ({jobs} jobs)", "CPU-hours", "makespan (one job at a time)"],
        [
            row(f"without the cache: {jobs} full builds", model["without_cache"], None),
            row(
                f"with the cache: {variants} full + {jobs - variants} flash_api.cpp-and-link builds",
                model["with_cache"],
                model["without_cache"],
            ),
            row(
                "the same, flash_api.cpp twice the demo binding's cost",
                doubled["with_cache"],
                doubled["without_cache"],
            ),
        ],
    )


# --- A new torch to its wheels published (bench/new_torch.py) ---


def new_torch(results: Path) -> str:
    data = load(results, "new-torch.json")
    repeats = data["repeats"]
    parts = (
        ("the whole: new torch on the index to its wheel published", "new_torch_to_published_s"),
        ("plan (`factory matrix --format github --unpublished`)", "plan_s"),
        ("wheelhouse download (torch and its CUDA wheels, cold)", "wheelhouse_s"),
        ("the job in its container (install, compile, checks)", "job_s"),
        ("the build command's rest (source, image check and its toolkit wheels, publish)", "build_rest_s"),
        ("`factory index check`", "index_check_s"),
    )
    rows = []
    for label, key in parts:
        values = [float(r[key]) for r in repeats]
        median = f"{fixed(statistics.median(values), 1)} s"
        if key == "new_torch_to_published_s":
            median = f"**{median}**"
        rows.append([label, median, f"{spread(values, 1)} s" if len(values) > 1 else "one run"])
    return table(["part", f"median of {len(repeats)}", "min-max"], rows)


# --- flash-attn, whole (bench/flash_attn_wheel.py) ---


def flash_attn_wheel(results: Path) -> str:
    """One row per shard run of the store the wheel was built from, the final build's, then the sums."""
    data = load(results, "flash-attn-wheel.json")
    runs = sorted(data["shards"].items(), key=lambda kv: int(kv[0].split("/")[0]))
    if data.get("final"):
        runs.append(("final", data["final"]))

    def row(name: str, r: Json) -> list[object]:
        return [
            name,
            _minutes(r["wall_s"]),
            f"{r['compiles_compiled']} / {r['compiles_cached']}",
            f"{fixed(r['cpu_s'], 0)} s",
            f"{r['attempts']}, {r['oom_kills']}",
            f"{fixed(r['container_peak_bytes'] / GIB, 1)} GiB" if r["container_peak_bytes"] else "",
            r["result"],
        ]

    rows = [row(name, r) for name, r in runs]
    if runs:
        done = [r for _, r in runs]
        rows.append(
            [
                "**all**",
                f"**{fixed(sum(r['wall_s'] for r in done) / 3600, 2)} h**",
                f"{sum(r['compiles_compiled'] for r in done)} compiled",
                f"**{fixed(sum(r['cpu_s'] for r in done) / 3600, 2)} CPU h**",
                f"{sum(r['attempts'] for r in done)}, {sum(r['oom_kills'] for r in done)}",
                f"{fixed(max(r['container_peak_bytes'] for r in done) / GIB, 1)} GiB",
                "",
            ]
        )
    return table(
        [
            "run",
            "wall",
            "compiled / cached",
            "compile CPU",
            "attempts, OOM kills",
            "container peak",
            "result",
        ],
        rows,
    )


TABLES: dict[str, Callable[[Path], str]] = {
    "flash-attn-courses": flash_attn_courses,
    "memory-model": memory_model,
    "memory-targets": memory_targets,
    "memory-hosts": memory_hosts,
    "memory-run17": lambda results: memory_real(results, "memory_run17.json"),
    "side-by-side": side_by_side,
    "serve": serve,
    "memory-metered-real": lambda results: memory_real(results, "memory_metered.json"),
    "memory-metered-model": memory_metered_model,
    "memory-metered-runs": memory_metered_runs,
    "preflight": preflight,
    "shard": shard,
    "shard-real": shard_real,
    "cache-run": cache_run,
    "cache-repeats": cache_repeats,
    "cache-overhead": cache_overhead,
    "cache-trust": cache_trust,
    "cache-trust-overhead": cache_trust_overhead,
    "cache-model": cache_model,
    "new-torch": new_torch,
    "flash-attn-wheel": flash_attn_wheel,
}


def render(text: str, results: Path, tables: Mapping[str, Callable[[Path], str]] = TABLES) -> str:
    """`text` with what is between each pair of markers rendered anew; the rest as it was."""
    out: list[str] = []
    pos = 0
    markers = list(MARKER.finditer(text))
    i = 0
    while i < len(markers):
        start = markers[i]
        line = text.count("\n", 0, start.start()) + 1
        name = start.group(2)
        if start.group(1):
            raise DocsError(f"line {line}: <!-- /bench:{name} --> without its opening marker")
        if name not in tables:
            raise DocsError(f"line {line}: no table named {name!r} (known: {', '.join(sorted(tables))})")
        if i + 1 >= len(markers) or markers[i + 1].group(0) != f"<!-- /bench:{name} -->":
            raise DocsError(f"line {line}: <!-- bench:{name} --> is not closed by <!-- /bench:{name} -->")
        end = markers[i + 1]
        out.append(text[pos : start.end()])
        try:
            rendered = tables[name](results)
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise DocsError(f"line {line}: table {name}: its results lack or garble {e}") from None
        # blank lines inside the markers: a table must not run into an HTML block in every renderer
        out.append("\n\n" + rendered + "\n\n")
        pos = end.start()
        i += 2
    out.append(text[pos:])
    return "".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.docs", description=__doc__)
    parser.add_argument("--doc", type=Path, default=DOC)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the file is not what the results render"
    )
    args = parser.parse_args(argv)
    try:
        text = args.doc.read_text()
        rendered = render(text, args.results)
    except OSError as e:
        print(f"bench.docs: {args.doc}: {e.strerror}", file=sys.stderr)
        return 2
    except DocsError as e:
        print(f"bench.docs: {args.doc}: {e}", file=sys.stderr)
        return 2
    if rendered == text:
        return 0
    if args.check:
        print(
            f"bench.docs: {args.doc} is not what bench/results renders; run make bench-docs", file=sys.stderr
        )
        return 1
    args.doc.write_text(rendered)
    print(f"written {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
