"""How commands print data. For scripts, one way: `--json`, an indented JSON document on stdout (fields in
the order the command gives them) and nothing else there. For people, tables that fit a terminal and stay
whole, one line a row, without one."""

from __future__ import annotations

import json

import typer
from rich.console import Console

JSON_HELP = "Print JSON instead of text (for scripts)."


def json_option() -> typer.models.OptionInfo:
    """The `--json` option, spelled and explained the same by every command."""
    return typer.Option("--json", help=JSON_HELP)


def echo_json(data: object) -> None:
    typer.echo(json.dumps(data, indent=2))


# Wide enough that no table the factory prints wraps: without a terminal, rows stay whole for grep and cut.
UNWRAPPED_WIDTH = 1_000


def table_console(*, minimum: int = 140) -> Console:
    """Where a command prints a table: a terminal at least `minimum` columns wide, else (a pipe, a file, a CI
    log) an unwrapped line per row, never a word broken across lines."""
    console = Console()
    if console.is_terminal:
        return Console(width=max(console.width, minimum))
    return Console(width=UNWRAPPED_WIDTH)
