"""One job of a build: its environment and mounts, its attempts, the driver's markers, the wheel's acceptance.

The driver (`factory.container.driver`) reports on marked lines of its log (`factory.container.protocol`): a
JSON object for results (phase, wheel, torch, objects); the attempt notes written here are marked too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from factory import buildlog, cache, images, leftovers, platform_tag, preflight, safefs, wheelcheck
from factory import shard as sharding
from factory.config import MatrixFile, format_size
from factory.container import (
    CONTAINER_DIR,
    DRIVER,
    IMPORT_ROOT,
    PACKAGE_MOUNT,
    compilecache,
    heartbeat,
    protocol,
)
from factory.engine import LABEL, RUN_LABEL, Engine, Interrupted, Limits, run_labels
from factory.errors import BuildError, FactoryError
from factory.memory import jobmemory, profiles
from factory.memory.planner import Parallelism
from factory.memory.retry import STOP_FAILED, STOP_NO_ATTEMPTS, STOP_OK, Outcome, run_attempts
from factory.plan import Job, matrix_env
from factory.report import Attempt, JobResult
from factory.urls import printable

WORK_VOLUME = "factory-work"
CHECK_WHEELHOUSE_MOUNT = "/wheelhouse-check"  # the driver's check phase installs from it too
CHECK_FAILED_DIR = "check-failed"  # under the output: a wheel that built and failed a check, kept
WORK_MOUNT = "/var/factory"
JOBS_ROOT = f"{WORK_MOUNT}/jobs"  # a job's directory there: `<job>-<run>` (`JobRun.job_dir`)
CONTAINER_USER = "10001:10001"
LOG_TAIL_LINES = 40
# a wheel the driver names: one plain file name of the wheel format, nothing that could leave its directory
WHEEL_NAME = re.compile(r"[A-Za-z0-9_.+-]+\.whl")
MAX_WHEEL_BYTES = 16 << 30
BUILD_REQUIREMENTS = ("pip", "setuptools", "wheel", "ninja", "packaging", "psutil")


@dataclass(frozen=True, kw_only=True)
class JobInputs:
    """What a job builds from, prepared once per run and shared by its jobs."""

    image: str
    source: Path
    wheelhouse: Path
    cache_domain: str = ""  # the compile cache's trust domain of the source (`cache.trust_domain`)
    toolkit: str | None = None  # the CUDA release of the image's nvcc, when the image says
    # the install check's own wheelhouse: the package's runtime requirements (`runtimereqs`); None: none
    check_wheelhouse: Path | None = None
    check_requirements: tuple[str, ...] = ()
    check_note: str = ""  # what the log says of them


@dataclass(frozen=True, kw_only=True)
class JobContext:
    """What every job of one run shares."""

    mf: MatrixFile
    engine: Engine
    run_id: str
    run_dir: Path
    output: Path
    memory_limit: int
    cpus: float
    on_change: Callable[[JobResult], None]
    log: Callable[[str], None]
    heartbeat_stale_s: float = heartbeat.STALE_S  # how long a build container outlives a silent factory
    shard: sharding.Shard | None = None  # --shard I/N: each job compiles that share into the cache, no wheel
    preflight: bool = False  # --preflight: each job compiles its host sources and one device source, no wheel
    compile_cache: cache.CacheSync | None = None  # None: the cache is off

    @property
    def heartbeat_file(self) -> Path:
        """The file the run touches while it lives (`engine.Heartbeat`); its directory is mounted into
        every build container."""
        return self.run_dir / "heartbeat" / heartbeat.FILE_NAME

    @property
    def stop(self) -> threading.Event:
        return self.engine.stop


def torch_requirement(torch: str) -> str:
    """ "2.14" -> "torch==2.14.*" (any patch release of that minor), "2.14.1" -> "torch==2.14.1"."""
    return f"torch=={torch}.*" if torch.count(".") == 1 else f"torch=={torch}"


def requirements(mf: MatrixFile, job: Job) -> list[str]:
    reqs = [torch_requirement(job.variant.torch), *BUILD_REQUIREMENTS, *mf.recipe.extra_build_requires]
    return list(dict.fromkeys(reqs))


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


def ninja_progress(log_text: str) -> tuple[int, int] | None:
    """(compiled, total) edges of the ninja runs in a log (one per extension): how far an attempt got before
    it died. Without a terminal ninja prints `[finished/total]` as each edge ends, failed ones too (with
    `FAILED:`)."""
    progress = buildlog.compile_progress(log_text)
    return (progress.compiled, progress.total) if progress is not None and progress.total else None


MAX_CHECK_LOG = 1 << 20  # of a check's log segment, the end read for its failure's reason


def read_tail_from(path: Path, offset: int, max_bytes: int = MAX_CHECK_LOG) -> str:
    """The log from `offset`, at most its last `max_bytes` (what a check container wrote is bounded here)."""
    try:
        with path.open("rb") as fh:
            end = fh.seek(0, os.SEEK_END)
            fh.seek(max(offset, end - max_bytes))
            return fh.read(max_bytes).decode("utf-8", "replace")
    except OSError:
        return ""


def read_from(path: Path, offset: int) -> str:
    with path.open("rb") as fh:
        fh.seek(offset)
        return fh.read().decode("utf-8", "replace")


@dataclass(frozen=True, kw_only=True)
class DriverOutcome:
    exit_code: int
    oom_killed: bool
    peak_bytes: int
    markers: Mapping[str, Any]


class JobRun:
    """Runs one job: prepare, build with OOM retries, accept the wheel. Records everything in `result`."""

    def __init__(self, ctx: JobContext, job: Job, result: JobResult) -> None:
        self.ctx = ctx
        self.mf = ctx.mf
        self.job = job
        self.result = result
        self.log_path = ctx.run_dir / "logs" / f"{job.id}.log"
        self.shard_sources: tuple[str, ...] | None = None  # a shard's own compiles, relative to the source
        self.preflight_candidates: tuple[str, ...] | None = None  # its device compile's, cheapest first
        self.job_cache: cache.JobCache | None = None  # the compile cache, once the job has its inputs
        self.trace = buildlog.BuildTrace()  # what its builds compiled and linked, from their log lines
        self.progress = buildlog.CompileProgress()  # the running attempt's compiles over its ninja runs

    @property
    def job_dir(self) -> str:
        """The job's directory in the shared work volume; per run, so concurrent runs never share one."""
        return f"{JOBS_ROOT}/{self.job.id}-{self.ctx.run_id}"

    @property
    def profile_dir(self) -> Path:
        """The host side of the job's read-only profile mount: the learned profile as each attempt starts."""
        return self.ctx.run_dir / "profiles" / self.job.id

    def driver_env(self, python: str | None = None) -> dict[str, str]:
        """What every driver phase needs, built from scratch: nothing of the host environment leaks in.
        `python`: the interpreter of an install check other than the job's own (a Python its abi3 wheel
        covers)."""
        return {
            "HOME": "/home/factory",
            protocol.ENV_JOB_DIR: self.job_dir,
            protocol.ENV_JOB_OWNER: leftovers.owner_json(),  # `factory clean` tells a dead run's from it
            protocol.ENV_PYTHON: f"python{python or self.job.python}",
            # uv's cache shares the work volume with the venvs: installing torch hardlinks, not copies.
            "UV_CACHE_DIR": f"{WORK_MOUNT}/uv-cache",
            "UV_LINK_MODE": "hardlink",
            "UV_PYTHON_DOWNLOADS": "never",
            "UV_NO_CONFIG": "1",
            "PYTHONPATH": IMPORT_ROOT,  # the driver and the nvcc wrapper import as `factory.container`
            heartbeat.ENV_FILE: f"{heartbeat.MOUNT}/{heartbeat.FILE_NAME}",
            heartbeat.ENV_STALE_S: f"{self.ctx.heartbeat_stale_s:g}",
            # local paths only: the store, its credentials and the signing key stay with the host
            **(self.cache_env() if self.ctx.compile_cache is not None else {}),
        }

    def cache_env(self) -> dict[str, str]:
        """The compile cache's read-only root and the job's outbox. The driver puts the host compiler through
        the cache (`driver.cache_env`): it alone sees the CXX the build would have had (the matrix's, the
        image's) and keeps it as FACTORY_REAL_CXX; a CXX set here would hide the image's."""
        assert self.ctx.compile_cache is not None
        env = {cache.ENV_DIR: cache.MOUNT, cache.ENV_OUT: cache.OUT_MOUNT}
        if self.ctx.compile_cache.config.verify:
            env[cache.ENV_VERIFY] = str(self.ctx.compile_cache.config.verify)
        return env

    def container_env(self, parallel: Parallelism) -> dict[str, str]:
        """The build container's environment: the driver's, the memory plan's (MAX_JOBS among it), then the
        matrix's own env for the job, which wins."""
        env = {
            **self.driver_env(),
            protocol.ENV_CUDA: self.job.variant.cuda,
            protocol.ENV_REQUIREMENTS: "\n".join(requirements(self.mf, self.job)),
            "PIP_NO_INDEX": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PYTHONUNBUFFERED": "1",
        }
        if self.job.limited_api:
            env[protocol.LIMITED_API_ENV] = self.job.limited_api
        env.update(
            jobmemory.wrapper_env(
                parallel,
                recipe=self.mf.recipe,
                job_dir=self.job_dir,
                memory_limit=self.ctx.memory_limit,
                package=self.mf.package.name,
                version=self.mf.package.version,
                profile_dir=self.profile_dir,
            )
        )
        env.update(matrix_env(self.mf, self.job))
        if self.ctx.shard is not None and self.shard_sources is not None:
            env[protocol.ENV_SHARD] = str(self.ctx.shard)
            env[protocol.ENV_SHARD_SOURCES] = json.dumps(list(self.shard_sources))
        if self.ctx.preflight and self.preflight_candidates is not None:
            env[protocol.ENV_PREFLIGHT] = json.dumps(list(self.preflight_candidates))
        return env

    def plan_shard(self, source: Path) -> None:
        """This shard's compiles, balanced by the learned profile the job starts from, else the recipe."""
        assert self.ctx.shard is not None
        name, version = self.mf.package.name, self.mf.package.version
        learned = profiles.load_profile(profiles.profile_path(name, version))
        self.shard_sources, basis = sharding.shard_sources(
            source,
            self.ctx.shard,
            entries=learned.entries,
            seconds_by_file=self.mf.recipe.compile_seconds_by_file,
        )
        self.note(
            f"shard {self.ctx.shard}: {len(self.shard_sources)} CUDA file(s), balanced by {basis}: "
            + " ".join(self.shard_sources)
        )

    def plan_preflight(self, source: Path) -> None:
        """The candidates for the preflight's one device compile, cheapest first (`preflight.candidates`)."""
        name, version = self.mf.package.name, self.mf.package.version
        learned = profiles.load_profile(profiles.profile_path(name, version))
        self.preflight_candidates, basis = preflight.candidates(
            source, entries=learned.entries, seconds_by_file=self.mf.recipe.compile_seconds_by_file
        )
        ranked = self.preflight_candidates
        self.note(
            f"preflight: every host compile, and of {len(ranked)} CUDA file(s) the cheapest by {basis} that "
            f"the build compiles (first: {ranked[0] if ranked else 'none'}), for one arch; no link, no wheel"
        )

    def log_lines(self) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []

    def changed(self) -> None:
        self.ctx.on_change(self.result)

    def note(self, line: str) -> None:
        with self.log_path.open("a") as fh:
            fh.write(protocol.note_line(line) + "\n")

    def log_error(self, reason: str) -> None:
        """A failure outside the driver (fetching the source, an image, docker itself) goes into the job's
        log too, as a plain line, so the log the failure names says why even when no container ran."""
        with contextlib.suppress(OSError), self.log_path.open("a") as fh:
            fh.write(f"factory: {reason}\n")

    # -- containers ----------------------------------------------------------------------------------
    def run_driver(
        self, phase: str, *, image: str, env: Mapping[str, str], mounts: Mapping[str, Mapping[str, str]]
    ) -> DriverOutcome:
        """One driver phase in a locked-down container; its markers gathered, its memory shown live."""
        markers: dict[str, Any] = {}
        result = self.result

        def on_line(line: str) -> None:
            self.trace.feed(line)
            if self.progress.feed(line):  # live counts only: the attempt's record is read from its log
                result.compiles_done, result.compiles_total = self.progress.done, self.progress.total
                self.changed()
                return
            served = cache.measured_cache(line)
            if served is not None:
                if served == protocol.CACHE_HIT:
                    result.compiles_cached += 1
                else:
                    result.compiles_compiled += 1
                    self.cache_checked(line)
                    if self.ctx.compile_cache is not None:
                        self.ctx.compile_cache.nudge()
                self.changed()
                return
            fields = protocol.parse_mark(line)
            if fields is not None:
                markers.update(fields)
                if "phase" in fields:
                    result.phase = fields["phase"]
                    self.changed()

        def on_memory(usage: int) -> None:
            result.mem_now = usage
            result.peak_bytes = max(result.peak_bytes, usage)
            self.changed()

        build = self.mf.build
        try:
            outcome = self.ctx.engine.run(
                image=image,
                command=[*DRIVER, phase],
                env=env,
                mounts=mounts,
                user=CONTAINER_USER,
                working_dir=WORK_MOUNT,
                limits=Limits(
                    memory_bytes=self.ctx.memory_limit,
                    cpus=self.ctx.cpus,
                    pids=build.pids_limit,
                    network="none" if build.offline else "bridge",
                ),
                log_path=self.log_path,
                on_line=on_line,
                on_memory=on_memory,
            )
        finally:
            result.mem_now = 0
        return DriverOutcome(
            exit_code=outcome.exit_code,
            oom_killed=outcome.oom_killed,
            peak_bytes=outcome.peak_bytes,
            markers=dict(markers),
        )

    def cache_checked(self, line: str) -> None:
        """A hit compiled again to check it (`build --verify-cache`): counted, and one that differs reported
        and removed from the local cache."""
        measured = protocol.parse_measurement(line)
        if measured is None or measured.cache_check is None:
            return
        self.result.cache_checked += 1
        if measured.cache_check != compilecache.CHECK_SAME:
            source = printable(measured.source or measured.key)  # the container's words: one line
            self.result.cache_suspects.append(source)
            if self.ctx.compile_cache is not None and measured.entry:
                self.ctx.compile_cache.suspect(self.job.id, measured.entry, source)

    def mounts(self, inputs: JobInputs, out_dir: Path) -> dict[str, dict[str, str]]:
        check = inputs.check_wheelhouse
        return {
            **({str(check): {"bind": CHECK_WHEELHOUSE_MOUNT, "mode": "ro"}} if check is not None else {}),
            **(self.job_cache.mounts() if self.job_cache is not None else {}),
            WORK_VOLUME: {"bind": WORK_MOUNT, "mode": "rw"},
            str(inputs.source): {"bind": "/src", "mode": "ro"},
            str(inputs.wheelhouse): {"bind": "/wheelhouse", "mode": "ro"},
            str(out_dir): {"bind": "/out", "mode": "rw"},
            str(CONTAINER_DIR): {"bind": PACKAGE_MOUNT, "mode": "ro"},
            str(self.profile_dir): {"bind": jobmemory.PROFILE_DIR, "mode": "ro"},
            str(self.ctx.heartbeat_file.parent): {"bind": heartbeat.MOUNT, "mode": "ro"},
        }

    # -- the job -------------------------------------------------------------------------------------
    def run(self, prepare: Callable[[Job], JobInputs]) -> None:
        """The whole job; `prepare` gives its inputs (shared by the run's jobs). Never raises: a failure, and
        an interruption too (the main thread owns signal handling), is recorded in the result."""
        result, ctx = self.result, self.ctx
        if ctx.stop.is_set():  # an earlier job failed without --keep-going, or the run is being stopped
            result.result, result.reason = (
                "skipped",
                "not started: the build stopped after an earlier failure",
            )
            return
        t0 = time.monotonic()
        result.started = t0
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        result.log = str(self.log_path)
        out_tmp = leftovers.output_tmp_dir(ctx.output, job_id=self.job.id, run_id=ctx.run_id)
        image: str | None = None
        try:
            result.phase = "prepare"
            self.changed()
            inputs = prepare(self.job)
            image = inputs.image
            result.image, result.toolkit = image, inputs.toolkit
            if inputs.check_note:
                self.note(inputs.check_note)
            result.check_requirements = list(inputs.check_requirements)
            leftovers.make_output_tmp_dir(out_tmp)  # owned, so a later run can tell it from a live one's
            out_tmp.chmod(0o777)  # the container's unprivileged user writes the wheel here
            self.profile_dir.mkdir(parents=True, exist_ok=True)
            if ctx.compile_cache is not None:
                self.job_cache = ctx.compile_cache.open_job(
                    self.job.id, domain=inputs.cache_domain, run_id=ctx.run_id
                )
            mounts = self.mounts(inputs, out_tmp)
            if ctx.shard is not None:
                self.plan_shard(inputs.source)
            if ctx.preflight:
                self.plan_preflight(inputs.source)
            if ctx.compile_cache is not None:
                ctx.compile_cache.before_job(self.job.id, inputs.cache_domain)
            built = self.build(image=image, mounts=mounts, out_dir=out_tmp)
            if built is not None:
                wheel, installed_torch = built
                self.accept(wheel=wheel, torch=installed_torch, image=image, mounts=mounts, prepare=prepare)
        except Interrupted:
            result.result, result.reason = "interrupted", "the build was stopped"
        except FactoryError as exc:
            result.result, result.reason = "failed", str(exc)
            self.log_error(result.reason)
        except Exception as exc:  # a docker API error must fail this job, not the whole run
            result.result, result.reason = "failed", f"{type(exc).__name__}: {exc}"
            self.log_error(result.reason)
        finally:
            result.wall_s = round(time.monotonic() - t0, 1)
            result.phase = result.result
            if result.result != "ok":
                result.log_tail = log_tail(self.log_path)
            if ctx.preflight and result.preflight is None:
                result.preflight = preflight.failed(
                    lines=self.log_lines(), reason=result.reason, log=result.log
                )
            shutil.rmtree(out_tmp, ignore_errors=True)  # fd-based on Linux: never follows a link
            shutil.rmtree(self.wheel_dir, ignore_errors=True)
            if ctx.compile_cache is not None and self.job_cache is not None:
                with contextlib.suppress(Exception):  # the cache never fails a job
                    ctx.compile_cache.after_job(self.job.id)
            self.changed()
            if not ctx.stop.is_set() and image is not None:
                with contextlib.suppress(Exception):
                    self.clean(image)

    def clean(self, image: str) -> None:
        self.ctx.engine.run_short(
            image,
            [*DRIVER, "clean"],
            env=self.driver_env(),
            user=CONTAINER_USER,
            mounts={
                WORK_VOLUME: {"bind": WORK_MOUNT, "mode": "rw"},
                str(CONTAINER_DIR): {"bind": PACKAGE_MOUNT, "mode": "ro"},
                str(self.ctx.heartbeat_file.parent): {"bind": heartbeat.MOUNT, "mode": "ro"},
            },
        )

    def build(
        self, *, image: str, mounts: Mapping[str, Mapping[str, str]], out_dir: Path
    ) -> tuple[Path, str] | None:
        """Attempts until a wheel, a non-OOM failure, the last attempt or nothing left to change. The build
        directory outlives an OOM kill, so each retry resumes from the objects already compiled."""
        job, result, ctx = self.job, self.result, self.ctx
        archs = len(job.variant.archs)
        first = jobmemory.initial_parallelism(
            recipe=self.mf.recipe, archs=archs, limit_bytes=ctx.memory_limit, cpus=ctx.cpus,
            package=self.mf.package.name, version=self.mf.package.version,
        )  # fmt: skip
        last: list[DriverOutcome] = []

        def attempt(number: int, parallel: Parallelism) -> Outcome:
            if number > 1:
                # the previous attempt's note is the reason for this one's plan
                result.attempts[-1].note = parallel.reason
                ctx.log(f"{job.id}: {parallel.reason}")
            record = Attempt(
                number=number, max_jobs=parallel.max_jobs, nvcc_threads=parallel.nvcc_threads,
                memory_limit=ctx.memory_limit,
            )  # fmt: skip
            result.attempts.append(record)
            result.compiles_done = result.compiles_total = 0
            self.progress = buildlog.CompileProgress()
            start = self.log_path.stat().st_size if self.log_path.exists() else 0
            # after an OOM the plan's reason is already the attempt's report line
            self.note(parallel.reason if number > 1 else f"attempt {number}: {parallel.reason}")
            env = self.container_env(parallel)
            self.note(f"MAX_JOBS={env['MAX_JOBS']} NVCC_THREADS={env['NVCC_THREADS']}")
            record.ninja_jobs = int(env["MAX_JOBS"]) if env["MAX_JOBS"].isdigit() else None
            t0 = time.monotonic()
            outcome = self.run_driver("build", image=image, env=env, mounts=mounts)
            last[:] = [outcome]
            segment = read_from(self.log_path, start)
            record.wall_s = round(time.monotonic() - t0, 1)
            record.exit_code = outcome.exit_code
            record.oom_killed = outcome.oom_killed
            record.peak_bytes = outcome.peak_bytes
            record.objects_kept = outcome.markers.get("objects_kept")
            progress = ninja_progress(segment)
            record.objects_compiled = progress[0] if progress else None
            record.objects_planned = progress[1] if progress else None
            record.objects_total = outcome.markers.get("objects_total")
            self.learn(segment)
            kept = record.objects_kept or 0
            total = kept + (record.objects_planned or 0)
            return Outcome(
                ok=outcome.exit_code == 0 and not outcome.oom_killed,
                oom=outcome.oom_killed,
                peak_bytes=outcome.peak_bytes,
                objects_done=kept + (record.objects_compiled or 0),
                objects_total=total or None,
            )

        retries = run_attempts(
            first, attempt, max_attempts=self.mf.build.max_attempts, limit_bytes=ctx.memory_limit, archs=archs
        )
        outcome = last[0]
        tried = retries.last
        if retries.stop == STOP_OK and ctx.shard is not None:
            # its compiles are in the cache (the host syncs them after the job); its wheel is of empty objects
            counts = sharding.count_compiles(self.log_lines())
            result.result, result.reason = "ok", sharding.summary(ctx.shard, counts)
            return None
        if retries.stop == STOP_OK and ctx.preflight:
            # its compiles are in the cache; its build linked nothing and handed back no wheel
            result.preflight = preflight.passed(
                mark=outcome.markers.get("preflight"), lines=self.log_lines(), log=result.log
            )
            result.result, result.reason = "ok", preflight.summary(result.preflight)
            return None
        if retries.stop == STOP_OK:
            wheel = self.take_wheel(out_dir, outcome.markers.get("wheel"))
            if wheel is None:
                result.result, result.reason = "failed", "the build finished without a wheel"
                return None
            # The driver reports the torch it built against; the wheel is pinned to that release.
            return wheel, str(outcome.markers.get("torch") or job.variant.torch)
        if retries.stop == STOP_FAILED:
            result.result = "failed"
            result.reason = f"build exited with code {outcome.exit_code} (attempt {tried.number})"
            return None
        record = result.attempts[-1]
        if retries.stop == STOP_NO_ATTEMPTS:
            record.note = (
                f"attempt {tried.number}: OOM at {format_size(outcome.peak_bytes)}; no attempts left"
            )
        elif tried.next_plan is not None:  # nothing to change: the plan a retry would have run
            record.note = tried.next_plan.reason
            ctx.log(f"{job.id}: {tried.next_plan.reason}")
        result.result = "oom"
        result.reason = (
            f"OOM-killed at {format_size(record.peak_bytes)} of a {format_size(ctx.memory_limit)} limit "
            f"after {len(result.attempts)} attempt(s)"
        )
        return None

    @property
    def wheel_dir(self) -> Path:
        """Where the host keeps its copy of the job's wheel while it checks it: no container writes there.
        Beside the output (a rename away from it), owned like the container's, so a dead run's is removed."""
        return leftovers.output_tmp_dir(self.ctx.output, job_id=f"{self.job.id}-host", run_id=self.ctx.run_id)

    def take_wheel(self, out_dir: Path, name: object) -> Path | None:
        """The wheel the driver named, copied out of the container-written output directory into the host's
        own (`safefs`: a plain file name, a regular file, no link followed, bounded); None when there is no
        such wheel."""
        if not isinstance(name, str) or not WHEEL_NAME.fullmatch(name):
            return None
        shutil.rmtree(self.wheel_dir, ignore_errors=True)
        leftovers.make_output_tmp_dir(self.wheel_dir)
        try:
            safefs.copy_out(out_dir, name, self.wheel_dir, name, max_bytes=MAX_WHEEL_BYTES)
        except OSError:
            return None
        return self.wheel_dir / name

    def learn(self, segment: str) -> None:
        """Fold one attempt's measured compiles into the package's profile, which the next attempt reads."""
        with tempfile.NamedTemporaryFile("w", suffix=".log") as fh:
            fh.write(segment)
            fh.flush()
            jobmemory.record_profiles(
                package=self.mf.package.name, version=self.mf.package.version, log_path=Path(fh.name)
            )

    def install_check(
        self,
        wheel: Path,
        *,
        python: str,
        image: str,
        mounts: Mapping[str, Mapping[str, str]],
        prepare: Callable[[Job], JobInputs],
    ) -> bool:
        """Install the wheel with its torch into a fresh venv of `python` and import it. A Python the job's
        abi3 wheel covers is checked in the image and with the wheelhouse a job of that Python would get
        (`prepare`'s)."""
        job, result = self.job, self.result
        if python != job.python:
            self.note(f"install check on Python {python}, which the {job.interpreter}-abi3 wheel covers")
            inputs = prepare(replace(job, python=python, covers=()))
            image = inputs.image
            binds = ("/wheelhouse", CHECK_WHEELHOUSE_MOUNT)
            mounts = {k: v for k, v in mounts.items() if v["bind"] not in binds}
            mounts[str(inputs.wheelhouse)] = {"bind": "/wheelhouse", "mode": "ro"}
            if inputs.check_wheelhouse is not None:
                mounts[str(inputs.check_wheelhouse)] = {"bind": CHECK_WHEELHOUSE_MOUNT, "mode": "ro"}
        # the host's checked copy, read-only: what is installed is what is accepted
        mounts = {k: v for k, v in mounts.items() if v["bind"] != "/out"}
        mounts[str(wheel.parent)] = {"bind": "/out", "mode": "ro"}
        env = {
            **self.driver_env(python),
            protocol.ENV_WHEEL: wheel.name,
            protocol.ENV_IMPORT_CHECK: wheelcheck.import_check_script(self.mf.recipe.import_name),
        }
        start = self.log_path.stat().st_size if self.log_path.exists() else 0
        outcome = self.run_driver("check", image=image, env=env, mounts=mounts)
        if outcome.exit_code != 0:
            result.result = "failed"
            on = f" on Python {python}" if python != job.python else ""
            why = buildlog.check_failure_reason(read_tail_from(self.log_path, start))
            result.reason = f"install/import check{on} failed (exit {outcome.exit_code})" + (
                f": {why}" if why else ""
            )
            return False
        result.checked_pythons.append(python)
        return True

    def accept(
        self,
        *,
        wheel: Path,
        torch: str,
        image: str,
        mounts: Mapping[str, Mapping[str, str]],
        prepare: Callable[[Job], JobInputs],
    ) -> None:
        """Label, pin torch, retag the platform, check the wheel, then install and import it in a fresh
        container; only then is it moved to the output. A wheel that built and failed a check is kept
        (`keep_wheel`), so that mending the check needs no compile."""
        job, result = self.job, self.result
        result.phase = "check"
        self.changed()
        self.note("checking the wheel")
        passed = False
        try:
            wheel = self.label(wheel)
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
                limited_api=job.limited_api,
                host_only=self.host_only(wheel),
            )
            if problems:
                result.result = "failed"
                result.reason = "wheel check failed: " + "; ".join(problems)
                return
            for python in job.pythons:
                if not self.install_check(wheel, python=python, image=image, mounts=mounts, prepare=prepare):
                    return
            passed = True
        finally:
            if not passed:
                self.keep_wheel(wheel)
        final = self.ctx.output / wheel.name
        os.replace(wheel, final)
        final.chmod(0o644)
        result.wheel = final.name
        result.result = "ok"

    def label(self, wheel: Path) -> Path:
        """The wheel with the variant's local version label: as built when its setup.py read the label,
        else set by the host (`wheelcheck.set_local_version`), whatever the recipe."""
        label = self.job.variant.local_version
        if not label:
            return wheel
        labelled = wheelcheck.set_local_version(wheel, label)
        if labelled is None:
            return wheel
        self.note(f"the wheel's version had no local label: {wheel.name} is now {labelled.name}")
        return labelled

    def host_only(self, wheel: Path) -> tuple[str, ...]:
        """The extension modules the wheel check lets carry no device code: those whose link in the build
        had no object nvcc compiled (`buildlog.module_kinds`), and the recipe's `host_only_libraries`,
        which are taken as they are; where the two disagree the log says so."""
        try:
            with zipfile.ZipFile(wheel) as archive:
                members = [n for n in archive.namelist() if wheelcheck.is_extension_module(n)]
        except (zipfile.BadZipFile, OSError):
            return self.mf.recipe.host_only_libraries  # the wheel check says what is wrong with it
        kinds = buildlog.module_kinds(members, self.trace)
        self.note(f"extension modules: {buildlog.describe_kinds(kinds)}")
        inferred = buildlog.host_only_globs(kinds)
        self.result.host_only = sorted(m for m, k in kinds.items() if k == buildlog.HOST)
        explicit = self.mf.recipe.host_only_libraries
        for member, kind in sorted(kinds.items()):
            if kind == buildlog.DEVICE and any(wheelcheck.library_glob_matches(member, g) for g in explicit):
                self.note(
                    f"the recipe's host_only_libraries names {printable(member)}, whose link has objects "
                    "nvcc compiled: it is excused from carrying device code as the recipe says"
                )
        return tuple(dict.fromkeys([*explicit, *inferred]))

    def keep_wheel(self, wheel: Path) -> None:
        """Keep a wheel that built but failed a check in `<output>/check-failed/`, named in the report and
        the summary: checking it again needs no compile (and a rerun finds its compiles in the cache)."""
        if not wheel.is_file() or wheel.is_symlink():
            return
        kept_dir = self.ctx.output / CHECK_FAILED_DIR
        try:
            kept_dir.mkdir(exist_ok=True)
            kept = kept_dir / wheel.name
            os.replace(wheel, kept)
            kept.chmod(0o644)
        except OSError as exc:
            self.note(f"the wheel could not be kept: {exc}")
            return
        self.result.kept_wheel = str(kept)
        self.note(f"the wheel that failed its check is kept: {kept}")


