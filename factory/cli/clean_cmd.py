"""`factory clean`: remove what runs and publishes that are gone (killed, crashed) left behind."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from factory.cli import app


@app.command("clean")
def clean(
    output: Annotated[
        list[Path] | None,
        typer.Option(
            "--output",
            "-o",
            metavar="DIR",
            help="A build's output directory (repeatable): its dead runs' .tmp-* directories go.",
        ),
    ] = None,
    to: Annotated[
        list[Path] | None,
        typer.Option(
            "--to",
            metavar="DIR",
            help="A local index directory (repeatable): its dead publishes' temporary files go.",
        ),
    ] = None,
    containers: Annotated[
        bool,
        typer.Option(
            help="Remove the build containers of dead runs on this host, and their jobs' directories in the "
            "work volume (needs Docker)."
        ),
    ] = True,
) -> None:
    """Remove what factory runs that died (killed, crashed) left behind.

    One line each; a live run's stay. Half-made downloads and source trees in $FACTORY_HOME go too."""
    from factory.build.cleanup import clean as remove_leftovers

    for item in remove_leftovers(outputs=output or [], indexes=to or [], containers=containers):
        typer.echo(f"removed {item}")
