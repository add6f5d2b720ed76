"""Compile profiles shipped with published results: each CI runner starts from what any runner learned.

A profile lives in the index store at `profiles/<name>-<version>.compile-profile.json`. Both directions merge
(peaks only rise), and the store write is conditional, so runners publishing at once lose no measurement.
"""

from __future__ import annotations

import json
from pathlib import Path

from packaging.utils import canonicalize_name

from factory.index import PAGE_CACHE_CONTROL
from factory.memory.profiles import (
    Profile,
    load_profile,
    merge_profiles,
    profile_from_json,
    profile_path,
    save_profile,
)
from factory.stores import PreconditionFailed, Store

RETRIES = 20


def profile_key(package: str, version: str) -> str:
    return f"profiles/{canonicalize_name(package)}-{version}.compile-profile.json"


def _stored(store: Store, key: str) -> tuple[Profile | None, str | None]:
    blob = store.get(key)
    if blob is None:
        return None, None
    return profile_from_json(json.loads(blob.data), source=f"{store.description}/{key}"), blob.etag


def pull_profile(store: Store, *, package: str, version: str, home: Path | None = None) -> int:
    """Merge the shipped profile into the local state directory; returns how many compiles it knows."""
    shipped, _ = _stored(store, profile_key(package, version))
    if shipped is None:
        return 0
    path = profile_path(package, version, home=home)
    merged = merge_profiles(load_profile(path, package=package, version=version), shipped)
    save_profile(merged, path)
    return len(shipped.entries)


def push_profile(store: Store, *, package: str, version: str, home: Path | None = None) -> int:
    """Merge the local profile into the shipped one; returns how many compiles the shipped one now knows."""
    local = load_profile(profile_path(package, version, home=home), package=package, version=version)
    if not local.entries:
        return 0
    key = profile_key(package, version)
    for _ in range(RETRIES):
        shipped, etag = _stored(store, key)
        merged = local if shipped is None else merge_profiles(shipped, local)
        data = (json.dumps(merged.to_json(), indent=1, sort_keys=True) + "\n").encode()
        try:
            store.put(
                key, data, content_type="application/json", cache_control=PAGE_CACHE_CONTROL,
                if_match=etag, if_none_match=etag is None,
            )  # fmt: skip
        except PreconditionFailed:
            continue  # another runner shipped in between: merge with theirs and try again
        return len(merged.entries)
    raise PreconditionFailed(key)
