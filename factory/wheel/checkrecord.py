"""The failure record beside a wheel that built and failed its checks: the one owner of its format.

`factory build` keeps such a wheel under `<output>/check-failed/` (`acceptance.Acceptance.keep_wheel`) so
that checking it again needs no compile, and writes `<wheel>.check-failed.json` beside it: the job, and why
its check failed. `factory publish` refuses a wheel that sits beside its record, or that the build report
names as kept, unless forced; `factory inspect` shows the check's result.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from factory.core import strictjson
from factory.core.urls import printable

SUFFIX = ".check-failed.json"
FORMAT = 1
MAX_RECORD = 1 << 16
MAX_REASON = 2000


@dataclass(frozen=True, kw_only=True)
class CheckFailure:
    wheel: str  # the wheel's file name
    job: str  # the job that built it
    reason: str  # why its check failed


def beside(wheel: Path) -> Path:
    """Where a wheel's failure record is: `<wheel>.check-failed.json` next to it."""
    return wheel.with_name(wheel.name + SUFFIX)


def dumps(record: CheckFailure) -> str:
    doc = {"format": FORMAT, "wheel": record.wheel, "job": record.job, "result": "failed"}
    doc["reason"] = record.reason[:MAX_REASON]
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def parse(data: bytes) -> CheckFailure:
    """A record's content, checked; ValueError in one line otherwise (the file was not ours)."""
    if len(data) > MAX_RECORD:
        raise ValueError(f"larger than {MAX_RECORD} bytes")
    doc = strictjson.loads(data)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("result") != "failed":
        raise ValueError("not a check failure record of this factory")
    fields = {key: doc.get(key) for key in ("wheel", "job", "reason")}
    bad = [key for key, value in fields.items() if not isinstance(value, str)]
    if bad:
        raise ValueError(f"{', '.join(bad)} missing or not a string")
    return CheckFailure(wheel=str(fields["wheel"]), job=str(fields["job"]), reason=str(fields["reason"]))


def write_beside(wheel: Path, *, job: str, reason: str) -> Path:
    path = beside(wheel)
    path.write_text(dumps(CheckFailure(wheel=wheel.name, job=job, reason=reason)))
    return path


def failure_of(wheel: Path, jobs: Sequence[Mapping[str, object]] = ()) -> str | None:
    """Why `wheel` failed its checks, when it did: its record beside it (a record that cannot be read still
    says the wheel failed), else a job of the build report that kept it under check-failed/; None when
    neither says so."""
    record = beside(wheel)
    if record.is_symlink():  # never followed; its being there says enough
        return f"its failure record {record.name} is there (a link, not read)"
    if record.is_file():
        try:
            with record.open("rb") as fh:
                found = parse(fh.read(MAX_RECORD + 1))
        except (OSError, ValueError) as exc:
            return f"its failure record {record.name} is there ({printable(str(exc))})"
        return printable(f"job {found.job}: {found.reason}")
    for job in jobs:
        kept = job.get("kept_wheel")
        if isinstance(kept, str) and Path(kept).name == wheel.name:
            return printable(f"job {job.get('job_id')}: {job.get('reason') or 'its check failed'}")
    return None


REPORT = "report.json"  # a build's report, in its output directory beside the wheels it made
MAX_REPORT = 16 << 20


def _reported(wheel: Path) -> Mapping[str, object] | None:
    """The job of the build report beside the wheel (its output directory's report.json) that made it."""
    report = wheel.parent / REPORT
    if report.is_symlink() or not report.is_file():
        return None
    try:
        with report.open("rb") as fh:
            doc = strictjson.loads(fh.read(MAX_REPORT))
    except (OSError, ValueError):
        return None
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    for job in jobs if isinstance(jobs, list) else ():
        if isinstance(job, dict) and job.get("wheel") == wheel.name:
            return job
    return None


def result_of(wheel: Path) -> tuple[str, str]:
    """(result, what says so) of a local wheel's checks: "failed" with why, when its failure record is
    beside it; the result of the job of the report.json beside it that made it; else "unknown"."""
    why = failure_of(wheel)
    if why is not None:
        return "failed", why
    job = _reported(wheel)
    if job is not None and isinstance(job.get("result"), str):
        return str(job["result"]), printable(f"job {job.get('job_id')} of {wheel.parent / REPORT}")
    return "unknown", f"no failure record and no {REPORT} naming it beside the wheel"


def describe(wheel: Path) -> str:
    """`factory inspect`'s line of a local wheel's check."""
    result, said = result_of(wheel)
    if result == "failed":
        return f"check       FAILED: {said}; `factory publish` refuses it (--force-failed)"
    if result == "ok":
        return f"check       passed ({said})"
    return f"check       {result} ({said})"


def to_json(wheel: Path) -> dict[str, str]:
    result, said = result_of(wheel)
    return {"result": result, "detail": said}
