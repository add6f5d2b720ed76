"""`factory memory`: plan parallelism for a container, and show or move learned compile profiles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from factory.cli import app, cpus_option, size_option
from factory.config import load_matrix_file
from factory.container import cgroup
from factory.container.admission import GIB
from factory.errors import ConfigError
from factory.home import factory_home
from factory.memory import profiles
from factory.memory.planner import plan_parallelism
from factory.units import format_size

memory_app = typer.Typer(help="Memory planning and learned compile profiles.", no_args_is_help=True)
app.add_typer(memory_app, name="memory")


# Beyond any machine; past it a plan is arithmetic on nonsense (--cpus 1e308 printed a 300-digit MAX_JOBS).
MAX_COUNT = 1024  # --archs, --nvcc-threads


def _count(value: int | None, option: str) -> None:
    if value is not None and value < 1:
        raise ConfigError(f"{option} must be at least 1, not {value}")
    if value is not None and value > MAX_COUNT:
        raise ConfigError(f"{option} must be at most {MAX_COUNT}, not {value}")


@memory_app.command("plan")
def plan_cmd(
    memory: Annotated[
        str | None, typer.Option(help="Memory limit, e.g. 16GiB (default: this cgroup's).")
    ] = None,
    cpus: Annotated[
        float | None, typer.Option(help="CPUs (default: this cgroup's quota or affinity).")
    ] = None,
    archs: Annotated[
        int | None,
        typer.Option(help="Number of CUDA archs compiled per file (default: 1, or --matrix's largest set)."),
    ] = None,
    recipe: Annotated[
        str | None, typer.Option(help="Built-in recipe whose per-arch estimate to use (default: flash-attn).")
    ] = None,
    matrix: Annotated[
        Path | None, typer.Option("--matrix", "-m", help="Plan for this matrix file's recipe and arch sets.")
    ] = None,
    per_arch: Annotated[
        str | None, typer.Option(help="Per-arch compile memory, overrides the recipe's.")
    ] = None,
    nvcc_threads: Annotated[int | None, typer.Option(help="NVCC_THREADS (default: planned).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """MAX_JOBS and NVCC_THREADS that fit a memory limit."""
    from factory.plan import plan_matrix
    from factory.recipes import BUILTIN_RECIPES

    info = cgroup.read_cgroup()
    limit = size_option(memory, "--memory") if memory else info.memory_limit
    if limit is None:
        raise ConfigError("--memory: no cgroup memory limit here; give one, e.g. --memory 16GiB")
    if matrix is not None and recipe is not None:
        raise ConfigError("--matrix and --recipe: give one (the matrix file names its recipe)")
    if matrix is not None:
        mf = load_matrix_file(matrix)
        chosen = mf.recipe
        if archs is None:
            archs = max((len(j.variant.archs) for j in plan_matrix(mf).jobs), default=1)
    elif (recipe or "flash-attn") in BUILTIN_RECIPES:
        chosen = BUILTIN_RECIPES[recipe or "flash-attn"]
    else:
        raise ConfigError(
            f"--recipe: unknown recipe {recipe!r} (built in: {', '.join(sorted(BUILTIN_RECIPES))}; "
            "for a matrix file's own recipe, --matrix FILE)"
        )
    archs = 1 if archs is None else archs
    per_arch_bytes = (
        size_option(per_arch, "--per-arch")
        if per_arch is not None
        else int(chosen.compile_gib_per_arch * GIB)
    )
    _count(archs, "--archs")
    _count(nvcc_threads, "--nvcc-threads")
    cpus = cpus_option(cpus)
    p = plan_parallelism(
        limit_bytes=limit, cpus=cgroup.effective_cpus(info) if cpus is None else cpus, archs=archs,
        per_arch_bytes=per_arch_bytes, nvcc_threads=nvcc_threads,
    )  # fmt: skip
    if as_json:
        typer.echo(json.dumps({"max_jobs": p.max_jobs, "nvcc_threads": p.nvcc_threads,
                               "per_compile_bytes": p.per_compile_bytes, "ninja_jobs": p.ninja_jobs,
                               "reason": p.reason}))  # fmt: skip
        return
    typer.echo(f"MAX_JOBS={p.max_jobs} NVCC_THREADS={p.nvcc_threads}")
    typer.echo(f"  {p.reason}")
    typer.echo(f"  with the admission wrapper: MAX_JOBS={p.ninja_jobs}, memory bounded per compile")


@memory_app.command("profiles")
def profiles_cmd(
    package: Annotated[str | None, typer.Argument(help="Show only this package.")] = None,
) -> None:
    """List the learned compile profiles in the state directory."""
    root = factory_home() / "profiles"
    paths = sorted(root.glob("*/*.json")) if root.is_dir() else []
    shown = 0
    for path in paths:
        if package and path.parent.name != profiles.canonicalize_name(package):
            continue
        p = profiles.load_profile(path)
        worst = max((e.peak_bytes for e in p.entries.values()), default=0)
        typer.echo(
            f"{path.parent.name} {path.stem}: {len(p.entries)} compiles, worst peak {format_size(worst)}"
        )
        shown += 1
    if not shown:
        typer.echo(f"no profiles in {root}")


@memory_app.command("import")
def import_cmd(path: Annotated[Path, typer.Argument(help="A shipped *.compile-profile.json.")]) -> None:
    """Merge a profile shipped with published results into the local state directory."""
    if not path.is_file():
        raise ConfigError("no such file", file=str(path))
    p = profiles.import_profile(path)
    typer.echo(f"{p.package} {p.version}: {len(p.entries)} compiles")
