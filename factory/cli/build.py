"""`factory build`: parse options, show progress, call `factory.build`."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from factory.cli import app, cpus_option
from factory.config import MatrixFile, format_size, load_matrix_file, parse_size
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


def _sync_profile(mf: MatrixFile, console: Console, *, pull: bool) -> None:
    """Compile profiles travel with the published results; an unreachable store only costs a head start."""
    from factory.errors import FactoryError
    from factory.memory.shipping import pull_profile, push_profile
    from factory.stores import open_store

    name, version = mf.package.name, mf.package.version
    try:
        store = open_store(mf.publish.to, endpoint_url=mf.publish.endpoint_url)
        count = (pull_profile if pull else push_profile)(store, package=name, version=version)
    except (FactoryError, OSError, ValueError) as exc:
        console.print(f"compile profile not {'fetched' if pull else 'shipped'}: {exc}")
        return
    if count:
        console.print(
            f"compile profile {'fetched from' if pull else 'shipped to'} {mf.publish.to}: {count} compiles"
        )


def _unpublished(mf: MatrixFile, jobs: list[Job], console: Console) -> list[Job]:
    from factory.publish import published_files, published_wheel
    from factory.stores import open_store

    store = open_store(mf.publish.to, endpoint_url=mf.publish.endpoint_url)
    pages: dict[str, tuple[str, ...]] = {}
    left = []
    for job in jobs:
        vid = job.variant.id
        if vid not in pages:
            pages[vid] = published_files(store, project=mf.package.name, variant_id=vid)
        found = published_wheel(
            pages[vid], project=mf.package.name, version=job.variant.full_version, python=job.python
        )
        if found is None:
            left.append(job)
        else:
            console.print(
                f"{job.id}: already published as {found}; skipped (--rebuild builds it again)",
                markup=False, highlight=False, soft_wrap=True,
            )  # fmt: skip
    return left


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
    from factory.plan import plan_matrix

    console = Console(stderr=True)
    mf = load_matrix_file(matrix)
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
    if publish and not rebuild:
        # a scheduled run builds what is new: a wheel built again differs in its bytes, and publishing it
        # would be refused (nothing published is overwritten)
        jobs = _unpublished(mf, jobs, console)
        if not jobs:
            console.print(
                f"nothing to build: every job's wheel is already published to {mf.publish.to}",
                markup=False, highlight=False, soft_wrap=True,
            )  # fmt: skip
            return
    client = check_docker()
    if publish:
        _sync_profile(mf, console, pull=True)
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

    if interactive:
        live.start()
    try:
        report = run_build(client, mf, jobs, settings, on_change=on_change_plain, log=log)
    finally:
        if interactive:
            live.stop()
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
    wheels = [output / r.wheel for r in report.jobs if r.wheel]
    if publish and wheels:
        # Failed jobs do not hold back the good wheels; the index's matrix page shows what failed.
        from factory.publish import describe, publish_wheels

        result = publish_wheels(
            wheels, to=mf.publish.to, endpoint_url=mf.publish.endpoint_url, report=output / "report.json"
        )
        for line in describe(result):
            console.print(line)
        _sync_profile(mf, console, pull=False)
    sys.exit(0 if report.ok else 1)
