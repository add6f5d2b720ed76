"""Matrix values that follow the index: `torch:` and `python:` PEP 440 specifiers, resolved at each plan.

A torch specifier resolves, for each combination, against the index its CUDA takes torch from
(`build.torch_index`; `default` and a CUDA it does not name... as `BuildOptions.torch_index_url` says):
to every torch minor with a version that matches the specifier and has a build for that CUDA (a `+cpu` build
is no CUDA build), as the minor ("2.14", which installs its newest patch) when the newest such version
matches, else as that exact version ("2.14.0" for `<2.14.1`). A Python specifier resolves to the Pythons the
chosen torch's wheels for that CUDA are tagged for. Versions pip's constraint files exclude are not offered.

A specifier that resolves to nothing is a ConfigError naming the versions the index has. The matrix loader
only checks a specifier's syntax; the index is read here, at plan time, never while loading.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from packaging.version import Version

from factory.core.errors import BuildError, ConfigError
from factory.core.validate import is_specifier, parse_specifier
from factory.core.variants import torch_minor
from factory.plan.torchcompat import DerivedTorch, allowed, build_of, by_version, derive_minor, with_derived
from factory.plan.torchindex import TorchFile, TorchIndex, TorchSource, constraint_specifiers
from factory.spec.compat import CompatData
from factory.spec.config import MAX_PLANNED_JOBS

SHOWN_VERSIONS = 12


@dataclass(frozen=True, kw_only=True)
class Resolution:
    """What one specifier resolved to for one CUDA (and for a Python specifier, one torch)."""

    axis: str  # "torch" or "python"
    spec: str
    cuda: str
    torch: str | None  # a Python specifier's torch
    values: tuple[str, ...]
    detail: tuple[str, ...]  # each value's exact version ("2.14 = 2.14.1") or note
    where: str

    def line(self) -> str:
        of = f"torch {self.torch}, " if self.torch else ""
        shown = ", ".join(self.detail or self.values)
        return f"{self.axis} {self.spec!r} ({of}CUDA {self.cuda}, {self.where}) -> {shown}"

    def to_json(self) -> dict[str, object]:
        return {
            "axis": self.axis,
            "spec": self.spec,
            "cuda": self.cuda,
            "torch": self.torch,
            "values": list(self.values),
            "detail": list(self.detail),
            "where": self.where,
        }


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A torch value a specifier may resolve to, for one CUDA: the value, its exact version, its wheels."""

    value: str
    version: Version
    files: tuple[TorchFile, ...]


