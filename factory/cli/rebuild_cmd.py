"""`factory rebuild`: a wheel built again from its own provenance and compared with it byte for byte.
`factory verify --rebuild` is its older spelling and runs the same (`run_rebuild`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from factory.cli import app
from factory.cli.matrix_cmd import TRUST_PATHS
from factory.cli.output import echo_json, json_option

if TYPE_CHECKING:
    from factory.build.rebuild import RebuildOptions

REBUILD_CACHE_OPTION = typer.Option(
    "--cache",
    metavar="DEST|local|off",
    help="Compile through this compile cache (a store: directory or s3://; local: this home's) to check "
    "it, or off.",
)
REBUILD_SOURCE_OPTION = typer.Option(
    "--source", metavar="DIR", help="The source directory of a wheel built from one (source: {path})."
)
REBUILD_MATRIX_OPTION = typer.Option(
    "--matrix",
    "-m",
    metavar="FILE",
    help="Your matrix file. The rebuild takes the wheel's patches from its files (by sha256), its source "
    "directory, and may use the images and torch indexes it names.",
)
REBUILD_FOREIGN_OPTION = typer.Option(
    "--allow-foreign",
    metavar="KIND",
    help="Use what only the wheel names, which your matrix does not: 'image' (a builder or base image, "
    "pulled and run), 'torch-index' (where torch is fetched). Repeatable.",
)
REBUILD_WORKDIR_OPTION = typer.Option(
    "--workdir",
    metavar="DIR",
    help="Rebuild here and keep it (its matrix, patches, rebuilt wheel and report); default: a temporary "
    "directory.",
)


@app.command()
def rebuild(
    wheel: Annotated[
        str, typer.Argument(metavar="WHEEL_OR_URL", help="A wheel file, or its URL on an index.")
    ],
    cache: Annotated[str, REBUILD_CACHE_OPTION] = "off",
    source: Annotated[Path | None, REBUILD_SOURCE_OPTION] = None,
    matrix: Annotated[Path | None, REBUILD_MATRIX_OPTION] = None,
    trust_paths: Annotated[bool, TRUST_PATHS] = False,
    allow_foreign: Annotated[list[str] | None, REBUILD_FOREIGN_OPTION] = None,
    workdir: Annotated[Path | None, REBUILD_WORKDIR_OPTION] = None,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Build a wheel again from its own provenance (its rebuild section) and compare the two byte for byte;
    exit 1 naming the first differing file (and ELF section) if they differ.

    A wheel's provenance is read as input from anyone: the rebuild keeps the build's network off, takes
    the source as recorded (the sdist or commit by hash, or --source DIR), each patch only as a file of
    yours with the sha256 recorded, and refuses an image or torch index your matrix does not name unless
    --allow-foreign names its kind."""
    options = rebuild_options(
        cache=cache,
        source=source,
        matrix=matrix,
        trust_paths=trust_paths,
        workdir=workdir,
        allow_foreign=allow_foreign,
    )
    run_rebuild(wheel, options, as_json=as_json)


def rebuild_options(
    *,
    cache: str,
    source: Path | None,
    matrix: Path | None,
    trust_paths: bool,
    workdir: Path | None,
    allow_foreign: list[str] | None,
) -> RebuildOptions:
    from factory.build.rebuild import RebuildOptions, check_allowed

    return RebuildOptions(
        cache=cache,
        source=source,
        matrix=matrix,
        trust_paths=trust_paths,
        workdir=workdir,
        allow_foreign=check_allowed(allow_foreign or []),
    )


def run_rebuild(wheel: str, options: RebuildOptions, *, as_json: bool) -> None:
    """The build's progress as `factory build` shows it (on stderr), then one line (or JSON); exit 0 when
    the rebuild is byte-identical, else 1."""
    from rich.console import Console

    from factory.build.rebuild import Hooks, rebuild_and_compare
    from factory.cli.progress import BuildDisplay

    if options.workdir is not None:
        report = str(options.workdir / "out" / "report.json")
    else:
        report = "(gone with the temporary work directory; --workdir DIR keeps it)"
    display = BuildDisplay(Console(stderr=True), report_path=report)
    hooks = Hooks(on_change=display.on_change, showing=display.showing, finished=display.finished)
    result = rebuild_and_compare(wheel, options, log=display.say, hooks=hooks)
    if as_json:
        echo_json(result.to_json())
    else:
        typer.echo(result.line())
    sys.exit(0 if result.ok else 1)
