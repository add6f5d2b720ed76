"""`factory build` as a library call: the options a command line gives, checked against each other and the
matrix file into a planned build (`plan_build`), and that build run, published when asked (`run_planned`).

The command line parses each option's value (sizes, CPUs, a shard); what needs the matrix file or several
options together is checked here, before any container starts, so a dry run refuses what a build would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from factory.build.pipeline import RunOutcome, build_matrix
from factory.build.report import BuildReport, JobResult
from factory.build.reuse import Reuse
from factory.build.runner import BuildSettings
from factory.core.errors import ConfigError
from factory.plan.plan import Job, plan_file
from factory.plan.shard import Shard
from factory.spec.config import MatrixFile
from factory.trust.signing import Signer, signer_from

if TYPE_CHECKING:
    from factory.build.runtimereqs import Dependency

Log = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class BuildRequest:
    """What `factory build` was asked, each value parsed but not yet checked against the others."""

    matrix: Path
    trust_paths: bool = False
    output: Path = Path("wheelhouse")
    only: str | None = None
    keep_going: bool = False
    memory: int | None = None
    cpus: float | None = None
    flavor: str | None = None
    publish: bool = False
    rebuild: bool = False
    shard: Shard | None = None
    preflight: bool = False
    cache: str | None = None  # --cache DEST|off
    check_cache: int = 0
    sign_key: Path | None = None  # --sign-key: the private key file publishing signs with
    sign_key_env: str | None = None  # --sign-key-env: the variable holding it (default FACTORY_SIGN_KEY)


@dataclass(frozen=True, kw_only=True)
class PlannedBuild:
    """A checked request: the matrix file, the jobs to build and how."""

    mf: MatrixFile
    jobs: tuple[Job, ...]
    settings: BuildSettings
    publish: bool
    rebuild: bool
    # loaded on this host before anything is built; it signs there, after the build (never in a container)
    signer: Signer | None = None


def _check_options(request: BuildRequest) -> None:
    """The refusals that need no matrix file."""
    if request.preflight and request.publish:
        raise ConfigError("--preflight makes no wheel to publish: drop --publish")
    if request.preflight and request.shard is not None:
        raise ConfigError("--preflight and --shard each choose which compiles run: use one of them")
    if request.rebuild and not request.publish:
        raise ConfigError("--rebuild only applies with --publish")
    if (request.sign_key or request.sign_key_env) and not request.publish:
        raise ConfigError("--sign-key and --sign-key-env sign what is published: add --publish")
    if request.output.exists() and not request.output.is_dir():
        raise ConfigError(f"--output {request.output}: exists and is not a directory")


def plan_build(request: BuildRequest, *, warn: Log) -> PlannedBuild:
    """Check `request` and plan its jobs (a preflight: each variant's first Python); a ConfigError (exit 2)
    for options that contradict each other or the matrix file, or an --only that keeps no job. `warn` gets
    the recipe's warnings and any about the compile cache."""
    from factory.build.preflight import lead_jobs
    from factory.cache.sync import resolve, writes_store
    from factory.trust.cachekeys import SIGN_KEY_ENV, check_environment

    _check_options(request)
    mf, plan = plan_file(
        request.matrix, trust_paths=request.trust_paths, flavor=request.flavor, only=request.only, warn=warn
    )
    jobs = list(plan.jobs)
    if not jobs:  # what --only kept, if anything, was dropped
        what = f"no job matches --only {request.only!r}" if request.only else "the matrix plans no job"
        if plan.dropped:
            # why, in the same line: a torch with no wheel for the platform, say (`factory matrix` shows all)
            first = plan.dropped[0]
            more = (
                f" (and {len(plan.dropped) - 1} more: `factory matrix` lists them)"
                if len(plan.dropped) > 1
                else ""
            )
            what += f": {first.id} is dropped: {first.reason}{more}"
        raise ConfigError(what, file=str(request.matrix))
    if request.preflight:
        jobs = lead_jobs(jobs)  # one Python per variant: the others compile the same sources
    compile_cache = resolve(
        mf, publishing=request.publish, override=request.cache, check_hits=request.check_cache
    )
    if request.check_cache and compile_cache is None:
        raise ConfigError("--check-cache checks the compile cache's hits, and the cache is off")
    if request.shard is not None and compile_cache is None:
        raise ConfigError("--shard compiles into the compile cache, which is off (build.cache, --cache)")
    if compile_cache is not None:
        check_environment()  # the cache's keys: a bad or an old (HMAC) one is refused before any build
    if request.shard is not None and compile_cache is not None and not writes_store(compile_cache):
        warn(
            f"--shard without {SIGN_KEY_ENV}: this host may not write the shared compile cache, and a final "
            "build on another host will not see its compiles"
        )
    settings = BuildSettings(
        output=request.output,
        keep_going=request.keep_going,
        memory=request.memory,
        cpus=request.cpus,
        shard=request.shard,
        preflight=request.preflight,
        compile_cache=compile_cache,
    )
    signer = signer_from(path=request.sign_key, env_name=request.sign_key_env) if request.publish else None
    return PlannedBuild(
        mf=mf,
        jobs=tuple(jobs),
        settings=settings,
        publish=request.publish,
        rebuild=request.rebuild,
        signer=signer,
    )


def dry_run_line(job: Job) -> str:
    """A job as `factory build --dry-run` lists it."""
    return f"{job.id}\tpython {job.python}\tarch {job.variant.arch}\t{job.variant.full_version}"


def run_planned(
    planned: PlannedBuild,
    *,
    on_change: Callable[[JobResult], None],
    log: Log,
    showing: Callable[[], AbstractContextManager[None]],
    finished: Callable[[BuildReport], None],
) -> RunOutcome:
    """Build the planned jobs (publishing, those not yet published) and publish the accepted wheels when
    asked. Docker is first asked once something is to be built; `showing` wraps each build (a progress
    display), `finished` gets its report."""
    from factory.build import emulation
    from factory.build.engine import connect
    from factory.build.runner import run_build

    def build(todo: Sequence[Job], reuse: Mapping[str, Reuse]) -> BuildReport:
        # another platform's jobs run under QEMU: its missing emulation is one line before any container
        emulation.require(job.platform for job in todo)
        client = connect()
        settings = replace(planned.settings, reuse=reuse)
        with showing():
            report = run_build(client, planned.mf, todo, settings, on_change=on_change, log=log)
        finished(report)
        return report

    return build_matrix(
        planned.mf,
        planned.jobs,
        build=build,
        output=planned.settings.output,
        publish=planned.publish,
        rebuild=planned.rebuild,
        signer=planned.signer,
        log=log,
    )


@dataclass(frozen=True, kw_only=True)
class PlannedRun:
    """Several matrix files built in one run (`factory build --matrix A --matrix B`), in the order their
    runtime requirements need (`schedule.matrix_order`): each one's wheels and report.json under
    `<output>/<package>/`."""

    builds: tuple[PlannedBuild, ...]


def plan_run(requests: Sequence[BuildRequest], *, warn: Log) -> PlannedRun:
    """Plan each request's matrix file (`plan_build`) and order them: a matrix whose runtime requirements
    (its source's metadata and `recipe.extra_requires`, `runtimereqs`) name another's package is built after
    it, and its install check takes that wheel (`run_ordered`). The sources are prepared here (cached: the
    build takes them as they are). ConfigError for two matrices of one package or a dependency cycle."""
    from factory.build import runtimereqs
    from factory.build.source import prepare_package
    from factory.core.home import factory_home
    from factory.plan.schedule import Needs, matrix_order

    planned = [plan_build(request, warn=warn) for request in requests]
    if len(planned) == 1:
        return PlannedRun(builds=tuple(planned))
    needs = []
    for p in planned:
        mf = p.mf
        tree = prepare_package(mf.package, mf.recipe, factory_home(), matrix_file=mf.display).tree
        declared = runtimereqs.with_recipe(runtimereqs.declared_requirements(tree), mf.recipe.extra_requires)
        needs.append(
            Needs(
                project=mf.package.canonical_name,
                requires=runtimereqs.project_names(declared),
                matrix=mf.display,
            )
        )
    ordered = [planned[i] for i in matrix_order(needs)]
    return PlannedRun(
        builds=tuple(
            replace(p, settings=replace(p.settings, output=p.settings.output / p.mf.package.canonical_name))
            for p in ordered
        )
    )


def built_dependency(planned: PlannedBuild, outcome: RunOutcome) -> Dependency:
    """What a built matrix offers the install checks of the run's later matrices: each accepted wheel by
    (variant id, Python: an abi3 wheel's every one), each other job's result and reason, and the index it
    published to."""
    from factory.build.runtimereqs import Dependency

    wheels: dict[tuple[str, str], Path] = {}
    failed: dict[tuple[str, str], str] = {}
    for r in outcome.report.jobs if outcome.report is not None else ():
        keys = [(r.variant_id, python) for python in (r.python, *r.covers)]
        for key in keys:
            if r.result == "ok" and r.wheel:
                wheels[key] = planned.settings.output / r.wheel
            elif r.result != "ok":  # (an ok job without a wheel is a shard's or a preflight's: no check)
                reason = r.reason.splitlines()[0] if r.reason else "no reason given"
                failed[key] = f"its job {r.job_id} {r.result} ({reason})"
    return Dependency(
        project=planned.mf.package.canonical_name,
        matrix=planned.mf.display,
        wheels=wheels,
        failed=failed,
        index=planned.mf.publish.pip_index() if planned.publish else None,
    )


def run_ordered(run: PlannedRun, *, build: Callable[[PlannedBuild], RunOutcome]) -> list[RunOutcome]:
    """Build the run's matrices one after the other (`build`: `run_planned` behind a display), each given
    what the earlier ones built (`BuildSettings.dependencies`); every matrix is built, a job whose
    dependency's job failed fails at once, saying so."""
    outcomes: list[RunOutcome] = []
    done: list[Dependency] = []
    for planned in run.builds:
        settings = replace(planned.settings, dependencies=tuple(done))
        outcome = build(replace(planned, settings=settings))
        outcomes.append(outcome)
        done.append(built_dependency(planned, outcome))
    return outcomes
