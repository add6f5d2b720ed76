"""A preflight's compiles (`factory build --preflight`): every host compile, one device compile, no link.

The host names the candidates for the device compile in FACTORY_PREFLIGHT: a JSON list of the prepared
source's CUDA files, cheapest first, relative to the source root. In the build:
- an nvcc compile of the first candidate runs (cache lookup, admission, store: as any compile), for the lowest
  arch of its -gencode set only (`one_arch`), so that a compile error shows once; it is recorded as made
  (`mark_device`)
- every other nvcc compile is stood in for, as another shard's is (`shardskip.stand_in`), and its call is
  recorded (`record`)
- the host compiler's compiles (the `c++` launcher) all run, through the cache as usual
- a link of a shared object through the `c++` launcher is stood in for by an empty one (`stand_in_link`): a
  link of stood-in objects proves nothing and can fail for that alone (`-z defs`)
After the build the driver compiles the recorded call that ranks first (`choose`) when the build never
compiled the first candidate (only setup.py knows what it compiles: the host's first may be a vendored file it
never builds), and hands back no wheel.

Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from . import nvcccall, protocol, shardskip

DIR_NAME = "preflight"  # under FACTORY_JOB_DIR: kept across the attempts of one job, fresh per run
CALLS = "calls"
DEVICE_FILE = "device.json"
_VIRTUAL = re.compile(r"(?:arch=)?compute_(\d+)([a-z]?)")
_REAL = re.compile(r"sm_(\d+)([a-z]?)")


def candidates(environ: Mapping[str, str] | None = None) -> tuple[str, ...] | None:
    """The device compile's candidates, cheapest first; None when the build is no preflight. A value that is
    not a JSON list of strings is no preflight either: the build then compiles everything, as a real one."""
    return shardskip.env_sources(protocol.ENV_PREFLIGHT, environ)


def _arch_of(value: str) -> tuple[int, str] | None:
    """The virtual arch of one -gencode value (`arch=compute_90a,code=[sm_90a,compute_90a]` -> (90, "a"))."""
    match = _VIRTUAL.search(value) or _REAL.search(value)
    return None if match is None else (int(match.group(1)), match.group(2))


def one_arch(call: nvcccall.NvccCall) -> nvcccall.NvccCall:
    """An nvcc call with only the -gencode entries of its lowest arch (by number: compute_80 before
    compute_100, whatever its codes); a call with one arch, or none in -gencode form, as it is."""
    gencodes = [  # (the argument, its arch) of each -gencode
        (a, _arch_of(a.value)) for a in call.args if a.option == "-gencode" and a.value is not None
    ]
    archs = {arch for _, arch in gencodes if arch is not None}
    if len(archs) < 2:
        return call
    lowest = min(archs)
    return call.without(a for a, arch in gencodes if arch not in (None, lowest))


def arch_label(archs: Sequence[str]) -> str | None:
    """The parsed archs of a call (`nvcccall.NvccCall.archs`: "compute_80") as the cubins they name:
    "sm_80"; None for a call that names none."""
    labels = [a.replace("compute_", "sm_") for a in archs if a.startswith("compute_")]
    return ",".join(labels) or None


# --- what the build did, in the job directory --------------------------------------------------------------


def state_dir(environ: Mapping[str, str] | None = None) -> str | None:
    job_dir = (environ if environ is not None else os.environ).get(protocol.ENV_JOB_DIR)
    return os.path.join(job_dir, DIR_NAME) if job_dir else None


def _write_json(directory: str, name: str | None, data: object) -> None:
    """Whole or not at all: a reader never sees half a file (compiles run side by side)."""
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, os.path.join(directory, name or os.path.basename(tmp)[len(".tmp-") :]))


@dataclass(frozen=True, kw_only=True)
class Call:
    """An nvcc compile the build made and a stand-in answered: enough to run it again as it was."""

    argv: tuple[str, ...]
    cwd: str
    source: str
    env: Mapping[str, str]


def record(call: nvcccall.NvccCall, *, environ: Mapping[str, str] | None = None) -> None:
    """Keep a stood-in compile's call, for `choose`; nowhere to keep it (no job directory) keeps nothing."""
    env = dict(environ if environ is not None else os.environ)
    directory = state_dir(env)
    if directory is None or call.source is None:
        return
    kept = {"argv": list(call.argv), "cwd": os.getcwd(), "source": call.source, "env": env}
    _write_json(os.path.join(directory, CALLS), None, kept)


def recorded(directory: str) -> list[Call]:
    """The calls `record` kept (every attempt's of the job), in name order; unreadable ones left out."""
    calls = []
    where = os.path.join(directory, CALLS)
    for name in sorted(os.listdir(where)) if os.path.isdir(where) else []:
        if name.startswith(".") or not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(where, name)) as fh:
                raw = json.load(fh)
            env = {str(k): str(v) for k, v in raw["env"].items()}
            argv = tuple(str(a) for a in raw["argv"])
            calls.append(Call(argv=argv, cwd=str(raw["cwd"]), source=str(raw["source"]), env=env))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return calls


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return sys.maxsize


def choose(calls: Sequence[Call], ranked: Sequence[str]) -> Call | None:
    """The recorded compile to run: the one whose source comes first among the host's candidates; sources
    it did not name (generated ones, or outside the source tree) after them, smallest first."""

    def rank(call: Call) -> tuple[int, int, str]:
        for i, rel in enumerate(ranked):
            if shardskip.in_shard(call.source, (rel,)):
                return (0, i, call.source)
        return (1, _size(os.path.join(call.cwd, call.source)), call.source)

    return min(calls, key=rank, default=None)


def mark_device(source: str, archs: Sequence[str], environ: Mapping[str, str] | None = None) -> None:
    """Record that the build makes the device compile (the first candidate's), so the driver need not; should
    it fail, the build fails before the driver would look."""
    directory = state_dir(environ)
    if directory is not None:
        _write_json(directory, DEVICE_FILE, {"source": source, "arch": arch_label(archs)})


def device_done(directory: str) -> dict[str, str | None] | None:
    try:
        with open(os.path.join(directory, DEVICE_FILE)) as fh:
            raw = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    return {"source": _str(raw.get("source")), "arch": _str(raw.get("arch"))}


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


# --- the link ----------------------------------------------------------------------------------------------


def stand_in_link(cxx: str, call: nvcccall.NvccCall) -> int:
    """An empty shared object where the link would have written one."""
    out = call.output
    if out is None:
        return 0
    print(f"factory-preflight: the link of {out} is stood in for (no link in a preflight)", file=sys.stderr)
    return subprocess.call([cxx, "-shared", "-x", "c", os.devnull, "-o", out])
