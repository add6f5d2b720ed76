"""What killed runs and publishes leave behind: owner liveness, temporaries' names, and their removal."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from factory.container import driver, protocol
from factory.core import leftovers
from factory.publish.stores import LocalStore, is_stale_tmp, tmp_prefix, tmp_writer


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


# --- the work volume's job directories ---------------------------------------------------------------------


def job_dir(name: str, owner: leftovers.Owner | None = None, idle_s: float = 0.0) -> protocol.JobDir:
    text = None if owner is None else leftovers.owner_json(owner)
    return protocol.JobDir(name=name, owner=text, idle_s=idle_s)


def test_stale_job_dirs_follow_the_output_dirs_rule() -> None:
    dirs = [
        job_dir("demo-py3.11-aaaaaaaaaaaa", leftovers.Owner(pid=1, host="h")),  # alive
        job_dir("demo-py3.11-bbbbbbbbbbbb", leftovers.Owner(pid=2, host="h")),  # gone
        job_dir("demo-py3.12-bbbbbbbbbbbb", leftovers.Owner(pid=2, host="h"), idle_s=1e9),  # gone
        job_dir("demo-py3.11-cccccccccccc", leftovers.Owner(pid=2, host="other")),  # cannot tell
        job_dir("demo-py3.11-dddddddddddd", idle_s=10.0),  # no owner, busy lately
        job_dir("demo-py3.11-eeeeeeeeeeee", idle_s=leftovers.UNOWNED_AGE_S + 1),  # no owner, idle long
        protocol.JobDir(name="demo-py3.11-ffffffffffff", owner="garbage", idle_s=leftovers.UNOWNED_AGE_S + 1),
        protocol.JobDir(name="demo-py3.11-000000000000", owner="garbage", idle_s=5.0),
    ]
    stale = leftovers.stale_job_dirs(dirs, running_runs=(), host="h", pid_exists=lambda p: p == 1)
    assert stale == [
        "demo-py3.11-bbbbbbbbbbbb",
        "demo-py3.12-bbbbbbbbbbbb",
        "demo-py3.11-eeeeeeeeeeee",
        "demo-py3.11-ffffffffffff",
    ]


def test_a_job_dir_whose_run_has_a_running_container_stays() -> None:
    dead = leftovers.Owner(pid=2, host="h")
    dirs = [job_dir("demo-py3.11-bbbbbbbbbbbb", dead), job_dir("x-eeeeeeeeeeee", idle_s=1e9)]
    running = {"bbbbbbbbbbbb", "eeeeeeeeeeee"}
    assert leftovers.stale_job_dirs(dirs, running_runs=running, host="h", pid_exists=lambda _p: False) == []
    # a run id is the name's whole last part: another run's id that ends alike is not it
    assert leftovers.stale_job_dirs(
        dirs, running_runs={"bbbbbbbbbbb"}, host="h", pid_exists=lambda _p: False
    ) == ["demo-py3.11-bbbbbbbbbbbb", "x-eeeeeeeeeeee"]


def test_the_driver_lists_and_removes_what_the_host_chose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The driver's `jobs` and `remove-jobs` phases on a directory, the host's choice between them."""
    root = tmp_path / "jobs"
    dead, live = root / "demo-py3.11-bbbbbbbbbbbb", root / "demo-py3.11-aaaaaaaaaaaa"
    gone = leftovers.Owner(pid=dead_pid(), host=socket.gethostname())
    monkeypatch.setenv(protocol.ENV_JOB_OWNER, leftovers.owner_json(gone))
    driver.claim(dead)
    (dead / "src" / "build").mkdir(parents=True)
    monkeypatch.setenv(protocol.ENV_JOB_OWNER, leftovers.owner_json())
    driver.claim(live)
    unowned_old, unowned_busy = root / "old-cccccccccccc", root / "busy-dddddddddddd"
    (unowned_old / "src").mkdir(parents=True)
    (unowned_busy / "src" / "build").mkdir(parents=True)
    for path in (unowned_old / "src", unowned_old, unowned_busy, unowned_busy / "src"):
        os.utime(path, (1.0, 1.0))  # the busy one's build tree alone changed lately
    (root / "stray-file").write_text("x")

    driver.list_jobs(root)
    listed = protocol.parse_job_listing(capsys.readouterr().out)
    assert [d.name for d in listed] == sorted(p.name for p in (dead, live, unowned_old, unowned_busy))
    assert leftovers.parse_owner(listed[1].owner) == leftovers.this_process()
    chosen = leftovers.stale_job_dirs(listed, running_runs=())
    assert chosen == [dead.name, unowned_old.name]

    driver.remove_jobs(root, chosen)
    assert protocol.parse_removed(capsys.readouterr().out) == chosen
    assert sorted(p.name for p in root.iterdir()) == sorted([live.name, unowned_busy.name, "stray-file"])
    with pytest.raises(SystemExit):
        driver.remove_jobs(root, ["../jobs"])
    driver.list_jobs(tmp_path / "missing")
    assert protocol.parse_job_listing(capsys.readouterr().out) == []


@pytest.mark.parametrize(
    ("name", "age_s", "stale"),
    [
        (".partial-h.1.xyz", 7200.0, False),  # live owner, however long it takes
        (".partial-h.2.xyz", 5.0, True),  # owner gone
        (".partial-other.2.xyz", 5.0, False),  # another host's: only age tells
        (".partial-other.2.xyz", 7200.0, True),
        (".partial-xyz", 5.0, False),  # an older factory's, no owner in the name: only age tells
        (".partial-xyz", 7200.0, True),
    ],
)
def test_partial_staleness_is_the_rule_of_named_temporaries(name: str, age_s: float, stale: bool) -> None:
    owner = leftovers.partial_owner(name)
    assert leftovers.is_stale_named(owner, age_s=age_s, host="h", pid_exists=lambda p: p == 1) is stale


def test_partial_prefix_names_this_process() -> None:
    assert leftovers.partial_owner(leftovers.partial_prefix() + "abc") == leftovers.Owner(
        pid=os.getpid(), host=leftovers.host_tag()
    )
