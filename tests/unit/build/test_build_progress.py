"""What `factory build` prints: plain progress lines and their cadence, the summary, failures' log paths."""

from __future__ import annotations

import io

from rich.console import Console

from factory.build.report import Attempt, BuildReport, JobResult, SourceInfo
from factory.cli import progress

GIB = 2**30


def running(job_id: str = "cu130-torch2.14-abi1-sm90-py311", started: float = 100.0) -> JobResult:
    r = JobResult(job_id=job_id, variant_id="cu130-torch2.14-abi1-sm90", python="3.11")
    r.phase, r.started = "build", started
    return r


def with_attempt(r: JobResult, number: int = 1, limit: int = 16 * GIB) -> JobResult:
    r.attempts.append(Attempt(number=number, max_jobs=4, nvcc_threads=2, memory_limit=limit))
    return r


def console(width: int) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=width, force_terminal=False, color_system=None), out


# -- the plain line ------------------------------------------------------------------------------------------


def test_progress_line_names_phase_compiles_memory_and_attempt() -> None:
    r = with_attempt(with_attempt(running()), number=2)
    r.compiles_done, r.compiles_total, r.mem_now = 37, 120, 3 * GIB
    line = progress.progress_line(r, now=100.0 + 125)
    assert line == (
        "cu130-torch2.14-abi1-sm90-py311: build, compiles 37/120 (extension 1), memory 3.0 GiB / 16.0 GiB, "
        "attempt 2, 2m05s"
    )


def test_progress_line_before_ninja_reports_leaves_out_what_is_unknown() -> None:
    r = running()
    r.phase = "prepare"
    assert progress.progress_line(r, now=103.0) == "cu130-torch2.14-abi1-sm90-py311: prepare, 3s"


def test_progress_line_of_a_failed_job_names_its_log_and_leaves_the_reason_to_the_summary() -> None:
    r = running()
    r.result = r.phase = "failed"
    r.reason, r.log = "git failed for https://x/y@v1", "/home/u/.factory/runs/abc/logs/job.log"
    line = progress.progress_line(r, now=200.0)
    assert line == (
        "cu130-torch2.14-abi1-sm90-py311: failed (why: in the summary; "
        "log: /home/u/.factory/runs/abc/logs/job.log)"
    )


# -- the cadence ---------------------------------------------------------------------------------------------


def test_a_phase_change_prints_at_once_and_only_once() -> None:
    plain = progress.PlainProgress(interval=60.0)
    r = running()
    r.phase = "prepare"
    assert plain.changed(r, now=100.0) == "cu130-torch2.14-abi1-sm90-py311: prepare, 0s"
    r.mem_now = GIB  # a memory reading is a change too, but not of the phase
    assert plain.changed(r, now=101.0) is None
    r.phase = "build"
    assert plain.changed(r, now=102.0) is not None


def test_a_running_job_prints_once_a_minute_after_its_last_line() -> None:
    plain = progress.PlainProgress(interval=60.0)
    r = running(started=100.0)
    assert plain.changed(r, now=100.0) is not None
    assert plain.due([r], now=159.9) == []
    r.compiles_done, r.compiles_total = 5, 10
    line = "cu130-torch2.14-abi1-sm90-py311: build, compiles 5/10 (extension 1), 1m00s"
    assert plain.due([r], now=160.0) == [line]
    assert plain.due([r], now=200.0) == []  # 40 s after that line
    r.phase = "check"
    assert plain.changed(r, now=210.0) is not None  # a phase change restarts the minute
    assert plain.due([r], now=260.0) == []
    assert len(plain.due([r], now=270.0)) == 1


def test_queued_and_finished_jobs_print_no_periodic_line() -> None:
    plain = progress.PlainProgress(interval=60.0)
    queued = JobResult(job_id="q", variant_id="v", python="3.11")
    done = running("d")
    done.phase = done.result = "ok"
    assert plain.due([queued, done], now=10_000.0) == []


def test_every_running_job_has_its_own_minute() -> None:
    plain = progress.PlainProgress(interval=60.0)
    a, b = running("a", started=0.0), running("b", started=30.0)
    assert [line.split(":")[0] for line in plain.due([a, b], now=60.0)] == ["a"]
    assert [line.split(":")[0] for line in plain.due([a, b], now=90.0)] == ["b"]


# -- the summary ---------------------------------------------------------------------------------------------


def report_with(*jobs: JobResult) -> BuildReport:
    return BuildReport(run_id="r", matrix="matrix.yaml", started=0.0, jobs=list(jobs))


