"""The builders' toolchains, the pure half of builder images: which Debian suite ships which Pythons with
which GCC (and, for the debian flavor, which CUDA), the builder image a job runs in and its glibc, named
without Docker. The plan checks a matrix against them (`factory.plan.plan`, `factory.plan.glibcfloor`);
`factory.build.images` makes the images they name.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from factory.core.errors import ConfigError, ImageError
from factory.core.platforms import DEFAULT_PLATFORM, PLATFORMS, Platform
from factory.spec.options import FLAVORS

BASE_REPOSITORY = "factory-base"

BUILDER_REPOSITORY = "factory-builder"

STANDIN_REPOSITORY = "factory-standin"

MANYLINUX_REPOSITORY = "pytorch/manylinux2_28-builder"

DEFAULT_SUITE = "bookworm"

DEFAULT_DEVEL_OS = "ubuntu22.04"


@dataclass(frozen=True, kw_only=True)
class Toolchain:
    """A Debian suite as the pypi flavor's base: the Pythons it ships side by side and the one GCC that
    compiles for all of them. Every job whose Python is here runs in one builder image, so a compile of one
    Python's job is the same compile (same compiler, same headers but Python's) for the others."""

    suite: str
    pythons: tuple[str, ...]
    # The pinned g++ major ("14"), made the image's gcc/g++/cc/c++; None: the suite's default g++.
    gcc: str | None = None
    # The CUDA release of the suite's own `nvidia-cuda-toolkit` (non-free), the debian flavor's toolkit; None:
    # the suite has none the factory uses.
    cuda: str | None = None
    # The suite's glibc: no symbol a wheel compiled here needs is newer, so it bounds the wheel's manylinux
    # tag (`builder_glibc`; measured with `ldd --version` in factory-base:<suite>).
    glibc: str | None = None
    # The Pythons are compiled from CPython's source on the suite's base (`images.ensure_cpython_base`,
    # factory-base:<suite>-cpython), not the suite's packages: a Python the suite does not ship, on its glibc.
    source_built: bool = False

    @property
    def name(self) -> str:
        """The toolchain's name in image tags: its suite, "-cpython" added for source-built Pythons."""
        return f"{self.suite}-cpython" if self.source_built else self.suite

    @property
    def multi(self) -> bool:
        return len(self.pythons) > 1

    @property
    def own_image(self) -> bool:
        """Its jobs run in one image of the toolchain's (`images.ensure_toolchain_image`): several Pythons
        share it, or its Pythons are none of the suite's packages."""
        return self.multi or self.source_built


# forky (Debian testing) ships python3.13, 3.14 and 3.15 and g++-12..16; nvcc 13.0 refuses GCC > 15, and
# g++-14 is the compiler of trixie and of the most CUDA 13 builds, so it is the one pinned.
# trixie's nvidia-cuda-toolkit is CUDA 12.4, whose nvcc takes GCC <= 13: g++-13 is pinned there. Listed after
# forky, so the pypi flavor's Python 3.13 keeps forky's multi-Python toolchain.
# bookworm-cpython: bookworm's glibc 2.36 and GCC 12 with a CPython 3.13 compiled from source
# (factory/build/cpythonsrc.py), the pypi flavor's builder for a Python 3.13 job whose glibc floor
# (build.glibc) forky's 2.43 is above. Listed last: without a floor below forky's, forky stays the builder.
# Older is out of reach from the mirror: bullseye (2.31) has GCC 10, which gives -std=c++20 a __cplusplus of
# 201709L, and torch 2.14's headers `#error` on anything below 202002L (measured; docs/PUBLISH.md).
TOOLCHAINS = (
    Toolchain(suite="bookworm", pythons=("3.11",), glibc="2.36"),
    Toolchain(suite="forky", pythons=("3.13", "3.14", "3.15"), gcc="14", glibc="2.43"),
    Toolchain(suite="trixie", pythons=("3.13",), gcc="13", cuda="12.4", glibc="2.41"),
    # gcc: bookworm's one g++ (12), named so the toolchain image checks every compiler name is it
    Toolchain(suite="bookworm", pythons=("3.13",), gcc="12", glibc="2.36", source_built=True),
)

# The glibc of the other flavors' bases: NVIDIA's devel images by their OS, PyTorch's manylinux_2_28 builder
# (AlmaLinux 8; its gcc-toolset links libstdc++'s newer parts statically, so 2.28 is the wheels' whole need).
DEVEL_OS_GLIBC = {"ubuntu22.04": "2.35", "ubuntu24.04": "2.39", "ubuntu20.04": "2.31"}

MANYLINUX_GLIBC = "2.28"

