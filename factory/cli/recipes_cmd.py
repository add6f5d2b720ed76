"""`factory recipes`: the built-in recipes, the package and versions each patch set was made for."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from factory.cli import app
from factory.cli.output import echo_json, json_option, table_console
from factory.spec.options import Recipe
from factory.spec.recipes import BUILTIN_RECIPES


def recipe_row(recipe: Recipe) -> dict[str, str]:
    """What `factory recipes` shows of one recipe, as text."""
    return {
        "recipe": recipe.name,
        "package": recipe.package or "any (the default)",
        "versions": recipe.versions or "any",
        "patches": ", ".join(p.name for p in recipe.patches) or "-",
        "archs": f"{recipe.arch_env} ({'80;90' if recipe.arch_format == 'flash-attn' else '8.0;9.0'})",
        "env": " ".join(f"{k}={v}" for k, v in recipe.env.items()) or "-",
        "abi3": {None: "-", "auto": "lowest Python"}.get(recipe.py_limited_api, recipe.py_limited_api or "-"),
    }


def recipe_json(recipe: Recipe) -> dict[str, object]:
    """What `factory recipes --json` says of one recipe: its values, not their display."""
    return {
        "name": recipe.name,
        "package": recipe.package,
        "versions": recipe.versions,
        "patches": [str(p) for p in recipe.patches],
        "arch_env": recipe.arch_env,
        "arch_format": recipe.arch_format,
        "env": dict(recipe.env),
        "py_limited_api": recipe.py_limited_api,
        "compile_gib_per_arch": recipe.compile_gib_per_arch,
    }


@app.command("recipes")
def recipes_command(
    paths: Annotated[
        bool, typer.Option("--paths", help="Print the path of each patch file instead.")
    ] = False,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """The built-in recipes (`recipe: NAME` in a matrix file) and the versions their patches were made for."""
    if as_json:
        echo_json([recipe_json(r) for r in BUILTIN_RECIPES.values()])
        return
    if paths:
        for recipe in BUILTIN_RECIPES.values():
            for path in recipe.patches:
                typer.echo(f"{recipe.name}\t{path}")
        return
    table = Table(title="built-in recipes", expand=False)
    rows = [recipe_row(r) for r in BUILTIN_RECIPES.values()]
    for column in rows[0]:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row.values())
    table_console().print(table)
