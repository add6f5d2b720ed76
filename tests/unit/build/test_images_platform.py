"""Builder images of another platform (aarch64 on this x86_64 host): names, base bootstrap commands, build
args and labels; the default platform's names and inputs exactly as before the axis."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from factory.build import engine, images
from factory.core.errors import ConfigError, DockerError, ImageError
from factory.core.platforms import DEFAULT_PLATFORM, Platform, named
from factory.spec import toolchains
from factory.spec.imageref import is_image_reference

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


@pytest.mark.parametrize("flavor", ["manylinux", "debian"])
def test_the_pypi_and_devel_flavors_build_another_platform_the_others_do_not(flavor: str) -> None:
    problem = f"flavor {flavor} builds x86_64 only; aarch64 jobs use flavor pypi or devel"
    assert toolchains.flavor_platform_problem(flavor, AARCH64) == problem
    # `factory images build --platform aarch64` of such a flavor: one line (a matrix drops its jobs first)
    with pytest.raises(ConfigError, match=rf"^{problem}$"):
        toolchains.builder_image_for(
            cuda="12.8", python="3.11", flavor=flavor, base_image=None, target=AARCH64
        )
    assert toolchains.flavor_platform_problem(flavor, DEFAULT_PLATFORM) is None
    assert toolchains.flavor_platform_problem("pypi", AARCH64) is None
    assert toolchains.flavor_platform_problem("devel", AARCH64) is None


def test_a_registry_images_platform_variant_has_its_own_local_tag() -> None:
    ref = "nvidia/cuda:12.8.1-devel-ubuntu22.04"
    assert toolchains.platform_image_name(ref, DEFAULT_PLATFORM) == ref
    assert toolchains.platform_image_name(ref, AARCH64) == "nvidia/cuda:12.8.1-devel-ubuntu22.04-aarch64"
    assert toolchains.platform_image_name("my/cuda", AARCH64) == "my/cuda:latest-aarch64"
    # a registry's port is not a tag; a digest names the variant by itself
    assert (
        toolchains.platform_image_name("localhost:5000/cuda", AARCH64) == "localhost:5000/cuda:latest-aarch64"
    )
    digest = "sha256:" + "ab" * 32
    assert toolchains.platform_image_name(f"nvcr.io/nvidia/cuda:13.0@{digest}", AARCH64) == (
        f"nvcr.io/nvidia/cuda:sha256-{'ab' * 32}-aarch64"
    )
    long = toolchains.platform_image_name("r:" + "t" * 128, AARCH64)
    tag = long.split(":", 1)[1]
    assert len(tag) == 128 and tag.endswith("-aarch64") and tag.startswith("t" * 100)
    for name in (long, toolchains.platform_image_name(f"r@{digest}", AARCH64)):
        assert is_image_reference(name), name


def test_the_devel_flavors_aarch64_builder_is_made_on_the_arm64_variant() -> None:
    assert toolchains.builder_image_for(
        cuda="12.8", python="3.11", flavor="devel", base_image=None, target=AARCH64
    ) == ("factory-builder:cu12.8-py3.11-devel-aarch64")
    assert toolchains.builder_image_for(cuda="12.8", python="3.11", flavor="devel", base_image=None) == (
        "factory-builder:cu12.8-py3.11-devel"
    )
    # NVIDIA's image: the default platform's reference as before; aarch64's variant under its own tag
    assert images.base_image_for(cuda="12.8", python="3.11", flavor="devel", base_image=None) == (
        "nvidia/cuda:12.8.1-devel-ubuntu22.04"
    )
    assert images.base_image_for(
        cuda="12.8", python="3.11", flavor="devel", base_image=None, target=AARCH64
    ) == ("nvidia/cuda:12.8.1-devel-ubuntu22.04-aarch64")
    assert images.base_image_for(
        cuda="12.8", python="3.11", flavor="devel", base_image="my/cuda:1", target=AARCH64
    ) == ("my/cuda:1-aarch64")
    # the stand-in named for a matrix is each platform's own, made on that platform's bootstrapped base
    standin = images.standin_devel_image("13.0")
    assert images.standin_devel_image("13.0", AARCH64) == "factory-standin:cuda13.0-devel-aarch64"
    assert images.base_image_for(
        cuda="13.0", python="3.11", flavor="devel", base_image=standin, target=AARCH64
    ) == ("factory-standin:cuda13.0-devel-aarch64")
    assert images.base_image_for(cuda="13.0", python="3.11", flavor="devel", base_image=standin) == standin
    assert toolchains.standin_cuda_of("factory-standin:cuda13.0-devel-aarch64") == "13.0"
    assert toolchains.base_platform_of("factory-standin:cuda13.0-devel-aarch64") is AARCH64
    assert toolchains.base_platform_of(standin) is DEFAULT_PLATFORM
    # its glibc is the stand-in's bookworm, as on the default platform
    assert toolchains.builder_glibc(
        cuda="13.0", python="3.11", flavor="devel", base_image="factory-standin:cuda13.0-devel-aarch64"
    ) == ("2.36")


def test_the_devel_dockerfile_checks_its_compilers_against_the_platforms_triplet() -> None:
    text = images.dockerfile_text("devel")
    assert "x86_64" not in text and "amd64" not in text
    assert '"${TRIPLET}-g++"' in text and "-dumpmachine" in text
    for target, triplet in ((DEFAULT_PLATFORM, "x86_64-linux-gnu"), (AARCH64, "aarch64-linux-gnu")):
        args = images.build_args(cuda="12.8", python="3.11", flavor="devel", base_image="b", target=target)
        assert args["TRIPLET"] == triplet
        assert set(args) == images.declared_build_args(text)


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


class FakeDaemon:
    """The daemon's tags, as far as pulling a multi-platform image goes: one tag names one image, and a pull
    points the pulled tag at the variant of the platform asked for (the daemon's own, amd64, without)."""

    def __init__(self, tags: dict[str, str] | None = None, *, registry: bool = True) -> None:
        self.variants = {
            p: engine.LocalImage(id=f"sha256:{p.replace('/', '-')}", platform=p)
            for p in ("linux/amd64", "linux/arm64")
        }
        self.tags = {name: self.variants[p] for name, p in (tags or {}).items()}
        self.pulls: list[tuple[str, str | None]] = []
        self.registry = registry

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeDaemon:
        monkeypatch.setattr(engine, "get_image", lambda _c, name: self.tags.get(name))
        monkeypatch.setattr(engine, "pull_image", self.pull)
        monkeypatch.setattr(engine, "tag_image", self.tag)
        monkeypatch.setattr(engine, "remove_image", lambda _c, name: self.tags.pop(name))
        return self

    def pull(self, _client: object, repository: str, *, tag: str, platform: str | None = None) -> None:
        self.pulls.append((f"{repository}:{tag}", platform))
        if not self.registry:
            raise DockerError("pulling failed (APIError: Get https://registry-1.docker.io/v2/: dial tcp)")
        self.tags[f"{repository}:{tag}"] = self.variants[platform or "linux/amd64"]

    def tag(self, _client: object, image_id: str, name: str) -> None:
        self.tags[name] = next(i for i in self.variants.values() if i.id == image_id)

    def platform_of(self, name: str) -> str | None:
        image = self.tags.get(name)
        return image.platform if image is not None else None


REF = "nvidia/cuda:12.8.1-devel-ubuntu22.04"
ARM_REF = f"{REF}-aarch64"


def ensure_devel_base(target: Platform) -> engine.LocalImage:
    base = images.base_image_for(cuda="12.8", python="3.11", flavor="devel", base_image=None, target=target)
    return images._ensure_base(
        None, base, flavor="devel", bootstrap=False, progress=None, cuda="12.8", pull=(REF, target)
    )


def test_the_arm64_variant_is_pulled_with_its_platform_and_the_amd64_tag_stays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    daemon = FakeDaemon({REF: "linux/amd64"}).install(monkeypatch)
    assert ensure_devel_base(AARCH64).platform == "linux/arm64"
    assert daemon.pulls == [(REF, "linux/arm64")]
    assert daemon.platform_of(ARM_REF) == "linux/arm64"
    assert daemon.platform_of(REF) == "linux/amd64"  # the x86_64 jobs' base, given back
    # present: reused, for both platforms
    assert ensure_devel_base(AARCH64).platform == "linux/arm64"
    assert ensure_devel_base(DEFAULT_PLATFORM).platform == "linux/amd64"
    assert len(daemon.pulls) == 1


def test_a_first_pull_of_the_arm64_variant_leaves_no_default_tag_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    daemon = FakeDaemon().install(monkeypatch)
    assert ensure_devel_base(AARCH64).platform == "linux/arm64"
    assert set(daemon.tags) == {ARM_REF}  # an x86_64 job would otherwise take the arm64 image for its own
    assert ensure_devel_base(DEFAULT_PLATFORM).platform == "linux/amd64"
    assert daemon.pulls == [(REF, "linux/arm64"), (REF, "linux/amd64")]


def test_a_tag_left_on_the_other_platforms_variant_is_pulled_again(monkeypatch: pytest.MonkeyPatch) -> None:
    daemon = FakeDaemon({REF: "linux/arm64", ARM_REF: "linux/amd64"}).install(monkeypatch)
    assert ensure_devel_base(DEFAULT_PLATFORM).platform == "linux/amd64"
    assert ensure_devel_base(AARCH64).platform == "linux/arm64"
    assert daemon.pulls == [(REF, "linux/amd64"), (REF, "linux/arm64")]
    assert daemon.platform_of(REF) == "linux/amd64"


def test_an_unreachable_registry_for_the_arm64_variant_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeDaemon(registry=False).install(monkeypatch)
    with pytest.raises(ImageError) as info:
        ensure_devel_base(AARCH64)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"cannot pull {REF} for linux/arm64: no registry reachable; ")
    assert "factory images standin-devel" in message
