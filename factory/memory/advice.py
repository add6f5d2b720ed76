"""`factory memory plan` as a library call: the parallelism a build would start with for a memory limit,
CPUs and a recipe (or a matrix file's), with the learned profile a build would use.

A build sets MAX_JOBS to the wrapper's (`Parallelism.ninja_jobs`) and lets the admission wrapper start each
compile when its memory fits; `max_jobs`, what fits without the wrapper, is the plan's secondary number.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from factory.container import cgroup
from factory.container.admission import GIB
from factory.core.errors import ConfigError
from factory.core.units import format_size
from factory.memory.jobmemory import initial_parallelism
from factory.memory.planner import Parallelism, plan_parallelism
from factory.spec.config import load_matrix_file
from factory.spec.options import Recipe

DEFAULT_RECIPE = "flash-attn"
# Beyond any machine; past it a plan is arithmetic on nonsense (--cpus 1e308 printed a 300-digit MAX_JOBS).
MAX_COUNT = 1024  # --archs, --nvcc-threads


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """`factory memory plan`'s options, each value parsed (None: not given)."""

    memory: int | None = None
    cpus: float | None = None
    archs: int | None = None
    recipe: str | None = None
    matrix: Path | None = None
    per_arch: int | None = None
    nvcc_threads: int | None = None


@dataclass(frozen=True, kw_only=True)
class MemoryPlan:
    parallel: Parallelism
    limit_bytes: int
    cpus: float
    archs: int
    recipe: str

    def to_json(self) -> dict[str, object]:
        p = self.parallel
        return {
            "ninja_jobs": p.ninja_jobs,  # the MAX_JOBS a build sets, first
            "nvcc_threads": p.nvcc_threads,
            "max_jobs": p.max_jobs,
            "per_compile_bytes": p.per_compile_bytes,
            "per_arch_bytes": p.per_arch_bytes,
            "memory_bytes": self.limit_bytes,
            "cpus": self.cpus,
            "archs": self.archs,
            "recipe": self.recipe,
            "reason": p.reason,
        }

    def lines(self) -> list[str]:
        p = self.parallel
        return [
            f"MAX_JOBS={p.ninja_jobs} NVCC_THREADS={p.nvcc_threads}: what a build sets; the admission "
            "wrapper starts each compile when its memory fits "
            f"({format_size(self.limit_bytes)}, {self.cpus:g} CPUs, recipe {self.recipe}, "
            f"{self.archs} arch{'s' if self.archs != 1 else ''} a file)",
            f"  {p.reason}",
            f"  without the wrapper (a plain ninja build): MAX_JOBS={p.max_jobs}",
        ]


def _count(value: int | None, option: str) -> None:
    if value is not None and value < 1:
        raise ConfigError(f"{option} must be at least 1, not {value}")
    if value is not None and value > MAX_COUNT:
        raise ConfigError(f"{option} must be at most {MAX_COUNT}, not {value}")


def _recipe(request: PlanRequest) -> tuple[Recipe, int | None, tuple[str, str] | None]:
    """The recipe, the matrix file's largest arch set and its (package, version), by --matrix or --recipe."""
    from factory.plan.plan import plan_matrix
    from factory.spec.recipes import BUILTIN_RECIPES

    if request.matrix is not None and request.recipe is not None:
        raise ConfigError("--matrix and --recipe: give one (the matrix file names its recipe)")
    if request.matrix is not None:
        mf = load_matrix_file(request.matrix)
        archs = max((len(j.variant.archs) for j in plan_matrix(mf).jobs), default=1)
        return mf.recipe, archs, (mf.package.name, mf.package.version)
    name = request.recipe or DEFAULT_RECIPE
    if name not in BUILTIN_RECIPES:
        raise ConfigError(
            f"--recipe: unknown recipe {name!r} (built in: {', '.join(sorted(BUILTIN_RECIPES))}; "
            "for a matrix file's own recipe, --matrix FILE)"
        )
    return BUILTIN_RECIPES[name], None, None


def plan_memory(request: PlanRequest) -> MemoryPlan:
    """The plan for `request`: the options are checked first, then what is not given is read from this
    cgroup (its memory limit, its CPU quota or affinity). With --matrix and no --per-arch, the recipe's
    estimate is raised to the package's learned profile, as a build's first attempt is."""
    recipe, matrix_archs, package = _recipe(request)
    archs = request.archs or matrix_archs or 1
    _count(request.archs, "--archs")
    _count(request.nvcc_threads, "--nvcc-threads")
    info = cgroup.read_cgroup()
    limit = request.memory if request.memory is not None else info.memory_limit
    if limit is None:
        raise ConfigError("--memory: no cgroup memory limit here; give one, e.g. --memory 16GiB")
    cpus = cgroup.effective_cpus(info) if request.cpus is None else request.cpus
    if package is not None and request.per_arch is None:
        parallel = initial_parallelism(
            recipe=recipe, archs=archs, limit_bytes=limit, cpus=cpus, package=package[0], version=package[1],
            nvcc_threads=request.nvcc_threads,
        )  # fmt: skip
    else:
        per_arch = (
            request.per_arch if request.per_arch is not None else int(recipe.compile_gib_per_arch * GIB)
        )
        parallel = plan_parallelism(
            limit_bytes=limit,
            cpus=cpus,
            archs=archs,
            per_arch_bytes=per_arch,
            nvcc_threads=request.nvcc_threads,
        )
    return MemoryPlan(parallel=parallel, limit_bytes=limit, cpus=cpus, archs=archs, recipe=recipe.name)
