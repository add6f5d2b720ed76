"""Pure parts of a build: job selection, requirements, a job's environment, memory readings, the report."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from factory.build import engine, jobrun, jobspec, report
from factory.build import runner as build
from factory.container import NVCC_LAUNCHER
from factory.container.protocol import ProfileEntry
from factory.core.errors import ConfigError
from factory.memory import jobmemory, profiles
from factory.plan.plan import Job, plan_matrix
from factory.spec.config import load_matrix_file

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def demo(tmp_path: Path) -> build.Runner:
    mf = load_matrix_file(ROOT / "examples" / "demo.yaml")
    return build.Runner(None, mf, build.BuildSettings(output=tmp_path, run_id="r1"))


def job_run(runner: build.Runner, job: Job) -> jobrun.JobRun:
    result = report.JobResult(job_id=job.id, variant_id=job.variant.id, python=job.python)
    return jobrun.JobRun(runner.context, job, result)


def test_only_selects_by_job_or_variant_glob() -> None:
    """`factory build --only` selects with Plan.only, the same filter `factory matrix --only` uses."""
    plan = plan_matrix(load_matrix_file(ROOT / "examples" / "demo.yaml"))
    assert [j.id for j in plan.only("*sm80-py311").jobs] == ["cu130-torch2.14-abi1-sm80-py311"]
    assert [j.variant.id for j in plan.only("*sm90.120").jobs] == ["cu130-torch2.14-abi1-sm90.120"]
    assert len(plan.only(None).jobs) == 2
    assert plan.only("cu128-*").jobs == ()


def test_working_set_excludes_inactive_page_cache() -> None:
    v1 = {"usage": 8_000, "max_usage": 9_000, "stats": {"total_inactive_file": 6_000}}
    v2 = {"usage": 5_000, "stats": {"inactive_file": 1_000}}
    assert engine.working_set(v1) == 2_000
    assert engine.working_set(v2) == 4_000
    assert engine.working_set({}) == 0


def test_job_env_carries_plan_and_recipe_but_no_host_secrets(
    demo: build.Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    job = plan_matrix(demo.mf).jobs[1]
    parallel = jobmemory.initial_parallelism(
        recipe=demo.mf.recipe, archs=2, limit_bytes=8 * 2**30, cpus=2, package="p", version="1"
    )
    env = job_run(demo, job).container_env(parallel)
    assert env["DEMO_CUDA_ARCHS"] == "9.0;12.0"
    assert env["DEMO_LOCAL_VERSION"] == "cu13.0.torch2.14.abi1.sm90.120"
    # The admission wrapper bounds memory per compile, so ninja may run more jobs than fit by estimate alone.
    assert env["MAX_JOBS"] == str(parallel.ninja_jobs) and parallel.ninja_jobs >= parallel.max_jobs
    assert env["PYTORCH_NVCC"] == NVCC_LAUNCHER
    assert env["FACTORY_MEM_LIMIT"] == str(demo.context.memory_limit)
    assert env["FACTORY_REQUIREMENTS"].splitlines()[0] == "torch==2.14.*"
    assert not any(k.startswith("AWS") for k in env)
    assert "do-not-leak" not in "".join(env.values())


def test_requirements_are_deduplicated_and_start_with_torch(demo: build.Runner) -> None:
    job = plan_matrix(demo.mf).jobs[0]
    reqs = jobspec.requirements(demo.mf, job)
    assert reqs[0] == "torch==2.14.*"
    assert len(reqs) == len(set(reqs))
    assert "ninja" in reqs and "pip" in reqs


def test_container_memory_prefers_cli_then_file(demo: build.Runner, tmp_path: Path) -> None:
    assert build.container_memory(demo.mf, build.BuildSettings(output=tmp_path)) == 8 * 2**30
    assert build.container_memory(demo.mf, build.BuildSettings(output=tmp_path, memory=2**30)) == 2**30


def test_container_limits_never_sum_past_the_budget(demo: build.Runner, tmp_path: Path) -> None:
    import dataclasses

    from factory.core.errors import ConfigError

    opts = dataclasses.replace(demo.mf.build, concurrency=3, memory=None, memory_budget=12 * 2**30)
    mf = dataclasses.replace(demo.mf, build=opts)
    assert build.container_memory(mf, build.BuildSettings(output=tmp_path)) == 4 * 2**30
    with pytest.raises(ConfigError, match="exceed the memory budget"):
        build.container_memory(mf, build.BuildSettings(output=tmp_path, memory=5 * 2**30))


def test_log_tail_skips_factory_markers(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)) + '::factory:: {"phase": "build"}\n')
    tail = jobrun.log_tail(log, lines=3)
    assert tail == ["line 97", "line 98", "line 99"]
    assert jobrun.log_tail(tmp_path / "missing.log") == []


def test_report_json_has_no_live_only_fields() -> None:
    r = report.JobResult(job_id="j", variant_id="v", python="3.11", result="ok")
    r.phase, r.mem_now = "build", 5
    data = report.BuildReport(run_id="x", matrix="m.yaml", started=0.0, jobs=[r]).to_json()
    assert data["ok"] is True
    keys = {"job_id", "variant_id", "python", "result", "wheel", "attempts", "log_tail"}
    assert set(data["jobs"][0]) >= keys
    assert "phase" not in data["jobs"][0] and "mem_now" not in data["jobs"][0]


def test_log_tail_leads_with_errors_that_scrolled_out(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    lines = ["[1/5] nvcc a.cu", "csrc/scale.cu(3): error: #error DEMO_FAIL_COMPILE", "FAILED: scale.o"]
    lines += [f"  File traceback {i}" for i in range(60)]
    log.write_text("\n".join(lines) + "\n")
    tail = jobrun.log_tail(log, lines=5)
    assert tail[:2] == ["csrc/scale.cu(3): error: #error DEMO_FAIL_COMPILE", "FAILED: scale.o"]
    assert tail[2] == "..."
    assert tail[-1] == "  File traceback 59"


def test_ninja_progress_counts_finished_edges_and_not_failed_ones() -> None:
    log = "\n".join([
        "  [1/9] nvcc light1.cu", "  [2/9] nvcc light2.cu", "  [3/9] nvcc heavy1.cu", "  FAILED: heavy1.o",
        "  Killed", "irrelevant [7/8] text",
    ])  # fmt: skip
    assert jobrun.ninja_progress(log) == (2, 9)
    assert jobrun.ninja_progress("no ninja here") is None


def test_job_env_hands_the_learned_profile_to_the_wrappers_in_the_job_s_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "home"))
    mf = load_matrix_file(ROOT / "examples" / "demo.yaml")
    runner = build.Runner(None, mf, build.BuildSettings(output=tmp_path / "out", run_id="r1"))
    entry = ProfileEntry(peak_bytes=2**30, wall_s=3.0, samples=15, envelope=(2**30,), rise=(2**30,))
    learned = profiles.Profile(
        package=mf.package.name, version=mf.package.version, entries={"k.cu|compute_90|1": entry}
    )
    profiles.save_profile(learned, profiles.profile_path(mf.package.name, mf.package.version))
    job = plan_matrix(mf).jobs[0]
    parallel = jobmemory.initial_parallelism(
        recipe=mf.recipe, archs=1, limit_bytes=8 * 2**30, cpus=2, package="p", version="1"
    )
    run = job_run(runner, job)
    env = run.container_env(parallel)
    # the container reads it where the job's snapshot directory is mounted
    assert env["FACTORY_PROFILE_IN"] == f"{jobmemory.PROFILE_DIR}/profile.json"
    snapshot = run.profile_dir / "profile.json"
    assert json.loads(snapshot.read_text())["entries"] == learned.to_json()["entries"]
    assert run.profile_dir.is_relative_to(tmp_path / "home")


def test_an_output_that_cannot_be_a_directory_stops_the_build_before_any_container(tmp_path: Path) -> None:
    mf = load_matrix_file(ROOT / "examples" / "demo.yaml")
    taken = tmp_path / "wheels"
    taken.write_text("a file")
    jobs = list(plan_matrix(mf).jobs)
    # client None: reaching Docker would fail differently; the check comes first
    with pytest.raises(ConfigError, match=r"--output .*/wheels: cannot make the directory \(File exists\)"):
        build.run_build(None, mf, jobs, build.BuildSettings(output=taken, run_id="r1"))
    assert taken.read_text() == "a file"


def test_build_says_an_output_that_is_a_file_in_one_line(
    tmp_path: Path, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    taken = tmp_path / "wheels"
    taken.write_text("a file")
    code, output = factory_cli(
        ["build", "--matrix", str(ROOT / "examples" / "demo.yaml"), "--output", str(taken), "--dry-run"]
    )
    assert code == 2
    assert output.strip() == f"error: --output {taken}: exists and is not a directory"
