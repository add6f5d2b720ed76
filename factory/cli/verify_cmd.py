"""`factory verify` (a wheel's signature: --key) and `factory keygen` (a signing key pair); the signing
options `factory publish` and `factory build --publish` share. `verify --rebuild` is the older spelling of
`factory rebuild` (`rebuild_cmd`), kept working."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from factory.cli import app
from factory.cli.matrix_cmd import TRUST_PATHS
from factory.cli.output import json_option
from factory.cli.rebuild_cmd import (
    REBUILD_CACHE_OPTION,
    REBUILD_FOREIGN_OPTION,
    REBUILD_MATRIX_OPTION,
    REBUILD_SOURCE_OPTION,
    REBUILD_WORKDIR_OPTION,
    rebuild_options,
    run_rebuild,
)
from factory.core.errors import ConfigError

SIGN_KEY_OPTION = typer.Option(
    "--sign-key",
    metavar="PATH",
    help="Sign each published wheel with this Ed25519 private key (PEM or OpenSSH, unencrypted); "
    "default: the key in $FACTORY_SIGN_KEY, if set.",
)
SIGN_KEY_ENV_OPTION = typer.Option(
    "--sign-key-env",
    metavar="VAR",
    help="Sign with the private key held in this environment variable (instead of FACTORY_SIGN_KEY).",
)


@app.command()
def verify(
    wheel: Annotated[
        str, typer.Argument(metavar="WHEEL_OR_URL", help="A wheel file, or its URL on an index.")
    ],
    key: Annotated[
        Path | None,
        typer.Option("--key", metavar="PUB", help="Check its signature with this Ed25519 public key."),
    ] = None,
    signature: Annotated[
        str | None,
        typer.Option(
            "--signature",
            metavar="FILE_OR_URL",
            help="The signature file (default: the wheel's path or URL with .sig.json appended).",
        ),
    ] = None,
    rebuild: Annotated[
        bool,
        typer.Option(
            "--rebuild",
            help="The older spelling of `factory rebuild WHEEL_OR_URL` (kept for scripts; the options "
            "below are that command's).",
        ),
    ] = False,
    cache: Annotated[str, REBUILD_CACHE_OPTION] = "off",
    source: Annotated[Path | None, REBUILD_SOURCE_OPTION] = None,
    matrix: Annotated[Path | None, REBUILD_MATRIX_OPTION] = None,
    trust_paths: Annotated[bool, TRUST_PATHS] = False,
    allow_foreign: Annotated[list[str] | None, REBUILD_FOREIGN_OPTION] = None,
    workdir: Annotated[Path | None, REBUILD_WORKDIR_OPTION] = None,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Verify a wheel's signature with --key PUB (exit 1 and one line naming what does not hold).

    "Verify" is a signature's check here and everywhere in the factory; --rebuild, building the wheel again
    to compare, is `factory rebuild`."""
    if key is None and not rebuild:
        raise ConfigError(
            "give --key PUB (the public key whose signature the wheel must carry); to build the wheel again "
            "from its provenance and compare: factory rebuild WHEEL_OR_URL"
        )
    if key is not None:
        from factory.consume.verify import verify_signature
        from factory.trust.signing import public_key_file

        verified = verify_signature(wheel, key=public_key_file(key), signature=signature)
        typer.echo(f"OK {verified.filename}: sha256 {verified.sha256}, signed by key {verified.key_id}")
    if rebuild:
        options = rebuild_options(
            cache=cache,
            source=source,
            matrix=matrix,
            trust_paths=trust_paths,
            workdir=workdir,
            allow_foreign=allow_foreign,
        )
        run_rebuild(wheel, options, as_json=as_json)
    elif matrix is not None or allow_foreign or trust_paths:
        raise ConfigError(
            "--matrix, --trust-paths and --allow-foreign apply with --rebuild (factory rebuild)"
        )


@app.command()
def keygen(
    path: Annotated[
        Path, typer.Argument(metavar="PATH", help="Where the private key goes (PATH.pub: public).")
    ],
) -> None:
    """Make an Ed25519 key pair for signing published wheels (the private key mode 0600; never overwrites)."""
    from factory.trust.signing import write_key_pair

    pub, key_id = write_key_pair(path)
    typer.echo(f"private key: {path} (keep it secret: a CI secret, or a file only the publisher reads)")
    typer.echo(f"public key:  {pub} ({key_id}); consumers check with: factory verify WHEEL --key {pub}")
