"""The compile cache on the host: where it lives, its trips to and from a store, its bound, its counts.

The cache itself (keys, lookups, entries) is the container's (`factory.container.compilecache`): every
committed file in it is immutable and named by its content, so two caches merge by the union of their relative
paths. The host mounts one local directory (`$FACTORY_HOME/cache/compile`) into every build container and is
the only one to talk to a store: before a job it downloads what the store has and the directory lacks; while
the job runs and after it, it uploads what the store lacks. Nothing is overwritten or deleted remotely, and a
build container never sees the store, its URL or its credentials.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from factory.config import MatrixFile, parse_size
from factory.container import compilecache
from factory.container.protocol import CACHE_HIT, CACHE_MISS, CACHE_OFF, MEASUREMENT_MARK, parse_measurement
from factory.errors import ConfigError, FactoryError
from factory.home import factory_home
from factory.options import DEFAULT_CACHE_MAX
from factory.stores import PreconditionFailed, Store, check_destination, open_store

LAYOUT = compilecache.LAYOUT_VERSION  # only files under it are synced
MOUNT = "/var/factory-cache"  # where build containers see the local cache
ENV_DIR = compilecache.CACHE_DIR_ENV  # the container's cache root; absent: the cache is off
# Under a publish store: index code lists only files/, simple/ and profiles/, and no project or variant name
# starts with "_", so nothing of the cache is taken for a project; `factory serve` refuses it.
STORE_PREFIX = "_cache/compile"
DEFAULT_MAX_BYTES = DEFAULT_CACHE_MAX
PUSH_INTERVAL_S = 2.0  # while a job runs, its new entries go up at most this long after they are made
OCTETS = "application/octet-stream"
IMMUTABLE = "public, max-age=31536000, immutable"

Log = Callable[[str], None]


def local_dir(home: Path | None = None) -> Path:
    """The host's cache directory, shared by every job and attempt."""
    return (home or factory_home()) / "cache" / "compile"


def parse_max(value: str | int, *, what: str) -> int:
    """A cache bound ("20GiB", a byte count): the one parser for config, CLI and tests; ConfigError naming
    `what` for anything else."""
    try:
        return parse_size(value)
    except ValueError as exc:
        raise ConfigError(f"{what}: {exc}") from None


# --- where the cache lives --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CacheConfig:
    """One run's cache: the local directory, and the store it is synced with (None: local only)."""

    local: Path
    store: str | None = None
    endpoint_url: str | None = None
    max_bytes: int = DEFAULT_MAX_BYTES


def under(to: str, prefix: str = STORE_PREFIX) -> str:
    """The cache store under a publish destination: s3://b/p -> s3://b/p/_cache/compile; a directory alike."""
    if to.startswith("s3://"):
        return f"{to.rstrip('/')}/{prefix}"
    return str(Path(to).expanduser() / prefix)


def resolve(
    mf: MatrixFile, *, publishing: bool, override: str | None = None, home: Path | None = None
) -> CacheConfig | None:
    """The run's cache from `build.cache` (or `--cache`, which wins): None when off; a store given by URL or
    directory; else, publishing, one under the publish store; else the local directory alone."""
    setting: bool | str = mf.build.cache
    if override is not None:
        setting = False if override == "off" else override
        if setting:
            check_destination(str(setting), what="--cache")
    if setting is False:
        return None
    endpoint = mf.publish.endpoint_url
    if isinstance(setting, str):
        store: str | None = setting
        endpoint = endpoint if setting.startswith("s3://") else None
    elif publishing:
        store = under(mf.publish.to)
    else:
        store, endpoint = None, None
    return CacheConfig(
        local=local_dir(home), store=store, endpoint_url=endpoint, max_bytes=mf.build.cache_max
    )


# --- the local directory ---------------------------------------------------------------------------------


def layout_key(relative: str | PurePosixPath) -> str | None:
    """A committed file's store key (its path relative to the cache root), or None for anything that is not
    one: outside the layout version, hidden or temporary, or a path that could leave the root."""
    parts = PurePosixPath(relative).parts
    if len(parts) < 3 or parts[0] != LAYOUT:
        return None
    if any(p in ("", ".", "..") or p.startswith(".") or p.endswith(".tmp") or "\\" in p for p in parts):
        return None
    return "/".join(parts)


