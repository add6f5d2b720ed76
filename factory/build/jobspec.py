"""A job's containers as data: each driver phase's environment, mounts and limits.

Pure: what a container of a job is made of follows from the job, the run's settings and paths the caller has
already made; nothing here reads a file, asks Docker or looks at the host. `factory.build.jobrun` runs the
`ContainerSpec`s made here (`engine.Engine.run`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from factory.build.engine import ContainerSpec, Limits
from factory.cache import sync
from factory.container import CONTAINER_DIR, DRIVER, IMPORT_ROOT, PACKAGE_MOUNT, heartbeat, protocol
from factory.core import reproducible
from factory.core.errors import CheckError
from factory.memory import jobmemory
from factory.plan.plan import Job, matrix_env
from factory.plan.shard import Shard
from factory.spec.config import BuildOptions, MatrixFile
from factory.spec.torchreq import torch_requirement

WORK_VOLUME = "factory-work"
WORK_MOUNT = protocol.WORK_MOUNT
JOBS_ROOT = protocol.JOBS_ROOT  # a job's directory there: `<job>-<run>` (`job_dir`)
CONTAINER_USER = "10001:10001"
CHECK_WHEELHOUSE_MOUNT = protocol.CHECK_WHEELHOUSE_MOUNT
BUILD_REQUIREMENTS = ("pip", "setuptools", "wheel", "ninja", "packaging", "psutil")

Mounts = Mapping[str, Mapping[str, str]]


def requirements(mf: MatrixFile, job: Job) -> list[str]:
    reqs = [
        str(torch_requirement(job.variant.torch, exact=True)),
        *BUILD_REQUIREMENTS,
        *mf.recipe.extra_build_requires,
    ]
    return list(dict.fromkeys(reqs))


def job_dir(job_id: str, run_id: str) -> str:
    """The job's directory in the shared work volume; per run, so concurrent runs never share one."""
    return f"{JOBS_ROOT}/{job_id}-{run_id}"


def driver_env(
    *,
    job_dir: str,
    python: str,
    owner: str,
    heartbeat_stale_s: float,
    compile_cache: sync.CacheConfig | None,
) -> dict[str, str]:
    """What every driver phase needs, built from scratch: nothing of the host environment leaks in.
    `python`: the interpreter the phase runs ("3.11"); `owner`: the run's `leftovers.owner_json`, which
    `factory clean` tells a dead run's job directory by."""
    return {
        "HOME": "/home/factory",
        **protocol.DriverEnv(
            job_dir=job_dir,
            owner=owner,
            python=f"python{python}",
            heartbeat=f"{heartbeat.MOUNT}/{heartbeat.FILE_NAME}",
            heartbeat_stale_s=heartbeat_stale_s,
        ).to_env(),
        # uv's cache shares the work volume with the venvs: installing torch hardlinks, not copies.
        "UV_CACHE_DIR": f"{WORK_MOUNT}/uv-cache",
        "UV_LINK_MODE": "hardlink",
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_NO_CONFIG": "1",
        "PYTHONPATH": IMPORT_ROOT,  # the driver and the nvcc wrapper import as `factory.container`
        # local paths only: the store, its credentials and the signing key stay with the host
        **(cache_env(compile_cache) if compile_cache is not None else {}),
    }


def cache_env(config: sync.CacheConfig) -> dict[str, str]:
    """The compile cache's read-only root and the job's outbox. The driver puts the host compiler through
    the cache (`driver.cache_env`): it alone sees the CXX the build would have had (the matrix's, the
    image's) and keeps it as FACTORY_REAL_CXX; a CXX set here would hide the image's."""
    return protocol.WrapperEnv(
        cache_dir=sync.MOUNT, cache_out=sync.OUT_MOUNT, cache_check_hits=config.check_hits
    ).to_env()


def container_env(
    mf: MatrixFile,
    job: Job,
    *,
    driver: Mapping[str, str],
    memory: Mapping[str, str],
    shard: Shard | None = None,
    shard_sources: Sequence[str] | None = None,
    preflight_candidates: Sequence[str] | None = None,
    source_date_epoch: int | None = None,
) -> dict[str, str]:
    """The build container's environment: the driver's (`driver_env`), the memory plan's
    (`jobmemory.wrapper_env`, MAX_JOBS among it), then the matrix's own env for the job, which wins. A
    shard's sources and a preflight's candidates when the run has them. SOURCE_DATE_EPOCH, the source's
    date (`reproducible`), is the one clock the build reads: what bdist_wheel and compilers date with it
    is the same in every build of the job."""
    sharded = shard is not None and shard_sources is not None
    env = {
        **driver,
        **protocol.DriverEnv(
            cuda=job.variant.cuda,
            requirements=tuple(requirements(mf, job)),
            limited_api=job.limited_api or None,
        ).to_env(),
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PYTHONUNBUFFERED": "1",
        **({reproducible.ENV: str(source_date_epoch)} if source_date_epoch is not None else {}),
    }
    env.update(memory)
    env.update(matrix_env(mf, job))
    env.update(protocol.DriverEnv(shard=str(shard) if sharded else None).to_env())
    env.update(
        protocol.WrapperEnv(
            shard_sources=tuple(shard_sources) if sharded and shard_sources is not None else None,
            preflight=tuple(preflight_candidates) if preflight_candidates is not None else None,
        ).to_env()
    )
    return env


