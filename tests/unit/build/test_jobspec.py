"""A job's containers as data (`factory.build.jobspec`): environments, mounts and limits from the job
alone."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from factory.build import jobspec
from factory.cache import sync
from factory.container import CONTAINER_DIR, DRIVER, PACKAGE_MOUNT, heartbeat, protocol
from factory.memory import jobmemory
from factory.plan.plan import Job, plan_matrix
from factory.plan.shard import Shard
from factory.spec.config import MatrixFile, load_matrix_file

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def mf() -> MatrixFile:
    return load_matrix_file(ROOT / "examples" / "demo.yaml")


@pytest.fixture(scope="module")
def job(mf: MatrixFile) -> Job:
    return plan_matrix(mf).jobs[0]


def driver(*, compile_cache: sync.CacheConfig | None = None, python: str = "3.11") -> dict[str, str]:
    return jobspec.driver_env(
        job_dir=jobspec.job_dir("j", "r1"),
        python=python,
        owner='{"pid": 1, "host": "h"}',
        heartbeat_stale_s=30.0,
        compile_cache=compile_cache,
    )


def test_a_job_dir_is_per_job_and_run_in_the_work_volume() -> None:
    assert jobspec.job_dir("cu130-py311", "abc") == f"{jobspec.JOBS_ROOT}/cu130-py311-abc"
    assert jobspec.JOBS_ROOT.startswith(jobspec.WORK_MOUNT + "/")


def test_the_driver_env_is_built_from_scratch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    env = driver(python="3.13")
    assert env["FACTORY_PYTHON"] == "python3.13"
    assert env["FACTORY_JOB_DIR"] == f"{jobspec.JOBS_ROOT}/j-r1"
    assert env[protocol.ENV_JOB_OWNER] == '{"pid": 1, "host": "h"}'
    assert env[protocol.ENV_HEARTBEAT_STALE_S] == "30"
    assert "do-not-leak" not in env.values() and "PATH" not in env
    assert sync.ENV_DIR not in env and sync.ENV_CHECK_HITS not in env


@pytest.mark.parametrize("check_hits", [0, 3])
def test_the_compile_cache_is_local_paths_only(tmp_path: Path, check_hits: int) -> None:
    config = sync.CacheConfig(local=tmp_path, store="s3://bucket/secret", check_hits=check_hits)
    env = driver(compile_cache=config)
    assert env[sync.ENV_DIR] == sync.MOUNT and env[sync.ENV_OUT] == sync.OUT_MOUNT
    assert env.get(sync.ENV_CHECK_HITS) == (str(check_hits) if check_hits else None)
    assert not [v for v in env.values() if "secret" in v or str(tmp_path) in v]


def test_the_matrix_env_wins_over_the_memory_plan(mf: MatrixFile, job: Job) -> None:
    memory = {"MAX_JOBS": "4", "NVCC_THREADS": "2"}
    env = jobspec.container_env(mf, dataclasses.replace(job, env={"MAX_JOBS": "1"}), driver={}, memory=memory)
    assert env["MAX_JOBS"] == "1" and env["NVCC_THREADS"] == "2"
    assert env["FACTORY_CUDA"] == job.variant.cuda
    assert env["FACTORY_REQUIREMENTS"].splitlines() == jobspec.requirements(mf, job)
    assert protocol.ENV_SHARD not in env and protocol.ENV_PREFLIGHT not in env


def test_a_memory_plan_s_env_is_the_build_s(mf: MatrixFile, job: Job) -> None:
    """The env the memory plan writes (`jobmemory.wrapper_env`) goes into the container as it is."""
    parallel = jobmemory.initial_parallelism(
        recipe=mf.recipe, archs=1, limit_bytes=8 * 2**30, cpus=2, package="p", version="1"
    )
    memory = jobmemory.wrapper_env(parallel, recipe=mf.recipe, job_dir="/j", memory_limit=8 * 2**30)
    env = jobspec.container_env(mf, job, driver=driver(), memory=memory)
    assert all(env[k] == v for k, v in memory.items() if k not in job.env)


def test_a_shard_and_a_preflight_say_their_sources(mf: MatrixFile, job: Job) -> None:
    shard = Shard(index=1, count=2)
    env = jobspec.container_env(mf, job, driver={}, memory={}, shard=shard, shard_sources=("a.cu", "b.cu"))
    assert env[protocol.ENV_SHARD] == "1/2" and json.loads(env[protocol.ENV_SHARD_SOURCES]) == [
        "a.cu",
        "b.cu",
    ]
    assert protocol.ENV_SHARD not in jobspec.container_env(mf, job, driver={}, memory={}, shard=shard)
    env = jobspec.container_env(mf, job, driver={}, memory={}, preflight_candidates=("c.cu",))
    assert json.loads(env[protocol.ENV_PREFLIGHT]) == ["c.cu"]


def test_the_check_env_names_the_wheel_and_its_import(job: Job) -> None:
    env = jobspec.check_env(driver(), wheel="x-1-py3-none-any.whl", import_name="factory_demo_ext")
    assert env["FACTORY_WHEEL"] == "x-1-py3-none-any.whl"
    assert "factory_demo_ext" in env["FACTORY_IMPORT_CHECK"]
    assert env["FACTORY_PYTHON"] == "python3.11"


def build_mounts(tmp_path: Path, **extra: object) -> dict[str, dict[str, str]]:
    return jobspec.job_mounts(
        source=tmp_path / "src",
        wheelhouse=tmp_path / "wh",
        out_dir=tmp_path / "out",
        profile_dir=tmp_path / "profile",
        heartbeat_dir=tmp_path / "hb",
        **extra,  # type: ignore[arg-type]
    )


def test_only_the_work_volume_and_the_output_are_written(tmp_path: Path) -> None:
    mounts = build_mounts(tmp_path)
    written = {host for host, m in mounts.items() if m["mode"] != "ro"}
    assert written == {jobspec.WORK_VOLUME, str(tmp_path / "out")}
    binds = {m["bind"]: host for host, m in mounts.items()}
    assert binds["/src"] == str(tmp_path / "src") and binds[PACKAGE_MOUNT] == str(CONTAINER_DIR)
    assert binds[heartbeat.MOUNT] == str(tmp_path / "hb") and binds[jobmemory.PROFILE_DIR] == str(
        tmp_path / "profile"
    )
    assert jobspec.CHECK_WHEELHOUSE_MOUNT not in binds


def test_the_cache_and_check_wheelhouse_mounts_join_when_given(tmp_path: Path) -> None:
    cached = {str(tmp_path / "domain"): {"bind": sync.MOUNT, "mode": "ro"}}
    mounts = build_mounts(tmp_path, check_wheelhouse=tmp_path / "check", cache_mounts=cached)
    assert mounts[str(tmp_path / "domain")] == {"bind": sync.MOUNT, "mode": "ro"}
    assert mounts[str(tmp_path / "check")] == {"bind": jobspec.CHECK_WHEELHOUSE_MOUNT, "mode": "ro"}


def test_the_install_check_reads_the_host_s_copy_of_the_wheel(tmp_path: Path) -> None:
    mounts = build_mounts(tmp_path, check_wheelhouse=tmp_path / "check")
    checked = jobspec.check_mounts(mounts, wheel_dir=tmp_path / "host-copy")
    binds = {m["bind"]: (host, m["mode"]) for host, m in checked.items()}
    assert binds["/out"] == (str(tmp_path / "host-copy"), "ro")
    assert binds["/wheelhouse"] == (str(tmp_path / "wh"), "ro")
    assert mounts[str(tmp_path / "out")] == {"bind": "/out", "mode": "rw"}  # the build's, unchanged


def test_another_python_s_check_gets_its_wheelhouses(tmp_path: Path) -> None:
    mounts = build_mounts(tmp_path, check_wheelhouse=tmp_path / "check")
    checked = jobspec.check_mounts(
        mounts,
        wheel_dir=tmp_path / "copy",
        wheelhouse=tmp_path / "wh313",
        check_wheelhouse=tmp_path / "chk313",
    )
    binds = {m["bind"]: host for host, m in checked.items()}
    assert binds["/wheelhouse"] == str(tmp_path / "wh313")
    assert binds[jobspec.CHECK_WHEELHOUSE_MOUNT] == str(tmp_path / "chk313")
    assert str(tmp_path / "wh") not in checked and str(tmp_path / "check") not in checked
    # without a check wheelhouse of its own, the build's is not used for another Python
    alone = jobspec.check_mounts(mounts, wheel_dir=tmp_path / "copy", wheelhouse=tmp_path / "wh313")
    assert jobspec.CHECK_WHEELHOUSE_MOUNT not in {m["bind"] for m in alone.values()}


def test_the_clean_phase_mounts_the_volume_the_driver_and_the_heartbeat(tmp_path: Path) -> None:
    binds = {m["bind"]: m["mode"] for m in jobspec.clean_mounts(tmp_path / "hb").values()}
    assert binds == {jobspec.WORK_MOUNT: "rw", PACKAGE_MOUNT: "ro", heartbeat.MOUNT: "ro"}


@pytest.mark.parametrize(("offline", "network"), [(True, "none"), (False, "bridge")])
def test_limits_follow_the_matrix(mf: MatrixFile, offline: bool, network: str) -> None:
    build = dataclasses.replace(mf.build, offline=offline, pids_limit=99)
    limits = jobspec.limits(build, memory_limit=2**33, cpus=1.5)
    assert (limits.memory_bytes, limits.cpus, limits.pids, limits.network) == (2**33, 1.5, 99, network)


def test_a_driver_phase_is_one_frozen_spec(mf: MatrixFile, tmp_path: Path) -> None:
    limits = jobspec.limits(mf.build, memory_limit=2**33, cpus=2)
    mounts = build_mounts(tmp_path)
    spec = jobspec.driver_container("check", image="img:1", env={"A": "1"}, mounts=mounts, limits=limits)
    assert spec.command == (*DRIVER, "check") and spec.image == "img:1"
    assert spec.user == jobspec.CONTAINER_USER and spec.working_dir == jobspec.WORK_MOUNT
    assert spec.mounts == mounts and spec.mounts is not mounts
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.image = "other"  # type: ignore[misc]


def test_the_build_reads_the_sources_date(mf: MatrixFile, job: Job) -> None:
    env = jobspec.container_env(mf, job, driver={}, memory={}, source_date_epoch=1_700_000_000)
    assert env["SOURCE_DATE_EPOCH"] == "1700000000"
    assert "SOURCE_DATE_EPOCH" not in jobspec.container_env(mf, job, driver={}, memory={})
