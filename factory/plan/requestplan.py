"""`factory matrix --requests`: the build requests of an index added to a matrix's plan, where compatibility
allows them, the rest listed as dropped with the reason.

A request's values are already the grammar of `factory.plan.variantrequest`; here they are judged as a matrix
combination would be (`CompatData.judge`, the flavor's toolkit; for a platform other than the default, the
torch wheels its index has for that platform and whether the flavor builds for it), and a request the data
knows nothing about is dropped rather than built: a stranger's request does not make the factory try the
unknown, nor build what the matrix's `exclude` takes out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from factory.core.errors import ConfigError
from factory.core.platforms import DEFAULT_PLATFORM, build_problem
from factory.core.urls import printable
from factory.core.validate import is_specifier, parse_specifier
from factory.core.variants import Arch, Variant, parse_arch_set, torch_minor
from factory.plan import glibcfloor
from factory.plan.plan import (
    DroppedJob,
    Job,
    Plan,
    flavor_problem,
    job_toolkit,
    limited_api_plan,
    toolkit_arch_problem,
    torch_platform_problem,
    torch_resolver,
)
from factory.plan.specs import Resolver
from factory.plan.torchindex import TorchIndex
from factory.plan.variantrequest import VariantRequest
from factory.spec.config import MatrixFile


def requested_archs(
    mf: MatrixFile, archs: tuple[str, ...], values: Mapping[str, object] | None = None
) -> tuple[str, ...] | None:
    """The arch set to build a request with: the matrix's first `arch` value whose code runs on every
    requested GPU (so the wheel joins the variants the matrix makes), else the requested set; the matrix's
    first set when the GPUs are unknown. None when there is neither. With the request's other `values`, a
    set the matrix's `exclude` takes out for them is passed over (a matrix that gives each platform or CUDA
    its own arch set by excluding the others, as matrix.yaml does)."""
    sets = [parse_arch_set(str(value)) for value in mf.matrix.axes.get("arch", ())]
    sets += [parse_arch_set(str(e.values["arch"])) for e in mf.matrix.include if "arch" in e.values]
    if values is not None:  # where it takes out every set, they stay: the request is dropped naming the entry
        sets = [s for s in sets if excluded_by(mf, {**values, "arch": ";".join(s)}) is None] or sets
    if not archs:
        return sets[0] if sets else None
    gpus = [Arch.parse(a) for a in archs]
    for candidate in sets:
        code = [Arch.parse(a) for a in candidate]
        if all(any(c.runs_on(gpu) for c in code) for gpu in gpus):
            return candidate
    return archs


def _matches(axis: str, pattern: object, value: object) -> bool:
    """Whether a request's `value` for `axis` is what an exclude entry's `pattern` names: equal, a torch
    release of the minor it names ("2.14" excludes "2.14.1"), a version its specifier allows, the same arch
    set however written."""
    if value is None:
        return False
    if axis in ("torch", "python") and is_specifier(pattern):
        try:
            return Version(str(value)) in parse_specifier(str(pattern))
        except (ValueError, InvalidVersion):
            return False
    if axis == "torch" and torch_minor(str(value)) == pattern:
        return True
    if axis == "arch":
        try:
            return parse_arch_set(str(pattern)) == parse_arch_set(str(value))
        except ValueError:
            return False
    return value == pattern


def excluded_by(mf: MatrixFile, values: Mapping[str, object]) -> str | None:
    """Why the matrix's `exclude` rules out a requested job of `values` (the axes), naming the entry; None
    when no entry matches. A stranger's request never adds what the matrix's author took out."""
    for i, entry in enumerate(mf.matrix.exclude):
        if all(
            _matches(axis, pattern, values.get(axis, mf.matrix.defaults.get(axis)))
            for axis, pattern in entry.values.items()
        ):
            where = f" (line {entry.line})" if entry.line is not None else ""
            shown = ", ".join(
                f"{axis}: {str(pattern).lower() if isinstance(pattern, bool) else pattern}"
                for axis, pattern in entry.values.items()
            )  # as the matrix file spells them
            return f"the matrix excludes it: matrix.exclude[{i}]{where} {{{shown}}}"
    return None


def _dropped(name: str, values: dict[str, object], reason: str) -> DroppedJob:
    return DroppedJob(values=MappingProxyType(values), reason=f"request {name[:12]}: {reason}")


def add_requests(
    mf: MatrixFile,
    plan: Plan,
    requests: Sequence[tuple[str, VariantRequest | str]],
    *,
    index: TorchIndex | None = None,
) -> Plan:
    """`plan` with a job for each request that compatibility allows and the plan lacks, on the platform it
    asks for, each noted as requested; every other request a dropped row saying why (unreadable, another
    package, ruled out, excluded by the matrix, unknown to the data, no torch wheel for its platform, planned
    already). `index` reads the torch index of a request for another platform than the default (default: the
    host's pip configuration's client, as `plan_matrix`)."""
    planned = {j.id: j for j in plan.jobs}
    added: list[Job] = []
    dropped: list[DroppedJob] = []
    resolver: Resolver | None = None
    for name, request in sorted(requests, key=lambda r: r[0]):
        name = printable(name)
        if isinstance(request, str):
            dropped.append(_dropped(name, {"request": name}, f"refused: {request}"))
            continue
        values: dict[str, object] = {
            "cuda": request.cuda,
            "torch": request.torch,
            "python": request.python,
            "cxx11_abi": request.cxx11_abi,
            "arch": request.arch or "?",
        }
        platform = request.platform
        if platform != DEFAULT_PLATFORM:  # as a planned job's values say it (`plan._values`)
            values["platform"] = platform.name
        if request.package is not None and canonicalize_name(request.package) != canonicalize_name(
            mf.package.name
        ):
            dropped.append(
                _dropped(name, values, f"for {request.package}; this matrix builds {mf.package.name}")
            )
            continue
        refused = build_problem(platform) or flavor_problem(mf, cuda=request.cuda, platform=platform)
        if refused is not None:
            dropped.append(_dropped(name, values, refused))
            continue
        archs = requested_archs(mf, request.archs, {**values, "platform": platform.name})
        if archs is None:
            dropped.append(_dropped(name, values, "names no GPU and the matrix no arch set"))
            continue
        values["arch"] = ";".join(archs)
        # an old request (no platform) is the default platform's whatever the matrix's default
        excluded = excluded_by(mf, {**values, "platform": platform.name})
        if excluded is not None:
            dropped.append(_dropped(name, values, excluded))
            continue
        verdict = mf.compat.judge(
            cuda=request.cuda,
            torch=request.torch,
            python=request.python,
            cxx11_abi=request.cxx11_abi,
            archs=archs,
            recipe=mf.recipe.name,
            min_arch=mf.recipe.min_arch,
            cxx_std=mf.recipe.cxx_std,
            default_index=mf.build.torch_index_url(request.cuda) is None,
        )
        if verdict.dropped is not None:
            dropped.append(_dropped(name, values, verdict.dropped))
            continue
        if not verdict.known:
            unknown = ", ".join(verdict.unknown)
            dropped.append(_dropped(name, values, f"the compatibility data knows nothing about {unknown}"))
            continue
        if platform != DEFAULT_PLATFORM:
            # compat.json speaks of the default platform's wheels; another's are read off the index
            wanted: list[dict[str, object]] = [
                {"cuda": r.cuda} for _n, r in requests if not isinstance(r, str)
            ]
            resolver = resolver or torch_resolver(mf, wanted, index)
            missing = torch_platform_problem(
                resolver, platform, cuda=request.cuda, torch=request.torch, python=request.python
            )
            if missing is not None:
                dropped.append(_dropped(name, values, missing))
                continue
        gpus = [Arch.parse(a) for a in request.archs]
        if not all(any(Arch.parse(a).runs_on(g) for a in verdict.archs) for g in gpus):
            dropped.append(_dropped(name, values, "no arch left for its GPUs: " + "; ".join(verdict.notes)))
            continue
        try:
            toolkit = job_toolkit(mf, cuda=request.cuda, python=request.python)
        except ConfigError as exc:
            dropped.append(_dropped(name, values, str(exc)))
            continue
        if toolkit != request.cuda:
            refused = toolkit_arch_problem(mf, archs=verdict.archs, cuda=request.cuda, toolkit=toolkit)
            if refused is not None:
                dropped.append(_dropped(name, values, refused))
                continue
        try:  # the matrix's glibc floor holds for a requested job too
            floor = glibcfloor.job_floor(mf.build, mf.compat, torch=request.torch)
            refused = glibcfloor.floor_problem(mf.build, floor, cuda=request.cuda, python=request.python)
        except ConfigError as exc:
            refused, floor = str(exc), None
        if refused is not None:
            dropped.append(_dropped(name, values, refused))
            continue
        # the set it would build
        excluded = excluded_by(mf, {**values, "platform": platform.name, "arch": ";".join(verdict.archs)})
        if excluded is not None:
            dropped.append(_dropped(name, values, excluded))
            continue
        job = Job(
            variant=Variant(
                package=mf.package.name,
                version=mf.package.version,
                cuda=request.cuda,
                torch=request.torch,
                cxx11_abi=request.cxx11_abi,
                archs=verdict.archs,
            ),
            python=request.python,
            platform=platform,
            known=True,
            notes=(*verdict.notes, f"requested ({name[:12]})"),
            toolkit=toolkit if toolkit != request.cuda else None,
            glibc=floor,
        )
        same = planned.get(job.id) or next((j for j in added if j.id == job.id), None)
        same = same or next(
            (
                j
                for j in plan.jobs
                if j.variant == job.variant and j.platform == job.platform and job.python in j.covers
            ),
            None,
        )
        if same is not None:
            dropped.append(_dropped(name, values, f"planned already ({same.id})"))
            continue
        added.append(job)
    if mf.recipe.py_limited_api and added:
        grouped = limited_api_plan(Plan(jobs=tuple(added)), mf.recipe.py_limited_api)
        added, dropped = list(grouped.jobs), dropped + list(grouped.dropped)
    return Plan(jobs=(*plan.jobs, *added), dropped=(*plan.dropped, *dropped))
