"""The factory's measured compiles of a package as a compiles CSV, and the admission's figures beside them.

    python -m bench.compiles_export --package flash-attn [--version 2.8.3] [--home ~/.cache/wheel-factory]
                                    [--csv OUT.csv] [--report OUT.md]
    python -m bench.compiles_export --matrix examples/demo.yaml ...   # its package, version and own recipe

Every nvcc compile a build runs through the admission wrapper is measured (`factory/container/measure.py`):
its peak RSS, wall and CPU seconds, its time course (`envelope`: the most it holds from each 80th of its time
to its end) and what admission predicted for it. The wrapper's measurement lines stay in each job's log
(`$FACTORY_HOME/runs/<run>/logs/<job>.log`) beside the driver's marks (the torch it built against, the nvcc
and host compiler: `{"toolchain": ...}`); the host folds them into the learned profile of the package version
(`$FACTORY_HOME/profiles/<name>/<version>.json`: peak, mean wall time and course per compile key, no CPU time
and no provenance). This tool reads both, never writes there, and writes:

- a CSV in the columns of `factory/data/flash-attn-compiles.csv` (what `factory.spec.measured` reads: the
first
  column holds the package version) plus where each row came from: `toolkit` (nvcc's release), `torch`,
  `host_compiler`, `python`, `date` (the log's last write, UTC), `source` (`run/<run id>/<job id>`, or
  `profile` for a compile the profile has and no kept log does: peak, mean wall time and course only);
- a report: per compile key, the figures the admission starts a first build from (the package's built-in
  recipe: `compile_gib_by_file` / `compile_gib_per_arch` for the peak, `compile_seconds_by_file` for time,
  both derived from the shipped CSV) against what was measured, with ratios and a summary.

`--run ID` reads only that run's logs and takes them all as the package version's, with or without a learned
profile (a first build still running has none yet). Otherwise a log belongs to the package version whose
learned profile the job was given (the host writes that snapshot
into `runs/<run>/profiles/<job>/profile.json`); a job that had none (the package's first build) belongs to it
when every compile it measured is a key of that version's profile, which the host folded its log into. Only
compiles that ran to success count: a killed compile's peak is a lower bound, and a cache hit or another
shard's stand-in measured nothing.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import statistics
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from packaging.utils import canonicalize_name

from factory.container import admission, protocol
from factory.container.admission import DEFAULT_BASE_BYTES, GIB, PAST_PEAK_DROP
from factory.core.errors import ConfigError
from factory.core.home import factory_home
from factory.core.variants import VariantKey
from factory.memory import profiles
from factory.memory.jobmemory import file_estimate_bytes
from factory.spec.config import load_matrix_file
from factory.spec.options import PackageSpec, Recipe
from factory.spec.recipes import default_recipe_for

# The shipped CSV's columns (what factory.spec.measured reads), then where each row came from.
COLUMNS = (
    "flash_attn_version", "tu", "gencodes", "nvcc_threads", "peak_gib", "cpu_s", "wall_s", "after_peak",
    "note",
)  # fmt: skip
ORIGIN_COLUMNS = ("toolkit", "torch", "host_compiler", "python", "date", "source")
# A container's words reach the CSV (toolchain names): kept short and printable.
TEXT_MAX = 120
# A snapshot profile is read only for its package and version; a larger one is not the host's.
SNAPSHOT_MAX = 64 * 2**20


@dataclass(frozen=True, kw_only=True)
class Origin:
    """Where a measured compile came from; "" where it is not known."""

    source: str
    toolkit: str = ""
    torch: str = ""
    host_compiler: str = ""
    python: str = ""
    date: str = ""


@dataclass(frozen=True, kw_only=True)
class Compile:
    """One measured compile (or, from the profile alone, the profile's figures of one compile key)."""

    key: str
    peak_bytes: int
    wall_s: float | None
    cpu_s: float | None
    envelope: tuple[int, ...]
    origin: Origin
    predicted_bytes: int | None = None  # what the wrapper predicted when it admitted it

    @property
    def parts(self) -> tuple[str, tuple[str, ...], int]:
        parsed = protocol.parse_compile_key(self.key)
        return parsed if parsed is not None else (self.key, (), 1)


def printable(text: object) -> str:
    """A container's string as one short printable field."""
    value = "".join(ch if ch.isprintable() else "?" for ch in str(text))
    return value[:TEXT_MAX]


def gencodes(archs: Sequence[str]) -> str:
    """The CSV's spelling of a compile key's archs: compute_80,compute_90 -> sm_80+sm_90."""
    return "+".join("sm_" + a.split("_", 1)[-1] for a in archs)


def after_peak(envelope: Sequence[int]) -> float | None:
    """The most a compile held after it first fell to PAST_PEAK_DROP of its peak, as a fraction of it, read
    from its envelope (point k: the most from k/80 of its time to its end); None when it never fell so far."""
    peak = max(envelope, default=0)
    if peak <= 0:
        return None
    fell = next((v for v in envelope if v <= PAST_PEAK_DROP * peak), None)
    return None if fell is None else fell / peak


# --- reading what the factory recorded ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LogRead:
    compiles: tuple[Compile, ...]
    keys: frozenset[str]  # every compile key the log measured as learning (failed ones included)
    failed: int  # compiles that did not end well (rc != 0): left out


def read_log(lines: Iterable[str], *, source: str, python: str, date: str) -> LogRead:
    """A job's log: its marks (torch, toolchain) and its measurement lines."""
    torch = toolkit = cxx = ""
    pending: list[tuple[protocol.Measurement, int | None]] = []
    keys: set[str] = set()
    failed = 0
    for line in lines:
        fields = protocol.parse_mark(line)
        if fields is not None:
            if isinstance(fields.get("torch"), str):
                torch = printable(fields["torch"])
            chain = fields.get("toolchain")
            if isinstance(chain, dict):
                toolkit = printable(chain.get("nvcc") or "")
                cxx = printable(chain.get("cxx") or "")
            continue
        m = protocol.parse_measurement(line) if protocol.MEASUREMENT_MARK in line else None
        if m is None or not m.learns:
            continue
        keys.add(m.key)
        if m.rc != 0:
            failed += 1
            continue
        pending.append((m, _predicted(line)))
    origin = Origin(source=source, toolkit=toolkit, torch=torch, host_compiler=cxx, python=python, date=date)
    compiles = tuple(
        Compile(
            key=m.key,
            peak_bytes=m.peak_bytes,
            wall_s=m.wall_s,
            cpu_s=m.cpu_s,
            envelope=m.envelope,
            origin=origin,
            predicted_bytes=predicted,
        )
        for m, predicted in pending
    )
    return LogRead(compiles=compiles, keys=frozenset(keys), failed=failed)


def _predicted(line: str) -> int | None:
    try:
        value = json.loads(line.split(protocol.MEASUREMENT_MARK, 1)[1]).get("predicted_bytes")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and 0 <= value < 2**50 else None


def _snapshot_owner(path: Path) -> tuple[str, str] | None:
    """The (package, version) a job's profile snapshot names; None when there is none."""
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > SNAPSHOT_MAX:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return canonicalize_name(str(data.get("package", ""))), str(data.get("version", ""))


JOB_PYTHON = re.compile(r"-py(\d)(\d+)$")


def _job_python(job: str) -> str:
    m = JOB_PYTHON.search(job)
    return f"{m.group(1)}.{m.group(2)}" if m else ""


def _job_torch_cuda(job: str) -> tuple[str, str]:
    try:
        key = VariantKey.parse_id(JOB_PYTHON.sub("", job))
    except ValueError:
        return "", ""
    return key.torch, key.cuda


@dataclass(frozen=True, kw_only=True)
class Collected:
    package: str
    version: str
    compiles: tuple[Compile, ...]
    logs: int  # logs attributed to the package version
    failed: int  # failed compiles in them, left out


def collect(home: Path, package: str, version: str, *, runs: Sequence[str] = ()) -> Collected:
    """Every successful compile of `package` `version` the factory recorded under `home`, read-only. `runs`:
    read only these runs' logs, every one of them taken as the package version's (the caller knows what they
    built: a first build still running has no profile to attribute its logs by)."""
    name = canonicalize_name(package)
    profile = profiles.load_profile(
        profiles.profile_path(name, version, home=home), package=name, version=version
    )
    known = set(profile.entries)
    compiles: list[Compile] = []
    logs = failed = 0
    root = home / "runs"
    run_dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()) if root.is_dir() else []
    if runs:
        run_dirs = [p for p in run_dirs if p.name in set(runs)]
    for run_dir in run_dirs:
        log_dir = run_dir / "logs"
        if not log_dir.is_dir() or log_dir.is_symlink():
            continue
        for log in sorted(log_dir.glob("*.log")):
            if log.is_symlink() or not log.is_file():
                continue
            job = log.stem
            owner = _snapshot_owner(run_dir / "profiles" / job / "profile.json")
            if owner is not None and owner != (name, version) and not runs:
                continue
            date = datetime.fromtimestamp(log.stat().st_mtime, UTC).date().isoformat()
            with log.open(encoding="utf-8", errors="replace") as fh:
                read = read_log(fh, source=f"run/{run_dir.name}/{job}", python=_job_python(job), date=date)
            if owner is None and not runs and not (read.keys and read.keys <= known):
                continue
            read = _with_job_defaults(read, job)
            logs += 1
            failed += read.failed
            compiles.extend(read.compiles)
    seen = {c.key for c in compiles}
    for key, entry in sorted(profile.entries.items()):
        if key in seen:
            continue
        origin = Origin(source="profile")
        compiles.append(
            Compile(
                key=key,
                peak_bytes=entry.peak_bytes,
                wall_s=entry.wall_s,
                cpu_s=None,
                envelope=entry.envelope,
                origin=origin,
            )
        )
    return Collected(package=name, version=version, compiles=tuple(compiles), logs=logs, failed=failed)


