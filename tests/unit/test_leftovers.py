"""What killed runs and publishes leave behind: owner liveness, temporaries' names, and their removal."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from factory import leftovers
from factory.stores import LocalStore, is_stale_tmp, tmp_prefix, tmp_writer


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_liveness() -> None:
    here = socket.gethostname()
    assert leftovers.is_alive(leftovers.Owner(pid=os.getpid(), host=here))
    assert not leftovers.is_alive(leftovers.Owner(pid=dead_pid(), host=here))
    # another host's process cannot be checked from here: it counts as alive
    assert leftovers.is_alive(
        leftovers.Owner(pid=12345, host="elsewhere"), host="here", pid_exists=lambda _p: False
    )
    assert not leftovers.is_alive(
        leftovers.Owner(pid=12345, host="here"), host="here", pid_exists=lambda _p: False
    )


@pytest.mark.parametrize(
    ("owner", "age_s", "stale"),
    [
        (leftovers.Owner(pid=1, host="h"), 10.0, False),  # alive
        (leftovers.Owner(pid=2, host="h"), 10.0, True),  # gone
        (leftovers.Owner(pid=2, host="other"), 10.0, False),  # cannot tell
        (None, 10.0, False),  # no owner, young: maybe a run that just made it
        (None, leftovers.UNOWNED_AGE_S + 1, True),
    ],
)
def test_output_dir_staleness(owner: leftovers.Owner | None, age_s: float, stale: bool) -> None:
    alive = {1}
    got = leftovers.is_stale_output_dir(owner, age_s=age_s, host="h", pid_exists=lambda p: p in alive)
    assert got is stale


def test_remove_stale_output_dirs(tmp_path: Path) -> None:
    live = leftovers.output_tmp_dir(tmp_path, job_id="a-b-cu126-py3.12", run_id="0123456789ab")
    leftovers.make_output_tmp_dir(live)
    assert leftovers.read_owner(live) == leftovers.this_process()
    dead = leftovers.output_tmp_dir(tmp_path, job_id="a-b-cu126-py3.12", run_id="ba9876543210")
    dead.mkdir()
    (dead / leftovers.OWNER_FILE).write_text(json.dumps({"pid": dead_pid(), "host": socket.gethostname()}))
    (dead / "x.whl").write_bytes(b"half")
    unowned_old = tmp_path / ".tmp-old-000000000000"
    unowned_old.mkdir()
    os.utime(unowned_old, (1.0, 1.0))
    unowned_new = tmp_path / ".tmp-new-111111111111"
    unowned_new.mkdir()
    wheel = tmp_path / "kept-1.0-cp312-cp312-linux_x86_64.whl"
    wheel.write_bytes(b"w")
    assert leftovers.remove_stale_output_dirs(tmp_path) == sorted([dead, unowned_old])
    assert live.is_dir() and unowned_new.is_dir() and wheel.is_file()
    assert not dead.exists() and not unowned_old.exists()
    assert leftovers.remove_stale_output_dirs(tmp_path / "missing") == []


def test_tmp_names_carry_their_writer() -> None:
    prefix = tmp_prefix("flash_attn-2.7.4-cp312-cp312-linux_x86_64.whl")
    name = f"{prefix}k3_x9abc.tmp"
    writer = tmp_writer(name)
    assert writer == leftovers.Owner(pid=os.getpid(), host=leftovers.host_tag())
    assert tmp_writer(".index.html.k3_x9abc.tmp") is None  # an older factory's name: no writer in it
    assert leftovers.host_tag("build.example.org") == "build-example-org"


@pytest.mark.parametrize(
    ("name", "age_s", "stale"),
    [
        (".a.whl.h.1.xyz.tmp", 5.0, False),  # live writer
        (".a.whl.h.1.xyz.tmp", 7200.0, False),  # live writer, however long it takes
        (".a.whl.h.2.xyz.tmp", 5.0, True),  # writer gone
        (".a.whl.other.2.xyz.tmp", 5.0, False),  # another host's: only age tells
        (".a.whl.other.2.xyz.tmp", 7200.0, True),
        (".a.whl.xyz.tmp", 5.0, False),  # no writer in the name: only age tells
        (".a.whl.xyz.tmp", 7200.0, True),
    ],
)
def test_tmp_staleness(name: str, age_s: float, stale: bool) -> None:
    assert is_stale_tmp(name, age_s=age_s, host="h", pid_exists=lambda p: p == 1) is stale


def test_next_publish_removes_a_killed_writers_temporaries(tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    host = leftovers.host_tag()
    dead = files / f".x-1.0-py3-none-any.whl.{host}.{dead_pid()}.abc123.tmp"
    dead.write_bytes(b"half a wheel")
    live = files / f".y-1.0-py3-none-any.whl.{host}.{os.getpid()}.abc123.tmp"
    live.write_bytes(b"being written")
    store = LocalStore(tmp_path)
    store.put("simple/x/index.html", b"<html/>", content_type="text/html", cache_control="no-cache")
    assert not dead.exists() and live.exists()
    assert (tmp_path / "simple" / "x" / "index.html").read_bytes() == b"<html/>"
    assert sorted(p.name for p in tmp_path.rglob("*.tmp")) == [live.name]
