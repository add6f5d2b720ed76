"""What the wrappers read from their environment, and how they speak to the build log."""

from __future__ import annotations

import os
import sys

from . import cgroup


def log(message: str) -> None:
    if os.environ.get("FACTORY_WRAPPER_QUIET") != "1":
        print(f"factory-nvcc: {message}", file=sys.stderr, flush=True)


def read_cgroup() -> cgroup.CgroupInfo:
    """The limits and usage of the cgroup this compile runs in (FACTORY_CGROUP_ROOT: where the cgroup file
    system is, when not at /sys/fs/cgroup)."""
    return cgroup.read_cgroup(os.environ.get("FACTORY_CGROUP_ROOT") or "/sys/fs/cgroup")


def env_int(name: str, default: int | None) -> int | None:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return int(float(value))
    except ValueError:
        return default


def env_fraction(name: str) -> float | None:
    """A fraction in (0, 1] from the environment; anything else is ignored (None), never fatal."""
    try:
        value = float(os.environ.get(name) or "nan")
    except ValueError:
        return None
    return value if 0 < value <= 1 else None
