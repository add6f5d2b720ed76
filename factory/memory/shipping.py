"""Compile profiles shipped with published results: each CI runner starts from what any runner learned.

A profile lives in the index store at `profiles/<name>-<version>.compile-profile.json`. Both directions merge
(peaks only rise), and the store write is conditional, so runners publishing at once lose no measurement.
"""

from __future__ import annotations

import json
from pathlib import Path

from packaging.utils import canonicalize_name

from factory.memory.profiles import (
    load_profile,
    merge_profiles,
    profile_from_json,
    profile_path,
    save_profile,
)
from factory.publish.index import PAGE_CACHE_CONTROL
from factory.publish.stores import Store, compare_and_swap


def profile_key(package: str, version: str) -> str:
    return f"profiles/{canonicalize_name(package)}-{version}.compile-profile.json"


def pull_profile(store: Store, *, package: str, version: str, home: Path | None = None) -> int:
    """Merge the shipped profile into the local state directory; returns how many compiles it knows."""
    key = profile_key(package, version)
    blob = store.get(key)
    if blob is None:
        return 0
    shipped = profile_from_json(json.loads(blob.data), source=f"{store.description}/{key}")
    path = profile_path(package, version, home=home)
    save_profile(merge_profiles(load_profile(path, package=package, version=version), shipped), path)
    return len(shipped.entries)


def push_profile(store: Store, *, package: str, version: str, home: Path | None = None) -> int:
    """Merge the local profile into the shipped one; returns how many compiles the shipped one now knows."""
    local = load_profile(profile_path(package, version, home=home), package=package, version=version)
    if not local.entries:
        return 0
    key = profile_key(package, version)
    known = len(local.entries)

    def merged(current: bytes | None) -> bytes:
        nonlocal known
        shipped = None if current is None else profile_from_json(json.loads(current), source=key)
        profile = local if shipped is None else merge_profiles(shipped, local)
        known = len(profile.entries)
        return (json.dumps(profile.to_json(), indent=1, sort_keys=True) + "\n").encode()

    # Conditional writes: runners shipping at once merge with each other instead of overwriting.
    compare_and_swap(store, key, merged, content_type="application/json", cache_control=PAGE_CACHE_CONTROL)
    return known
