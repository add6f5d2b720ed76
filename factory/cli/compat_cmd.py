"""`factory compat show`: what the factory knows about each torch, and where each fact came from."""

from __future__ import annotations

from typing import Annotated

import typer

from factory.cli import app
from factory.cli.output import echo_json, json_option
from factory.core.errors import ConfigError
from factory.core.urls import INDEX_SCHEMES, checked_url
from factory.core.variants import TORCH_VERSION
from factory.plan.torchcompat import compat_report

compat_app = typer.Typer(help="Compatibility knowledge: derived from the index, and compat.json.")
app.add_typer(compat_app, name="compat")


def _value(value: object) -> str:
    if isinstance(value, list):
        return ", ".join(str(v).lower() if isinstance(v, bool) else str(v) for v in value)
    return str(value).lower() if isinstance(value, bool) else str(value)


@compat_app.command("show")
def show_command(
    torch: Annotated[
        str | None, typer.Option("--torch", metavar="X.Y", help="Only this torch minor (2.14) or version.")
    ] = None,
    index: Annotated[
        list[str] | None,
        typer.Option(
            "--index",
            metavar="URL",
            help="Also read this index (a per-CUDA one, like build.torch_index's); repeatable.",
        ),
    ] = None,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Every fact about each torch: its CUDA builds, Pythons, glibc, C++11 ABI and C++ standard, read from
    the host's pip configuration's indexes (filenames, metadata, headers) and from compat.json, each with its
    source; compat.json wins where they differ, and the difference is shown."""
    if torch is not None and not TORCH_VERSION.fullmatch(torch):
        raise ConfigError(f"--torch {torch!r} is not a torch version like 2.14 or 2.14.1")
    for url in index or ():
        checked_url(url, schemes=INDEX_SCHEMES, what="--index")
    report = compat_report(torch=torch, urls=tuple(index or ()))
    if as_json:
        echo_json(report)
        return
    typer.echo(f"sources: {', '.join(report['sources'])}, compat.json ({report['precedence']})")
    for row in report["torch"]:
        typer.echo(f"torch {row['torch']}")
        for fact in row["facts"]:
            typer.echo(f"  {fact['key']}: {_value(fact['value'])}  [{fact['source']}]")
        for line in row["contradictions"]:
            typer.echo(f"  contradiction: {line}")
        for line in row["problems"]:
            typer.echo(f"  not read: {line}")
    for line in report["problems"]:
        typer.echo(f"not read: {line}")
