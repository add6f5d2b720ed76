"""Running planned jobs: a pool of job threads, the inputs they share, signals, a report at the end.

Threads: each job runs in a worker thread that owns its containers (`factory.build.jobrun`); the main thread
only waits, renders progress and handles signals. What jobs share (the source tree, builder images,
wheelhouses, the work volume) is made once per run, whichever job asks first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from factory.build import domainnote, facts, images, runtimereqs, wheelhouse
from factory.build.engine import (
    RUN_LABEL,
    Engine,
    Heartbeat,
    Interrupted,
    get_image,
    remove_containers,
    remove_stale_containers,
    run_labels,
)
from factory.build.jobcontext import JobContext, JobInputs
from factory.build.jobrun import run_job
from factory.build.jobspec import CONTAINER_USER, WORK_MOUNT, WORK_VOLUME, requirements
from factory.build.report import BuildReport, JobResult, SourceInfo, write_report
from factory.build.source import PreparedSource, prepare_package
from factory.cache import sync
from factory.container import heartbeat, protocol
from factory.core import home, leftovers
from factory.core.errors import BuildError, ConfigError, FactoryError, PatchError
from factory.memory import jobmemory
from factory.plan import glibcfloor
from factory.plan.plan import Job
from factory.plan.schedule import Schedule
from factory.plan.shard import Shard
from factory.spec import toolchains
from factory.spec.config import MatrixFile
from factory.spec.options import PYTORCH_INDEX
from factory.wheel import provenance, record

if TYPE_CHECKING:
    from factory.build.reuse import Reuse

BUDGET_FRACTION = 0.75  # of host memory, when the matrix sets no memory_budget


@dataclass(frozen=True, kw_only=True)
class BuildSettings:
    output: Path
    keep_going: bool = False
    memory: int | None = None
    cpus: float | None = None
    shard: Shard | None = None  # --shard I/N: compile that share of each job into the cache, make no wheel
    # --preflight: each job's host compiles and one device compile (`factory.build.preflight`), no link, no
    # wheel
    preflight: bool = False
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    # the compile cache, as `cache.resolve` made it from build.cache, --cache and the publish store; None: off
    compile_cache: sync.CacheConfig | None = None
    # stable-ABI jobs (by id) that take their published wheel instead of compiling (`factory.build.reuse`)
    reuse: Mapping[str, Reuse] = field(default_factory=dict)
    # projects other matrices of this run built before this one (`buildplan.run_ordered`): the install
    # check takes a runtime requirement naming one of them from there
    dependencies: tuple[runtimereqs.Dependency, ...] = ()


def git_commit(tree: Path) -> str | None:
    """The commit a cloned tree has checked out; None when git cannot say."""
    try:
        proc = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
    except OSError:
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def host_memory() -> int:
    return psutil.virtual_memory().total


def container_memory(mf: MatrixFile, settings: BuildSettings) -> int:
    """Each container's limit; all `concurrency` containers together stay within the host budget."""
    budget = mf.build.memory_budget or int(host_memory() * BUDGET_FRACTION)
    per_job = settings.memory if settings.memory is not None else mf.build.memory
    limits = jobmemory.container_limits(
        budget_bytes=budget, concurrency=mf.build.concurrency, per_job_bytes=per_job
    )
    return limits[0]


def heartbeat_stale_s() -> float:
    """How long a build container outlives a silent factory; tests shorten it through the environment."""
    raw = os.environ.get(protocol.ENV_HEARTBEAT_STALE_S)
    if not raw:
        return heartbeat.STALE_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value < math.inf:
        raise ConfigError(f"{protocol.ENV_HEARTBEAT_STALE_S}={raw!r}: must be a positive number of seconds")
    return value


