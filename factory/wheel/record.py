"""A published wheel's build record: `<wheel>.build.json` beside it on the index, its one format (compose,
parse, check).

What differs between two builds of one job and a client may still want to know: the compile cache's use
(its setting and the job's hits and compiles), the builder image's docker id, the factory's version, when
the build ran (UTC) and the CI run that ran it. None of it changes a byte of the wheel, so none of it is in
the wheel's provenance (`factory.wheel.provenance`), which holds only the build's inputs and so allows a
byte-identical rebuild; the record names the wheel and its provenance file by sha256.

The record is informational: the signature (`factory.trust.signing`) and the SLSA attestation cover the wheel
and so its provenance, not the record. Publishing writes it once, from the build's report.json; it never
changes afterwards, and a wheel published without a report has none.

A job that failed has a record too (the human page's failed cell links it): no wheel (`"wheel": null`) and
a `"failed"` object with the job's id, result and the first line of its reason; it is stored under the
index's `_builds/` (`index.failed_record_path`), not beside a wheel. A wheel's record has no such field,
so records written before failures had any are unchanged, byte for byte.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from factory.core import storeurl, strictjson
from factory.core.errors import CheckError

FORMAT = 1
SUFFIX = ".build.json"  # beside the wheel, as `<wheel>.sig.json` and `<wheel>.metadata` are
MAX_BYTES = 64 << 10  # a record read from an index nobody here controls
MAX_TEXT = 512  # any one string of it
CACHE_SETTINGS = ("off", "local", "directory", "s3")  # local: the home's cache alone; else its store's kind
_SHA256 = re.compile(r"[0-9a-f]{64}")
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
_REPOSITORY = re.compile(r"[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}")
_SERVER = re.compile(r"https://[A-Za-z0-9.-]{1,253}(:\d{1,5})?")
_RUN_URL = re.compile(
    r"https://[A-Za-z0-9.-]{1,253}(:\d{1,5})?/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/actions/runs/\d+"
)


@dataclass(frozen=True, kw_only=True)
class Failure:
    """What a failed job's record says of its failure (from its report.json job)."""

    job_id: str  # a key's part (`index.failed_record_path`)
    result: str  # one of FAILED_RESULTS
    reason: str | None  # the first line of the job's reason (`reason_line`), at most MAX_TEXT long


@dataclass(frozen=True, kw_only=True)
class BuildRecord:
    filename: str | None  # the wheel's, as the index spells it; None: a failed job's record (`failure`)
    sha256: str | None  # the wheel's; None with `filename`
    provenance_sha256: str | None  # of its factory-provenance.json; None: the wheel has none
    compile_cache: str | None  # one of CACHE_SETTINGS; None: the report did not say
    cache_hits: int  # the job's compiles served from the compile cache
    compiled: int  # the job's compiles run (with the cache on, each a miss)
    image_id: str | None  # the builder image's docker id on the host that built it
    factory_version: str | None
    started: str | None  # the build run's start and end, UTC (`utc`)
    finished: str | None
    ci_run_url: str | None  # the CI run that built it (`ci_run_url`)
    failure: Failure | None = None  # a failed job's record: why it has no wheel


FAILED_RESULTS = ("failed", "oom")  # a report job's results that make its cell "failed"


def reason_line(reason: object, limit: int) -> str:
    """The first line of a report's reason, printable characters only, cut at `limit` characters and an
    ellipsis then ("" for none): a build container wrote it."""
    if not isinstance(reason, str):
        return ""
    line = "".join(ch for ch in (reason.strip().splitlines() or [""])[0] if ch.isprintable()).strip()
    return f"{line[:limit]}…" if len(line) > limit else line


class CacheSetting(Protocol):
    """What the record says of a run's compile cache (`factory.cache.sync.CacheConfig` is one)."""

    @property
    def store(self) -> str | None: ...


def cache_setting(config: CacheSetting | None) -> str:
    """The compile cache as the record names it: off, local, or the kind of store it is synced with (never
    its path or URL, which may name a bucket or a user)."""
    if config is None:
        return "off"
    if config.store is None:
        return "local"
    return storeurl.parse(config.store, what="the cache store").kind


def ci_run_url(environ: Mapping[str, str] | None = None) -> str | None:
    """The GitHub Actions run this process runs in, from GITHUB_SERVER_URL, GITHUB_REPOSITORY and
    GITHUB_RUN_ID alone (no other variable is read); None outside one or for any value out of shape."""
    env = os.environ if environ is None else environ
    server = env.get("GITHUB_SERVER_URL", "").rstrip("/")
    repository = env.get("GITHUB_REPOSITORY", "")
    run_id = env.get("GITHUB_RUN_ID", "")
    if not (_SERVER.fullmatch(server) and _REPOSITORY.fullmatch(repository) and run_id.isascii()):
        return None
    if not run_id.isdigit() or len(run_id) > 20:
        return None
    return f"{server}/{repository}/actions/runs/{run_id}"


