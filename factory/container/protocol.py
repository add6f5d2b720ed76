"""The lines and files that cross the container boundary: each format with both directions, in one place.

- progress marks: `::factory:: {json}` lines the driver prints on stdout (`mark_line`), which the host's build
  runner reads (`parse_mark`); the host writes its own notes into the build log behind the same mark
  (`note_line`), and leaves every marked line out of a failure's log tail (`is_marked`)
- compile measurements: one JSON object per compile the nvcc wrapper ran, appended to FACTORY_PROFILE_OUT
  (`measurement_json`) and printed into the build log behind `::factory-compile::` (`measurement_line`);
  `parse_measurement` reads either; its "cache" field says whether the compile cache served it ("hit": nothing
  was compiled, its figures are the lookup's and teach no profile), compiled it ("miss") or was off
- links: `::factory-link::` {"output", "inputs"} lines the `c++` launcher prints into the build log for each
  shared link it runs (`link_line`, `parse_link`); with the compiles' "object" they tell the host which
  modules carry no object nvcc compiled (`links`)
- learned profiles: `{"format", "package", "version", "entries": {compile key: entry}}`, written by the host
  (`profile_json`) and read by the host and by the wrapper (`parse_profile`)
- compile keys: `file|arch,arch|threads`, the keys of a profile (`compile_key`)
- the abi3 tag of a job's wheel ("cp311"), set by the host in LIMITED_API_ENV when its recipe builds a
  limited-API wheel; the driver passes it to bdist_wheel
- owners: `{"pid", "host"}` of the factory process a directory belongs to (`owner_json`, `parse_owner`), in
  OWNER_FILE of a run's temporary output directory and of a job's directory in the work volume (set by the
  host in ENV_JOB_OWNER, written there by the driver)
- the work volume's job directories, as the driver's `jobs` phase lists them for `factory clean`
  (`job_listing_line`, `parse_job_listing`), and those its `remove-jobs` phase removed (`removed_line`,
  `parse_removed`)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .links import Link

MARK = "::factory::"
MEASUREMENT_MARK = "::factory-compile::"
LINK_MARK = "::factory-link::"
MAX_LINK_INPUTS = 100_000  # a line naming more is no link the host reads
PROFILE_FORMAT = 1
CACHE_HIT = "hit"
CACHE_MISS = "miss"
CACHE_OFF = "off"
# a compile another shard makes: an empty object stood in for it
CACHE_SKIPPED = "skipped"
# `factory build --shard I/N`: the shard, and its compiles (JSON list of paths relative to the source root)
ENV_SHARD = "FACTORY_SHARD"
ENV_SHARD_SOURCES = "FACTORY_SHARD_SOURCES"
# `factory build --preflight`: the candidates for its one device compile (JSON list of paths relative to the
# source root, cheapest first); every other nvcc compile is stood in for
ENV_PREFLIGHT = "FACTORY_PREFLIGHT"
LIMITED_API_ENV = "FACTORY_PY_LIMITED_API"


# --- progress marks ----------------------------------------------------------------------------------------


def mark_line(**fields: object) -> str:
    return f"{MARK} {json.dumps(fields, sort_keys=True)}"


def note_line(text: str) -> str:
    """A line of the host's own in the build log: marked, so that it is not taken for the build's output."""
    return f"{MARK} {text}"


def is_marked(line: str) -> bool:
    return line.startswith(f"{MARK} ")


def parse_mark(line: str) -> dict[str, Any] | None:
    """The fields of a driver's progress mark; None for any other line (a note, the build's output)."""
    if not is_marked(line):
        return None
    try:
        fields = json.loads(line[len(MARK) + 1 :])
    except ValueError:
        return None
    return fields if isinstance(fields, dict) else None


# --- compile measurements ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Measurement:
    key: str
    peak_bytes: int
    wall_s: float
    rc: int = 0
    envelope: tuple[int, ...] = ()
    rise: tuple[int, ...] = ()
    cpu_s: float | None = None  # absent from the lines of wrappers older than this field
    mem_s: float = 0.0  # byte-seconds
    cache: str | None = None  # CACHE_HIT, CACHE_MISS, CACHE_OFF; None from wrappers older than the cache
    tool: str = "nvcc"  # "cxx": the host compiler's launcher, which admits nothing
    # a cache hit compiled anyway to check it (FACTORY_CACHE_VERIFY): "same" or "differs", and the entry
    # ("<dk>-<rk>") it was checked against
    cache_check: str | None = None
    entry: str | None = None
    source: str | None = None
    tool_object: str | None = None  # the object the compile wrote, absolute in the container ("object")

    @property
    def compiled(self) -> bool:
        """Whether a compiler ran (a cache hit's figures are only its lookup's)."""
        return self.cache != CACHE_HIT

    @property
    def learns(self) -> bool:
        """Whether it may teach a compile profile: an nvcc compile that ran."""
        return self.compiled and self.tool == "nvcc"


def measurement_json(record: Mapping[str, object]) -> str:
    """One line of FACTORY_PROFILE_OUT: the wrapper's whole record (`parse_measurement` reads what the
    host needs of it)."""
    return json.dumps(record, sort_keys=True)


def measurement_line(record: Mapping[str, object]) -> str:
    """The same record as a build log line."""
    return f"{MEASUREMENT_MARK} {measurement_json(record)}"


def parse_measurement(line: str) -> Measurement | None:
    """A measurement from a line of FACTORY_PROFILE_OUT or of a build log; None for any other line and for
    one cut short by a kill, and for a skipped compile (another shard's: it measured nothing)."""
    if MEASUREMENT_MARK in line:
        line = line.split(MEASUREMENT_MARK, 1)[1]
    elif not line.startswith("{"):
        return None
    try:
        raw = json.loads(line)
        if raw.get("cache") == CACHE_SKIPPED:
            return None
        return Measurement(
            key=str(raw["key"]),
            peak_bytes=int(raw["peak_bytes"]),
            wall_s=float(raw["wall_s"]),
            rc=int(raw.get("rc", 0)),
            envelope=_ints(raw.get("envelope")),
            rise=_ints(raw.get("rise")),
            cpu_s=None if raw.get("cpu_s") is None else float(raw["cpu_s"]),
            mem_s=float(raw.get("mem_s", 0)),
            cache=None if raw.get("cache") is None else str(raw["cache"]),
            tool=str(raw.get("tool", "nvcc")),
            cache_check=_text(raw.get("cache_check")),
            entry=_text(raw.get("entry")),
            source=_text(raw.get("source")),
            tool_object=_text(raw.get("object")),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


# --- links ------------------------------------------------------------------------------------------------


def link_line(link: Link) -> str:
    return f"{LINK_MARK} {json.dumps({'output': link.output, 'inputs': list(link.inputs)}, sort_keys=True)}"


def parse_link(line: str) -> Link | None:
    """The link a build log line records; None for any other line, and for one that is not well formed (the
    build writes its log: a line is read as text, never as a path to open)."""
    line = line.lstrip()  # pip -v indents what setuptools' commands print
    if not line.startswith(f"{LINK_MARK} "):
        return None
    try:
        raw = json.loads(line[len(LINK_MARK) + 1 :])
        output, inputs = raw["output"], raw["inputs"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(output, str) or not isinstance(inputs, list) or len(inputs) > MAX_LINK_INPUTS:
        return None
    if not all(isinstance(i, str) for i in inputs):
        return None
    return Link(output=output, inputs=tuple(inputs))


# --- learned profiles --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ProfileEntry:
    peak_bytes: int
    wall_s: float | None
    samples: int
    envelope: tuple[int, ...] = ()
    rise: tuple[int, ...] = ()


def entry_json(entry: ProfileEntry) -> dict[str, Any]:
    """One entry as a profile file holds it; also the shape `admission.predict_from` reads entries in."""
    return {
        "peak_bytes": entry.peak_bytes,
        "wall_s": entry.wall_s,
        "samples": entry.samples,
        "envelope": list(entry.envelope),
        "rise": list(entry.rise),
    }


def profile_json(package: str, version: str, entries: Mapping[str, ProfileEntry]) -> dict[str, object]:
    return {
        "format": PROFILE_FORMAT,
        "package": package,
        "version": version,
        "entries": {key: entry_json(e) for key, e in sorted(entries.items())},
    }


def parse_profile(data: object) -> tuple[str, str, dict[str, ProfileEntry]]:
    """A profile's package, version and entries; ValueError, saying what is wrong, for anything else."""
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        raise ValueError("not a compile profile (no 'entries' object)")
    entries: dict[str, ProfileEntry] = {}
    for key, raw in data["entries"].items():
        try:
            entry = ProfileEntry(
                peak_bytes=_bounded_int(raw["peak_bytes"]),
                wall_s=_seconds(raw["wall_s"]) if raw.get("wall_s") is not None else None,
                samples=max(1, _bounded_int(raw.get("samples", 1))),
                envelope=_ints(raw.get("envelope")),
                rise=_ints(raw.get("rise")),
            )
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise ValueError(f"bad profile entry {key!r}: {exc}") from None
        entries[str(key)] = entry
    return str(data.get("package", "")), str(data.get("version", "")), entries


# --- compile keys ------------------------------------------------------------------------------------------


def compile_key(source: str, archs: Sequence[str], nvcc_threads: int) -> str:
    """Key of a measured compile: paths differ between builds, so only the file name counts."""
    return f"{os.path.basename(source)}|{','.join(sorted(archs))}|{nvcc_threads}"


def parse_compile_key(key: str) -> tuple[str, tuple[str, ...], int] | None:
    """A compile key's file name, archs and nvcc threads; None for a key that is not one."""
    parts = key.split("|")
    if len(parts) != 3:
        return None
    return parts[0], tuple(parts[1].split(",")), int(parts[2]) if parts[2].isdigit() else 1


# JSON as Python reads it takes NaN and Infinity, and integers of any length: a profile is planned with, so
# what no compile measures is refused (int(Infinity) raised OverflowError through `factory memory import`).
_MAX_PROFILE_INT = 2**46  # 64 TiB of memory, and far more samples than any build takes
_MAX_PROFILE_SECONDS = 7 * 86400.0


def _bounded_int(value: object) -> int:
    number: int = int(value)  # type: ignore[call-overload]
    if not 0 <= number <= _MAX_PROFILE_INT:
        raise ValueError(f"{number if len(str(number)) <= 30 else 'a huge number'} is out of range")
    return number


def _seconds(value: object) -> float:
    number = float(value)  # type: ignore[arg-type]
    if not 0 <= number <= _MAX_PROFILE_SECONDS:  # NaN fails this too
        raise ValueError(f"{number} seconds is out of range")
    return number


def _ints(value: object) -> tuple[int, ...]:
    return tuple(_bounded_int(v) for v in value or ())  # type: ignore[attr-defined]


# --- owners ------------------------------------------------------------------------------------------------

ENV_JOB_OWNER = "FACTORY_JOB_OWNER"
OWNER_FILE = ".owner"


def owner_json(pid: int, host: str) -> str:
    return json.dumps({"pid": pid, "host": host}) + "\n"


def parse_owner(text: str) -> tuple[int, str] | None:
    """The (pid, host) of an owner file; None for text that is not one."""
    try:
        data = json.loads(text)
        return int(data["pid"]), str(data["host"])
    except (ValueError, KeyError, TypeError):
        return None


# --- the work volume's job directories ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class JobDir:
    """A job's directory in the work volume: its owner file's text (None: none), and, when that names no
    owner, for how long nothing in it changed."""

    name: str
    owner: str | None
    idle_s: float


def is_job_dir_name(name: str) -> bool:
    """A directory directly under the jobs root: a plain name, never a path out of it."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def job_listing_line(dirs: Sequence[JobDir]) -> str:
    return mark_line(jobs=[{"name": d.name, "owner": d.owner, "idle_s": d.idle_s} for d in dirs])


def parse_job_listing(output: str) -> list[JobDir]:
    """The job directories a `jobs` phase listed in its output; entries that are not one are left out."""
    dirs: list[JobDir] = []
    for line in output.splitlines():
        fields = parse_mark(line)
        if not fields or not isinstance(fields.get("jobs"), list):
            continue
        for entry in fields["jobs"]:
            try:
                name, owner, idle = entry["name"], entry["owner"], float(entry["idle_s"])
            except (TypeError, KeyError, ValueError):
                continue
            if isinstance(name, str) and is_job_dir_name(name) and (owner is None or isinstance(owner, str)):
                dirs.append(JobDir(name=name, owner=owner, idle_s=idle))
    return dirs


def removed_line(name: str) -> str:
    return mark_line(removed=name)


def parse_removed(output: str) -> list[str]:
    """The job directories a `remove-jobs` phase removed, in its order."""
    fields = (parse_mark(line) for line in output.splitlines())
    return [f["removed"] for f in fields if f and isinstance(f.get("removed"), str)]
