"""`factory verify --rebuild WHEEL_OR_URL`: build a wheel again from its provenance and compare the bytes.

The signature check (`factory verify WHEEL --key PUB`) shares the command: each is its own option and its own
library call (`rebuild.verify_rebuild` here)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from factory.cli import app
from factory.cli.output import echo_json, json_option
from factory.errors import ConfigError


@app.command()
def verify(
    wheel: Annotated[
        str, typer.Argument(metavar="WHEEL_OR_URL", help="A wheel file, or an http(s) URL of one.")
    ],
    rebuild: Annotated[
        bool,
        typer.Option(
            "--rebuild",
            help="Build the wheel again from its provenance (its rebuild section) and compare the two "
            "byte for byte; exit 1 naming the first differing file (and ELF section) if they differ.",
        ),
    ] = False,
    cache: Annotated[
        str,
        typer.Option(
            "--cache",
            metavar="DEST|local|off",
            help="With --rebuild: compile through this compile cache (a store: directory or s3://; local: "
            "this home's) to check it, or off.",
        ),
    ] = "off",
    source: Annotated[
        Path | None,
        typer.Option(
            "--source",
            metavar="DIR",
            help="With --rebuild: the source directory of a wheel built from one (source: {path}).",
        ),
    ] = None,
    workdir: Annotated[
        Path | None,
        typer.Option(
            "--workdir",
            metavar="DIR",
            help="With --rebuild: rebuild here and keep it (its matrix, rebuilt wheel and report); "
            "default: a temporary directory.",
        ),
    ] = None,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Check a wheel: --rebuild builds it again from its own provenance and compares."""
    if not rebuild:
        raise ConfigError("give --rebuild (build the wheel again from its provenance and compare)")
    rebuild_and_compare(wheel, cache=cache, source=source, workdir=workdir, as_json=as_json)


def rebuild_and_compare(
    wheel: str, *, cache: str, source: Path | None, workdir: Path | None, as_json: bool
) -> None:
    """`--rebuild`: one line (or JSON), exit 0 when the rebuild is byte-identical, else 1."""
    from factory.rebuild import RebuildOptions, verify_rebuild

    options = RebuildOptions(cache=cache, source=source, workdir=workdir)
    result = verify_rebuild(wheel, options, log=lambda line: typer.echo(line, err=True))
    if as_json:
        echo_json(result.to_json())
    else:
        typer.echo(result.line())
    sys.exit(0 if result.ok else 1)
