"""Learned compile profiles per (package, version): peak memory and time of each (source file, archs,
threads)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from packaging.utils import canonicalize_name

from factory.container import protocol
from factory.container.protocol import Measurement, ProfileEntry
from factory.core.errors import ConfigError
from factory.core.home import factory_home
from factory.core.units import format_size


@dataclass(frozen=True, kw_only=True)
class Profile:
    package: str
    version: str
    entries: Mapping[str, ProfileEntry] = field(default_factory=lambda: MappingProxyType({}))

    def to_json(self) -> dict[str, object]:
        """The file format (`protocol.profile_json`), also what the nvcc wrapper reads from
        FACTORY_PROFILE_IN."""
        return protocol.profile_json(self.package, self.version, self.entries)


def profile_path(package: str, version: str, *, home: Path | None = None) -> Path:
    return (home or factory_home()) / "profiles" / canonicalize_name(package) / f"{version}.json"


def keyed_version(version: str, measured: str) -> str:
    """The version a profile is stored and shipped under: the package's own for figures measured natively on
    the default platform, "<version>@<measured>" for others (`emulation.measured_on`), so figures measured
    under emulation never mix with native ones (a PEP 440 version has no "@")."""
    return f"{version}@{measured}" if measured else version


def profile_from_json(data: object, *, source: str = "profile") -> Profile:
    try:
        package, version, entries = protocol.parse_profile(data)
    except ValueError as exc:
        raise ConfigError(str(exc), file=source) from None
    return Profile(package=package, version=version, entries=MappingProxyType(entries))


def load_profile(path: Path, *, package: str = "", version: str = "") -> Profile:
    """The stored profile, or an empty one when none was learned yet."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Profile(package=package, version=version)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"not valid JSON: {exc}", file=str(path)) from None
    return profile_from_json(data, source=str(path))


def save_profile(profile: Profile, path: Path) -> None:
    """Written whole and renamed into place: a reader never sees half a profile."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        json.dump(profile.to_json(), fh, indent=1, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


def read_measurements(path: Path) -> list[Measurement]:
    """The wrapper's JSON lines, or its marked lines in a build log; a line cut short by a kill is skipped."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    return [m for m in map(protocol.parse_measurement, lines) if m is not None]


def merge(profile: Profile, measurements: Iterable[Measurement]) -> Profile:
    """Fold new measurements in: a peak only ever rises; time is the mean of successful compiles.

    A killed compile's peak is still a lower bound of what it needs, so it raises the estimate too. A
    compile served from the cache teaches nothing.
    """
    entries = dict(profile.entries)
    for m in measurements:
        if not m.learns:  # a cache hit measured a lookup; the host compiler is not admitted
            continue
        old = entries.get(m.key)
        ok_wall = m.wall_s if m.rc == 0 else None
        if old is None:
            entries[m.key] = ProfileEntry(
                peak_bytes=m.peak_bytes,
                wall_s=ok_wall,
                samples=1,
                envelope=m.envelope if m.rc == 0 else (),
                rise=m.rise if m.rc == 0 else (),
            )
            continue
        wall = old.wall_s
        if ok_wall is not None:
            wall = ok_wall if wall is None else (wall * old.samples + ok_wall) / (old.samples + 1)
        entries[m.key] = ProfileEntry(
            peak_bytes=max(old.peak_bytes, m.peak_bytes),
            wall_s=round(wall, 3) if wall is not None else None,
            samples=old.samples + 1,
            envelope=_pointwise_max(old.envelope, m.envelope if m.rc == 0 else ()),
            rise=_pointwise_max(old.rise, m.rise if m.rc == 0 else ()),
        )
    return replace(profile, entries=MappingProxyType(entries))


