"""`factory verify` (a wheel's signature) and `factory keygen` (a signing key pair); the signing options
`factory publish` and `factory build --publish` share."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from factory.cli import app
from factory.errors import ConfigError

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
) -> None:
    """Check that a wheel's signature vouches for it with a public key (exit 1, one line, if not)."""
    from factory.signing import public_key_file
    from factory.verify import verify_signature

    if key is None:
        raise ConfigError("give --key PUB (the public key whose signature the wheel must carry)")
    verified = verify_signature(wheel, key=public_key_file(key), signature=signature)
    typer.echo(f"OK {verified.filename}: sha256 {verified.sha256}, signed by key {verified.key_id}")


@app.command()
def keygen(
    path: Annotated[
        Path, typer.Argument(metavar="PATH", help="Where the private key goes (PATH.pub: public).")
    ],
) -> None:
    """Make an Ed25519 key pair for signing published wheels (the private key mode 0600; never overwrites)."""
    from factory.signing import write_key_pair

    pub, key_id = write_key_pair(path)
    typer.echo(f"private key: {path} (keep it secret: a CI secret, or a file only the publisher reads)")
    typer.echo(f"public key:  {pub} ({key_id}); consumers check with: factory verify WHEEL --key {pub}")
