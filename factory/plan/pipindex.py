"""A package index read as pip reads it: the host's pip configuration (index-url, extra-index-url,
find-links, cert, client-cert, proxy, trusted-host, timeout, constraints), an HTTP client configured the same
way (`IndexClient`: credentials only to their own host, a deadline on every request, bounded bodies), and the
files a simple page (PEP 691 JSON or PEP 503 HTML) or a find-links location lists.

Below the torch index reader (`torchindex`, `torchcompat`) and the sdist finder (`factory.build.source`),
which both read indexes through it.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

from factory.core import bounded
from factory.core.bounded import Deadline
from factory.core.errors import BuildError
from factory.core.simpleapi import PYPI_JSON_TYPE, parse_anchors
from factory.core.units import format_size
from factory.core.urls import without_credentials
from factory.spec.options import FetchLimits

PYPI_SIMPLE = "https://pypi.org/simple"
# PEP 691 JSON first, PEP 503 HTML otherwise (and from indexes that know neither media type).
ACCEPT = f"{PYPI_JSON_TYPE}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"
# pip's own sections, weakest first; environment variables (":env:") beat every file.
PIP_SECTIONS = ("global", "download", ":env:")
CHUNK = 1 << 20
# What a page may link to: an index on the network must not make the factory read the host's own files
# (file:///etc/passwd, file:///dev/zero); a local index or find-links may name local files.
REMOTE_LINK_SCHEMES = ("http", "https")
LOCAL_LINK_SCHEMES = ("file", "http", "https")


# ---------------------------------------------------------------------------------------------- pip settings


@dataclass(frozen=True, kw_only=True)
class PipSettings:
    """What finding and fetching an sdist needs of the host's pip configuration."""

    index_url: str = PYPI_SIMPLE
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    cert: str | None = None  # CA bundle
    client_cert: str | None = None  # PEM with the client's key and certificate
    proxy: str | None = None
    trusted_hosts: tuple[str, ...] = ()  # host or host:port whose TLS certificate is not checked
    timeout: float = 15.0
    constraints: tuple[str, ...] = ()  # pip's constraint files (local paths), which cap what pip installs

    @property
    def indexes(self) -> tuple[str, ...]:
        return () if self.no_index else (self.index_url, *self.extra_index_urls)


# pip option names a configuration may use for the same setting
_ALIASES = {"pypi-url": "index-url", "default-timeout": "timeout"}


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "y", "yes", "t", "true", "on")


def parse_pip_config(text: str) -> PipSettings:
    """`pip config list` output -> the settings, sections merged as pip merges them for `pip download`.

    pip has already merged the files (global, user, site, PIP_CONFIG_FILE) key by key; its output names each
    key's section, and PIP_* variables appear as the ":env:" section, which wins over every file.
    """
    by_section: dict[str, dict[str, str]] = {s: {} for s in PIP_SECTIONS}
    for line in text.splitlines():
        key, sep, raw = line.partition("=")
        section, _, name = key.strip().rpartition(".")
        if not sep or section not in by_section:
            continue
        try:
            value = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            value = raw.strip()
        by_section[section][_ALIASES.get(name, name)] = str(value)
    merged: dict[str, str] = {}
    for section in PIP_SECTIONS:
        merged.update(by_section[section])

    def listed(name: str) -> tuple[str, ...]:
        return tuple(merged.get(name, "").split())

    timeout = merged.get("timeout")
    try:
        seconds = float(timeout) if timeout else PipSettings.timeout
    except ValueError:
        raise BuildError(f"pip configuration: timeout {timeout!r} is not a number of seconds") from None
    return PipSettings(
        index_url=merged.get("index-url") or PYPI_SIMPLE,
        extra_index_urls=listed("extra-index-url"),
        find_links=listed("find-links"),
        no_index=_truthy(merged.get("no-index", "")),
        cert=merged.get("cert") or None,
        client_cert=merged.get("client-cert") or None,
        proxy=merged.get("proxy") or None,
        trusted_hosts=listed("trusted-host"),
        timeout=seconds,
        constraints=listed("constraint"),
    )