def _pointwise_max(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Courses of several runs of one compile: the most at each point is the safe one to plan with."""
    if not a or not b or len(a) != len(b):
        return a or b
    return tuple(max(x, y) for x, y in zip(a, b, strict=True))


def merge_profiles(base: Profile, other: Profile) -> Profile:
    """Import of a profile shipped with published results (e.g. from another CI runner)."""
    measurements = [
        Measurement(
            key=k,
            peak_bytes=e.peak_bytes,
            wall_s=e.wall_s or 0.0,
            rc=0 if e.wall_s else 1,
            envelope=e.envelope,
            rise=e.rise,
        )
        for k, e in other.entries.items()
    ]
    return merge(base, measurements)


def record(package: str, version: str, measurements_file: Path, *, home: Path | None = None) -> Profile:
    """Merge a build's measurements into the stored profile of (package, version) and save it."""
    path = profile_path(package, version, home=home)
    profile = merge(
        load_profile(path, package=package, version=version), read_measurements(measurements_file)
    )
    save_profile(profile, path)
    return profile


def raised_per_arch(per_arch_bytes: int, profile: Profile, *, base_bytes: int) -> int:
    """The recipe's estimate for files never measured, raised to the worst per-arch peak measured so far."""
    worst = per_arch_bytes
    for key, entry in profile.entries.items():
        parsed = protocol.parse_compile_key(key)
        if parsed is None:
            continue
        _, archs, threads = parsed
        width = max(1, min(threads, len(archs)))
        worst = max(worst, (entry.peak_bytes - base_bytes) // width)
    return worst


def export_profile(package: str, version: str, dest_dir: Path, *, home: Path | None = None) -> Path | None:
    """Copy the stored profile next to published results as `<name>-<version>.compile-profile.json`."""
    profile = load_profile(profile_path(package, version, home=home), package=package, version=version)
    if not profile.entries:
        return None
    dest = dest_dir / f"{canonicalize_name(package)}-{version}.compile-profile.json"
    save_profile(profile, dest)
    return dest


def import_profile(path: Path, *, home: Path | None = None) -> Profile:
    """Merge a shipped profile into the local state directory (peaks only rise)."""
    other = load_profile(path)
    if not other.package or not other.version:
        raise ConfigError("a shipped profile must name its package and version", file=str(path))
    dest = profile_path(other.package, other.version, home=home)
    merged = merge_profiles(load_profile(dest, package=other.package, version=other.version), other)
    save_profile(merged, dest)
    return merged


def profile_summaries(package: str | None = None, *, home: Path | None = None) -> list[str]:
    """`factory memory profiles`: one line per learned profile in the state directory (only `package`'s when
    given), or one saying there are none."""
    root = (home or factory_home()) / "profiles"
    lines: list[str] = []
    for path in sorted(root.glob("*/*.json")) if root.is_dir() else []:
        if package and path.parent.name != canonicalize_name(package):
            continue
        p = load_profile(path)
        worst = max((e.peak_bytes for e in p.entries.values()), default=0)
        lines.append(
            f"{path.parent.name} {path.stem}: {len(p.entries)} compiles, worst peak {format_size(worst)}"
        )
    return lines or [f"no profiles in {root}"]


# How many compiles (ninja edges, over every extension) a complete first attempt of a package's build ran:
# the next build's progress shows its count against it from its first compile on, where torch's one ninja
# per extension would only tell the whole total when the last extension starts.
MAX_TOTAL_FILE = 4096


def compile_total_path(package: str, version: str, *, home: Path | None = None) -> Path:
    return (home or factory_home()) / "compile-totals" / canonicalize_name(package) / f"{version}.json"


def load_compile_total(package: str, version: str, *, home: Path | None = None) -> int:
    """The compiles an earlier complete build counted; 0 when none did (or its file is not one we wrote)."""
    try:
        with compile_total_path(package, version, home=home).open("rb") as fh:
            data = json.loads(fh.read(MAX_TOTAL_FILE))
    except (OSError, ValueError):
        return 0
    total = data.get("compiles") if isinstance(data, dict) else None
    return total if isinstance(total, int) and not isinstance(total, bool) and 0 < total < 10**7 else 0


def save_compile_total(package: str, version: str, total: int, *, home: Path | None = None) -> None:
    if total <= 0:
        return
    path = compile_total_path(package, version, home=home)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        json.dump({"compiles": total}, fh)
    os.replace(tmp, path)
