"""CPython's source, for a builder whose Debian suite ships no package of the job's Python.

The pypi flavor's Python 3.13 otherwise comes from forky (glibc 2.43), so its wheels do not install on
Debian 12, Ubuntu 22.04 or RHEL 9. A CUDA extension links no libpython: what bounds its wheel is the builder's
glibc and libstdc++, so a bookworm builder (2.36, GCC 12) with a CPython 3.13 compiled there makes wheels as
portable as its Python 3.11's (`images.ensure_cpython_base`, docker/Dockerfile.cpython).

No registry and no python.org is reachable from the hosts this is for; the Debian mirror is. It serves each
CPython's upstream tarball as the `.orig.tar.xz` of Debian's source package. The tarball is fetched on the
host (never inside the image build), from the mirror the host's apt uses, bounded in size and time, and kept
only when its sha256 is the one pinned here (read from the signed `Sources` index of forky's `main`, December
2026): a mirror cannot hand over another file. Debian's pool drops a version once no suite lists it; the pin
is then bumped here, and until it is, the error says which file the mirror no longer has.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from factory.core import bounded
from factory.core.errors import ImageError
from factory.core.home import factory_home

# A source tarball is ~25 MB; a mirror answering with more is refused.
MAX_BYTES = 64 << 20
SECONDS = 600.0


@dataclass(frozen=True, kw_only=True)
class CPythonSource:
    """One CPython release's source tarball on the Debian mirror, by its pool path and sha256."""

    python: str  # "3.13"
    version: str  # "3.13.15"
    pool_path: str  # under the mirror's root
    sha256: str
    size: int

    @property
    def file_name(self) -> str:
        return self.pool_path.rsplit("/", 1)[-1]


# python3.14's pool directory is not served by the mirror reachable here (404, December 2026): 3.14 and 3.15
# are left to forky's packages until it is.
SOURCES = {
    "3.13": CPythonSource(
        python="3.13",
        version="3.13.15",
        pool_path="pool/main/p/python3.13/python3.13_3.13.15.orig.tar.xz",
        sha256="1e66a7945a48390ee4c2a4268a0e4185884059a13c4aab6d148aa208deea4a76",
        size=23160540,
    ),
}


def source_for(python: str) -> CPythonSource:
    """The pinned source of `python`; ImageError naming those there are for another."""
    found = SOURCES.get(python)
    if found is None:
        raise ImageError(
            f"no CPython source is pinned for Python {python} (pinned: {', '.join(sorted(SOURCES))}); "
            "factory/build/cpythonsrc.py lists them"
        )
    return found


def cache_path(source: CPythonSource) -> Path:
    return factory_home() / "cache" / "cpython" / source.sha256 / source.file_name


def fetch(source: CPythonSource, *, mirror: str) -> Path:
    """The tarball, from the cache when a verified copy is there, else downloaded from `mirror` and verified
    against the pin before it is kept. ImageError for an unreachable mirror, a missing file or other bytes."""
    path = cache_path(source)
    if path.is_file() and _sha256_file(path) == source.sha256:
        return path
    url = f"{mirror.rstrip('/')}/{source.pool_path}"
    digest = hashlib.sha256()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + f".part-{os.getpid()}")
    try:
        with (
            bounded.open_url(bounded.request(url), seconds=SECONDS, max_bytes=MAX_BYTES, shown=url) as body,
            partial.open("wb") as out,
        ):
            while chunk := body.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != source.sha256:
            raise ImageError(
                f"{url}: sha256 {digest.hexdigest()}, not the pinned {source.sha256} of CPython "
                f"{source.version}'s source; the file is not used"
            )
        os.replace(partial, path)
    except urllib.error.HTTPError as exc:
        gone = " (Debian's pool drops a version no suite lists: bump the pin in factory/build/cpythonsrc.py)"
        raise ImageError(
            f"cannot fetch CPython {source.version}'s source {url}: HTTP {exc.code}"
            + (gone if exc.code == 404 else "")
        ) from None
    except OSError as exc:
        raise ImageError(f"cannot fetch CPython {source.version}'s source {url}: {exc}") from None
    finally:
        partial.unlink(missing_ok=True)
    return path


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with bounded.open_file(path, max_bytes=MAX_BYTES) as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
    except OSError:  # not a regular file, too large: fetched again
        return ""
    return digest.hexdigest()
