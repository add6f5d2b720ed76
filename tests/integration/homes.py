"""The integration tests' own `$FACTORY_HOME`s, sharing with the user's only what is keyed by its content.

The wheelhouses (torch's GBs) and the sdists are keyed by a hash of their inputs and never change once made:
a test's home links them to the user's. A real third-party package's compiles (minutes each on two cores) are
kept across sessions the same way a CI cache would keep them (`kept_compile_cache`): every key of the compile
cache names all of a compile's inputs and every entry is signed, so a later session takes an object only
where the same compile made it, and a changed toolkit, torch, flag or patch compiles again.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SHARED = ("wheelhouses", "sdists")
KEPT = "test-compile-caches"  # in the user's home: one folder per test that keeps its compiles


def user_home(session_home: Path) -> Path:
    """The user's `$FACTORY_HOME`, whose wheelhouses the session's home links to."""
    return (session_home / "wheelhouses").resolve().parent


def fresh_home(tmp: Path, name: str, session_home: Path, shared: tuple[str, ...] = ("wheelhouses",)) -> Path:
    """An empty `$FACTORY_HOME` but for `shared` (the wheelhouse cache by default), linked to the user's."""
    home = tmp / name
    home.mkdir()
    user = user_home(session_home)
    for item in shared:
        (user / item).mkdir(exist_ok=True)
        (home / item).symlink_to(user / item, target_is_directory=True)
    return home


@contextmanager
def kept_compile_cache(home: Path, session_home: Path, name: str) -> Iterator[None]:
    """`home`'s compile cache (`cache/`, with its signing key) as the last session that ran `name` left it,
    saved again afterwards, whole and at once (a killed session leaves the last whole copy). The factory
    prunes the cache to its size limit itself, so what is kept stays bounded."""
    kept = user_home(session_home) / KEPT / name
    cache = home / "cache"
    if kept.is_dir() and not kept.is_symlink():
        shutil.copytree(kept, cache, symlinks=True)
    yield
    if not cache.is_dir():
        return
    staged = kept.with_name(f".{name}.{os.getpid()}")
    shutil.rmtree(staged, ignore_errors=True)
    shutil.copytree(cache, staged, symlinks=True, ignore=shutil.ignore_patterns("outbox"))
    old = kept.with_name(f".{name}.old.{os.getpid()}")
    if kept.exists():
        kept.rename(old)
    staged.rename(kept)
    shutil.rmtree(old, ignore_errors=True)
