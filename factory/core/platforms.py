"""The target platforms: every fact the factory knows about a CPU architecture, in one table.

A platform is an axis of the matrix (`platform: [...]`, default the one row the factory has always built)
and a field of each planned job. Everything that differs between platforms is a column of `Platform`: the
name pip, PEP 425 tags and `platform_machine` markers use, what `platform.machine()` says on such a host,
the manylinux/musllinux tag suffix, the tag of an untagged build and the tag of the host-side wheelhouse
(torch's own wheels), Docker's platform string, Debian's architecture name, the GNU triplet compilers are
named by, the ELF machine number of its shared objects, the architecture of auditwheel's policies and the
CI runner its jobs run on by default.

No other module spells a platform's name: they take a `Platform` (`DEFAULT_PLATFORM` where a caller has
no job at hand) and read its columns, so adding a platform is a row here plus what truly differs (a unit
test holds the rest of factory/ to that). Only `BUILDABLE` platforms are planned; the others are known
(tags, host detection) but refused in a matrix with one line, until their builder images exist. Today
every platform of the table is buildable.
"""

from __future__ import annotations

import platform as _host
from dataclasses import dataclass

from factory.core.errors import ConfigError
from factory.core.tags import manylinux_tag, parse_manylinux


@dataclass(frozen=True, kw_only=True)
class Platform:
    """One target platform's facts. `name` is the matrix value and the machine of its wheel tags."""

    name: str
    # what `platform.machine()` returns on such a host, lower-cased (Linux says the name, others may not)
    machines: tuple[str, ...]
    # the glibc of the tag the host-side wheelhouse asks pip for: torch's CUDA wheels are manylinux_2_28
    wheelhouse_glibc: tuple[int, int]
    docker: str  # `docker run --platform`: "linux/amd64"
    debian_arch: str  # dpkg's architecture, debootstrap's --arch
    gnu_triplet: str  # the multiarch directory and the prefix of the cross-named compilers
    elf_machine: int  # e_machine of its ELF objects (EM_X86_64 = 62, EM_AARCH64 = 183)
    auditwheel_arch: str  # the architecture auditwheel's manylinux policies are written for
    # QEMU's name for it: the binfmt_misc entry `qemu-<qemu>` that runs its binaries on another host
    qemu: str
    # The `runs-on` labels of a CI job (the reusable workflow's build and shard jobs) building for it, unless
    # the caller names others (`factory matrix --runner`): a host of this platform, so that its builds run
    # natively, never under emulation
    ci_runner: tuple[str, ...]

    @property
    def tag_suffix(self) -> str:
        """What every linux/manylinux/musllinux platform tag of this platform ends with: "_<name>"."""
        return f"_{self.name}"

    @property
    def wheel_tag(self) -> str:
        """The tag setuptools gives a build for this platform, which promises nothing about glibc."""
        return f"linux{self.tag_suffix}"

    @property
    def wheelhouse_tag(self) -> str:
        """The `pip download --platform` of the host-side wheelhouses (torch's wheels are this tag)."""
        return self.manylinux_tag(self.wheelhouse_glibc)

    def manylinux_tag(self, glibc: tuple[int, int]) -> str:
        """The PEP 600 tag of this platform for a glibc: (2, 28) -> "manylinux_2_28_<name>"."""
        return manylinux_tag(glibc, self.name)

    def musllinux_tag(self, musl: tuple[int, int]) -> str:
        """The PEP 656 tag of this platform for a musl: (1, 2) -> "musllinux_1_2_<name>"."""
        return f"musllinux_{musl[0]}_{musl[1]}{self.tag_suffix}"

    def owns_tag(self, tag: str) -> bool:
        """Whether a wheel platform tag (linux_, manylinux_X_Y_, a legacy manylinux or musllinux) is for this
        platform; the tag's glibc is not judged here."""
        prefix, sep, _rest = tag.partition("_")
        return bool(sep) and tag.endswith(self.tag_suffix) and prefix.rstrip("0123456789") in _LINUX_PREFIXES

    def manylinux_glibc(self, tag: str) -> tuple[int, int] | None:
        """The glibc a manylinux tag of this platform needs ("manylinux_2_28_<name>" -> (2, 28)); None for a
        tag of another platform or one that promises nothing about glibc (linux_, musllinux_)."""
        parsed = parse_manylinux(tag)
        return parsed.glibc if parsed is not None and parsed.machine == self.name else None


