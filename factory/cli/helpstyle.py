"""How `--help` shows the factory's commands, the way pip and uv show theirs: a flag is its name alone, a
value is named by its metavar (FILE, SIZE, N), never by a Python type (`<bool>`, `<list[Path]>`), and a
command's summary is its first paragraph on one line, never cut where the source wrapped it.

Typer builds the click commands anew on each call; the top group (`FactoryGroup`) tidies each command as
click resolves it, before any help is rendered. Typer carries its own copy of click since 0.2x (and used click
before), so commands and parameters are known here by what both have (`opts`, `is_flag`, `params`), not by
class.
"""

from __future__ import annotations

import inspect
from typing import Any

from typer.core import TyperGroup

Command = Any  # a click command or group, of typer's click or click itself
Parameter = Any  # an option or argument, likewise
Context = Any


def reflow(text: str | None) -> str | None:
    """Each paragraph of a docstring on one line (typer keeps single line breaks as they are in the
    source); a paragraph that starts with click's no-rewrap mark `\\b` stays as written."""
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split()) for p in paragraphs)


def _no_type(*_args: Any, **_kwargs: Any) -> None:
    return None


def metavar_for(param: Parameter) -> str:
    """A value's name when the command gives none: the option's long name in capitals, as uv does."""
    longest = max(param.opts, key=len) if param.opts else param.name or "value"
    return longest.lstrip("-").replace("-", "_").upper()


def tidy_param(param: Parameter) -> None:
    if param.param_type_name == "argument" and param.metavar is None:
        param.metavar = (param.name or "value").upper()
    if getattr(param, "is_flag", False) or param.param_type_name == "argument":
        # a flag takes no value; an argument's metavar is in the name column already
        setattr(param, "display_type_rich", _no_type)  # noqa: B010 - typer renders the type from this method
    elif param.metavar is None:
        param.metavar = metavar_for(param)


def tidy(command: Command, ctx: Context) -> None:
    """`command`, and each command under it, as the module's docstring says."""
    command.help = reflow(command.help)
    help_option = command.get_help_option(ctx)
    for param in [*command.params, *([help_option] if help_option is not None else [])]:
        tidy_param(param)
    for sub in getattr(command, "commands", {}).values():
        tidy(sub, ctx)


class FactoryGroup(TyperGroup):
    """The `factory` group: tidies each command as click looks it up, and its own options."""

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            tidy(command, ctx)
        return command

    def get_params(self, ctx: Context) -> list[Parameter]:
        params = super().get_params(ctx)
        for param in params:
            tidy_param(param)
        return params
