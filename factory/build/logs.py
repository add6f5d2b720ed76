"""What the host reads from a job's build log as it streams: how far its compiles are over every extension,
which modules link an object nvcc compiled (the others carry no kernels), and why an install check failed.

The log is written by the package's build and check, so it is read as text only: a line is never a path the
host opens, what is kept of it is bounded, and what is shown of it goes through `printable`. A package could
forge these lines; what it gains is a wrong progress count, or an excuse for a module of its own wheel to
carry no device code (the wheel must still carry some), never anything of another job's.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from factory.container import protocol
from factory.container.links import Link
from factory.container.protocol import IMPORT_CHECK_MARKER, parse_import_check
from factory.core.urls import printable

NINJA_STATUS = re.compile(r"^\s*\[(\d+)/(\d+)\]")
# setuptools' build_ext, before each extension (torch's cpp_extension then runs one ninja per extension)
BUILDING_EXTENSION = re.compile(r"^\s*building '[^']*' extension\s*$")
MAX_TRACED = 100_000  # objects and links a job's trace keeps; a log naming more is not believed past that


# --- compile progress over every ninja run ------------------------------------------------------------------


@dataclass
class CompileProgress:
    """ninja's `[finished/total]` summed over the ninja runs of one attempt. torch's cpp_extension runs one
    ninja per extension, each counting from 1 again (torch-cluster: nine), so a single run's count reads
    "done" for most of a long build. A new run starts at setuptools' `building '...' extension` line, or
    when the count falls back or the total changes. `total` is what is known so far: later extensions add
    theirs."""

    finished_runs_done: int = 0
    finished_runs_total: int = 0
    done_now: int = 0
    total_now: int = 0
    failed_now: int = 0
    failed_runs: int = 0
    runs: int = 0
    _new_run: bool = True

    @property
    def done(self) -> int:
        return self.finished_runs_done + self.done_now

    @property
    def total(self) -> int:
        return self.finished_runs_total + self.total_now

    @property
    def compiled(self) -> int:
        """Edges that finished and did not fail (ninja counts a `FAILED:` edge as finished)."""
        return max(0, self.done - self.failed_runs - self.failed_now)

    def _close_run(self) -> None:
        self.finished_runs_done += self.done_now
        self.finished_runs_total += self.total_now
        self.failed_runs += self.failed_now
        self.done_now = self.total_now = self.failed_now = 0

    def feed(self, line: str) -> bool:
        """Read one log line; whether the counts changed."""
        match = NINJA_STATUS.match(line)
        if match is None:
            if BUILDING_EXTENSION.match(line):
                self._new_run = True
            elif line.lstrip().startswith("FAILED:"):
                self.failed_now += 1
            return False
        done, total = int(match.group(1)), int(match.group(2))
        if self._new_run or done < self.done_now or total != self.total_now:
            if self.runs:
                self._close_run()
            self.runs += 1
            self._new_run = False
        self.done_now, self.total_now = max(self.done_now, done), total
        return True


def compile_progress(log_text: str) -> CompileProgress | None:
    """The progress of a whole log segment (an attempt's); None when no ninja ran in it."""
    progress = CompileProgress()
    for line in log_text.splitlines():
        progress.feed(line)
    return progress if progress.runs else None


# --- how far the CUDA compiles are, by the profile's or the recipe's times ---------------------------------

BASIS_WORDS = {"profile": "by the profile's times", "recipe": "by the recipe's times", "count": "by count"}


@dataclass
class DeviceEstimate:
    """The source's CUDA files, known before the build starts (`shard.compile_units`), weighted by the
    learned profile's or the recipe's times (`shard.unit_weights`, else one each), and those the build's nvcc
    compiles have finished, from their measurement lines (a cache hit too): the share of the device work done,
    and from the time it took, the time left. Files are told by their base name, as compile keys name them."""

    weights: Mapping[str, float]
    basis: str = "count"
    done: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, by_unit: Mapping[str, float], basis: str) -> DeviceEstimate:
        weights: dict[str, float] = {}
        for unit, weight in by_unit.items():
            name = unit.rsplit("/", 1)[-1]
            weights[name] = weights.get(name, 0.0) + max(0.0, float(weight))
        return cls(weights=weights, basis=basis)

    def feed(self, line: str) -> bool:
        """Read one line; whether a file of the source finished its first compile."""
        if protocol.MEASUREMENT_MARK not in line:
            return False
        measured = protocol.parse_measurement(line)
        if measured is None or measured.tool != "nvcc" or measured.rc != 0:
            return False
        key = protocol.parse_compile_key(measured.key)
        name = key[0] if key is not None else ""
        if name not in self.weights or name in self.done:
            return False
        self.done.add(name)
        return True

    @property
    def fraction(self) -> float:
        total = sum(self.weights.values())
        return sum(self.weights[n] for n in self.done) / total if total > 0 else 0.0

    def left_s(self, elapsed_s: float) -> float | None:
        """The time left at the pace of the share done so far; None before any."""
        share = self.fraction
        if share <= 0 or elapsed_s <= 0:
            return None
        return elapsed_s * (1 - share) / share


