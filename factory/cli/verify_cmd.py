"""`factory verify` (a wheel's signature: --key; a rebuild from its provenance compared byte for byte:
--rebuild) and `factory keygen` (a signing key pair); the signing options `factory publish` and `factory build
--publish` share. Each check is its own option and its own library call."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from factory.cli import app
from factory.cli.matrix_cmd import TRUST_PATHS
from factory.cli.output import echo_json, json_option
from factory.core.errors import ConfigError

if TYPE_CHECKING:
    from factory.build.rebuild import RebuildOptions

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
            help="Build the wheel again from its provenance (its rebuild section) and compare the two "
            "byte for byte; exit 1 naming the first differing file (and ELF section) if they differ.",
        ),
    ] = False,
    cache: Annotated[
        str,
        typer.Option(
            "--cache",
            metavar="DEST|local|off",
            help="With --rebuild: compile through this compile cache (a store: directory or s3://; local: "
            "this home's) to check it, or off.",
        ),
    ] = "off",
    source: Annotated[
        Path | None,
        typer.Option(
            "--source",
            metavar="DIR",
            help="With --rebuild: the source directory of a wheel built from one (source: {path}).",
        ),
    ] = None,
    matrix: Annotated[
        Path | None,
        typer.Option(
            "--matrix",
            "-m",
            metavar="FILE",
            help="With --rebuild: your matrix file. The rebuild takes the wheel's patches from its files "
            "(by sha256), its source directory, and may use the images and torch indexes it names.",
        ),
    ] = None,
    trust_paths: Annotated[bool, TRUST_PATHS] = False,
    allow_foreign: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-foreign",
            metavar="KIND",
            help="With --rebuild: use what only the wheel names, which your matrix does not: 'image' (a "
            "builder or base image, pulled and run), 'torch-index' (where torch is fetched). Repeatable.",
        ),
    ] = None,
    workdir: Annotated[
        Path | None,
        typer.Option(
            "--workdir",
            metavar="DIR",
            help="With --rebuild: rebuild here and keep it (its matrix, patches, rebuilt wheel and report); "
            "default: a temporary directory.",
        ),
    ] = None,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Check a wheel: --key its signature, --rebuild a build from its own provenance compared byte for byte
    (exit 1 and one line naming what failed).

    A wheel's provenance is read as input from anyone: the rebuild keeps the build's network off, takes
    the source as recorded (the sdist or commit by hash, or --source DIR), each patch only as a file of
    yours with the sha256 recorded, and refuses an image or torch index your matrix does not name unless
    --allow-foreign names its kind."""
    if key is None and not rebuild:
        raise ConfigError(
            "give --key PUB (the public key whose signature the wheel must carry) and/or --rebuild "
            "(build the wheel again from its provenance and compare)"
        )
    if key is not None:
        from factory.consume.verify import verify_signature
        from factory.trust.signing import public_key_file

        verified = verify_signature(wheel, key=public_key_file(key), signature=signature)
        typer.echo(f"OK {verified.filename}: sha256 {verified.sha256}, signed by key {verified.key_id}")
    if rebuild:
        from factory.build.rebuild import RebuildOptions, check_allowed

        options = RebuildOptions(
            cache=cache,
            source=source,
            matrix=matrix,
            trust_paths=trust_paths,
            workdir=workdir,
            allow_foreign=check_allowed(allow_foreign or []),
        )
        rebuild_and_compare(wheel, options, as_json=as_json)
    elif matrix is not None or allow_foreign or trust_paths:
        raise ConfigError("--matrix, --trust-paths and --allow-foreign apply with --rebuild")


def rebuild_and_compare(wheel: str, options: RebuildOptions, *, as_json: bool) -> None:
    """`--rebuild`: the build's progress as `factory build` shows it (on stderr), then one line (or JSON);
    exit 0 when the rebuild is byte-identical, else 1."""
    from rich.console import Console

    from factory.build.rebuild import Hooks, verify_rebuild
    from factory.cli.progress import BuildDisplay

    if options.workdir is not None:
        report = str(options.workdir / "out" / "report.json")
    else:
        report = "(gone with the temporary work directory; --workdir DIR keeps it)"
    display = BuildDisplay(Console(stderr=True), report_path=report)
    hooks = Hooks(on_change=display.on_change, showing=display.showing, finished=display.finished)
    result = verify_rebuild(wheel, options, log=display.say, hooks=hooks)
    if as_json:
        echo_json(result.to_json())
    else:
        typer.echo(result.line())
    sys.exit(0 if result.ok else 1)


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
