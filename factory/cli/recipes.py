"""`factory recipes`: the built-in recipes, the package and versions each patch set was made for."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from factory.cli import app
from factory.options import Recipe
from factory.recipes import BUILTIN_RECIPES


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


@app.command("recipes")
def recipes_command(
    paths: Annotated[
        bool, typer.Option("--paths", help="Print the path of each patch file instead.")
    ] = False,
) -> None:
    """The built-in recipes (`recipe: NAME` in a matrix file) and the versions their patches were made for."""
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
    console = Console(width=max(Console().width, 140))
    console.print(table)
