"""Saying so when a recipe's patches move a source to a new compile-cache domain.

The compile cache keeps one trust domain per code that builds (`cache.trust_domain` of the source's code id,
which hashes the patches): a patch that changes only setup.py is other code, so the compiles an earlier build
or a preflight of the same package left in the cache are not offered to the next build. That is by design
(a build uses only entries made by builds of the same code), but it costs a whole compile, so the host says it
when it happens: it remembers, per package and version, the domain and the patches of its last build here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from packaging.utils import canonicalize_name

from factory.core.urls import printable

STATE_DIR = "source-domains"  # under $FACTORY_HOME
MAX_STATE_FILE = 1 << 16


def patch_digests(patches: Sequence[Path]) -> dict[str, str]:
    """Each patch file's sha256, by its name in the recipe's order (a name twice: the later one)."""
    found: dict[str, str] = {}
    for patch in patches:
        digest = hashlib.sha256()
        with contextlib.suppress(OSError), patch.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 16), b""):
                digest.update(block)
        found[patch.name] = digest.hexdigest()
    return found


def change_note(
    previous: Mapping[str, object] | None, *, domain: str, patches: Mapping[str, str], what: str
) -> str | None:
    """The line to say when `domain` is not the one the last build of `what` ran in, and its patches are
    not the ones it had; None when nothing changed, or nothing was remembered."""
    if not isinstance(previous, Mapping) or previous.get("domain") in (None, domain):
        return None
    before = previous.get("patches")
    if not isinstance(before, Mapping):
        return None
    changed = sorted(name for name in patches if name in before and before[name] != patches[name])
    added = sorted(name for name in patches if name not in before)
    dropped = sorted(str(name) for name in before if name not in patches)
    if not (changed or added or dropped):
        return None  # the same patches: another source (a new sdist, a moved tree), not a patch's doing
    parts = [f"{label} {', '.join(names)}" for label, names in (
        ("changed", changed), ("added", added), ("dropped", dropped)
    ) if names]  # fmt: skip
    return printable(
        f"the recipe's patches of {what} differ from its last build here ({'; '.join(parts)}): the source "
        "is other code, so it builds in a new compile-cache domain and the compiles of earlier builds and "
        "preflights of it are not reused (a patch that changes only setup.py does this too)"
    )


def _state_path(home: Path, package: str, version: str) -> Path:
    return home / STATE_DIR / canonicalize_name(package) / f"{version}.json"


def remember(home: Path, *, package: str, version: str, domain: str, patches: Sequence[Path]) -> str | None:
    """Compare this build's domain and patches with the last build's of the package version here, keep
    this one's, and return the note to say (`change_note`)."""
    path = _state_path(home, package, version)
    digests = patch_digests(patches)
    previous: object = None
    with contextlib.suppress(OSError, ValueError), path.open("rb") as fh:
        previous = json.loads(fh.read(MAX_STATE_FILE))
    note = change_note(
        previous if isinstance(previous, Mapping) else None,
        domain=domain,
        patches=digests,
        what=f"{package} {version}",
    )
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as out:
            json.dump({"domain": domain, "patches": digests}, out)
        os.replace(tmp, path)
    return note
