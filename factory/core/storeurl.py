"""A store's URL: the one owner of how a store (an index, a compile cache) is spelled, by its spelling alone:
`s3://bucket/prefix` or a directory, no other URL (`parse`). A new kind of store is a new spelling here, a
`StoreURL.kind`, and its class in `factory.publish.stores`; no other module tests a URL's scheme for a store
(a test keeps it so).

Here in `core`, not in `publish.stores`, because the matrix file's checks (`spec.config`) and the build record
(`wheel.record`) need the spelling too, and they sit below `publish`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from factory.core.errors import ConfigError
from factory.core.urls import HTTP_SCHEMES, checked_url, without_credentials

S3 = "s3"  # the scheme, and the kind of store it names
DIRECTORY = "directory"
_S3_PREFIX = f"{S3}://"


@dataclass(frozen=True)
class StoreURL:
    """A store's location as `parse` read it: an S3 bucket and key prefix, or a local directory."""

    spelling: str  # as given (a directory is resolved where it is opened)
    bucket: str | None = None  # an S3 store's bucket; None for a directory
    prefix: str = ""  # an S3 store's key prefix, no slash at either end

    @property
    def is_s3(self) -> bool:
        return self.bucket is not None

    @property
    def kind(self) -> str:
        """The kind of store, as a build record names it (never its path or URL)."""
        return S3 if self.is_s3 else DIRECTORY


def s3_url(bucket: str, prefix: str = "") -> str:
    """The URL of an S3 store: s3://bucket or s3://bucket/prefix."""
    return f"{_S3_PREFIX}{bucket}/{prefix}" if prefix else f"{_S3_PREFIX}{bucket}"


def join(to: str, name: str) -> str:
    """The store `name` (a relative key prefix) under the store `to`: s3://b/p -> s3://b/p/name; a
    directory alike (`to` as `parse` takes it)."""
    url = parse(to)
    if url.bucket is not None:
        return s3_url(url.bucket, f"{url.prefix}/{name}" if url.prefix else name)
    return str(Path(to).expanduser() / name)


_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_BUCKET_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BUCKET_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def bucket_problem(bucket: str) -> str | None:
    """Why `bucket` is not a valid S3 bucket name (AWS's general-purpose bucket naming rules), or None."""
    if not 3 <= len(bucket) <= 63:
        return "a bucket name is 3 to 63 characters long"
    if not _BUCKET.fullmatch(bucket):
        return (
            "a bucket name has only lower-case letters, digits, dots and hyphens, "
            "and begins and ends with a letter or digit"
        )
    if ".." in bucket:
        return "a bucket name has no two dots in a row"
    with contextlib.suppress(ValueError):
        ipaddress.IPv4Address(bucket)
        return "a bucket name is not an IP address"
    if bucket.startswith(_BUCKET_RESERVED_PREFIXES) or bucket.endswith(_BUCKET_RESERVED_SUFFIXES):
        return "that bucket name prefix or suffix is reserved by S3"
    return None


def parse_s3(url: str) -> tuple[str, str]:
    """ "s3://bucket/some/prefix" -> ("bucket", "some/prefix"); ConfigError for a bucket S3 would refuse
    and for a prefix whose keys would leave it ("..", "." or empty segments)."""
    shown_url = without_credentials(url)
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigError(f"{shown_url}: not an s3://bucket/prefix URL ({exc})") from None
    if parts.scheme != S3 or not parts.netloc:
        raise ConfigError(f"{shown_url}: not an s3://bucket/prefix URL")
    if "@" in parts.netloc:
        raise ConfigError(
            f"{shown_url}: an s3:// URL carries no credentials (boto3 takes them from the AWS chain)"
        )
    problem = bucket_problem(parts.netloc)
    if problem is not None:
        raise ConfigError(f"{shown_url}: bucket {parts.netloc!r}: {problem}")
    prefix = parts.path.strip("/")
    if prefix:
        bad = next((seg for seg in prefix.split("/") if seg in {"", ".", ".."}), None)
        if bad is not None:
            raise ConfigError(
                f"{shown_url}: the prefix {prefix!r} has an empty, '.' or '..' segment "
                f"({bad!r}); give a plain path like s3://{parts.netloc}/team/index"
            )
        if any(ord(c) < 32 or ord(c) == 127 for c in prefix):
            raise ConfigError(f"{shown_url}: the prefix has control characters")
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise ConfigError(f"{shown_url}: an s3://bucket/prefix URL has no ?query or #fragment")
    return parts.netloc, prefix


def check_endpoint_url(url: str, *, what: str = "endpoint URL") -> None:
    """An S3 endpoint botocore will take: an http(s) URL whose host it accepts; else a ConfigError naming
    `what` and the URL without its credentials."""
    from botocore.utils import is_valid_endpoint_url, is_valid_ipv6_endpoint_url

    checked_url(url, schemes=HTTP_SCHEMES, what=what)
    if not (is_valid_endpoint_url(url) or is_valid_ipv6_endpoint_url(url)):
        raise ConfigError(f"{what} {without_credentials(url)}: Invalid endpoint (not a host name or address)")


def parse(to: str, *, what: str = "--to") -> StoreURL:
    """Where a store is, by its spelling alone: s3://bucket/prefix or a directory, no other URL; a
    ConfigError naming `what` (the option or key that gave it) otherwise."""
    if to.startswith(_S3_PREFIX):
        try:
            bucket, prefix = parse_s3(to)
        except ConfigError as exc:
            raise ConfigError(f"{what} {exc}") from None
        return StoreURL(spelling=to, bucket=bucket, prefix=prefix)
    if "://" in to:
        raise ConfigError(f"{what} {to!r}: use a directory or s3://bucket/prefix")
    if to.lower().startswith(f"{S3}:"):
        # "s3:/bucket" or "s3:bucket" is a slash short of a URL, not a directory named "s3:" to create
        raise ConfigError(f"{what} {to!r}: an S3 index is s3://bucket/prefix (a directory: ./{to})")
    return StoreURL(spelling=to)
