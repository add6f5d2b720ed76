"""The container engine, the one module that talks to Docker (the docker SDK): locked-down containers with
limits, their logs and memory; the images, volumes and leftover containers of the factory.

Knows nothing of jobs, matrices or the driver's markers: a caller hands in an image, a command, an
environment, mounts and limits, and gets each log line and each memory reading through callbacks. Every
container carries the run's labels, so an interrupted run (or a crashed one, found by the next run) never
leaves containers behind. Whatever the SDK raises when the daemon fails or refuses is a `DockerError`; the
client is opaque to every other module, and images come back as `LocalImage`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from factory.container import heartbeat
from factory.core.errors import ConfigError, DockerError
from factory.spec.options import MAX_CPUS, MIN_CPUS

LABEL = "io.wheel-factory"
RUN_LABEL = "io.wheel-factory.run"
PID_LABEL = "io.wheel-factory.pid"
HOST_LABEL = "io.wheel-factory.host"


class Interrupted(KeyboardInterrupt):
    """SIGTERM or a stop request turned into the same path as Ctrl-C."""


def short_reason(exc: BaseException) -> str:
    """What the SDK (or the daemon, through it) said, on one line of at most 300 characters."""
    text = getattr(exc, "explanation", None) or str(exc) or exc.__class__.__name__
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return " ".join(str(text).split())[:300]


def _sdk_errors() -> tuple[type[BaseException], ...]:
    """The exceptions of a failed or refused request: the SDK's own, and those of the HTTP layer below it
    (a daemon that went away mid-request)."""
    import docker.errors
    import requests.exceptions

    return (docker.errors.DockerException, requests.exceptions.RequestException)


@contextlib.contextmanager
def _requests(what: str) -> Iterator[None]:
    """Turn a failed request into a DockerError: `what` failed, and what the daemon said."""
    try:
        yield
    except _sdk_errors() as exc:
        raise DockerError(f"{what} failed ({type(exc).__name__}: {short_reason(exc)})") from None


def connect(timeout: int = 600, *, client_factory: Callable[[], Any] | None = None) -> Any:
    """A docker client that answers, or a DockerError (never a traceback) saying the daemon does not."""
    try:
        import docker

        client = (client_factory or (lambda: docker.from_env(timeout=timeout)))()
        client.ping()
    except Exception as exc:  # the SDK raises several unrelated types when no daemon answers
        why = f"{exc.__class__.__name__}: {short_reason(exc)}"
        raise DockerError(f"cannot reach the Docker daemon ({why}): is dockerd running?") from None
    return client


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
class ContainerSpec:
    """What one container is: image, command, environment, mounts (host path or volume -> bind and mode), its
    user and working directory, its limits."""

    image: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    mounts: Mapping[str, Mapping[str, str]]
    user: str
    working_dir: str
    limits: Limits


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
        # why `stop` was set, for the jobs it ends (set before `stop`); "" when no one said
        self.stop_reason = ""

    def ensure_volume(self, name: str) -> None:
        if not volume_exists(self.client, name):
            with _requests(f"creating volume {name}"):
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
        with _requests(f"a container of {image} ({' '.join(command[:3])})"):
            output = self._run_short(image, command, user=user, mounts=mounts, env=env, cap_add=cap_add)
        return output.decode("utf-8", "replace") if isinstance(output, bytes) else ""

    def _run_short(
        self,
        image: str,
        command: Sequence[str],
        *,
        user: str,
        mounts: Mapping[str, Mapping[str, str]],
        env: Mapping[str, str] | None,
        cap_add: Sequence[str],
    ) -> object:
        return self.client.containers.run(
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

    def run(
        self,
        spec: ContainerSpec,
        *,
        log_path: Path,
        on_line: Callable[[str], None] = lambda _line: None,
        on_memory: Callable[[int], None] = lambda _bytes: None,
    ) -> Outcome:
        """Run `spec`'s container to its end: every log line appended to `log_path` and passed to `on_line`,
        every memory reading to `on_memory`. Raises `Interrupted` when `stop` is set, before or while it
        runs."""
        if self.stop.is_set():
            raise Interrupted()
        limits = spec.limits
        with _requests(f"a container of {spec.image}"):
            container = self.client.containers.create(
                spec.image,
                list(spec.command),
                environment=dict(spec.env),
                volumes=_volumes(spec.mounts),
                user=spec.user,
                working_dir=spec.working_dir,
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
                        if (
                            "timed out" not in str(exc).lower()
                            and "timeout" not in type(exc).__name__.lower()
                        ):
                            raise
                        if self.stop.is_set():
                            raise Interrupted() from None
                done.set()
                threads[0].join(timeout=30)
                if self.stop.is_set() and status.get("StatusCode") != 0:
                    # killed by the run's own stop (Ctrl-C, SIGTERM: its containers are removed), not a
                    # build that failed: its exit code (137) says nothing of the build
                    raise Interrupted()
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


# ---------------------------------------------------------------------------------------------- volumes


def volume_exists(client: Any, name: str) -> bool:
    import docker.errors

    with _requests(f"looking up volume {name}"):
        try:
            client.volumes.get(name)
        except docker.errors.NotFound:
            return False
    return True


# ---------------------------------------------------------------------------------------------- images


@dataclass(frozen=True, kw_only=True)
class LocalImage:
    """An image on this host, as the factory reads it."""

    id: str  # the full id, "sha256:<hex>"
    tags: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    env: tuple[str, ...] = ()  # its config's environment, "KEY=value" each
    size: int = 0
    created: str = ""
    # "<os>/<architecture>" of its config (`Platform.docker`'s form); "" where it says neither
    platform: str = ""

    @property
    def short_id(self) -> str:
        """The id as `docker images` shows it: twelve hex digits."""
        return self.id.removeprefix("sha256:")[:12]


def _local_image(image: Any) -> LocalImage:
    attrs = image.attrs or {}
    return LocalImage(
        id=str(image.id),
        tags=tuple(image.tags),
        labels=dict(image.labels or {}),
        env=tuple(str(item) for item in (attrs.get("Config") or {}).get("Env") or ()),
        size=int(attrs.get("Size", 0) or 0),
        created=str(attrs.get("Created", "")),
        platform=(
            f"{attrs['Os']}/{attrs['Architecture']}" if attrs.get("Os") and attrs.get("Architecture") else ""
        ),
    )


def get_image(client: Any, name: str) -> LocalImage | None:
    """The image `name` (a reference or an id) on this host; None when there is none."""
    import docker.errors

    with _requests(f"looking up image {name}"):
        try:
            return _local_image(client.images.get(name))
        except docker.errors.ImageNotFound:
            return None


def list_images(client: Any, *, label: str) -> list[LocalImage]:
    """The images on this host that carry `label`."""
    with _requests(f"listing the images labelled {label}"):
        return [_local_image(image) for image in client.images.list(filters={"label": label})]


def pull_image(client: Any, repository: str, *, tag: str, platform: str | None = None) -> None:
    """`docker pull`; `platform` (`Platform.docker`) picks that variant of a multi-platform image."""
    with _requests(f"pulling {repository}:{tag}"):
        if platform is None:
            client.images.pull(repository, tag=tag)
        else:
            client.images.pull(repository, tag=tag, platform=platform)


def tag_image(client: Any, image_id: str, name: str) -> None:
    """`docker tag image_id name` (`name`: "repository:tag")."""
    repository, _, tag = name.rpartition(":")
    with _requests(f"tagging {name}"):
        if not client.api.tag(image_id, repository, tag=tag):
            raise DockerError(f"docker did not tag {image_id} as {name}")


def remove_image(client: Any, image_id: str) -> None:
    with _requests(f"removing image {image_id}"):
        client.images.remove(image_id)


def image_layers(client: Any, image_id: str) -> set[str]:
    """The short ids of the images `image_id` was stepped through (its history) that are images still."""
    with _requests(f"reading the history of {image_id}"):
        history = client.api.history(image_id)
    return {str(entry.get("Id", "")).removeprefix("sha256:")[:12] for entry in history}


def import_image(
    client: Any,
    chunks: Iterable[bytes],
    *,
    repository: str,
    tag: str,
    changes: Sequence[str],
    platform: str | None = None,
) -> str:
    """`docker import` of a root filesystem's tar stream; the daemon's answer, as text. `platform`
    (`Platform.docker`) is the image's own where it is not the daemon's (the SDK's import has no such
    argument); a daemon may record its own architecture whatever it is told (20.10 does), so the factory's
    images carry their platform in a label as well (`images.LABEL_PLATFORM`)."""
    with _requests(f"docker import of {repository}:{tag}"):
        if platform is None:
            result = client.api.import_image_from_stream(
                chunks, repository=repository, tag=tag, changes=list(changes)
            )
        else:
            params = {"repo": repository, "tag": tag, "fromSrc": "-", "changes": list(changes)}
            params["platform"] = platform
            headers = {"Content-Type": "application/tar", "Transfer-Encoding": "chunked"}
            response = client.api._post(
                client.api._url("/images/create"), data=chunks, params=params, headers=headers
            )
            result = client.api._result(response)
    return result if isinstance(result, str) else json.dumps(result)


def build_image(
    client: Any,
    context: Path,
    *,
    tag: str,
    buildargs: Mapping[str, str],
    labels: Mapping[str, str],
    network_mode: str | None,
) -> Iterator[Mapping[str, Any]]:
    """`docker build` of `context` (the legacy builder, intermediate containers removed): the daemon's
    decoded stream, one JSON object a step line or an error."""
    with _requests(f"building {tag}"):
        stream = client.api.build(
            path=str(context),
            tag=tag,
            buildargs=dict(buildargs),
            labels=dict(labels),
            rm=True,
            forcerm=True,
            decode=True,
            network_mode=network_mode,
            use_config_proxy=False,
        )
        yield from stream


# ---------------------------------------------------------------------------------------------- containers


def running_runs(client: Any) -> set[str]:
    """The run ids of the factory's containers running now on this daemon (any host's)."""
    with _requests("listing the factory's containers"):
        containers = client.containers.list(filters={"label": LABEL})
    return {run for c in containers if (run := (c.labels or {}).get(RUN_LABEL, ""))}


def remove_containers(client: Any, *, filters: Mapping[str, Any]) -> int:
    removed = 0
    with _requests("listing the factory's containers"):
        containers = client.containers.list(all=True, filters=dict(filters))
    for container in containers:
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
    with _requests("listing the factory's containers"):
        containers = client.containers.list(all=True, filters={"label": LABEL})
    for container in containers:
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