def _with_job_defaults(read: LogRead, job: str) -> LogRead:
    """A log without the driver's marks (an older factory's) still says its torch and CUDA in its job id."""
    torch, cuda = _job_torch_cuda(job)
    out = []
    for c in read.compiles:
        o = c.origin
        if not o.torch and torch:
            o = replace(o, torch=torch)
        if not o.toolkit and cuda:
            o = replace(o, toolkit=f"CUDA {cuda}")
        out.append(replace(c, origin=o))
    return replace(read, compiles=tuple(out))


# --- the CSV -----------------------------------------------------------------------------------------------


def csv_rows(collected: Collected) -> list[dict[str, str]]:
    rows = []
    for c in collected.compiles:
        file, archs, threads = c.parts
        after = after_peak(c.envelope)
        o = c.origin
        note = "factory build" if o.source != "profile" else "factory profile: peak, mean wall time, course"
        rows.append(
            {
                "flash_attn_version": collected.version,
                "tu": file,
                "gencodes": gencodes(archs),
                "nvcc_threads": str(threads),
                "peak_gib": f"{c.peak_bytes / GIB:.2f}",
                "cpu_s": "" if c.cpu_s is None else f"{c.cpu_s:.0f}",
                "wall_s": "" if c.wall_s is None else f"{c.wall_s:.0f}",
                "after_peak": "" if after is None else f"{after:.3f}",
                "note": note,
                "toolkit": o.toolkit,
                "torch": o.torch,
                "host_compiler": o.host_compiler,
                "python": o.python,
                "date": o.date,
                "source": o.source,
            }
        )
    return rows


