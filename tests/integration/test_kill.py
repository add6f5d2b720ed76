"""`kill -9` of a factory mid-build: its build container stops by itself, and `factory clean` removes what
the dead run left (the stopped container, the temporary output directory, its job's directory in the work
volume)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from test_build import FACTORY, ROOT, demo_matrix, run_factory

from factory.build import engine, jobspec
from factory.container import heartbeat, protocol

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STALE_S = 15


def build_containers(client: Any, pid: int, *, running_only: bool) -> list[Any]:
    """The driver's build containers of the factory process `pid` (not its short housekeeping ones)."""
    found = client.containers.list(all=not running_only, filters={"label": f"{engine.PID_LABEL}={pid}"})
    return [c for c in found if "factory.container.driver" in " ".join(c.attrs["Config"]["Cmd"] or [])]


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1)


def test_a_killed_factorys_container_stops_by_itself(tmp_path: Path, docker_client: Any) -> None:
    matrix = demo_matrix(tmp_path, arch=["8.0"])
    out = tmp_path / "w"
    env = {**os.environ, protocol.ENV_HEARTBEAT_STALE_S: str(STALE_S)}
    proc = subprocess.Popen(
        # the cache off: an earlier test's demo objects would end the build before the heartbeat goes stale
        [*FACTORY, "build", "--trust-paths", "--matrix", str(matrix), "--output", str(out), "--cache", "off"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: proc.poll() is not None or build_containers(docker_client, proc.pid, running_only=True),
            900,
            "the build container",
        )
        assert proc.poll() is None, "the build ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # no rerun: the container itself sees the heartbeat stop and ends
        wait_until(
            lambda: not build_containers(docker_client, proc.pid, running_only=True),
            120,
            "the container to stop",
        )
        (stopped,) = build_containers(docker_client, proc.pid, running_only=False)
        assert stopped.attrs["State"]["ExitCode"] == heartbeat.EXIT_ORPHANED
        tmp_dirs = list(out.glob(".tmp-*"))
        assert tmp_dirs, "the killed run's temporary output directory should still be there"

        cleaned = run_factory("clean", "--output", str(out))
        assert cleaned.returncode == 0, cleaned.stderr
        assert f"removed container {stopped.name}" in cleaned.stdout.splitlines()
        assert f"removed {tmp_dirs[0]}" in cleaned.stdout.splitlines()
        volume_dir = f"removed {jobspec.WORK_VOLUME}:{jobspec.JOBS_ROOT}/"
        run_id = stopped.labels[engine.RUN_LABEL]
        assert [
            line
            for line in cleaned.stdout.splitlines()
            if line.startswith(volume_dir) and line.endswith(f"-{run_id}")
        ], cleaned.stdout
        assert build_containers(docker_client, proc.pid, running_only=False) == []
        assert not list(out.glob(".tmp-*"))
    finally:
        if proc.poll() is None:
            proc.kill()
        for container in build_containers(docker_client, proc.pid, running_only=False):
            container.remove(force=True)


def test_sigterm_mid_build_is_an_interruption_not_a_failed_build(tmp_path: Path, docker_client: Any) -> None:
    """CI cancelling a run (SIGTERM) while a job compiles: the job was interrupted, and says so, not
    "build exited with code 137" as if the build had failed; the run exits 130 and removes its container."""
    matrix = demo_matrix(tmp_path, arch=["8.0"])
    out = tmp_path / "w"
    said = tmp_path / "said.txt"
    argv = [*FACTORY, "build", "--trust-paths", "--matrix", str(matrix), "--output", str(out)]
    with said.open("w") as sink:
        # the cache off: an earlier test's demo objects would end the build before the signal
        proc = subprocess.Popen([*argv, "--cache", "off"], cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
        try:
            wait_until(
                lambda: (
                    proc.poll() is not None or build_containers(docker_client, proc.pid, running_only=True)
                ),
                900,
                "the build container",
            )
            assert proc.poll() is None, "the build ended before it could be stopped"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=120) == 130
        finally:
            if proc.poll() is None:
                proc.kill()
    (job,) = json.loads((out / "report.json").read_text())["jobs"]
    assert job["result"] == "interrupted", job
    assert job["reason"].startswith("interrupted by SIGTERM"), job["reason"]
    text = said.read_text()
    assert "exited with code" not in text and "exited with code" not in json.dumps(job)
    assert build_containers(docker_client, proc.pid, running_only=False) == []
