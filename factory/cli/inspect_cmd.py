"""`factory inspect WHEEL_OR_URL`: what built a wheel (its provenance) and what its SBOM lists."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from factory.cli import app
from factory.cli.output import echo_json, json_option
from factory.wheel import checkrecord, embedded


@app.command("inspect")
def inspect_command(
    wheel: Annotated[
        str, typer.Argument(metavar="WHEEL_OR_URL", help="A wheel file, or an http(s) URL of one.")
    ],
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Print what built a wheel (its provenance) and what its SBOM lists.

    From its .dist-info's factory-provenance.json: the source and patches, recipe, builder image,
    toolchain, torch, build requirements and job; and the components of its CycloneDX SBOM (sboms/).
    A wheel without them, or with malformed ones, fails in one line. The build record beside the wheel
    (<wheel>.build.json next to the file or URL: compile cache use, image id, times, CI run) is shown
    when there is one and it names this wheel; for a wheel file, its check's result: failed, with the
    reason, when its failure record (<wheel>.check-failed.json) is beside it, else what the build's
    report.json beside it says."""
    found = embedded.inspect(wheel)
    local = None if "://" in wheel else Path(wheel)
    if as_json:
        doc = embedded.to_json(found)
        if local is not None:
            doc["check"] = checkrecord.to_json(local)
        echo_json(doc)
        return
    for line in embedded.describe(found):
        typer.echo(line)
    if local is not None:
        typer.echo(checkrecord.describe(local))