def csv_text(collected: Sequence[Collected]) -> str:
    """The CSV of one or more versions' compiles, behind a comment line (factory.spec.measured skips
    those)."""
    out = io.StringIO()
    names = ", ".join(f"{c.package} {c.version}" for c in collected)
    out.write(
        f"# Compiles of {names} measured by the factory's builds (python -m bench.compiles_export); "
        "peak_gib = the nvcc process tree's peak RSS, cpu_s its CPU time; the first column is the version.\n"
    )
    writer = csv.DictWriter(out, fieldnames=[*COLUMNS, *ORIGIN_COLUMNS], lineterminator="\n")
    writer.writeheader()
    for c in collected:
        writer.writerows(csv_rows(c))
    return out.getvalue()


MERGED_LINE = "# Rows with a `source` were measured by the factory's own builds"


def merged_csv(existing: str, collected: Sequence[Collected]) -> str:
    """`existing` (a compiles CSV, factory/data/flash-attn-compiles.csv) with the factory's measured rows in
    place of every row of the same file, arch set and nvcc threads; the rows of files no build measured yet
    stay, so a partial build (some shards of a wheel) never drops the worst file's figure from the estimates.
    Comment lines stay on top, with one more that says what was merged."""
    comments = [
        line for line in existing.splitlines() if line.startswith("#") and not line.startswith(MERGED_LINE)
    ]
    old = list(csv.DictReader(line for line in existing.splitlines() if not line.startswith("#")))
    new = [row for c in collected for row in csv_rows(c)]

    def key(row: dict[str, str]) -> tuple[str, str, str]:
        return row["tu"], row["gencodes"], row["nvcc_threads"]

    measured = {key(r) for r in new}
    kept = [r for r in old if key(r) not in measured]
    names = ", ".join(f"{c.package} {c.version}" for c in collected)
    out = io.StringIO()
    for line in comments:
        out.write(line + "\n")
    out.write(
        f"{MERGED_LINE} of {names} (python -m "
        f"bench.compiles_export --into): {len(new)} of {len(new) + len(kept)}; the others are the earlier "
        "hand-run measurements of files no build has measured yet.\n"
    )
    writer = csv.DictWriter(out, fieldnames=[*COLUMNS, *ORIGIN_COLUMNS], lineterminator="\n", restval="")
    writer.writeheader()
    writer.writerows(sorted(new, key=key))
    writer.writerows({k: r.get(k, "") or "" for k in (*COLUMNS, *ORIGIN_COLUMNS)} for r in kept)
    return out.getvalue()