# Every Debian suite name that can appear in a factory-base tag; other tags are never bootstrapped.
_SUITE_RE = re.compile(r"^[a-z][a-z0-9-]*$")

_VERSION_RE = re.compile(r"^\d+\.\d+(\.\d+)?$")


def toolchain_named(suite: str) -> Toolchain | None:
    """The toolchain of a suite (or of a toolchain name: "bookworm-cpython"), None for a suite the factory
    bootstraps with its default packages."""
    return next((t for t in TOOLCHAINS if t.name == suite), None)


def toolchain_for(pythons: Sequence[str]) -> Toolchain:
    """The toolchain that carries every one of `pythons` (["3.13", "3.14"] -> forky)."""
    for python in pythons:
        _check_version("Python", python)
    for toolchain in TOOLCHAINS:
        if not toolchain.source_built and all(p in toolchain.pythons for p in pythons):
            return toolchain
    known = "; ".join(f"{t.suite}: {', '.join(t.pythons)}" for t in TOOLCHAINS if not t.source_built)
    what = f"Python {pythons[0]}" if len(pythons) == 1 else f"Pythons {', '.join(pythons)} together"
    raise ImageError(
        f"no Debian suite ships {what} for a bootstrapped base (known: {known}); pass a base image with "
        "that Python"
    )


def python_suite_for(python: str) -> str:
    """The Debian suite whose packages give the pypi flavor `python` ("3.11" -> bookworm, "3.13" -> forky)."""
    return toolchain_for([python]).suite


def _check_version(what: str, value: str) -> None:
    if not _VERSION_RE.fullmatch(value):
        raise ConfigError(f"invalid {what} version {value!r}: expected MAJOR.MINOR")


def _check_flavor(flavor: str) -> None:
    if flavor not in FLAVORS:
        raise ConfigError(f"unknown image flavor {flavor!r}: expected one of {', '.join(FLAVORS)}")


def platform_suffix(target: Platform) -> str:
    """What an image tag or a job id adds for its platform: nothing for the default one (both predate the
    axis), "-<name>" for another; an image of another platform is never taken for the default one's."""
    return "" if target == DEFAULT_PLATFORM else f"-{target.name}"


def split_platform(tag: str) -> tuple[str, Platform]:
    """A factory image tag's name part and platform ("bookworm-<name>" -> ("bookworm", that platform))."""
    for target in PLATFORMS:
        suffix = platform_suffix(target)
        if suffix and tag.endswith(suffix):
            return tag[: -len(suffix)], target
    return tag, DEFAULT_PLATFORM


def base_image_name(suite: str, target: Platform = DEFAULT_PLATFORM) -> str:
    """The bootstrapped base of a suite for a platform: `factory-base:bookworm`, and
    `factory-base:bookworm-<name>` for another platform."""
    if not _SUITE_RE.fullmatch(suite):
        raise ConfigError(f"invalid suite name {suite!r}")
    return f"{BASE_REPOSITORY}:{suite}{platform_suffix(target)}"


def builder_image_name(*, cuda: str, python: str, flavor: str, target: Platform = DEFAULT_PLATFORM) -> str:
    """The tag of a one-Python builder image: `factory-builder:cu13.0-py3.11-pypi` (`...-pypi-<platform>`
    for another platform)."""
    _check_version("CUDA", cuda)
    _check_version("Python", python)
    _check_flavor(flavor)
    return f"{BUILDER_REPOSITORY}:cu{cuda}-py{python}-{flavor}{platform_suffix(target)}"


def toolchain_image_name(*, cuda: str, suite: str, flavor: str, target: Platform = DEFAULT_PLATFORM) -> str:
    """The tag of a builder image with every Python of a toolchain: `factory-builder:cu13.0-forky-pypi`."""
    _check_version("CUDA", cuda)
    _check_flavor(flavor)
    if not _SUITE_RE.fullmatch(suite):
        raise ConfigError(f"invalid suite name {suite!r}")
    return f"{BUILDER_REPOSITORY}:cu{cuda}-{suite}-{flavor}{platform_suffix(target)}"


def pypi_toolchain(python: str, *, base_image: str | None, floor: str | None = None) -> Toolchain | None:
    """The toolchain the pypi flavor builds a `python` job with: the one build.base_image names (a factory
    base: `factory-base:forky`, `factory-base:bookworm-cpython`), else the first that carries `python`, unless
    a glibc floor is declared that its glibc is above: then the newest-glibc toolchain at or below the floor
    (Python 3.13 with floor 2.36: bookworm-cpython), or the oldest where none is. None where no toolchain
    carries `python`."""
    candidates = [t for t in TOOLCHAINS if python in t.pythons and t.cuda is None]
    if base_image is not None:
        named = base_suite_of(base_image)
        return next((t for t in candidates if t.name == named), None)
    if not candidates:
        return None
    first = candidates[0]
    if floor is None or first.glibc is None or version_key(first.glibc) <= version_key(floor):
        return first
    meeting = [t for t in candidates if t.glibc is not None and version_key(t.glibc) <= version_key(floor)]
    if meeting:
        return max(meeting, key=lambda t: version_key(t.glibc or "0"))
    # none meets it (the plan refuses the job): the closest, which the refusal names
    return min(candidates, key=lambda t: version_key(t.glibc or "999"))