_LINUX_PREFIXES = frozenset({"linux", "manylinux", "musllinux"})

PLATFORMS: tuple[Platform, ...] = (
    Platform(
        name="x86_64",
        machines=("x86_64", "amd64"),
        wheelhouse_glibc=(2, 28),
        docker="linux/amd64",
        debian_arch="amd64",
        gnu_triplet="x86_64-linux-gnu",
        elf_machine=62,
        auditwheel_arch="x86_64",
        qemu="x86_64",
        # the self-hosted Docker hosts the workflow has always built on (root, the matrix's memory)
        ci_runner=("self-hosted", "linux", "x64"),
    ),
    Platform(
        name="aarch64",
        machines=("aarch64", "arm64"),
        wheelhouse_glibc=(2, 28),
        docker="linux/arm64",
        debian_arch="arm64",
        gnu_triplet="aarch64-linux-gnu",
        elf_machine=183,
        auditwheel_arch="aarch64",
        qemu="aarch64",
        # GitHub's hosted Arm runner (Ubuntu 24.04, Docker)
        ci_runner=("ubuntu-24.04-arm",),
    ),
)

# What a matrix without `platform:` builds, and what every caller without a job at hand means: the one
# platform whose job ids and wheel names carry no platform (they predate the axis).
DEFAULT_PLATFORM = PLATFORMS[0]

# The platforms a matrix may plan: each has builder images (the pypi flavor's, from a bootstrapped base and
# the toolkit's wheels of that platform), built natively on such a host and under QEMU on another
# (`factory.build.emulation`).
BUILDABLE: tuple[Platform, ...] = PLATFORMS

NAMES: tuple[str, ...] = tuple(p.name for p in PLATFORMS)


def by_name(name: str) -> Platform | None:
    """The platform a matrix or a wheel tag calls `name`; None for one the table lacks."""
    return next((p for p in PLATFORMS if p.name == name), None)


def named(name: str) -> Platform:
    """`by_name`, or ConfigError naming the known platforms."""
    found = by_name(name)
    if found is None:
        raise ConfigError(f"unknown platform {name!r}: expected one of {', '.join(NAMES)}")
    return found


def build_problem(found: Platform) -> str | None:
    """Why the factory cannot build for a platform yet (one line); None for a buildable one."""
    if found in BUILDABLE:
        return None
    built = ", ".join(p.name for p in BUILDABLE)
    return f"{found.name} builds are not supported yet (the factory builds {built})"


def of_machine(machine: str) -> Platform | None:
    """The platform of a `platform.machine()` value (x86_64, AMD64, aarch64, arm64); None if unknown."""
    lowered = machine.lower()
    return next((p for p in PLATFORMS if lowered in p.machines), None)


def of_tag(tag: str) -> Platform | None:
    """The platform a wheel platform tag is for; None for a tag of no known Linux platform."""
    return next((p for p in PLATFORMS if p.owns_tag(tag)), None)


def host_platform() -> Platform | None:
    """This host's platform (`platform.machine()`), None where the table lacks it."""
    return of_machine(_host.machine())


__all__ = [
    "BUILDABLE",
    "DEFAULT_PLATFORM",
    "NAMES",
    "PLATFORMS",
    "Platform",
    "build_problem",
    "by_name",
    "host_platform",
    "named",
    "of_machine",
    "of_tag",
]
