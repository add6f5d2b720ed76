"""`factory build --publish` as one run: leave out what is already published, start from the compile profile
the store carries, build, publish the accepted wheels, ship back what this run learned.

The build itself is the caller's (`factory.build.runner.run_build` behind the CLI's progress display), so this
module needs no Docker; the store is opened once, before anything is built.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from factory.build.reuse import Reuse, fetch_all, plan_reuse
from factory.core.errors import ConfigError, FactoryError
from factory.memory.shipping import pull_profile, push_profile
from factory.plan import shard as sharding
from factory.plan.ci import (
    RUNS_ON,
    Chunk,
    Runners,
    chunk_of,
    github_json,
    github_matrix,
    github_outputs,
    too_many,
)
from factory.publish.publisher import (
    PublishResult,
    describe,
    publish_wheels,
    published_files,
    published_wheel,
)
from factory.publish.stores import Store, open_store
from factory.spec.config import MatrixFile

if TYPE_CHECKING:
    from factory.build.report import BuildReport
    from factory.plan.plan import Job
    from factory.trust.signing import Signer

Log = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class RunOutcome:
    """What one run did: its build report (None when every job was already published) and what it
    published (None when it published nothing)."""

    report: BuildReport | None
    published: PublishResult | None = None

    @property
    def ok(self) -> bool:
        return self.report is None or self.report.ok


def job_pages(job: Job) -> tuple[str, ...]:
    """The variant pages that list a job's wheel: its variant's, or each torch variant a stable-ABI job
    covers (`publish.stable_pages`)."""
    key = job.variant.key
    if key.stable:
        return tuple(key.with_torch(torch).id for torch in job.torches)
    return (key.id,)


def unpublished(store: Store, mf: MatrixFile, jobs: Sequence[Job], log: Log) -> list[Job]:
    """The jobs whose wheel the store does not list yet (a stable-ABI job's: on some torch's page); each one
    left out is said through `log`. Per platform: one variant's page lists the wheels of every platform, and
    a job is left to build while only another platform's wheel of it is there."""
    pages: dict[str, tuple[str, ...]] = {}
    left = []
    for job in jobs:
        found: str | None = None
        for vid in job_pages(job):
            if vid not in pages:
                pages[vid] = published_files(store, project=mf.package.name, variant_id=vid)
            found = published_wheel(
                pages[vid],
                project=mf.package.name,
                version=job.variant.full_version,
                python=job.python,
                limited_api=job.limited_api,
                platform=job.platform,
            )
            if found is None:
                break
        if found is None:
            left.append(job)
        else:
            log(f"{job.id}: already published as {found}; skipped (--rebuild builds it again)")
    return left


@dataclass(frozen=True, kw_only=True)
class CiPlan:
    """The jobs a CI run's build matrix holds: its chunk's, less those published already when asked."""

    jobs: tuple[Job, ...]
    planned: int  # the chunk's jobs
    total: int  # the whole matrix's


def plan_ci(mf: MatrixFile, jobs: Sequence[Job], *, chunk: Chunk, skip_published: bool, log: Log) -> CiPlan:
    """The chunk's jobs (with `skip_published`, only those whose wheel `publish.to` does not list yet);
    ConfigError saying how to chunk when they are more than one GitHub matrix holds."""
    mine = chunk_of(jobs, chunk)
    left = mine
    if skip_published and mine:
        store = open_store(mf.publish.to, endpoint_url=mf.publish.endpoint_url)
        left = unpublished(store, mf, mine, log)
    problem = too_many(planned=len(mine), left=len(left), total=len(jobs), chunk=chunk)
    if problem is not None:
        raise ConfigError(problem, file=str(mf.path))
    return CiPlan(jobs=tuple(left), planned=len(mine), total=len(jobs))


