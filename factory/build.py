"""Running planned jobs: one locked-down container per job, checked wheels out, a report at the end.

Threads: each job runs in a worker thread that owns its containers; the main thread only waits, renders
progress and handles signals. Every container carries the run's labels, so an interrupted run (or a crashed
one, found by the next run) never leaves containers behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import docker.errors
import psutil

from factory import home, images, platform_tag, wheelcheck, wheelhouse
from factory.config import MatrixFile, format_size
from factory.container import CONTAINER_DIR, DRIVER, IMPORT_ROOT, PACKAGE_MOUNT, protocol
from factory.errors import BuildError, ConfigError, FactoryError
from factory.memory import runner as memory
from factory.plan import Job, job_env
from factory.source import prepare_source

LABEL = "io.wheel-factory"
RUN_LABEL = "io.wheel-factory.run"
PID_LABEL = "io.wheel-factory.pid"
HOST_LABEL = "io.wheel-factory.host"
WORK_VOLUME = "factory-work"
WORK_MOUNT = "/var/factory"
CONTAINER_USER = "10001:10001"
LOG_TAIL_LINES = 40
BUDGET_FRACTION = 0.75  # of host memory, when the matrix sets no memory_budget
BUILD_REQUIREMENTS = ("pip", "setuptools", "wheel", "ninja", "packaging", "psutil")


class Interrupted(KeyboardInterrupt):
    """SIGTERM turned into the same path as Ctrl-C."""


@dataclass(frozen=True, kw_only=True)
class BuildSettings:
    output: Path
    keep_going: bool = False
    memory: int | None = None
    cpus: float | None = None
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])


@dataclass(kw_only=True)
class Attempt:
    number: int
    max_jobs: int
    nvcc_threads: int
    memory_limit: int
    exit_code: int | None = None
    oom_killed: bool = False
    peak_bytes: int = 0
    wall_s: float = 0.0
    # the MAX_JOBS ninja ran with: the plan's; under admission, more (memory is bounded per compile); or what
    # the matrix's env sets itself, whatever the plan
    ninja_jobs: int | None = None
    objects_kept: int | None = None  # objects found from an earlier attempt when this one started
    objects_compiled: int | None = None  # compiles ninja finished in this attempt
    objects_planned: int | None = None  # compiles ninja had to run in this attempt
    objects_total: int | None = None  # objects present when the build finished
    note: str = ""


@dataclass(kw_only=True)
class JobResult:
    job_id: str
    variant_id: str
    python: str
    package: str = ""
    version: str = ""
    result: str = "pending"  # ok | failed | oom | interrupted
    wheel: str | None = None
    wall_s: float = 0.0
    peak_bytes: int = 0
    reason: str | None = None
    log: str | None = None
    log_tail: list[str] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    # Live-only state, not part of the report.
    phase: str = field(default="queued", repr=False)
    started: float | None = field(default=None, repr=False)
    mem_now: int = field(default=0, repr=False)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("phase", "started", "mem_now"):
            data.pop(key)
        return data


@dataclass(kw_only=True)
class BuildReport:
    run_id: str
    matrix: str
    started: float
    finished: float = 0.0
    jobs: list[JobResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(j.result == "ok" for j in self.jobs)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "matrix": self.matrix,
            "started": self.started,
            "finished": self.finished,
            "ok": self.ok,
            "jobs": [j.to_json() for j in self.jobs],
        }


@dataclass(frozen=True, kw_only=True)
class ContainerOutcome:
    exit_code: int
    oom_killed: bool
    peak_bytes: int
    markers: Mapping[str, Any]


def torch_requirement(torch: str) -> str:
    """ "2.14" -> "torch==2.14.*" (any patch release of that minor), "2.14.1" -> "torch==2.14.1"."""
    return f"torch=={torch}.*" if torch.count(".") == 1 else f"torch=={torch}"


def host_memory() -> int:
    return psutil.virtual_memory().total


def container_memory(mf: MatrixFile, settings: BuildSettings) -> int:
    """Each container's limit; all `concurrency` containers together stay within the host budget."""
    budget = mf.build.memory_budget or int(host_memory() * BUDGET_FRACTION)
    per_job = settings.memory if settings.memory is not None else mf.build.memory
    limits = memory.container_limits(
        budget_bytes=budget, concurrency=mf.build.concurrency, per_job_bytes=per_job
    )
    return limits[0]


