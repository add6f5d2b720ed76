"""URLs a user gives on the command line (an index, an S3 endpoint): checked in one place, so a bad one is a
one-line ConfigError, and shown without the credentials they may carry."""

from __future__ import annotations

import re
from collections.abc import Collection
from urllib.parse import SplitResult, urlsplit, urlunsplit

from factory.core.errors import ConfigError

HTTP_SCHEMES = ("http", "https")  # an S3 endpoint
INDEX_SCHEMES = ("file", "http", "https")  # a package index: pip reads file: URLs too
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}://[^\s\"'<>]+")


def without_credentials(url: str) -> str:
    """The URL as it may be shown: no user:password@, query or fragment."""
    try:
        parts = urlsplit(url)
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
    except ValueError:  # not even splittable: drop whatever comes before the last @
        scheme, sep, rest = url.partition("://")
        return f"{scheme}{sep}{rest.rpartition('@')[2]}"
    if not netloc and url.startswith(f"{parts.scheme}://"):  # urlunsplit drops the // of s3:///x
        return f"{parts.scheme}://{parts.path}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def checked_url(url: str, *, schemes: Collection[str], what: str) -> SplitResult:
    """`url` split, when its scheme is one of `schemes` and it names a host (a file: URL, a path); else a
    ConfigError naming `what` and the URL without its credentials."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- urllib checks the port only when it is read
    except ValueError as exc:  # an unclosed [IPv6 address, a port out of range
        raise ConfigError(f"{what} {without_credentials(url)}: {exc}") from None
    if parts.scheme not in schemes or (parts.scheme != "file" and not parts.hostname):
        allowed = " or ".join(f"{s}://" for s in sorted(schemes))
        raise ConfigError(f"{what} {without_credentials(url)}: not a URL of {allowed}")
    return parts


MAX_LOG_LINE = 2048
_CONTROL = str.maketrans({c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0), ord("\\"))})


def printable(text: str) -> str:
    """`text` as one log line: control characters (ESC, CR, LF, C1) and backslashes escaped, URLs without
    their credentials, cut at MAX_LOG_LINE characters. For whatever a client, a container or an index said."""
    line = scrub_urls(text).translate(_CONTROL)
    return line if len(line) <= MAX_LOG_LINE else line[: MAX_LOG_LINE - 3] + "..."


def scrub_urls(text: str) -> str:
    """`text` with every URL in it through without_credentials (an outside message: botocore's, git's)."""
    return _URL_IN_TEXT.sub(lambda m: without_credentials(m.group()), text)


def urls_without_credentials(text: str) -> str:
    """An outside message as one line, every URL in it through without_credentials."""
    return " ".join(scrub_urls(text).split())
