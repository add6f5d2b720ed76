"""Where an index lives: a local directory or an S3 bucket prefix, behind one compare-and-swap interface.

Both stores give the same guarantees publish relies on: a write is all-or-nothing, and a conditional write
(`if_none_match` = "create only", `if_match=etag` = "replace only that version") fails with
PreconditionFailed when another publisher got there first. Locally that is a lock file (fcntl) around
check-then-rename; on S3 the server's own If-None-Match / If-Match conditional PUT.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, Protocol

import psutil

from factory.core import leftovers, safefs, storeurl
from factory.core.errors import ConfigError, PublishError
from factory.core.urls import urls_without_credentials, without_credentials


class PreconditionFailed(Exception):
    """A conditional write lost a race; re-read and retry."""


@dataclass(frozen=True, kw_only=True)
class Blob:
    data: bytes
    etag: str


@dataclass(frozen=True, kw_only=True)
class Head:
    size: int
    etag: str
    sha256: str | None  # recorded at upload time where the store can keep it


class Store(Protocol):
    """Keys are "/"-separated paths relative to the index root."""

    description: str
    # S3 static hosting cannot map "dir/" to "dir/index.html", so pages are stored under both keys there.
    wants_directory_keys: bool

    def get(self, key: str) -> Blob | None: ...

    def head(self, key: str) -> Head | None: ...

    def put(
        self,
        key: str,
        data: bytes | Path,
        *,
        content_type: str,
        cache_control: str,
        if_match: str | None = None,
        if_none_match: bool = False,
        sha256: str | None = None,
    ) -> str: ...

    def open(self, key: str) -> tuple[IO[bytes], int] | None: ...

    def sha256_of(self, key: str) -> str | None: ...

    def keys(self, prefix: str) -> Iterator[str]:
        """Every key under `prefix` (a "dir/" key), in no particular order."""
        ...


_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _sha256_stream(fh: IO[bytes]) -> str:
    digest = hashlib.sha256()
    for chunk in iter(lambda: fh.read(1 << 20), b""):
        digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def _blocks(data: bytes | Path) -> Iterator[Iterable[bytes]]:
    if isinstance(data, bytes):
        yield [data]
        return
    with data.open("rb") as fh:
        yield iter(lambda: fh.read(1 << 20), b"")


def _exists_at(dirfd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _check_key(key: str) -> None:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in {"..", "."} for p in parts):
        raise ValueError(f"bad store key {key!r}")


# put()'s temporaries: ".<name>.<host>.<pid>.<random>.tmp", beside the file they become. Hidden: nothing
# published starts with ".". The writer's host and pid tell a killed publish's leftovers from a live one's.
_TMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<host>[A-Za-z0-9-]*)\.(?P<pid>\d+)\.[A-Za-z0-9_]+\.tmp$")


def tmp_prefix(name: str) -> str:
    """mkstemp's prefix for a temporary that becomes `name`; mkstemp adds the random part."""
    return f".{name}.{leftovers.host_tag()}.{os.getpid()}."


def tmp_writer(tmp_name: str) -> leftovers.Owner | None:
    """The process that writes a temporary, from its name; None for a name not made by tmp_prefix."""
    match = _TMP_NAME.fullmatch(tmp_name)
    if match is None:
        return None
    return leftovers.Owner(pid=int(match["pid"]), host=match["host"])


def is_stale_tmp(
    tmp_name: str,
    *,
    age_s: float,
    host: str | None = None,
    pid_exists: Callable[[int], bool] = psutil.pid_exists,
) -> bool:
    """Whether a temporary was abandoned: its writer on this host is gone (a live one's is kept however long
    it takes), or, when its writer cannot be checked from here, it is older than leftovers.UNOWNED_AGE_S."""
    return leftovers.is_stale_named(tmp_writer(tmp_name), age_s=age_s, host=host, pid_exists=pid_exists)