# --- a build that should carry device code and runs no nvcc -------------------------------------------------

# After this many host compiles with no nvcc among them, or two whole ninja runs (extensions) of host compiles
# alone, a job that must carry device code says so. A CUDA extension's first ninja run compiles its .cu
# files beside its .cpp ones; a package that left its CUDA code out (PyG without FORCE_CUDA and no visible
# GPU) compiles nothing but .cpp files for as long as it takes; the wheel check refuses it only at the end.
HOST_ONLY_AFTER = 16
HOST_ONLY_RUNS = 2


def _is_nvcc(command: str) -> bool:
    """Whether ninja's command (torch's build.ninja names nvcc, or the factory's nvcc launcher, by path) runs
    nvcc."""
    words = command.split(None, 1)
    return bool(words) and words[0].rsplit("/", 1)[-1] == "nvcc"


@dataclass
class DeviceWatch:
    """Whether the first compiles of a build are all host compiles and nvcc has not run once: ninja's status
    lines name each edge's command (torch runs `ninja -v`), the nvcc wrapper's measurements each compile of
    its own. `feed` returns the one warning, once."""

    after: int = HOST_ONLY_AFTER
    runs_after: int = HOST_ONLY_RUNS
    host: int = 0
    nvcc: int = 0
    host_runs: int = 0  # ninja runs that reached their total with host compiles alone
    warned: bool = False
    _run_host: int = 0
    _run_nvcc: int = 0

    def feed(self, line: str) -> str | None:
        if protocol.MEASUREMENT_MARK in line:
            measured = protocol.parse_measurement(line)
            if measured is not None and measured.tool == "nvcc":
                self.nvcc += 1
            return None
        match = NINJA_STATUS.match(line)
        if match is None:
            return None
        done, total = int(match.group(1)), int(match.group(2))
        if _is_nvcc(line[match.end() :].strip()):
            self.nvcc += 1
            self._run_nvcc += 1
        else:
            self.host += 1
            self._run_host += 1
        if done >= total:  # this ninja run (one extension) is at its end
            if self._run_host and not self._run_nvcc:
                self.host_runs += 1
            self._run_host = self._run_nvcc = 0
        if self.warned or self.nvcc:
            return None
        if self.host >= self.after or self.host_runs >= self.runs_after:
            self.warned = True
            return (
                f"no nvcc yet after {self.host} host compile(s): this build may be making CPU-only "
                "extensions "
                "(does the package compile CUDA code only with an env switch such as FORCE_CUDA=1, or when a "
                "GPU is visible? set it in recipe.env); the wheel check refuses a wheel without device code"
            )
        return None


# --- which modules carry kernels ----------------------------------------------------------------------------

HOST = "host"  # linked from objects no nvcc call wrote: no kernels
DEVICE = "device"  # links an object nvcc compiled
UNKNOWN = "unknown"  # its link was not seen, or it links an archive or library that may hold anything


@dataclass
class BuildTrace:
    """The objects nvcc wrote and the shared links of a job's builds (every attempt's: a retry links objects
    an earlier attempt compiled), from the build log's lines as they stream."""

    nvcc_objects: set[str] = field(default_factory=set)
    links: dict[str, Link] = field(default_factory=dict)  # by output; the last link of a path counts

    def feed(self, line: str) -> None:
        if protocol.MEASUREMENT_MARK in line:
            measured = protocol.parse_measurement(line)
            if (
                measured is not None
                and measured.tool == "nvcc"
                and measured.tool_object
                and len(self.nvcc_objects) < MAX_TRACED
            ):
                self.nvcc_objects.add(measured.tool_object)
            return
        if protocol.LINK_MARK in line:
            link = protocol.parse_link(line)
            if link is not None and (link.output in self.links or len(self.links) < MAX_TRACED):
                self.links[link.output] = link


