"""The host's heartbeat and the build container's watch on it: a container outlives no factory for long.

The host touches a file in a directory it mounts read-only into every build container, every few seconds.
A factory killed with SIGKILL cannot stop its containers; the driver inside sees the file go stale, kills
its build's process groups and exits with EXIT_ORPHANED, which ends the container.

Standard library only: the driver imports it inside the container.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from . import protocol

MOUNT = "/run/factory-heartbeat"  # where the host's heartbeat directory is mounted
FILE_NAME = "beat"
PERIOD_S = 5.0  # how often the host touches it
STALE_S = 60.0  # how long the container waits for a touch before it takes its factory for dead
EXIT_ORPHANED = 86  # the driver's exit code when its factory stopped beating


def is_stale(*, mtime: float | None, now: float, watching_since: float, stale_s: float) -> bool:
    """Whether the factory is taken for dead: its last touch (or, with no file at all, the start of the watch)
    is more than `stale_s` ago."""
    last = watching_since if mtime is None else max(mtime, watching_since)
    return now - last > stale_s


def touch(path: Path) -> None:
    """One beat: the file's mtime is now (it is made, readable by the container's user, when missing)."""
    try:
        os.utime(path)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o644)
        path.chmod(0o644)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


class Children:
    """The build's processes, each started in its own session so that its whole group can be killed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen[bytes]] = []

    def run(self, cmd: list[str], **kwargs: object) -> None:
        """`subprocess.run(cmd, check=True)` in a new process group that `kill` reaches."""
        proc = subprocess.Popen(cmd, start_new_session=True, **kwargs)  # type: ignore[call-overload]
        with self._lock:
            self._procs.append(proc)
        try:
            code = proc.wait()
        finally:
            with self._lock:
                self._procs.remove(proc)
        if code != 0:
            raise subprocess.CalledProcessError(code, cmd)

    def kill(self) -> None:
        with self._lock:
            for proc in self._procs:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)


def watch(
    path: Path,
    *,
    stale_s: float,
    on_stale: Callable[[], None],
    poll_s: float = 1.0,
    stop: threading.Event | None = None,
) -> None:
    """Poll `path` until it goes stale (then call `on_stale` once) or `stop` is set."""
    stop = stop or threading.Event()
    since = time.time()
    while not stop.wait(poll_s):
        if is_stale(mtime=_mtime(path), now=time.time(), watching_since=since, stale_s=stale_s):
            on_stale()
            return


def start_watch(children: Children, environ: dict[str, str] | os._Environ[str]) -> threading.Thread | None:
    """The driver's watch when the host set a heartbeat: on staleness every build process group is killed and
    the driver exits with EXIT_ORPHANED. None when the environment names no heartbeat."""
    env = protocol.DriverEnv.from_env(environ)
    if not env.heartbeat:
        return None
    where = env.heartbeat
    stale_s = env.heartbeat_stale_s or STALE_S

    def orphaned() -> None:
        print(
            f"factory: no heartbeat from the factory for {stale_s:g}s: it is gone; stopping the build",
            flush=True,
        )
        children.kill()
        os._exit(EXIT_ORPHANED)  # from a thread: sys.exit would only end this thread

    thread = threading.Thread(
        target=watch,
        args=(Path(where),),
        kwargs={"stale_s": stale_s, "on_stale": orphaned, "poll_s": min(1.0, stale_s / 4)},
        daemon=True,
    )
    thread.start()
    return thread
