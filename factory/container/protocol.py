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
- the environment the host gives a build container: the variables' names (`ENV_*`), what the driver reads of
  it (`DriverEnv`) and what the nvcc wrapper and its `c++` launcher read (`WrapperEnv`), each with `to_env`
  and `from_env`, with the per-file tables the wrapper's carries (`format_by_file`, `parse_by_file`)
- the install check: the script the host gives the check phase (`import_check_script`, in
  ENV_IMPORT_CHECK) and the JSON line it prints behind IMPORT_CHECK_MARKER (`parse_import_check`)
- the work volume's job directories, as the driver's `jobs` phase lists them for `factory clean`
  (`job_listing_line`, `parse_job_listing`), and those its `remove-jobs` phase removed (`removed_line`,
  `parse_removed`)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

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
# The build container's environment, as the host writes it and the container reads it. The names stay: the
# images' scripts and the matrices' own env may name them too.
# the driver's
ENV_JOB_DIR = "FACTORY_JOB_DIR"  # the job's directory in the work volume
ENV_PYTHON = "FACTORY_PYTHON"  # the interpreter of the build's venv ("python3.12")
ENV_CUDA = "FACTORY_CUDA"  # the CUDA version the job builds for
ENV_REQUIREMENTS = "FACTORY_REQUIREMENTS"  # the build's requirements, one a line
ENV_WHEEL = "FACTORY_WHEEL"  # the install check's wheel, in /out
ENV_IMPORT_CHECK = "FACTORY_IMPORT_CHECK"  # the install check's script
ENV_JOB_OWNER = "FACTORY_JOB_OWNER"  # the run's owner_json, for the job directory's OWNER_FILE
ENV_HEARTBEAT = "FACTORY_HEARTBEAT"  # the host's heartbeat file, as the container sees it
ENV_HEARTBEAT_STALE_S = "FACTORY_HEARTBEAT_STALE_S"
LIMITED_API_ENV = "FACTORY_PY_LIMITED_API"
# `factory build --shard I/N`: the shard, and its compiles (JSON list of paths relative to the source root)
ENV_SHARD = "FACTORY_SHARD"
ENV_SHARD_SOURCES = "FACTORY_SHARD_SOURCES"
# `factory build --preflight`: the candidates for its one device compile (JSON list of paths relative to the
# source root, cheapest first); every other nvcc compile is stood in for
ENV_PREFLIGHT = "FACTORY_PREFLIGHT"
# the nvcc wrapper's and its `c++` launcher's (`WrapperEnv`)
ENV_STATE_DIR = "FACTORY_STATE_DIR"
ENV_PROFILE_IN = "FACTORY_PROFILE_IN"
ENV_PROFILE_JSON = "FACTORY_PROFILE_JSON"
ENV_PROFILE_OUT = "FACTORY_PROFILE_OUT"
ENV_MEM_LIMIT = "FACTORY_MEM_LIMIT"
ENV_EST_PER_ARCH_BYTES = "FACTORY_EST_PER_ARCH_BYTES"
ENV_EST_BASE_BYTES = "FACTORY_EST_BASE_BYTES"
ENV_EST_BY_FILE = "FACTORY_EST_BY_FILE"
ENV_AFTER_PEAK = "FACTORY_AFTER_PEAK"
ENV_SECONDS_BY_FILE = "FACTORY_SECONDS_BY_FILE"
ENV_HEADROOM_BYTES = "FACTORY_HEADROOM_BYTES"
ENV_CPUS = "FACTORY_CPUS"
ENV_POLL_S = "FACTORY_POLL_S"
ENV_SAMPLE_S = "FACTORY_SAMPLE_S"
ENV_ADMISSION = "FACTORY_ADMISSION"
ENV_REAL_NVCC = "FACTORY_REAL_NVCC"
ENV_REAL_CXX = "FACTORY_REAL_CXX"
ENV_CGROUP_ROOT = "FACTORY_CGROUP_ROOT"
ENV_WRAPPER_QUIET = "FACTORY_WRAPPER_QUIET"
ENV_CACHE_DIR = "FACTORY_CACHE_DIR"  # the compile cache's entries to look up in (read-only in a container)
ENV_CACHE_OUT = "FACTORY_CACHE_OUT"  # where new entries and hit marks go (the job's outbox)
ENV_CACHE_CHECK = "FACTORY_CACHE_CHECK"  # how many hits of a build to compile anyway and compare


