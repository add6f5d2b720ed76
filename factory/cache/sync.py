"""The compile cache on the host: where it lives, who may add to it, its trips to and from a store, its bound.

The cache's format is the container's (`factory.container.compilecache`); this module owns its trust. The
local cache (`$FACTORY_HOME/cache/compile`) is written by the host alone: `v2/<domain>/{m,o}/...`, one
directory per trust domain (the code that builds: an sdist's sha256 and the recipe's patches, a source
path, a git URL). A build container sees its own domain's directory read-only, and writes what it compiles
to an outbox of its job's (`Outbox`); the host imports from it only files of the cache's grammar that are
regular files (no link followed, sizes bounded), objects whose content has the sha256 they are named by, and
manifests it then signs (Ed25519, with a key no container sees: `factory/trust/cachekeys.py`). Whatever a
container plants is at most an entry of its own domain, used only by builds of the same code, which runs in
them anyway.

The host is the only one to talk to a store: before a job it downloads the store's manifests of the job's
domain that the directory lacks, each kept only when a key of the store signed it (else a miss, never an
error), and the objects those name, each checked as an import is; while the job runs and after it, a
trusted writer (the store's private key) uploads the entries the store lacks; an untrusted build (public
keys only) uploads nothing. Nothing is overwritten or deleted remotely, and a build container never sees
the store, its URL, its credentials or a key.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from factory.container import compilecache
from factory.container.compilecache import MANIFEST, OBJECT
from factory.container.protocol import CACHE_HIT, CACHE_MISS, CACHE_OFF, MEASUREMENT_MARK, parse_measurement
from factory.core import leftovers, safefs, storeurl
from factory.core.errors import ConfigError, FactoryError
from factory.core.home import factory_home
from factory.core.units import parse_size
from factory.publish.index import COMPILE_CACHE_PREFIX
from factory.publish.stores import PreconditionFailed, Store, open_store
from factory.spec.config import MatrixFile
from factory.spec.options import DEFAULT_CACHE_MAX
from factory.trust import cachekeys
from factory.trust.cachekeys import Keyring, signed_manifest, verified_entry

LAYOUT = compilecache.LAYOUT_VERSION  # only files under it are synced
MOUNT = "/var/factory-cache"  # where a build container sees its domain of the local cache (read-only)
OUT_MOUNT = "/var/factory-cache-out"  # where it writes what it compiles (its job's outbox)
ENV_DIR = compilecache.CACHE_DIR_ENV
ENV_OUT = compilecache.CACHE_OUT_ENV
ENV_CHECK_HITS = compilecache.CACHE_CHECK_ENV
DEFAULT_MAX_BYTES = DEFAULT_CACHE_MAX
PUSH_INTERVAL_S = 2.0  # while a job runs, its new entries go up at most this long after they are made
OCTETS = "application/octet-stream"
IMMUTABLE = "public, max-age=31536000, immutable"
# what one file from an outbox or a store may be: a flash-attn object is tens of MiB, a manifest of 6000
# headers under 1 MiB
MAX_OBJECT_BYTES = 4 << 30
MAX_MANIFEST_BYTES = 64 << 20
OUTBOX_UID = 10001  # the build containers' user (jobrun.CONTAINER_USER)

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
    check_hits: int = 0  # hits per job compiled again and compared (`build --check-cache`)


def under(to: str, prefix: str = COMPILE_CACHE_PREFIX) -> str:
    """The cache store under a publish destination: s3://b/p -> s3://b/p/_cache/compile; a directory alike."""
    return storeurl.join(to, prefix)


MAX_CHECK_HITS = 100_000


