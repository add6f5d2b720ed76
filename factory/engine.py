"""The container engine over the docker SDK: locked-down containers with limits, their logs and memory.

Knows nothing of jobs, matrices or the driver's markers: a caller hands in an image, a command, an
environment, mounts and limits, and gets each log line and each memory reading through callbacks. Every
container carries the run's labels, so an interrupted run (or a crashed one, found by the next run) never
leaves containers behind.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from factory.container import heartbeat
from factory.errors import BuildError, ConfigError
from factory.options import MAX_CPUS, MIN_CPUS

LABEL = "io.wheel-factory"
RUN_LABEL = "io.wheel-factory.run"
PID_LABEL = "io.wheel-factory.pid"
HOST_LABEL = "io.wheel-factory.host"


class Interrupted(KeyboardInterrupt):
    """SIGTERM or a stop request turned into the same path as Ctrl-C."""


@dataclass(frozen=True, kw_only=True)
class Limits:
    memory_bytes: int  # also the memory+swap limit: no swap, so an overrun is a real OOM kill
    cpus: float
    pids: int
    network: str = "none"  # "none" or "bridge"


def nano_cpus(cpus: float) -> int:
    """Docker's nano_cpus for a CPU limit; ConfigError outside MIN_CPUS to MAX_CPUS, never the 0 that Docker
    reads as "no limit" (what 1e-12 CPUs truncated to) nor an OverflowError."""
    if not (math.isfinite(cpus) and MIN_CPUS <= cpus <= MAX_CPUS):
        raise ConfigError(f"a container's CPU limit must be {MIN_CPUS:g} to {MAX_CPUS}, not {cpus:g}")
    return round(cpus * 1e9)


@dataclass(frozen=True, kw_only=True)
class Outcome:
    exit_code: int
    oom_killed: bool
    peak_bytes: int  # the most working set seen (`working_set`)


def run_labels(run_id: str) -> dict[str, str]:
    """The labels of every container of one run: which run, which process on which host."""
    return {LABEL: "1", RUN_LABEL: run_id, PID_LABEL: str(os.getpid()), HOST_LABEL: socket.gethostname()}


def working_set(mem: Mapping[str, Any]) -> int:
    """Memory the kernel cannot simply drop, as `docker stats` shows it: usage less inactive page cache.

    Raw cgroup usage counts the page cache of every file the build touched (gigabytes of torch wheels), which
    says nothing about how close the compiles came to an OOM kill.
    """
    usage = int(mem.get("usage") or 0)
    stats = mem.get("stats") or {}
    inactive = stats.get("total_inactive_file", stats.get("inactive_file", 0))
    return max(0, usage - int(inactive or 0))


def _volumes(mounts: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, str]]:
    return {k: dict(v) for k, v in mounts.items()}


class Engine:
    """Runs containers for one run: each carries `labels`, and a set `stop` ends the one running."""

    def __init__(self, client: Any, *, labels: Mapping[str, str], stop: threading.Event) -> None:
        self.client = client
        self.labels = dict(labels)
        self.stop = stop

    def ensure_volume(self, name: str) -> None:
        import docker.errors

        try:
            self.client.volumes.get(name)
        except docker.errors.NotFound:
            self.client.volumes.create(name, labels={LABEL: "1"})

    def run_short(
        self,
        image: str,
        command: Sequence[str],
        *,
        user: str,
        mounts: Mapping[str, Mapping[str, str]],
        env: Mapping[str, str] | None = None,
        cap_add: Sequence[str] = (),
    ) -> str:
        """A short housekeeping container, without network, removed when it exits; its standard output."""
        output = self.client.containers.run(
            image,
            list(command),
            environment=dict(env or {}),
            user=user,
            cap_drop=["ALL"],
            cap_add=list(cap_add) or None,
            network_mode="none",
            remove=True,
            labels=self.labels,
            volumes=_volumes(mounts),
        )
        return output.decode("utf-8", "replace") if isinstance(output, bytes) else ""

    def run(
        self,
        *,
        image: str,
        command: Sequence[str],
        env: Mapping[str, str],
        mounts: Mapping[str, Mapping[str, str]],
        user: str,
        working_dir: str,
        limits: Limits,
        log_path: Path,
        on_line: Callable[[str], None] = lambda _line: None,
        on_memory: Callable[[int], None] = lambda _bytes: None,
    ) -> Outcome:
        """Run one container to its end: every log line appended to `log_path` and passed to `on_line`, every
        memory reading to `on_memory`. Raises `Interrupted` when `stop` is set, before or while it runs."""
        if self.stop.is_set():
            raise Interrupted()
        container = self.client.containers.create(
            image,
            list(command),
            environment=dict(env),
            volumes=_volumes(mounts),
            user=user,
            working_dir=working_dir,
            mem_limit=limits.memory_bytes,
            memswap_limit=limits.memory_bytes,
            nano_cpus=nano_cpus(limits.cpus),
            pids_limit=limits.pids,
            security_opt=["no-new-privileges"],
            cap_drop=["ALL"],
            network_mode=limits.network,
            labels=self.labels,
            detach=True,
        )
        peak = 0
        done = threading.Event()

        def stream_logs() -> None:
            with log_path.open("a", encoding="utf-8") as fh:
                buf = b""
                for chunk in container.logs(stream=True, follow=True):
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for raw in lines:
                        line = raw.decode("utf-8", "replace")
                        fh.write(line + "\n")
                        on_line(line)
                    fh.flush()
                if buf:
                    fh.write(buf.decode("utf-8", "replace") + "\n")

        def watch_memory() -> None:
            nonlocal peak
            with contextlib.suppress(Exception):
                for stats in container.stats(stream=True, decode=True):
                    usage = working_set(stats.get("memory_stats") or {})
                    peak = max(peak, usage)
                    on_memory(usage)
                    if done.is_set():
                        break

        try:
            container.start()
            threads = [
                threading.Thread(target=stream_logs, daemon=True),
                threading.Thread(target=watch_memory, daemon=True),
            ]
            for t in threads:
                t.start()
            while True:
                try:
                    status = container.wait(timeout=1)
                    break
                except Exception as exc:  # requests' ReadTimeout: poll so a stop request is seen quickly
                    if "timed out" not in str(exc).lower() and "timeout" not in type(exc).__name__.lower():
                        raise
                    if self.stop.is_set():
                        raise Interrupted() from None
            done.set()
            threads[0].join(timeout=30)
            container.reload()
            state = container.attrs.get("State", {})
            return Outcome(
                exit_code=int(status.get("StatusCode", -1)),
                oom_killed=bool(state.get("OOMKilled")),
                peak_bytes=peak,
            )
        finally:
            done.set()
            with contextlib.suppress(Exception):
                container.remove(force=True)


def remove_containers(client: Any, *, filters: Mapping[str, Any]) -> int:
    removed = 0
    for container in client.containers.list(all=True, filters=dict(filters)):
        with contextlib.suppress(Exception):
            container.remove(force=True)
            removed += 1
    return removed


def remove_stale_containers(client: Any) -> list[str]:
    """Remove containers left by factory runs on this host whose process is gone (a crash, a kill -9), those
    that stopped themselves when its heartbeat did, too; the names of those removed. Another host's (sharing
    the daemon) cannot be checked, so they are left."""
    removed: list[str] = []
    host = socket.gethostname()
    for container in client.containers.list(all=True, filters={"label": LABEL}):
        labels = container.labels
        if labels.get(HOST_LABEL) != host:
            continue
        try:
            pid = int(labels.get(PID_LABEL, "0"))
        except ValueError:
            pid = 0
        if pid and pid != os.getpid() and psutil.pid_exists(pid):
            continue
        with contextlib.suppress(Exception):
            container.remove(force=True)
            removed.append(container.name)
    return removed


class Heartbeat:
    """Touches `path` every `period_s` seconds while in use: the build containers' sign that their factory
    lives (`factory.container.heartbeat`). A factory killed with SIGKILL stops touching it, and its
    containers stop themselves."""

    def __init__(self, path: Path, *, period_s: float = heartbeat.PERIOD_S) -> None:
        self.path = path
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)

    def _beat(self) -> None:
        while True:
            with contextlib.suppress(OSError):  # a full disk must not end the build; the containers will
                heartbeat.touch(self.path)
            if self._stop.wait(self.period_s):
                return

    def __enter__(self) -> Heartbeat:
        heartbeat.touch(self.path)  # before any container can look at it
        self.path.parent.chmod(0o755)  # the containers' unprivileged user reads it
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def check_docker(client_factory: Callable[[], Any] | None = None) -> Any:
    """A docker client that answers, or a clear error (never a traceback) naming what is missing."""
    import docker

    try:
        client = (client_factory or (lambda: docker.from_env(timeout=600)))()
        client.ping()
    except Exception as exc:
        raise BuildError(
            f"cannot reach the Docker daemon ({exc.__class__.__name__}): is dockerd running?"
        ) from exc
    return client