class Runner:
    """One `factory build` invocation: its job context and the inputs its jobs share."""

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
        self.log = log
        self.stop = threading.Event()
        self.engine = Engine(client, labels=run_labels(settings.run_id), stop=self.stop)
        self.home = home.factory_home()
        config = settings.compile_cache
        self.compile_cache = None if config is None else sync.CacheSync(config, log=log)
        self.context = JobContext(
            mf=mf,
            engine=self.engine,
            run_id=settings.run_id,
            run_dir=self.home / "runs" / settings.run_id,
            output=settings.output,
            memory_limit=container_memory(mf, settings),
            cpus=settings.cpus or mf.build.cpus or float(os.cpu_count() or 1),
            on_change=on_change or (lambda _r: None),
            log=log,
            heartbeat_stale_s=heartbeat_stale_s(),
            shard=settings.shard,
            preflight=settings.preflight,
            reuse=settings.reuse,
            compile_cache=self.compile_cache,
        )
        self._results: dict[int, JobResult] = {}  # the running jobs' results, by their thread
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._cache: dict[str, Any] = {}

    # -- shared, computed once per key even with concurrent jobs --------------------------------------
    def _once(self, key: str, make: Callable[[], Any]) -> Any:
        with self._locks_guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._cache:
                try:
                    self._cache[key] = make()
                except FactoryError as exc:
                    # every job that shares it fails as the first did, without trying again (an image no
                    # registry serves is one failure, not one per job)
                    self._cache[key] = exc
            found = self._cache[key]
            if isinstance(found, FactoryError):
                raise found
            return found

    def prepared_source(self) -> PreparedSource:
        return self._once(
            "source",
            lambda: prepare_package(self.mf.package, self.mf.recipe, self.home, matrix_file=self.mf.display),
        )

    def source_info(self) -> SourceInfo:
        """The source's provenance for the report; only its kind while no job has prepared it."""
        kind = self.mf.package.source.kind
        prepared = self._cache.get("source")
        if not isinstance(prepared, PreparedSource):  # not prepared yet, or its failure (`_once` keeps it)
            return SourceInfo(kind=kind)
        commit = git_commit(prepared.tree) if kind == "git" else None
        return SourceInfo(kind=kind, sdist=prepared.sdist, sha256=prepared.sha256, commit=commit)

    def image(self, job: Job) -> str:
        b = self.mf.build
        explicit = b.images.get(job.variant.cuda)
        if explicit:
            return self._once(f"image:{explicit}", lambda: self._explicit_image(explicit))
        # Keyed by the image, not the Python: the Pythons of one toolchain share one image, made once.
        name = toolchains.builder_image_for(
            cuda=job.variant.cuda,
            python=job.python,
            flavor=b.flavor,
            base_image=b.base_image,
            floor=job.glibc,
            target=job.platform,
        )
        return self._once(
            f"image:{name}",
            lambda: images.ensure_builder_image(
                self.client,
                cuda=job.variant.cuda,
                python=job.python,
                flavor=b.flavor,
                base_image=b.base_image,
                progress=self.log,
                floor=job.glibc,
                target=job.platform,
            ),
        )

    def _explicit_image(self, ref: str) -> str:
        if get_image(self.client, ref) is None:
            images.pull_image(self.client, ref, progress=self.log)
        return ref

    def wheelhouse_for(self, job: Job) -> Path:
        reqs = requirements(self.mf, job)
        index = self.mf.build.torch_index_url(job.variant.cuda)
        extra = () if index is None else (index,)
        key = f"wheelhouse:{job.python}:{job.platform.name}:{reqs}:{extra}"
        return self._once(key, lambda: self._download_build_wheelhouse(job, reqs, extra))

    def activity(self) -> Callable[[str], None]:
        """What the progress line of the job this thread runs says it is doing while its phase alone does
        not (pip's downloads in `prepare`: GBs of torch and CUDA wheels, for its own torch or the oldest
        its wheel covers)."""
        result = self._results.get(threading.get_ident())

        def show(text: str) -> None:
            if result is not None:
                result.activity = text
                self.context.on_change(result)

        return show

    def _download_build_wheelhouse(self, job: Job, reqs: list[str], extra: tuple[str, ...]) -> Path:
        """The build's wheelhouse, whose torch is a build for the job's CUDA: where pip took another build
        of the release (a `+cpu` one), that exact version is refused once and the download repeated."""
        cuda = job.variant.cuda
        show = self.activity()
        try:
            return self._download_cuda_torch(job, reqs, extra, cuda=cuda, show=show)
        finally:
            show("")

    def _download_cuda_torch(
        self, job: Job, reqs: list[str], extra: tuple[str, ...], *, cuda: str, show: Callable[[str], None]
    ) -> Path:
        def download(reqs: list[str]) -> Path:
            return wheelhouse.download_wheelhouse(
                reqs,
                self.home / "wheelhouses",
                python=job.python,
                platform=job.platform.wheelhouse_tag,
                extra_index_urls=extra,
                progress=show,
            )

        path = download(reqs)
        foreign = wheelhouse.foreign_torch(path, cuda=cuda)
        if foreign is None:
            return path
        self.log(f"{job.id}: the index's {reqs[0]} is {foreign}, no CUDA {cuda} build: refusing that version")
        path = download([wheelhouse.without_version(reqs[0], foreign), *reqs[1:]])
        again = wheelhouse.foreign_torch(path, cuda=cuda)
        if again is not None:
            pytorch = PYTORCH_INDEX.format(tag=cuda.replace(".", ""))
            raise BuildError(
                f"{job.id}: the torch index has no CUDA {cuda} build for {reqs[0]} (pip takes {again}); "
                f"point build.torch_index for {cuda} at one that has (PyTorch's: {pytorch})"
            )
        return path

    def runtime_requirements(self) -> runtimereqs.Declared:
        """The package's runtime requirements: its source's metadata (read once) and the recipe's."""
        return self._once(
            "runtime-requirements",
            lambda: runtimereqs.with_recipe(
                runtimereqs.declared_requirements(self.prepared_source().tree), self.mf.recipe.extra_requires
            ),
        )

    def dependencies_of(self, job: Job) -> tuple[runtimereqs.Dependency, ...]:
        """The projects built earlier in this run that the job's runtime requirements name; BuildError, one
        line, where the job of one of them for this variant and Python failed (nothing to check against)."""
        if not self.settings.dependencies:
            return ()
        deps = runtimereqs.needed(
            self.settings.dependencies, self.runtime_requirements(), package=self.mf.package.name,
            python=job.python, platform=job.platform,
        )  # fmt: skip
        problem = runtimereqs.dependency_problem(deps, variant_id=job.variant.id, python=job.python)
        if problem is not None:
            raise BuildError(problem)
        return deps

    def check_wheelhouse_for(self, job: Job) -> runtimereqs.CheckWheelhouse:
        """The package's runtime requirements for the install check, downloaded before the build starts. A
        project another matrix of this run built comes from there (`dependencies_of`): its wheel for the
        job's variant and Python, else its published index; the factory's own indexes (those and
        build.check_indexes) are read with the tags the check's container accepts (`check_platform`)."""
        declared = self.runtime_requirements()
        deps = self.dependencies_of(job)
        key = (job.variant.id, job.python)
        built = tuple(d.wheels[key] for d in deps if key in d.wheels)
        published = [d.index_url(job.variant.id) for d in deps if key not in d.wheels]
        index = self.mf.build.torch_index_url(job.variant.cuda)
        ours = (
            *self.mf.build.check_index_urls(job.variant.id, own=self.mf.publish.pip_index()),
            *(url for url in published if url is not None),
        )
        extra = (*(() if index is None else (index,)), *dict.fromkeys(ours))
        platform = (
            glibcfloor.check_platform(
                self.mf.build, cuda=job.variant.cuda, python=job.python, target=job.platform, floor=job.glibc
            )
            if ours or built
            else None
        )
        # a dependency's wheel pins torch: pip takes it (and CUDA's wheels) from the build's wheelhouse
        links = (self.wheelhouse_for(job),) if built else ()
        return self._once(
            f"check-wheelhouse:{job.python}:{job.platform.name}:{extra}:{platform}:{built}",
            lambda: runtimereqs.check_wheelhouse(
                declared,
                package=self.mf.package.name,
                python=job.python,
                dest=self.home / "wheelhouses",
                extra_index_urls=extra,
                platform=platform,
                target=job.platform,
                built=built,
                find_links=links,
            ),
        )

    def ensure_work_volume(self, image: str) -> None:
        """The shared work volume must belong to the unprivileged build user; only root can chown it."""

        def make() -> None:
            self.engine.ensure_volume(WORK_VOLUME)
            self.engine.run_short(
                image,
                [
                    "sh",
                    "-c",
                    f"mkdir -p {WORK_MOUNT}/uv-cache {WORK_MOUNT}/jobs && "
                    f"chown {CONTAINER_USER} {WORK_MOUNT} {WORK_MOUNT}/uv-cache {WORK_MOUNT}/jobs",
                ],
                user="0:0",
                cap_add=["CHOWN"],
                mounts={WORK_VOLUME: {"bind": WORK_MOUNT, "mode": "rw"}},
            )

        self._once(f"volume:{image}", make)

    def inputs(self, job: Job) -> JobInputs:
        self.dependencies_of(job)  # a dependency that failed fails the job before anything is made for it
        image = self.image(job)
        source = self.prepared_source().tree
        wh = self.wheelhouse_for(job)
        self.ensure_work_volume(image)
        domain = sync.trust_domain(self.prepared_source().code_id)
        if self.compile_cache is not None:
            self._once("domain-note", lambda: self.note_domain(domain))
        toolkit = self._once(f"toolkit:{image}", lambda: images.image_toolkit(self.client, image))
        check = self.check_wheelhouse_for(job)
        local = self._once(f"local-image:{image}", lambda: get_image(self.client, image))
        return JobInputs(
            image=image, source=source, wheelhouse=wh, cache_domain=domain, toolkit=toolkit,
            check_wheelhouse=check.path, check_requirements=check.requirements, check_note=check.note,
            image_id=local.id if local is not None else None,
            facts=facts.InputFacts(
                source=self._once("source-facts", self.source_facts),
                image=facts.image_identity(self.mf, job, local.labels if local is not None else {}),
                build_requirements=self._once(f"facts:{wh}", lambda: facts.wheelhouse_facts(wh)),
            ),
            source_date_epoch=self.prepared_source().source_date_epoch,
        )  # fmt: skip

    def note_domain(self, domain: str) -> None:
        """Say so when the recipe's patches moved the source to a new compile-cache domain."""
        package = self.mf.package
        note = domainnote.remember(
            self.home, package=package.name, version=package.version, domain=domain,
            patches=self.mf.recipe.patches,
        )  # fmt: skip
        if note is not None:
            self.log(f"note: {note}")

    def source_facts(self) -> provenance.SourceFacts:
        """The source as the wheels' provenance names it (a path source's tree hashed once per run)."""
        prepared = self.prepared_source()
        commit = git_commit(prepared.tree) if self.mf.package.source.kind == "git" else None
        return facts.source_facts(self.mf, prepared, commit=commit)

    def run_job(self, job: Job, result: JobResult) -> None:
        self._results[threading.get_ident()] = result
        run_job(self.context, job, result, prepare=self.inputs)


