"""Hostile input to publishing's pure parts: wheel names and metadata, build reports, S3 URLs, messages."""

from __future__ import annotations

import json
import tracemalloc
import zipfile
from pathlib import Path

import pytest

from factory.core.errors import ConfigError
from factory.core.tags import canonical_wheel_filename
from factory.core.urls import urls_without_credentials
from factory.publish import index
from factory.publish.publisher import MAX_METADATA_BYTES, inspect_wheel, load_report
from factory.wheel.checks import record_hash

LABEL = "cu13.0.torch2.14.abi1.sm80.90"
VID = "cu130-torch2.14-abi1-sm80.90"


def wheel(directory: Path, filename: str, metadata: bytes | None = None, *, name: str = "demo-ext") -> Path:
    """A wheel file named `filename` whose METADATA is `metadata` (default: consistent with the name)."""
    version = filename.split("-")[1]
    if metadata is None:
        metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n".encode()
    dist_info = f"demo_ext-{version}.dist-info"
    record = f"{dist_info}/METADATA,{record_hash(metadata)},{len(metadata)}\n{dist_info}/RECORD,,\n"
    path = directory / filename
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{dist_info}/METADATA", metadata)
        zf.writestr(f"{dist_info}/RECORD", record)
    return path


def rec(filename: str, sha: str = "a" * 64) -> index.FileRecord:
    return index.FileRecord(filename=filename, sha256=sha, size=1, upload_time="")


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        (f"Demo_Ext-0.1.0+{LABEL.upper()}-py3-none-any.whl", f"demo_ext-0.1.0+{LABEL}-py3-none-any.whl"),
        (f"demo.ext-0.1.0+{LABEL}-PY3-None-Any.whl", f"demo_ext-0.1.0+{LABEL}-py3-none-any.whl"),
        (f"demo_ext-0.1.0.0+{LABEL}-py3-none-any.whl", f"demo_ext-0.1.0.0+{LABEL}-py3-none-any.whl"),
        (f"demo_ext-01.1.0+{LABEL}-1-py3-none-any.whl", f"demo_ext-1.1.0+{LABEL}-1-py3-none-any.whl"),
    ],
)
def test_canonical_wheel_filename(given: str, canonical: str) -> None:
    assert canonical_wheel_filename(given) == canonical


def test_inspect_wheel_gives_the_canonical_filename(tmp_path: Path) -> None:
    info = inspect_wheel(wheel(tmp_path, f"Demo_Ext-0.1.0+{LABEL.upper()}-py3-none-any.whl"))
    assert info.filename == f"demo_ext-0.1.0+{LABEL}-py3-none-any.whl"
    assert (info.project, info.variant_id) == ("demo-ext", VID)


@pytest.mark.parametrize(
    "impostor",
    [
        f"demo_ext-0.1.0.0+{LABEL}-py3-none-any.whl",  # PEP 440 equal version
        f"demo_ext-0.1.0+{LABEL}-7-py3-none-any.whl",  # a build tag: pip prefers it
        f"demo_ext-0.1.0+{LABEL}-py2.py3-none-any.whl",  # shares the py3-none-any tag
    ],
)
def test_another_file_of_a_published_release_is_a_conflict(impostor: str) -> None:
    published = rec(f"demo_ext-0.1.0+{LABEL}-py3-none-any.whl")
    with pytest.raises(index.RecordConflict, match="same release"):
        index.merge_records([published], [rec(impostor, "b" * 64)])
    with pytest.raises(index.RecordConflict, match="same release"):  # both in one publish
        index.merge_records([], [published, rec(impostor, "b" * 64)])


def test_other_tags_and_versions_of_a_release_are_not_conflicts() -> None:
    published = rec(f"demo_ext-0.1.0+{LABEL}-cp311-cp311-linux_x86_64.whl")
    others = [
        rec(f"demo_ext-0.1.0+{LABEL}-cp312-cp312-linux_x86_64.whl"),
        rec(f"demo_ext-0.1.1+{LABEL}-cp311-cp311-linux_x86_64.whl"),
        rec(f"other-0.1.0+{LABEL}-cp311-cp311-linux_x86_64.whl"),
    ]
    merged = index.merge_records([published], others)
    assert merged is not None and len(merged) == 4


def test_a_page_that_already_lists_two_spellings_still_takes_new_files() -> None:
    old = [rec(f"demo_ext-0.1.0+{LABEL}-py3-none-any.whl"), rec(f"demo_ext-0.1.0.0+{LABEL}-py3-none-any.whl")]
    merged = index.merge_records(old, [rec(f"demo_ext-0.2.0+{LABEL}-py3-none-any.whl")])
    assert merged is not None and len(merged) == 3


