"""`factory memory`: plan parallelism for a container, and show or move learned compile profiles."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from factory.cli import app, cpus_option, size_option
from factory.cli.output import echo_json, json_option
from factory.core.errors import ConfigError
from factory.memory import profiles

memory_app = typer.Typer(help="Memory planning and learned compile profiles.", no_args_is_help=True)
app.add_typer(memory_app, name="memory")


@memory_app.command("plan")
def plan_cmd(
    memory: Annotated[
        str | None, typer.Option(metavar="SIZE", help="Memory limit, e.g. 16GiB (default: this cgroup's).")
    ] = None,
    cpus: Annotated[
        float | None, typer.Option(metavar="N", help="CPUs (default: this cgroup's quota or affinity).")
    ] = None,
    archs: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            help="Number of CUDA archs compiled per file (default: 1, or --matrix's largest set).",
        ),
    ] = None,
    recipe: Annotated[
        str | None,
        typer.Option(
            metavar="NAME", help="Built-in recipe whose per-arch estimate to use (default: flash-attn)."
        ),
    ] = None,
    matrix: Annotated[
        Path | None,
        typer.Option(
            "--matrix",
            "-m",
            metavar="FILE",
            help="Plan for this matrix file's recipe, arch sets and profile.",
        ),
    ] = None,
    per_arch: Annotated[
        str | None, typer.Option(metavar="SIZE", help="Per-arch compile memory, overrides the recipe's.")
    ] = None,
    nvcc_threads: Annotated[
        int | None, typer.Option(metavar="N", help="NVCC_THREADS (default: planned).")
    ] = None,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """The MAX_JOBS and NVCC_THREADS a build sets for a memory limit, and what the wrapper admits."""
    from factory.memory.advice import PlanRequest, plan_memory

    request = PlanRequest(
        memory=size_option(memory, "--memory") if memory else None,
        cpus=cpus_option(cpus),
        archs=archs,
        recipe=recipe,
        matrix=matrix,
        per_arch=size_option(per_arch, "--per-arch") if per_arch is not None else None,
        nvcc_threads=nvcc_threads,
    )
    plan = plan_memory(request)
    if as_json:
        echo_json(plan.to_json())
        return
    for line in plan.lines():
        typer.echo(line)


@memory_app.command("profiles")
def profiles_cmd(
    package: Annotated[str | None, typer.Argument(metavar="PACKAGE", help="Show only this package.")] = None,
) -> None:
    """List the learned compile profiles in the state directory."""
    for line in profiles.profile_summaries(package):
        typer.echo(line)


@memory_app.command("import")
def import_cmd(
    path: Annotated[Path, typer.Argument(metavar="FILE", help="A shipped *.compile-profile.json.")],
) -> None:
    """Merge a profile shipped with published results into the local state directory."""
    if not path.is_file():
        raise ConfigError("no such file", file=str(path))
    p = profiles.import_profile(path)
    typer.echo(f"{p.package} {p.version}: {len(p.entries)} compiles")
