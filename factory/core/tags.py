"""Wheel tags: the interpreter tag of a job's Python, the manylinux platform tags of its wheels and the one
spelling of a wheel's filename."""

from __future__ import annotations

import re
from typing import NamedTuple

from packaging.utils import parse_wheel_filename

_MANYLINUX = re.compile(r"^manylinux_(?P<major>\d+)_(?P<minor>\d+)_(?P<machine>.+)$")
# The pre-PEP 600 names and the glibc each stands for (PEP 513, 571, 599).
_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


class Manylinux(NamedTuple):
    glibc: tuple[int, int]  # the oldest glibc the tag promises to run on
    machine: str


def python_tag(python: str) -> str:
    """The CPython interpreter tag of a "3.11"-style version: "cp311"; ValueError for anything else."""
    parts = python.strip().split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise ValueError(f"python version {python!r} is not like 3.11")
    return f"cp{parts[0]}{parts[1]}"


def parse_manylinux(platform: str) -> Manylinux | None:
    """manylinux_2_34_<m> -> ((2, 34), "<m>"); manylinux2014_<m> -> ((2, 17), "<m>"); None for any other
    platform tag (linux_<m> promises nothing about glibc); <m> is a machine of `factory.core.platforms`."""
    match = _MANYLINUX.fullmatch(platform)
    if match is not None:
        return Manylinux((int(match["major"]), int(match["minor"])), match["machine"])
    legacy, _, machine = platform.partition("_")
    if legacy in _LEGACY and machine:
        return Manylinux(_LEGACY[legacy], machine)
    return None


def manylinux_tag(glibc: tuple[int, int], machine: str) -> str:
    return f"manylinux_{glibc[0]}_{glibc[1]}_{machine}"


def parse_glibc(version: str) -> tuple[int, int] | None:
    """ "2.36" (what `os.confstr("CS_GNU_LIBC_VERSION")` ends with) -> (2, 36); None for anything else."""
    match = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+)*", version.strip())
    return (int(match[1]), int(match[2])) if match else None


def canonical_wheel_filename(filename: str) -> str:
    """The one spelling of a wheel's filename: normalised project name with "_", normalised version,
    lower-case tags ("Demo_Ext-0.1.0+CU13...-PY3-none-any.whl" -> "demo_ext-0.1.0+cu13...-py3-none-any.whl").

    Raises InvalidWheelFilename."""
    name, version, build, _tags = parse_wheel_filename(filename)
    tag_part = "-".join(filename[: -len(".whl")].split("-")[-3:]).lower()
    build_part = f"-{build[0]}{build[1]}" if build else ""
    return f"{name.replace('-', '_')}-{version}{build_part}-{tag_part}.whl"
