"""The build plan: the expanded matrix turned into jobs, pruned by the compatibility data, with reasons."""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import cast

from factory.core.errors import ConfigError, ImageError
from factory.core.platforms import DEFAULT_PLATFORM, Platform, named
from factory.core.tags import python_tag
from factory.core.variants import Variant, arch_set_str, parse_arch_set, version_tuple
from factory.plan import glibcfloor
from factory.plan.pipindex import IndexClient, read_pip_settings
from factory.plan.specs import Resolution, Resolver, has_specifiers, resolve_combinations
from factory.plan.torchindex import TorchIndex, TorchSource
from factory.spec.abi3 import ABI3, covers, python_key, wheel_tag
from factory.spec.compat import CompatData
from factory.spec.config import AXES, MatrixFile, load_matrix_file, with_flavor
from factory.spec.matrix import expand, expand_with_origin
from factory.spec.recipes import recipe_env, recipe_warnings
from factory.spec.stable_abi import covers_torch
from factory.spec.toolchains import cuda_major, flavor_platform_problem, platform_suffix, toolkit_cuda


@dataclass(frozen=True, kw_only=True)
class Job:
    variant: Variant
    python: str
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    extra: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    known: bool = True
    notes: tuple[str, ...] = ()
    # The platform the wheel is built for. Not part of the variant: pip tells platforms apart by the wheel's
    # platform tag, so one variant's page lists the wheels of every platform.
    platform: Platform = DEFAULT_PLATFORM
    # An abi3 job (the recipe's py_limited_api): its wheel's tag ("cp311") and the later Pythons it covers.
    limited_api: str | None = None
    covers: tuple[str, ...] = ()
    # The CUDA release of the nvcc that compiles the job when it is not the variant's own (the debian flavor:
    # Debian's 12.4 package for a CUDA 12.8 torch).
    toolkit: str | None = None
    # A stable-ABI job (the recipe's stable_abi): every torch of the matrix its one wheel serves, oldest
    # first; the variant's torch (the newest) builds it.
    torches: tuple[str, ...] = ()
    # The oldest glibc its wheel must install on (build.glibc, resolved for its torch); None: none declared.
    glibc: str | None = None

    @property
    def id(self) -> str:
        return f"{self.variant.id}-py{self.python.replace('.', '')}{platform_suffix(self.platform)}"

    @property
    def interpreter(self) -> str:
        """The interpreter tag of the job's wheel: "cp311", or the abi3 tag (which may be older)."""
        return self.limited_api or python_tag(self.python)

    @property
    def pythons(self) -> tuple[str, ...]:
        """Every Python the job's wheel is installed and checked on: its own, then those it covers."""
        return (self.python, *self.covers)

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
            "known": self.known,
        }
        if self.toolkit:
            out["toolkit"] = self.toolkit
        if self.glibc:
            out["glibc"] = self.glibc
        if self.limited_api:
            out["abi"] = f"{self.limited_api}-{ABI3}"
            out["covers"] = list(self.covers)
        if v.stable_abi is not None:
            out["stable_abi"] = v.stable_abi
            out["torches"] = list(self.torches)
        if self.platform != DEFAULT_PLATFORM:
            out["platform"] = self.platform.name
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
            found = named(str(v.get("platform", DEFAULT_PLATFORM.name)))
            return f"{variant.id}-py{str(v['python']).replace('.', '')}{platform_suffix(found)}"
        except (KeyError, ValueError, ConfigError):
            return ",".join(f"{k}={val}" for k, val in v.items())

    def to_json(self) -> dict[str, object]:
        """The dropped combination as `factory matrix --json` prints it: its id, why, and its raw values."""
        values = json.loads(json.dumps(dict(self.values), default=str))
        return {"id": self.id, "reason": self.reason, "values": values}


@dataclass(frozen=True, kw_only=True)
class Plan:
    jobs: tuple[Job, ...]
    dropped: tuple[DroppedJob, ...] = ()
    # what the matrix's torch/python specifiers resolved to, and what the index said that compat.json did not
    # (contradictions, builds pip may prefer)
    resolved: tuple[Resolution, ...] = ()
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        """`factory matrix --json`: the jobs, the dropped rows and, where specifiers were resolved, how."""
        doc: dict[str, object] = {
            "jobs": [j.to_json() for j in self.jobs],
            "dropped": [d.to_json() for d in self.dropped],
        }
        if self.resolved or self.notes:
            doc["resolved"] = [r.to_json() for r in self.resolved]
            doc["notes"] = list(self.notes)
        return doc

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
        return replace(
            self,
            jobs=tuple(j for j in self.jobs if _glob(pattern, j.variant.id, j.id)),
            dropped=tuple(d for d in self.dropped if _glob(pattern, d.id)),
        )