def utc(timestamp: object) -> str | None:
    """A report's epoch seconds as the record's UTC time; None for anything else."""
    if isinstance(timestamp, bool) or not isinstance(timestamp, int | float) or not math.isfinite(timestamp):
        return None
    if not 0 < timestamp < 32503680000:  # before the year 3000
        return None
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def compose(record: BuildRecord) -> dict[str, Any]:
    wheel = None if record.filename is None else {"filename": record.filename, "sha256": record.sha256}
    document: dict[str, Any] = {
        "format": FORMAT,
        "wheel": wheel,
        "provenance_sha256": record.provenance_sha256,
        "compile_cache": {
            "setting": record.compile_cache,
            "hits": record.cache_hits,
            "compiled": record.compiled,
        },
        "image_id": record.image_id,
        "factory_version": record.factory_version,
        "started": record.started,
        "finished": record.finished,
        "ci_run_url": record.ci_run_url,
    }
    if record.failure is not None:  # only here: a wheel's record stays as it was written before
        f = record.failure
        document["failed"] = {"job_id": f.job_id, "result": f.result, "reason": f.reason}
    return document


def dumps(record: BuildRecord) -> bytes:
    """The file's bytes, checked as `parse` checks them: a record this factory writes, it can read."""
    problem = _problem(compose(record))
    if problem:
        name = record.filename or (record.failure.job_id if record.failure else "<wheel>")
        raise CheckError(f"{name}{SUFFIX}: {problem}")
    text = json.dumps(compose(record), sort_keys=True, indent=2, ensure_ascii=True, allow_nan=False)
    return (text + "\n").encode("ascii")


def from_report(
    report: Mapping[str, Any],
    job: Mapping[str, Any],
    *,
    filename: str | None,
    sha256: str | None,
    provenance_sha256: str | None,
) -> BuildRecord:
    """The record of one job's wheel from its build's report.json (the top-level object and the job's);
    a value of the wrong type is left out (None, or 0 for a count) rather than trusted. A failed job
    (`filename` None, its result one of FAILED_RESULTS) gets its `failure`; CheckError for a job of
    another result, or one whose id cannot name a key."""

    def text(value: object) -> str | None:
        ok = isinstance(value, str) and value.isprintable() and 0 < len(value) <= MAX_TEXT
        return value if ok else None  # type: ignore[return-value]

    def count(value: object) -> int:
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

    setting = report.get("compile_cache")
    url = report.get("ci_run_url")
    failure = None
    if filename is None:
        job_id, result = job.get("job_id"), job.get("result")
        if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
            raise CheckError(f"job id {json.dumps(job_id)[:60]} cannot name a failed job's build record")
        if result not in FAILED_RESULTS:
            raise CheckError(f"job {job_id}: result {json.dumps(result)[:20]} is not a failure")
        reason = reason_line(job.get("reason"), MAX_TEXT - 1)
        failure = Failure(job_id=job_id, result=result, reason=reason or None)
    return BuildRecord(
        filename=filename,
        sha256=sha256,
        provenance_sha256=provenance_sha256,
        compile_cache=setting if setting in CACHE_SETTINGS else None,
        cache_hits=count(job.get("compiles_cached")),
        compiled=count(job.get("compiles_compiled")),
        image_id=text(job.get("image_id")),
        factory_version=text(report.get("factory_version")),
        started=utc(report.get("started")),
        finished=utc(report.get("finished")),
        ci_run_url=url if isinstance(url, str) and _RUN_URL.fullmatch(url) else None,
        failure=failure,
    )


# --- parsing -----------------------------------------------------------------------------------------------

_TEXT = "text"
_OPT_TEXT = "optional text"
_SHA = "sha256"
_OPT_SHA = "optional sha256"
_COUNT = "count"
_NUMBER = "number"
_OPT_TIME = "optional time"
_OPT_SETTING = "optional setting"
_OPT_URL = "optional run url"
_NULL = "null"
_JOB = "job id"
_RESULT = "failed result"

_SHAPE: dict[str, Any] = {
    "format": _NUMBER,
    "wheel": {"filename": _TEXT, "sha256": _SHA},
    "provenance_sha256": _OPT_SHA,
    "compile_cache": {"setting": _OPT_SETTING, "hits": _COUNT, "compiled": _COUNT},
    "image_id": _OPT_TEXT,
    "factory_version": _OPT_TEXT,
    "started": _OPT_TIME,
    "finished": _OPT_TIME,
    "ci_run_url": _OPT_URL,
}
# A failed job's record: no wheel, and what failed.
_FAILED_SHAPE: dict[str, Any] = {
    **_SHAPE,
    "wheel": _NULL,
    "failed": {"job_id": _JOB, "result": _RESULT, "reason": _OPT_TEXT},
}
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,199}")  # as index.failed_record_path takes it