_PIP_ENV = ("HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "VIRTUAL_ENV")
_read_settings: dict[tuple[object, ...], PipSettings] = {}


def _pip_config_key() -> tuple[object, ...]:
    """What pip's configuration is read from: the environment (PIP_*, where the files are) and each file's
    identity, so an edited pip.conf is read anew."""
    env = {k: v for k, v in os.environ.items() if k.startswith("PIP_") or k in _PIP_ENV}
    home = Path(env.get("HOME") or "~").expanduser()
    config = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    files = [
        *(Path(d) / "pip" / "pip.conf" for d in (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":") if d),
        Path("/etc/pip.conf"),
        home / ".pip" / "pip.conf",
        config / "pip" / "pip.conf",
        *([Path(env["VIRTUAL_ENV"]) / "pip.conf"] if env.get("VIRTUAL_ENV") else []),
        *([Path(env["PIP_CONFIG_FILE"])] if env.get("PIP_CONFIG_FILE") else []),
    ]
    stats: list[tuple[object, ...]] = []
    for f in files:
        try:
            st = f.stat()
            stats.append((str(f), st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            stats.append((str(f), None))
    return (sys.executable, tuple(sorted(env.items())), tuple(stats))


def read_pip_settings() -> PipSettings:
    """The host's pip configuration, as pip itself reads it (every pip.conf, PIP_CONFIG_FILE, PIP_*): read
    once (`pip config list` costs a Python start) however many parts of a run ask (the plan's torch index,
    the sdist finder), and again only when the environment or a configuration file changed."""
    key = _pip_config_key()
    if key not in _read_settings:
        proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
        if proc.returncode != 0:
            detail = proc.stderr.strip().splitlines()
            raise BuildError(f"cannot read the pip configuration: {detail[-1] if detail else 'pip failed'}")
        _read_settings[key] = parse_pip_config(proc.stdout)
    return _read_settings[key]


# ---------------------------------------------------------------------------------------------- the index


class _NotFound(Exception):
    """The index has no page for the project (HTTP 404/410, no such directory)."""


class IndexPageError(ValueError):
    """A page or file refused for what it is (malformed, too large, too slow); the message says why."""


class _TooLarge(IndexPageError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"larger than {format_size(limit)}")
        self.limit = limit


class _TooSlow(IndexPageError):
    def __init__(self, seconds: float) -> None:
        super().__init__(f"not done within {seconds:g} s")
        self.seconds = seconds


@dataclass(frozen=True, kw_only=True)
class IndexFile:
    """One file an index page links to."""

    filename: str
    url: str  # without credentials: they travel as a header to their own host only
    digest: tuple[str, str] | None  # (hashlib algorithm, hex digest) as the index gives it
    where: str  # the index or find-links location that listed it, as it may be shown


def _hash_of(fragment: str) -> tuple[str, str] | None:
    algo, sep, digest = fragment.partition("=")
    algo = algo.lower()
    if sep and algo in hashlib.algorithms_guaranteed and digest:
        return algo, digest.lower()
    return None


def is_file_name(name: str) -> bool:
    """Whether `name` can be saved as it is: one path component, nothing unprintable (a newline, a NUL)."""
    return name not in ("", ".", "..") and "/" not in name and "\\" not in name and name.isprintable()


def _json_files(body: bytes) -> list[tuple[str, str, dict[str, Any]]]:
    """(filename, url, hashes) of each file of a PEP 691 page; IndexPageError for a page of another shape."""
    try:
        doc = json.loads(body)
    except ValueError as exc:  # also a UnicodeDecodeError
        raise IndexPageError(f"not a PEP 691 JSON page ({exc})") from None
    files = doc.get("files", []) if isinstance(doc, dict) else None
    if not isinstance(files, list):
        raise IndexPageError("malformed PEP 691 page: no list of files")
    out: list[tuple[str, str, dict[str, Any]]] = []
    for item in files:
        if not isinstance(item, dict):
            raise IndexPageError(f"malformed PEP 691 page: a file entry is {item!r:.60}")
        filename, url, hashes = item.get("filename"), item.get("url"), item.get("hashes") or {}
        if not isinstance(filename, str) or not isinstance(url, str) or not isinstance(hashes, dict):
            raise IndexPageError(f"malformed PEP 691 page: file entry {item!r:.80}")
        if not is_file_name(filename):
            raise IndexPageError(f"malformed PEP 691 page: filename {filename!r:.80} is not a file name")
        out.append((filename, url, hashes))
    return out


def parse_project_page(
    body: bytes, content_type: str, page_url: str
) -> list[tuple[str, str, tuple[str, str] | None]]:
    """(filename, absolute URL, hash) of each file a simple page (PEP 691 JSON or PEP 503 HTML) lists.

    A JSON page not of PEP 691's shape is an IndexPageError; an HTML link whose name is not a plain file name
    is not a file, and is passed over as pages' other links are."""
    out: list[tuple[str, str, tuple[str, str] | None]] = []
    if content_type == PYPI_JSON_TYPE:
        for filename, url, hashes in _json_files(body):
            algo = "sha256" if "sha256" in hashes else next(iter(sorted(hashes)), None)
            digest: tuple[str, str] | None = None
            if algo is not None and algo in hashlib.algorithms_guaranteed:
                digest = (algo, str(hashes[algo]).lower())
            out.append((filename, urljoin(page_url, url), digest))
        return out
    for anchor in parse_anchors(body.decode("utf-8", "replace")):
        if not anchor.href:
            continue
        url = urljoin(page_url, anchor.href)
        parts = urlsplit(url)
        filename = unquote(parts.path.rsplit("/", 1)[-1])
        if is_file_name(filename):
            out.append((filename, urlunsplit(parts._replace(fragment="")), _hash_of(parts.fragment)))
    return out


def _links_checked(
    files: list[tuple[str, str, tuple[str, str] | None]], schemes: Sequence[str]
) -> list[tuple[str, str, tuple[str, str] | None]]:
    for _, url, _ in files:
        if urlsplit(url).scheme not in schemes:
            raise IndexPageError(
                f"it links to {without_credentials(url)}; only a local index or find-links may link to "
                "anything but http(s) files"
            )
    return files


class IndexClient:
    """urllib configured as pip is: CA bundle, client certificate, proxy, trusted hosts, credentials."""

    def __init__(self, pip: PipSettings) -> None:
        self.timeout = pip.timeout
        self.trusted = {h.lower() for h in pip.trusted_hosts}
        self.auth: dict[str, str] = {}  # host[:port] -> Authorization header
        try:
            verified = ssl.create_default_context(cafile=pip.cert)
        except OSError as exc:  # ssl.SSLError is one
            raise BuildError(f"pip configuration: cert {pip.cert}: {exc}") from None
        unverified = ssl.create_default_context()
        unverified.check_hostname = False
        unverified.verify_mode = ssl.CERT_NONE
        if pip.client_cert:
            try:
                for ctx in (verified, unverified):
                    ctx.load_cert_chain(pip.client_cert)
            except OSError as exc:
                raise BuildError(f"pip configuration: client-cert {pip.client_cert}: {exc}") from None
        self.proxies = {"http": pip.proxy, "https": pip.proxy} if pip.proxy else None
        self.contexts = {False: verified, True: unverified}

    def bare(self, url: str) -> str:
        """`url` without user:password@, remembering them for requests to that host."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or parts.username is None:
            return url
        netloc = parts.netloc.rpartition("@")[2]
        self.auth[netloc.lower()] = bounded.basic_auth(parts.username, parts.password)
        return urlunsplit(parts._replace(netloc=netloc))

    def open(
        self,
        url: str,
        *,
        deadline: Deadline,
        accept: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:  # urllib's response
        """A GET of an http(s) URL (nothing else: no file:, ftp: or data:, nor a redirect to one), its
        connections shut down when `deadline` expires; `headers` (Range, If-None-Match) go with it."""
        parts = urlsplit(url)
        request = bounded.request(url, headers={**({"Accept": accept} if accept else {}), **(headers or {})})
        header = self.auth.get(parts.netloc.lower())
        if header:
            # never carried to the host a redirect points to
            request.add_unredirected_header("Authorization", header)
        trust = parts.netloc.lower() in self.trusted or (parts.hostname or "").lower() in self.trusted
        director = bounded.opener(deadline, context=self.contexts[trust], proxies=self.proxies)
        return director.open(request, timeout=self.timeout)

    def _transfer(
        self,
        url: str,
        sink: Callable[[bytes], object],
        *,
        limit: int,
        seconds: float,
        accept: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, dict[str, str], str, str]:
        """GET `url` into `sink` block by block: at most `limit` bytes (else _TooLarge), all within `seconds`
        (else _TooSlow). The status, the response headers (names lower-cased), the content type, and the URL
        it came from after redirects."""
        with Deadline(seconds) as deadline:
            total = 0
            try:
                with self.open(url, deadline=deadline, accept=accept, headers=headers) as resp:
                    declared = resp.headers.get("Content-Length", "").strip()
                    if declared.isdigit() and int(declared) > limit:
                        raise _TooLarge(limit)
                    # read1: one receive at a time, so the deadline is seen between them
                    while not deadline.expired and (block := resp.read1(CHUNK)):
                        total += len(block)
                        if total > limit:
                            raise _TooLarge(limit)
                        sink(block)
                    short = resp.length  # what the Content-Length promised and the body did not bring
                    said = {k.lower(): v for k, v in resp.headers.items()}
                    got = resp.status, said, resp.headers.get_content_type(), resp.geturl()
            except (OSError, HTTPException):
                if deadline.expired:
                    raise _TooSlow(seconds) from None
                raise
            if deadline.expired:
                raise _TooSlow(seconds)
        if short:
            raise IndexPageError(f"the connection closed after {total} of {declared} bytes")
        return got

    def get(
        self,
        url: str,
        sink: Callable[[bytes], object],
        *,
        limit: int,
        seconds: float,
        accept: str | None = None,
    ) -> tuple[str, str]:
        """GET `url` into `sink` (bounded as `_transfer` says): the content type, and the URL it came from
        after redirects."""
        _, _, content_type, final_url = self._transfer(url, sink, limit=limit, seconds=seconds, accept=accept)
        return content_type, final_url

    def fetch(
        self, url: str, *, limit: int, seconds: float, headers: Mapping[str, str] | None = None
    ) -> tuple[int, Mapping[str, str], bytes]:
        """GET `url` with `headers` (Range, If-None-Match; bounded as `_transfer` says): its status, response
        headers (names lower-cased) and body. A 304 is a status, not an error; any other HTTP error is raised
        as urllib raises it."""
        body = bytearray()
        try:
            status, said, _, _ = self._transfer(
                url, body.extend, limit=limit, seconds=seconds, headers=headers
            )
        except urllib.error.HTTPError as exc:
            if exc.code == 304:
                return 304, {k.lower(): v for k, v in exc.headers.items()}, b""
            raise
        return status, said, bytes(body)

    def page(self, url: str, limits: FetchLimits) -> list[tuple[str, str, tuple[str, str] | None]]:
        """The files an index page, or a find-links page or directory, lists."""
        parts = urlsplit(url)
        if parts.scheme == "file" or "://" not in url:
            path = Path(urllib.request.url2pathname(parts.path)) if parts.scheme == "file" else Path(url)
            if path.is_dir() and not (path / "index.html").is_file():
                return [(p.name, p.resolve().as_uri(), None) for p in sorted(path.iterdir()) if p.is_file()]
            page = path / "index.html" if path.is_dir() else path
            if not page.is_file():
                raise _NotFound
            with bounded.open_file(page, max_bytes=None) as fh:  # a FIFO is refused, never waited on
                body = fh.read(limits.page_bytes + 1)
            if len(body) > limits.page_bytes:
                raise _TooLarge(limits.page_bytes)
            files = parse_project_page(body, "text/html", page.resolve().as_uri())
            return _links_checked(files, LOCAL_LINK_SCHEMES)
        received = bytearray()
        try:
            content_type, final_url = self.get(
                url, received.extend, limit=limits.page_bytes, seconds=limits.page_seconds, accept=ACCEPT
            )
        except urllib.error.HTTPError as exc:
            if exc.code in (404, 410):
                raise _NotFound from None
            raise
        return _links_checked(
            parse_project_page(bytes(received), content_type, final_url), REMOTE_LINK_SCHEMES
        )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    return " ".join(str(getattr(exc, "reason", exc)).split()) or type(exc).__name__


def _copy_local(path: Path, out: Any, limit: int) -> None:
    """A file a local index names, at most `limit` bytes of it; a FIFO or device (/dev/zero) is refused."""
    try:
        # its type checked on the descriptor, not the path: a FIFO swapped in after a check would block
        with bounded.open_file(path, max_bytes=None) as src:
            total = 0
            while block := src.read(CHUNK):
                total += len(block)
                if total > limit:
                    raise _TooLarge(limit)
                out.write(block)
    except bounded.Refused:
        raise IndexPageError("not a regular file") from None