def check_env(driver: Mapping[str, str], *, wheel: str, import_name: str) -> dict[str, str]:
    """The install check's environment: the driver's for the checked Python, the wheel and what to import."""
    try:
        script = protocol.import_check_script(import_name)
    except ValueError as exc:
        raise CheckError(str(exc)) from None
    return {**driver, **protocol.DriverEnv(wheel=wheel, import_check=script).to_env()}


def work_mounts() -> dict[str, dict[str, str]]:
    """The housekeeping phases' mounts: the work volume and the driver's package."""
    return {
        WORK_VOLUME: {"bind": WORK_MOUNT, "mode": "rw"},
        str(CONTAINER_DIR): {"bind": PACKAGE_MOUNT, "mode": "ro"},
    }


def clean_mounts(heartbeat_dir: Path) -> dict[str, dict[str, str]]:
    """The mounts of a job's `clean` phase."""
    return {**work_mounts(), str(heartbeat_dir): {"bind": heartbeat.MOUNT, "mode": "ro"}}


def job_mounts(
    *,
    source: Path,
    wheelhouse: Path,
    out_dir: Path,
    profile_dir: Path,
    heartbeat_dir: Path,
    check_wheelhouse: Path | None = None,
    cache_mounts: Mounts | None = None,
) -> dict[str, dict[str, str]]:
    """The build's mounts: the source, the wheelhouses and the driver read-only; the work volume and the
    output written; the compile cache's (`cache.JobCache.mounts`) when it is on."""
    check = check_wheelhouse
    return {
        **({str(check): {"bind": CHECK_WHEELHOUSE_MOUNT, "mode": "ro"}} if check is not None else {}),
        **{host: dict(m) for host, m in (cache_mounts or {}).items()},
        WORK_VOLUME: {"bind": WORK_MOUNT, "mode": "rw"},
        str(source): {"bind": protocol.SOURCE_MOUNT, "mode": "ro"},
        str(wheelhouse): {"bind": protocol.WHEELHOUSE_MOUNT, "mode": "ro"},
        str(out_dir): {"bind": protocol.OUTPUT_MOUNT, "mode": "rw"},
        str(CONTAINER_DIR): {"bind": PACKAGE_MOUNT, "mode": "ro"},
        str(profile_dir): {"bind": jobmemory.PROFILE_DIR, "mode": "ro"},
        str(heartbeat_dir): {"bind": heartbeat.MOUNT, "mode": "ro"},
    }


def check_mounts(
    mounts: Mounts,
    *,
    wheel_dir: Path,
    wheelhouse: Path | None = None,
    check_wheelhouse: Path | None = None,
) -> dict[str, dict[str, str]]:
    """The install check's mounts: the build's, with the host's checked copy of the wheel read-only at /out
    (what is installed is what is accepted). `wheelhouse` (and `check_wheelhouse`): those of another
    Python's job, for a Python the wheel covers, in place of the build's."""
    out = {host: dict(m) for host, m in mounts.items()}
    if wheelhouse is not None:
        binds = (protocol.WHEELHOUSE_MOUNT, CHECK_WHEELHOUSE_MOUNT)
        out = {k: v for k, v in out.items() if v["bind"] not in binds}
        out[str(wheelhouse)] = {"bind": protocol.WHEELHOUSE_MOUNT, "mode": "ro"}
        if check_wheelhouse is not None:
            out[str(check_wheelhouse)] = {"bind": CHECK_WHEELHOUSE_MOUNT, "mode": "ro"}
    out = {k: v for k, v in out.items() if v["bind"] != protocol.OUTPUT_MOUNT}
    out[str(wheel_dir)] = {"bind": protocol.OUTPUT_MOUNT, "mode": "ro"}
    return out


def limits(build: BuildOptions, *, memory_limit: int, cpus: float) -> Limits:
    """A job container's limits: the run's memory and CPUs per container, the matrix's pids and network."""
    return Limits(
        memory_bytes=memory_limit,
        cpus=cpus,
        pids=build.pids_limit,
        network="none" if build.offline else "bridge",
    )


def driver_container(
    phase: str, *, image: str, env: Mapping[str, str], mounts: Mounts, limits: Limits
) -> ContainerSpec:
    """One driver phase (`build`, `check`) in a locked-down container of the job's image."""
    return ContainerSpec(
        image=image,
        command=(*DRIVER, phase),
        env=dict(env),
        mounts={host: dict(m) for host, m in mounts.items()},
        user=CONTAINER_USER,
        working_dir=WORK_MOUNT,
        limits=limits,
    )
