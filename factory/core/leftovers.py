"""What a killed factory leaves behind, and whether its owner still lives.

A run killed with SIGKILL cleans nothing up: its `.tmp-<job>-<run>` directories stay in `--output`, its jobs'
directories in the work volume, a publish's half-written temporaries in a local index, a download or unpack
in `$FACTORY_HOME` (`sdists/.partial-*`, `sources/.partial-*`). Each records its owner (process id and host),
so the next run (or `factory clean`) removes those whose owner is gone, and never a live one's. The work
volume is reached through Docker, in a container of a builder image, by `factory.build.cleanup`, which asks
this module which of its job directories are stale.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from factory.container import protocol
from factory.core import safefs

OWNER_FILE = protocol.OWNER_FILE  # inside a run's temporary output directory
OUTPUT_TMP_PREFIX = ".tmp-"
PARTIAL_PREFIX = ".partial-"
_PARTIAL = re.compile(r"^\.partial-(?P<host>[A-Za-z0-9-]*)\.(?P<pid>\d+)\.")
# Without a readable owner (written by an older factory, or the run died between mkdir and the marker):
# old enough that no live run can still be writing there.
UNOWNED_AGE_S = 3600.0


@dataclass(frozen=True, kw_only=True)
class Owner:
    pid: int
    host: str


def this_process() -> Owner:
    return Owner(pid=os.getpid(), host=socket.gethostname())


def is_alive(
    owner: Owner, *, host: str | None = None, pid_exists: Callable[[int], bool] = psutil.pid_exists
) -> bool:
    """Whether `owner` may still be running: its process exists on this host. Another host's process cannot
    be checked from here, so it counts as alive."""
    if owner.host != (host if host is not None else socket.gethostname()):
        return True
    return owner.pid == os.getpid() or pid_exists(owner.pid)


OWNER_MAX_BYTES = 64 << 10


def output_tmp_dir(output: Path, *, job_id: str, run_id: str) -> Path:
    """Where a job's wheel is made before it is accepted into `output`."""
    return output / f"{OUTPUT_TMP_PREFIX}{job_id}-{run_id}"


def make_output_tmp_dir(path: Path) -> None:
    """The directory, with this process recorded as its owner."""
    path.mkdir(parents=True, exist_ok=True)
    (path / OWNER_FILE).write_text(owner_json())


def owner_json(owner: Owner | None = None) -> str:
    """An owner file's text: `owner`, else this process."""
    owner = owner or this_process()
    return protocol.owner_json(owner.pid, owner.host)


def parse_owner(text: str | None) -> Owner | None:
    parsed = protocol.parse_owner(text) if text is not None else None
    return Owner(pid=parsed[0], host=parsed[1]) if parsed else None


def read_owner(directory: Path) -> Owner | None:
    """The owner a directory records; the build container can write there, so its file is read as any file
    a container wrote (`safefs`: no link followed, a regular file, bounded)."""
    try:
        return parse_owner(safefs.read_bytes(directory, OWNER_FILE, max_bytes=OWNER_MAX_BYTES).decode())
    except (OSError, UnicodeDecodeError):
        return None


def is_stale_output_dir(
    owner: Owner | None,
    *,
    age_s: float,
    host: str | None = None,
    pid_exists: Callable[[int], bool] = psutil.pid_exists,
) -> bool:
    """A temporary output directory is stale when its owner is gone, or, with no owner recorded, when it is
    older than UNOWNED_AGE_S."""
    if owner is None:
        return age_s > UNOWNED_AGE_S
    return not is_alive(owner, host=host, pid_exists=pid_exists)


def remove_stale_output_dirs(output: Path) -> list[Path]:
    """Remove the temporary directories in `output` that runs now gone left behind; the removed ones."""
    removed: list[Path] = []
    try:
        entries = list(output.iterdir())
    except OSError:
        return removed
    now = time.time()
    for entry in sorted(entries):
        if not entry.name.startswith(OUTPUT_TMP_PREFIX) or entry.is_symlink() or not entry.is_dir():
            continue
        try:
            age = now - entry.stat().st_mtime
        except OSError:
            continue
        if is_stale_output_dir(read_owner(entry), age_s=age):
            shutil.rmtree(entry, ignore_errors=True)
            if not entry.exists():
                removed.append(entry)
    return removed


def stale_job_dirs(
    dirs: Sequence[protocol.JobDir],
    *,
    running_runs: Collection[str],
    host: str | None = None,
    pid_exists: Callable[[int], bool] = psutil.pid_exists,
) -> list[str]:
    """The names of the work volume's job directories (`<job>-<run>`) that runs now gone left: the rule of
    temporary output directories (`is_stale_output_dir`, an unowned one's age the time nothing in it
    changed), and never one whose run still has a running container."""
    return [
        d.name
        for d in dirs
        if not any(d.name.endswith(f"-{run}") for run in running_runs)
        and is_stale_output_dir(parse_owner(d.owner), age_s=d.idle_s, host=host, pid_exists=pid_exists)
    ]


_HOST_UNSAFE = re.compile(r"[^A-Za-z0-9-]")


def host_tag(host: str | None = None) -> str:
    """The host name as it can appear in a file name: letters, digits and dashes only."""
    return _HOST_UNSAFE.sub("-", host if host is not None else socket.gethostname())


def partial_prefix() -> str:
    """mkstemp's or mkdtemp's prefix for a temporary this process fills, then renames into place. A file has
    no room for an owner file, so the name carries the owner, for files and directories alike."""
    return f"{PARTIAL_PREFIX}{host_tag()}.{os.getpid()}."


def partial_owner(name: str) -> Owner | None:
    """The owner a partial_prefix name records (its host as host_tag); None for any other name."""
    match = _PARTIAL.match(name)
    return Owner(pid=int(match["pid"]), host=match["host"]) if match else None


def is_stale_named(
    owner: Owner | None,
    *,
    age_s: float,
    host: str | None = None,
    pid_exists: Callable[[int], bool] = psutil.pid_exists,
) -> bool:
    """The rule for temporaries whose name records their owner (host as host_tag): stale when the owner on
    this host is gone (a live one's is kept however long it takes), or, when it cannot be checked from here
    (another host's, an older factory's unowned name), when it is older than UNOWNED_AGE_S."""
    here = host_tag(host)
    if owner is not None and owner.host == here:
        return not is_alive(owner, host=here, pid_exists=pid_exists)
    return age_s > UNOWNED_AGE_S


def remove_stale_partials(directory: Path) -> list[Path]:
    """Remove the `.partial-*` files and directories in `directory` of owners now gone; the removed ones."""
    removed: list[Path] = []
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        if not entry.name.startswith(PARTIAL_PREFIX):
            continue
        try:
            age = now - entry.lstat().st_mtime
            if not is_stale_named(partial_owner(entry.name), age_s=age):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink()
        except OSError:  # gone meanwhile: its owner renamed it into place
            continue
        if not os.path.lexists(entry):
            removed.append(entry)
    return removed