def select_jobs(plan: Plan, pattern: str | None, *, file: str) -> Plan:
    """`plan.only(pattern)`, refused when the pattern keeps neither a job nor a dropped row (a typo would
    otherwise show or build nothing and succeed); `file` is the matrix file the message names."""
    kept = plan.only(pattern)
    if pattern and not kept.jobs and not kept.dropped:
        raise ConfigError(f"no job matches --only {pattern!r}", file=file)
    return kept


def plan_file(
    path: Path,
    *,
    trust_paths: bool = False,
    flavor: str | None = None,
    only: str | None = None,
    prune: bool = True,
    warn: Callable[[str], None],
) -> tuple[MatrixFile, Plan]:
    """A matrix file loaded (`load_matrix_file`, with `flavor`: `with_flavor`) and planned, `--only`'s jobs
    selected (`select_jobs`), as `factory matrix` shows it and `factory build` starts from; `warn` gets the
    recipe's warnings."""
    mf = with_flavor(load_matrix_file(path, trust_paths=trust_paths), flavor)
    for warning in recipe_warnings(mf.recipe, mf.package):
        warn(warning)
    return mf, select_jobs(plan_matrix(mf, prune=prune), only, file=str(path))


def _glob(pattern: str, *names: str) -> bool:
    return any(fnmatch.fnmatchcase(n, pattern) for n in names)


def matrix_env(mf: MatrixFile, job: Job) -> dict[str, str]:
    """The full build environment of a job: the recipe's env for its variant, then the job's own env."""
    return {**recipe_env(mf.recipe, job.variant), **job.env}


def job_toolkit(mf: MatrixFile, *, cuda: str, python: str) -> str:
    """The CUDA release that compiles a (cuda, python) job: the debian flavor's distribution package, else the
    variant's own (an image named in build.images is taken at its word)."""
    if cuda in mf.build.images:
        return cuda
    try:
        return toolkit_cuda(cuda=cuda, python=python, flavor=mf.build.flavor)
    except ImageError as exc:
        raise ConfigError(f"{mf.display}: {exc}") from None


def toolkit_arch_problem(mf: MatrixFile, *, archs: tuple[str, ...], cuda: str, toolkit: str) -> str | None:
    """Why a flavor's toolkit cannot compile one of a CUDA `cuda` variant's archs, naming the arch, the
    toolkit and the flavors that can; None when it compiles them all."""
    flavor = mf.build.flavor
    for arch in archs:
        problem = mf.compat.arch_problem(arch, toolkit)
        if problem is None:
            continue
        able = ["devel"] + (["pypi"] if cuda_major(cuda) >= 13 else [])
        if mf.compat.arch_problem(arch, cuda) is not None:
            able = []
        instead = f"; flavor {' or '.join(able)} (CUDA {cuda}) can" if able else ""
        uses = f"flavor {flavor} compiles the CUDA {cuda} variant with CUDA {toolkit}"
        return f"arch {arch}: {uses}: {problem}{instead}"
    return None


def _job_floor(mf: MatrixFile, compat: CompatData, *, cuda: str, torch: str, python: str) -> str | None:
    """The glibc floor of a job (`glibcfloor.job_floor`); a builder that cannot meet it is refused, one line
    naming the flavors that can."""
    try:
        floor = glibcfloor.job_floor(mf.build, compat, torch=torch)
        refused = glibcfloor.floor_problem(mf.build, floor, cuda=cuda, python=python)
    except ConfigError as exc:
        raise ConfigError(f"{mf.display}: {exc}") from None
    if refused is not None:
        raise ConfigError(f"{mf.display}: {refused}")
    return floor


def flavor_problem(mf: MatrixFile, *, cuda: str, platform: Platform) -> str | None:
    """Why the matrix's flavor makes no builder image for a CUDA `cuda` job on `platform` (the debian and
    manylinux flavors but on the default platform: `flavor_platform_problem`); None where it does, and for an
    image build.images names for the CUDA, which is taken at its word."""
    return None if cuda in mf.build.images else flavor_platform_problem(mf.build.flavor, platform)