def run_job(ctx: JobContext, job: Job, result: JobResult, *, prepare: Callable[[Job], JobInputs]) -> None:
    JobRun(ctx, job, result).run(prepare)


def remove_stale_job_dirs(client: Any) -> list[str]:
    """Remove the work volume's job directories that runs now gone left (a finished job removes its own; a
    killed or interrupted run's stay), by `leftovers.stale_job_dirs`; their paths in the volume. Nothing when
    the volume, or a builder image to open it with, is not on this host."""
    import docker.errors

    try:
        client.volumes.get(WORK_VOLUME)
    except docker.errors.NotFound:
        return []
    image = images.housekeeping_image(images.list_images(client))
    if image is None:
        return []
    engine = Engine(client, labels=run_labels(f"clean-{os.getpid()}"), stop=threading.Event())

    def driver(*args: str) -> str:
        try:
            return engine.run_short(
                image,
                [*DRIVER, *args],
                env={"PYTHONPATH": IMPORT_ROOT},
                user=CONTAINER_USER,
                mounts={
                    WORK_VOLUME: {"bind": WORK_MOUNT, "mode": "rw"},
                    str(CONTAINER_DIR): {"bind": PACKAGE_MOUNT, "mode": "ro"},
                },
            )
        except docker.errors.DockerException as exc:
            first = str(exc).strip().splitlines()[:1]
            raise BuildError(
                f"volume {WORK_VOLUME}: the driver's {args[0]} in {image} failed "
                f"({type(exc).__name__}{': ' + first[0] if first else ''})"
            ) from None

    listed = protocol.parse_job_listing(driver("jobs", JOBS_ROOT))
    # read after the listing, so that a container started meanwhile is seen
    running = {c.labels.get(RUN_LABEL, "") for c in client.containers.list(filters={"label": LABEL})}
    stale = leftovers.stale_job_dirs(listed, running_runs=running - {""})
    if not stale:
        return []
    removed = protocol.parse_removed(driver("remove-jobs", JOBS_ROOT, *stale))
    return [f"{JOBS_ROOT}/{name}" for name in removed]