def interrupted_reason(exc: BaseException) -> str:
    """What the report says of the jobs a signal stopped: the build did not fail, it was interrupted."""
    how = "SIGTERM" if isinstance(exc, Interrupted) and exc.args == ("SIGTERM",) else "Ctrl-C (SIGINT)"
    return f"interrupted by {how}: the build was stopped, it did not fail"


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (CI cancelling, `kill`) must clean up exactly like Ctrl-C."""

    def handler(signum: int, frame: Any) -> None:
        raise Interrupted("SIGTERM")

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
    report = BuildReport(
        run_id=settings.run_id,
        matrix=str(mf.path),
        started=time.time(),
        compile_cache=record.cache_setting(settings.compile_cache),
        ci_run_url=record.ci_run_url(),
    )
    report.jobs = [
        JobResult(
            job_id=j.id,
            variant_id=j.variant.id,
            python=j.python,
            package=mf.package.name,
            version=mf.package.version,
            platform=j.platform.name,
            shard=None if settings.shard is None else str(settings.shard),
            covers=list(j.covers),
            torches=list(j.torches),
        )
        for j in jobs
    ]
    runner = Runner(client, mf, settings, on_change=on_change, log=log)
    # a project or version the index does not have is the matrix file's error (exit 2) before any job
    # starts; an index that cannot be reached now is each job's failure, in the report, and so is a patch
    # that does not apply in a preflight, which reports each variant's first error
    with contextlib.suppress(*((BuildError, PatchError) if settings.preflight else (BuildError,))):
        runner.prepared_source()
    stale = remove_stale_containers(client)
    if stale:
        log(f"removed {len(stale)} container(s) left by an earlier run that did not finish")
    for leftover in leftovers.remove_stale_output_dirs(settings.output):
        log(f"removed {leftover}, left by an earlier run that did not finish")
    if runner.compile_cache is not None:
        for leftover in sync.remove_stale_outboxes(runner.compile_cache.local):
            log(f"removed {leftover}, left by an earlier run that did not finish")
    pool = ThreadPoolExecutor(max_workers=max(1, mf.build.concurrency), thread_name_prefix="job")
    pending: dict[Future[None], JobResult] = {}
    try:
        uploads = runner.compile_cache or contextlib.nullcontext()
        with sigterm_as_interrupt(), Heartbeat(runner.context.heartbeat_file), uploads:
            # A variant's later Pythons wait for its first one, whose compiles they then find in the cache.
            schedule = Schedule(jobs=jobs)
            slots = max(1, mf.build.concurrency)
            index_of: dict[Future[None], int] = {}

            def start_ready() -> None:
                for i in schedule.take(slots - len(pending)):
                    fut = pool.submit(runner.run_job, jobs[i], report.jobs[i])
                    pending[fut], index_of[fut] = report.jobs[i], i

            start_ready()
            while pending:
                done, _ = wait(list(pending), timeout=0.5, return_when=FIRST_COMPLETED)
                for fut in done:
                    result = pending.pop(fut)
                    schedule.finish(index_of.pop(fut))
                    fut.result()
                    if result.result != "ok" and not settings.keep_going and not runner.stop.is_set():
                        runner.engine.stop_reason = (
                            f"stopped after {result.job_id} {result.result} (--keep-going builds on)"
                        )
                        runner.stop.set()
                        for f in pending:
                            f.cancel()
                if not runner.stop.is_set():
                    start_ready()
    except KeyboardInterrupt as exc:
        runner.engine.stop_reason = interrupted_reason(exc)
        runner.stop.set()
        for f in pending:
            f.cancel()
        remove_containers(client, filters={"label": f"{RUN_LABEL}={settings.run_id}"})
        for r in report.jobs:
            if r.result in ("pending",):
                r.result, r.reason = "interrupted", runner.engine.stop_reason
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        remove_containers(client, filters={"label": f"{RUN_LABEL}={settings.run_id}"})
        for r in report.jobs:
            if r.result == "pending":
                r.result, r.reason = "skipped", r.reason or "not started: the build stopped before this job"
        report.finished = time.time()
        report.source = runner.source_info()
        write_report(report, settings.output / "report.json")
    return report
