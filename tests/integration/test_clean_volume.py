"""`factory clean` in the real work volume: a dead run's job directories go, a live run's stay (dockerd and a
builder image; a few seconds)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import uuid
from typing import Any

import pytest

from factory.build import cleanup, engine, images, jobspec
from factory.core import leftovers

pytestmark = [pytest.mark.integration]


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_clean_removes_dead_runs_job_dirs_from_the_work_volume(docker_client: Any) -> None:
    image = images.housekeeping_image(images.list_images(docker_client))
    if image is None:
        pytest.skip("no builder image on this host")
    box = engine.Engine(docker_client, labels=engine.run_labels("test-clean"), stop=threading.Event())
    volume = {jobspec.WORK_VOLUME: {"bind": jobspec.WORK_MOUNT, "mode": "rw"}}
    box.ensure_volume(jobspec.WORK_VOLUME)
    root = jobspec.JOBS_ROOT
    box.run_short(  # as the build does before its first job: the volume belongs to the build user
        image,
        ["sh", "-c", f"mkdir -p {root} && chown {jobspec.CONTAINER_USER} {jobspec.WORK_MOUNT} {root}"],
        user="0:0",
        cap_add=["CHOWN"],
        mounts=volume,
    )
    here = socket.gethostname()
    run = uuid.uuid4().hex[:12]
    dead, live, old = f"demo-py3.11-{run}", f"demo-py3.12-{run[::-1]}", f"old-{run[:6]}{run[:6]}"
    script = (
        f"cd {root} && mkdir -p {dead}/src/build {live}/src {old}/src"
        f' && printf %s "$DEAD" > {dead}/.owner && printf %s "$LIVE" > {live}/.owner'
        f" && touch -d @1 {old}/src {old}"
    )
    env = {
        "DEAD": leftovers.owner_json(leftovers.Owner(pid=dead_pid(), host=here)),
        "LIVE": leftovers.owner_json(),  # this test's own process: alive
    }
    box.run_short(image, ["sh", "-c", script], user=jobspec.CONTAINER_USER, mounts=volume, env=env)
    try:
        removed = cleanup.remove_stale_job_dirs(docker_client, image=image)
        assert f"{root}/{dead}" in removed and f"{root}/{old}" in removed
        assert f"{root}/{live}" not in removed
        left = box.run_short(image, ["ls", root], user=jobspec.CONTAINER_USER, mounts=volume).split()
        assert live in left and dead not in left and old not in left
    finally:
        box.run_short(
            image,
            ["rm", "-rf", f"{root}/{dead}", f"{root}/{live}", f"{root}/{old}"],
            user=jobspec.CONTAINER_USER,
            mounts=volume,
        )
