"""`factory images ...`: make and list builder images."""

from __future__ import annotations

from typing import Annotated

import typer

from factory.cli import app
from factory.cli.output import echo_json, json_option, table_console
from factory.core.platforms import DEFAULT_PLATFORM, NAMES

images_app = typer.Typer(help="Make and list the factory's builder images.", no_args_is_help=True)
app.add_typer(images_app, name="images")


def _progress(message: str) -> None:
    typer.echo(message, err=True)


PLATFORM_OPTION = typer.Option(
    metavar="PLATFORM",
    help=f"Target platform ({', '.join(NAMES)}); another than the host's runs under QEMU (binfmt_misc).",
)


@images_app.command("bootstrap")
def bootstrap(
    suite: Annotated[
        str,
        typer.Option(
            metavar="SUITE",
            help="Debian suite to bootstrap (bookworm: Python 3.11; forky: 3.13, 3.14, 3.15).",
        ),
    ] = "bookworm",
    name: Annotated[
        str | None, typer.Option(metavar="TAG", help="Image tag (default factory-base:<suite>).")
    ] = None,
    mirror: Annotated[
        str | None, typer.Option(metavar="URL", help="Debian mirror (default: the host's apt mirror).")
    ] = None,
    platform: Annotated[str, PLATFORM_OPTION] = DEFAULT_PLATFORM.name,
) -> None:
    """Make a base image from the distribution mirror (debootstrap, then docker import)."""
    from factory.build import emulation, images
    from factory.build.engine import connect
    from factory.core.platforms import named
    from factory.spec import toolchains

    target = named(platform)
    tag_name = name or toolchains.base_image_name(suite, target)
    emulation.require([target])
    client = connect()
    tag = images.bootstrap_base(
        client, suite=suite, name=tag_name, mirror=mirror, progress=_progress, target=target
    )
    typer.echo(tag)


@images_app.command("standin-devel")
def standin_devel(
    cuda: Annotated[
        str,
        typer.Option(metavar="VERSION", help="CUDA version, MAJOR.MINOR (13.0 or later: the PyPI toolkit)."),
    ],
    base: Annotated[
        str | None,
        typer.Option(
            metavar="IMAGE",
            help="Debian base image to put the toolkit on (default factory-base:bookworm of the platform).",
        ),
    ] = None,
    no_bootstrap: Annotated[
        bool, typer.Option("--no-bootstrap", help="Fail instead of bootstrapping a missing base.")
    ] = False,
    platform: Annotated[str, PLATFORM_OPTION] = DEFAULT_PLATFORM.name,
) -> None:
    """Make (or reuse) a stand-in for nvidia/cuda:<cuda>-devel, for the devel flavor without a registry.

    The image is factory-standin:cuda<cuda>-devel (factory-standin:cuda<cuda>-devel-<platform> for another
    platform), with the layout of nvidia/cuda:<cuda>-devel; a matrix uses it with build.base_image:
    factory-standin:cuda<cuda>-devel, and its jobs of another platform that platform's stand-in."""
    from factory.build import emulation, images
    from factory.build.engine import connect
    from factory.core.platforms import named
    from factory.spec import toolchains

    target = named(platform)
    base = base or toolchains.base_image_name(toolchains.DEFAULT_SUITE, target)
    images.standin_build_args(cuda=cuda, base_image=base)  # a bad value is one line, without a daemon
    emulation.require([target])
    client = connect()
    tag = images.ensure_standin_devel(
        client, cuda=cuda, base_image=base, bootstrap=not no_bootstrap, progress=_progress, target=target
    )
    typer.echo(tag)


@images_app.command("build")
def build(
    cuda: Annotated[str, typer.Option(metavar="VERSION", help="CUDA version, MAJOR.MINOR.")],
    python: Annotated[
        list[str],
        typer.Option(
            metavar="VERSION",
            help="Python version, MAJOR.MINOR; repeatable. Pythons of one toolchain (pypi: 3.13, 3.14, 3.15 "
            "on forky) share one image.",
        ),
    ],
    flavor: Annotated[
        str,
        typer.Option(
            metavar="FLAVOR",
            help="devel (nvidia/cuda base), pypi (PyPI toolkit), manylinux (pytorch/manylinux2_28) or "
            "debian (Debian's nvidia-cuda-toolkit: CUDA 12.4 on trixie, for CUDA 12 variants).",
        ),
    ] = "pypi",
    base: Annotated[
        str | None,
        typer.Option(metavar="IMAGE", help="Base image (pypi default: factory-base:<suite of the Python>)."),
    ] = None,
    no_bootstrap: Annotated[
        bool, typer.Option("--no-bootstrap", help="Fail instead of bootstrapping a missing base.")
    ] = False,
    glibc: Annotated[
        str | None,
        typer.Option(
            metavar="VERSION",
            help="The glibc floor the wheels must install on (as build.glibc): the builder a job with that "
            "floor gets (pypi, Python 3.13, 2.36: bookworm with a source-built CPython).",
        ),
    ] = None,
    platform: Annotated[str, PLATFORM_OPTION] = DEFAULT_PLATFORM.name,
) -> None:
    """Build (or reuse, when its inputs are unchanged) each Python's builder image; prints each tag once."""
    from factory.build import images
    from factory.core.errors import ConfigError
    from factory.core.platforms import named
    from factory.spec.config import GLIBC_TORCH, parse_glibc_floor

    floor = parse_glibc_floor(glibc) if glibc is not None else None
    if floor == GLIBC_TORCH:
        raise ConfigError("--glibc: name a version (build.glibc's `torch` depends on each job's torch)")
    tags = images.build_images(
        cuda=cuda,
        pythons=python,
        flavor=flavor,
        base_image=base,
        bootstrap=not no_bootstrap,
        progress=_progress,
        floor=floor,
        target=named(platform),
    )
    for tag in tags:
        typer.echo(tag)


@images_app.command("list")
def list_(
    json_output: Annotated[bool, json_option()] = False,
) -> None:
    """List the factory's images with their labels."""
    from rich.table import Table

    from factory.build import images
    from factory.build.engine import connect

    found = images.list_images(connect())
    if json_output:
        rows = [
            {"tags": list(i.tags), "id": i.id, "kind": i.kind, "size": i.size, "labels": dict(i.labels)}
            for i in found
        ]
        echo_json(rows)
        return
    # cuda and flavor are in the builder's tag already; a toolchain image carries several Pythons.
    table = Table("tag", "kind", "pythons", "gcc", "toolkit", "base", "size", "created")
    table.columns[0].no_wrap = True
    for info in found:
        labels = info.labels
        table.add_row(
            ", ".join(info.tags) or f"<none> {info.id}",
            info.kind,
            ",".join(labels.get(images.LABEL_PYTHON, "").split()),
            labels.get(images.LABEL_GCC, ""),
            labels.get(images.LABEL_TOOLKIT, ""),
            labels.get(images.LABEL_BASE) or labels.get(images.LABEL_SUITE, ""),
            f"{info.size / 2**20:.0f} MiB",
            info.created[:16].replace("T", " "),
        )
    table_console(minimum=0).print(table)
