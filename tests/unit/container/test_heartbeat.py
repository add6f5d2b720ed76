"""The build container's watch on the factory's heartbeat: the decision, and a real driver killing a build."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from factory.build.engine import Heartbeat
from factory.build.runner import heartbeat_stale_s
from factory.container import heartbeat, protocol
from factory.core.errors import ConfigError


@pytest.mark.parametrize(
    ("mtime", "now", "stale"),
    [
        (100.0, 150.0, False),  # touched 50 s ago, 60 s allowed
        (100.0, 161.0, True),
        (None, 150.0, False),  # no file yet: counted from the start of the watch (100)
        (None, 161.0, True),
        (10.0, 150.0, False),  # a file older than the watch counts from the watch's start
    ],
)
def test_is_stale(mtime: float | None, now: float, stale: bool) -> None:
    assert heartbeat.is_stale(mtime=mtime, now=now, watching_since=100.0, stale_s=60.0) is stale


def test_touch_makes_then_refreshes(tmp_path: Path) -> None:
    beat = tmp_path / "hb" / heartbeat.FILE_NAME
    heartbeat.touch(beat)
    assert beat.stat().st_mode & 0o777 == 0o644
    os.utime(beat, (1.0, 1.0))
    heartbeat.touch(beat)
    assert beat.stat().st_mtime > 1.0


DRIVER = textwrap.dedent(
    """
    import os, sys
    from factory.container import driver, heartbeat
    heartbeat.start_watch(driver.CHILDREN, os.environ)
    driver.run(["sh", "-c", "sleep 600 & echo $! > " + sys.argv[1] + "; wait"])
    """
)


def wait_for(predicate: Callable[[], object], timeout: float, what: str, beat: Path | None = None) -> None:
    """Poll `predicate`, touching `beat` meanwhile when given."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        if beat is not None:
            heartbeat.touch(beat)
        time.sleep(0.2)


def test_driver_kills_its_build_when_the_heartbeat_stops(tmp_path: Path) -> None:
    beat = tmp_path / heartbeat.FILE_NAME
    heartbeat.touch(beat)
    pidfile = tmp_path / "sleep.pid"
    stale_s = 2.0
    env = {**os.environ, protocol.ENV_HEARTBEAT: str(beat), protocol.ENV_HEARTBEAT_STALE_S: str(stale_s)}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(pidfile)], env=env, stdout=subprocess.PIPE)
    try:
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 60, "the build to start", beat)
        sleeper = psutil.Process(int(pidfile.read_text()))
        # while the host beats, the build lives on well past the staleness limit
        until = time.monotonic() + 3 * stale_s
        wait_for(lambda: time.monotonic() > until, 30, "three staleness periods", beat)
        assert proc.poll() is None and sleeper.is_running()
        # no more beats: the driver kills the build's process group, grandchildren too, and says why
        assert proc.wait(timeout=60) == heartbeat.EXIT_ORPHANED
        wait_for(
            lambda: not sleeper.is_running() or sleeper.status() == psutil.STATUS_ZOMBIE,
            30,
            "the sleep to die",
        )
        assert proc.stdout is not None
        assert b"no heartbeat from the factory" in proc.stdout.read()
    finally:
        proc.kill()
        proc.wait()
        if pidfile.exists():
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(int(pidfile.read_text())).kill()


def test_no_heartbeat_configured_means_no_watch() -> None:
    assert heartbeat.start_watch(heartbeat.Children(), {}) is None


def test_host_heartbeat_touches_until_it_ends(tmp_path: Path) -> None:
    beat = tmp_path / "run" / "heartbeat" / heartbeat.FILE_NAME
    with Heartbeat(beat, period_s=0.05):
        assert beat.parent.stat().st_mode & 0o777 == 0o755
        os.utime(beat, (1.0, 1.0))
        wait_for(lambda: beat.stat().st_mtime > 1.0, 30, "a beat")
    os.utime(beat, (1.0, 1.0))
    time.sleep(0.2)  # four periods: a beat would have come by now
    assert beat.stat().st_mtime == 1.0


def test_stale_limit_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(protocol.ENV_HEARTBEAT_STALE_S, "5")
    assert heartbeat_stale_s() == 5.0
    monkeypatch.setenv(protocol.ENV_HEARTBEAT_STALE_S, "soon")
    with pytest.raises(ConfigError, match="FACTORY_HEARTBEAT_STALE_S='soon'"):
        heartbeat_stale_s()
    monkeypatch.delenv(protocol.ENV_HEARTBEAT_STALE_S)
    assert heartbeat_stale_s() == heartbeat.STALE_S
