"""The build report: each job's result and attempts, written as report.json next to the wheels."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from factory import version
from factory.core.platforms import DEFAULT_PLATFORM


@dataclass(kw_only=True)
class Attempt:
    number: int
    max_jobs: int
    nvcc_threads: int
    memory_limit: int
    exit_code: int | None = None
    oom_killed: bool = False
    peak_bytes: int = 0
    wall_s: float = 0.0
    # the MAX_JOBS ninja ran with: the plan's; under admission, more (memory is bounded per compile); or what
    # the matrix's env sets itself, whatever the plan
    ninja_jobs: int | None = None
    objects_kept: int | None = None  # objects found from an earlier attempt when this one started
    objects_compiled: int | None = None  # compiles ninja finished in this attempt
    objects_planned: int | None = None  # compiles ninja had to run in this attempt
    objects_total: int | None = None  # objects present when the build finished
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class PreflightResult:
    """A job's `build --preflight` (`factory.build.preflight`): passed, or the first error line of its
    failure."""

    result: str  # pass | fail
    line: str | None = None  # a failure's first error line (the compiler's, else the job's reason)
    log: str | None = None
    host_compiles: int = 0  # the host compiler's compiles that ran or came from the cache
    device: str | None = None  # the one device compile's source (None: the build has none)
    arch: str | None = None  # the one arch it was compiled for ("sm_80")

    @property
    def passed(self) -> bool:
        return self.result == "pass"


@dataclass(kw_only=True)
class JobResult:
    job_id: str
    variant_id: str
    python: str
    package: str = ""
    version: str = ""
    result: str = "pending"  # ok | failed | oom | interrupted | skipped
    wheel: str | None = None
    # the platform its wheel is for: publishing shows a job that made no wheel in its platform's cell
    platform: str = DEFAULT_PLATFORM.name
    wall_s: float = 0.0
    peak_bytes: int = 0
    reason: str | None = None
    log: str | None = None
    log_tail: list[str] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    shard: str | None = None  # "I/N": a shard's build, which fills the compile cache and makes no wheel
    image: str | None = None  # the builder image
    # its docker id here (the wheel's provenance names the image by its content, the same on every host)
    image_id: str | None = None
    toolkit: str | None = None  # the CUDA release of its nvcc (Debian's 12.4 for a CUDA 12.8 variant, say)
    preflight: PreflightResult | None = None  # `build --preflight`: its compiles' verdict, no wheel
    # compiles of every attempt (the measurement lines' "cache" field): served from the compile cache, or run
    compiles_cached: int = 0
    compiles_compiled: int = 0
    # `build --check-cache N`: hits compiled again and compared, and the sources whose bytes differed
    cache_checked: int = 0
    cache_suspects: list[str] = field(default_factory=list)
    # An abi3 job: the later Pythons its one wheel covers, and every Python it was installed and imported on.
    covers: list[str] = field(default_factory=list)
    checked_pythons: list[str] = field(default_factory=list)
    # A stable-ABI job: every torch its one wheel serves (publishing lists it on each one's page).
    torches: list[str] = field(default_factory=list)
    checked_torches: list[str] = field(default_factory=list)  # those it was installed and imported with
    # a stable-ABI job that compiled nothing: the variant page whose published wheel it took
    # (`factory.build.reuse`)
    reused_from: str | None = None
    # the package's runtime requirements the install check's own wheelhouse holds (`runtimereqs`)
    check_requirements: list[str] = field(default_factory=list)
    # extension modules whose link had no object nvcc compiled: excused from carrying device code
    host_only: list[str] = field(default_factory=list)
    # a wheel that built and failed a check, kept under <output>/check-failed/ (its path)
    kept_wheel: str | None = None
    # what the host noticed while it ran (a build that ran no nvcc after its first compiles, `buildlog`)
    warnings: list[str] = field(default_factory=list)
    # Live-only state, not part of the report (LIVE_FIELDS).
    phase: str = field(default="queued", repr=False)
    started: float | None = field(default=None, repr=False)
    mem_now: int = field(default=0, repr=False)
    # ninja's `[done/total]` of the attempt that is running, summed over its ninja runs (one per extension):
    # the total is what is known so far
    compiles_done: int = field(default=0, repr=False)
    compiles_total: int = field(default=0, repr=False)
    # the ninja runs seen so far and the running one's own `[done/total]`
    compiles_runs: int = field(default=0, repr=False)
    compiles_run_done: int = field(default=0, repr=False)
    compiles_run_total: int = field(default=0, repr=False)
    # the whole build's compiles as an earlier complete build of the package counted them (0: not known),
    # and when the attempt's compiles started (monotonic): the estimate of the time left
    compiles_expected: int = field(default=0, repr=False)
    compiles_since: float | None = field(default=None, repr=False)
    # the source's CUDA files whose compile finished, of those it has, and the device work's share done by
    # the profile's or the recipe's times (`buildlog.DeviceEstimate`), with the words of that basis
    device_done: int = field(default=0, repr=False)
    device_total: int = field(default=0, repr=False)
    device_share: float = field(default=0.0, repr=False)
    device_basis: str = field(default="", repr=False)
    # what the job does now when its phase alone does not say (the wheelhouse's downloads)
    activity: str = field(default="", repr=False)

    @property
    def attempt(self) -> int:
        return len(self.attempts)

    @property
    def memory_limit(self) -> int:
        """The running attempt's container limit; 0 before the first attempt."""
        return self.attempts[-1].memory_limit if self.attempts else 0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in LIVE_FIELDS:
            data.pop(key)
        return data


LIVE_FIELDS = (
    "phase",
    "started",
    "mem_now",
    "compiles_done",
    "compiles_total",
    "compiles_runs",
    "compiles_run_done",
    "compiles_run_total",
    "compiles_expected",
    "compiles_since",
    "device_done",
    "device_total",
    "device_share",
    "device_basis",
    "activity",
)


@dataclass(frozen=True, kw_only=True)
class SourceInfo:
    """Where the built source came from: the run's once, as report.json's top-level `source`."""

    kind: str  # pypi | git | path
    sdist: str | None = None  # source: pypi: the sdist's filename
    sha256: str | None = None  # source: pypi: the sdist's sha256
    commit: str | None = None  # source: git: the commit checked out

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(kw_only=True)
class BuildReport:
    run_id: str
    matrix: str
    started: float
    finished: float = 0.0
    source: SourceInfo | None = None  # set by run_build as it writes the report
    jobs: list[JobResult] = field(default_factory=list)
    factory_version: str = field(default_factory=version)  # the factory that ran the build
    # the compile cache's setting (`buildrecord.cache_setting`) and the CI run (`buildrecord.ci_run_url`):
    # what a published wheel's build record says beside the wheel, never in it
    compile_cache: str = "off"
    ci_run_url: str | None = None

    @property
    def ok(self) -> bool:
        return all(j.result == "ok" for j in self.jobs)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "matrix": self.matrix,
            "started": self.started,
            "finished": self.finished,
            "ok": self.ok,
            "source": self.source.to_json() if self.source else None,
            "jobs": [j.to_json() for j in self.jobs],
            "factory_version": self.factory_version,
            "compile_cache": self.compile_cache,
            "ci_run_url": self.ci_run_url,
        }


def write_report(report: BuildReport, path: Path) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    os.replace(tmp, path)
