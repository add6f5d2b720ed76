"""The build report: each job's result and attempts, written as report.json next to the wheels."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


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


@dataclass(kw_only=True)
class JobResult:
    job_id: str
    variant_id: str
    python: str
    package: str = ""
    version: str = ""
    result: str = "pending"  # ok | failed | oom | interrupted | skipped
    wheel: str | None = None
    wall_s: float = 0.0
    peak_bytes: int = 0
    reason: str | None = None
    log: str | None = None
    log_tail: list[str] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    # Live-only state, not part of the report.
    phase: str = field(default="queued", repr=False)
    started: float | None = field(default=None, repr=False)
    mem_now: int = field(default=0, repr=False)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("phase", "started", "mem_now"):
            data.pop(key)
        return data


@dataclass(kw_only=True)
class BuildReport:
    run_id: str
    matrix: str
    started: float
    finished: float = 0.0
    jobs: list[JobResult] = field(default_factory=list)

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
            "jobs": [j.to_json() for j in self.jobs],
        }


def write_report(report: BuildReport, path: Path) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    os.replace(tmp, path)
