"""`factory matrix`: show which wheels a matrix file builds, which it drops and why."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from factory.build.source import prepare_matrix_source
from factory.cli import app
from factory.cli.output import echo_json, json_option, table_console
from factory.core.errors import ConfigError
from factory.core.validate import shown_name
from factory.plan import glibcfloor
from factory.plan import shard as sharding
from factory.plan.ci import Chunk, parse_chunk, parse_runners
from factory.plan.plan import Job, Plan, plan_file
from factory.spec import stable_abi
from factory.spec.config import MatrixFile
from factory.spec.toolchains import platform_suffix

# Shared with `factory build`: the file's own paths are confined to its directory unless the user says so.
TRUST_PATHS = typer.Option(
    "--trust-paths",
    help="Allow package.source.path and recipe.patches outside the matrix file's directory.",
)

FLAVOR_OPTION = typer.Option(
    "--flavor",
    metavar="FLAVOR",
    help="Build with this image flavor instead of build.flavor (devel, pypi, manylinux, debian).",
)

MATRIX_OPTION = typer.Option("--matrix", "-m", metavar="FILE", help="The matrix file.")

ONLY_OPTION = typer.Option(
    "--only", metavar="GLOB", help="Only the jobs whose id or variant id matches this glob."
)


class Format(StrEnum):
    table = "table"
    github = "github"
    json = "json"  # deprecated: --json, which lists the dropped rows too


def _pythons(job: Job) -> str:
    """ "3.11", or for an abi3 job "3.11 (cp311-abi3, covers 3.12, 3.13)"; a stable-ABI job adds the torches
    its wheel serves: "3.11 (torch 2.12, 2.14)"."""
    served = f" (torch {', '.join(job.torches)})" if job.torches else ""
    # another platform's job says so (its id ends with it too): "3.11 <platform>"
    where = platform_suffix(job.platform).replace("-", " ")
    if not job.limited_api:
        return job.python + where + served
    covered = f", covers {', '.join(job.covers)}" if job.covers else ""
    return f"{job.python}{where} ({job.limited_api}-abi3{covered}){served}"


def _floors(mf: MatrixFile, jobs: tuple[Job, ...]) -> str:
    """The glibc column: each job's floor and the builder meeting it (`glibcfloor.shown`), one line when
    every Python of the variant has the same, else one per Python."""
    # keyed as the Pythons column names a job ("3.12 <platform>" for another platform's, with its own image)
    shown = {
        j.python + platform_suffix(j.platform).replace("-", " "): glibcfloor.shown(
            mf.build,
            j.glibc,
            cuda=j.variant.cuda,
            python=j.python,
            torch_floor=mf.compat.torch_glibc(j.variant.torch),
            target=j.platform,
        )
        for j in jobs
    }
    if len(set(shown.values())) == 1:
        return next(iter(shown.values()))
    return "\n".join(f"{python}: {text}" for python, text in shown.items())


def _table(plan: Plan, title: str, mf: MatrixFile) -> Table:
    table = Table(title=title, expand=False)
    for col in ("variant", "pythons", "arch", "glibc", "status"):
        table.add_column(col, overflow="fold")
    for variant in plan.variants:
        jobs = plan.jobs_of(variant)
        pythons = ", ".join(_pythons(j) for j in jobs)
        notes = list(dict.fromkeys(n for j in jobs for n in j.notes))
        known = all(j.known for j in jobs)
        status = "[green]ok[/]" if known else "[yellow]unknown[/]"
        toolkits = sorted({j.toolkit for j in jobs if j.toolkit})
        notes += [f"compiled with CUDA {t}'s nvcc (the flavor's toolkit)" for t in toolkits]
        if notes:
            status += "\n" + "\n".join(f"[dim]{n}[/]" for n in notes)
        table.add_row(variant.id, pythons, variant.arch, _floors(mf, jobs), status)
    for d in plan.dropped:
        v = d.values
        table.add_row(
            f"[red]{d.id}[/]",
            str(v.get("python", "?")),
            str(v.get("arch", "?")),
            "",
            f"[red]dropped[/]: {d.reason}",
        )
    return table


def _resolution_lines(plan: Plan) -> list[str]:
    """What each specifier resolved to, then what the index said that compat.json does not."""
    return [f"resolved: {r.line()}" for r in plan.resolved] + [f"note: {n}" for n in plan.notes]


def _check_line(mf: MatrixFile, plan: Plan, matrix: Path, *, fetch: bool) -> str:
    """`factory matrix --check`'s line; with `fetch`, after trying the recipe's patches on the source."""
    patched = ""
    if mf.recipe.patches and fetch:
        # the fetch and patched tree a build makes (cached): a patch that no longer applies fails here
        prepared = prepare_matrix_source(mf)
        of = prepared.sdist or f"{shown_name(mf.package.name)} {shown_name(mf.package.version)}"
        count = len(mf.recipe.patches)
        patched = f", {count} patch{'es apply' if count > 1 else ' applies'} to {of}"
    unknown = sum(not j.known for j in plan.jobs)
    covered = sum(len(j.covers) for j in plan.jobs)
    hint = ""
    if fetch and not mf.recipe.stable_abi and (mf.recipe.patches or mf.package.source.kind == "path"):
        # a source this check reads anyway: a package written against torch's stable ABI is said to be one
        found = stable_abi.detect(stable_abi.source_files(prepare_matrix_source(mf).tree))
        hint = f"; hint: {found}" if found else ""
    return (
        f"{matrix}: ok: {len(plan.jobs)} jobs in {len(plan.variants)} variants, "
        f"{len(plan.dropped)} dropped, {unknown} unknown"
        + (f", {covered} Pythons covered by abi3 wheels" if covered else "")
        + patched
        + hint
    )


@app.command("matrix")
def matrix_command(
    matrix: Annotated[Path, MATRIX_OPTION] = Path("matrix.yaml"),
    as_json: Annotated[bool, json_option()] = False,
    fmt: Annotated[
        Format,
        typer.Option(
            "--format",
            "-f",
            metavar="FORMAT",
            help="table, or github: the matrix for a GitHub Actions workflow (json: deprecated, use --json).",
        ),
    ] = Format.table,
    only: Annotated[str | None, ONLY_OPTION] = None,
    no_prune: Annotated[bool, typer.Option("--no-prune", help="Show the raw expansion.")] = False,
    check: Annotated[
        bool,
        typer.Option(
            "--check", help="Only validate, the recipe's patches against the source too; exit 0 or 2."
        ),
    ] = False,
    no_source: Annotated[
        bool, typer.Option("--no-source", help="With --check: do not fetch the source to try the patches.")
    ] = False,
    trust_paths: Annotated[bool, TRUST_PATHS] = False,
    flavor: Annotated[str | None, FLAVOR_OPTION] = None,
    unpublished: Annotated[
        bool,
        typer.Option("--unpublished", help="With --format github: only jobs whose wheel publish.to lacks."),
    ] = False,
    chunk: Annotated[
        str,
        typer.Option(
            "--chunk", metavar="I/K", help="With --format github: chunk I/K of the jobs (a matrix holds 256)."
        ),
    ] = "1/1",
    github_output: Annotated[
        Path | None,
        typer.Option(
            "--github-output",
            metavar="FILE",
            help="With --format github: append matrix= and count= to this file ($GITHUB_OUTPUT).",
        ),
    ] = None,
    shards: Annotated[
        int | None,
        typer.Option(
            "--shards",
            metavar="N",
            help="With --format github: N shard jobs per job, then its final job (two matrices).",
        ),
    ] = None,
    runner: Annotated[
        list[str] | None,
        typer.Option(
            "--runner",
            metavar="PLATFORM=LABELS",
            help="With --format github: the runs-on labels of that platform's jobs (comma-separated, or "
            "JSON), instead of its own (a host of the platform: its builds never run emulated); repeatable.",
        ),
    ] = None,
    requests: Annotated[
        str | None,
        typer.Option(
            "--requests",
            metavar="DIR_OR_URL",
            help="Add the build requests of this index directory (its _requests/) that compatibility allows.",
        ),
    ] = None,
) -> None:
    """Expand a matrix file into jobs: variant ids, Pythons, arch sets, and what was dropped and why."""
    part = parse_chunk(chunk)
    if as_json and fmt is not Format.table:
        raise ConfigError(f"--json and --format {fmt}: give one")
    if fmt is not Format.github and (unpublished or github_output or part != Chunk() or runner):
        raise ConfigError(
            "--unpublished, --chunk, --runner and --github-output apply to --format github only"
        )
    runners = parse_runners(runner or ())
    mf, plan = plan_file(
        matrix,
        trust_paths=trust_paths,
        flavor=flavor,
        only=only,
        prune=not no_prune,
        warn=lambda line: typer.echo(f"warning: {line}", err=True),
    )
    if requests is not None:
        from factory.plan.requestplan import add_requests
        from factory.plan.variantrequest import read_requests, requests_directory

        said = read_requests(
            requests_directory(requests), warn=lambda line: typer.echo(f"warning: {line}", err=True)
        )
        plan = add_requests(mf, plan, said)
    if shards is not None and (fmt is not Format.github or not 1 <= shards <= sharding.MAX_SHARDS):
        raise ConfigError(f"--shards {shards}: needs --format github and 1 to {sharding.MAX_SHARDS} shards")
    if check:
        typer.echo(_check_line(mf, plan, matrix, fetch=not no_source))
        return
    if as_json:
        echo_json(plan.to_json())
        return
    if fmt is Format.json:
        typer.echo("warning: --format json is deprecated: use --json (with the dropped rows too)", err=True)
        echo_json([j.to_json() for j in plan.jobs])
        return
    if fmt is Format.github:
        from factory.build.pipeline import github_plan

        def say(line: str) -> None:
            typer.echo(line, err=True)

        for line in _resolution_lines(plan):
            say(line)
        github = github_plan(
            mf,
            plan.jobs,
            chunk=part,
            skip_published=unpublished,
            shards=shards,
            github_output=github_output,
            log=say,
            runners=runners,
        )
        typer.echo(github)
        return
    for line in _resolution_lines(plan):
        typer.echo(line)
    console = table_console()
    title = f"{shown_name(mf.package.name)} {shown_name(mf.package.version)} ({matrix})"
    console.print(_table(plan, title, mf))
    covered = sum(len(j.covers) for j in plan.jobs)
    console.print(
        f"{len(plan.jobs)} jobs in {len(plan.variants)} variants; {len(plan.dropped)} dropped"
        + (f"; {covered} more Pythons covered by abi3 wheels" if covered else "")
        + ("" if not no_prune else " (not pruned)")
    )
