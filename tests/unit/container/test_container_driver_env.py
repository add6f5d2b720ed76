"""The driver's environment (`protocol.DriverEnv`): what the host writes for each phase
(`factory.build.jobspec`)
reads back in the container, under the names the images' scripts know."""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path

import pytest

from factory.build import jobspec
from factory.container import driver, heartbeat, protocol
from factory.container.protocol import DriverEnv, WrapperEnv

FULL = DriverEnv(
    job_dir="/var/factory/jobs/j-r1",
    owner='{"pid": 1, "host": "h"}\n',
    python="python3.12",
    heartbeat="/run/factory-heartbeat/beat",
    heartbeat_stale_s=2.5,
    cuda="12.8",
    requirements=("torch==2.9.*", "pip", "ninja"),
    limited_api="cp311",
    shard="1/2",
    wheel="demo-1.0-cp311-abi3-linux_x86_64.whl",
    import_check="import demo\nprint(demo)",
)


def test_every_field_reads_back_from_its_variable() -> None:
    env = FULL.to_env()
    assert set(env) == set(DriverEnv.NAMES)  # no field at its default: every variable written
    assert DriverEnv.from_env(env) == FULL
    for f in dataclasses.fields(DriverEnv):
        one = DriverEnv(**{f.name: getattr(FULL, f.name)})
        assert len(one.to_env()) == 1 and DriverEnv.from_env(one.to_env()) == one


def test_the_variables_keep_their_names() -> None:
    env = FULL.to_env()
    assert env["FACTORY_JOB_DIR"] == "/var/factory/jobs/j-r1"
    assert env["FACTORY_PYTHON"] == "python3.12"
    assert env["FACTORY_REQUIREMENTS"] == "torch==2.9.*\npip\nninja"  # one a line
    assert env["FACTORY_HEARTBEAT_STALE_S"] == "2.5"
    assert env["FACTORY_PY_LIMITED_API"] == "cp311"
    assert env["FACTORY_SHARD"] == "1/2"
    assert env["FACTORY_IMPORT_CHECK"] == "import demo\nprint(demo)"


def test_defaults_are_not_written_and_unset_or_empty_reads_as_default() -> None:
    assert DriverEnv().to_env() == {}
    assert DriverEnv.from_env(dict.fromkeys(DriverEnv.NAMES, "")) == DriverEnv()
    assert DriverEnv.from_env({"FACTORY_REQUIREMENTS": "\n\n"}).requirements == ()


def test_a_stale_time_the_driver_would_refuse_never_leaves_the_host() -> None:
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="FACTORY_HEARTBEAT_STALE_S="):
            DriverEnv(heartbeat_stale_s=bad)
    with pytest.raises(ValueError, match="FACTORY_HEARTBEAT_STALE_S='soon'"):
        DriverEnv.from_env({"FACTORY_HEARTBEAT_STALE_S": "soon"})


def test_the_two_descriptions_share_only_the_job_dir() -> None:
    # the wrapper reads the job's directory too (the compile cache's @JOB@); no other variable has two readers
    assert set(DriverEnv.NAMES) & set(WrapperEnv.NAMES) == {protocol.ENV_JOB_DIR}


def test_each_phase_of_a_job_reads_what_the_host_wrote(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    owner = '{"pid": 1, "host": "h"}\n'
    env = jobspec.driver_env(
        job_dir=str(tmp_path / "j-r1"), python="3.13", owner=owner, heartbeat_stale_s=30.0, compile_cache=None
    )
    env = jobspec.check_env(env, wheel="w.whl", import_name="demo")
    for name in DriverEnv.NAMES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    read = driver.environment()
    assert read.python == "python3.13" and read.wheel == "w.whl" and read.heartbeat_stale_s == 30.0
    assert read.heartbeat == f"{heartbeat.MOUNT}/{heartbeat.FILE_NAME}"
    assert driver.job_dir() == tmp_path / "j-r1"
    driver.claim(driver.job_dir())
    assert (tmp_path / "j-r1" / protocol.OWNER_FILE).read_text() == '{"pid": 1, "host": "h"}\n'


def test_a_missing_job_dir_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FACTORY_JOB_DIR", raising=False)
    with pytest.raises(SystemExit, match=r"^factory: FACTORY_JOB_DIR is not set$"):
        driver.job_dir()


def test_the_heartbeat_watch_follows_the_description(tmp_path: Path) -> None:
    assert heartbeat.start_watch(heartbeat.Children(), {}) is None
    beat = tmp_path / "beat"
    heartbeat.touch(beat)
    env = DriverEnv(heartbeat=str(beat), heartbeat_stale_s=3600.0).to_env()
    thread = heartbeat.start_watch(heartbeat.Children(), {**os.environ, **env})
    assert isinstance(thread, threading.Thread) and thread.daemon and thread.is_alive()
