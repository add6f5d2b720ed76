"""`factory clean`: a dead run's temporary output and a dead publish's temporaries go, live ones stay."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from factory.cli import app
from factory.core import leftovers


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_clean_removes_dead_leftovers_only(tmp_path: Path) -> None:
    out, index = tmp_path / "out", tmp_path / "index"
    live = leftovers.output_tmp_dir(out, job_id="j", run_id="aaaaaaaaaaaa")
    leftovers.make_output_tmp_dir(live)
    dead = leftovers.output_tmp_dir(out, job_id="j", run_id="bbbbbbbbbbbb")
    dead.mkdir()
    (dead / leftovers.OWNER_FILE).write_text(json.dumps({"pid": dead_pid(), "host": socket.gethostname()}))
    (index / "files").mkdir(parents=True)
    host = leftovers.host_tag()
    dead_tmp = index / "files" / f".w-1-py3-none-any.whl.{host}.{dead_pid()}.q1w2e3.tmp"
    dead_tmp.write_bytes(b"half")
    live_tmp = index / "files" / f".v-1-py3-none-any.whl.{host}.{os.getpid()}.q1w2e3.tmp"
    live_tmp.write_bytes(b"writing")
    result = CliRunner().invoke(
        app, ["clean", "--no-containers", "--output", str(out), "--to", str(index)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [f"removed {dead}", f"removed {dead_tmp}"]
    assert live.is_dir() and live_tmp.is_file()
    assert not dead.exists() and not dead_tmp.exists()


def test_clean_refuses_a_missing_directory(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "factory", "clean", "--no-containers", "--output", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {tmp_path / 'nope'}: not a local directory"
