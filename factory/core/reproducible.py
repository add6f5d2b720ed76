"""What makes two builds of one job write the same bytes: the source's date, and a wheel's canonical archive.

SOURCE_DATE_EPOCH (reproducible-builds.org) is the one clock a build may read. It comes from the source, never
from the host: an sdist's newest member, a git checkout's commit, and for a local directory a fixed date (its
files' mtimes say when it was copied, not what it holds). The build container gets it (`jobspec`), so
setuptools' bdist_wheel dates the members it writes with it; the host's rewrite of the wheel
(`wheelcheck.rewrite_wheel`) then writes every member in one canonical form (`canonical_order`,
`canonical_info`): sorted by name with .dist-info last and RECORD its last member, dated from the epoch,
mode 0644 or 0755, deflated at one level. Nothing of the build's host, home or time is left in the archive.
"""

from __future__ import annotations

import calendar
import subprocess
import tarfile
import time
import zipfile
from collections.abc import Iterable
from pathlib import Path

from factory.core import bounded

# 1980-01-01T00:00:00Z, the earliest date a zip can hold: the date of a source that has none of its own
DEFAULT_EPOCH = 315532800
ENV = "SOURCE_DATE_EPOCH"
COMPRESSION = zipfile.ZIP_DEFLATED
COMPRESS_LEVEL = 6  # zlib's default, named so that no library's default can change it
FILE_MODE = 0o644
EXECUTABLE_MODE = 0o755
DIR_MODE = 0o755
_UNIX = 3  # ZipInfo.create_system: the permission bits in external_attr are Unix's
_S_IFREG = 0o100000
_S_IFDIR = 0o040000
_MAX_SDIST_MEMBERS = 1_000_000


def clamp(epoch: int) -> int:
    """An epoch a zip can hold: from 1980 (zip's first date) to 2107 (its last)."""
    return min(max(epoch, DEFAULT_EPOCH), 4354819199)


def zip_date_time(epoch: int) -> tuple[int, int, int, int, int, int]:
    """The zip member date of `epoch`, in UTC (a zip has no time zone: UTC is the one every host agrees on).
    Zip keeps even seconds only."""
    t = time.gmtime(clamp(epoch))
    return (t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec - t.tm_sec % 2)


def sdist_epoch(archive: Path) -> int | None:
    """The newest member mtime of an sdist (.tar.gz or .zip): the date its maker wrote, the same wherever it
    is downloaded. None when it holds no dated member or cannot be read."""
    newest: int | None = None
    try:
        if archive.suffix == ".zip":
            with bounded.open_zip(archive) as z:
                for count, info in enumerate(z.infolist()):
                    if count > _MAX_SDIST_MEMBERS:
                        break
                    stamp = calendar.timegm((*info.date_time, 0, 0, 0))  # read as UTC, as written
                    newest = stamp if newest is None else max(newest, stamp)
        else:
            with tarfile.open(archive, "r:*") as tar:
                for count, member in enumerate(tar):
                    if count > _MAX_SDIST_MEMBERS:
                        break
                    stamp = int(member.mtime)
                    newest = stamp if newest is None else max(newest, stamp)
    except (OSError, EOFError, tarfile.TarError, zipfile.BadZipFile, ValueError, OverflowError):
        return None
    return newest if newest is not None and newest > 0 else None


def git_epoch(tree: Path) -> int | None:
    """The commit time of the checkout at `tree`; None when it is no git checkout."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(tree), "log", "-1", "--format=%ct"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    text = proc.stdout.strip()
    return int(text) if proc.returncode == 0 and text.isdigit() else None


def source_date_epoch(kind: str, *, archive: Path | None = None, tree: Path | None = None) -> int:
    """SOURCE_DATE_EPOCH for a source of `kind` ("pypi", "git", "path"): from the sdist, the commit, else
    DEFAULT_EPOCH; clamped to what a zip can hold."""
    found: int | None = None
    if kind == "pypi" and archive is not None:
        found = sdist_epoch(archive)
    elif kind == "git" and tree is not None:
        found = git_epoch(tree)
    return clamp(found if found is not None else DEFAULT_EPOCH)


# --- a wheel's canonical archive ---------------------------------------------------------------------------


def member_sort_key(name: str) -> tuple[int, str]:
    """Sorted by name, the .dist-info directory after everything else and its RECORD last, as installers
    expect (the wheel spec recommends .dist-info last) and as bdist_wheel writes them."""
    top = name.split("/", 1)[0]
    if top.endswith(".dist-info") and "/" in name:
        return (2 if name.endswith("/RECORD") and name.count("/") == 1 else 1, name)
    return (0, name)


def canonical_order(names: Iterable[str]) -> list[str]:
    return sorted(names, key=member_sort_key)


def canonical_mode(external_attr: int, *, is_dir: bool) -> int:
    """0755 for a directory or a member any execute bit was set on, else 0644: umasks and owners differ."""
    if is_dir:
        return DIR_MODE
    return EXECUTABLE_MODE if (external_attr >> 16) & 0o111 else FILE_MODE


def canonical_info(name: str, *, epoch: int, mode: int, is_dir: bool = False) -> zipfile.ZipInfo:
    """A member's zip metadata as every build writes it: the source's date, Unix permission bits of `mode`,
    deflated at COMPRESS_LEVEL (stored for a directory), and nothing of the host."""
    info = zipfile.ZipInfo(name, date_time=zip_date_time(epoch))
    info.create_system = _UNIX
    info.external_attr = ((_S_IFDIR if is_dir else _S_IFREG) | mode) << 16
    if is_dir:
        info.external_attr |= 0x10  # MS-DOS directory bit, as zipfile sets it
        info.compress_type = zipfile.ZIP_STORED
    else:
        info.compress_type = COMPRESSION
        # `compress_level` from Python 3.13, `_compresslevel` before: zipfile reads one or the other
        attribute = "compress_level" if hasattr(info, "compress_level") else "_compresslevel"
        setattr(info, attribute, COMPRESS_LEVEL)
    return info