def torch_resolver(mf: MatrixFile, combos: list[dict[str, object]], index: TorchIndex | None) -> Resolver:
    """A Resolver reading, for each CUDA of `combos`, the index its torch comes from (build.torch_index)."""
    from factory.core.home import factory_home

    pip = read_pip_settings()
    index = index or TorchIndex(http=IndexClient(pip), home=factory_home())
    sources: dict[str, TorchSource] = {}
    for cuda in dict.fromkeys(str(c["cuda"]) for c in combos):
        url = mf.build.torch_index_url(cuda)
        sources[cuda] = TorchSource.from_pip(pip) if url is None else TorchSource.from_url(url)
    return Resolver(index=index, sources=sources)


def torch_platform_problem(
    resolver: Resolver, platform: Platform, *, cuda: str, torch: str, python: str
) -> str | None:
    """Why the index CUDA `cuda` takes torch from has no torch wheel for the job on `platform` (which
    torches, Pythons and platforms exist is read off its file names, as for the default platform)."""
    from factory.plan.torchcompat import platform_problem

    source = resolver.sources[cuda]
    return platform_problem(resolver.index.files(source), source, platform, torch=torch, python=python)


def plan_matrix(mf: MatrixFile, *, prune: bool = True, index: TorchIndex | None = None) -> Plan:
    """Expand the matrix and (unless prune=False) drop or trim what the compatibility data rules out.

    A torch or python specifier is resolved against the index (`factory.plan.specs`; `index` reads it, default
    the host's pip configuration's client and $FACTORY_HOME's cache), and what the index says of the torches
    it resolved to fills what compat.json does not say (`factory.plan.torchcompat.with_derived`)."""
    spec = mf.matrix
    excludes = [e.values for e in spec.exclude]
    includes = [e.values for e in spec.include]
    combos = expand(spec.axes, includes, excludes, spec.defaults)
    compat = mf.compat
    resolved: tuple[Resolution, ...] = ()
    plan_notes: tuple[str, ...] = ()
    resolver: Resolver | None = None
    if has_specifiers(combos):
        resolver = torch_resolver(mf, combos, index)
        combos, resolved = resolve_combinations(
            expand_with_origin(spec.axes, includes, excludes, spec.defaults),
            resolver,
            axes=spec.axes,
            exclude=excludes,
            defaults=spec.defaults,
            file=mf.display or str(mf.path),
        )
        compat, plan_notes = resolver.compat(mf.compat)
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
        platform = named(str(combo.get("platform", spec.defaults["platform"])))
        # a flavor with no builder image for the platform: dropped here, --no-prune or not, so no build starts
        unbuildable = flavor_problem(mf, cuda=cuda, platform=platform)
        if unbuildable is not None:
            dropped.append(DroppedJob(values=raw, reason=unbuildable))
            continue
        notes: tuple[str, ...] = ()
        known = False
        if prune:
            verdict = compat.judge(
                cuda=cuda,
                torch=torch,
                python=python,
                cxx11_abi=abi,
                archs=archs,
                recipe=mf.recipe.name,
                min_arch=mf.recipe.min_arch,
                cxx_std=mf.recipe.cxx_std,
                default_index=mf.build.torch_index_url(cuda) is None,
            )
            if verdict.dropped is not None:
                dropped.append(DroppedJob(values=raw, reason=verdict.dropped))
                continue
            archs, notes, known = verdict.archs, verdict.notes, verdict.known
            if platform != DEFAULT_PLATFORM:
                # compat.json speaks of the default platform's wheels; another's are read off the index
                resolver = resolver or torch_resolver(mf, combos, index)
                missing = torch_platform_problem(resolver, platform, cuda=cuda, torch=torch, python=python)
                if missing is not None:
                    dropped.append(DroppedJob(values=raw, reason=missing))
                    continue
        else:
            notes = ("not checked (--no-prune)",)
        toolkit = job_toolkit(mf, cuda=cuda, python=python)
        if prune and toolkit != cuda:
            refused = toolkit_arch_problem(mf, archs=archs, cuda=cuda, toolkit=toolkit)
            if refused is not None:
                raise ConfigError(f"{mf.display}: {refused}")
        floor = _job_floor(mf, compat, cuda=cuda, torch=torch, python=python)
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
            platform=platform,
            env=MappingProxyType(dict(cast("Mapping[str, str]", env))),
            extra=MappingProxyType(extra),
            known=known,
            notes=notes,
            toolkit=toolkit if toolkit != cuda else None,
            glibc=floor,
        )
        if job.id in seen:
            reason = f"same job as {job.id}" + (" after trimming archs" if notes else "")
            dropped.append(DroppedJob(values=raw, reason=reason))
            continue
        seen[job.id] = job
        jobs.append(job)
    plan = Plan(jobs=tuple(jobs), dropped=tuple(dropped), resolved=resolved, notes=plan_notes)
    if mf.recipe.stable_abi:
        plan = stable_abi_plan(plan, mf.recipe.stable_abi)
    if mf.recipe.py_limited_api:
        return limited_api_plan(plan, mf.recipe.py_limited_api)
    return plan


