"""Compatibility derived from the index: each torch minor's facts as compat.json holds them, and their source.

Precedence: compat.json (the shipped file, then a matrix file's `compat:` overrides) wins key by key; a
derived fact fills what it does not say, and one that contradicts it is kept as a note (`factory compat show`,
`factory matrix`) rather than silently preferred, because compat.json is where a person corrects the index
(a yanked build, a broken header). A list fact contradicts compat.json when the index has a value the list
lacks (a CUDA build compat.json says does not exist); a scalar when the two differ.

Derived facts are about one source (the host's pip configuration, or one per-CUDA index): its builds are the
ones a job that takes torch from there can get, so they are not marked incomplete.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from factory.core.home import factory_home
from factory.core.platforms import DEFAULT_PLATFORM, Platform
from factory.core.variants import torch_minor
from factory.plan.pipindex import IndexClient, PipSettings, read_pip_settings
from factory.plan.torchindex import (
    HEADER,
    TorchFile,
    TorchIndex,
    TorchSource,
    WheelFacts,
    constraint_specifiers,
)
from factory.spec.compat import TORCH_KEYS, CompatData, merge

COMPAT_JSON = "compat.json"
PRECEDENCE = "compat.json (and a matrix file's compat:) wins key by key; derived facts fill the rest"


@dataclass(frozen=True, kw_only=True)
class Fact:
    key: str  # a compat.json torch key, or "glibc", "platforms", "versions"
    value: object
    source: str  # "index filename X", "metadata of X", "headers of X", "compat.json"

    def to_json(self) -> dict[str, object]:
        return {"key": self.key, "value": self.value, "source": self.source}


@dataclass(frozen=True, kw_only=True)
class DerivedTorch:
    """What one source says about one torch minor."""

    minor: str
    where: str
    facts: tuple[Fact, ...]
    problems: tuple[str, ...] = ()

    def entry(self) -> dict[str, Any]:
        """The facts that have a compat.json key, in its shape."""
        return {f.key: f.value for f in self.facts if f.key in TORCH_KEYS}


def allowed(
    files: Iterable[TorchFile], source: TorchSource, platform: Platform = DEFAULT_PLATFORM
) -> list[TorchFile]:
    """The manylinux wheels of `files` for `platform` (the builders') that pip's constraint files let pip
    install."""
    caps = [req for _, req in constraint_specifiers(source.constraints)]
    return [
        f
        for f in files
        if f.runs_on(platform) and all(req.specifier.contains(f.version, prereleases=True) for req in caps)
    ]


def platform_offer(
    files: Iterable[TorchFile], source: TorchSource, platform: Platform, *, torch: str
) -> dict[str, list[str]]:
    """What `source` has of `torch` (a minor, "2.14", or a release, "2.14.1") for `platform`, from the index's
    file names alone: each Python -> the versions with a wheel for it, newest first."""
    offer: dict[str, list[str]] = {}
    for f in sorted(allowed(files, source, platform), key=lambda f: f.version, reverse=True):
        public = f.version.public
        if torch not in (public, torch_minor(public)) or f.version.is_prerelease or f.version.is_devrelease:
            continue
        for python in f.pythons:
            versions = offer.setdefault(python, [])
            if str(f.version) not in versions:
                versions.append(str(f.version))
    return offer


def platform_problem(
    files: Iterable[TorchFile], source: TorchSource, platform: Platform, *, torch: str, python: str
) -> str | None:
    """Why a job of torch `torch` and Python `python` on `platform` cannot be built from `source`, one line
    naming what the index has instead; None when it has a wheel (which CUDA it is a build of is judged as
    for every platform, by the version pip takes)."""
    offer = platform_offer(files, source, platform, torch=torch)
    if python in offer:
        return None
    where = f"on {source.label}"
    if not offer:
        return f"no torch {torch} wheel for {platform.name} {where} (its {platform.wheelhouse_tag} wheels)"
    pythons = ", ".join(sorted(offer, key=lambda p: tuple(int(x) for x in p.split("."))))
    return f"no torch {torch} wheel for Python {python} on {platform.name} {where} (it has Python {pythons})"


def representative(files: Sequence[TorchFile]) -> TorchFile:
    """The one wheel of a version read for what all of them share (version.py, headers, requirements)."""
    return next((f for f in files if "3.11" in f.pythons), files[0])


def build_of(
    index: TorchIndex, files: Sequence[TorchFile], *, open_wheel: bool = True
) -> tuple[tuple[str, str] | None, str, WheelFacts | None]:
    """(build, where it was read, the wheel's facts when read) of one version's wheels; without
    `open_wheel`, only what the filename or a PEP 658 metadata file says."""
    f = representative(files)
    label = f.label_build
    if label is not None:
        return label, f"index filename {f.filename}", None
    if not open_wheel and not f.metadata:
        return None, "", None
    facts = index.facts(f)
    if facts.build is None:
        return None, "", facts
    what = (
        f"metadata of {f.filename}" if facts.build_from == "metadata" else f"torch/version.py in {f.filename}"
    )
    return facts.build, what, facts


def by_version(files: Iterable[TorchFile]) -> dict[Version, list[TorchFile]]:
    """Files grouped by their full version (the local label included), newest first."""
    out: dict[Version, list[TorchFile]] = {}
    for f in sorted(files, key=lambda f: f.version, reverse=True):
        out.setdefault(f.version, []).append(f)
    return out


def derive_minor(
    index: TorchIndex, source: TorchSource, minor: str, files: Sequence[TorchFile]
) -> DerivedTorch:
    """The facts `source`'s wheels of torch `minor` give: every labelled build from its filename, the plain
    builds' CUDA from their metadata, the newest version's C++ standard from its headers."""
    ours = [f for f in allowed(files, source) if torch_minor(f.version.public) == minor]
    groups = by_version(ours)
    facts: list[Fact] = []
    problems: list[str] = []
    cudas: dict[str, str] = {}
    pythons: set[str] = set()
    cxx_std: Fact | None = None
    default_cuda: Fact | None = None
    opened = False
    for version, group in groups.items():
        plain = version.local is None
        # a wheel is opened for the newest plain version only: older patches' builds from their metadata
        build, where, wheel = build_of(index, group, open_wheel=not opened)
        opened = opened or (plain and not group[0].metadata)
        if wheel is not None:
            problems.extend(wheel.problems)
        if build is not None and build[0] == "cuda":
            cudas.setdefault(build[1], where)
            pythons.update(p for f in group for p in f.pythons)
            if plain and source.default and default_cuda is None:
                default_cuda = Fact(key="default_cuda", value=build[1], source=where)
        if cxx_std is None:
            if wheel is None:
                wheel = index.facts(representative(group))
                problems.extend(wheel.problems)
            if wheel.cxx_std is not None:
                shown = representative(group).filename
                cxx_std = Fact(key="cxx_std", value=wheel.cxx_std, source=f"headers ({HEADER}) of {shown}")
    names = f"{len(ours)} wheel filenames of " + ", ".join(str(v) for v in reversed(groups))
    if cudas:
        ordered = sorted(cudas, key=lambda c: tuple(int(p) for p in c.split(".")))
        facts.append(Fact(key="cuda", value=ordered, source="; ".join(f"{c}: {cudas[c]}" for c in ordered)))
    if pythons:
        ordered_py = sorted(pythons, key=lambda p: int(p.split(".")[1]))
        facts.append(Fact(key="python", value=ordered_py, source=f"index filenames ({names})"))
    if default_cuda is not None:
        facts.append(default_cuda)
    glibcs = [g for f in ours if (g := f.glibc) is not None]
    if glibcs:
        low = min(glibcs)
        facts.append(Fact(key="glibc", value=f"{low[0]}.{low[1]}", source=f"manylinux tags ({names})"))
        if low >= (2, 28):
            # torch's manylinux_2_28 builds are compiled with the new (C++11) std::string ABI
            facts.append(
                Fact(
                    key="cxx11_abi",
                    value=[True],
                    source="manylinux_2_28 tags (torch builds them with the C++11 ABI)",
                )
            )
    if cxx_std is not None:
        facts.append(cxx_std)
    versions = [str(v) for v in groups]
    if versions:
        facts.append(Fact(key="versions", value=versions, source=f"index ({source.label})"))
    return DerivedTorch(
        minor=minor, where=source.label, facts=tuple(facts), problems=tuple(dict.fromkeys(problems))
    )


def contradictions(derived: DerivedTorch, entry: Mapping[str, Any] | None) -> tuple[str, ...]:
    """Where `derived` says otherwise than compat.json's `entry` (compat.json wins)."""
    if entry is None:
        return ()
    out: list[str] = []
    for fact in derived.facts:
        if fact.key not in TORCH_KEYS or fact.key not in entry:
            continue
        said = entry[fact.key]
        if isinstance(fact.value, list) and isinstance(said, list):
            extra = [v for v in fact.value if v not in said]
            if extra:
                shown = ", ".join(str(v).lower() for v in extra)
                out.append(
                    f"torch {derived.minor} {fact.key}: {derived.where} has {shown}, which compat.json does "
                    f"not list ({fact.source}); compat.json wins"
                )
        elif fact.value != said:
            out.append(
                f"torch {derived.minor} {fact.key}: compat.json says {said}, {derived.where} says "
                f"{fact.value} ({fact.source}); compat.json wins"
            )
    return tuple(out)


def with_derived(compat: CompatData, derived: Iterable[DerivedTorch]) -> tuple[CompatData, tuple[str, ...]]:
    """`compat` with the derived facts filling what it does not say, and the contradictions as notes.
    Derived entries of the same minor from several sources are joined (their lists united)."""
    joined: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for d in derived:
        current = joined.setdefault(d.minor, {})
        for key, value in d.entry().items():
            if isinstance(value, list) and isinstance(current.get(key), list):
                current[key] = current[key] + [v for v in value if v not in current[key]]
            else:
                current.setdefault(key, value)
        notes.extend(contradictions(d, compat.torch_entry(d.minor)))
    data = dict(compat.data)
    torches = dict(data.get("torch", {}))
    for minor, entry in joined.items():
        torches[minor] = merge(entry, torches.get(minor, {}))
    data["torch"] = torches
    return CompatData(data=data), tuple(dict.fromkeys(notes))


# ---------------------------------------------------------------------------------------------- compat show


def open_index(*, home: Path | None = None, pip: PipSettings | None = None) -> tuple[TorchIndex, PipSettings]:
    settings = pip or read_pip_settings()
    return TorchIndex(http=IndexClient(settings), home=home or factory_home()), settings


def minors_on(files: Iterable[TorchFile]) -> list[str]:
    found = {torch_minor(f.version.public) for f in files}
    return sorted(found, key=lambda m: tuple(int(p) for p in m.split(".")))


def compat_report(
    *,
    torch: str | None = None,
    urls: Sequence[str] = (),
    compat: CompatData | None = None,
    home: Path | None = None,
    pip: PipSettings | None = None,
) -> dict[str, Any]:
    """Everything the factory knows about each torch minor (or only `torch`'s), fact by fact with its
    source: the host's pip configuration's indexes and find-links, each of `urls` (per-CUDA indexes), and
    compat.json."""
    compat = compat or CompatData.load()
    index, settings = open_index(home=home, pip=pip)
    sources = [TorchSource.from_pip(settings), *(TorchSource.from_url(u) for u in urls)]
    wanted = torch_minor(torch) if torch else None
    minors: dict[str, dict[str, Any]] = {}
    for minor in compat.data.get("torch", {}):
        if wanted in (None, minor):
            minors[minor] = {"torch": minor, "facts": [], "contradictions": [], "problems": []}
    known = [tuple(int(p) for p in m.split(".")) for m in compat.data.get("torch", {})]
    oldest = min(known, default=(0,))
    for source in sources:
        # each minor's files, grouped once: derived from its own, the report is linear in the index's size
        by_minor: dict[str, list[TorchFile]] = {}
        for f in allowed(index.files(source), source):
            by_minor.setdefault(torch_minor(f.version.public), []).append(f)
        # newest first, so that the bound on wheels read leaves out the oldest; without --torch, from the
        # oldest torch compat.json knows on (older wheels predate the C++11 ABI and manylinux_2_28)
        for minor in reversed(minors_on(f for files in by_minor.values() for f in files)):
            if wanted not in (None, minor):
                continue
            if wanted is None and tuple(int(p) for p in minor.split(".")) < oldest:
                continue
            row = minors.setdefault(
                minor, {"torch": minor, "facts": [], "contradictions": [], "problems": []}
            )
            derived = derive_minor(index, source, minor, by_minor[minor])
            row["facts"] += [{**f.to_json(), "where": source.label} for f in derived.facts]
            row["contradictions"] += list(contradictions(derived, compat.torch_entry(minor)))
            row["problems"] += list(derived.problems)
    for minor, row in minors.items():
        entry = compat.torch_entry(minor) or {}
        row["facts"] += [
            {"key": k, "value": v, "source": COMPAT_JSON, "where": COMPAT_JSON} for k, v in entry.items()
        ]
    ordered = sorted(minors.values(), key=lambda r: tuple(int(p) for p in r["torch"].split(".")))
    return {
        "sources": [s.label for s in sources],
        "precedence": PRECEDENCE,
        "torch": ordered,
        "problems": list(dict.fromkeys(index.problems)),
    }
