"""One job of a build: its environment and mounts, its attempts, the driver's markers, the wheel's acceptance.

The driver (`factory.container.driver`) reports on marked lines of its log (`factory.container.protocol`): a
JSON object for results (phase, wheel, torch, objects); the attempt notes written here are marked too.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from factory.build import emulation, jobspec, logs, preflight
from factory.build.acceptance import Acceptance, accept_reused, oldest_torch_job
from factory.build.engine import Interrupted
from factory.build.jobcontext import DriverOutcome, JobContext, JobInputs
from factory.build.report import Attempt, JobResult
from factory.cache import sync
from factory.container import DRIVER, compilecache, protocol
from factory.core import leftovers, reproducible
from factory.core.errors import FactoryError
from factory.core.units import format_size
from factory.core.urls import printable
from factory.memory import jobmemory, profiles
from factory.memory.planner import Parallelism
from factory.memory.retry import STOP_FAILED, STOP_NO_ATTEMPTS, STOP_OK, Outcome, run_attempts
from factory.plan import shard as sharding
from factory.plan.plan import Job
from factory.spec.config import MatrixFile

LOG_TAIL_LINES = 40


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
    progress = logs.compile_progress(log_text)
    return (progress.compiled, progress.total) if progress is not None and progress.total else None


def read_from(path: Path, offset: int) -> str:
    with path.open("rb") as fh:
        fh.seek(offset)
        return fh.read().decode("utf-8", "replace")


def record_attempt(record: Attempt, outcome: DriverOutcome, segment: str) -> Outcome:
    """Fill an attempt's record from its driver's outcome and its log `segment`; what the retry loop
    (`memory.retry.run_attempts`) decides the next attempt by."""
    record.exit_code = outcome.exit_code
    record.oom_killed = outcome.oom_killed
    record.peak_bytes = outcome.peak_bytes
    record.objects_kept = outcome.markers.get("objects_kept")
    progress = ninja_progress(segment)
    record.objects_compiled = progress[0] if progress else None
    record.objects_planned = progress[1] if progress else None
    record.objects_total = outcome.markers.get("objects_total")
    kept = record.objects_kept or 0
    total = kept + (record.objects_planned or 0)
    return Outcome(
        ok=outcome.exit_code == 0 and not outcome.oom_killed,
        oom=outcome.oom_killed,
        peak_bytes=outcome.peak_bytes,
        objects_done=kept + (record.objects_compiled or 0),
        objects_total=total or None,
    )


def shard_plan(mf: MatrixFile, shard: sharding.Shard, source: Path) -> tuple[tuple[str, ...], str]:
    """A shard's compiles, balanced by the learned profile the job starts from, else the recipe; and the
    log's note of them."""
    learned = profiles.load_profile(profiles.profile_path(mf.package.name, mf.package.version))
    sources, basis = sharding.shard_sources(
        source, shard, entries=learned.entries, seconds_by_file=mf.recipe.compile_seconds_by_file
    )
    return sources, f"shard {shard}: {len(sources)} CUDA file(s), balanced by {basis}: " + " ".join(sources)


def preflight_plan(mf: MatrixFile, source: Path) -> tuple[tuple[str, ...], str]:
    """The candidates for the preflight's one device compile, cheapest first (`preflight.candidates`); and
    the log's note of them."""
    learned = profiles.load_profile(profiles.profile_path(mf.package.name, mf.package.version))
    ranked, basis = preflight.candidates(
        source, entries=learned.entries, seconds_by_file=mf.recipe.compile_seconds_by_file
    )
    return ranked, (
        f"preflight: every host compile, and of {len(ranked)} CUDA file(s) the cheapest by {basis} that "
        f"the build compiles (first: {ranked[0] if ranked else 'none'}), for one arch; no link, no wheel"
    )