@dataclass
class Resolver:
    """Resolves a plan's specifiers through one TorchIndex, each source's answers remembered for the plan."""

    index: TorchIndex
    sources: Mapping[str, TorchSource]  # CUDA -> where its torch comes from
    notes: list[str] = field(default_factory=list)
    derived: dict[tuple[str, str], DerivedTorch] = field(default_factory=dict)  # (source label, minor)
    _builds: dict[tuple[str, str], tuple[str, str] | None] = field(default_factory=dict)
    # per source, read once: its versions' wheels (newest first), and the same grouped by torch minor, so
    # that resolving is linear in the index's size, not in its size times its minors
    _grouped: dict[str, dict[Version, list[TorchFile]]] = field(default_factory=dict)
    _minors: dict[str, dict[str, list[tuple[Version, list[TorchFile]]]]] = field(default_factory=dict)

    def _build(self, source: TorchSource, group: Sequence[TorchFile]) -> tuple[str, str] | None:
        key = (source.label, str(group[0].version))
        if key not in self._builds:
            self._builds[key] = build_of(self.index, group)[0]
        return self._builds[key]

    def _groups(self, source: TorchSource) -> dict[Version, list[TorchFile]]:
        if source.label not in self._grouped:
            self._grouped[source.label] = by_version(allowed(self.index.files(source), source))
        return self._grouped[source.label]

    def _by_minor(self, source: TorchSource) -> dict[str, list[tuple[Version, list[TorchFile]]]]:
        if source.label not in self._minors:
            minors: dict[str, list[tuple[Version, list[TorchFile]]]] = {}
            for version, group in self._groups(source).items():
                minors.setdefault(torch_minor(version.public), []).append((version, group))
            self._minors[source.label] = minors
        return self._minors[source.label]

    def candidates(self, cuda: str, minor: str) -> Iterator[Candidate]:
        """Torch `minor`'s versions with a CUDA `cuda` build on its source, newest first, found as they are
        asked for: a wheel whose filename does not say its build is read only when the caller gets there."""
        source = self.sources[cuda]
        for version, group in self._by_minor(source).get(minor, []):
            if version.is_prerelease or version.is_devrelease:
                continue
            if self._build(source, group) == ("cuda", cuda):
                yield Candidate(value=minor, version=version, files=tuple(group))

    def _derive(self, cuda: str, minor: str) -> None:
        source = self.sources[cuda]
        key = (source.label, minor)
        if key not in self.derived:
            ours = [f for _, group in self._by_minor(source).get(minor, []) for f in group]
            self.derived[key] = derive_minor(self.index, source, minor, ours)

    def _shown_versions(self, cuda: str) -> str:
        source = self.sources[cuda]
        shown = []
        for version, group in list(self._groups(source).items())[:SHOWN_VERSIONS]:
            build = group[0].label_build or self._builds.get((source.label, str(version)))
            if build is None:
                shown.append(str(version))
            else:
                shown.append(f"{version} ({'no CUDA build' if build[0] != 'cuda' else f'CUDA {build[1]}'})")
        capped = [
            f"{v} (excluded by pip's constraint file {path}: {req})"
            for path, req in constraint_specifiers(source.constraints)
            for v, group in by_version(self.index.files(source)).items()
            if any(f.runs_on() for f in group) and not req.specifier.contains(v, prereleases=True)
        ]
        return ", ".join(shown + capped[:3]) or "no torch at all"

    def torch(self, spec_text: str, cuda: str, *, file: str) -> Resolution:
        """The torch values `spec_text` resolves to for CUDA `cuda` (ConfigError when none)."""
        spec = parse_specifier(spec_text)
        source = self.sources[cuda]
        values: list[str] = []
        detail: list[str] = []
        minors = {
            torch_minor(v.public) for v in self._groups(source) if spec.contains(v.public, prereleases=False)
        }
        for minor in sorted(minors, key=lambda m: tuple(int(p) for p in m.split("."))):
            if len(values) >= MAX_PLANNED_JOBS:
                raise ConfigError(
                    f"torch {spec_text!r} resolves to more than {MAX_PLANNED_JOBS} torches with a CUDA "
                    f"{cuda} build on {source.label}; a matrix makes at most {MAX_PLANNED_JOBS} jobs: narrow "
                    "the specifier",
                    file=file,
                )
            newest: Candidate | None = None
            best: Candidate | None = None
            for candidate in self.candidates(cuda, minor):
                newest = newest or candidate
                if spec.contains(candidate.version.public, prereleases=False):
                    best = candidate
                    break
            if best is None or newest is None:
                continue
            value = minor if best.version == newest.version else best.version.public
            values.append(value)
            detail.append(f"{value} = {best.version}" if value != str(best.version) else value)
            self._derive(cuda, minor)
            shadowed = [
                str(v)
                for v, group in self._by_minor(source)[minor]
                if v.public == best.version.public and v.local and group[0].label_build != ("cuda", cuda)
            ]
            if shadowed:
                self.notes.append(
                    f"torch {', '.join(shadowed)} on {source.label} is no CUDA {cuda} build; pip prefers it "
                    f"over {best.version} unless the build's torch_index excludes it"
                )
        if not values:
            message = (
                f"torch {spec_text!r} matches no torch with a CUDA {cuda} build on {source.label}; it has "
                f"{self._shown_versions(cuda)}"
            )
            unread = [self.index.unreadable[p] for p in source.pages if p in self.index.unreadable]
            if unread:
                # what could not be read may have it: not the matrix file's error
                raise BuildError(f"{file}: {message}; could not read {'; '.join(unread)}")
            raise ConfigError(message, file=file)
        return Resolution(
            axis="torch",
            spec=spec_text,
            cuda=cuda,
            torch=None,
            values=tuple(values),
            detail=tuple(detail),
            where=source.label,
        )

    def python(self, spec_text: str, cuda: str, torch: str, *, file: str) -> Resolution:
        """The Pythons `spec_text` resolves to for torch `torch` with CUDA `cuda` (ConfigError when none)."""
        spec = parse_specifier(spec_text)
        source = self.sources[cuda]
        minor = torch_minor(torch)
        found = self.candidates(cuda, minor)
        if torch.count(".") == 2:
            found = (c for c in found if c.version.public == torch)
        exact = list(itertools.islice(found, 1))
        pythons = sorted(
            {p for c in exact for f in c.files for p in f.pythons}, key=lambda p: int(p.split(".")[1])
        )
        values = tuple(p for p in pythons if spec.contains(p, prereleases=True))
        if not values:
            has = ", ".join(pythons) if pythons else "no wheels for it"
            raise ConfigError(
                f"python {spec_text!r} matches no Python torch {torch} (CUDA {cuda}) ships for on "
                f"{source.label}; it has {has}",
                file=file,
            )
        if exact:
            self._derive(cuda, minor)
        return Resolution(
            axis="python",
            spec=spec_text,
            cuda=cuda,
            torch=torch,
            values=values,
            detail=values,
            where=source.label,
        )

    def compat(self, compat: CompatData) -> tuple[CompatData, tuple[str, ...]]:
        """`compat` with what the index says of the resolved torches (compat.json wins; contradictions are
        notes), and the resolution's own notes."""
        merged, contradictions = with_derived(compat, self.derived.values())
        return merged, tuple(dict.fromkeys([*contradictions, *self.notes, *self.index.problems]))


