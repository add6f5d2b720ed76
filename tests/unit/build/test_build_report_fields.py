"""A build's report without containers: the source's provenance, and a job that fails before any container."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from factory.build import jobrun, report
from factory.build import runner as build
from factory.cli import progress
from factory.core.errors import BuildError
from factory.plan.plan import Job, plan_matrix
from factory.spec.config import load_matrix_file
from factory.spec.options import Source

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def demo(tmp_path: Path) -> build.Runner:
    mf = load_matrix_file(ROOT / "examples" / "demo.yaml")
    return build.Runner(None, mf, build.BuildSettings(output=tmp_path / "out", run_id="r1"))


def test_source_info_of_a_path_source(demo: build.Runner) -> None:
    assert demo.source_info() == report.SourceInfo(kind="path")  # before any job prepared it
    assert demo.prepared_source().tree.is_dir()
    assert demo.source_info() == report.SourceInfo(kind="path")


def test_source_info_of_a_git_source_names_the_commit(demo: build.Runner, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> str:
        env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
               "GIT_COMMITTER_EMAIL": "t@x", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}  # fmt: skip
        done = subprocess.run(
            ["git", "-C", str(repo), *args], env=env, capture_output=True, text=True, check=True
        )
        return done.stdout.strip()

    git("init", "--quiet")
    (repo / "setup.py").write_text("print('x')\n")
    git("add", "setup.py")
    git("commit", "--quiet", "-m", "one")
    head = git("rev-parse", "HEAD")
    package = dataclasses.replace(demo.mf.package, source=Source(kind="git", url=str(repo)))
    runner = build.Runner(None, dataclasses.replace(demo.mf, package=package), demo.settings)
    runner.prepared_source()
    assert runner.source_info() == report.SourceInfo(kind="git", commit=head)


def first_job(runner: build.Runner) -> Job:
    return plan_matrix(runner.mf).jobs[0]


def test_a_job_failing_before_its_container_names_a_log_that_says_why(demo: build.Runner) -> None:
    demo.settings.output.mkdir()
    job = first_job(demo)
    result = report.JobResult(job_id=job.id, variant_id=job.variant.id, python=job.python)

    def prepare(_job: Job) -> jobrun.JobInputs:
        raise BuildError("cannot fetch the sdist: connection refused")

    jobrun.run_job(demo.context, job, result, prepare=prepare)
    assert result.result == "failed"
    assert result.log is not None
    log = Path(result.log)
    assert log.read_text() == "factory: cannot fetch the sdist: connection refused\n"
    assert result.log_tail == ["factory: cannot fetch the sdist: connection refused"]
    assert progress.ended(result) == f"{job.id}: failed (why: in the summary; log: {log})"
    assert "connection refused" in "\n".join(progress.summary_lines(report.BuildReport(
        run_id="r", matrix="m.yaml", started=0.0, jobs=[result]
    )))  # fmt: skip


def test_an_input_every_job_shares_fails_once_for_all_of_them(demo: build.Runner) -> None:
    """An image no registry serves: the first job's failure is every later job's, without trying again."""
    tries: list[int] = []

    def make() -> str:
        tries.append(1)
        raise BuildError("cannot pull nvidia/cuda:13.0.1-devel-ubuntu22.04: no registry reachable")

    for _job in range(3):
        with pytest.raises(BuildError, match="no registry reachable"):
            demo._once("image:x", make)
    assert len(tries) == 1
    assert demo._once("image:y", lambda: "made") == "made"


def test_the_download_a_job_waits_for_is_its_progress_lines_activity(demo: build.Runner) -> None:
    import threading

    result = report.JobResult(job_id="j", variant_id="v", python="3.11")
    seen: list[str] = []
    demo.context = dataclasses.replace(demo.context, on_change=lambda r: seen.append(r.activity))
    demo._results[threading.get_ident()] = result
    show = demo.activity()
    show("downloading 1 of 3 wheels so far (873 MiB): torch-2.14.1.whl")
    assert result.activity.startswith("downloading 1 of 3") and seen == [result.activity]
    show("")
    assert result.activity == ""


def test_a_job_of_host_compiles_alone_says_so_in_its_result_and_log(demo: build.Runner) -> None:
    job = first_job(demo)
    result = report.JobResult(job_id=job.id, variant_id=job.variant.id, python=job.python)
    notes: list[str] = []
    lines = jobrun.DriverLines(demo.context, job, result, changed=lambda: None, note=notes.append)
    for i in range(1, 41):
        lines.feed(f"[{i}/40] c++ -MMD -c /src/csrc/cpu/f{i}.cpp -o f{i}.o")
    (warning,) = result.warnings
    assert warning.startswith("no nvcc yet after 16 host compile(s)")
    assert notes == [f"warning: {warning}"]
    assert report.BuildReport(run_id="r", matrix="m", started=0.0, jobs=[result]).to_json()["jobs"][0][
        "warnings"
    ] == [warning]


def test_a_jobs_cuda_files_are_counted_from_its_source_before_the_build(
    demo: build.Runner, tmp_path: Path
) -> None:
    from factory.container import protocol

    job = first_job(demo)
    result = report.JobResult(job_id=job.id, variant_id=job.variant.id, python=job.python)
    run = jobrun.JobRun(demo.context, job, result)
    source = tmp_path / "src"
    (source / "csrc").mkdir(parents=True)
    for name in ("a.cu", "b.cu", "host.cpp"):
        (source / "csrc" / name).write_text("")
    run.plan_estimate(source)
    assert (result.device_total, result.device_done) == (2, 0)
    assert result.device_basis == "by count"  # no profile, and the demo recipe names no times
    line = protocol.measurement_line({"key": "a.cu|compute_80|1", "peak_bytes": 1, "wall_s": 1.0})
    run.lines.feed(line)
    assert (result.device_done, result.device_share) == (1, 0.5)
