"""Reading what the factory is given, bounded: a file a user, a store or a page names, a URL, a zip, a tool's
output.

Each of these is someone else's, and may be hostile: a FIFO that blocks an `open` forever, a device that never
ends, a file of gigabytes where kilobytes were meant, a server that sends a byte just before each socket
timeout, a zip whose central directory lists a million entries, a tool that prints without end. The one way
in is here:

- `open_file` / `read_file`: a named path, opened without blocking (O_NONBLOCK: a FIFO is refused by its type
  on the descriptor, never waited on), `fstat` checked to be a regular file, its size capped, and the read
  cut off at the cap should the file grow while it is read. (Trees a container or a store writer could have
  written are `safefs`'s: it adds O_NOFOLLOW at every level.)
- `Deadline` and `open_url`: one GET with a total wall-clock deadline (its sockets shut down when it passes,
  which wakes a read blocked on them) and a byte cap; a `file:` URL goes through `open_file`. This is the
  factory's one HTTP client: `opener` is the one place urllib's handlers are chosen (deadline, TLS context,
  proxies, whether a redirect is followed), `request` the one place a URL's user:password@ becomes a header
  (never carried to the host a redirect points to); the package-index client that reads pip's settings
  (`IndexClient`) opens through them, and boto3 (S3) is the only other.
- `open_zip`: a zip whose central directory holds more than `MAX_ZIP_ENTRIES` entries is refused before
  `zipfile` builds an object per entry (counted from the directory itself, not from the count its end record
  claims); `read_member`: one member's bytes, inflated no further than a cap, whatever its entry declares.
- `run_output`: a tool's stdout, at most a cap, within a time limit.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import os
import select
import socket
import ssl
import stat
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from http.client import HTTPConnection, HTTPException, HTTPResponse, HTTPSConnection
from pathlib import Path
from typing import IO, Any, BinaryIO, Protocol
from urllib.parse import unquote, urlsplit, urlunsplit

CHUNK = 1 << 20
# A zip with more entries than this is not a wheel or an sdist this factory reads (torch's wheel has ~13,000;
# source.MAX_MEMBERS bounds an sdist's members at the same number).
MAX_ZIP_ENTRIES = 200_000
# a wheel fetched whole to verify or inspect: at most this long, however the server paces it
WHEEL_DEADLINE_S = 600.0
_CENTRAL = b"PK\x01\x02"
_CENTRAL_HEADER = 46  # the fixed part of a central directory entry


class Refused(OSError):
    """A file or URL refused for what it is: not a regular file, too large, too slow, too many entries."""


# ---------------------------------------------------------------------------------------------- files


def open_file(path: Path | str, *, max_bytes: int | None) -> BinaryIO:
    """The regular file `path`, opened for reading (a file object, closed by `with`) without blocking on a
    FIFO; Refused (naming the path) for a FIFO, a device or a file over `max_bytes`, IsADirectoryError for a
    directory. Reading it whole is the caller's to bound (`read_capped`): a file may grow."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{path}: not a regular file ({_kind(st.st_mode)})")
        if max_bytes is not None and st.st_size > max_bytes:
            raise Refused(f"{path}: {st.st_size} bytes, over the {size_text(max_bytes)} it may have")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def file_sha256(path: Path | str) -> str:
    """The sha256 of the regular file `path`, read block by block (a FIFO or device is Refused, not waited
    on)."""
    digest = hashlib.sha256()
    with open_file(path, max_bytes=None) as fh:
        while block := fh.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def read_capped(fh: IO[bytes], *, max_bytes: int, shown: str) -> bytes:
    """All of `fh`, read at most `max_bytes` + 1 deep; Refused when there is more (a file that grew)."""
    data = bytearray()
    while len(data) <= max_bytes and (chunk := fh.read(min(CHUNK, max_bytes + 1 - len(data)))):
        data += chunk
    if len(data) > max_bytes:
        raise Refused(f"{shown}: over the {size_text(max_bytes)} it may have")
    return bytes(data)


def read_file(path: Path | str, *, max_bytes: int) -> bytes:
    """The bytes of the regular file `path`, at most `max_bytes` (`open_file`'s refusals)."""
    with open_file(path, max_bytes=max_bytes) as fh:
        return read_capped(fh, max_bytes=max_bytes, shown=str(path))


def iter_lines(path: Path | str, *, max_bytes: int) -> Iterator[str]:
    """The lines of the regular file `path` (UTF-8, errors replaced), streamed: never the whole file in
    memory, at most `max_bytes` of it read."""
    with open_file(path, max_bytes=max_bytes) as fh:
        seen = 0
        for raw in fh:
            seen += len(raw)
            if seen > max_bytes:
                raise Refused(f"{path}: over the {size_text(max_bytes)} it may have")
            yield raw.decode("utf-8", "replace").rstrip("\r\n")


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a file"


