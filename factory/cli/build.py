"""`factory build`: parse options, show progress, call `factory.build`."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from factory.cli import app, cpus_option
from factory.config import format_size, load_matrix_file, parse_size
from factory.errors import ConfigError

if TYPE_CHECKING:
    from factory.build import BuildReport, JobResult
    from factory.plan import Job

STYLE = {"ok": "green", "failed": "red", "oom": "magenta", "interrupted": "yellow", "skipped": "dim"}


def _progress_table(results: list[JobResult]) -> Table:
    table = Table(title="factory build", expand=False)
    for col in ("job", "phase", "elapsed", "memory", "peak"):
        table.add_column(col)
    now = time.monotonic()
    for r in results:
        elapsed = r.wall_s if r.wall_s else (now - r.started if r.started else 0.0)
        table.add_row(
            r.job_id,
            f"[{STYLE.get(r.phase, 'cyan')}]{r.phase}[/]",
            f"{elapsed:.0f}s",
            format_size(r.mem_now) if r.mem_now else "-",
            format_size(r.peak_bytes) if r.peak_bytes else "-",
        )
    return table


def _summary_table(report: BuildReport) -> Table:
    table = Table(title="summary")
    for col in ("job", "result", "wall", "peak", "attempts", "wheel / reason"):
        table.add_column(col, overflow="fold")
    for r in report.jobs:
        detail = escape(r.wheel or r.reason or "")
        table.add_row(
            r.job_id,
            f"[{STYLE.get(r.result, 'white')}]{r.result}[/]",
            f"{r.wall_s:.0f}s",
            format_size(r.peak_bytes) if r.peak_bytes else "-",
            str(len(r.attempts)),
            detail,
        )
    return table


@app.command()
def build(
    matrix: Annotated[Path, typer.Option("--matrix", "-m", help="The matrix file.")] = Path("matrix.yaml"),
    output: Annotated[Path, typer.Option("--output", "-o", help="Where accepted wheels go.")] = Path(
        "wheelhouse"
    ),
    only: Annotated[
        str | None, typer.Option(help="Only jobs whose id or variant id matches this glob.")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the jobs, start nothing.")] = False,
    keep_going: Annotated[
        bool, typer.Option("--keep-going", help="Build the other jobs after a failure.")
    ] = False,
    memory: Annotated[str | None, typer.Option(help="Memory limit per container, e.g. 16GiB.")] = None,
    cpus: Annotated[float | None, typer.Option(help="CPUs per container.")] = None,
    publish: Annotated[
        bool, typer.Option("--publish", help="Publish accepted wheels (see `publish:`).")
    ] = False,
    rebuild: Annotated[
        bool,
        typer.Option(
            "--rebuild", help="With --publish: build jobs whose wheel is already published too (not skipped)."
        ),
    ] = False,
) -> None:
    """Build every planned (variant, python) job in its own container and check the wheels."""
    # Imported here so `factory --help` and the other commands stay fast and independent of docker.
    from factory.build import BuildSettings, check_docker, run_build
    from factory.pipeline import build_matrix
    from factory.plan import plan_matrix
    from factory.recipes import recipe_warnings

    console = Console(stderr=True)
    mf = load_matrix_file(matrix)
    for warning in recipe_warnings(mf.recipe, mf.package):
        typer.echo(f"warning: {warning}", err=True)
    jobs = list(plan_matrix(mf).only(only).jobs)
    if not jobs:
        raise ConfigError(
            f"no job matches --only {only!r}" if only else "the matrix plans no job", file=str(matrix)
        )
    try:
        mem = parse_size(memory) if memory is not None else None
    except ValueError as exc:
        raise ConfigError(f"--memory: {exc}") from None
    cpus = cpus_option(cpus)
    if output.exists() and not output.is_dir():
        raise ConfigError(f"--output {output}: exists and is not a directory")
    if rebuild and not publish:
        raise ConfigError("--rebuild only applies with --publish")
    if dry_run:
        for job in jobs:
            typer.echo(f"{job.id}\tpython {job.python}\tarch {job.variant.arch}\t{job.variant.full_version}")
        return
    settings = BuildSettings(output=output, keep_going=keep_going, memory=mem, cpus=cpus)
    lock = threading.Lock()
    results: list[JobResult] = []
    live = Live(_progress_table(results), console=console, refresh_per_second=2, transient=False)
    interactive = console.is_terminal

    def on_change(r: JobResult) -> None:
        with lock:
            if r not in results:
                results.append(r)
            if interactive:
                live.update(_progress_table(results))

    last_phase: dict[str, str] = {}

    def on_change_plain(r: JobResult) -> None:
        on_change(r)
        if not interactive and last_phase.get(r.job_id) != r.phase:
            last_phase[r.job_id] = r.phase
            console.print(f"{r.job_id}: {r.phase}")

    def log(msg: str) -> None:
        console.print(msg, markup=False, highlight=False)

    def build_shown(todo: Sequence[Job]) -> BuildReport:
        client = check_docker()
        if interactive:
            live.start()
        try:
            report = run_build(client, mf, todo, settings, on_change=on_change_plain, log=log)
        finally:
            if interactive:
                live.stop()
        _show_report(console, report, output)
        return report

    def say(msg: str) -> None:
        console.print(msg, markup=False, highlight=False, soft_wrap=True)

    outcome = build_matrix(
        mf, jobs, build=build_shown, output=output, publish=publish, rebuild=rebuild, log=say
    )
    sys.exit(0 if outcome.ok else 1)


def _show_report(console: Console, report: BuildReport, output: Path) -> None:
    console.print(_summary_table(report))
    for r in report.jobs:
        for a in r.attempts:
            if a.note:
                console.print(f"{r.job_id}: {a.note}")
        if r.result not in ("ok", "skipped") and r.log_tail:
            # Compiler errors lead the tail (see build.log_tail); then the last lines of the log.
            errors = r.log_tail[: r.log_tail.index("...") + 1] if "..." in r.log_tail else []
            shown = [*errors, *r.log_tail[len(errors) :][-15:]]
            console.print(f"[bold]{escape(r.job_id)}[/]: {escape(r.reason or '')}\n  log: {r.log}")
            console.print("\n".join(f"  {line}" for line in shown), markup=False, highlight=False)
    console.print(f"report: {output / 'report.json'}")
