"""`factory index repair` and `factory index check`: rebuild a published index's pages from the wheel
files in it; check that it is whole."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from factory.cli import app
from factory.cli.matrix import TRUST_PATHS

index_app = typer.Typer(help="Look after a published index.", no_args_is_help=True)
app.add_typer(index_app, name="index")


@index_app.command("repair")
def repair(
    to: Annotated[
        str, typer.Option("--to", metavar="DEST", help="Index directory or s3://bucket/prefix.")
    ] = ("./index"),
    endpoint_url: Annotated[
        str | None,
        typer.Option(
            "--endpoint-url", metavar="URL", help="S3-compatible endpoint (credentials: AWS chain)."
        ),
    ] = None,
) -> None:
    """Rewrite every page of an index from the wheel files present in it.

    For an index that was damaged; not while anyone publishes to it."""
    from factory.publish import repair_index

    result = repair_index(to=to, endpoint_url=endpoint_url)
    for line in result.skipped:
        typer.echo(f"not listed: {line}")
    typer.echo(
        f"index: {result.destination}: {result.wheels} wheels in {len(result.variant_ids)} variant indexes "
        f"({len(result.pages_written)} page objects written)"
    )


@index_app.command("check")
def check(
    to: Annotated[
        str | None,
        typer.Option(
            "--to", metavar="DEST", help="Index directory or s3://bucket/prefix (default: publish.to)."
        ),
    ] = None,
    endpoint_url: Annotated[
        str | None,
        typer.Option(
            "--endpoint-url", metavar="URL", help="S3-compatible endpoint (credentials: AWS chain)."
        ),
    ] = None,
    matrix: Annotated[
        Path | None,
        typer.Option(
            "--matrix", "-m", metavar="FILE", help="Show its jobs not published as not built, and name them."
        ),
    ] = None,
    trust_paths: Annotated[bool, TRUST_PATHS] = False,
) -> None:
    """Check that an index is whole; exit 1 when not (safe while others publish).

    Every page lists only files that are there with its bytes, every wheel is listed and every page is its
    state's rendering."""
    from factory.indexcheck import check_published

    result = check_published(to=to, endpoint_url=endpoint_url, matrix=matrix, trust_paths=trust_paths)
    for line in result.problems:
        typer.echo(f"problem: {line}")
    if result.planned:
        typer.echo(f"{result.planned - len(result.missing)} of {result.planned} planned jobs published")
        for job_id in result.missing:
            typer.echo(f"not published: {job_id}")
    typer.echo(
        f"index: {result.destination}: {result.wheels} wheels in {len(result.variant_ids)} variant indexes, "
        f"{len(result.problems)} problems"
    )
    if not result.ok:
        for line in result.advice():
            typer.echo(line, err=True)
        raise typer.Exit(1)
