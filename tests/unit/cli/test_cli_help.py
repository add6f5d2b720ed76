"""`factory ... --help` as pip and uv show theirs: flags alone, values by metavar, no Python types, each
command's summary whole on one line."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from factory.cli import app
from factory.cli.helpstyle import reflow

runner = CliRunner()
WIDE = {"COLUMNS": "250", "TERM": "dumb"}  # wide enough that no summary needs a second line
PYTHON_TYPE = re.compile(
    r"<(bool|str|int|float|path|list\[[^>]*\]|[a-z_]+\[[^>]*\])>|<(text|integer|boolean)>"
)


def _paths() -> list[list[str]]:
    """Every command and group, as the argv that names it."""
    group = typer.main.get_command(app)
    ctx = group.make_context("factory", [], resilient_parsing=True)
    out: list[list[str]] = [[]]

    def walk(command: Any, path: list[str]) -> None:
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            out.append([*path, name])
            if hasattr(sub, "commands"):
                walk(sub, [*path, name])

    walk(group, [])
    return out


PATHS = _paths()


def test_every_command_is_walked() -> None:
    assert ["build"] in PATHS and ["images", "list"] in PATHS and ["memory", "plan"] in PATHS


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "factory")
def test_help_shows_no_python_types(path: list[str]) -> None:
    result = runner.invoke(app, [*path, "--help"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert PYTHON_TYPE.search(result.output) is None, result.output


def _option_row(output: str, option: str) -> str:
    (row,) = [line for line in output.splitlines() if re.search(rf"│\s*{re.escape(option)}\b", line)]
    return row


def test_a_flag_is_shown_alone_and_a_value_by_its_metavar() -> None:
    output = runner.invoke(app, ["build", "--help"], env=WIDE).output
    dry_run = _option_row(output, "--dry-run")
    assert re.search(r"--dry-run\s+Show the jobs", dry_run), dry_run
    assert re.search(r"--matrix\s+-m\s+FILE\s+The matrix file", _option_row(output, "--matrix"))
    assert re.search(r"--help\s+-h\s+Show this message", _option_row(output, "--help"))
    clean = runner.invoke(app, ["clean", "--help"], env=WIDE).output
    assert re.search(r"--output\s+-o\s+DIR\s+A build's output directory", _option_row(clean, "--output"))


def test_every_command_summary_is_one_whole_line() -> None:
    for group in ([], ["images"], ["index"], ["memory"], ["cache"], ["source"]):
        output = runner.invoke(app, [*group, "--help"], env=WIDE).output
        panel = output[output.index("Commands") :]
        rows = [line.strip("│ ").rstrip() for line in panel.splitlines()[1:] if line.startswith("│")]
        # a row that continues the one above starts with spaces where a command's name would be
        continued = [row for row in panel.splitlines()[1:] if re.match(r"│\s{3,}\S", row)]
        assert continued == [], output
        assert all(row.endswith((".", ")")) for row in rows), rows


def test_reflow_joins_the_lines_of_each_paragraph() -> None:
    assert reflow("One\n    sentence.\n\n    Two\n    more.") == "One sentence.\n\nTwo more."
    assert reflow("\b\nkept\nas is") == "\b\nkept\nas is"
    assert reflow(None) is None