def test_plain_summary_never_splits_a_long_wheel_filename() -> None:
    wheel = (
        "flash_attn-2.8.3+cu13.0.torch2.14.abi1.sm80.90.100.120-cp311-cp311-" + "x" * 40 + "-linux_x86_64.whl"
    )
    assert len(wheel) >= 120
    ok = running()
    ok.result, ok.phase, ok.wheel, ok.wall_s = "ok", "ok", wheel, 754.0
    con, out = console(width=40)
    progress.show_report(con, report_with(ok), "wheelhouse/report.json", interactive=False)
    text = out.getvalue()
    assert wheel in text.splitlines()[1]
    assert "wall 12m34s" in text
    assert "report: wheelhouse/report.json" in text


def test_plain_summary_names_the_reason_and_the_log_once() -> None:
    log = "/home/someone/.cache/factory/runs/0123456789ab/logs/cu130-torch2.14-abi1-sm90-py311.log"
    failed = running()
    failed.result = failed.phase = "failed"
    failed.reason, failed.log = "base image bootstrap failed: debootstrap exited 1", log
    skipped = running("skipped-job")
    skipped.result = "skipped"
    con, out = console(width=40)
    progress.show_report(con, report_with(failed, skipped), "report.json", interactive=False)
    lines = out.getvalue().splitlines()
    assert f"  log: {log}" in lines  # in the summary
    reason = "base image bootstrap failed: debootstrap exited 1"
    assert sum(reason in line for line in lines) == 1
    assert not any("skipped-job" in line and "log" in line for line in lines)


def test_terminal_summary_table_names_the_log_of_a_failure() -> None:
    failed = running()
    failed.result, failed.reason, failed.log = "oom", "OOM-killed", "/tmp/x/job.log"
    con, out = console(width=200)
    progress.show_report(con, report_with(failed), "report.json", interactive=True)
    assert "log: /tmp/x/job.log" in out.getvalue()


def test_progress_table_has_a_compiles_column() -> None:
    r = with_attempt(running())
    r.compiles_done, r.compiles_total = 3, 9
    con, out = console(width=200)
    con.print(progress.progress_table([r], now=130.0))
    text = out.getvalue()
    assert "compiles" in text and "3/9" in text and "30s" in text


# -- report.json's source ------------------------------------------------------------------------------------


def test_report_json_records_the_sdist_once_at_the_top() -> None:
    report = report_with(running("a"), running("b"))
    report.source = SourceInfo(kind="pypi", sdist="flash_attn-2.8.3.tar.gz", sha256="ab" * 32)
    data = report.to_json()
    assert data["source"] == {
        "kind": "pypi",
        "sdist": "flash_attn-2.8.3.tar.gz",
        "sha256": "ab" * 32,
        "commit": None,
    }
    assert all("source" not in job and "sdist" not in job for job in data["jobs"])
    keys = ["run_id", "matrix", "started", "finished", "ok", "source", "jobs", "factory_version"]
    keys += ["compile_cache", "ci_run_url"]
    assert list(data) == keys


def test_report_json_live_counts_stay_out() -> None:
    r = running()
    r.compiles_done, r.compiles_total = 1, 2
    job = report_with(r).to_json()["jobs"][0]
    assert not {"compiles_done", "compiles_total", "phase", "started", "mem_now"} & set(job)


def test_progress_line_of_a_finished_job_that_succeeded_names_its_wheel() -> None:
    r = running()
    r.result = r.phase = "ok"
    r.wheel, r.log = "demo-0.1.0+cu13.0-cp311-cp311-linux_x86_64.whl", "/x/job.log"
    assert progress.progress_line(r, now=0.0) == (
        "cu130-torch2.14-abi1-sm90-py311: ok: demo-0.1.0+cu13.0-cp311-cp311-linux_x86_64.whl"
    )


def test_the_summary_names_a_toolkit_other_than_the_variants_cuda() -> None:
    debian = JobResult(
        job_id="cu128-torch2.10-abi1-sm80-py313",
        variant_id="cu128-torch2.10-abi1-sm80",
        python="3.13",
        result="ok",
        image="factory-builder:cu12.4-trixie-debian",
        toolkit="12.4",
    )
    pypi = JobResult(
        job_id="cu130-torch2.14-abi1-sm80-py313",
        variant_id="cu130-torch2.14-abi1-sm80",
        python="3.13",
        result="ok",
        toolkit="13.0.88",
    )
    lines = progress.summary_lines(BuildReport(run_id="r", matrix="m.yaml", started=0.0, jobs=[debian, pypi]))
    assert "nvcc 12.4" in lines[1] and "nvcc" not in lines[2]
    data = debian.to_json()
    assert data["toolkit"] == "12.4" and data["image"] == "factory-builder:cu12.4-trixie-debian"