class LocalStore:
    """An index in a local directory; etags are the sha256 of the content."""

    wants_directory_keys = False

    def __init__(self, root: Path) -> None:
        self.root = root
        self.description = str(root)
        self._swept = False

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Serialises check-and-replace between processes (and hosts sharing a POSIX-locking filesystem)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / ".lock").open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _relative(self, key: str) -> str:
        _check_key(key)
        return f"{key}index.html" if key.endswith("/") else key

    def _open(self, key: str) -> tuple[IO[bytes], int] | None:
        """A stored file, opened without following a link on the way (`safefs`): whoever else can write the
        directory cannot make the factory read a host file through it. None when there is no regular file."""
        relative = self._relative(key)
        try:
            with safefs.open_regular(self.root, relative) as opened:
                dup = os.dup(opened)
        except OSError:
            return None
        return os.fdopen(dup, "rb"), os.fstat(dup).st_size

    def get(self, key: str) -> Blob | None:
        opened = self._open(key)
        if opened is None:
            return None
        with opened[0] as fh:
            data = fh.read()
        return Blob(data=data, etag=hashlib.sha256(data).hexdigest())

    def head(self, key: str) -> Head | None:
        opened = self._open(key)
        if opened is None:
            return None
        with opened[0] as fh:
            digest = _sha256_stream(fh)
        return Head(size=opened[1], etag=digest, sha256=digest)

    def sha256_of(self, key: str) -> str | None:
        opened = self._open(key)
        if opened is None:
            return None
        with opened[0] as fh:
            return _sha256_stream(fh)

    def open(self, key: str) -> tuple[IO[bytes], int] | None:
        return self._open(key)

    def keys(self, prefix: str) -> Iterator[str]:
        _check_key(prefix)
        # regular files only, no link followed: put()'s temporaries are hidden (_TMP_NAME); nothing
        # published starts with "."
        base = PurePosixPath(prefix.rstrip("/")) if prefix.strip("/") else None
        top = self.root / base if base is not None else self.root
        for found in safefs.walk(top):
            if not any(part.startswith(".") for part in found.relative.parts):
                yield (base / found.relative).as_posix() if base is not None else found.relative.as_posix()

    def put(
        self,
        key: str,
        data: bytes | Path,
        *,
        content_type: str,
        cache_control: str,
        if_match: str | None = None,
        if_none_match: bool = False,
        sha256: str | None = None,
    ) -> str:
        # Content type and caching are decided by whoever serves the directory (factory serve), from the name.
        del content_type, cache_control, sha256
        relative = PurePosixPath(self._relative(key))
        if not self._swept:  # a publish killed mid-copy left its temporaries: the next one removes them
            self._swept = True
            self.remove_stale_temporaries()
        self.root.mkdir(parents=True, exist_ok=True)
        # every level made and entered without following a link: nothing lands outside the store
        with safefs.open_dir(self.root, relative.parent, create=True) as dirfd:
            tmp = f"{tmp_prefix(relative.name)}{os.urandom(6).hex()}.tmp"
            fd = os.open(tmp, _NEW_FILE, 0o644, dir_fd=dirfd)
            try:
                # Write the new content aside first so the lock is held only for check-and-rename.
                digest = hashlib.sha256()
                with os.fdopen(fd, "wb") as fh, _blocks(data) as blocks:
                    for block in blocks:
                        digest.update(block)
                        fh.write(block)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.chmod(tmp, 0o644, dir_fd=dirfd)
                with self.lock():
                    if if_none_match and _exists_at(dirfd, relative.name):
                        raise PreconditionFailed(key)
                    if if_match is not None and self.sha256_of(key) != if_match:
                        raise PreconditionFailed(key)
                    os.replace(tmp, relative.name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
                return digest.hexdigest()
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=dirfd)

    def remove_stale_temporaries(self) -> list[Path]:
        """Remove the temporaries of writers now gone (`is_stale_tmp`); the removed ones."""
        removed: list[Path] = []
        now = time.time()
        for tmp in sorted(self.root.rglob(".*.tmp")) if self.root.is_dir() else []:
            try:
                if tmp.is_symlink() or not tmp.is_file():
                    continue
                if is_stale_tmp(tmp.name, age_s=now - tmp.stat().st_mtime):
                    tmp.unlink()
                    removed.append(tmp)
            except OSError:  # gone meanwhile (its writer renamed it), or not ours to remove
                continue
        return removed


