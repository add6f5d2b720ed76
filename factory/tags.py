"""Wheel tags: the interpreter tag of a job's Python and the Linux platform tags a factory wheel may carry."""

from __future__ import annotations

import re

_MANYLINUX = re.compile(r"^(manylinux_\d+_\d+|manylinux1|manylinux2010|manylinux2014)_(?P<machine>.+)$")


def python_tag(python: str) -> str:
    """The CPython interpreter tag of a "3.11"-style version: "cp311"; ValueError for anything else."""
    parts = python.strip().split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise ValueError(f"python version {python!r} is not like 3.11")
    return f"cp{parts[0]}{parts[1]}"


def is_linux_platform(platform: str, machine: str = "x86_64") -> bool:
    """True for linux_<machine> and every manylinux flavour for that machine."""
    if platform == f"linux_{machine}":
        return True
    match = _MANYLINUX.match(platform)
    return match is not None and match["machine"] == machine
