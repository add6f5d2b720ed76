"""The glibc floor: the oldest glibc a matrix's wheels must install on (build.glibc), and whether a job's
builder can meet it.

A CUDA extension links no libpython, so the newest glibc (and libstdc++) its symbols can need is the
builder's: a wheel compiled on bookworm needs at most glibc 2.36 (auditwheel then finds its exact tag, often
lower), one compiled on forky at most 2.43. A floor the builder's glibc is above is therefore not a promise
the build can keep, and is refused at plan time, naming a flavor whose builder is old enough; the wheel
check (`wheelcheck.check_wheel`) refuses a wheel whose manylinux tag is above the floor all the same.

`build.glibc` is a version ("2.28"), `torch` (each torch's own floor: the manylinux tag of its wheels, from
the compatibility data or the index) or `builder` (the default: no floor declared; the builder's glibc bounds
the wheels, and `factory matrix` shows how far above torch's that is). The default is not torch's floor
because no builder this factory makes without a registry is that old (bookworm, the oldest base whose GCC
compiles torch's C++20 headers, has 2.36): a default of 2.28 would refuse every matrix on such a host.

The floor also picks the builder where a flavor has several for a job: the pypi flavor's Python 3.13 builds
on forky (2.43) unless the floor is below that, then on bookworm with a source-built CPython (2.36;
`toolchains.pypi_toolchain`), so `build.glibc: "2.36"` is met for every Python this host builds without a
registry but 3.14 and 3.15.
"""

from __future__ import annotations

from dataclasses import dataclass

from factory.core.errors import ConfigError, ImageError
from factory.core.platforms import DEFAULT_PLATFORM, Platform
from factory.core.tags import parse_glibc
from factory.spec import toolchains
from factory.spec.compat import CompatData
from factory.spec.config import GLIBC_TORCH
from factory.spec.options import FLAVORS, BuildOptions

# The flavors whose default base is pulled from a registry (NVIDIA's, PyTorch's), not made from the mirror.
PULLED = ("devel", "manylinux")


def glibc_key(version: str) -> tuple[int, int]:
    parsed = parse_glibc(version)
    if parsed is None:
        raise ConfigError(f"{version!r} is not a glibc version")
    return parsed


def job_floor(build: BuildOptions, compat: CompatData, *, torch: str) -> str | None:
    """The floor a job of `torch` is held to ("2.28"), None where the matrix declares none. ConfigError
    where build.glibc is `torch` and the data knows no floor of that torch."""
    if build.glibc != GLIBC_TORCH:
        return build.glibc
    found = compat.torch_glibc(torch)
    if found is None:
        raise ConfigError(
            f"build.glibc: torch: the compatibility data knows no glibc floor for torch {torch} "
            '(compat.torch."<minor>".glibc); name one, like glibc: "2.28"'
        )
    return found


@dataclass(frozen=True, kw_only=True)
class Builder:
    """Where a job compiles, as far as its glibc goes."""

    image: str  # the builder image's tag, or the reference build.images names
    glibc: str | None  # its glibc; None: not known (an image of the user's own)
    explicit: bool = False  # named in build.images or build.base_image: its glibc is the user's word


def builder_of(
    build: BuildOptions,
    *,
    cuda: str,
    python: str,
    floor: str | None = None,
    target: Platform = DEFAULT_PLATFORM,
) -> Builder:
    """The builder of a (cuda, python) job of glibc floor `floor` on `target` and its glibc
    (`toolchains.builder_glibc`: the pypi flavor's Python 3.13 job with a floor below forky's builds on
    bookworm with a source-built CPython; another platform's image has the same glibc, and its name)."""
    explicit = build.images.get(cuda)
    if explicit:
        return Builder(image=explicit, glibc=None, explicit=True)
    try:
        image = toolchains.builder_image_for(
            cuda=cuda,
            python=python,
            flavor=build.flavor,
            base_image=build.base_image,
            floor=floor,
            target=target,
        )
        glibc = toolchains.builder_glibc(
            cuda=cuda, python=python, flavor=build.flavor, base_image=build.base_image, floor=floor
        )
    except ImageError as exc:
        raise ConfigError(str(exc)) from None
    return Builder(image=image, glibc=glibc, explicit=glibc is None)


def check_platform(
    build: BuildOptions,
    *,
    cuda: str,
    python: str,
    target: Platform = DEFAULT_PLATFORM,
    floor: str | None = None,
) -> str | None:
    """The newest platform tag the install check's container takes (it runs in the job's builder, so its
    glibc; `target`'s machine): "manylinux_2_43_<machine>" on forky; None where the builder's glibc is not
    known."""
    try:
        glibc = builder_of(build, cuda=cuda, python=python, floor=floor).glibc
    except ConfigError:
        return None
    return None if glibc is None else target.manylinux_tag(glibc_key(glibc))