def resolve(
    mf: MatrixFile,
    *,
    publishing: bool,
    override: str | None = None,
    home: Path | None = None,
    check_hits: int = 0,
) -> CacheConfig | None:
    """The run's cache from `build.cache` (or `--cache`, which wins): None when off; a store given by URL or
    directory; else, publishing, one under the publish store; else the local directory alone. `check_hits`:
    hits per job to compile again and compare (`--check-cache`)."""
    if not 0 <= check_hits <= MAX_CHECK_HITS:
        raise ConfigError(f"--check-cache {check_hits}: must be from 0 to {MAX_CHECK_HITS}")
    setting: bool | str = mf.build.cache
    if override is not None:
        setting = False if override == "off" else override
        if setting:
            storeurl.parse(str(setting), what="--cache")
    if setting is False:
        return None
    endpoint = mf.publish.endpoint_url
    if isinstance(setting, str):
        store: str | None = setting
        endpoint = endpoint if storeurl.parse(setting, what="build.cache").is_s3 else None
    elif publishing:
        store = under(mf.publish.to)
    else:
        store, endpoint = None, None
    return CacheConfig(
        local=local_dir(home),
        store=store,
        endpoint_url=endpoint,
        max_bytes=mf.build.cache_max,
        check_hits=check_hits,
    )


# --- trust: domains, keys, signatures ------------------------------------------------------------------


def trust_domain(code_id: str) -> str:
    """The directory of the cache a build may read and add to: one per code that builds (`PreparedSource`'s
    code_id). Entries a container made are used only by builds that run the same code."""
    return hashlib.sha256(b"factory-cache-domain\0" + code_id.encode()).hexdigest()