@pytest.mark.parametrize(
    ("meta", "why"),
    [
        (b"Metadata-Version: 2.1\nName: demo-ext\nVersion: 0.2.0+" + LABEL.encode() + b"\n\n", "Version"),
        (b"Metadata-Version: 2.1\nName: demo-ext\nVersion: not a version\n\n", "Version"),
        (b"Metadata-Version: 2.1\nName: demo-ext\n\n", "Version None"),
        (b"Metadata-Version: 2.1\nName: other\nVersion: 0.1.0+" + LABEL.encode() + b"\n\n", "Name"),
    ],
)
def test_metadata_that_contradicts_the_filename_is_refused(tmp_path: Path, meta: bytes, why: str) -> None:
    path = wheel(tmp_path, f"demo_ext-0.1.0+{LABEL}-py3-none-any.whl", meta)
    with pytest.raises(ConfigError, match=f"METADATA {why}") as exc:
        inspect_wheel(path)
    assert exc.value.exit_code == 2 and "\n" not in str(exc.value)


def test_metadata_equal_under_pep440_is_consistent(tmp_path: Path) -> None:
    meta = f"Metadata-Version: 2.1\nName: Demo_Ext\nVersion: 0.1.0.0+{LABEL.upper()}\n\n".encode()
    assert inspect_wheel(wheel(tmp_path, f"demo_ext-0.1.0+{LABEL}-py3-none-any.whl", meta)).metadata == meta


def test_a_huge_metadata_is_refused_without_being_inflated(tmp_path: Path) -> None:
    path = tmp_path / f"demo_ext-0.1.0+{LABEL}-py3-none-any.whl"
    with (
        zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf,
        zf.open("demo_ext.dist-info/METADATA", "w") as fh,
    ):
        fh.write(f"Metadata-Version: 2.1\nName: demo-ext\nVersion: 0.1.0+{LABEL}\n".encode())
        block = b"X-Filler: " + b"x" * 1000 + b"\n"
        for _ in range(100_000):  # 100 MB that deflate to a few hundred KB
            fh.write(block)
    assert path.stat().st_size < 1_000_000
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match="METADATA is larger than 1 MiB"):
            inspect_wheel(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * MAX_METADATA_BYTES


def test_metadata_at_the_limit_is_published(tmp_path: Path) -> None:
    head = f"Metadata-Version: 2.1\nName: demo-ext\nVersion: 0.1.0+{LABEL}\n\n".encode()
    meta = head + b"d" * (MAX_METADATA_BYTES - len(head))
    assert len(inspect_wheel(wheel(tmp_path, f"demo_ext-0.1.0+{LABEL}-py3-none-any.whl", meta)).metadata) == (
        MAX_METADATA_BYTES
    )


GOOD_JOB = {"variant_id": VID, "python": "3.11", "result": "ok", "wheel": None}


@pytest.mark.parametrize(
    ("job", "why"),
    [
        ({**GOOD_JOB, "wheel": "notes.txt"}, "'notes.txt' is not a wheel filename"),
        ({**GOOD_JOB, "wheel": 3}, "'wheel' is 3, not a string"),
        ({**GOOD_JOB, "python": 3.11}, "'python' is 3.11"),
        ({"python": "3.11", "result": "ok"}, "has no 'variant_id'"),
        ({**GOOD_JOB, "package": ["x"]}, "'package'"),
        ({**GOOD_JOB, "platform": 64}, "'platform' is 64, not a string"),
        ({**GOOD_JOB, "platform": "sparc"}, 'platform "sparc" is not one of x86_64, aarch64'),
    ],
)
def test_every_report_job_is_checked(tmp_path: Path, job: dict[str, object], why: str) -> None:
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"jobs": [GOOD_JOB, job]}))
    with pytest.raises(ConfigError, match=f"job 2.*{why}"):
        load_report(report)


def test_a_report_job_names_its_platform_or_is_the_default_ones(tmp_path: Path) -> None:
    """The runner writes each job's platform (a job that made no wheel is shown in its platform's cell); a
    report older than the platform axis has none: its jobs are the default platform's."""
    from factory.build.report import JobResult
    from factory.publish.index import job_platform

    report = tmp_path / "report.json"
    arm = JobResult(job_id="j-aarch64", variant_id=VID, python="3.11", platform="aarch64", result="oom")
    report.write_text(json.dumps({"jobs": [GOOD_JOB, arm.to_json()]}))
    assert [job_platform(j) for j in load_report(report)] == ["x86_64", "aarch64"]
    assert JobResult(job_id="j", variant_id=VID, python="3.11").to_json()["platform"] == "x86_64"


def test_a_report_that_is_not_text_is_a_config_error(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    report.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="report"):
        load_report(report)


def test_messages_show_urls_without_credentials() -> None:
    text = 'Could not connect to the endpoint URL: "http://user:PASSWORD@127.0.0.1:9/b/x?token=SECRET"\nretry'
    assert (
        urls_without_credentials(text)
        == 'Could not connect to the endpoint URL: "http://127.0.0.1:9/b/x" retry'
    )