def size_text(n: int) -> str:
    """A cap as a message says it: 4 MiB, 256 KiB, 4097 bytes."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


# ---------------------------------------------------------------------------------------------- zips


class Seekable(Protocol):
    """What zipfile reads an archive through: a local file, or a remote one read by ranges."""

    def seek(self, offset: int, whence: int = 0, /) -> int: ...
    def tell(self) -> int: ...
    def read(self, n: int = -1, /) -> bytes: ...


def zip_entries(fp: Seekable, *, max_entries: int) -> int:
    """How many entries the central directory of the zip `fp` holds, counted entry by entry and stopped past
    `max_entries` (Refused); the end record's own count is not trusted (zipfile reads the directory by its
    size, whatever the count says). A file that is no zip is left for zipfile to name (0)."""
    # zipfile's own end-record reader (it finds the record behind a comment, and its zip64 form)
    end = getattr(zipfile, "_EndRecData")(fp)  # noqa: B009  # private, stable since Python 2
    if not end:
        return 0
    signature, size_cd, offset_cd, location = end[0], end[5], end[6], end[9]
    concat = location - size_cd - offset_cd  # bytes prepended to the archive, as zipfile reckons them
    if signature == b"PK\x06\x06":  # the zip64 end record, and its locator, precede the plain one
        concat -= 56 + 20
    pos, stop, count = offset_cd + concat, offset_cd + concat + size_cd, 0
    buf, buf_at = b"", pos
    while pos < stop:
        if pos + _CENTRAL_HEADER > buf_at + len(buf):
            fp.seek(pos)
            buf, buf_at = fp.read(max(CHUNK // 4, _CENTRAL_HEADER)), pos
        head = buf[pos - buf_at : pos - buf_at + _CENTRAL_HEADER]
        if len(head) < _CENTRAL_HEADER or head[:4] != _CENTRAL:
            break  # zipfile says what is wrong with it
        count += 1
        if count > max_entries:
            raise Refused(f"more than {max_entries} entries in the zip")
        name, extra, comment = struct.unpack("<HHH", head[28:34])
        pos += _CENTRAL_HEADER + name + extra + comment
    return count


class _OwnedZip(zipfile.ZipFile):
    """A ZipFile over a handle it closes with itself, named by its path as zipfile names one it opened."""

    def __init__(self, fh: IO[bytes], path: Path | str) -> None:
        self._owned = fh
        super().__init__(fh)
        self.filename = os.fspath(path)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._owned.close()


def open_zip(source: Path | str | Seekable, *, max_entries: int | None = None) -> zipfile.ZipFile:
    """A ZipFile for reading `source` (a regular file's path, or an open seekable file), its central
    directory first counted (`zip_entries`): Refused past `max_entries` (default MAX_ZIP_ENTRIES)."""
    limit = MAX_ZIP_ENTRIES if max_entries is None else max_entries
    if isinstance(source, (str, Path)):
        fh = open_file(source, max_bytes=None)
        try:
            try:
                zip_entries(fh, max_entries=limit)
            except Refused as exc:
                raise Refused(f"{source}: {exc}") from None
            fh.seek(0)
            return _OwnedZip(fh, source)
        except BaseException:
            fh.close()
            raise
    zip_entries(source, max_entries=limit)
    source.seek(0)
    return zipfile.ZipFile(source)  # zipfile reads through seek, tell and read


class BadMember(OSError):
    """A zip member that cannot be read: a CRC mismatch, bad deflate data, an unknown compression method,
    encryption, a truncated file (the message is zipfile's or zlib's)."""


# What reading a damaged or unsupported zip member raises (streaming it: `read_member` raises BadMember)
MEMBER_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    NotImplementedError,
    RuntimeError,
    EOFError,
    OSError,
    ValueError,
)


def read_member(archive: zipfile.ZipFile, member: str | zipfile.ZipInfo, *, max_bytes: int) -> bytes:
    """The bytes of one member of `archive`, never inflated past `max_bytes` + 1: Refused (naming the member)
    when its entry declares more (inflated or compressed) or its stream holds more than its entry declares;
    KeyError when there is no such member; BadMember when it cannot be read."""
    info = member if isinstance(member, zipfile.ZipInfo) else archive.getinfo(member)
    declared = max(info.file_size, info.compress_size)
    if declared > max_bytes:
        raise Refused(f"{info.filename}: {declared} bytes, over the {size_text(max_bytes)} it may have")
    try:
        with archive.open(info) as fh:
            data = fh.read(max_bytes + 1)
    except MEMBER_ERRORS as exc:
        raise BadMember(str(exc) or type(exc).__name__) from None
    if len(data) > max_bytes:  # the entry said less than its stream holds
        raise Refused(f"{info.filename}: over the {size_text(max_bytes)} it may have")
    return data


# ---------------------------------------------------------------------------------------------- URLs


class Deadline:
    """Ends a request at a wall-clock deadline by shutting its sockets down, which wakes a read blocked on
    them: a socket timeout bounds one read, not a server that sends a byte just before each one times out."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        with self._lock:
            for sock in self._socks:
                sock.close()
            self._socks.clear()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._socks:
                _shut(sock)

    def connect(self, address: tuple[str, int], timeout: Any, source_address: Any = None) -> socket.socket:
        """socket.create_connection, the socket watched."""
        sock = socket.create_connection(address, timeout, source_address)
        with self._lock:
            # A duplicate: TLS wrapping detaches the original, and once the connection closes the original's
            # descriptor number may be another file's.
            self._socks.append(sock.dup())
            if self.expired:
                _shut(sock)
        return sock

    def connection(self, cls: type[HTTPConnection]) -> Callable[..., HTTPConnection]:
        def make(*args: Any, **kwargs: Any) -> HTTPConnection:
            conn = cls(*args, **kwargs)
            # HTTPConnection connects (directly or to a proxy, before any TLS handshake) through this hook
            conn._create_connection = self.connect  # type: ignore[attr-defined]
            return conn

        return make


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # not connected any more
        sock.shutdown(socket.SHUT_RDWR)


class DeadlineHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req: urllib.request.Request) -> HTTPResponse:
        return self.do_open(self.deadline.connection(HTTPConnection), req)


class DeadlineHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: Deadline, context: ssl.SSLContext) -> None:
        super().__init__(context=context)
        self.deadline = deadline
        self.tls = context

    def https_open(self, req: urllib.request.Request) -> HTTPResponse:
        return self.do_open(self.deadline.connection(HTTPSConnection), req, context=self.tls)


class Body:
    """A response body read within its deadline and byte cap: `read` raises Refused past either."""

    def __init__(self, raw: IO[bytes], *, deadline: Deadline | None, max_bytes: int, shown: str) -> None:
        self.raw, self.deadline, self.max_bytes, self.shown = raw, deadline, max_bytes, shown
        self.total = 0
        self.status: int | None = getattr(raw, "status", None)  # an HTTP response's

    def _late(self) -> Refused:
        seconds = self.deadline.seconds if self.deadline is not None else 0
        return Refused(f"{self.shown}: not done within {seconds:g} s")

    def read(self, n: int = -1) -> bytes:
        want = self.max_bytes + 1 - self.total if n < 0 else min(n, self.max_bytes + 1 - self.total)
        if self.deadline is not None and self.deadline.expired:
            raise self._late()
        try:
            # read1 where there is one: one receive at a time, so the deadline is seen between them
            reader = getattr(self.raw, "read1", self.raw.read)
            chunk = reader(min(max(want, 0), CHUNK)) if want > 0 else b""
        except (OSError, HTTPException, ValueError) as exc:
            if self.deadline is not None and self.deadline.expired:
                raise self._late() from None
            if isinstance(exc, HTTPException):  # a body cut short: an OSError as the callers catch them
                raise OSError(f"the answer broke off ({type(exc).__name__})") from None
            raise
        if self.deadline is not None and self.deadline.expired:
            raise self._late()
        self.total += len(chunk)
        if self.total > self.max_bytes:
            raise Refused(f"{self.shown}: over the {size_text(self.max_bytes)} it may have")
        return chunk

    def read_all(self) -> bytes:
        """Everything left, within the cap (Refused past it)."""
        out = bytearray()
        while chunk := self.read(CHUNK):
            out += chunk
        return bytes(out)


class NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is a URL the server hands back, which the host did not compose: it is not followed (an
    HTTPError of its 3xx code, which says where it pointed)."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        return None


def basic_auth(username: str, password: str | None) -> str:
    """An Authorization header's value for a URL's (percent-encoded) user and password."""
    userinfo = f"{unquote(username)}:{unquote(password or '')}"
    return "Basic " + base64.b64encode(userinfo.encode()).decode()


def request(
    url: str, *, data: bytes | None = None, headers: Mapping[str, str] | None = None
) -> urllib.request.Request:
    """A GET (a POST with `data`) of `url` with `headers`; a user:password@ in it becomes an Authorization
    header that goes to that host only (urllib drops it from a redirect's request), and leaves the URL."""
    parts = urlsplit(url)
    auth = None
    if parts.scheme in ("http", "https") and parts.username is not None:
        auth = basic_auth(parts.username, parts.password)
        url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2], fragment=""))
    req = urllib.request.Request(
        url, data=data, headers=dict(headers or {}), method="POST" if data else "GET"
    )
    if auth is not None:
        req.add_unredirected_header("Authorization", auth)
    return req