def local_files(root: Path) -> set[str]:
    """The committed files of a local cache, as store keys (a writer's temporaries left out)."""
    if not root.is_dir():
        return set()
    keys = (layout_key(PurePosixPath(p.as_posix())) for p in compilecache.iter_files(root))
    return {k for k in keys if k is not None}


def objects_first(keys: Iterable[str]) -> list[str]:
    """Objects before manifests: a reader (a build's lookup, a prune) that finds a manifest whose object is
    missing removes it, so neither side of a sync may show one before its object."""
    return sorted(keys, key=lambda k: (k.split("/")[1] != "o", k))


def ensure_local(root: Path) -> None:
    """The directory exists and the build containers' unprivileged user can add entries to it."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o777)


def _make_dirs(root: Path, parent: Path) -> None:
    """`parent` and every directory between it and `root`, writable by the container's user (the host may
    run as root: a directory it makes must not lock the build out of a key prefix)."""
    missing = []
    here = parent
    while here != root and not here.exists():
        missing.append(here)
        here = here.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir()
        with contextlib.suppress(OSError):
            directory.chmod(0o777)


# --- sync ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SyncResult:
    files: int = 0
    bytes: int = 0
    failed: int = 0


def remote_files(store: Store) -> set[str]:
    return {k for k in (layout_key(key) for key in store.keys(f"{LAYOUT}/")) if k}


def download(store: Store, root: Path, key: str) -> int:
    """One store file into the local cache, whole or not at all (written aside, then renamed); its size, or
    0 when the store no longer has it or it arrived short."""
    target = root / key
    opened = store.open(key)
    if opened is None:
        return 0
    stream, size = opened
    _make_dirs(root, target.parent)
    # the cache's own temporary name: a download that dies is cleaned up by prune like a build's writer's
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f"{compilecache.TEMP_PREFIX}{target.name}-")
    try:
        with os.fdopen(fd, "wb") as fh, contextlib.closing(stream):
            written = 0
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                fh.write(chunk)
                written += len(chunk)
        if written != size:
            return 0
        # writable by the build's user, so a hit in a container can mark it used (LRU); the directories
        # are open to it anyway
        os.chmod(tmp, 0o666)
        if target.exists():  # the build made it meanwhile: the same content by its name
            return 0
        os.replace(tmp, target)
        return size
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def pull(
    store: Store, root: Path, *, remote: set[str] | None = None, max_bytes: int | None = None
) -> SyncResult:
    """Download the files the store has (`remote`, else its listing) and `root` lacks, up to `max_bytes`:
    more would only be pruned again."""
    ensure_local(root)
    remote = remote_files(store) if remote is None else remote
    files = size = failed = 0
    for key in objects_first(remote - local_files(root)):
        if max_bytes is not None and size >= max_bytes:
            break
        try:
            got = download(store, root, key)
        except (FactoryError, OSError):
            got = 0
        if got:
            files, size = files + 1, size + got
        else:
            failed += 1
    return SyncResult(files=files, bytes=size, failed=failed)


def push(store: Store, root: Path, *, remote: set[str]) -> SyncResult:
    """Upload every file of `root` that `remote` (what the store is known to have) lacks; each one uploaded
    is added to `remote`. A file another writer put first is left as it is (same name, same content)."""
    files = size = failed = 0
    for key in objects_first(local_files(root) - remote):
        path = root / key
        try:
            store.put(key, path, content_type=OCTETS, cache_control=IMMUTABLE, if_none_match=True)
            files, size = files + 1, size + path.stat().st_size
        except PreconditionFailed:
            pass
        except FileNotFoundError:  # pruned meanwhile
            continue
        except (FactoryError, OSError):
            failed += 1
            continue
        remote.add(key)
    return SyncResult(files=files, bytes=size, failed=failed)


class CacheSync:
    """One run's cache: the local directory mounted into its jobs, and, with a store, the store's files
    pulled before each job and pushed while it runs (nudged by its measured compiles) and after it.

    Thread-safe: jobs of one run call it from their threads. A store that cannot be reached is said once
    and costs only the head start; the build goes on with the local cache."""

    def __init__(self, config: CacheConfig, *, log: Log = lambda _m: None) -> None:
        self.config = config
        self.local = config.local
        self.log = log
        self._lock = threading.Lock()
        self._store: Store | None = None
        self._remote: set[str] | None = None
        self._fetched: set[str] = set()
        self._broken = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        ensure_local(self.local)

    # -- the store ------------------------------------------------------------------------------------
    def _open(self) -> Store | None:
        if self.config.store is None or self._broken:
            return None
        if self._store is None:
            try:
                self._store = open_store(self.config.store, endpoint_url=self.config.endpoint_url)
            except (FactoryError, OSError) as exc:
                self._fail("opened", exc)
                return None
        return self._store

    def _fail(self, what: str, exc: Exception) -> None:
        self._broken = True
        self.log(f"compile cache store not {what}: {exc}; building with the local cache only")

    def before_job(self, job_id: str) -> None:
        """Bring down what the store has that the local cache lacks."""
        with self._lock:
            store = self._open()
            if store is None:
                return
            try:
                self._remote = remote_files(store)
                # each file once a run: one pruned to keep the bound is not fetched again for the next job
                wanted = self._remote - self._fetched
                got = pull(store, self.local, remote=wanted, max_bytes=self.config.max_bytes)
            except (FactoryError, OSError) as exc:
                self._fail("read", exc)
                return
            self._fetched |= wanted
        if got.files:
            self.log(f"{job_id}: compile cache: {got.files} file(s) fetched from {self.config.store}")

    def upload(self) -> SyncResult:
        """Send up what the store lacks (what this host compiled since the last upload)."""
        with self._lock:
            store = self._open()
            if store is None:
                return SyncResult()
            try:
                if self._remote is None:
                    self._remote = remote_files(store)
                return push(store, self.local, remote=self._remote)
            except (FactoryError, OSError) as exc:
                self._fail("written", exc)
                return SyncResult()

    def after_job(self, job_id: str) -> None:
        """Upload what the job made (whatever finished, also after a failure or a kill), then bound the
        local cache."""
        sent = self.upload()
        if sent.files:
            self.log(f"{job_id}: compile cache: {sent.files} file(s) sent to {self.config.store}")
        try:
            pruned = prune(self.config.max_bytes, self.local)
        except OSError as exc:
            self.log(f"compile cache not pruned: {exc}")
            return
        if pruned.removed_entries:
            self.log(f"compile cache: {pruned.removed_entries} old entries removed to stay within the bound")

    def nudge(self) -> None:
        """A compile finished: upload soon, so a killed run has already shipped it."""
        self._wake.set()

    # -- the uploader while jobs run ------------------------------------------------------------------
    def __enter__(self) -> CacheSync:
        if self.config.store is not None:
            self._thread = threading.Thread(target=self._uploader, name="cache-upload", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()

    def _uploader(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            if self._stop.is_set():
                return
            self._wake.clear()
            self.upload()
            self._stop.wait(PUSH_INTERVAL_S)  # a burst of finished compiles goes up together


# --- counts ----------------------------------------------------------------------------------------------


def measured_cache(line: str) -> str | None:
    """A build log line's compile measurement: its "cache" field ("hit", "miss", "off"; "off" from a wrapper
    without a cache); None for any other line, and for one cut short by a kill."""
    if MEASUREMENT_MARK not in line:
        return None
    measured = parse_measurement(line)
    if measured is None:
        return None
    return measured.cache if measured.cache in (CACHE_HIT, CACHE_MISS) else CACHE_OFF


def count_compiles(lines: Iterable[str]) -> tuple[int, int]:
    """(served from the cache, compiled) of a build log's measurement lines."""
    cached = compiled = 0
    for line in lines:
        state = measured_cache(line)
        if state == CACHE_HIT:
            cached += 1
        elif state is not None:
            compiled += 1
    return cached, compiled


# --- the CLI's commands ----------------------------------------------------------------------------------


def stats(root: Path | None = None) -> compilecache.CacheStats:
    root = root or local_dir()
    if not root.is_dir():
        return compilecache.CacheStats(entries=0, objects=0, bytes=0, oldest=None, newest=None)
    return compilecache.stats(root)


def prune(max_bytes: int, root: Path | None = None) -> compilecache.PruneResult:
    """The local cache within `max_bytes`, least recently used entries out first."""
    root = root or local_dir()
    if not root.is_dir():
        return compilecache.PruneResult(removed_entries=0, removed_bytes=0, kept_bytes=0)
    return compilecache.prune(root, max_bytes=max_bytes)