def stable_abi_plan(plan: Plan, floor: str) -> Plan:
    """One job per (CUDA, C++11 ABI, arch set, Python) for a stable-ABI recipe: the newest torch of the group
    builds the one wheel (targeting `floor`), which every other torch of the group installs. A torch older
    than the floor cannot use it (dropped, with the reason), and neither can a job whose matrix entry gives
    it another env or other values than the builder's: that would be a second build of the same wheel."""
    dropped = list(plan.dropped)
    groups: dict[tuple[str, bool, tuple[str, ...], str, Platform], list[Job]] = {}
    for job in plan.jobs:
        v = job.variant
        if not covers_torch(floor, v.torch):
            reason = f"torch {v.torch} is older than the recipe's stable ABI target (torch {floor})"
            dropped.append(DroppedJob(values=_values(job), reason=reason))
            continue
        groups.setdefault((v.cuda, v.cxx11_abi, v.archs, job.python, job.platform), []).append(job)
    jobs: list[Job] = []
    for group in groups.values():
        group.sort(key=lambda j: version_tuple(j.variant.torch))
        builder = group[-1]
        covered = []
        for job in group[:-1]:
            if job.env != builder.env or dict(job.extra) != dict(builder.extra):
                reason = (
                    f"its env or include values differ from those of torch {builder.variant.torch}'s job, "
                    f"which builds the one stable-ABI wheel (torch>={floor})"
                )
                dropped.append(DroppedJob(values=_values(job), reason=reason))
            else:
                covered.append(job)
        members = (*covered, builder)
        jobs.append(
            replace(
                builder,
                variant=replace(builder.variant, stable_abi=floor),
                torches=tuple(j.variant.torch for j in members),
                known=all(j.known for j in members),
                notes=tuple(dict.fromkeys(n for j in members for n in j.notes)),
            )
        )
    return replace(plan, jobs=tuple(jobs), dropped=tuple(dropped))


def limited_api_plan(plan: Plan, limited_api: str) -> Plan:
    """One job per variant for an abi3 recipe: its lowest Python builds the wheel, which every later Python
    of the variant installs. A Python older than the recipe's tag cannot use it (dropped, with the reason),
    and neither can a job whose matrix entry gives it another env or other values than the builder's: that
    would be a second build of the same wheel."""
    jobs: list[Job] = []
    dropped = list(plan.dropped)
    for variant, platform in dict.fromkeys((j.variant, j.platform) for j in plan.jobs):
        mine = (j for j in plan.jobs_of(variant) if j.platform == platform)
        group = sorted(mine, key=lambda j: python_key(j.python))
        tag = wheel_tag(limited_api, group[0].python)
        usable = []
        for job in group:
            if covers(tag, job.python):
                usable.append(job)
            else:
                reason = f"Python {job.python} is older than the recipe's limited API ({tag}-{ABI3})"
                dropped.append(DroppedJob(values=_values(job), reason=reason))
        if not usable:
            continue
        builder, rest = usable[0], usable[1:]
        covered = []
        for job in rest:
            if job.env != builder.env or dict(job.extra) != dict(builder.extra):
                reason = (
                    f"its env or include values differ from {builder.id}'s, which builds the variant's one "
                    f"{tag}-{ABI3} wheel"
                )
                dropped.append(DroppedJob(values=_values(job), reason=reason))
            else:
                covered.append(job)
        jobs.append(
            replace(
                builder,
                limited_api=tag,
                covers=tuple(j.python for j in covered),
                known=all(j.known for j in (builder, *covered)),
                notes=tuple(dict.fromkeys(n for j in (builder, *covered) for n in j.notes)),
            )
        )
    return replace(plan, jobs=tuple(jobs), dropped=tuple(dropped))


def _values(job: Job) -> Mapping[str, object]:
    v = job.variant
    values: dict[str, object] = {
        "cuda": v.cuda,
        "torch": v.torch,
        "python": job.python,
        "cxx11_abi": v.cxx11_abi,
        "arch": v.arch,
    }
    if job.platform != DEFAULT_PLATFORM:
        values["platform"] = job.platform.name
    return MappingProxyType(values)


__all__ = ["DroppedJob", "Job", "Plan", "arch_set_str", "matrix_env", "plan_matrix", "stable_abi_plan"]