def job_toolchain(
    *, python: str, flavor: str, base_image: str | None, floor: str | None = None
) -> Toolchain | None:
    """The toolchain whose own image a job builds in (`pypi_toolchain`, for the job's glibc floor): the pypi
    flavor on a factory base whose suite ships several Pythons, `python` among them, or whose Pythons are
    source-built. None: the job gets a builder image of its own Python."""
    if flavor != "pypi":
        return None
    toolchain = pypi_toolchain(python, base_image=base_image, floor=floor)
    return toolchain if toolchain is not None and toolchain.own_image else None


def debian_toolchain(*, cuda: str, python: str) -> Toolchain:
    """The suite whose own nvidia-cuda-toolkit builds a CUDA `cuda` variant for `python` (the debian flavor):
    the toolkit's CUDA major must be the variant's (torch's extension builder refuses another major) and its
    minor not above it (a lower minor is a warning there, and the wheel links the same libcudart soname)."""
    _check_version("CUDA", cuda)
    _check_version("Python", python)
    wanted = version_key(cuda)
    for toolchain in TOOLCHAINS:
        if toolchain.cuda is None or python not in toolchain.pythons:
            continue
        have = version_key(toolchain.cuda)
        if have[0] == wanted[0] and have <= wanted:
            return toolchain
    known = "; ".join(
        f"{t.suite}: CUDA {t.cuda}, Python {', '.join(t.pythons)}" for t in TOOLCHAINS if t.cuda is not None
    )
    raise ImageError(
        f"flavor debian: no Debian suite's nvidia-cuda-toolkit builds CUDA {cuda} for Python {python} "
        f"({known}); use flavor pypi (CUDA >= 13) or devel"
    )


def version_key(version: str) -> tuple[int, ...]:
    """ "12.4" -> (12, 4): CUDA versions compared as numbers ("12.10" above "12.9")."""
    return tuple(int(part) for part in version.split("."))


def toolkit_cuda(*, cuda: str, python: str, flavor: str) -> str:
    """The CUDA release whose nvcc compiles a variant of CUDA `cuda`: the distribution's package for the
    debian flavor, the variant's own release for the others (NVIDIA's image, the PyPI wheels)."""
    _check_flavor(flavor)
    if flavor == "debian":
        toolkit = debian_toolchain(cuda=cuda, python=python).cuda
        assert toolkit is not None
        return toolkit
    return cuda


# The flavors whose builder images the factory makes for every platform: pypi from a bootstrapped base and
# the toolkit's wheels of that platform, devel from the platform's variant of NVIDIA's multi-platform devel
# image (one manifest per platform; `platform_image_name`) or of the stand-in. PyTorch's manylinux builder
# and Debian's toolkit image: the default platform's only.
PORTABLE_FLAVORS = ("pypi", "devel")


def flavor_platform_problem(flavor: str, target: Platform) -> str | None:
    """Why `flavor` makes no builder image for `target` (one line); None where it does. The plan drops such
    a job with this reason (`factory.plan.plan`), so no build starts for it."""
    if target == DEFAULT_PLATFORM or flavor in PORTABLE_FLAVORS:
        return None
    return (
        f"flavor {flavor} builds {DEFAULT_PLATFORM.name} only; {target.name} jobs use flavor "
        f"{' or '.join(PORTABLE_FLAVORS)}"
    )


def platform_image_name(ref: str, target: Platform) -> str:
    """The local tag of `target`'s variant of an image pulled from a registry (a multi-platform one:
    `nvidia/cuda:<cuda>-devel-<os>`): `ref` itself for the default platform; for another, its tag with the
    platform's suffix (`nvidia/cuda:12.8.1-devel-ubuntu22.04-<platform>`), a digest's as "sha256-<hex>": one
    tag names one image on a daemon, so each platform's variant has its own and pulling one never moves the
    other's."""
    if target == DEFAULT_PLATFORM:
        return ref
    name, _, digest = ref.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    repository, tag = (name[:colon], name[colon + 1 :]) if colon > slash else (name, "latest")
    if digest:
        tag = digest.replace(":", "-")
    suffix = platform_suffix(target)
    if len(tag) + len(suffix) > 128:  # Docker's limit of a tag: a long one keeps its start and a hash
        tag = tag[: 128 - len(suffix) - 13] + "-" + hashlib.sha256(tag.encode()).hexdigest()[:12]
    return f"{repository}:{tag}{suffix}"