# Where a build container finds what the host mounts for it (`factory.build.jobspec` binds them there).
SOURCE_MOUNT = "/src"  # the prepared source, read-only
WHEELHOUSE_MOUNT = "/wheelhouse"  # the build's wheelhouse, read-only
CHECK_WHEELHOUSE_MOUNT = "/wheelhouse-check"  # the package's runtime requirements, when the host found any
OUTPUT_MOUNT = "/out"  # the build's wheel; in the install check, the host's checked copy of it, read-only
WORK_MOUNT = "/var/factory"  # the work volume: uv's cache and the jobs' directories
JOBS_ROOT = f"{WORK_MOUNT}/jobs"  # a job's directory there: `<job>-<run>`


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
    # a cache hit compiled anyway to check it (FACTORY_CACHE_CHECK): "same" or "differs", and the entry
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


# --- the wrapper's environment -----------------------------------------------------------------------------


def format_by_file(table: Sequence[tuple[str, float]]) -> str:
    """FACTORY_EST_BY_FILE (bytes) or FACTORY_SECONDS_BY_FILE: a per-file table as a JSON list of [glob on
    the base name, number], the first match winning (`parse_by_file` reads it back)."""
    return json.dumps([list(item) for item in table], separators=(",", ":"))


def parse_by_file(text: str | None) -> tuple[tuple[str, int], ...]:
    """FACTORY_EST_BY_FILE (a JSON list of [pattern, bytes]); anything malformed is dropped, so a bad value
    falls back to the per-arch estimate instead of breaking every compile of the build."""
    return tuple((pattern, int(value)) for pattern, value in _parse_table(text)[0])


def parse_seconds_by_file(text: str | None) -> tuple[tuple[str, float], ...]:
    """FACTORY_SECONDS_BY_FILE (a JSON list of [pattern, seconds]), dropping what is malformed."""
    return _parse_table(text)[0]


def _parse_table(text: str | None) -> tuple[tuple[tuple[str, float], ...], str | None]:
    """A JSON list of [glob, positive number]: the items that are one, and what was wrong with the rest."""
    if not text:
        return (), None
    try:
        value = json.loads(text)
    except ValueError:
        return (), "not JSON"
    if not isinstance(value, list):
        return (), "not a JSON list"
    table: list[tuple[str, float]] = []
    for item in value:
        if (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], int | float)
            and not isinstance(item[1], bool)
            and math.isfinite(item[1])
            and item[1] > 0
        ):
            table.append((item[0], item[1]))
    wrong = len(value) - len(table)
    return tuple(table), (f"{wrong} item(s) not [glob, positive number]" if wrong else None)