def writes_store(config: CacheConfig, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether other hosts can use what this one compiles: no store (nothing to share), or the store's
    private key (`cachekeys`: a trusted writer) rather than this home's own."""
    return config.store is None or cachekeys.writes_store(environ)


# --- where things are: the local directory and the store's keys --------------------------------------------


def domain_dir(local: Path, domain: str) -> Path:
    return local / LAYOUT / domain


def store_key(domain: str, relative: str | PurePosixPath) -> str:
    """The one key for a domain's file, in the store and (as a path) under the local cache."""
    return f"{LAYOUT}/{domain}/{PurePosixPath(relative).as_posix()}"


def parse_store_key(key: str) -> tuple[str, PurePosixPath, tuple[str, ...]] | None:
    """(domain, path in it, what it names) of a committed object or manifest's key; None for anything else:
    another layout, a temporary, an outbox's marks, a path that could leave the root."""
    parts = PurePosixPath(key).parts
    if len(parts) < 3 or parts[0] != LAYOUT or not compilecache.is_key(parts[1]) or "\\" in key:
        return None
    relative = PurePosixPath(*parts[2:])
    named = compilecache.classify(relative)
    if named is None or named[0] not in (OBJECT, MANIFEST):
        return None
    return parts[1], relative, named


def local_files(root: Path) -> set[str]:
    """The committed files of a local cache, as store keys: regular files of the grammar, no link followed."""
    found = (f"{LAYOUT}/{f.relative.as_posix()}" for f in safefs.walk(root / LAYOUT))
    return {k for k in found if parse_store_key(k) is not None}


def ensure_local(root: Path) -> None:
    """The directory exists, is the host's alone and readable by the build containers' user."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)


# --- importing what a build compiled ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ImportResult:
    objects: int = 0
    entries: int = 0
    hits: int = 0
    refused: int = 0


OUTBOXES = "outbox"  # beside the local cache: `<run>-<job>/`, each with its owner in `<run>-<job>.owner`
OWNER_SUFFIX = ".owner"


def outbox_dir(local: Path, *, run_id: str, job_id: str) -> Path:
    return local.parent / OUTBOXES / f"{run_id}-{job_id}"


def make_outbox(path: Path) -> Path:
    """A job's outbox: a fresh directory only the build containers' user can write (and the host), its owner
    (this process) recorded beside it where no container writes, so a dead run's is removed
    (`remove_stale_outboxes`)."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_name(path.name + OWNER_SUFFIX).write_text(leftovers.owner_json())
    path.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(path, OUTBOX_UID, OUTBOX_UID)
    else:  # a rootless host: the container's user maps elsewhere
        path.chmod(0o777)
    return path


def remove_stale_outboxes(local: Path) -> list[Path]:
    """Remove the outboxes that runs now gone left (a killed factory's: what they hold was never imported,
    and never will be); the removed ones. A live run's are kept, however old."""
    removed: list[Path] = []
    root = local.parent / OUTBOXES
    now = time.time()
    for item in safefs.walk(root, max_depth=0):
        if not item.relative.name.endswith(OWNER_SUFFIX):
            continue
        box = root / item.relative.name[: -len(OWNER_SUFFIX)]
        try:
            owner = leftovers.parse_owner(
                safefs.read_bytes(root, item.relative, max_bytes=leftovers.OWNER_MAX_BYTES).decode()
            )
        except (OSError, UnicodeDecodeError):
            owner = None
        if leftovers.is_stale_output_dir(owner, age_s=now - item.mtime):
            shutil.rmtree(box, ignore_errors=True)  # never follows a link (fd-based on Linux)
            safefs.unlink(root, item.relative)
            removed.append(box)
    return removed


def import_outbox(outbox: Path, dest: Path, *, domain: str, keyring: Keyring) -> ImportResult:
    """Take what a build left in its outbox into its domain's directory of the local cache: objects whose
    content has the sha256 they are named by, manifests that parse, name themselves and whose object is
    here (signed on the way in), and hit marks (their entries marked used). Every file is removed from the
    outbox once read; anything else there is left for the outbox's removal. Never follows a link, never
    reads anything but a regular file, never more than the bounds."""
    objects = entries = hits = refused = 0
    found: dict[str, list[tuple[PurePosixPath, tuple[str, ...], int]]] = {"o": [], "m": [], "h": []}
    for item in safefs.walk(outbox):
        named = compilecache.classify(item.relative)
        if named is not None:
            found[named[0]].append((item.relative, named, item.size))
    for relative, (_, sha), size in found[OBJECT]:
        # one of another size is a truncated copy: the build that just made it anew replaces it
        if _size_of(dest, relative) != size:
            try:
                safefs.copy_out(
                    outbox, relative, dest, relative, max_bytes=MAX_OBJECT_BYTES, expect_sha256=sha
                )
                objects += 1
            except OSError:
                refused += 1
        safefs.unlink(outbox, relative)
    for relative, (_, dk, rk), _ in found[MANIFEST]:
        try:
            data = safefs.read_bytes(outbox, relative, max_bytes=MAX_MANIFEST_BYTES)
        except OSError:
            refused += 1
            safefs.unlink(outbox, relative)
            continue
        entry = compilecache.parse_manifest(data)
        if entry is None or entry.direct_key != dk or entry.result_key != rk:
            refused += 1
        elif not _has_object(dest, entry):
            refused += 1  # its object was refused, or never written
        elif not safefs.exists(dest, relative):
            safefs.write_bytes(dest, relative, signed_manifest(entry, domain=domain, keyring=keyring))
            entries += 1
        safefs.unlink(outbox, relative)
    for relative, (_, dk, rk), _ in found[compilecache.HIT]:
        manifest = compilecache.manifest_relative(dk, rk)
        entry = _local_entry(dest, manifest, domain=domain, keyring=keyring)
        if entry is not None:
            safefs.touch(dest, manifest)
            safefs.touch(dest, compilecache.object_relative(entry.object_sha256))
            hits += 1
        safefs.unlink(outbox, relative)
    return ImportResult(objects=objects, entries=entries, hits=hits, refused=refused)


def _has_object(dest: Path, entry: compilecache.Entry) -> bool:
    return _size_of(dest, compilecache.object_relative(entry.object_sha256)) == entry.object_size


def _size_of(root: Path, relative: PurePosixPath) -> int | None:
    """The size of a regular file under root; None for none."""
    try:
        with safefs.open_regular(root, relative) as fd:
            return os.fstat(fd).st_size
    except OSError:
        return None


def _local_entry(
    dest: Path, manifest: PurePosixPath, *, domain: str, keyring: Keyring
) -> compilecache.Entry | None:
    try:
        data = safefs.read_bytes(dest, manifest, max_bytes=MAX_MANIFEST_BYTES)
    except OSError:
        return None
    return verified_entry(data, domain=domain, keyring=keyring)


def verify_domain(
    dest: Path, *, domain: str, keyring: Keyring, known: set[tuple[str, int, int]] | None = None
) -> int:
    """Remove every manifest of a domain's directory that no trusted key signed for it (how many): what a
    build container reads there is what the host vouched for. `known`: manifests already checked, by path,
    inode and size, so a run checks each once."""
    removed = 0
    for item in safefs.walk(dest / MANIFEST):
        relative = PurePosixPath(MANIFEST) / item.relative
        memo = (relative.as_posix(), item.inode, item.size)
        if known is not None and memo in known:
            continue
        named = compilecache.classify(relative)
        entry = _local_entry(dest, relative, domain=domain, keyring=keyring) if named else None
        if entry is None or named is None or (entry.direct_key, entry.result_key) != named[1:]:
            safefs.unlink(dest, relative)
            removed += 1
        elif known is not None:
            known.add(memo)
    return removed


# --- sync ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SyncResult:
    files: int = 0
    bytes: int = 0
    failed: int = 0


def remote_files(store: Store, domain: str | None = None) -> set[str]:
    prefix = f"{LAYOUT}/{domain}/" if domain else f"{LAYOUT}/"
    return {k for k in store.keys(prefix) if parse_store_key(k) is not None}


def _fetch_manifest(store: Store, key: str, *, keyring: Keyring) -> tuple[compilecache.Entry, bytes] | None:
    """A manifest of the store, read whole (bounded) and kept only when a key of the store signed it for its
    domain under its own name; None otherwise (gone, short, too long, unsigned, another key's or domain's)."""
    parsed = parse_store_key(key)
    if parsed is None or parsed[2][0] != MANIFEST:
        return None
    domain, _, named = parsed
    opened = store.open(key)
    if opened is None:
        return None
    stream, size = opened
    with contextlib.closing(stream):
        if size > MAX_MANIFEST_BYTES:
            return None
        data = b"".join(_bounded(iter(lambda: stream.read(1 << 20), b""), MAX_MANIFEST_BYTES))
    entry = verified_entry(data, domain=domain, keyring=keyring, from_store=True)
    if entry is None or (entry.direct_key, entry.result_key) != named[1:] or len(data) != size:
        return None
    return entry, data


def _fetch_object(store: Store, root: Path, key: str, entry: compilecache.Entry) -> int:
    """The object a verified manifest names, whole and of the sha256 and size it names, or nothing (0)."""
    if entry.object_size > MAX_OBJECT_BYTES or safefs.exists(root, key):
        return 0  # one here of another size is a truncated copy: a build that makes it anew replaces it
    opened = store.open(key)
    if opened is None:
        return 0
    stream, size = opened
    with contextlib.closing(stream):
        if size != entry.object_size:
            return 0
        chunks = iter(lambda: stream.read(1 << 20), b"")
        safefs.write_stream(
            root, key, chunks, max_bytes=size, expect_sha256=entry.object_sha256, expect_size=size
        )
    return size


def _bounded(chunks: Iterable[bytes], limit: int) -> Iterable[bytes]:
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > limit:
            raise safefs.UnsafePath(f"over {limit} bytes")
        yield chunk


def pull(
    store: Store,
    root: Path,
    *,
    keyring: Keyring,
    remote: set[str] | None = None,
    max_bytes: int | None = None,
) -> SyncResult:
    """Download the entries the store has (`remote`, else its listing) and `root` lacks, up to `max_bytes`
    (more would only be pruned again): each manifest a key of the store signed, then the object it names
    when it is not here, then the manifest. Nothing else: an object no verified manifest names is never
    fetched. An entry that fails a check counts as failed and nothing of it is kept."""
    ensure_local(root)
    remote = remote_files(store) if remote is None else remote
    files = size = failed = 0
    for key in sorted(k for k in remote - local_files(root) if _is_manifest(k)):
        if max_bytes is not None and size >= max_bytes:
            break
        try:
            got = _fetch_manifest(store, key, keyring=keyring)
            if got is None:
                failed += 1
                continue
            entry, data = got
            domain = key.split("/")[1]
            if not _has_object(domain_dir(root, domain), entry):
                if max_bytes is not None and size + entry.object_size + len(data) > max_bytes:
                    break
                obj = store_key(domain, compilecache.object_relative(entry.object_sha256))
                fetched = _fetch_object(store, root, obj, entry)
                if not fetched:
                    failed += 1
                    continue
                files, size = files + 1, size + fetched
            if not safefs.exists(root, key):
                safefs.write_bytes(root, key, data)
                files, size = files + 1, size + len(data)
        except (FactoryError, OSError):
            failed += 1
    return SyncResult(files=files, bytes=size, failed=failed)


def _is_manifest(key: str) -> bool:
    parsed = parse_store_key(key)
    return parsed is not None and parsed[2][0] == MANIFEST


def push(
    store: Store,
    root: Path,
    *,
    keyring: Keyring,
    remote: set[str],
    domains: Iterable[str] | None = None,
) -> SyncResult:
    """Upload the entries of `root` (of `domains`, when given) that `remote` (what the store is known to
    have) lacks, each object before its manifest: only manifests a key of the store signed for their domain
    (never what an untrusted build signed with its home's own key) and the objects they name, nothing else.
    Each file uploaded is added to `remote`; one another writer put first is left as it is (same name, same
    content)."""
    files = size = failed = 0
    wanted = None if domains is None else set(domains)
    for key in sorted(local_files(root) - remote):
        parsed = parse_store_key(key)
        if parsed is None or parsed[2][0] != MANIFEST or (wanted is not None and parsed[0] not in wanted):
            continue
        domain, relative, _ = parsed
        try:
            data = safefs.read_bytes(domain_dir(root, domain), relative, max_bytes=MAX_MANIFEST_BYTES)
        except OSError:
            continue  # pruned meanwhile
        entry = verified_entry(data, domain=domain, keyring=keyring, from_store=True)
        if entry is None:
            continue
        obj = store_key(domain, compilecache.object_relative(entry.object_sha256))
        for name, body in ((obj, root / obj), (key, data)):
            if name in remote:
                continue
            try:
                sent = len(body) if isinstance(body, bytes) else body.stat().st_size
                store.put(name, body, content_type=OCTETS, cache_control=IMMUTABLE, if_none_match=True)
                files, size = files + 1, size + sent
            except PreconditionFailed:
                pass
            except (FactoryError, OSError):  # the object pruned meanwhile, or the store refused it
                failed += 1
                break  # never a manifest without its object
            remote.add(name)
    return SyncResult(files=files, bytes=size, failed=failed)


@dataclass(kw_only=True)
class JobCache:
    """One job's view of the cache: its domain's directory (mounted read-only) and its outbox."""

    domain: str
    dest: Path
    outbox: Path
    refused: int = 0

    def mounts(self) -> dict[str, dict[str, str]]:
        return {
            str(self.dest): {"bind": MOUNT, "mode": "ro"},
            str(self.outbox): {"bind": OUT_MOUNT, "mode": "rw"},
        }


class CacheSync:
    """One run's cache: each job's domain of the local directory mounted read-only and its outbox imported
    while it runs and after; with a store, the domain's files pulled before each job and pushed while it
    runs (nudged by its measured compiles) and after it.

    Thread-safe: jobs of one run call it from their threads. A store that cannot be reached is said once
    and costs only the head start; the build goes on with the local cache."""

    def __init__(
        self, config: CacheConfig, *, log: Log = lambda _m: None, keyring: Keyring | None = None
    ) -> None:
        self.config = config
        self.local = config.local
        self.log = log
        self.keyring = keyring or cachekeys.load_keyring(config.local.parent)
        self._lock = threading.Lock()
        self._store: Store | None = None
        self._remote: set[str] = set()  # what the store is known to have of the domains listed
        self._listed: set[str] = set()
        self._domains: set[str] = set()  # of this run's jobs: the only ones synced
        self._fetched: set[str] = set()
        self._verified: set[tuple[str, int, int]] = set()
        self._jobs: dict[str, JobCache] = {}
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
            if not self.keyring.store_keys():
                self._broken = True  # said once, as a store that fails is
                self.log(
                    f"compile cache store {self.config.store} not used: no key to verify its entries with "
                    f"(${cachekeys.PUBLIC_KEYS_ENV}, or ${cachekeys.SIGN_KEY_ENV} to write it); this host's "
                    "compiles stay in its local cache"
                )
                return None
            if not self.keyring.writes_store:
                self.log(
                    f"compile cache store {self.config.store}: read only (no ${cachekeys.SIGN_KEY_ENV}): "
                    "the entries its keys signed are used, this host's compiles stay in its local cache"
                )
            try:
                self._store = open_store(self.config.store, endpoint_url=self.config.endpoint_url)
            except (FactoryError, OSError) as exc:
                self._fail("opened", exc)
                return None
        return self._store

    def _fail(self, what: str, exc: Exception) -> None:
        self._broken = True
        self.log(f"compile cache store not {what}: {exc}; building with the local cache only")

    def open_job(self, job_id: str, *, domain: str, run_id: str) -> JobCache:
        """A job's cache: its domain's directory, with only entries the host vouches for in it (anything
        else removed), and a fresh outbox."""
        dest = domain_dir(self.local, domain)
        outbox = outbox_dir(self.local, run_id=run_id, job_id=job_id)
        with safefs.open_dir(self.local, PurePosixPath(LAYOUT, domain), create=True):
            pass
        job = JobCache(domain=domain, dest=dest, outbox=make_outbox(outbox))
        with self._lock:
            verify_domain(dest, domain=domain, keyring=self.keyring, known=self._verified)
            self._jobs[job_id] = job
            self._domains.add(domain)
        return job

    def before_job(self, job_id: str, domain: str) -> None:
        """Bring down what the store has of the job's domain that the local cache lacks."""
        with self._lock:
            self._domains.add(domain)
            store = self._open()
            if store is None:
                return
            try:
                remote = remote_files(store, domain)
                self._remote |= remote
                self._listed.add(domain)
                # each file once a run: one pruned to keep the bound is not fetched again for the next job
                wanted = remote - self._fetched
                got = pull(
                    store, self.local, keyring=self.keyring, remote=wanted, max_bytes=self.config.max_bytes
                )
            except (FactoryError, OSError) as exc:
                self._fail("read", exc)
                return
            self._fetched |= wanted
        if got.files:
            self.log(f"{job_id}: compile cache: {got.files} file(s) fetched from {self.config.store}")
        if got.failed:
            self.log(f"{job_id}: compile cache: {got.failed} file(s) of the store not taken (unverifiable)")

    def import_all(self) -> ImportResult:
        """Take in what every running job's build has compiled so far."""
        total = ImportResult()
        with self._lock:
            for job in self._jobs.values():
                got = self._import(job)
                total = ImportResult(
                    objects=total.objects + got.objects, entries=total.entries + got.entries,
                    hits=total.hits + got.hits, refused=total.refused + got.refused,
                )  # fmt: skip
        return total

    def _import(self, job: JobCache) -> ImportResult:
        try:
            got = import_outbox(job.outbox, job.dest, domain=job.domain, keyring=self.keyring)
        except OSError as exc:
            self.log(f"compile cache: the outbox {job.outbox} not imported: {exc}")
            return ImportResult()
        job.refused += got.refused
        return got

    def upload(self) -> SyncResult:
        """Send up what the store lacks of this run's domains (what this host compiled since the last
        upload); nothing unless this host holds the store's private key."""
        if not self.keyring.writes_store:
            return SyncResult()
        with self._lock:
            store = self._open()
            if store is None or not self._domains:
                return SyncResult()
            try:
                for domain in self._domains - self._listed:
                    self._remote |= remote_files(store, domain)
                    self._listed.add(domain)
                return push(
                    store, self.local, keyring=self.keyring, remote=self._remote, domains=self._domains
                )
            except (FactoryError, OSError) as exc:
                self._fail("written", exc)
                return SyncResult()

    def after_job(self, job_id: str) -> None:
        """Import what the job made (whatever its end, also after a failure or a kill), upload it, remove the
        outbox, then bound the local cache."""
        with self._lock:
            job = self._jobs.pop(job_id, None)
            if job is not None:
                self._import(job)
                shutil.rmtree(job.outbox, ignore_errors=True)  # never follows a link (fd-based on Linux)
                job.outbox.with_name(job.outbox.name + OWNER_SUFFIX).unlink(missing_ok=True)
        if job is not None and job.refused:
            self.log(f"{job_id}: compile cache: {job.refused} file(s) of the build's outbox refused")
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

    def suspect(self, job_id: str, entry: str, source: str | None) -> None:
        """A hit compiled again gave other bytes: the entry is removed here and named in the log, as a
        suspected poisoned entry (or a compile that is not deterministic)."""
        dk, _, rk = entry.partition(compilecache.HIT_SEPARATOR)
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None or not (compilecache.is_key(dk) and compilecache.is_key(rk)):
            return
        safefs.unlink(job.dest, compilecache.manifest_relative(dk, rk))
        self.log(
            f"{job_id}: compile cache: {source or 'a compile'} compiled again differs from entry {dk[:12]}/"
            f"{rk[:12]}: suspected poisoned entry (or a compile that is not deterministic); entry removed"
        )

    def nudge(self) -> None:
        """A compile finished: import (and upload) soon, so other jobs find it and a killed run has already
        shipped it."""
        self._wake.set()

    # -- the importer and uploader while jobs run -----------------------------------------------------
    def __enter__(self) -> CacheSync:
        self._thread = threading.Thread(target=self._worker, name="cache-sync", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()

    def _worker(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            if self._stop.is_set():
                return
            self._wake.clear()
            self.import_all()
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


@dataclass(frozen=True, kw_only=True)
class CacheStats:
    entries: int  # manifests
    objects: int
    bytes: int  # of every committed file, manifests and objects
    oldest: float | None  # mtime of the least recently used manifest
    newest: float | None


@dataclass(frozen=True, kw_only=True)
class PruneResult:
    removed_entries: int
    removed_bytes: int
    kept_bytes: int


@dataclass(kw_only=True)
class _Files:
    # by domain: (path in the domain's directory, what lstat said)
    manifests: dict[str, list[tuple[PurePosixPath, safefs.Found]]] = field(default_factory=dict)
    objects: dict[tuple[str, str], safefs.Found] = field(default_factory=dict)  # (domain, sha256)
    other: list[safefs.Found] = field(default_factory=list)  # relative to the layout's directory


def _inventory(root: Path) -> _Files:
    files = _Files()
    for item in safefs.walk(root / LAYOUT):
        parsed = parse_store_key(f"{LAYOUT}/{item.relative.as_posix()}")
        if parsed is None:
            files.other.append(item)
        elif parsed[2][0] == OBJECT:
            files.objects[(parsed[0], parsed[2][1])] = item
        else:
            files.manifests.setdefault(parsed[0], []).append((parsed[1], item))
    return files


def stats(root: Path | None = None) -> CacheStats:
    root = root or local_dir()
    files = _inventory(root)
    manifests = [m for found in files.manifests.values() for _, m in found]
    times = [m.mtime for m in manifests]
    return CacheStats(
        entries=len(manifests),
        objects=len(files.objects),
        bytes=sum(f.size for f in manifests) + sum(f.size for f in files.objects.values()),
        oldest=min(times, default=None),
        newest=max(times, default=None),
    )


def prune(max_bytes: int, root: Path | None = None, *, now: float | None = None) -> PruneResult:
    """Bring the local cache under max_bytes, least recently used entries (manifest, and its object when no
    other manifest names it) first. Whatever is not of the cache's grammar goes whatever the size (an earlier
    layout, a stray file), and so do manifests whose object is gone, objects no manifest names and writers'
    temporaries, once older than TEMP_GRACE_S (a writer may be at work)."""
    root = root or local_dir()
    now = time.time() if now is None else now
    grace = compilecache.TEMP_GRACE_S
    removed_entries = removed_bytes = 0
    for entry in sorted(os.listdir(root)) if root.is_dir() else []:
        if entry != LAYOUT:  # an earlier layout's tree, never followed if a link
            removed_bytes += _remove_tree(root / entry)
    files = _inventory(root)
    for other in files.other:
        if not compilecache.is_temp(other.relative.name) or now - other.mtime > grace:
            safefs.unlink(root / LAYOUT, other.relative)
    entries: list[tuple[float, str, PurePosixPath, int, str]] = []
    users: dict[tuple[str, str], int] = {}
    for domain, manifests in files.manifests.items():
        for relative, item in manifests:
            dest = domain_dir(root, domain)
            sha = _object_named(dest, relative)
            obj = files.objects.get((domain, sha)) if sha else None
            if obj is None or sha is None:
                if now - item.mtime > grace:
                    safefs.unlink(dest, relative)
                    removed_entries, removed_bytes = removed_entries + 1, removed_bytes + item.size
                continue
            users[(domain, sha)] = users.get((domain, sha), 0) + 1
            entries.append((max(item.mtime, obj.mtime), domain, relative, item.size, sha))
    for (domain, sha), obj in files.objects.items():
        if (domain, sha) not in users and now - obj.mtime > grace:
            safefs.unlink(domain_dir(root, domain), compilecache.object_relative(sha))
            removed_bytes += obj.size
    kept = {k: v for k, v in files.objects.items() if k in users}
    total = sum(e[3] for e in entries) + sum(o.size for o in kept.values())
    for _, domain, relative, size, sha in sorted(entries):
        if total <= max_bytes:
            break
        dest = domain_dir(root, domain)
        safefs.unlink(dest, relative)  # the manifest first: an object without its manifest is never read
        removed_entries, removed_bytes, total = removed_entries + 1, removed_bytes + size, total - size
        users[(domain, sha)] -= 1
        if users[(domain, sha)] == 0:
            obj = kept[(domain, sha)]
            safefs.unlink(dest, compilecache.object_relative(sha))
            removed_bytes, total = removed_bytes + obj.size, total - obj.size
        with contextlib.suppress(OSError):
            (dest / relative).parent.rmdir()  # its direct key's last manifest
    return PruneResult(removed_entries=removed_entries, removed_bytes=removed_bytes, kept_bytes=total)


def _object_named(dest: Path, manifest: PurePosixPath) -> str | None:
    try:
        entry = compilecache.parse_manifest(safefs.read_bytes(dest, manifest, max_bytes=MAX_MANIFEST_BYTES))
    except OSError:
        return None
    return entry.object_sha256 if entry is not None else None


def _remove_tree(path: Path) -> int:
    """Remove a file, a link (not what it points to) or a whole directory; the bytes of regular files gone."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        path.unlink()
        return st.st_size if stat.S_ISREG(st.st_mode) else 0
    size = sum(f.size for f in safefs.walk(path))
    shutil.rmtree(path, ignore_errors=True)  # fd-based on Linux: never follows a link
    return size