def _links_for(member: str, links: Iterable[Link]) -> list[Link]:
    """The links whose output is the wheel member: setuptools links into build/lib.*/<member> (or, in
    place, the member's path in the tree) and copies that into the wheel."""
    return [link for link in links if link.output == member or link.output.endswith("/" + member)]


def module_kind(member: str, trace: BuildTrace) -> str:
    """HOST, DEVICE or UNKNOWN for one extension module of the wheel."""
    found = _links_for(member, trace.links.values())
    if not found:
        return UNKNOWN
    kinds = set()
    for link in found:
        if any(i in trace.nvcc_objects for i in link.inputs):
            kinds.add(DEVICE)
        elif any(not i.endswith((".o", ".obj")) for i in link.inputs):
            kinds.add(UNKNOWN)  # an archive or library: its objects were not seen going in
        else:
            kinds.add(HOST)
    return DEVICE if DEVICE in kinds else UNKNOWN if UNKNOWN in kinds else HOST


def module_kinds(members: Sequence[str], trace: BuildTrace) -> dict[str, str]:
    return {member: module_kind(member, trace) for member in members}


def host_only_globs(kinds: Mapping[str, str]) -> tuple[str, ...]:
    """The modules found host-only, as globs of the wheel check (`wheelcheck.library_glob_matches`) that
    match exactly their own path."""
    return tuple(sorted(glob.escape(member) for member, kind in kinds.items() if kind == HOST))


def describe_kinds(kinds: Mapping[str, str]) -> str:
    """One line for the log: which modules the build shows to carry no kernels, and which it cannot tell."""
    by_kind = {kind: sorted(m for m, k in kinds.items() if k == kind) for kind in (HOST, DEVICE, UNKNOWN)}
    parts = []
    if by_kind[HOST]:
        parts.append("host-only (no object nvcc compiled in their link): " + ", ".join(by_kind[HOST]))
    if by_kind[DEVICE]:
        parts.append("with kernels: " + ", ".join(by_kind[DEVICE]))
    if by_kind[UNKNOWN]:
        parts.append("not known (link not seen, or an archive linked): " + ", ".join(by_kind[UNKNOWN]))
    return printable("; ".join(parts) or "no extension modules")


# --- why an install check failed ----------------------------------------------------------------------------

# uv's resolver: "Because scipy was not found in the package registry and ... depends on scipy, ..."
_UV_BECAUSE = re.compile(
    r"Because (.+?) was not found in (?:the provided package locations|the package registry)"
)
_PIP_NO_MATCH = re.compile(r"No matching distribution found for \S+")
_PYTHON_ERROR = re.compile(r"^(?:[A-Za-z_][\w.]*)?(?:Error|Exception): .+")
MAX_REASON = 200


def _short(text: str) -> str:
    line = printable(" ".join(text.split()))
    return line if len(line) <= MAX_REASON else line[: MAX_REASON - 3] + "..."


def check_failure_reason(log_text: str) -> str | None:
    """The line that says why an install check failed, from its log segment: the import check's error
    (`ModuleNotFoundError: No module named 'scipy'`), else the installer's (uv's `scipy was not found in
    the provided package locations`, pip's `No matching distribution found for scipy`), else the last Python
    exception line; None when there is none."""
    if IMPORT_CHECK_MARKER in log_text:
        reported = parse_import_check(log_text)
        if reported is not None and reported.get("ok") is False and isinstance(reported.get("error"), str):
            return _short(str(reported["error"]))
    lines = [line.strip() for line in log_text.splitlines()]
    for line in lines:
        found = _UV_BECAUSE.search(line)
        if found:
            return _short(f"{found.group(1)} is not in the check's wheelhouse (uv: {found.group(0)})")
        found = _PIP_NO_MATCH.search(line)
        if found:
            return _short(found.group(0))
    errors = [line for line in lines if _PYTHON_ERROR.match(line) and not protocol.is_marked(line)]
    return _short(errors[-1]) if errors else None