class S3Store:
    """An index under s3://bucket/prefix via boto3 (any S3-compatible endpoint, standard credential chain)."""

    wants_directory_keys = True

    def __init__(
        self, bucket: str, prefix: str, *, endpoint_url: str | None = None, client: Any = None
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.description = storeurl.s3_url(bucket, self.prefix)
        if client is None:
            import boto3
            from botocore.config import Config

            if endpoint_url is not None:
                storeurl.check_endpoint_url(endpoint_url)
            try:
                # Path-style addressing works with every S3-compatible server and with plain-HTTP consumers.
                client = boto3.client(
                    "s3",
                    endpoint_url=endpoint_url,
                    config=Config(
                        s3={"addressing_style": "path"}, retries={"max_attempts": 5, "mode": "standard"}
                    ),
                )
            except ValueError as exc:  # botocore's own check of the endpoint (a space in the host)
                raise ConfigError(f"endpoint URL {without_credentials(endpoint_url or '')}: {exc}") from None
        self.client = client

    def _key(self, key: str) -> str:
        if key != "":
            _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    @staticmethod
    def _code(exc: Exception) -> str:
        response = getattr(exc, "response", None) or {}
        return str(response.get("Error", {}).get("Code", ""))

    def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(**kwargs)
        except ClientError as exc:
            code = self._code(exc)
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            # 409 ConditionalRequestConflict: another conditional write to the key is in flight.
            if code in {"PreconditionFailed", "ConditionalRequestConflict"} or status in {409, 412}:
                raise PreconditionFailed(kwargs.get("Key", "")) from None
            if code in {"NoSuchKey", "404", "NotFound"}:
                return None
            raise PublishError(
                f"{what} {self.description}: {code or urls_without_credentials(str(exc))}"
            ) from None
        except BotoCoreError as exc:
            # The message names the endpoint (shown without credentials) or which credentials are missing.
            raise PublishError(f"{what} {self.description}: {urls_without_credentials(str(exc))}") from None

    def get(self, key: str) -> Blob | None:
        resp = self._call("reading", self.client.get_object, Bucket=self.bucket, Key=self._key(key))
        if resp is None:
            return None
        return Blob(data=resp["Body"].read(), etag=resp["ETag"])

    def head(self, key: str) -> Head | None:
        resp = self._call("reading", self.client.head_object, Bucket=self.bucket, Key=self._key(key))
        if resp is None:
            return None
        return Head(
            size=resp["ContentLength"], etag=resp["ETag"], sha256=resp.get("Metadata", {}).get("sha256")
        )

    def sha256_of(self, key: str) -> str | None:
        head = self.head(key)
        if head is None:
            return None
        if head.sha256:
            return head.sha256
        opened = self.open(key)
        if opened is None:
            return None
        stream, _ = opened
        digest = hashlib.sha256()
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
        return digest.hexdigest()

    def open(self, key: str) -> tuple[IO[bytes], int] | None:
        resp = self._call("reading", self.client.get_object, Bucket=self.bucket, Key=self._key(key))
        if resp is None:
            return None
        return resp["Body"], int(resp["ContentLength"])

    def keys(self, prefix: str) -> Iterator[str]:
        _check_key(prefix)
        full = self._key(prefix)
        strip = len(self.prefix) + 1 if self.prefix else 0
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full}
            if token:
                kwargs["ContinuationToken"] = token
            resp = self._call("listing", self.client.list_objects_v2, **kwargs)
            if resp is None:
                return
            for obj in resp.get("Contents", []):
                key = str(obj["Key"])[strip:]
                if not key.endswith("/"):  # the directory keys of pages are pages, not files
                    yield key
            token = resp.get("NextContinuationToken")
            if not resp.get("IsTruncated") or not token:
                return

    def put(
        self,
        key: str,
        data: bytes | Path,
        *,
        content_type: str,
        cache_control: str,
        if_match: str | None = None,
        if_none_match: bool = False,
        sha256: str | None = None,
    ) -> str:
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self._key(key),
            "ContentType": content_type,
            "CacheControl": cache_control,
        }
        if sha256:
            kwargs["Metadata"] = {"sha256": sha256}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        if isinstance(data, Path):
            with data.open("rb") as fh:
                resp = self._call("writing to", self.client.put_object, Body=fh, **kwargs)
        else:
            resp = self._call("writing to", self.client.put_object, Body=data, **kwargs)
        if resp is None:  # If-Match on a key that vanished
            raise PreconditionFailed(key)
        return str(resp["ETag"])


# How often a conditional write is retried against other writers before giving up.
CONFLICT_ATTEMPTS = 200


def backoff(attempt: int) -> None:
    """A random pause, growing with the attempt, so writers that collided do not collide again."""
    time.sleep(random.uniform(0, min(0.5, 0.005 * 2**attempt)))


def compare_and_swap(
    store: Store,
    key: str,
    update: Callable[[bytes | None], bytes | None],
    *,
    content_type: str,
    cache_control: str,
) -> bool:
    """Compare-and-swap `key` through `update(current) -> new | None` (None: nothing to change)."""
    for attempt in range(CONFLICT_ATTEMPTS):
        current = store.get(key)
        new = update(current.data if current else None)
        if new is None:
            return False
        try:
            store.put(
                key,
                new,
                content_type=content_type,
                cache_control=cache_control,
                if_match=current.etag if current else None,
                if_none_match=current is None,
            )
            return True
        except PreconditionFailed:
            backoff(attempt)
    raise PublishError(f"could not update {key} in {store.description}: too many concurrent publishers")


def open_store(to: str, *, endpoint_url: str | None = None, existing: bool = False) -> Store:
    """A store for "--to": s3://bucket/prefix, or a local directory (created here, unless `existing`: an
    index to read or mend must be there already)."""
    url = storeurl.parse(to)
    if url.bucket is not None:
        return S3Store(url.bucket, url.prefix, endpoint_url=endpoint_url)
    if endpoint_url:
        raise ConfigError("--endpoint-url only applies to an s3:// destination")
    path = Path(to).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--to {to}: exists and is not a directory")
    if existing and not path.is_dir():
        raise ConfigError(f"--to {to}: no such index directory")
    # Created now, so a destination that cannot hold an index (/dev/null/x, /proc/self/x, read-only) is
    # a usage error before anything is published, not an OSError halfway through.
    try:
        path.mkdir(parents=True, exist_ok=True)
        root = path.resolve(strict=True)
    except OSError as exc:
        raise ConfigError(f"--to {to}: cannot create the index directory ({exc.strerror})") from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise ConfigError(f"--to {to}: the index directory is not writable")
    return LocalStore(root)
