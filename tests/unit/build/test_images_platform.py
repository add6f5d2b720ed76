"""Builder images of another platform (aarch64 on this x86_64 host): names, base bootstrap commands, build
args and labels; the default platform's names and inputs exactly as before the axis."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from factory.build import images
from factory.core.errors import ConfigError, ImageError
from factory.core.platforms import DEFAULT_PLATFORM, named
from factory.spec import toolchains

AARCH64 = named("aarch64")


def test_names_carry_a_platform_other_than_the_default() -> None:
    assert toolchains.base_image_name("bookworm") == "factory-base:bookworm"
    assert toolchains.base_image_name("bookworm", AARCH64) == "factory-base:bookworm-aarch64"
    assert images.default_base_image("3.11", AARCH64) == "factory-base:bookworm-aarch64"
    assert toolchains.builder_image_for(cuda="13.0", python="3.11", flavor="pypi", base_image=None) == (
        "factory-builder:cu13.0-py3.11-pypi"
    )
    assert toolchains.builder_image_for(
        cuda="13.0", python="3.11", flavor="pypi", base_image=None, target=AARCH64
    ) == ("factory-builder:cu13.0-py3.11-pypi-aarch64")
    assert toolchains.builder_image_for(
        cuda="13.0", python="3.14", flavor="pypi", base_image=None, target=AARCH64
    ) == ("factory-builder:cu13.0-forky-pypi-aarch64")
    assert images.base_image_for(
        cuda="13.0", python="3.11", flavor="pypi", base_image=None, target=AARCH64
    ) == ("factory-base:bookworm-aarch64")


def test_a_base_tag_says_its_suite_and_platform() -> None:
    assert toolchains.base_suite_of("factory-base:bookworm-aarch64") == "bookworm"
    assert toolchains.base_platform_of("factory-base:bookworm-aarch64") is AARCH64
    assert toolchains.base_suite_of("factory-base:forky") == "forky"
    assert toolchains.base_platform_of("factory-base:forky") is DEFAULT_PLATFORM
    assert toolchains.base_platform_of("nvidia/cuda:13.0.1-devel-ubuntu22.04") is DEFAULT_PLATFORM
    assert toolchains.split_platform("trixie") == ("trixie", DEFAULT_PLATFORM)
    # an aarch64 job on the toolchain's own aarch64 base still gets the multi-Python image
    assert (
        toolchains.job_toolchain(python="3.14", flavor="pypi", base_image="factory-base:forky-aarch64")
        is not None
    )


@pytest.mark.parametrize("flavor", ["devel", "manylinux", "debian"])
def test_only_the_pypi_flavor_builds_another_platform(flavor: str) -> None:
    with pytest.raises(
        ConfigError, match=rf"^flavor {flavor} builds x86_64 only; aarch64 jobs use flavor pypi"
    ):
        toolchains.builder_image_for(
            cuda="12.8", python="3.11", flavor=flavor, base_image=None, target=AARCH64
        )
    assert toolchains.flavor_platform_problem(flavor, DEFAULT_PLATFORM) is None
    assert toolchains.flavor_platform_problem("pypi", AARCH64) is None


def test_debootstrap_native_is_one_command_as_before() -> None:
    (command,) = images.debootstrap_commands(
        "/usr/sbin/debootstrap",
        suite="bookworm",
        rootfs=Path("/r"),
        mirror="http://m/debian",
        include=("g++",),
    )
    assert command == [
        "/usr/sbin/debootstrap",
        "--variant=minbase",
        "--include=g++",
        "bookworm",
        "/r",
        "http://m/debian",
    ]


def test_debootstrap_foreign_then_second_stage_under_qemu() -> None:
    first, second = images.debootstrap_commands(
        "/usr/sbin/debootstrap",
        suite="forky",
        rootfs=Path("/r"),
        mirror="http://m/debian",
        include=("python3", "g++-14"),
        target=AARCH64,
        script="sid",
        foreign=True,
    )
    assert first == [
        "/usr/sbin/debootstrap",
        "--variant=minbase",
        "--arch=arm64",
        "--foreign",
        "--include=python3,g++-14",
        "forky",
        "/r",
        "http://m/debian",
        "sid",
    ]
    assert second == ["chroot", "/r", "/debootstrap/debootstrap", "--second-stage"]


def test_compilers_are_named_by_the_platform_triplet() -> None:
    assert images.compiler_links("14")["x86_64-linux-gnu-g++"] == "/usr/bin/g++-14"
    links = images.compiler_links("14", AARCH64)
    assert links["aarch64-linux-gnu-g++"] == "/usr/bin/g++-14" and "x86_64-linux-gnu-g++" not in links
    toolchain = toolchains.toolchain_named("forky")
    assert toolchain is not None
    args = images.toolchain_build_args(cuda="13.0", toolchain=toolchain, base_image="b", target=AARCH64)
    assert args["TRIPLET"] == "aarch64-linux-gnu"
    assert images.toolchain_build_args(cuda="13.0", toolchain=toolchain, base_image="b")["TRIPLET"] == (
        "x86_64-linux-gnu"
    )
    # the debian flavor builds the default platform only (`flavor_platform_problem`): its Dockerfile, and so
    # its image's inputs, stay as they were
    assert "TRIPLET" not in images.build_args(cuda="12.8", python="3.13", flavor="debian", base_image="b")
    text = images.toolchain_dockerfile_text()
    assert "x86_64" not in text and '"${TRIPLET}-g++"' in text


def test_default_platform_base_inputs_are_unchanged() -> None:
    """A base bootstrapped before the axis keeps its inputs hash (no rebuild); another platform's differs."""
    include = images.base_include("bookworm")
    before = hashlib.sha256(json.dumps(["bookworm", sorted(include)]).encode()).hexdigest()
    changes = images.base_changes(suite="bookworm", mirror="http://m", include=include)
    assert f"LABEL {images.LABEL_INPUTS}={before}" in changes
    assert not any(images.LABEL_PLATFORM in c for c in changes)
    other = images.base_changes(suite="bookworm", mirror="http://m", include=include, target=AARCH64)
    assert f"LABEL {images.LABEL_PLATFORM}=aarch64" in other
    assert f"LABEL {images.LABEL_INPUTS}={before}" not in other


def test_the_source_built_cpython_base_is_the_default_platforms_only() -> None:
    # a glibc floor's toolchain (bookworm with a source-built CPython) is named for aarch64 as for any other,
    # but its base is compiled on the host: refused in one line before the daemon is asked anything
    assert toolchains.builder_image_for(
        cuda="13.0", python="3.13", flavor="pypi", base_image=None, floor="2.36", target=AARCH64
    ) == ("factory-builder:cu13.0-bookworm-cpython-pypi-aarch64")
    with pytest.raises(ImageError, match=r"^the bookworm-cpython base .* x86_64 only, not aarch64$"):
        images.ensure_toolchain_image(
            None,
            cuda="13.0",
            suite="bookworm-cpython",
            flavor="pypi",
            bootstrap=False,
            progress=None,
            target=AARCH64,
        )