def opener(
    deadline: Deadline,
    *,
    context: ssl.SSLContext | None = None,
    proxies: Mapping[str, str] | None = None,
    follow_redirects: bool = True,
) -> urllib.request.OpenerDirector:
    """urllib's opener for one request, the one place its handlers are chosen: connections watched by
    `deadline`, TLS by `context` (default: the system's CA store, host names checked), `proxies` (default:
    the environment's), a redirect followed or not (`NoRedirect`); no file:, ftp: or data: handler."""
    director = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.ProxyHandler(None if proxies is None else dict(proxies)),
        urllib.request.UnknownHandler(),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPRedirectHandler() if follow_redirects else NoRedirect(),
        urllib.request.HTTPErrorProcessor(),
        DeadlineHTTPHandler(deadline),
        DeadlineHTTPSHandler(deadline, context or ssl.create_default_context()),
    ):
        director.add_handler(handler)
    return director


@contextlib.contextmanager
def open_url(
    request: urllib.request.Request,
    *,
    seconds: float,
    max_bytes: int,
    shown: str,
    context: ssl.SSLContext | None = None,
    whole: bool = True,
    follow_redirects: bool = True,
) -> Iterator[Body]:
    """GET (or POST) `request` with a total wall-clock deadline of `seconds` over connecting, the answer's
    headers and every read of its body, the body capped at `max_bytes` (a Content-Length over it refused
    before the body is read, unless the caller reads a prefix only: `whole=False`); a `file:` URL is a regular
    file (`open_file`). HTTP errors are raised as urllib raises them; too slow or too large is Refused naming
    `shown` (the URL as it may be shown). With `follow_redirects=False` a redirect is not followed: it is the
    HTTPError of its 3xx code (a URL the server handed back, which the host did not compose)."""
    parts = urlsplit(request.full_url)
    if parts.scheme == "file":
        with open_file(Path(unquote(parts.path)), max_bytes=max_bytes) as fh:
            yield Body(fh, deadline=None, max_bytes=max_bytes, shown=shown)
        return
    if parts.scheme not in ("http", "https"):
        raise Refused(f"{shown}: not an http(s) or file URL")
    with Deadline(seconds) as deadline:
        try:
            # the socket timeout bounds each wait; the deadline bounds them all
            resp = opener(deadline, context=context, follow_redirects=follow_redirects).open(
                request, timeout=min(seconds, 60.0)
            )
        except urllib.error.HTTPError:
            raise
        except (OSError, HTTPException) as exc:
            if deadline.expired:
                raise Refused(f"{shown}: not done within {seconds:g} s") from None
            if isinstance(exc, OSError):
                raise
            raise OSError(str(exc) or type(exc).__name__) from None
        with resp:
            declared = (resp.headers.get("Content-Length") or "").strip()
            if whole and declared.isdigit() and int(declared) > max_bytes:
                raise Refused(f"{shown}: {declared} bytes, over the {size_text(max_bytes)} it may have")
            yield Body(resp, deadline=deadline, max_bytes=max_bytes, shown=shown)


# ---------------------------------------------------------------------------------------------- tools


def run_output(args: list[str], *, max_bytes: int, seconds: float) -> str | None:
    """A tool's stdout (text, errors replaced) when it exits 0 within `seconds`, having printed at most
    `max_bytes`; None when it cannot run, fails, prints more or takes longer (it is killed). Its stderr is
    discarded, its stdin is empty."""
    try:
        proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
    except OSError:
        return None
    assert proc.stdout is not None
    out = bytearray()
    end = time.monotonic() + seconds
    ok = True
    try:
        fd = proc.stdout.fileno()
        while True:
            left = end - time.monotonic()
            if left <= 0:
                ok = False
                break
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            out += chunk
            if len(out) > max_bytes:
                ok = False
                break
        if ok:
            try:
                code = proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                ok = False
            else:
                ok = code == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    return out.decode("utf-8", "replace") if ok else None


__all__ = [
    "MAX_ZIP_ENTRIES",
    "Body",
    "Deadline",
    "DeadlineHTTPHandler",
    "DeadlineHTTPSHandler",
    "Refused",
    "iter_lines",
    "open_file",
    "open_url",
    "open_zip",
    "read_capped",
    "read_file",
    "run_output",
    "size_text",
    "zip_entries",
]