def parse_paths(text: str | None) -> tuple[str, ...] | None:
    """FACTORY_SHARD_SOURCES or FACTORY_PREFLIGHT: a JSON list of paths; None when unset or not one (the
    build then compiles everything, which is never wrong, only slower)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return tuple(value)


def _whole(text: str) -> int:
    try:
        number = float(text)  # "6e9" and "6442450944.0" as well: a size written as a float is still one
    except ValueError:
        raise ValueError("not a number of bytes") from None
    if not (math.isfinite(number) and number >= 0 and number == int(number)):
        raise ValueError("not a whole number of bytes, 0 or more")
    return int(number)


def _positive(text: str) -> float:
    try:
        number = float(text)
    except ValueError:
        raise ValueError("not a number") from None
    if not (math.isfinite(number) and number > 0):
        raise ValueError("not a number above 0")
    return number


def _fraction(text: str) -> float:
    number = _positive(text)
    if number > 1:
        raise ValueError("not a fraction in (0, 1]")
    return number


def _switch(text: str) -> bool:
    if text not in ("on", "off"):
        raise ValueError('not "on" or "off"')
    return text == "on"


def _flag(text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError('not "0" or "1"')
    return text == "1"


def _table(text: str) -> tuple[tuple[str, float], ...]:
    table, wrong = _parse_table(text)
    if wrong:
        raise ValueError(f"{wrong}: a JSON list of [glob, positive number] is wanted")
    return table


def _byte_table(text: str) -> tuple[tuple[str, int], ...]:
    return tuple((pattern, int(value)) for pattern, value in _table(text))


def _paths(text: str) -> tuple[str, ...]:
    paths = parse_paths(text)
    if paths is None:
        raise ValueError("not a JSON list of paths")
    return paths


def _number(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _on_off(value: object) -> str:
    return "on" if value else "off"


def _one_zero(value: object) -> str:
    return "1" if value else "0"


def _json_list(value: object) -> str:
    return json.dumps(list(value))  # type: ignore[call-overload]


def _table_text(value: object) -> str:
    return format_by_file(value)  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Var:
    """How one field of an environment description is written into the environment and read back."""

    name: str
    read: Callable[[str], Any]
    write: Callable[[object], str]


def _var(name: str, read: Callable[[str], Any], write: Callable[[object], str], default: Any = None) -> Any:
    return field(default=default, metadata={"var": _Var(name, read, write)})


def _vars(cls: type) -> list[tuple[dataclasses.Field[Any], _Var]]:
    return [(f, f.metadata["var"]) for f in dataclasses.fields(cls)]


# typing.Self is 3.11's: a builder image's python3 may be 3.10 (Ubuntu 22.04's, under NVIDIA's devel images)
_Env = TypeVar("_Env", bound="_Environment")


class _Environment:
    """What `WrapperEnv` and `DriverEnv` share: a frozen dataclass whose fields are variables (`_var`). A
    field at its default is not written, and an unset or empty variable reads as its field's default."""

    NAMES: ClassVar[tuple[str, ...]]

    def __post_init__(self) -> None:
        # a value the host could write but the container would refuse never leaves the host
        for f, var in _vars(type(self)):
            value = getattr(self, f.name)
            if value != f.default:
                try:
                    var.read(var.write(value))
                except ValueError as exc:
                    raise ValueError(f"{var.name}={var.write(value)!r}: {exc}") from None

    def to_env(self) -> dict[str, str]:
        """The variables of the fields not at their default."""
        return {
            var.name: var.write(getattr(self, f.name))
            for f, var in _vars(type(self))
            if getattr(self, f.name) != f.default
        }

    @classmethod
    def from_env(cls: type[_Env], env: Mapping[str, str], *, problems: list[str] | None = None) -> _Env:
        """The container's view of an environment. A value that is not one of its variable's raises
        ValueError naming both; with `problems`, it is said there instead and its field keeps its default (a
        table keeps its good items): a compile never fails for a hint."""
        values: dict[str, Any] = {}
        for f, var in _vars(cls):
            raw = env.get(var.name)
            if not raw:
                continue
            try:
                values[f.name] = var.read(raw)
            except ValueError as exc:
                shown = raw if len(raw) <= 60 else f"{raw[:57]}..."
                message = f"{var.name}={shown!r}: {exc}"
                if problems is None:
                    raise ValueError(message) from None
                problems.append(message)
                if var.read in (_table, _byte_table):
                    good = _parse_table(raw)[0]
                    values[f.name] = tuple((p, int(v)) for p, v in good) if var.read is _byte_table else good
        return cls(**values)


_E = TypeVar("_E", bound=type[_Environment])


def _named(cls: _E) -> _E:
    """The class with its variables' names in NAMES."""
    cls.NAMES = tuple(var.name for _, var in _vars(cls))
    return cls