def _value_problem(value: Any, shape: Any, where: str) -> str | None:
    return strictjson.shape_problem(
        value, shape, where, leaf=_leaf_problem, closed="is not a field of this format"
    )


def _leaf_problem(value: Any, shape: Any, where: str) -> str | None:
    """This format's own kinds of value (`strictjson.shape_problem`'s leaves)."""
    if shape == _NULL:
        return None if value is None else f"{where} must be null in a failed job's record"
    if shape in (_NUMBER, _COUNT):
        ok = isinstance(value, int) and not isinstance(value, bool) and (shape == _NUMBER or value >= 0)
        return None if ok else f"{where} must be a {'count' if shape == _COUNT else 'number'}"
    if isinstance(shape, str) and shape.startswith("optional ") and value is None:
        return None
    if not isinstance(value, str) or not value.isprintable() or not 0 < len(value) <= MAX_TEXT:
        return f"{where} must be printable text of at most {MAX_TEXT} characters"
    if shape in (_SHA, _OPT_SHA) and not _SHA256.fullmatch(value):
        return f"{where} must be a sha256 (64 lowercase hex digits)"
    if shape == _OPT_TIME and not _TIME.fullmatch(value):
        return f"{where} must be a UTC time like 2026-01-31T12:00:00Z"
    if shape == _OPT_SETTING and value not in CACHE_SETTINGS:
        return f"{where} must be one of {', '.join(CACHE_SETTINGS)}"
    if shape == _OPT_URL and not _RUN_URL.fullmatch(value):
        return f"{where} must be a CI run's https URL"
    if shape == _JOB and not _JOB_ID.fullmatch(value):
        return f"{where} must be a job id (letters, digits and _.+- only)"
    if shape == _RESULT and value not in FAILED_RESULTS:
        return f"{where} must be one of {', '.join(FAILED_RESULTS)}"
    return None


def _problem(document: Any) -> str | None:
    if not isinstance(document, dict):
        return f"must be a JSON object, not {type(document).__name__}"
    fmt = document.get("format")
    if fmt != FORMAT or isinstance(fmt, bool):
        return f"format {json.dumps(fmt)[:20]} is not {FORMAT}, the one this factory reads"
    return _value_problem(document, _FAILED_SHAPE if "failed" in document else _SHAPE, "record")


def parse(data: bytes, *, where: str = f"<wheel>{SUFFIX}") -> BuildRecord:
    """A record file's content, checked against its format; anything else (too large, not UTF-8 JSON,
    another format, a missing, extra or ill-typed field) is a CheckError of one line naming `where`."""
    if len(data) > MAX_BYTES:
        raise CheckError(f"{where}: over the {MAX_BYTES >> 10} KiB a build record may have")
    try:
        document = strictjson.loads(data)
    except strictjson.StrictJSONError as exc:
        raise CheckError(f"{where}: not valid JSON ({exc})") from None
    problem = _problem(document)
    if problem:
        raise CheckError(f"{where}: {problem}")
    cache = document["compile_cache"]
    wheel = document["wheel"]
    failed = document.get("failed")
    return BuildRecord(
        filename=None if wheel is None else wheel["filename"],
        sha256=None if wheel is None else wheel["sha256"],
        provenance_sha256=document["provenance_sha256"],
        compile_cache=cache["setting"],
        cache_hits=cache["hits"],
        compiled=cache["compiled"],
        image_id=document["image_id"],
        factory_version=document["factory_version"],
        started=document["started"],
        finished=document["finished"],
        ci_run_url=document["ci_run_url"],
        failure=None if failed is None else Failure(**failed),
    )


def describe(record: BuildRecord) -> list[str]:
    """What `factory inspect` prints of a record, for a person (each value checked printable by `parse`)."""
    cache = record.compile_cache or "?"
    when = f"{record.started or '?'} .. {record.finished or '?'}"
    lines = [
        f"built       {when} by factory {record.factory_version or '?'}",
        *(
            [f"failed      job {record.failure.job_id}: {record.failure.reason or record.failure.result}"]
            if record.failure
            else []
        ),
        f"cache       {cache}: {record.cache_hits} hits, {record.compiled} compiled",
        f"image id    {record.image_id or '?'}",
    ]
    if record.ci_run_url:
        lines.append(f"ci run      {record.ci_run_url}")
    if record.provenance_sha256:
        lines.append(f"provenance  sha256:{record.provenance_sha256}")
    return lines