def test_compiles_never_read_a_fraction_of_the_part_known_so_far() -> None:
    r = running()
    r.compiles_done, r.compiles_total, r.compiles_runs = 12, 15, 1
    assert progress.compiles(r) == "12/15 (extension 1)"  # ninja's own total of the one run so far
    # torch runs one ninja per extension: the sum of the totals so far is not the build's
    r.compiles_done, r.compiles_total, r.compiles_runs = 14, 14, 4
    r.compiles_run_done, r.compiles_run_total = 2, 2
    assert progress.compiles(r) == "14 done; extension 4: 2/2"
    r.phase = "check"
    assert progress.compiles(r) == "14/14"


def test_compiles_against_the_total_an_earlier_build_counted_with_the_time_left() -> None:
    r = running(started=0.0)
    r.compiles_done, r.compiles_total, r.compiles_runs = 10, 12, 3
    r.compiles_expected, r.compiles_since = 40, 100.0
    assert progress.compiles(r) == "10/40 (expected, from an earlier build)"
    # 10 compiles in 200 s: 30 more at that pace
    assert progress.compiles(r, now=300.0) == "10/40 (expected, from an earlier build), ~10m00s left"
    # a build that outgrew the earlier count says what it knows
    r.compiles_total, r.compiles_run_done, r.compiles_run_total = 41, 1, 5
    assert progress.compiles(r, now=300.0) == "10 done; extension 3: 1/5"


def test_the_running_line_says_what_prepare_downloads_and_a_warning() -> None:
    r = running(started=0.0)
    r.phase, r.activity = "prepare", "downloading 3 of 14 wheels so far (2.1 GB): torch-2.14.1.whl"
    assert progress.progress_line(r, now=244.0) == (
        "cu130-torch2.14-abi1-sm90-py311: prepare, downloading 3 of 14 wheels so far (2.1 GB): "
        "torch-2.14.1.whl, 4m04s"
    )
    r.phase, r.activity = "build", ""
    r.warnings.append("no nvcc yet after 16 host compile(s): this build may be making CPU-only extensions")
    assert "WARNING no nvcc yet after 16 host compile(s)" in progress.progress_line(r, now=300.0)
    con, out = console(width=200)
    con.print(progress.progress_table([r], now=300.0))
    assert "WARNING no nvcc yet" in out.getvalue()


def test_a_setup_failure_every_job_shares_is_said_once() -> None:
    """The devel flavor without a registry: the reason once, in the summary; the log's only line (the
    host's own of that reason) not again; the second job named by the first."""
    reason = (
        "cannot pull nvidia/cuda:13.0.1-devel-ubuntu22.04: no registry reachable; set `build.flavor: pypi`"
    )
    jobs = []
    for job_id in ("a-py311", "a-py313"):
        r = running(job_id)
        r.result = r.phase = "failed"
        r.reason, r.log, r.log_tail = reason, f"/x/{job_id}.log", [f"factory: {reason}"]
        jobs.append(r)
    plain = progress.PlainProgress()
    said = [plain.changed(r, now=1.0) or "" for r in jobs]
    con, out = console(width=100)
    progress.show_report(con, report_with(*jobs), "report.json", interactive=False)
    text = "\n".join(said) + "\n" + out.getvalue()
    assert text.count("no registry reachable") == 1
    assert "a-py313  failed" in text and "as a-py311" in text


def test_a_wheel_that_failed_its_check_is_named_in_the_summary_and_the_failure() -> None:
    r = running()
    r.result = r.phase = "failed"
    r.reason = "install/import check failed (exit 1): ModuleNotFoundError: No module named 'scipy'"
    r.log, r.kept_wheel = "/x/job.log", "/out/check-failed/x-0.1.0+cu13.0-cp313-cp313-linux_x86_64.whl"
    con, out = console(width=80)
    progress.show_report(con, report_with(r), "report.json", interactive=False)
    text = out.getvalue()
    assert f"  wheel kept: {r.kept_wheel}\n" in text
    assert text.count(r.reason) == 1
    assert report_with(r).to_json()["jobs"][0]["kept_wheel"] == r.kept_wheel


def test_the_time_left_by_the_share_of_the_sources_cuda_work_done() -> None:
    """The source's CUDA files are known before the build: their count from the start, and the time left by
    the share of their weight (the profile's or the recipe's times) compiled so far."""
    r = running(started=0.0)
    r.compiles_done, r.compiles_total, r.compiles_runs, r.compiles_since = 6, 20, 1, 100.0
    r.device_total, r.device_basis = 8, "by the profile's times"
    assert progress.compiles(r, now=100.0) == "6/20 (extension 1); CUDA files 0/8"
    r.device_done, r.device_share = 2, 0.25  # a quarter of the device work in 5 minutes
    assert progress.compiles(r, now=400.0) == (
        "6/20 (extension 1); CUDA files 2/8, ~15m00s left by the profile's times"
    )
    assert "CUDA files 2/8" in progress.progress_line(r, now=400.0)