# --- the comparison ----------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Comparison:
    key: str
    samples: int
    peak_bytes: int  # the most any sample peaked at
    predicted_bytes: int  # the recipe's estimate for a first build
    cpu_s: float | None  # mean over samples with a CPU time
    predicted_s: float | None  # the recipe's compile_seconds_by_file x archs; None when it names no such file
    admitted_bytes: int | None  # the most the wrapper predicted when it admitted a sample (from the log)

    @property
    def peak_ratio(self) -> float:
        return self.peak_bytes / self.predicted_bytes if self.predicted_bytes else math.inf

    @property
    def cpu_ratio(self) -> float | None:
        if self.cpu_s is None or not self.predicted_s:
            return None
        return self.cpu_s / self.predicted_s


def recipe_prediction(recipe: Recipe, key: str) -> tuple[int, float | None]:
    """What a first build predicts for a compile key from the recipe alone (no learned profile): the peak
    the wrapper's `compile_estimate` gives, and the recipe's per-arch seconds times the archs."""
    file, archs, threads = protocol.parse_compile_key(key) or (key, (), 1)
    per_arch = int(recipe.compile_gib_per_arch * GIB)
    peak = admission.compile_estimate(
        file, per_arch_bytes=per_arch, archs=max(1, len(archs)), nvcc_threads=threads,
        base_bytes=DEFAULT_BASE_BYTES, by_file=file_estimate_bytes(recipe),
    )  # fmt: skip
    seconds = admission.file_value(file, recipe.compile_seconds_by_file)
    return peak, None if seconds is None else seconds * max(1, len(archs))


def compare(collected: Collected, recipe: Recipe) -> list[Comparison]:
    by_key: dict[str, list[Compile]] = {}
    for c in collected.compiles:
        by_key.setdefault(c.key, []).append(c)
    out = []
    for key, group in sorted(by_key.items()):
        predicted, seconds = recipe_prediction(recipe, key)
        cpus = [c.cpu_s for c in group if c.cpu_s is not None]
        admitted = [c.predicted_bytes for c in group if c.predicted_bytes is not None]
        out.append(
            Comparison(
                key=key,
                samples=len(group),
                peak_bytes=max(c.peak_bytes for c in group),
                predicted_bytes=predicted,
                cpu_s=statistics.fmean(cpus) if cpus else None,
                predicted_s=seconds,
                admitted_bytes=max(admitted) if admitted else None,
            )
        )
    return out


def _spread(values: Sequence[float]) -> str:
    if not values:
        return "none"
    return (
        f"median {statistics.median(values):.2f}, min {min(values):.2f}, max {max(values):.2f} "
        f"(n={len(values)})"
    )