class DriverLines:
    """What a job's driver containers say, line by line as it streams, and their memory: the live compile
    counts, the compile cache's hits and checks, the driver's marks; all into the job's result."""

    def __init__(
        self,
        ctx: JobContext,
        job: Job,
        result: JobResult,
        *,
        changed: Callable[[], None],
        note: Callable[[str], None] = lambda _line: None,
    ) -> None:
        self.ctx = ctx
        self.job = job
        self.result = result
        self.changed = changed
        self.note = note  # a line of the host's own into the job's log
        self.trace = logs.BuildTrace()  # what its builds compiled and linked, from their log lines
        self.progress = logs.CompileProgress()  # the running attempt's compiles over its ninja runs
        self.watch = logs.DeviceWatch()  # whether nvcc runs at all (every job must carry device code)
        self.estimate: logs.DeviceEstimate | None = None  # the source's CUDA files, once it is known

    def feed(self, line: str) -> Mapping[str, Any] | None:
        """Take one line in; the fields of a driver's mark, None for any other line."""
        result = self.result
        self.trace.feed(line)
        if self.estimate is not None and self.estimate.feed(line):
            result.device_done, result.device_share = len(self.estimate.done), self.estimate.fraction
        warning = self.watch.feed(line)
        if warning is not None:
            result.warnings.append(warning)
            self.note(f"warning: {warning}")
            self.ctx.log(f"{self.job.id}: warning: {warning}")
            self.changed()
        if self.progress.feed(line):  # live counts only: the attempt's record is read from its log
            progress = self.progress
            result.compiles_done, result.compiles_total = progress.done, progress.total
            result.compiles_runs = progress.runs
            result.compiles_run_done, result.compiles_run_total = progress.done_now, progress.total_now
            self.changed()
            return None
        served = sync.measured_cache(line)
        if served is not None:
            if served == protocol.CACHE_HIT:
                result.compiles_cached += 1
            else:
                result.compiles_compiled += 1
                self.cache_checked(line)
                if self.ctx.compile_cache is not None:
                    self.ctx.compile_cache.nudge()
            self.changed()
            return None
        fields = protocol.parse_mark(line)
        if fields is not None and "phase" in fields:
            result.phase = fields["phase"]
            self.changed()
        return fields

    def memory(self, usage: int) -> None:
        self.result.mem_now = usage
        self.result.peak_bytes = max(self.result.peak_bytes, usage)
        self.changed()

    def cache_checked(self, line: str) -> None:
        """A hit compiled again to check it (`build --check-cache`): counted, and one that differs reported
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


NOT_STARTED = "not started: the build stopped after an earlier failure"


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
        self.job_cache: sync.JobCache | None = None  # the compile cache, once the job has its inputs
        self.source_date_epoch = reproducible.DEFAULT_EPOCH  # the source's, once the job has its inputs
        self.lines = DriverLines(ctx, job, result, changed=self.changed, note=self.note)
        self.acceptance = Acceptance(self)

    @property
    def job_dir(self) -> str:
        """The job's directory in the shared work volume (`jobspec.job_dir`)."""
        return jobspec.job_dir(self.job.id, self.ctx.run_id)

    @property
    def profile_dir(self) -> Path:
        """The host side of the job's read-only profile mount: the learned profile as each attempt starts."""
        return self.ctx.run_dir / "profiles" / self.job.id

    @property
    def profile_version(self) -> str:
        """The key of the learned memory profile this job reads and extends: the package's version, qualified
        where the job is not measured natively on the default platform (`emulation.measured_on`)."""
        return profiles.keyed_version(self.mf.package.version, emulation.measured_on(self.job.platform))

    def driver_env(self, python: str | None = None) -> dict[str, str]:
        """What every driver phase needs (`jobspec.driver_env`). `python`: the interpreter of an install
        check other than the job's own (a Python its abi3 wheel covers)."""
        return jobspec.driver_env(
            job_dir=self.job_dir,
            python=python or self.job.python,
            owner=leftovers.owner_json(),  # `factory clean` tells a dead run's from it
            heartbeat_stale_s=self.ctx.heartbeat_stale_s,
            compile_cache=self.ctx.compile_cache.config if self.ctx.compile_cache is not None else None,
        )

    def container_env(self, parallel: Parallelism) -> dict[str, str]:
        """The build container's environment (`jobspec.container_env`) with this attempt's memory plan."""
        memory = jobmemory.wrapper_env(
            parallel,
            recipe=self.mf.recipe,
            job_dir=self.job_dir,
            memory_limit=self.ctx.memory_limit,
            package=self.mf.package.name,
            version=self.profile_version,
            profile_dir=self.profile_dir,
        )
        return jobspec.container_env(
            self.mf,
            self.job,
            driver=self.driver_env(),
            memory=memory,
            shard=self.ctx.shard,
            shard_sources=self.shard_sources,
            preflight_candidates=self.preflight_candidates if self.ctx.preflight else None,
            source_date_epoch=self.source_date_epoch,
        )

    def plan_estimate(self, source: Path) -> None:
        """The source's CUDA files and their weights (the learned profile's times, else the recipe's, else
        one each), against which the progress shows the device work done and the time left."""
        units = sharding.compile_units(source)
        if not units:
            return
        learned = profiles.load_profile(profiles.profile_path(self.mf.package.name, self.profile_version))
        weights = sharding.unit_weights(
            units, entries=learned.entries, seconds_by_file=self.mf.recipe.compile_seconds_by_file
        )
        self.lines.estimate = logs.DeviceEstimate.of(weights.by_unit, weights.basis)
        self.result.device_total = len(self.lines.estimate.weights)
        self.result.device_basis = logs.BASIS_WORDS[weights.basis]

    def plan_shard(self, source: Path) -> None:
        assert self.ctx.shard is not None
        self.shard_sources, line = shard_plan(self.mf, self.ctx.shard, source)
        self.note(line)

    def plan_preflight(self, source: Path) -> None:
        self.preflight_candidates, line = preflight_plan(self.mf, source)
        self.note(line)

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

        def on_line(line: str) -> None:
            fields = self.lines.feed(line)
            if fields is not None:
                markers.update(fields)

        limits = jobspec.limits(self.mf.build, memory_limit=self.ctx.memory_limit, cpus=self.ctx.cpus)
        spec = jobspec.driver_container(phase, image=image, env=env, mounts=mounts, limits=limits)
        try:
            outcome = self.ctx.engine.run(
                spec, log_path=self.log_path, on_line=on_line, on_memory=self.lines.memory
            )
        finally:
            self.result.mem_now = 0
        return DriverOutcome(
            exit_code=outcome.exit_code,
            oom_killed=outcome.oom_killed,
            peak_bytes=outcome.peak_bytes,
            markers=dict(markers),
        )

    def mounts(self, inputs: JobInputs, out_dir: Path) -> dict[str, dict[str, str]]:
        return jobspec.job_mounts(
            source=inputs.source,
            wheelhouse=inputs.wheelhouse,
            out_dir=out_dir,
            profile_dir=self.profile_dir,
            heartbeat_dir=self.ctx.heartbeat_file.parent,
            check_wheelhouse=inputs.check_wheelhouse,
            cache_mounts=self.job_cache.mounts() if self.job_cache is not None else None,
        )

    # -- the job -------------------------------------------------------------------------------------
    def run(self, prepare: Callable[[Job], JobInputs]) -> None:
        """The whole job; `prepare` gives its inputs (shared by the run's jobs). Never raises: a failure, and
        an interruption too (the main thread owns signal handling), is recorded in the result."""
        result, ctx = self.result, self.ctx
        if ctx.stop.is_set():  # an earlier job failed without --keep-going, or the run is being stopped
            result.result, result.reason = "skipped", NOT_STARTED
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
            reused = ctx.reuse.get(self.job.id) if ctx.shard is None else None
            oldest = oldest_torch_job(self.job)
            if oldest is not None and ctx.shard is None and not ctx.preflight and reused is None:
                prepare(oldest)  # its wheelhouse, for the install check: a download error before the compiles
            image = inputs.image
            self.source_date_epoch = inputs.source_date_epoch
            result.image, result.toolkit, result.image_id = image, inputs.toolkit, inputs.image_id
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
            if reused is not None:  # its wheel is published for older torches: checked, not compiled
                accept_reused(
                    self.acceptance, reused, image=image, mounts=mounts, prepare=prepare, inputs=inputs
                )
                return
            if ctx.shard is None and not ctx.preflight:
                self.plan_estimate(inputs.source)
            if ctx.shard is not None:
                self.plan_shard(inputs.source)
            if ctx.preflight:
                self.plan_preflight(inputs.source)
            if ctx.compile_cache is not None:
                ctx.compile_cache.before_job(self.job.id, inputs.cache_domain)
            built = self.build(image=image, mounts=mounts, out_dir=out_tmp)
            if built is not None:
                wheel, installed_torch, toolchain = built
                self.acceptance.accept(
                    wheel=wheel, torch=installed_torch, image=image, mounts=mounts, prepare=prepare,
                    inputs=inputs, toolchain=toolchain, epoch=self.source_date_epoch,
                )  # fmt: skip
        except Interrupted:
            result.result, result.reason = "interrupted", ctx.engine.stop_reason or "the build was stopped"
        except FactoryError as exc:
            result.result, result.reason = "failed", str(exc)
            self.log_error(result.reason)
        except Exception as exc:  # anything unforeseen must fail this job, not the whole run
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
            shutil.rmtree(self.acceptance.wheel_dir, ignore_errors=True)
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
            user=jobspec.CONTAINER_USER,
            mounts=jobspec.clean_mounts(self.ctx.heartbeat_file.parent),
        )

    def build(
        self, *, image: str, mounts: Mapping[str, Mapping[str, str]], out_dir: Path
    ) -> tuple[Path, str, object] | None:
        """Attempts until a wheel, a non-OOM failure, the last attempt or nothing left to change. The build
        directory outlives an OOM kill, so each retry resumes from the objects already compiled."""
        job, result, ctx = self.job, self.result, self.ctx
        archs = len(job.variant.archs)
        first = jobmemory.initial_parallelism(
            recipe=self.mf.recipe, archs=archs, limit_bytes=ctx.memory_limit, cpus=ctx.cpus,
            package=self.mf.package.name, version=self.profile_version,
        )  # fmt: skip
        last: list[DriverOutcome] = []
        package, version = self.mf.package.name, self.mf.package.version
        result.compiles_expected = profiles.load_compile_total(package, version)

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
            result.compiles_done = result.compiles_total = result.compiles_runs = 0
            result.compiles_since = time.monotonic()
            self.lines.progress = logs.CompileProgress()
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
            learn(self.mf, segment, version=self.profile_version)
            counted = record_attempt(record, outcome, segment)
            if counted.ok and number == 1 and record.objects_planned and not record.objects_kept:
                # a whole build's compiles (a retry resumes, and counts only those left)
                profiles.save_compile_total(package, version, record.objects_planned)
            return counted

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
            wheel = self.acceptance.take_wheel(out_dir, outcome.markers.get("wheel"))
            if wheel is None:
                result.result, result.reason = "failed", "the build finished without a wheel"
                return None
            # The driver reports the torch it built against (the wheel is pinned to that release) and
            # the toolchain it compiled with (the wheel's provenance names both).
            torch = str(outcome.markers.get("torch") or job.variant.torch)
            return wheel, torch, outcome.markers.get("toolchain")
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


def learn(mf: MatrixFile, segment: str, *, version: str | None = None) -> None:
    """Fold one attempt's measured compiles into the package's profile (`version`: the profile's key,
    `JobRun.profile_version`), which the next attempt reads."""
    with tempfile.NamedTemporaryFile("w", suffix=".log") as fh:
        fh.write(segment)
        fh.flush()
        jobmemory.record_profiles(
            package=mf.package.name, version=version or mf.package.version, log_path=Path(fh.name)
        )


def run_job(ctx: JobContext, job: Job, result: JobResult, *, prepare: Callable[[Job], JobInputs]) -> None:
    JobRun(ctx, job, result).run(prepare)