@_named
@dataclass(frozen=True, kw_only=True)
class WrapperEnv(_Environment):
    """What the nvcc wrapper (and its `c++` launcher, and the admission gate) read from the build container's
    environment: the host writes it (`to_env`), the wrapper reads it (`from_env`). A field at its default is
    not written, and an unset or empty variable reads as its field's default.

    FACTORY_STATE_DIR       directory shared by all compiles of one build; without it nvcc runs unadmitted
    FACTORY_PROFILE_IN      learned profile JSON ({"entries": {key: {"peak_bytes", "wall_s"}}})
    FACTORY_PROFILE_JSON    the same profile inline (wins over FACTORY_PROFILE_IN)
    FACTORY_PROFILE_OUT     JSON lines file the measurements are appended to
    FACTORY_MEM_LIMIT       bytes (default: the cgroup's limit)
    FACTORY_EST_PER_ARCH_BYTES  estimate per arch per nvcc thread for files without a profile entry
    FACTORY_EST_BASE_BYTES  nvcc's own share of a compile's peak
    FACTORY_EST_BY_FILE     per-file estimates before the per-arch one: [[glob on the base name, bytes], ...],
                            the first match wins
    FACTORY_AFTER_PEAK      the recipe's compile_after_peak: what an unprofiled compile holds at most past its
                            peak, as a fraction of it
    FACTORY_SECONDS_BY_FILE the recipe's compile_seconds_by_file: [[glob, seconds], ...]; unprofiled compiles
                            wait in its order, longest first
    FACTORY_HEADROOM_BYTES  memory kept free for linking and Python
    FACTORY_CPUS            CPUs (default: cgroup quota or affinity)
    FACTORY_POLL_S          seconds between admission checks
    FACTORY_SAMPLE_S        seconds between RSS samples of a compile
    FACTORY_ADMISSION       "off": measure and record only, start at once (for comparisons)
    FACTORY_REAL_NVCC       the real nvcc (default $CUDA_HOME/bin/nvcc)
    FACTORY_REAL_CXX        the real host compiler of the `c++` launcher (default: c++ on PATH)
    FACTORY_CGROUP_ROOT     where the cgroup file system is mounted (default /sys/fs/cgroup)
    FACTORY_WRAPPER_QUIET   "1": the wrapper says nothing in the build log but its measurements
    FACTORY_SHARD_SOURCES   a sharded build's own sources (JSON list, relative to the source root)
    FACTORY_PREFLIGHT       a preflight's candidates for its one device compile (JSON list, cheapest first)
    FACTORY_CACHE_DIR       the compile cache's root (read-only); unset: no cache
    FACTORY_CACHE_OUT       the job's outbox: compiles that ran are recorded there, and hits marked
    FACTORY_CACHE_CHECK     how many hits of the build are compiled anyway and compared with the cache's
    FACTORY_JOB_DIR         the job's directory (the compile cache's @JOB@, a preflight's records)
    """

    state_dir: str | None = _var(ENV_STATE_DIR, str, str)
    profile_in: str | None = _var(ENV_PROFILE_IN, str, str)
    profile_json: str | None = _var(ENV_PROFILE_JSON, str, str)
    profile_out: str | None = _var(ENV_PROFILE_OUT, str, str)
    mem_limit: int | None = _var(ENV_MEM_LIMIT, _whole, _number)
    est_per_arch_bytes: int | None = _var(ENV_EST_PER_ARCH_BYTES, _whole, _number)
    est_base_bytes: int | None = _var(ENV_EST_BASE_BYTES, _whole, _number)
    est_by_file: tuple[tuple[str, int], ...] = _var(ENV_EST_BY_FILE, _byte_table, _table_text, ())
    after_peak: float | None = _var(ENV_AFTER_PEAK, _fraction, _number)
    seconds_by_file: tuple[tuple[str, float], ...] = _var(ENV_SECONDS_BY_FILE, _table, _table_text, ())
    headroom_bytes: int | None = _var(ENV_HEADROOM_BYTES, _whole, _number)
    cpus: float | None = _var(ENV_CPUS, _positive, _number)
    poll_s: float = _var(ENV_POLL_S, _positive, _number, 0.5)
    sample_s: float = _var(ENV_SAMPLE_S, _positive, _number, 0.2)
    admission: bool = _var(ENV_ADMISSION, _switch, _on_off, True)
    real_nvcc: str | None = _var(ENV_REAL_NVCC, str, str)
    real_cxx: str | None = _var(ENV_REAL_CXX, str, str)
    cgroup_root: str | None = _var(ENV_CGROUP_ROOT, str, str)
    quiet: bool = _var(ENV_WRAPPER_QUIET, _flag, _one_zero, False)
    shard_sources: tuple[str, ...] | None = _var(ENV_SHARD_SOURCES, _paths, _json_list)
    preflight: tuple[str, ...] | None = _var(ENV_PREFLIGHT, _paths, _json_list)
    cache_dir: str | None = _var(ENV_CACHE_DIR, str, str)
    cache_out: str | None = _var(ENV_CACHE_OUT, str, str)
    cache_check_hits: int = _var(ENV_CACHE_CHECK, _whole, _number, 0)
    job_dir: str | None = _var(ENV_JOB_DIR, str, str)


def _lines(text: str) -> tuple[str, ...]:
    return tuple(line for line in text.split("\n") if line)


