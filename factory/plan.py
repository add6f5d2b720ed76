"""The build plan: the expanded matrix turned into jobs, pruned by the compatibility data, with reasons."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from factory.config import AXES, MatrixFile
from factory.matrix import expand
from factory.recipes import recipe_env
from factory.variants import Variant, arch_set_str, parse_arch_set


@dataclass(frozen=True, kw_only=True)
class Job:
    variant: Variant
    python: str
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    extra: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    verified: bool = True
    notes: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.variant.id}-py{self.python.replace('.', '')}"

    def to_json(self) -> dict[str, object]:
        """The job as `factory matrix --format json/github` prints it."""
        v = self.variant
        out: dict[str, object] = {
            "id": v.id,
            "job_id": self.id,
            "package": v.package,
            "version": v.version,
            "cuda": v.cuda,
            "torch": v.torch,
            "python": self.python,
            "cxx11_abi": v.cxx11_abi,
            "arch": v.arch,
            "local_version": v.local_version,
            "verified": self.verified,
        }
        if self.notes:
            out["notes"] = list(self.notes)
        if self.env:
            out["env"] = dict(self.env)
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out


@dataclass(frozen=True, kw_only=True)
class DroppedJob:
    values: Mapping[str, object]
    reason: str

    @property
    def id(self) -> str:
        """A readable id for the raw combination (best effort: it may lack axes or hold untrimmed archs)."""
        v = self.values
        try:
            variant = Variant(
                package="",
                version="",
                cuda=str(v["cuda"]),
                torch=str(v["torch"]),
                cxx11_abi=bool(v["cxx11_abi"]),
                archs=parse_arch_set(str(v["arch"])),
            )
            return f"{variant.id}-py{str(v['python']).replace('.', '')}"
        except (KeyError, ValueError):
            return ",".join(f"{k}={val}" for k, val in v.items())


@dataclass(frozen=True, kw_only=True)
class Plan:
    jobs: tuple[Job, ...]
    dropped: tuple[DroppedJob, ...] = ()

    @property
    def variants(self) -> tuple[Variant, ...]:
        """Distinct variants in job order."""
        return tuple(dict.fromkeys(j.variant for j in self.jobs))

    def jobs_of(self, variant: Variant) -> tuple[Job, ...]:
        return tuple(j for j in self.jobs if j.variant == variant)

    def only(self, pattern: str | None) -> Plan:
        """Keep what matches a glob on the variant id or the job id."""
        if not pattern:
            return self
        return Plan(
            jobs=tuple(j for j in self.jobs if _glob(pattern, j.variant.id, j.id)),
            dropped=tuple(d for d in self.dropped if _glob(pattern, d.id)),
        )


def _glob(pattern: str, *names: str) -> bool:
    return any(fnmatch.fnmatchcase(n, pattern) for n in names)


def matrix_env(mf: MatrixFile, job: Job) -> dict[str, str]:
    """The full build environment of a job: the recipe's env for its variant, then the job's own env."""
    return {**recipe_env(mf.recipe, job.variant), **job.env}


def plan_matrix(mf: MatrixFile, *, prune: bool = True) -> Plan:
    """Expand the matrix and (unless prune=False) drop or trim what the compatibility data rules out."""
    spec = mf.matrix
    combos = expand(spec.axes, [e.values for e in spec.include], [e.values for e in spec.exclude])
    jobs: list[Job] = []
    dropped: list[DroppedJob] = []
    seen: dict[str, Job] = {}
    for combo in combos:
        raw = MappingProxyType(dict(combo))
        env = combo.get("env") or {}
        extra = {k: v for k, v in combo.items() if k not in AXES and k != "env"}
        archs = parse_arch_set(str(combo["arch"]))
        cuda, torch, python = str(combo["cuda"]), str(combo["torch"]), str(combo["python"])
        abi = bool(combo["cxx11_abi"])
        notes: tuple[str, ...] = ()
        verified = False
        if prune:
            verdict = mf.compat.judge(
                cuda=cuda,
                torch=torch,
                python=python,
                cxx11_abi=abi,
                archs=archs,
                recipe=mf.recipe.name,
                min_arch=mf.recipe.min_arch,
                cxx_std=mf.recipe.cxx_std,
            )
            if verdict.dropped is not None:
                dropped.append(DroppedJob(values=raw, reason=verdict.dropped))
                continue
            archs, notes, verified = verdict.archs, verdict.notes, verdict.verified
        else:
            notes = ("not checked (--no-prune)",)
        job = Job(
            variant=Variant(
                package=mf.package.name,
                version=mf.package.version,
                cuda=cuda,
                torch=torch,
                cxx11_abi=abi,
                archs=archs,
            ),
            python=python,
            env=MappingProxyType(dict(env)),  # type: ignore[arg-type]
            extra=MappingProxyType(extra),
            verified=verified,
            notes=notes,
        )
        if job.id in seen:
            reason = f"same job as {job.id}" + (" after trimming archs" if notes else "")
            dropped.append(DroppedJob(values=raw, reason=reason))
            continue
        seen[job.id] = job
        jobs.append(job)
    return Plan(jobs=tuple(jobs), dropped=tuple(dropped))


__all__ = ["DroppedJob", "Job", "Plan", "arch_set_str", "matrix_env", "plan_matrix"]
