"""`factory source`: the package's source as a build sees it, to write a patch for the recipe against."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from factory.build.source import PreparedSource, diff_trees, prepare_matrix_source, unpack_for_editing
from factory.cli import app
from factory.cli.matrix_cmd import MATRIX_OPTION
from factory.core.errors import ConfigError
from factory.spec.config import load_matrix_file

source_app = typer.Typer(help="Unpack a package's source to edit, and turn the edits into a patch.")
app.add_typer(source_app, name="source")

MatrixOption = Annotated[Path, MATRIX_OPTION]
DirArgument = Annotated[Path, typer.Argument(metavar="DIR", help="The directory with the source to edit.")]


def _prepared(matrix: Path) -> PreparedSource:
    return prepare_matrix_source(load_matrix_file(matrix))


@source_app.command("unpack")
def unpack_command(matrix: MatrixOption = Path("matrix.yaml"), directory: DirArgument = Path("src")) -> None:
    """Unpack the package's source into DIR as a build gets it: fetched, the recipe's patches applied."""
    prepared = _prepared(matrix)
    unpack_for_editing(prepared.tree, directory)
    of = f" ({prepared.sdist})" if prepared.sdist else ""
    typer.echo(f"{directory}: the source{of} with the recipe's patches applied; edit it, then")
    typer.echo(f"  factory source diff --matrix {matrix} {directory} -o my.patch")


@source_app.command("diff")
def diff_command(
    matrix: MatrixOption = Path("matrix.yaml"),
    directory: DirArgument = Path("src"),
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", metavar="FILE", help="Write the patch here (default: stdout)."),
    ] = None,
) -> None:
    """The edits made in DIR since `factory source unpack`, as a patch for the recipe's `patches:` list."""
    if not directory.is_dir():
        raise ConfigError(f"{directory} is not a directory (make it with `factory source unpack`)")
    text = diff_trees(_prepared(matrix).tree, directory)
    if output is None:
        typer.echo(text, nl=False)
        return
    output.write_text(text)
    files = sum(1 for line in text.splitlines() if line.startswith("+++ "))
    if files:
        typer.echo(f"{output}: {files} files changed; add it to the recipe's patches: (after the base's)")
    else:
        typer.echo(f"{output}: no changes (the patch is empty)", err=True)