def github_plan(
    mf: MatrixFile,
    jobs: Sequence[Job],
    *,
    chunk: Chunk,
    skip_published: bool,
    shards: int | None,
    github_output: Path | None,
    log: Log,
    runners: Runners | None = None,
) -> str:
    """`factory matrix --format github`: the chunk's jobs (`plan_ci`) as a GitHub Actions matrix, or with
    `shards`, its shard and final matrices; appended to `github_output` as step outputs too. Each job names
    the runner labels of its platform (`runners`; an include entry's own `runs_on` wins). The JSON to
    print; ConfigError for a matrix GitHub would refuse (the run would fail after its plan)."""
    ci = plan_ci(mf, jobs, chunk=chunk, skip_published=skip_published, log=log)
    runners = runners or Runners()
    rows = [j.to_json() for j in ci.jobs]
    for job, row in zip(ci.jobs, rows, strict=True):
        row.setdefault(RUNS_ON, list(runners.of(job.platform)))
    matrices = sharding.github_matrices(rows, shards) if shards is not None else None
    if matrices is not None:
        for line in sharding.over_limit(matrices):
            raise ConfigError(line)
    if github_output is not None:
        try:
            with github_output.open("a") as fh:
                fh.write(github_outputs(rows))
                if matrices is not None:
                    fh.write(sharding.github_shard_outputs(matrices))
        except OSError as exc:
            raise ConfigError(f"--github-output {github_output}: {exc.strerror}") from None
    if skip_published or chunk != Chunk():
        log(f"chunk {chunk}: {len(rows)} of its {ci.planned} jobs to build ({ci.total} in the matrix)")
    return github_json(matrices) if matrices is not None else github_matrix(rows)


def sync_profile(store: Store, mf: MatrixFile, log: Log, *, pull: bool) -> None:
    """Compile profiles travel with the published results; an unreachable store only costs a head start."""
    name, version = mf.package.name, mf.package.version
    try:
        count = (pull_profile if pull else push_profile)(store, package=name, version=version)
    except (FactoryError, OSError, ValueError) as exc:
        log(f"compile profile not {'fetched' if pull else 'shipped'}: {exc}")
        return
    if count:
        log(f"compile profile {'fetched from' if pull else 'shipped to'} {mf.publish.to}: {count} compiles")


def build_matrix(
    mf: MatrixFile,
    jobs: Sequence[Job],
    *,
    build: Callable[[Sequence[Job], Mapping[str, Reuse]], BuildReport],
    output: Path,
    publish: bool = False,
    rebuild: bool = False,
    signer: Signer | None = None,
    log: Log,
) -> RunOutcome:
    """Build `jobs` with `build` (its wheels and report.json go to `output`); with `publish`, publish the
    accepted wheels to `publish.to`, each signed on this host when `signer`.

    Publishing, jobs whose wheel is already published are not built unless `rebuild`: a wheel built again
    differs in its bytes, and publishing it would be refused (nothing published is overwritten). A
    stable-ABI job whose wheel some of its torches' pages list already takes that file (`reuse`), which
    `build` gets by job id, checks, and publishing adds to the other pages. Failed jobs do not hold back
    the good wheels; the index's matrix page shows what failed."""
    if not publish:
        return RunOutcome(report=build(jobs, {}))
    store = open_store(mf.publish.to, endpoint_url=mf.publish.endpoint_url)
    planned: dict[str, Reuse] = {}
    if not rebuild:
        jobs = unpublished(store, mf, jobs, log)
        if not jobs:
            log(f"nothing to build: every job's wheel is already published to {mf.publish.to}")
            return RunOutcome(report=None)
        planned = plan_reuse(store, mf, jobs, log)
    sync_profile(store, mf, log, pull=True)
    with tempfile.TemporaryDirectory(prefix="factory-reuse-") as fetched:
        # a file publishing signs afresh is taken only when its signature checks with the same key
        key = signer.public_key() if signer is not None else None
        report = build(jobs, fetch_all(store, planned, Path(fetched), log, key=key))
    wheels = [output / r.wheel for r in report.jobs if r.wheel]
    if not wheels:
        return RunOutcome(report=report)
    result = publish_wheels(
        wheels,
        to=mf.publish.to,
        endpoint_url=mf.publish.endpoint_url,
        report=output / "report.json",
        store=store,
        signer=signer,
        variants=mf.publish.variants,
    )
    for line in describe(result):
        log(line)
    sync_profile(store, mf, log, pull=False)
    return RunOutcome(report=report, published=result)
