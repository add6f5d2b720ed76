"""The wheel a build leaves in `/out` (a directory its container can write) reaches the host's checks only as
a copy made without following a link, of a regular file, under the plain file name the driver reported: a
build's code can plant links, FIFOs and forged log marks there (issue 31, section 1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from factory.build import acceptance, jobrun, report, runner
from factory.core import leftovers
from factory.plan.plan import plan_matrix
from factory.spec.config import load_matrix_file

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def run(tmp_path: Path) -> acceptance.Acceptance:
    mf = load_matrix_file(ROOT / "examples" / "demo.yaml")
    settings = runner.BuildSettings(output=tmp_path / "out", run_id="r1", compile_cache=None)
    job = plan_matrix(mf).jobs[0]
    return jobrun.JobRun(
        runner.Runner(None, mf, settings).context,
        job,
        report.JobResult(job_id=job.id, variant_id="v", python="3.11"),
    ).acceptance


@pytest.fixture
def out(tmp_path: Path) -> Path:
    path = tmp_path / "out" / ".tmp-job"
    path.mkdir(parents=True)
    return path


def test_the_reported_wheel_is_copied_out(run: acceptance.Acceptance, out: Path) -> None:
    (out / "demo-0.1.0-cp311-cp311-linux_x86_64.whl").write_bytes(b"wheel bytes")
    taken = run.take_wheel(out, "demo-0.1.0-cp311-cp311-linux_x86_64.whl")
    assert taken is not None and taken.read_bytes() == b"wheel bytes"
    assert taken.parent == run.wheel_dir and not taken.is_relative_to(out)
    assert leftovers.read_owner(run.wheel_dir) is not None  # a dead run's copy is removed like its /out


@pytest.mark.parametrize(
    "name",
    ["../../../../etc/passwd", "/etc/passwd", "a/b.whl", "x.whl\n", ".whl/..", "", None, 7, "ok.tar.gz"],
)
def test_a_name_that_is_not_one_wheel_file_is_no_wheel(
    run: acceptance.Acceptance, out: Path, name: object
) -> None:
    # the driver's mark can be forged by the build's own output: the name is the container's word
    assert run.take_wheel(out, name) is None


def test_a_link_or_a_fifo_named_as_the_wheel_is_no_wheel(
    run: acceptance.Acceptance, out: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "host-secret"
    secret.write_bytes(b"credentials")
    (out / "a-1-py3-none-any.whl").symlink_to(secret)
    os.mkfifo(out / "b-1-py3-none-any.whl")
    assert run.take_wheel(out, "a-1-py3-none-any.whl") is None
    assert run.take_wheel(out, "b-1-py3-none-any.whl") is None  # refused at once, never a blocked open
    assert not [p for p in run.wheel_dir.iterdir() if p.name != leftovers.OWNER_FILE]


def test_a_kept_wheel_has_its_failure_record_beside_it(run: acceptance.Acceptance, tmp_path: Path) -> None:
    from factory.wheel import checkrecord

    (tmp_path / "out").mkdir(exist_ok=True)
    (tmp_path / "out" / ".log").mkdir()
    run.run.log_path = tmp_path / "out" / ".log" / "job.log"
    wheel = tmp_path / "demo-0.1.0-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"wheel bytes")
    run.result.reason = "wheel check failed: no cubins for sm_80 in demo/_k.so"
    run.keep_wheel(wheel)
    kept = tmp_path / "out" / acceptance.CHECK_FAILED_DIR / wheel.name
    assert run.result.kept_wheel == str(kept) and kept.read_bytes() == b"wheel bytes"
    record = checkrecord.parse(checkrecord.beside(kept).read_bytes())
    assert (record.wheel, record.job, record.reason) == (wheel.name, run.job.id, run.result.reason)
    assert checkrecord.failure_of(kept) == f"job {run.job.id}: {run.result.reason}"
