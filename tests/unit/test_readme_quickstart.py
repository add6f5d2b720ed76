"""README's "Your own package" walk stays true: every `factory ...` command line it shows names a command and
options the CLI has, and the matrix its YAML blocks make together loads and means what the walk says."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
from ruamel.yaml import YAML

from factory.cli import app
from factory.spec.config import load_matrix_file

ROOT = Path(__file__).resolve().parents[2]
HEADING = "## Your own package"
FENCE = re.compile(r"^[ \t]*```(\w+)\n(.*?)^[ \t]*```", re.S | re.M)


def section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.count(HEADING + "\n") == 1, f"README.md has no single {HEADING!r} section"
    body = text.split(HEADING + "\n", 1)[1]
    return body.split("\n## ", 1)[0]


def blocks(language: str) -> list[str]:
    """The section's code blocks in `language`, dedented as the list items indent them."""
    out = []
    for lang, body in FENCE.findall(section()):
        if lang == language:
            lines = body.splitlines()
            indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
            out.append("\n".join(line[indent:] for line in lines))
    return out


def command_lines() -> list[list[str]]:
    """Each `factory ...` command of the section's shell blocks, as its words (comments dropped, `&&` chains
    split)."""
    out = []
    for block in blocks("sh"):
        for line in block.splitlines():
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                if words[:1] == ["factory"]:
                    out.append(words[1:])
    return out


def check_command(words: list[str]) -> None:
    """The words name commands of the CLI down to a leaf, and each option word is one of its options."""
    command: Any = typer.main.get_command(app)  # Typer may carry its own click: no isinstance on click's
    ctx = command.make_context("factory", [], resilient_parsing=True)
    path = ["factory"]
    rest = list(words)
    while hasattr(command, "commands") and rest and not rest[0].startswith("-"):
        sub = command.get_command(ctx, rest[0])
        assert sub is not None, f"README: `{' '.join(path)} {rest[0]}`: no such command"
        path.append(rest.pop(0))
        command = sub
        ctx = command.make_context(path[-1], [], parent=ctx, resilient_parsing=True)
    assert not hasattr(command, "commands") or "--version" in rest, (
        f"README: `{' '.join(path)}` names a command group, not a command"
    )
    options = {opt for param in command.get_params(ctx) for opt in (*param.opts, *param.secondary_opts)}
    for word in rest:
        if word.startswith("-"):
            option = word.split("=", 1)[0]
            assert option in options, f"README: `{' '.join(path)}` has no option {option}"


def test_the_section_shows_the_whole_walk() -> None:
    """The walk the issue asks for, in the order a user meets it."""
    commands = [" ".join(words) for words in command_lines()]
    order = [
        "--version",
        "matrix -m my-ext.yaml",
        "build -m my-ext.yaml --preflight",
        "source unpack",
        "source diff",
        "build -m my-ext.yaml -m torch-scatter.yaml --publish",
        "publish",
        "which",
    ]
    at = [next((i for i, c in enumerate(commands) if c.startswith(step)), -1) for step in order]
    assert -1 not in at, dict(zip(order, at, strict=True))
    assert at == sorted(at), commands


@pytest.mark.parametrize("words", command_lines(), ids=lambda w: " ".join(w))
def test_every_command_and_option_exists(words: list[str]) -> None:
    check_command(words)


def test_the_checker_catches_a_wrong_command() -> None:
    with pytest.raises(AssertionError, match="no such command"):
        check_command(["biuld", "--publish"])
    with pytest.raises(AssertionError, match="no option --no-such"):
        check_command(["build", "--no-such"])


def merge(into: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """`more` over `into`, mappings merged key by key (the later steps add to step 2's matrix)."""
    out = dict(into)
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def test_the_matrix_the_walk_writes_loads(tmp_path: Path) -> None:
    """Every key of the section's YAML is one the loader takes, and means what the walk says: a recipe
    mapping without base: keeps torch-ext's FORCE_CUDA=1 under its own env, extra_requires reaches the recipe,
    the glibc floor and the check indexes reach the build options. The source is a path here (no network)."""
    doc: dict[str, Any] = {}
    for block in blocks("yaml"):
        doc = merge(doc, YAML(typ="safe").load(block))
    (tmp_path / "src").mkdir()
    doc["package"]["source"] = {"path": "src"}
    for patch in doc.get("recipe", {}).get("patches", []):
        (tmp_path / patch).write_text("")
    path = tmp_path / "my-ext.yaml"
    path.write_text(json.dumps(doc), encoding="utf-8")  # JSON is YAML

    mf = load_matrix_file(path)

    assert mf.recipe.env["FORCE_CUDA"] == "1"
    assert dict(mf.recipe.env).items() >= doc["recipe"]["env"].items()
    assert tuple(mf.recipe.extra_requires) == tuple(doc["recipe"]["extra_requires"])
    assert mf.build.glibc is not None
    assert mf.build.check_indexes == tuple(doc["build"]["check_indexes"])
    assert mf.build.flavor == doc["build"]["flavor"]
