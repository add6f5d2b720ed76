"""`factory index repair`: rebuild a published index's pages from the wheel files in it."""

from __future__ import annotations

from typing import Annotated

import typer

from factory.cli import app

index_app = typer.Typer(help="Look after a published index.", no_args_is_help=True)
app.add_typer(index_app, name="index")


@index_app.command("repair")
def repair(
    to: Annotated[str, typer.Option("--to", help="Index directory or s3://bucket/prefix.")] = "./index",
    endpoint_url: Annotated[
        str | None, typer.Option("--endpoint-url", help="S3-compatible endpoint (credentials: AWS chain).")
    ] = None,
) -> None:
    """Rewrite every page of an index from the wheel files present in it (after damage; not while
    anyone publishes to it)."""
    from factory.publish import repair_index

    result = repair_index(to=to, endpoint_url=endpoint_url)
    for line in result.skipped:
        typer.echo(f"not listed: {line}")
    typer.echo(
        f"index: {result.destination}: {result.wheels} wheels in {len(result.variant_ids)} variant indexes "
        f"({len(result.pages_written)} page objects written)"
    )