def report_text(collected: Collected, recipe: Recipe, rows: Sequence[Comparison]) -> str:
    lines = [
        f"# {collected.package} {collected.version}: the factory's measured compiles against the admission's "
        "first-build figures",
        "",
        f"{len(collected.compiles)} compiles of {len(rows)} compile keys, from {collected.logs} job log(s) "
        f"and the learned profile; {collected.failed} failed compile(s) left out. Predicted: recipe "
        f"`{recipe.name}` (`compile_gib_by_file`, else {recipe.compile_gib_per_arch} GiB per arch, + "
        f"{DEFAULT_BASE_BYTES / GIB:.2f} GiB; `compile_seconds_by_file` x archs: relative seconds, measured "
        "on another machine, so only their spread across files is comparable).",
        "",
        "| compile | n | peak GiB | predicted GiB | peak / predicted | admitted at GiB | CPU s | predicted s "
        "| CPU / predicted |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cpu_ratio = r.cpu_ratio
        lines.append(
            f"| {r.key} | {r.samples} | {r.peak_bytes / GIB:.2f} | {r.predicted_bytes / GIB:.2f} "
            f"| {r.peak_ratio:.2f} | {'' if r.admitted_bytes is None else f'{r.admitted_bytes / GIB:.2f}'} "
            f"| {'' if r.cpu_s is None else f'{r.cpu_s:.0f}'} "
            f"| {'' if r.predicted_s is None else f'{r.predicted_s:.0f}'} "
            f"| {'' if cpu_ratio is None else f'{cpu_ratio:.2f}'} |"
        )
    peaks = [r.peak_ratio for r in rows if math.isfinite(r.peak_ratio)]
    cpus = [x for x in (r.cpu_ratio for r in rows) if x is not None]
    over = [r.key for r in rows if r.peak_bytes > r.predicted_bytes]
    relative = [c / statistics.median(cpus) for c in cpus] if cpus else []
    lines += [
        "",
        f"- peak / predicted: {_spread(peaks)}; above the prediction (a first build would have "
        f"under-reserved them): {len(over)}" + (f" ({', '.join(over)})" if over else ""),
        f"- CPU s / predicted s: {_spread(cpus)}; each over their median (how far the recipe's times are off "
        f"the files' order, whatever the machine): {_spread(relative)}",
    ]
    return "\n".join(lines) + "\n"


# --- the command -------------------------------------------------------------------------------------------


def versions_of(home: Path, package: str) -> list[str]:
    folder = home / "profiles" / canonicalize_name(package)
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def export(
    home: Path, package: str, version: str | None, recipe: Recipe | None = None, runs: Sequence[str] = ()
) -> Iterator[tuple[Collected, Recipe]]:
    """The collected compiles of each recorded version of `package` (or the one asked for), with the recipe
    that predicts them (given, else the package's built-in one)."""
    found = versions_of(home, package)
    chosen = [version] if version else found
    if not chosen:
        raise ConfigError(f"no learned profiles of {package} under {home / 'profiles'}")
    missing = [r for r in runs if not (home / "runs" / r / "logs").is_dir()]
    if missing:
        raise ConfigError(f"no run {missing[0]} under {home / 'runs'}")
    for v in chosen:
        if v not in found and not runs:
            have = ", ".join(found) or "none"
            raise ConfigError(f"no learned profile of {package} {v} under {home / 'profiles'} (have: {have})")
        chosen_recipe = recipe or default_recipe_for(PackageSpec(name=package, version=v))
        yield collect(home, package, v, runs=runs), chosen_recipe


DESCRIPTION = "The factory's measured compiles of a package as a compiles CSV, and a comparison report."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compiles_export", description=DESCRIPTION)
    parser.add_argument("--package", help="the package (or --matrix)")
    parser.add_argument("--matrix", type=Path, help="a matrix file: its package, version and recipe")
    parser.add_argument("--version", help="one version (default: every version with a learned profile)")
    parser.add_argument(
        "--home", type=Path, help="the factory's home (default: $FACTORY_HOME, else ~/.cache)"
    )
    parser.add_argument(
        "--run",
        action="append",
        default=[],
        help="only this run's logs, all of them the package's (repeatable)",
    )
    parser.add_argument("--csv", type=Path, help="write the CSV here (default: not written)")
    parser.add_argument(
        "--into",
        type=Path,
        help="merge the measured rows into this CSV (factory/data/flash-attn-compiles.csv): each replaces "
        "the row of its file, arch set and nvcc threads; rows of files not measured stay",
    )
    parser.add_argument("--report", type=Path, help="write the report here (default: standard output)")
    args = parser.parse_args(argv)
    home = (args.home or factory_home()).expanduser()
    try:
        if (args.package is None) == (args.matrix is None):
            raise ConfigError("give --package or --matrix (one of them)")
        package, version, recipe = args.package, args.version, None
        if args.matrix is not None:
            mf = load_matrix_file(args.matrix, trust_paths=True)
            package, version, recipe = mf.package.name, version or mf.package.version, mf.recipe
        if args.run and not version:
            raise ConfigError("--run needs the version (--version, or --matrix)")
        results = list(export(home, package, version, recipe, args.run))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = "\n".join(report_text(c, r, compare(c, r)) for c, r in results)
    if args.csv:
        args.csv.write_text(csv_text([c for c, _ in results]), encoding="utf-8")
    if args.into:
        merged = merged_csv(args.into.read_text(encoding="utf-8"), [c for c, _ in results])
        tmp = args.into.with_name(args.into.name + ".tmp")
        tmp.write_text(merged, encoding="utf-8")
        tmp.replace(args.into)
    if args.report:
        args.report.write_text(report, encoding="utf-8")
    else:
        sys.stdout.write(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
