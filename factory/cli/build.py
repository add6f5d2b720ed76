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

from factory.cli import app, cpus_option, size_option
from factory.cli.matrix import FLAVOR_OPTION, TRUST_PATHS
from factory.cli.progress import PlainProgress, ProgressView, show_report
from factory.config import MIN_CONTAINER_MEMORY, load_matrix_file, with_flavor
from factory.errors import ConfigError
from factory.shard import Shard, parse_shard

if TYPE_CHECKING:
    from factory.plan import Job
    from factory.report import BuildReport, JobResult

TICK_S = 5.0  # how often the plain display looks for a running job whose line is due


def shard_option(value: str | None) -> Shard | None:
    if value is None:
        return None
    try:
        return parse_shard(value)
    except ValueError as exc:
        raise ConfigError(f"--shard {exc}") from None


@app.command()
def build(
    matrix: Annotated[Path, typer.Option("--matrix", "-m", help="The matrix file.")] = Path("matrix.yaml"),
    trust_paths: Annotated[bool, TRUST_PATHS] = False,
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
    flavor: Annotated[str | None, FLAVOR_OPTION] = None,
    publish: Annotated[
        bool, typer.Option("--publish", help="Publish accepted wheels (see `publish:`).")
    ] = False,
    rebuild: Annotated[
        bool,
        typer.Option(
            "--rebuild", help="With --publish: build jobs whose wheel is already published too (not skipped)."
        ),
    ] = False,
    shard: Annotated[
        str | None,
        typer.Option(
            "--shard",
            metavar="I/N",
            help="Compile only shard I of N of each job's CUDA files into the compile cache; no wheel.",
        ),
    ] = None,
    preflight: Annotated[
        bool,
        typer.Option(
            "--preflight",
            help="For each variant (its first Python): fetch, patch, compile every host source and the "
            "cheapest device source for one arch, into the compile cache; then stop: no wheel. Exit 1 if any "
            "failed.",
        ),
    ] = False,
    cache: Annotated[
        str | None,
        typer.Option(
            "--cache",
            metavar="DEST|off",
            help="Sync the compile cache with this store (s3://bucket/prefix or a directory), or off.",
        ),
    ] = None,
    verify_cache: Annotated[
        int,
        typer.Option(
            "--verify-cache",
            metavar="N",
            help="Compile N of each job's cache hits anyway and compare the bytes; a difference is reported "
            "as a suspected poisoned entry and the entry removed.",
        ),
    ] = 0,
) -> None:
    """Build every planned (variant, python) job in its own container and check the wheels."""
    # Imported here so `factory --help` and the other commands stay fast and independent of docker.
    from factory.build import BuildSettings, run_build
    from factory.cache import KEY_ENV, resolve, shared_key
    from factory.engine import connect
    from factory.pipeline import build_matrix
    from factory.plan import plan_matrix
    from factory.preflight import lead_jobs
    from factory.recipes import recipe_warnings

    if preflight and publish:
        raise ConfigError("--preflight makes no wheel to publish: drop --publish")
    if preflight and shard is not None:
        raise ConfigError("--preflight and --shard each choose which compiles run: use one of them")
    console = Console(stderr=True)
    mf = with_flavor(load_matrix_file(matrix, trust_paths=trust_paths), flavor)
    for warning in recipe_warnings(mf.recipe, mf.package):
        typer.echo(f"warning: {warning}", err=True)
    jobs = list(plan_matrix(mf).only(only).jobs)
    if not jobs:
        raise ConfigError(
            f"no job matches --only {only!r}" if only else "the matrix plans no job", file=str(matrix)
        )
    if preflight:
        jobs = lead_jobs(jobs)  # one Python per variant: the others compile the same sources
    mem = size_option(memory, "--memory", minimum=MIN_CONTAINER_MEMORY) if memory is not None else None
    cpus = cpus_option(cpus)
    one_shard = shard_option(shard)
    if output.exists() and not output.is_dir():
        raise ConfigError(f"--output {output}: exists and is not a directory")
    if rebuild and not publish:
        raise ConfigError("--rebuild only applies with --publish")
    compile_cache = resolve(mf, publishing=publish, override=cache, verify=verify_cache)
    if verify_cache and compile_cache is None:
        raise ConfigError("--verify-cache checks the compile cache's hits, and the cache is off")
    if one_shard is not None and compile_cache is None:
        raise ConfigError("--shard compiles into the compile cache, which is off (build.cache, --cache)")
    if one_shard is not None and compile_cache is not None and not shared_key(compile_cache):
        typer.echo(
            f"warning: --shard without {KEY_ENV}: this host signs its compiles with its own key, and a "
            "final build on another host will not use them",
            err=True,
        )
    if dry_run:
        for job in jobs:
            typer.echo(f"{job.id}\tpython {job.python}\tarch {job.variant.arch}\t{job.variant.full_version}")
        return
    settings = BuildSettings(
        output=output,
        keep_going=keep_going,
        memory=mem,
        cpus=cpus,
        shard=one_shard,
        preflight=preflight,
        compile_cache=compile_cache,
    )
    interactive = console.is_terminal
    lock = threading.Lock()
    results: list[JobResult] = []
    plain = PlainProgress()

    def snapshot() -> list[JobResult]:
        with lock:
            return list(results)

    def say(msg: str) -> None:
        console.print(msg, markup=False, highlight=False, soft_wrap=True)

    def on_change(r: JobResult) -> None:
        with lock:
            if r not in results:
                results.append(r)
            line = None if interactive else plain.changed(r, time.monotonic())
        if line is not None:
            say(line)

    def tick(stop: threading.Event) -> None:
        while not stop.wait(TICK_S):
            with lock:
                lines = plain.due(results, time.monotonic())
            for line in lines:
                say(line)

    def build_shown(todo: Sequence[Job]) -> BuildReport:
        client = connect()
        stop = threading.Event()
        display: Live | threading.Thread
        if interactive:
            display = Live(ProgressView(snapshot, time.monotonic), console=console, refresh_per_second=2)
        else:
            display = threading.Thread(target=tick, args=(stop,), name="progress", daemon=True)
        display.start()
        try:
            report = run_build(client, mf, todo, settings, on_change=on_change, log=say)
        finally:
            if isinstance(display, Live):
                display.stop()
            else:
                stop.set()
                display.join()
        show_report(console, report, str(output / "report.json"), interactive=interactive)
        return report

    outcome = build_matrix(
        mf, jobs, build=build_shown, output=output, publish=publish, rebuild=rebuild, log=say
    )
    sys.exit(0 if outcome.ok else 1)
