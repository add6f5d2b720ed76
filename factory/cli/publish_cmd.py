"""`factory publish`, `factory serve` and `factory which`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from factory.cli import app
from factory.cli.verify_cmd import SIGN_KEY_ENV_OPTION, SIGN_KEY_OPTION
from factory.core.errors import ConfigError


@app.command()
def publish(
    wheel_dir: Annotated[Path, typer.Argument(metavar="WHEEL_DIR", help="Directory of built wheels.")] = Path(
        "wheelhouse"
    ),
    to: Annotated[
        str, typer.Option("--to", metavar="DEST", help="Index directory or s3://bucket/prefix.")
    ] = ("./index"),
    endpoint_url: Annotated[
        str | None,
        typer.Option(
            "--endpoint-url", metavar="URL", help="S3-compatible endpoint (credentials: AWS chain)."
        ),
    ] = None,
    report: Annotated[
        Path | None,
        typer.Option(
            "--report", metavar="FILE", help="Build report (default: WHEEL_DIR/report.json if present)."
        ),
    ] = None,
    sign_key: Annotated[Path | None, SIGN_KEY_OPTION] = None,
    sign_key_env: Annotated[str | None, SIGN_KEY_ENV_OPTION] = None,
    force_failed: Annotated[
        bool,
        typer.Option(
            "--force-failed",
            help="Publish a wheel that failed its checks (its .check-failed.json beside it) anyway.",
        ),
    ] = False,
    variants: Annotated[
        bool,
        typer.Option(
            "--variants", help="Also as wheel variants (PEP 825, experimental) under DEST/variants/."
        ),
    ] = False,
) -> None:
    """Publish wheels into one simple index per variant (local directory or S3).

    A wheel that failed its checks (kept under check-failed/ with its failure record, or kept by a job of
    the report) is refused, and nothing is published, unless --force-failed."""
    from factory.publish.publisher import describe, publish_directory
    from factory.trust.signing import signer_from

    signer = signer_from(path=sign_key, env_name=sign_key_env)
    result = publish_directory(
        wheel_dir,
        to=to,
        endpoint_url=endpoint_url,
        report=report,
        signer=signer,
        force_failed=force_failed,
        variants=variants,
    )
    for line in describe(result):
        typer.echo(line)


@app.command()
def serve(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="Local index directory.")] = Path("index"),
    port: Annotated[int, typer.Option("--port", metavar="PORT", help="TCP port (0: any free port).")] = 8000,
    host: Annotated[
        str, typer.Option("--host", metavar="ADDRESS", help="Address to listen on.")
    ] = "127.0.0.1",
    basic_auth: Annotated[
        str | None,
        typer.Option("--basic-auth", metavar="USER:PASSWORD", help="Require this user (HTTP basic auth)."),
    ] = None,
    source: Annotated[
        str | None,
        typer.Option(
            "--from",
            metavar="SOURCE",
            help="The index to serve: a directory or s3://bucket/prefix (for DIR).",
        ),
    ] = None,
    endpoint_url: Annotated[
        str | None, typer.Option("--endpoint-url", metavar="URL", help="S3-compatible endpoint.")
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            metavar="SECONDS",
            help="Seconds a request head may take to arrive, or a connection idle.",
        ),
    ] = 30.0,
    accept_requests: Annotated[
        bool,
        typer.Option(
            "--accept-requests",
            help="Take build requests (factory which --request) into DIR/_requests/, rate-limited.",
        ),
    ] = False,
) -> None:
    """Serve a published index over HTTP (PEP 503 HTML and PEP 691 JSON by content negotiation)."""
    from factory.publish.serve import serve as serve_index

    def announce(line: str) -> None:
        typer.echo(line)
        sys.stdout.flush()

    serve_index(
        directory,
        source=source,
        endpoint_url=endpoint_url,
        host=host,
        port=port,
        basic_auth=basic_auth,
        timeout_s=timeout,
        accept_requests=accept_requests,
        announce=announce,
    )


@app.command()
def which(
    project: Annotated[
        str | None, typer.Argument(metavar="PROJECT", help="Project to install (default: all in the index).")
    ] = None,
    index: Annotated[
        str | None,
        typer.Option(
            "--index-url",
            "-i",
            "--index",
            metavar="URL",
            help="Index URL or directory (its root or its simple/ page); --index is the old spelling.",
        ),
    ] = None,
    python: Annotated[
        str | None,
        typer.Option(
            "--python", metavar="PYTHON", help="Interpreter whose torch decides (default: this one)."
        ),
    ] = None,
    request: Annotated[
        bool,
        typer.Option(
            "--request",
            help="When no variant fits: send what is missing to the index's server (factory serve "
            "--accept-requests), or write it into a local index's _requests/.",
        ),
    ] = False,
    verify_key: Annotated[
        Path | None,
        typer.Option(
            "--verify-key",
            metavar="PUB",
            help="Print the commands only if the wheels they install are signed with this public key.",
        ),
    ] = None,
    default_index: Annotated[
        str | None,
        typer.Option(
            "--default-index",
            metavar="URL",
            help="Index the commands take torch's and the project's dependencies from (default: PyPI); "
            "never the project itself.",
        ),
    ] = None,
) -> None:
    """Print the pip/uv command for the variant index that fits this host (torch, CUDA, ABI, GPUs; without
    torch: its driver), or what is missing and the matrix lines that would build it."""
    import os

    from factory.consume.which import advise
    from factory.publish.installcmd import DEFAULT_INDEX

    if index is None:
        index = os.environ.get("FACTORY_INDEX_URL")
    if index is None:
        if not Path("index/simple").is_dir():
            raise ConfigError("give --index-url URL (or set FACTORY_INDEX_URL)")
        index = "index"
    advise(
        index,
        python=python,
        project=project,
        say=typer.echo,
        request=request,
        verify_key=verify_key,
        default_index=default_index or DEFAULT_INDEX,
    )
