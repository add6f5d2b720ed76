"""The `factory` command line: a thin Typer layer over the library modules.

Each area registers its commands from its own module, `<area>_cmd.py` (named apart from the library modules
and packages it calls: `cli/verify_cmd.py` is the CLI of `consume/verify.py`), so the areas stay independent.
"""

from __future__ import annotations

import math
import sys
from typing import Annotated

import typer

from factory import version
from factory.cli.helpstyle import FactoryGroup
from factory.core.errors import ConfigError, FactoryError

app = typer.Typer(
    name="factory",
    cls=FactoryGroup,
    help="Build, check and publish torch CUDA extension wheels in containers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # every command's context inherits them from the top one's, as pip and uv spell help
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"factory {version()}")
        raise typer.Exit()


@app.callback()
def _top(
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Show the version and exit."),
    ] = False,
) -> None:
    pass


def _register() -> None:
    import importlib

    for name in (
        "matrix_cmd",
        "build_cmd",
        "images_cmd",
        "publish_cmd",
        "index_cmd",
        "memory_cmd",
        "recipes_cmd",
        "source_cmd",
        "clean_cmd",
        "cache_cmd",
        "verify_cmd",
        "rebuild_cmd",
        "compat_cmd",
        "inspect_cmd",
    ):
        try:
            importlib.import_module(f"factory.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"factory.cli.{name}":
                raise


# before _register(): the command modules import it
def cpus_option(value: float | None) -> float | None:
    """A --cpus option as given: None, or a finite number of CPUs from MIN_CPUS to MAX_CPUS."""
    from factory.spec.options import MAX_CPUS, MIN_CPUS

    if value is not None and not (math.isfinite(value) and value > 0):
        raise ConfigError(f"--cpus must be a positive number of CPUs, not {value:g}")
    if value is not None and value < MIN_CPUS:
        raise ConfigError(f"--cpus must be at least {MIN_CPUS:g}, not {value:g}")
    if value is not None and value > MAX_CPUS:
        raise ConfigError(f"--cpus must be at most {MAX_CPUS}, not {value:g}")
    return value


def size_option(value: str, option: str, *, minimum: int = 1) -> int:
    """A size option (--memory 16GiB) in bytes, from `minimum` to MAX_SIZE."""
    from factory.core.units import format_size, parse_size
    from factory.spec.options import MAX_SIZE

    try:
        size = parse_size(value)
    except ValueError as exc:
        raise ConfigError(f"{option}: {exc}") from None
    if size > MAX_SIZE:
        raise ConfigError(f"{option} {value} is above {format_size(MAX_SIZE)}")
    if size < minimum:
        raise ConfigError(f"{option} {value} is below {format_size(minimum)}")
    return size


_register()


def usage_error(exc: Exception) -> int | None:
    """Say one of click's errors (a bad option, an unknown command, a missing value) in one line and return
    its exit code (2 for usage); None for any other exception.

    Typer carries its own copy of click since 0.2x (`typer._click`) and used click itself before, so these
    are known by what every click error has, `format_message` and an int `exit_code`, not by one class."""
    message = getattr(exc, "format_message", None)
    code = getattr(exc, "exit_code", None)
    if not callable(message) or not isinstance(code, int):
        return None
    if type(exc).__name__ == "NoArgsIsHelpError":
        # `factory`, or a command group, alone: its help is the answer
        typer.echo(message(), err=True)
        return code
    ctx = getattr(exc, "ctx", None)
    path = getattr(ctx, "command_path", "")
    hint = f" (see {path} --help)" if path else ""
    typer.echo(f"error: {' '.join(str(message()).split())}{hint}", err=True)
    return code


def main() -> None:
    try:
        sys.exit(app(prog_name="factory", standalone_mode=False) or 0)
    except FactoryError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # click's usage errors arrive here with standalone_mode=False
        code = usage_error(exc)
        if code is None:
            raise
        sys.exit(code)
