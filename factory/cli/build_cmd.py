"""`factory build`: parse options, call `factory.build.request`, show progress."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from factory.cli import app, cpus_option, size_option
from factory.cli.matrix_cmd import FLAVOR_OPTION, ONLY_OPTION, TRUST_PATHS
from factory.cli.output import echo_json, json_option
from factory.cli.progress import BuildDisplay
from factory.cli.verify_cmd import SIGN_KEY_ENV_OPTION, SIGN_KEY_OPTION
from factory.core.errors import ConfigError
from factory.plan.shard import Shard, parse_shard
from factory.spec.config import MIN_CONTAINER_MEMORY

if TYPE_CHECKING:
    from factory.build.pipeline import RunOutcome


def shard_option(value: str | None) -> Shard | None:
    if value is None:
        return None
    try:
        return parse_shard(value)
    except ValueError as exc:
        raise ConfigError(f"--shard {exc}") from None


MATRICES_OPTION = typer.Option(
    "--matrix",
    "-m",
    metavar="FILE",
    help="The matrix file. Several (repeat it): built in one run, each after those whose package its runtime "
    "requirements name, whose wheels its install check takes; each under OUTPUT/<package>/.",
)


@app.command()
def build(
    matrix: Annotated[list[Path] | None, MATRICES_OPTION] = None,
    trust_paths: Annotated[bool, TRUST_PATHS] = False,
    output: Annotated[
        Path, typer.Option("--output", "-o", metavar="DIR", help="Where accepted wheels go.")
    ] = Path("wheelhouse"),
    only: Annotated[str | None, ONLY_OPTION] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the jobs, start nothing.")] = False,
    as_json: Annotated[bool, json_option()] = False,
    keep_going: Annotated[
        bool, typer.Option("--keep-going", help="Build the other jobs after a failure.")
    ] = False,
    memory: Annotated[
        str | None, typer.Option(metavar="SIZE", help="Memory limit per container, e.g. 16GiB.")
    ] = None,
    cpus: Annotated[float | None, typer.Option(metavar="N", help="CPUs per container.")] = None,
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
    check_cache: Annotated[
        int,
        typer.Option(
            "--check-cache",
            "--verify-cache",  # its older spelling, kept for scripts ("verify" is a signature's check)
            metavar="N",
            help="Check the compile cache: compile N of each job's cache hits anyway and compare the bytes; "
            "a difference is reported as a suspected poisoned entry and the entry removed.",
        ),
    ] = 0,
    sign_key: Annotated[Path | None, SIGN_KEY_OPTION] = None,
    sign_key_env: Annotated[str | None, SIGN_KEY_ENV_OPTION] = None,
) -> None:
    """Build every planned (variant, python) job in its own container and check the wheels."""
    # Imported here so `factory --help` and the other commands stay fast and independent of docker.
    from factory.build.request import (
        BuildRequest,
        PlannedBuild,
        dry_run_line,
        plan_run,
        run_ordered,
        run_planned,
    )

    if as_json and not dry_run:
        raise ConfigError("--json applies to --dry-run (a build writes its report to OUTPUT/report.json)")
    matrices = list(dict.fromkeys(matrix or [Path("matrix.yaml")]))
    request = BuildRequest(
        matrix=matrices[0],
        trust_paths=trust_paths,
        output=output,
        only=only,
        keep_going=keep_going,
        memory=size_option(memory, "--memory", minimum=MIN_CONTAINER_MEMORY) if memory is not None else None,
        cpus=cpus_option(cpus),
        flavor=flavor,
        publish=publish,
        rebuild=rebuild,
        shard=shard_option(shard),
        preflight=preflight,
        cache=cache,
        check_cache=check_cache,
        sign_key=sign_key,
        sign_key_env=sign_key_env,
    )
    run = plan_run(
        [replace(request, matrix=path) for path in matrices],
        warn=lambda line: typer.echo(f"warning: {line}", err=True),
    )
    if dry_run:
        jobs = [job for planned in run.builds for job in planned.jobs]
        if as_json:
            echo_json([job.to_json() for job in jobs])
        else:
            several = len(run.builds) > 1  # then each line names its package: job ids may repeat
            for planned in run.builds:
                for job in planned.jobs:
                    typer.echo((f"{planned.mf.package.name}\t" if several else "") + dry_run_line(job))
        return

    def build_one(planned: PlannedBuild) -> RunOutcome:
        report_path = planned.settings.output / "report.json"
        display = BuildDisplay(Console(stderr=True), report_path=str(report_path))
        return run_planned(
            planned,
            on_change=display.on_change,
            log=display.say,
            showing=display.showing,
            finished=display.finished,
        )

    outcomes = run_ordered(run, build=build_one)
    sys.exit(0 if all(outcome.ok for outcome in outcomes) else 1)