def _lines_text(value: object) -> str:
    return "\n".join(value)  # type: ignore[arg-type]


@_named
@dataclass(frozen=True, kw_only=True)
class DriverEnv(_Environment):
    """What the driver (and its heartbeat watch) reads from a build container's environment: the host writes
    it (`factory.build.jobspec`, with `to_env`), the driver reads it (`from_env`); each phase gets the fields
    it uses.

    FACTORY_JOB_DIR         the job's directory in the work volume (every phase)
    FACTORY_JOB_OWNER       the factory process the job belongs to (`owner_json`), written into OWNER_FILE
    FACTORY_PYTHON          the interpreter the phase's venv is made with ("python3.12")
    FACTORY_HEARTBEAT       the host's heartbeat file, as the container sees it; unset: no watch
    FACTORY_HEARTBEAT_STALE_S  seconds without a beat after which the driver takes its factory for dead
    FACTORY_CUDA            the CUDA version the job builds for (the build phase)
    FACTORY_REQUIREMENTS    the build's requirements, one a line
    FACTORY_PY_LIMITED_API  the abi3 tag of a limited-API wheel ("cp311"), passed to bdist_wheel
    FACTORY_SHARD           `factory build --shard I/N`: the shard, "I/N"
    FACTORY_WHEEL           the install check's wheel, in /out (the check phase)
    FACTORY_IMPORT_CHECK    the install check's script
    """

    job_dir: str | None = _var(ENV_JOB_DIR, str, str)
    owner: str | None = _var(ENV_JOB_OWNER, str, str)
    python: str | None = _var(ENV_PYTHON, str, str)
    heartbeat: str | None = _var(ENV_HEARTBEAT, str, str)
    heartbeat_stale_s: float | None = _var(ENV_HEARTBEAT_STALE_S, _positive, _number)
    cuda: str | None = _var(ENV_CUDA, str, str)
    requirements: tuple[str, ...] = _var(ENV_REQUIREMENTS, _lines, _lines_text, ())
    limited_api: str | None = _var(LIMITED_API_ENV, str, str)
    shard: str | None = _var(ENV_SHARD, str, str)
    wheel: str | None = _var(ENV_WHEEL, str, str)
    import_check: str | None = _var(ENV_IMPORT_CHECK, str, str)


# --- owners ------------------------------------------------------------------------------------------------

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


# --- the install check ------------------------------------------------------------------------------------

IMPORT_CHECK_MARKER = "FACTORY-IMPORT-CHECK"
_DOTTED_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def import_check_script(import_name: str) -> str:
    """Python source that imports `import_name` after torch and prints one JSON line prefixed by the marker.

    Run it as `python -I -c SCRIPT` (or from a file with -I) outside the source tree: a checkout on sys.path
    would be imported instead of the installed wheel. The script also drops the working directory itself.
    """
    if not _DOTTED_NAME.fullmatch(import_name):
        raise ValueError(f"import name {import_name!r} is not a dotted Python module name")
    return f"""\
import importlib, json, os, sys, traceback
cwd = os.getcwd()
sys.path[:] = [p for p in sys.path if p not in ("", ".", cwd)]
try:
    import torch
    module = importlib.import_module({import_name!r})
except BaseException as exc:
    traceback.print_exc()
    print("{IMPORT_CHECK_MARKER} " + json.dumps({{"ok": False, "error": f"{{type(exc).__name__}}: {{exc}}"}}))
    sys.exit(1)
report = {{
    "ok": True,
    "module": {import_name!r},
    "file": getattr(module, "__file__", None),
    "version": getattr(module, "__version__", None),
    "torch": torch.__version__,
    "cuda": torch.version.cuda,
}}
print("torch", report["torch"], "cuda", report["cuda"])
print({import_name!r}, report["file"])
print("{IMPORT_CHECK_MARKER} " + json.dumps(report))
"""


def parse_import_check(output: str) -> dict[str, object] | None:
    """The JSON report of `import_check_script` from a container's output (last marker line), if any."""
    for line in reversed(output.splitlines()):
        if line.startswith(IMPORT_CHECK_MARKER + " "):
            try:
                value = json.loads(line[len(IMPORT_CHECK_MARKER) + 1 :])
            except json.JSONDecodeError:
                return None
            return value if isinstance(value, dict) else None
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
