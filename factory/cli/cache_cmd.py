"""`factory cache stats|prune`: the local compile cache (`$FACTORY_HOME/cache/compile`)."""

from __future__ import annotations

from typing import Annotated

import typer

from factory.cli import app
from factory.cli.output import echo_json, json_option

cache_app = typer.Typer(help="The local compile cache.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")


@cache_app.command("stats")
def stats(
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Entries, objects and bytes in the local compile cache, and its oldest and newest use."""
    from factory.cache.sync import local_dir
    from factory.cache.sync import stats as cache_stats
    from factory.core.units import format_size

    root = local_dir()
    s = cache_stats(root)
    if as_json:
        fields = {"entries": s.entries, "objects": s.objects, "bytes": s.bytes}
        echo_json({"path": str(root), **fields, "oldest": s.oldest, "newest": s.newest})
        return
    typer.echo(f"compile cache: {root}")
    typer.echo(f"entries: {s.entries}  objects: {s.objects}  size: {format_size(s.bytes)}")


@cache_app.command("prune")
def prune(
    max_size: Annotated[
        str | None,
        typer.Option("--max", metavar="SIZE", help="Keep at most this much (e.g. 10GiB); default 20GiB."),
    ] = None,
) -> None:
    """Remove the least recently used entries until the local compile cache fits in --max."""
    from factory.cache.sync import DEFAULT_MAX_BYTES, local_dir, parse_max
    from factory.cache.sync import prune as cache_prune
    from factory.core.units import format_size

    limit = DEFAULT_MAX_BYTES if max_size is None else parse_max(max_size, what="--max")
    result = cache_prune(limit, local_dir())
    typer.echo(
        f"compile cache: removed {result.removed_entries} entries ({format_size(result.removed_bytes)}), "
        f"kept {format_size(result.kept_bytes)}"
    )
