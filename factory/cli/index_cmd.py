"""`factory index repair`, `factory index check` and `factory index audit`: rebuild a published index's
pages from the wheel files in it; check that it is whole; check every wheel in it against what it claims."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from factory.cli import app
from factory.cli.matrix_cmd import TRUST_PATHS
from factory.cli.output import echo_json, json_option
from factory.core.errors import ConfigError

ENDPOINT_URL = typer.Option(
    "--endpoint-url", metavar="URL", help="S3-compatible endpoint (credentials: AWS chain)."
)
DEST_OR_PUBLISH_TO = typer.Option(
    "--to", metavar="DEST", help="Index directory or s3://bucket/prefix (default: publish.to)."
)

index_app = typer.Typer(help="Look after a published index.", no_args_is_help=True)
app.add_typer(index_app, name="index")


@index_app.command("repair")
def repair(
    to: Annotated[
        str, typer.Option("--to", metavar="DEST", help="Index directory or s3://bucket/prefix.")
    ] = ("./index"),
    endpoint_url: Annotated[str | None, ENDPOINT_URL] = None,
) -> None:
    """Rewrite every page of an index from the wheel files present in it.

    For an index that was damaged; not while anyone publishes to it."""
    from factory.publish.publisher import repair_index

    result = repair_index(to=to, endpoint_url=endpoint_url)
    for line in result.skipped:
        typer.echo(f"not listed: {line}")
    typer.echo(
        f"index: {result.destination}: {result.wheels} wheels in {len(result.variant_ids)} variant indexes "
        f"({len(result.pages_written)} page objects written)"
    )


@index_app.command("check")
def check(
    to: Annotated[str | None, DEST_OR_PUBLISH_TO] = None,
    endpoint_url: Annotated[str | None, ENDPOINT_URL] = None,
    matrix: Annotated[
        Path | None,
        typer.Option(
            "--matrix", "-m", metavar="FILE", help="Show its jobs not published as not built, and name them."
        ),
    ] = None,
    trust_paths: Annotated[bool, TRUST_PATHS] = False,
) -> None:
    """Check that an index is whole; exit 1 when not (safe while others publish).

    Every page lists only files that are there with its bytes, every wheel is listed and every page is its
    state's rendering."""
    from factory.publish.indexcheck import check_published

    result = check_published(to=to, endpoint_url=endpoint_url, matrix=matrix, trust_paths=trust_paths)
    for line in result.problems:
        typer.echo(f"problem: {line}")
    if result.planned:
        typer.echo(f"{result.planned - len(result.missing)} of {result.planned} planned jobs published")
        for job_id in result.missing:
            typer.echo(f"not published: {job_id}")
    typer.echo(
        f"index: {result.destination}: {result.wheels} wheels in {len(result.variant_ids)} variant indexes, "
        f"{len(result.problems)} problems"
    )
    if not result.ok:
        for line in result.advice():
            typer.echo(line, err=True)
        raise typer.Exit(1)


@index_app.command("audit")
def audit(
    to: Annotated[str | None, DEST_OR_PUBLISH_TO] = None,
    endpoint_url: Annotated[str | None, ENDPOINT_URL] = None,
    key: Annotated[
        Path | None,
        typer.Option(
            "--key",
            metavar="PUB",
            help="Every wheel must be signed with this Ed25519 public key (a missing signature: a problem).",
        ),
    ] = None,
    matrix: Annotated[
        Path | None,
        typer.Option(
            "--matrix",
            "-m",
            metavar="FILE",
            help="Check each wheel's provenance against the job that builds it.",
        ),
    ] = None,
    trust_paths: Annotated[bool, TRUST_PATHS] = False,
    rebuild: Annotated[
        int,
        typer.Option(
            "--rebuild",
            metavar="N",
            help="Rebuild N wheels chosen at random from their provenance and compare them bit for bit "
            "(needs Docker; default 0).",
        ),
    ] = 0,
    report: Annotated[
        Path | None,
        typer.Option("--report", metavar="FILE", help="Write the audit as JSON to FILE as well."),
    ] = None,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Check every published wheel against its page, signature, provenance and label; exit 1 on any problem.

    Its size, sha256 and PEP 658 metadata; its signature (--key); its provenance against its label (and the
    matrix's job); its device code against its label's archs; its torch pin; the stable-ABI symbol rule;
    --rebuild N of them bit for bit. One line per problem; nothing is written to the index."""
    from factory.build.rebuild import rebuilder
    from factory.publish.indexaudit import audit_published

    def log(line: str) -> None:
        if rebuild:
            typer.echo(line, err=True)

    result = audit_published(
        to=to,
        endpoint_url=endpoint_url,
        key=key,
        matrix=matrix,
        trust_paths=trust_paths,
        rebuild=rebuild,
        rebuilder=rebuilder(matrix=matrix, trust_paths=trust_paths, log=log),
        log=log,
    )
    document = result.to_json()
    if report is not None:
        try:
            report.write_text(json.dumps(document, indent=2) + "\n")
        except OSError as exc:
            raise ConfigError(f"--report {report}: cannot write ({exc.strerror})") from None
    if as_json:
        echo_json(document)
    else:
        for problem in result.problems:
            typer.echo(f"problem: {problem.line()}")
        for audited in result.rebuilt:
            if audited.rebuilt and audited.rebuilt.get("ok"):
                typer.echo(f"rebuilt bit for bit: {audited.key}")
        if result.unplanned:
            typer.echo(f"{len(result.unplanned)} wheels no job of the matrix builds (not checked against it)")
        typer.echo(result.summary())
    if not result.ok:
        raise typer.Exit(1)
