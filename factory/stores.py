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
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol
from urllib.parse import urlsplit

from factory.errors import ConfigError, PublishError
from factory.urls import HTTP_SCHEMES, checked_url, without_credentials


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


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check_key(key: str) -> None:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in {"..", "."} for p in parts):
        raise ValueError(f"bad store key {key!r}")


class LocalStore:
    """An index in a local directory; etags are the sha256 of the content."""

    wants_directory_keys = False

    def __init__(self, root: Path) -> None:
        self.root = root
        self.description = str(root)

    def _path(self, key: str) -> Path:
        _check_key(key)
        if key.endswith("/"):
            key += "index.html"
        return self.root / key

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

    def get(self, key: str) -> Blob | None:
        try:
            data = self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        return Blob(data=data, etag=hashlib.sha256(data).hexdigest())

    def head(self, key: str) -> Head | None:
        path = self._path(key)
        if not path.is_file():
            return None
        digest = _sha256_file(path)
        return Head(size=path.stat().st_size, etag=digest, sha256=digest)

    def sha256_of(self, key: str) -> str | None:
        path = self._path(key)
        return _sha256_file(path) if path.is_file() else None

    def open(self, key: str) -> tuple[IO[bytes], int] | None:
        path = self._path(key)
        if not path.is_file():
            return None
        return path.open("rb"), path.stat().st_size

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
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write the new content aside first so the lock is held only for check-and-rename.
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as fh:
                if isinstance(data, Path):
                    with data.open("rb") as src:
                        shutil.copyfileobj(src, fh, 1 << 20)
                else:
                    fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o644)
            etag = _sha256_file(tmp)
            with self.lock():
                if if_none_match and path.exists():
                    raise PreconditionFailed(key)
                if if_match is not None:
                    current = _sha256_file(path) if path.is_file() else None
                    if current != if_match:
                        raise PreconditionFailed(key)
                os.replace(tmp, path)
            return etag
        finally:
            tmp.unlink(missing_ok=True)


class S3Store:
    """An index under s3://bucket/prefix via boto3 (any S3-compatible endpoint, standard credential chain)."""

    wants_directory_keys = True

    def __init__(
        self, bucket: str, prefix: str, *, endpoint_url: str | None = None, client: Any = None
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.description = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        if client is None:
            import boto3
            from botocore.config import Config

            if endpoint_url is not None:
                check_endpoint_url(endpoint_url)
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
            raise PublishError(f"{what} {self.description}: {code or exc}") from None
        except BotoCoreError as exc:
            # The message names the endpoint or the missing credentials, never their values.
            raise PublishError(f"{what} {self.description}: {exc}") from None

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


def parse_s3_url(url: str) -> tuple[str, str]:
    """ "s3://bucket/some/prefix" -> ("bucket", "some/prefix")."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise ConfigError(f"{url!r} is not an s3://bucket/prefix URL")
    return parts.netloc, parts.path.strip("/")


def check_endpoint_url(url: str, *, what: str = "endpoint URL") -> None:
    """An S3 endpoint botocore will take: an http(s) URL whose host it accepts; else a ConfigError naming
    `what` and the URL without its credentials."""
    from botocore.utils import is_valid_endpoint_url, is_valid_ipv6_endpoint_url

    checked_url(url, schemes=HTTP_SCHEMES, what=what)
    if not (is_valid_endpoint_url(url) or is_valid_ipv6_endpoint_url(url)):
        raise ConfigError(f"{what} {without_credentials(url)}: Invalid endpoint (not a host name or address)")


def check_destination(to: str, *, what: str = "--to") -> None:
    """Where an index may go, by its spelling alone: s3://bucket/prefix or a directory, no other URL."""
    if to.startswith("s3://"):
        try:
            parse_s3_url(to)
        except ConfigError as exc:
            raise ConfigError(f"{what} {exc}") from None
    elif "://" in to:
        raise ConfigError(f"{what} {to!r}: use a directory or s3://bucket/prefix")


def open_store(to: str, *, endpoint_url: str | None = None) -> Store:
    """A store for "--to": s3://bucket/prefix, or a local directory (created on first write)."""
    check_destination(to)
    if to.startswith("s3://"):
        bucket, prefix = parse_s3_url(to)
        return S3Store(bucket, prefix, endpoint_url=endpoint_url)
    if endpoint_url:
        raise ConfigError("--endpoint-url only applies to an s3:// destination")
    path = Path(to).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--to {to}: exists and is not a directory")
    return LocalStore(path.resolve())
