"""The `factory` command line: a thin Typer layer over the library modules.

Each area registers its commands from its own module so the areas stay independent.
"""

from __future__ import annotations

import sys

import typer

from factory.errors import FactoryError

app = typer.Typer(
    name="factory",
    help="Build, check and publish torch CUDA extension wheels in containers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register() -> None:
    import importlib

    for name in ("matrix", "build", "images", "publish", "memory"):
        try:
            importlib.import_module(f"factory.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"factory.cli.{name}":
                raise


_register()


def main() -> None:
    try:
        sys.exit(app(standalone_mode=False) or 0)
    except FactoryError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # click's usage errors arrive here with standalone_mode=False
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(2 if isinstance(exc, click.exceptions.UsageError) else exc.exit_code)
        if isinstance(exc, click.exceptions.Abort):
            typer.echo("aborted", err=True)
            sys.exit(130)
        raise
