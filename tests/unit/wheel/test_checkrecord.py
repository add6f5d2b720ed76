"""A wheel that failed its checks: its failure record beside it (`factory.build.checkrecord`),
`factory publish`'s refusal of it unless forced, and `factory inspect`'s line of its check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_publish_inputs import LABEL, wheel

from factory.core.errors import PublishError
from factory.publish.publisher import publish_directory
from factory.wheel import checkrecord

ROOT = Path(__file__).resolve().parents[3]
NAME = f"demo_ext-0.1.0+{LABEL}-py3-none-any.whl"
WHY = "install/import check failed (exit 1): ModuleNotFoundError: No module named 'torch_scatter'"


def kept(output: Path) -> Path:
    """What `factory build` leaves of a wheel that failed its check: check-failed/<wheel> and its record."""
    failed = output / "check-failed"
    failed.mkdir(parents=True)
    path = wheel(failed, NAME)
    checkrecord.write_beside(path, job="cu130-torch2.14-abi1-sm80.90-py313", reason=WHY)
    return path


def test_the_record_reads_back_and_a_foreign_one_is_refused() -> None:
    record = checkrecord.CheckFailure(wheel=NAME, job="j", reason=WHY)
    assert checkrecord.parse(checkrecord.dumps(record).encode()) == record
    for bad in (b"[]", b'{"format": 1, "result": "ok"}', b'{"format": 1, "result": "failed", "job": 3}'):
        with pytest.raises(ValueError):
            checkrecord.parse(bad)


def test_publish_refuses_a_wheel_beside_its_failure_record_and_writes_nothing(tmp_path: Path) -> None:
    wheel_path = kept(tmp_path / "out")
    index = tmp_path / "index"
    with pytest.raises(PublishError) as info:
        publish_directory(wheel_path.parent, to=str(index))
    message = str(info.value)
    assert "\n" not in message and NAME in message and "No module named 'torch_scatter'" in message
    assert "--force-failed" in message
    assert not index.exists()
    # forced, it is published
    result = publish_directory(wheel_path.parent, to=str(index), force_failed=True)
    assert [f.filename for f in result.files] == [NAME]


def test_publish_refuses_a_wheel_the_report_kept_even_without_its_record(tmp_path: Path) -> None:
    elsewhere = tmp_path / "copied"
    elsewhere.mkdir()
    wheel_path = wheel(elsewhere, NAME)
    report = tmp_path / "report.json"
    job = {"job_id": "j1", "variant_id": "cu130-torch2.14-abi1-sm80.90", "python": "3.13", "result": "failed"}
    job |= {"reason": WHY, "kept_wheel": f"/out/check-failed/{NAME}", "wheel": None}
    report.write_text(json.dumps({"jobs": [job]}))
    with pytest.raises(PublishError, match="job j1: install/import check failed"):
        publish_directory(wheel_path.parent, to=str(tmp_path / "index"), report=report)


def test_a_wheel_with_no_record_is_published(tmp_path: Path) -> None:
    good = tmp_path / "out"
    good.mkdir()
    wheel(good, NAME)
    assert checkrecord.failure_of(good / NAME) is None
    assert len(publish_directory(good, to=str(tmp_path / "index")).files) == 1


def test_inspect_line_of_the_checks_result(tmp_path: Path) -> None:
    failed = kept(tmp_path / "out")
    assert checkrecord.result_of(failed)[0] == "failed"
    line = checkrecord.describe(failed)
    assert line.startswith("check       FAILED: job cu130-torch2.14-abi1-sm80.90-py313: install/import check")
    ok = wheel(tmp_path / "out", NAME)
    (tmp_path / "out" / "report.json").write_text(
        json.dumps({"jobs": [{"job_id": "j", "wheel": NAME, "result": "ok"}]})
    )
    assert checkrecord.describe(ok) == f"check       passed (job j of {tmp_path / 'out' / 'report.json'})"
    alone = tmp_path / "alone"
    alone.mkdir()
    assert checkrecord.result_of(wheel(alone, NAME))[0] == "unknown"


def test_publish_help_names_the_force_flag() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "factory.cli", "publish", "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode == 0 and "--force-failed" in out.stdout


def test_factory_inspect_shows_the_checks_result(tmp_path: Path, factory_cli: Any) -> None:
    from test_provenance import NEEDED, make_facts, write_wheel

    from factory.wheel import embedded
    from factory.wheel.checks import pin_torch_requirement

    failed = tmp_path / "check-failed"
    failed.mkdir()
    built = write_wheel(failed / "factory_memext-0.1.0-cp311-cp311-linux_x86_64.whl")
    pin_torch_requirement(built, "2.14.1", extra=embedded.files(make_facts(), NEEDED))
    code, out = factory_cli(["inspect", str(built)])
    assert code == 0 and "check       unknown (no failure record" in out, out
    checkrecord.write_beside(built, job="j1", reason=WHY)
    code, out = factory_cli(["inspect", str(built)])
    assert code == 0 and f"check       FAILED: job j1: {WHY}; `factory publish` refuses it" in out, out
    code, out = factory_cli(["inspect", str(built), "--json"])
    assert json.loads(out)["check"] == {"result": "failed", "detail": f"job j1: {WHY}"}
    # a link planted where the record goes is never followed, and still says the wheel failed
    record = checkrecord.beside(built)
    record.unlink()
    record.symlink_to(tmp_path / "elsewhere.json")
    assert checkrecord.result_of(built)[0] == "failed"