def flavors_meeting(floor: str, *, cuda: str, python: str) -> list[tuple[str, str]]:
    """(flavor, its builder's glibc) of each flavor whose default builder for (cuda, python) and this floor
    is not newer than `floor`, oldest glibc first."""
    return [
        (flavor, glibc)
        for flavor, glibc, _ in _builders(floor, cuda=cuda, python=python)
        if glibc_key(glibc) <= glibc_key(floor)
    ]


def _builders(floor: str, *, cuda: str, python: str) -> list[tuple[str, str, str]]:
    """(flavor, glibc, image) of each flavor's default builder for a (cuda, python) job of this floor whose
    glibc is known, oldest glibc first."""
    found = []
    for flavor in FLAVORS:
        try:
            glibc = toolchains.builder_glibc(
                cuda=cuda, python=python, flavor=flavor, base_image=None, floor=floor
            )
            image = toolchains.builder_image_for(
                cuda=cuda, python=python, flavor=flavor, base_image=None, floor=floor
            )
        except (ImageError, ConfigError):
            continue
        if glibc is not None:
            found.append((flavor, glibc, image))
    return sorted(found, key=lambda f: glibc_key(f[1]))


def closest_local(floor: str, *, cuda: str, python: str) -> tuple[str, str, str] | None:
    """(flavor, glibc, image) of the oldest-glibc builder made without a registry (not a PULLED flavor's)
    for a (cuda, python) job of this floor; None where no such flavor builds the job."""
    local = [b for b in _builders(floor, cuda=cuda, python=python) if b[0] not in PULLED]
    return local[0] if local else None


def floor_problem(build: BuildOptions, floor: str | None, *, cuda: str, python: str) -> str | None:
    """Why the job's builder cannot promise `floor`, naming the flavors whose builder can; None when it can,
    when no floor is declared, or when the builder's glibc is not known (the wheel check decides then)."""
    if floor is None:
        return None
    builder = builder_of(build, cuda=cuda, python=python, floor=floor)
    if builder.glibc is None or glibc_key(builder.glibc) <= glibc_key(floor):
        return None
    meeting = _builders(floor, cuda=cuda, python=python)
    able = [
        # a builder the factory makes is named (a source-built Python's, say); a registry's is its flavor's
        f"{flavor} ({'' if flavor in PULLED else image + ', '}glibc {glibc})"
        for flavor, glibc, image in meeting
        if glibc_key(glibc) <= glibc_key(floor)
    ]
    pulled = all(flavor in PULLED for flavor, glibc, _ in meeting if glibc_key(glibc) <= glibc_key(floor))
    local = closest_local(floor, cuda=cuda, python=python)
    # Where only a registry's builder meets the floor, the oldest one this host makes from the mirror alone.
    nearest = (
        f"; without a registry the oldest is flavor {local[0]} ({local[2]}, glibc {local[1]}): "
        f'build.glibc "{local[1]}"'
        if local is not None and glibc_key(local[1]) > glibc_key(floor)
        else ""
    )
    instead = (
        f"flavor {' or '.join(able)} can"
        + (" (its base comes from a registry: `docker load` it where none is reachable)" if pulled else "")
        + (nearest if pulled else "")
        if able
        else "no flavor's builder is that old: lower the floor or name an older builder in build.images"
        + nearest
    )
    return (
        f"build.glibc {floor}: flavor {build.flavor} compiles CUDA {cuda} / Python {python} in "
        f"{builder.image} (glibc {builder.glibc}), whose wheels may need glibc up to {builder.glibc}; "
        f"{instead}"
    )


def shown(
    build: BuildOptions,
    floor: str | None,
    *,
    cuda: str,
    python: str,
    torch_floor: str | None,
    target: Platform = DEFAULT_PLATFORM,
) -> str:
    """What `factory matrix` says of a job's floor: "2.28 (manylinux builder, glibc 2.28)", or without a
    declared floor the builder's bound and, where it is above, torch's: "<= 2.43 (<image>, glibc 2.43; torch:
    2.28)". A job the flavor has no builder for says so (the build refuses it when it makes the image)."""
    try:
        builder = builder_of(build, cuda=cuda, python=python, floor=floor, target=target)
    except ConfigError as exc:
        return f"no builder: {exc}"
    where = builder.image + (f", glibc {builder.glibc}" if builder.glibc else ", glibc not known")
    if floor is not None:
        return f"{floor} ({where})"
    if builder.glibc is None:
        return f"not declared ({where})"
    above = torch_floor is not None and glibc_key(builder.glibc) > glibc_key(torch_floor)
    return f"<= {builder.glibc} ({where}" + (f"; torch: {torch_floor})" if above else ")")