Combination = dict[str, object]


def _order(value: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", value))


def resolve_combinations(
    combos: Iterable[tuple[Mapping[str, object], int | None]],
    resolver: Resolver,
    *,
    axes: Mapping[str, Sequence[object]],
    exclude: Sequence[Mapping[str, object]],
    defaults: Mapping[str, object] | None = None,
    file: str,
) -> tuple[list[Combination], tuple[Resolution, ...]]:
    """Each combination (`expand_with_origin`'s) with a specifier replaced by one combination per value it
    resolves to (torch first, then python against the resolved torch). The axes' combinations come in the
    order they would have had with the resolved values written in the specifier's place, then the include
    entries' own; exclude entries apply to the resolved values too (`defaults`: the value of an axis a
    combination leaves out, as `expand` compares it)."""
    seen: dict[tuple[str, ...], Resolution] = {}
    ordered: list[tuple[tuple[object, ...], Combination]] = []
    added: list[Combination] = []
    for combo, origin in combos:
        if not (is_specifier(combo.get("torch")) or is_specifier(combo.get("python"))):
            resolved_combos = [dict(combo)]
        else:
            resolved_combos = []
            cuda = str(combo["cuda"])
            torches = [str(combo["torch"])]
            if is_specifier(combo["torch"]):
                key: tuple[str, ...] = ("torch", str(combo["torch"]), cuda)
                if key not in seen:
                    seen[key] = resolver.torch(str(combo["torch"]), cuda, file=file)
                torches = list(seen[key].values)
            for torch in torches:
                pythons = [str(combo["python"])]
                if is_specifier(combo["python"]):
                    key = ("python", str(combo["python"]), cuda, torch)
                    if key not in seen:
                        seen[key] = resolver.python(str(combo["python"]), cuda, torch, file=file)
                    pythons = list(seen[key].values)
                for python in pythons:
                    resolved = {**combo, "torch": torch, "python": python}
                    if not any(
                        all(resolved.get(k, (defaults or {}).get(k)) == v for k, v in e.items())
                        for e in exclude
                    ):
                        resolved_combos.append(resolved)
        # the loader's cap on the matrix's size, again for what the specifiers resolved to
        if len(ordered) + len(added) + len(resolved_combos) > MAX_PLANNED_JOBS:
            raise ConfigError(
                f"matrix: its specifiers resolve to more than {MAX_PLANNED_JOBS} jobs; at most "
                f"{MAX_PLANNED_JOBS}: narrow them or add exclude entries",
                file=file,
            )
        for resolved in resolved_combos:
            if origin is not None:
                added.append(resolved)
                continue
            position: list[object] = []
            for axis, values in axes.items():
                written = combo.get(axis)
                index = values.index(written) if written in values else len(values)
                position.append((index, _order(str(resolved[axis])) if is_specifier(written) else ()))
            ordered.append((tuple(position), resolved))
    ordered.sort(key=lambda pair: pair[0])
    return [c for _, c in ordered] + added, tuple(seen.values())


def has_specifiers(combos: Iterable[Mapping[str, object]]) -> bool:
    return any(is_specifier(c.get("torch")) or is_specifier(c.get("python")) for c in combos)