ERROR_LINE = re.compile(r"(\berror\b|^FAILED:|#error|Killed|out of memory)", re.IGNORECASE)
MAX_ERROR_LINES = 12


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The end of a job's log, led by its first compiler errors when those scrolled out of the end.

    A failed ninja build ends in a Python traceback from setuptools; the line a person needs (nvcc's
    `error:`, ninja's `FAILED:`) is usually far above it.
    """
    try:
        text = [
            line for line in path.read_text(errors="replace").splitlines() if not protocol.is_marked(line)
        ]
    except OSError:
        return []
    tail = text[-lines:]
    errors = [line for line in text[: len(text) - len(tail)] if ERROR_LINE.search(line)][:MAX_ERROR_LINES]
    return [*errors, *(["..."] if errors else []), *tail]


def remove_containers(client: Any, *, filters: Mapping[str, Any]) -> int:
    removed = 0
    for container in client.containers.list(all=True, filters=dict(filters)):
        with contextlib.suppress(Exception):
            container.remove(force=True)
            removed += 1
    return removed


def remove_stale_containers(client: Any) -> int:
    """Remove containers left by factory runs on this host whose process is gone (a crash, a kill -9)."""
    removed = 0
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
            removed += 1
    return removed


class Runner:
    """Executes the jobs of one `factory build` invocation."""

    def __init__(
        self,
        client: Any,
        mf: MatrixFile,
        settings: BuildSettings,
        *,
        on_change: Callable[[JobResult], None] | None = None,
        log: Callable[[str], None] = lambda _msg: None,
    ) -> None:
        self.client = client
        self.mf = mf
        self.settings = settings
        self.on_change = on_change or (lambda _r: None)
        self.log = log
        self.stop = threading.Event()
        self.labels = {
            LABEL: "1",
            RUN_LABEL: settings.run_id,
            PID_LABEL: str(os.getpid()),
            HOST_LABEL: socket.gethostname(),
        }
        self.home = home.factory_home()
        self.run_dir = self.home / "runs" / settings.run_id
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._cache: dict[str, Any] = {}
        self.memory_limit = container_memory(mf, settings)
        self.cpus = settings.cpus or mf.build.cpus or float(os.cpu_count() or 1)

    # -- shared, computed once per key even with concurrent jobs --------------------------------------
    def _once(self, key: str, make: Callable[[], Any]) -> Any:
        with self._locks_guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._cache:
                self._cache[key] = make()
            return self._cache[key]

    def source_tree(self) -> Path:
        pkg = self.mf.package
        src = pkg.source
        return self._once(
            "source",
            lambda: prepare_source(
                kind=src.kind,
                name=pkg.name,
                version=pkg.version,
                cache=self.home,
                url=src.url,
                ref=src.ref,
                path=src.path,
                patches=self.mf.recipe.patches,
            ),
        ).tree

    def image(self, job: Job) -> str:
        b = self.mf.build
        explicit = b.images.get(job.variant.cuda)
        if explicit:
            return self._once(f"image:{explicit}", lambda: self._explicit_image(explicit))
        return self._once(
            f"image:{job.variant.cuda}:{job.python}",
            lambda: images.ensure_builder_image(
                self.client,
                cuda=job.variant.cuda,
                python=job.python,
                flavor=b.flavor,
                base_image=b.base_image,
                progress=self.log,
            ),
        )

    def _explicit_image(self, ref: str) -> str:
        try:
            self.client.images.get(ref)
        except docker.errors.ImageNotFound:
            images.pull_image(self.client, ref, progress=self.log)
        return ref

    def requirements(self, job: Job) -> list[str]:
        reqs = [
            torch_requirement(job.variant.torch),
            *BUILD_REQUIREMENTS,
            *self.mf.recipe.extra_build_requires,
        ]
        return list(dict.fromkeys(reqs))

    def wheelhouse_for(self, job: Job) -> Path:
        reqs = self.requirements(job)
        index = self.mf.build.torch_index_url(job.variant.cuda)
        extra = () if index is None else (index,)
        key = f"wheelhouse:{job.python}:{reqs}:{extra}"
        return self._once(
            key,
            lambda: wheelhouse.download_wheelhouse(
                reqs, self.home / "wheelhouses", python=job.python, extra_index_urls=extra
            ),
        )

    def ensure_work_volume(self, image: str) -> None:
        """The shared work volume must belong to the unprivileged build user; only root can chown it."""

        def make() -> None:
            try:
                self.client.volumes.get(WORK_VOLUME)
            except docker.errors.NotFound:
                self.client.volumes.create(WORK_VOLUME, labels={LABEL: "1"})
            self.client.containers.run(
                image,
                [
                    "sh",
                    "-c",
                    f"mkdir -p {WORK_MOUNT}/uv-cache {WORK_MOUNT}/jobs && "
                    f"chown {CONTAINER_USER} {WORK_MOUNT} {WORK_MOUNT}/uv-cache {WORK_MOUNT}/jobs",
                ],
                user="0:0",
                cap_drop=["ALL"],
                cap_add=["CHOWN"],
                network_mode="none",
                remove=True,
                labels=self.labels,
                volumes={WORK_VOLUME: {"bind": WORK_MOUNT, "mode": "rw"}},
            )

        self._once(f"volume:{image}", make)

    # -- containers ----------------------------------------------------------------------------------
    def run_container(
        self,
        *,
        image: str,
        command: Sequence[str],
        env: Mapping[str, str],
        mounts: Mapping[str, Mapping[str, str]],
        memory_limit: int,
        log_path: Path,
        result: JobResult,
    ) -> ContainerOutcome:
        if self.stop.is_set():
            raise Interrupted()
        container = self.client.containers.create(
            image,
            list(command),
            environment=dict(env),
            volumes={k: dict(v) for k, v in mounts.items()},
            user=CONTAINER_USER,
            working_dir=WORK_MOUNT,
            mem_limit=memory_limit,
            memswap_limit=memory_limit,  # equal to the limit: no swap, so an overrun is a real OOM kill
            nano_cpus=int(self.cpus * 1e9),
            pids_limit=self.mf.build.pids_limit,
            security_opt=["no-new-privileges"],
            cap_drop=["ALL"],
            network_mode="none" if self.mf.build.offline else "bridge",
            labels=self.labels,
            detach=True,
        )
        markers: dict[str, Any] = {}
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
                        fields = protocol.parse_mark(line)
                        if fields is not None:
                            markers.update(fields)
                            if "phase" in fields:
                                result.phase = fields["phase"]
                                self.on_change(result)
                    fh.flush()
                if buf:
                    fh.write(buf.decode("utf-8", "replace") + "\n")

        def watch_memory() -> None:
            nonlocal peak
            with contextlib.suppress(Exception):
                for stats in container.stats(stream=True, decode=True):
                    usage = working_set(stats.get("memory_stats") or {})
                    peak = max(peak, usage)
                    result.mem_now = usage
                    result.peak_bytes = max(result.peak_bytes, peak)
                    self.on_change(result)
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
            return ContainerOutcome(
                exit_code=int(status.get("StatusCode", -1)),
                oom_killed=bool(state.get("OOMKilled")),
                peak_bytes=peak,
                markers=dict(markers),
            )
        finally:
            done.set()
            result.mem_now = 0
            with contextlib.suppress(Exception):
                container.remove(force=True)

    # -- one job -------------------------------------------------------------------------------------
    def job_dir(self, job: Job) -> str:
        """The job's directory in the shared work volume; per run, so concurrent runs never share one."""
        return f"{WORK_MOUNT}/jobs/{job.id}-{self.settings.run_id}"

    def driver_env(self, job: Job) -> dict[str, str]:
        """What every driver phase needs, built from scratch: nothing of the host environment leaks in."""
        return {
            "HOME": "/home/factory",
            "FACTORY_JOB_DIR": self.job_dir(job),
            "FACTORY_PYTHON": f"python{job.python}",
            # uv's cache shares the work volume with the venvs: installing torch hardlinks, not copies.
            "UV_CACHE_DIR": f"{WORK_MOUNT}/uv-cache",
            "UV_LINK_MODE": "hardlink",
            "UV_PYTHON_DOWNLOADS": "never",
            "UV_NO_CONFIG": "1",
            "PYTHONPATH": IMPORT_ROOT,  # the driver and the nvcc wrapper import as `factory.container`
        }

    def job_env(self, job: Job, parallel: memory.Parallelism) -> dict[str, str]:
        env = {
            **self.driver_env(job),
            "FACTORY_CUDA": job.variant.cuda,
            "FACTORY_REQUIREMENTS": "\n".join(self.requirements(job)),
            "PIP_NO_INDEX": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PYTHONUNBUFFERED": "1",
            "MAX_JOBS": str(parallel.max_jobs),
            "NVCC_THREADS": str(parallel.nvcc_threads),
        }
        env.update(
            memory.wrapper_env(
                parallel,
                recipe=self.mf.recipe,
                job_dir=env["FACTORY_JOB_DIR"],
                memory_limit=self.memory_limit,
                package=self.mf.package.name,
                version=self.mf.package.version,
                profile_dir=self.profile_dir(job),
            )
        )
        env.update(job_env(self.mf, job))
        return env

    def profile_dir(self, job: Job) -> Path:
        """The host side of the job's read-only profile mount: the learned profile as each attempt starts."""
        return self.run_dir / "profiles" / job.id

    def run_job(self, job: Job, result: JobResult) -> None:
        if self.stop.is_set():  # an earlier job failed without --keep-going, or the run is being stopped
            result.result, result.reason = (
                "skipped",
                "not started: the build stopped after an earlier failure",
            )
            return
        t0 = time.monotonic()
        result.started = t0
        log_path = self.run_dir / "logs" / f"{job.id}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        result.log = str(log_path)
        out_tmp = self.settings.output / f".tmp-{job.id}-{self.settings.run_id}"
        image: str | None = None
        try:
            result.phase = "prepare"
            self.on_change(result)
            image = self.image(job)
            source = self.source_tree()
            wh = self.wheelhouse_for(job)
            self.ensure_work_volume(image)
            out_tmp.mkdir(parents=True, exist_ok=True)
            out_tmp.chmod(0o777)  # the container's unprivileged user writes the wheel here
            self.profile_dir(job).mkdir(parents=True, exist_ok=True)
            mounts = {
                WORK_VOLUME: {"bind": WORK_MOUNT, "mode": "rw"},
                str(source): {"bind": "/src", "mode": "ro"},
                str(wh): {"bind": "/wheelhouse", "mode": "ro"},
                str(out_tmp): {"bind": "/out", "mode": "rw"},
                str(CONTAINER_DIR): {"bind": PACKAGE_MOUNT, "mode": "ro"},
                str(self.profile_dir(job)): {"bind": memory.PROFILE_DIR, "mode": "ro"},
            }
            built = self.build_with_retries(
                job, result, image=image, mounts=mounts, out_dir=out_tmp, log_path=log_path
            )
            if built is None:
                return
            wheel, installed_torch = built
            self.accept(
                job, result, wheel=wheel, torch=installed_torch, image=image, mounts=mounts, log_path=log_path
            )
        except Interrupted:
            # The main thread owns signal handling; a worker only records why it stopped.
            result.result, result.reason = "interrupted", "the build was stopped"
        except FactoryError as exc:
            result.result, result.reason = "failed", str(exc)
        except Exception as exc:  # a docker API error must fail this job, not the whole run
            result.result, result.reason = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            result.wall_s = round(time.monotonic() - t0, 1)
            result.phase = result.result
            if result.result != "ok":
                result.log_tail = log_tail(log_path)
            shutil.rmtree(out_tmp, ignore_errors=True)
            self.on_change(result)
            if not self.stop.is_set():
                with contextlib.suppress(Exception):
                    self.clean_job_dir(job, image=image)

    def clean_job_dir(self, job: Job, *, image: str | None) -> None:
        if image is None:
            return
        self.client.containers.run(
            image,
            [*DRIVER, "clean"],
            environment=self.driver_env(job),
            user=CONTAINER_USER,
            cap_drop=["ALL"],
            network_mode="none",
            remove=True,
            labels=self.labels,
            volumes={
                WORK_VOLUME: {"bind": WORK_MOUNT, "mode": "rw"},
                str(CONTAINER_DIR): {"bind": PACKAGE_MOUNT, "mode": "ro"},
            },
        )

    def build_with_retries(
        self, job: Job, result: JobResult, *, image: str, mounts: Mapping[str, Mapping[str, str]],
        out_dir: Path, log_path: Path,
    ) -> tuple[Path, str] | None:  # fmt: skip
        """Attempts until a wheel, a non-OOM failure or the last attempt. The build directory outlives an OOM
        kill, so each retry resumes from the objects already compiled."""
        archs = len(job.variant.archs)
        parallel = memory.initial_parallelism(
            recipe=self.mf.recipe, archs=archs, limit_bytes=self.memory_limit, cpus=self.cpus,
            package=self.mf.package.name, version=self.mf.package.version,
        )  # fmt: skip
        for number in range(1, self.mf.build.max_attempts + 1):
            attempt = Attempt(
                number=number, max_jobs=parallel.max_jobs, nvcc_threads=parallel.nvcc_threads,
                memory_limit=self.memory_limit,
            )  # fmt: skip
            result.attempts.append(attempt)
            start = log_path.stat().st_size if log_path.exists() else 0
            with log_path.open("a") as fh:
                # After an OOM the plan's reason is already the attempt's report line.
                line = parallel.reason if number > 1 else f"attempt {number}: {parallel.reason}"
                fh.write(protocol.note_line(line) + "\n")
                env = self.job_env(job, parallel)
                fh.write(
                    protocol.note_line(f"MAX_JOBS={env['MAX_JOBS']} NVCC_THREADS={env['NVCC_THREADS']}")
                    + "\n"
                )
            attempt.ninja_jobs = int(env["MAX_JOBS"]) if env["MAX_JOBS"].isdigit() else None
            t0 = time.monotonic()
            outcome = self.run_container(
                image=image, command=[*DRIVER, "build"],
                env=env, mounts=mounts, memory_limit=self.memory_limit,
                log_path=log_path, result=result,
            )  # fmt: skip
            segment = read_from(log_path, start)
            attempt.wall_s = round(time.monotonic() - t0, 1)
            attempt.exit_code = outcome.exit_code
            attempt.oom_killed = outcome.oom_killed
            attempt.peak_bytes = outcome.peak_bytes
            attempt.objects_kept = outcome.markers.get("objects_kept")
            progress = ninja_progress(segment)
            attempt.objects_compiled = progress[0] if progress else None
            attempt.objects_planned = progress[1] if progress else None
            attempt.objects_total = outcome.markers.get("objects_total")
            self.learn(segment)
            if outcome.exit_code == 0 and not outcome.oom_killed:
                wheel_name = outcome.markers.get("wheel")
                if not wheel_name or not (out_dir / wheel_name).is_file():
                    result.result, result.reason = "failed", "the build finished without a wheel"
                    return None
                # The driver reports the torch it built against; the wheel is pinned to that release.
                return out_dir / str(wheel_name), str(outcome.markers.get("torch") or job.variant.torch)
            if not outcome.oom_killed:
                result.result = "failed"
                result.reason = f"build exited with code {outcome.exit_code} (attempt {number})"
                return None
            if number == self.mf.build.max_attempts:
                attempt.note = f"attempt {number}: OOM at {format_size(outcome.peak_bytes)}; no attempts left"
                break
            kept = (attempt.objects_kept or 0) + (attempt.objects_compiled or 0)
            total = (attempt.objects_kept or 0) + (attempt.objects_planned or 0)
            nxt = memory.next_attempt(
                parallel, oom_peak_bytes=outcome.peak_bytes, limit_bytes=self.memory_limit, objects_done=kept,
                objects_total=total or None, attempt=number + 1, archs=archs,
            )  # fmt: skip
            attempt.note = nxt.reason
            self.log(f"{job.id}: {nxt.reason}")
            if (nxt.max_jobs, nxt.nvcc_threads, nxt.per_compile_bytes) == (
                parallel.max_jobs,
                parallel.nvcc_threads,
                parallel.per_compile_bytes,
            ):
                break  # nothing left to change: a retry would repeat the same OOM
            parallel = nxt
        result.result = "oom"
        last = result.attempts[-1]
        result.reason = (
            f"OOM-killed at {format_size(last.peak_bytes)} of a {format_size(self.memory_limit)} limit "
            f"after {len(result.attempts)} attempt(s)"
        )
        return None

    def learn(self, segment: str) -> None:
        """Fold one attempt's measured compiles into the package's profile, which the next attempt reads."""
        with tempfile.NamedTemporaryFile("w", suffix=".log") as fh:
            fh.write(segment)
            fh.flush()
            memory.record_profiles(
                package=self.mf.package.name, version=self.mf.package.version, log_path=Path(fh.name)
            )

    def accept(
        self,
        job: Job,
        result: JobResult,
        *,
        wheel: Path,
        torch: str,
        image: str,
        mounts: Mapping[str, Mapping[str, str]],
        log_path: Path,
    ) -> None:
        result.phase = "check"
        self.on_change(result)
        with log_path.open("a") as fh:
            fh.write(protocol.note_line("checking the wheel") + "\n")
        wheelcheck.pin_torch_requirement(wheel, torch)
        wheel = platform_tag.repair_platform_tag(wheel, wheel.parent)
        problems = wheelcheck.check_wheel(
            wheel,
            name=self.mf.package.name,
            version=self.mf.package.version,
            local_version=job.variant.local_version,
            python=job.python,
            torch_version=torch,
            archs=job.variant.archs,
        )
        if problems:
            result.result = "failed"
            result.reason = "wheel check failed: " + "; ".join(problems)
            return
        env = {
            **self.driver_env(job),
            "FACTORY_WHEEL": wheel.name,
            "FACTORY_IMPORT_CHECK": wheelcheck.import_check_script(self.mf.recipe.import_name),
        }
        outcome = self.run_container(
            image=image,
            command=[*DRIVER, "check"],
            env=env,
            mounts=mounts,
            memory_limit=self.memory_limit,
            log_path=log_path,
            result=result,
        )
        if outcome.exit_code != 0:
            result.result = "failed"
            result.reason = f"install/import check failed (exit {outcome.exit_code})"
            return
        final = self.settings.output / wheel.name
        os.replace(wheel, final)
        final.chmod(0o644)
        result.wheel = final.name
        result.result = "ok"


NINJA_STATUS = re.compile(r"^\s*\[(\d+)/(\d+)\]")


def ninja_progress(log_text: str) -> tuple[int, int] | None:
    """(compiled, total) edges of a ninja run in a log: how far an attempt got before it died.

    Without a terminal ninja prints `[finished/total]` as each edge ends, failed ones too (with `FAILED:`).
    """
    finished = total = failed = 0
    for line in log_text.splitlines():
        match = NINJA_STATUS.match(line)
        if match:
            finished, total = max(finished, int(match.group(1))), int(match.group(2))
        elif line.lstrip().startswith("FAILED:"):
            failed += 1
    return (max(0, finished - failed), total) if total else None


def read_from(path: Path, offset: int) -> str:
    with path.open("rb") as fh:
        fh.seek(offset)
        return fh.read().decode("utf-8", "replace")


def working_set(mem: Mapping[str, Any]) -> int:
    """Memory the kernel cannot simply drop, as `docker stats` shows it: usage less inactive page cache.

    Raw cgroup usage counts the page cache of every file the build touched (gigabytes of torch wheels), which
    says nothing about how close the compiles came to an OOM kill.
    """
    usage = int(mem.get("usage") or 0)
    stats = mem.get("stats") or {}
    inactive = stats.get("total_inactive_file", stats.get("inactive_file", 0))
    return max(0, usage - int(inactive or 0))


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (CI cancelling, `kill`) must clean up exactly like Ctrl-C."""

    def handler(signum: int, frame: Any) -> None:
        raise Interrupted()

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_build(
    client: Any,
    mf: MatrixFile,
    jobs: Sequence[Job],
    settings: BuildSettings,
    *,
    on_change: Callable[[JobResult], None] | None = None,
    log: Callable[[str], None] = lambda _m: None,
) -> BuildReport:
    """Build every job. A failed job is in the report; only interruption or a setup error raises."""
    # Docker binds only absolute host paths; a relative --output would be taken for a volume name.
    settings = dataclasses.replace(settings, output=settings.output.resolve())
    try:
        settings.output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # before any container starts: nothing is built for nowhere to go
        raise ConfigError(f"--output {settings.output}: cannot make the directory ({exc.strerror})") from None
    report = BuildReport(run_id=settings.run_id, matrix=str(mf.path), started=time.time())
    report.jobs = [
        JobResult(
            job_id=j.id,
            variant_id=j.variant.id,
            python=j.python,
            package=mf.package.name,
            version=mf.package.version,
        )
        for j in jobs
    ]
    runner = Runner(client, mf, settings, on_change=on_change, log=log)
    stale = remove_stale_containers(client)
    if stale:
        log(f"removed {stale} container(s) left by an earlier run that did not finish")
    pool = ThreadPoolExecutor(max_workers=max(1, mf.build.concurrency), thread_name_prefix="job")
    pending: dict[Future[None], JobResult] = {}
    try:
        with sigterm_as_interrupt():
            queue = list(zip(jobs, report.jobs, strict=True))
            for job, result in queue:
                pending[pool.submit(runner.run_job, job, result)] = result
            while pending:
                done, _ = wait(list(pending), timeout=0.5, return_when=FIRST_COMPLETED)
                for fut in done:
                    result = pending.pop(fut)
                    fut.result()
                    if result.result != "ok" and not settings.keep_going:
                        runner.stop.set()
                        for f in pending:
                            f.cancel()
    except KeyboardInterrupt:
        runner.stop.set()
        for f in pending:
            f.cancel()
        remove_containers(client, filters={"label": f"{RUN_LABEL}={settings.run_id}"})
        for r in report.jobs:
            if r.result in ("pending",):
                r.result, r.reason = "interrupted", "the build was interrupted"
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        remove_containers(client, filters={"label": f"{RUN_LABEL}={settings.run_id}"})
        for r in report.jobs:
            if r.result == "pending":
                r.result, r.reason = "skipped", r.reason or "not started: the build stopped before this job"
        report.finished = time.time()
        write_report(report, settings.output / "report.json")
    return report


def write_report(report: BuildReport, path: Path) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    os.replace(tmp, path)


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
