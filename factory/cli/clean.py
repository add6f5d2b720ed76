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
    from factory import leftovers
    from factory.cache import local_dir, remove_stale_outboxes
    from factory.errors import ConfigError
    from factory.home import factory_home
    from factory.source import remove_stale_partials
    from factory.stores import LocalStore

    for directory in [*(output or []), *(to or [])]:
        if not directory.is_dir():  # an s3:// index has no temporaries: its writes are whole
            raise ConfigError(f"{directory}: not a local directory")
    if containers:
        from factory.engine import connect, remove_stale_containers
        from factory.images import housekeeping_image, list_images
        from factory.jobspec import WORK_VOLUME

        client = connect()
        for name in remove_stale_containers(client):
            typer.echo(f"removed container {name}")
        image = housekeeping_image(list_images(client))
        for job_dir in leftovers.remove_stale_job_dirs(client, image=image):
            typer.echo(f"removed {WORK_VOLUME}:{job_dir}")
    for directory in output or []:
        for path in leftovers.remove_stale_output_dirs(directory.resolve()):
            typer.echo(f"removed {path}")
    for directory in to or []:
        for path in LocalStore(directory.resolve()).remove_stale_temporaries():
            typer.echo(f"removed {path}")
    for path in remove_stale_partials(factory_home()):
        typer.echo(f"removed {path}")
    for path in remove_stale_outboxes(local_dir()):
        typer.echo(f"removed {path}")
