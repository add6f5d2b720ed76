"""What the wrappers read from their environment (`protocol.WrapperEnv`), and how they speak to the build
log."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from . import cgroup, protocol


def log(message: str) -> None:
    if os.environ.get(protocol.ENV_WRAPPER_QUIET) != "1":
        print(f"factory-nvcc: {message}", file=sys.stderr, flush=True)


def settings(environ: Mapping[str, str] | None = None) -> protocol.WrapperEnv:
    """The wrapper's environment. A value it cannot read is said in the build log and left at its default:
    a compile never fails for a hint (a matrix's own env may set these)."""
    problems: list[str] = []
    found = protocol.WrapperEnv.from_env(os.environ if environ is None else environ, problems=problems)
    for problem in problems:
        log(f"ignored {problem}")
    return found


def read_cgroup(root: str | None = None) -> cgroup.CgroupInfo:
    """The limits and usage of the cgroup this compile runs in (`root`: where the cgroup file system is, when
    not at /sys/fs/cgroup)."""
    return cgroup.read_cgroup(root or "/sys/fs/cgroup")
