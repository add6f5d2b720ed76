"""`factory build --preflight`, pure: which jobs, the device compile's candidates, the verdict.

A preflight runs, for each variant, its first job (its first Python: the others share its sources) as far as
its compiles: the source fetched and patched, the environment made, every host compile and one device compile
run with the real flags in the real container under admission (`factory.container.preflightcompiles`), no
link, no wheel. Its compiles go to the compile cache under the keys the real build looks up.

The device compile is the cheapest CUDA file by the learned profile, else by the recipe's
`compile_seconds_by_file`, else the smallest (`candidates`); the container compiles the first of these the
build really compiles, for one arch.

A failure is reported by its first error line: the first line of the log that reads like a compiler's error
(`file:line:col: error:`, `fatal error:`, `#error`, nvcc's `file(line): error:` and `nvcc fatal   :`), else
the driver's or the host's own complaint (a patch that does not apply), else a Python exception, else the
job's reason; one line, the job directory's prefix taken out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from factory.build.report import PreflightResult
from factory.container import admission, protocol
from factory.container.protocol import ProfileEntry
from factory.core.urls import printable
from factory.plan import shard as sharding
from factory.plan.plan import Job

MAX_LINE = 300  # a summary row's error line; the log has the whole of it


def lead_jobs(jobs: Sequence[Job]) -> list[Job]:
    """Each variant's first job in plan order (the schedule's lead, whose compiles its other Pythons find
    in the cache), in the order variants first appear."""
    leads: dict[object, Job] = {}
    for job in jobs:
        leads.setdefault(job.variant, job)
    return list(leads.values())


def candidates(
    tree: Path,
    *,
    entries: Mapping[str, ProfileEntry] | None = None,
    seconds_by_file: Sequence[tuple[str, float]] = (),
) -> tuple[tuple[str, ...], str]:
    """The prepared source's CUDA files, cheapest first, and what ranked them ("profile", "recipe", both
    joined by "+", or "size"). A file's estimate is its learned wall time (`shard.profile_walls`), else the
    recipe's `compile_seconds_by_file`; files with one come first, by it, then the others; ties by size, then
    name. Unlike a shard's weights, a file without an estimate never takes the median's: a profile that
    measured one file (an earlier preflight's) would otherwise tie every file with it."""
    units = sharding.compile_units(tree)
    walls = sharding.profile_walls(units, entries or {})
    estimates: dict[str, float] = {}
    used: set[str] = set()
    for unit in units:
        wall = walls.get(unit.rsplit("/", 1)[-1])
        table = admission.file_value(unit, seconds_by_file)
        if wall is not None:
            estimates[unit] = wall
            used.add("profile")
        elif table is not None:
            estimates[unit] = float(table)
            used.add("recipe")
    sizes = {u: (tree / u).stat().st_size for u in units}

    def rank(unit: str) -> tuple[int, float, int, str]:
        known = estimates.get(unit)
        return (0 if known is not None else 1, known or 0.0, sizes[unit], unit)

    basis = "+".join(b for b in ("profile", "recipe") if b in used) or "size"
    return tuple(sorted(units, key=rank)), basis


# --- the first error line ----------------------------------------------------------------------------------

_COMPILER_ERROR = re.compile(
    r"""
      ^\S[^:]*:\d+(?::\d+)?:\s+(?:fatal\ )?error:                 # gcc/clang: file:line[:col]: [fatal] error:
    | ^\S[^(]*\(\d+\):\s+(?:catastrophic\ )?error\b              # nvcc's front end: file(line): error:
    | ^(?:nvcc|ptxas|cicc|cudafe\+\+|fatbinary|nvlink)\s+(?:error|fatal)\s*:   # nvcc's own: nvcc fatal   :
    | ^[\w.+-]+:\s+(?:fatal\ )?error:                           # a driver: c++: error:, cc1plus: fatal error:
    | \#\s*error\b                                              # an #error however it is shown
    """,
    re.VERBOSE,
)
# the driver's own complaints (`sys.exit("factory: ...")`) and the host's (`JobRun.log_error`), less the
# line that only says the build's command failed: what failed in it is above
_FACTORY_LINE = re.compile(r"^factory: (?!'.*' failed with exit code \d+$)")
_PYTHON_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit): \S")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_JOB_DIR = re.compile(re.escape(protocol.JOBS_ROOT) + r"/[^/\s]+/")
_SITE = re.compile(r"venv/lib/python3\.\d+/site-packages/")


def _plain(line: str) -> str:
    return _ANSI.sub("", line).strip()


def first_error_line(lines: Iterable[str]) -> str | None:
    """The line that says why a build failed, shortened (`shorten`); None when no line of the log does."""
    found: dict[int, str] = {}
    for raw in lines:
        if protocol.is_marked(raw) or protocol.MEASUREMENT_MARK in raw:
            continue
        line = _plain(raw)
        if _COMPILER_ERROR.search(line):
            return shorten(line)
        for tier, pattern in ((1, _FACTORY_LINE), (2, _PYTHON_EXCEPTION)):
            if tier not in found and pattern.search(line):
                found[tier] = line
    if not found:
        return None
    tier = min(found)
    return shorten(found[tier].removeprefix("factory: ") if tier == 1 else found[tier])


def shorten(line: str) -> str:
    """One line for a summary: paths relative to the job's directory (`src/csrc/x.cpp`, and
    `site-packages/torch/...` for the venv's), control characters escaped, at most MAX_LINE characters."""
    text = printable(_SITE.sub("site-packages/", _JOB_DIR.sub("", line.strip())))
    return text if len(text) <= MAX_LINE else text[: MAX_LINE - 3] + "..."


# --- the verdict -------------------------------------------------------------------------------------------


def host_compiles(lines: Iterable[str]) -> int:
    """The host compiler's compiles of a log that ran or came from the cache, and succeeded."""
    count = 0
    for line in lines:
        measured = protocol.parse_measurement(line) if protocol.MEASUREMENT_MARK in line else None
        if measured is not None and measured.tool == "cxx" and measured.rc == 0:
            count += 1
    return count


def _text(value: Any) -> str | None:
    """A field of the driver's mark (the container's word: one printable line), or None."""
    return printable(value) if isinstance(value, str) and value else None


def passed(*, mark: object, lines: Sequence[str], log: str | None) -> PreflightResult:
    """A preflight whose build finished: its device compile as the driver's `preflight` mark names it."""
    fields = mark if isinstance(mark, dict) else {}
    source = _text(fields.get("source"))
    return PreflightResult(
        result="pass",
        log=log,
        host_compiles=host_compiles(lines),
        device=None if source is None else source.rsplit("/", 1)[-1],
        arch=_text(fields.get("arch")),
    )


def failed(*, lines: Sequence[str], reason: str | None, log: str | None) -> PreflightResult:
    line = first_error_line(lines) or (shorten(reason) if reason else None)
    return PreflightResult(result="fail", line=line, log=log, host_compiles=host_compiles(lines))


def summary(result: PreflightResult) -> str:
    """A passed preflight in the job's reason: "preflight: 1 host compile, device add.cu for sm_80"."""
    host = f"{result.host_compiles} host compile{'' if result.host_compiles == 1 else 's'}"
    if result.device is None:
        return f"preflight: {host}, no device compile"
    return f"preflight: {host}, device {result.device}" + (f" for {result.arch}" if result.arch else "")