def builder_image_for(
    *,
    cuda: str,
    python: str,
    flavor: str,
    base_image: str | None,
    floor: str | None = None,
    target: Platform = DEFAULT_PLATFORM,
) -> str:
    """The builder image a job of (cuda, python) runs in: the toolchain image when the job has one (every
    Python of a variant then compiles with one compiler; for a glibc `floor`, one whose glibc meets it where
    there is such), else the image of its own Python. The debian flavor's image is its suite's, named by the
    toolkit's CUDA (every CUDA 12 variant shares it). Another platform's image carries its name
    (`platform_suffix`)."""
    problem = flavor_platform_problem(flavor, target)
    if problem is not None:
        raise ConfigError(problem)
    if flavor == "debian":
        debian = debian_toolchain(cuda=cuda, python=python)
        assert debian.cuda is not None
        return toolchain_image_name(cuda=debian.cuda, suite=debian.suite, flavor=flavor)
    toolchain = job_toolchain(python=python, flavor=flavor, base_image=base_image, floor=floor)
    if toolchain is not None:
        return toolchain_image_name(cuda=cuda, suite=toolchain.name, flavor=flavor, target=target)
    return builder_image_name(cuda=cuda, python=python, flavor=flavor, target=target)


def builder_glibc(
    *, cuda: str, python: str, flavor: str, base_image: str | None, floor: str | None = None
) -> str | None:
    """The glibc of the builder a (cuda, python) job of `flavor` compiles in ("2.36" for bookworm), the
    newest a wheel made there can need; None where the factory does not know the base (an image of the
    user's own). ImageError where the flavor has no builder for the job (the debian flavor's CUDA, a Python
    no suite ships)."""
    _check_flavor(flavor)
    if flavor == "debian":
        return debian_toolchain(cuda=cuda, python=python).glibc
    suite = base_suite_of(base_image) if base_image is not None else None
    if flavor == "pypi":
        _check_pypi_toolkit(cuda)
        if base_image is None:
            toolchain = pypi_toolchain(python, base_image=None, floor=floor)
            return (toolchain or toolchain_for([python])).glibc
        return toolchain_glibc(suite) if suite is not None else None
    if base_image is not None and suite is None:  # the image named replaces NVIDIA's or PyTorch's
        # the devel stand-in is made on the default bootstrapped base
        return toolchain_glibc(DEFAULT_SUITE) if standin_cuda_of(base_image) is not None else None
    return DEVEL_OS_GLIBC.get(DEFAULT_DEVEL_OS) if flavor == "devel" else MANYLINUX_GLIBC


def toolchain_glibc(suite: str) -> str | None:
    toolchain = toolchain_named(suite)
    return None if toolchain is None else toolchain.glibc


def standin_cuda_of(image: str) -> str | None:
    """The CUDA version of a stand-in tag (`factory-standin:cuda13.0-devel` -> "13.0", so does
    `factory-standin:cuda13.0-devel-<platform>`), else None."""
    repo, sep, tag = image.rpartition(":")
    match = re.fullmatch(r"cuda(\d+\.\d+)-devel", split_platform(tag)[0])
    if not sep or repo != STANDIN_REPOSITORY or match is None:
        return None
    return match.group(1)


def cuda_major(cuda: str) -> int:
    _check_version("CUDA", cuda)
    return int(cuda.split(".", 1)[0])


def _check_pypi_toolkit(cuda: str) -> None:
    if cuda_major(cuda) < 13:
        raise ImageError(
            f"the PyPI toolkit (flavor pypi, the devel stand-in) needs CUDA >= 13 (CUDA {cuda}'s PyPI wheels "
            "do not form one toolkit tree); use flavor devel with NVIDIA's image"
        )


def base_suite_of(image: str) -> str | None:
    """The suite of a factory-bootstrapped base tag (`factory-base:bookworm` -> "bookworm", so does
    `factory-base:bookworm-<platform>`), else None."""
    repo, sep, tag = image.rpartition(":")
    if not sep or repo != BASE_REPOSITORY or not _SUITE_RE.fullmatch(tag):
        return None
    return split_platform(tag)[0]


def base_platform_of(image: str) -> Platform:
    """The platform of a factory-bootstrapped base tag or a stand-in tag; the default one for any other
    image."""
    repo, sep, tag = image.rpartition(":")
    if not sep or repo not in (BASE_REPOSITORY, STANDIN_REPOSITORY):
        return DEFAULT_PLATFORM
    return split_platform(tag)[1]
