"""`factory serve`: a published index over HTTP, from a local directory or from a (private) S3 prefix.

Static hosting cannot negotiate; this server can, so a project URL answers PEP 691 JSON to clients that ask
for it (uv, recent pip) and PEP 503 HTML to the rest, with directory URLs, content types, Cache-Control and
optional HTTP basic auth. The access log goes to stderr, one escaped line per request, never with credentials.

Under load and odd clients: a deep listen queue, so a crowd connecting at once is queued rather than dropped;
one thread per connection, each bounded by a deadline for its request head and a timeout when idle; paths that
cannot name anything answered 414 or 400 before the store is asked; a store that fails (an S3 endpoint down)
answered 502 with the reason on the request's log line.

With --accept-requests (a local index only), POST /_requests/ takes a consumer's build request
(`factory.plan.variantrequest`): rate-limited per client address and overall before its body is read, refused
past MAX_BYTES, parsed and validated, then written atomically under the index's _requests/ named by its hash.
The directory is never served, and nothing in a request is run or used as a path.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import io
import math
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from factory.core import storeurl
from factory.core.errors import ConfigError, FactoryError
from factory.core.simpleapi import PYPI_HTML_TYPE, PYPI_JSON_TYPE
from factory.core.urls import printable
from factory.plan import variantrequest
from factory.publish import index, site
from factory.publish.stores import LocalStore, S3Store, Store

_JSON_TYPES = {PYPI_JSON_TYPE, "application/vnd.pypi.simple.latest+json"}
_HTML_TYPES = {PYPI_HTML_TYPE, "application/vnd.pypi.simple.latest+html", "text/html", "*/*"}


def negotiate(accept: str | None) -> str:
    """PEP 691 content negotiation: the content type to answer a simple-repository page request with.

    The highest q wins; at equal q, JSON. No Accept header (or nothing we know) gets HTML, which every
    client reads.
    """
    if not accept:
        return index.HTML_TYPE
    best: tuple[float, int, str] | None = None
    for part in accept.split(","):
        fields = [f.strip() for f in part.split(";")]
        media = fields[0].lower()
        q = 1.0
        for param in fields[1:]:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if q <= 0:
            continue
        if media in _JSON_TYPES:
            choice = (q, 2, PYPI_JSON_TYPE)
        elif media in {PYPI_HTML_TYPE, "application/vnd.pypi.simple.latest+html"}:
            choice = (q, 1, PYPI_HTML_TYPE)
        elif media in _HTML_TYPES:
            choice = (q, 0, index.HTML_TYPE)
        else:
            continue
        if best is None or choice[:2] > best[:2]:
            best = choice
    return best[2] if best else index.HTML_TYPE


def content_type_of(key: str) -> str:
    """A page object's type as publishing stores it (`site.content_type`); other keys by their suffix."""
    page_type = site.content_type(key)
    if page_type is not None:
        return page_type
    if key.endswith(".metadata"):
        return "text/plain; charset=utf-8"
    if key.endswith(".html"):
        return index.HTML_TYPE
    if key.endswith(".json"):
        return "application/json"
    return "application/octet-stream"


def cache_control_of(key: str) -> str:
    immutable = key.startswith("files/") or key.startswith(index.FAILED_RECORDS_DIR)
    return index.FILE_CACHE_CONTROL if immutable else index.PAGE_CACHE_CONTROL


def parse_basic_auth(value: str) -> tuple[str, str]:
    user, sep, password = value.partition(":")
    if not sep or not user:
        raise ConfigError("--basic-auth takes USER:PASSWORD")
    return user, password


# Connections the kernel holds for accept(): a crowd of clients connecting at once must not find the queue
# full, or each of their retried SYNs waits 1, 3, 7... seconds (the kernel caps it at net.core.somaxconn).
BACKLOG = 1024
# A request path longer than S3's longest key, or a segment longer than a file name may be, names nothing.
MAX_PATH_BYTES = 1024
MAX_SEGMENT_BYTES = 255
MAX_LOGGED_REQUEST = 512  # of a request line, so that its status still fits on the line


@dataclass(frozen=True, kw_only=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port
    basic_auth: tuple[str, str] | None = None
    # A request head must arrive in full, and an idle connection is closed, within this many seconds; a
    # response write that stalls this long ends its connection too.
    timeout_s: float = 30.0
    # POST /_requests/: take build requests into this index directory's _requests/ (None: refuse them)
    requests_root: Path | None = None
    request_rate: tuple[int, int, float] = (10, 100, 3600.0)  # per client, in all, per this many seconds
    max_requests: int = variantrequest.MAX_STORED


def path_problem(path: str) -> HTTPStatus | None:
    """Why a decoded request path (without its leading "/") cannot name anything in an index, if it cannot."""
    if len(path.encode()) > MAX_PATH_BYTES or any(
        len(part.encode()) > MAX_SEGMENT_BYTES for part in path.split("/")
    ):
        return HTTPStatus.REQUEST_URI_TOO_LONG
    if any(part.startswith(".") for part in path.split("/")) or "\\" in path:
        return HTTPStatus.BAD_REQUEST
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in path):
        return HTTPStatus.BAD_REQUEST
    return None


def is_cache_path(path: str) -> bool:
    """Whether a request path lies in the compile cache's part of a publish store."""
    top = index.COMPILE_CACHE_PREFIX.split("/", 1)[0]
    return path == top or path.startswith(f"{top}/")


def is_requests_path(path: str) -> bool:
    """Whether a request path lies in an index's build requests (taken by POST, never served)."""
    top = variantrequest.DIRECTORY
    return path == top or path.startswith(f"{top}/")


class _DeadlineReader(io.RawIOBase):
    """Reads a socket so that a whole request head must arrive before `deadline`, not merely each of its
    bytes within a timeout of the one before: a client that drips a byte a second still runs out of time."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.deadline = time.monotonic()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("request head not received in time")
        self.sock.settimeout(remaining)
        return self.sock.recv_into(buffer)


class IndexServer(ThreadingHTTPServer):
    """One thread per connection; the store, the options and the log for the handlers."""

    request_queue_size = BACKLOG
    daemon_threads = True

    def __init__(self, store: Store, options: ServeOptions, write_log: Callable[[str], None]) -> None:
        self.store = store
        self.options = options
        self.write_log = write_log
        self.auth_token: bytes | None = None
        if options.basic_auth is not None:
            user, password = options.basic_auth
            self.auth_token = base64.b64encode(f"{user}:{password}".encode())
        per_client, total, window_s = options.request_rate
        self.limiter = variantrequest.RateLimiter(per_client=per_client, total=total, window_s=window_s)
        # one request stored at a time: the count of those stored is read, then added to
        self.requests_lock = threading.Lock()
        super().__init__((options.host, options.port), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed outside a reply (the client went away mid-download): one line."""
        exc = sys.exc_info()[1]
        self.write_log(printable(f"{client_address[0]} connection ended: {exc.__class__.__name__}: {exc}"))


class _Handler(BaseHTTPRequestHandler):
    server: IndexServer
    server_version = "wheel-factory"
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes: no 40 ms delayed-ACK stall

    def setup(self) -> None:
        super().setup()
        self._reader = _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)
        self._note = ""

    def handle_one_request(self) -> None:
        self._reader.deadline = time.monotonic() + self.server.options.timeout_s
        self._note = ""
        super().handle_one_request()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        # The head is in: from here on the socket's plain timeout bounds each write of the reply.
        self.connection.settimeout(self.server.options.timeout_s)
        return ok

    def log_message(self, format: str, *args: object) -> None:
        self.server.write_log(printable(f"{self.client_address[0]} {format % args}"))

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        code = code.value if isinstance(code, HTTPStatus) else code
        note = f" ({self._note})" if self._note else ""
        request = self.requestline
        if len(request) > MAX_LOGGED_REQUEST:
            request = request[: MAX_LOGGED_REQUEST - 3] + "..."
        self.log_message('"%s" %s %s%s', request, code, size, note)

    def _authorized(self) -> bool:
        expected = self.server.auth_token
        if expected is None:
            return True
        header = self.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            base64.b64decode(token, validate=True)
        except (binascii.Error, ValueError):
            return False
        return hmac.compare_digest(token.strip().encode(), expected)

    def _reply(self, status: HTTPStatus, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in {"Content-Type": "text/plain", **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _reply_unauthorized(self) -> None:
        self._reply(
            HTTPStatus.UNAUTHORIZED,
            b"authentication required\n",
            {"WWW-Authenticate": 'Basic realm="wheel index"'},
        )

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        if not self._authorized():
            self._reply_unauthorized()
            return
        raw_path = urlsplit(self.path).path
        path = unquote(raw_path).lstrip("/")
        problem = path_problem(path)
        if problem is not None:
            self._reply(problem, f"{problem.phrase.lower()}\n".encode())
            return
        if is_cache_path(path) or is_requests_path(
            path
        ):  # the compile cache under a publish store is the factory's, not the index's
            self._reply(HTTPStatus.NOT_FOUND, b"not found\n")
            return
        headers = {"Vary": "Accept"}
        if path == "" or path.endswith("/"):
            kind = negotiate(self.headers.get("Accept"))
            page = index.parse_page_key(path)
            # project pages and variant index roots have a PEP 691 twin; the list of variant indexes has not
            if kind == PYPI_JSON_TYPE and page is not None and page[0].kind in {"project", "variant"}:
                key = page[0].state_key
            else:
                key = f"{path}index.html"
                kind = kind if kind != PYPI_JSON_TYPE else index.HTML_TYPE
            headers["Content-Type"] = kind
        else:
            key = path
            headers["Content-Type"] = content_type_of(key)
        store = self.server.store
        try:
            opened = store.open(key)
            is_directory = (
                opened is None
                and not key.endswith("index.html")
                and store.head(f"{key}/index.html") is not None
            )
        except FactoryError as exc:  # the S3 endpoint down or refusing: a gateway's failure, not the client's
            self._note = str(exc)
            self._reply(HTTPStatus.BAD_GATEWAY, b"index store unavailable\n")
            return
        except OSError as exc:
            self._note = f"reading {key}: {exc.strerror or exc}"
            self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, b"cannot read the index\n")
            return
        if opened is None:
            if is_directory:
                self._reply(HTTPStatus.MOVED_PERMANENTLY, b"", {"Location": raw_path + "/"})
            else:
                self._reply(HTTPStatus.NOT_FOUND, b"not found\n")
            return
        stream, size = opened
        try:
            self.send_response(HTTPStatus.OK)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Cache-Control", cache_control_of(key))
            self.send_header("Content-Length", str(size))
            self.end_headers()
            if self.command != "HEAD":
                shutil.copyfileobj(stream, self.wfile, 1 << 20)
        finally:
            stream.close()

    def do_POST(self) -> None:
        """A build request (module doc); every other POST is refused."""
        # the body is not read unless taken: a reply before it ends the connection
        self.close_connection = True
        if not self._authorized():
            self._reply_unauthorized()
            return
        if urlsplit(self.path).path.rstrip("/") != f"/{variantrequest.DIRECTORY}":
            self._reply(HTTPStatus.NOT_FOUND, b"not found\n")
            return
        root = self.server.options.requests_root
        if root is None:
            self._reply(
                HTTPStatus.METHOD_NOT_ALLOWED, b"this index takes no requests\n", {"Allow": "GET, HEAD"}
            )
            return
        wait = self.server.limiter.allow(self.client_address[0])
        if wait is not None:
            self._note = "rate limited"
            self._reply(HTTPStatus.TOO_MANY_REQUESTS, b"too many requests\n", {"Retry-After": str(int(wait))})
            return
        length = self.headers.get("Content-Length")
        if length is None or self.headers.get("Transfer-Encoding"):
            self._reply(HTTPStatus.LENGTH_REQUIRED, b"a Content-Length is required\n")
            return
        if not (length.isascii() and length.isdigit()):
            self._reply(HTTPStatus.BAD_REQUEST, b"bad Content-Length\n")
            return
        if int(length) > variantrequest.MAX_BYTES:
            self._reply(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"over {variantrequest.MAX_BYTES} bytes\n".encode()
            )
            return
        media = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if media != "application/json":
            self._reply(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, b"send application/json\n")
            return
        body = self.rfile.read(int(length))  # within the request's deadline (_DeadlineReader)
        if len(body) != int(length):
            self._reply(HTTPStatus.BAD_REQUEST, b"body shorter than its Content-Length\n")
            return
        try:
            request = variantrequest.parse(body)
        except variantrequest.RequestError as exc:
            self._note = str(exc)
            self._reply(HTTPStatus.BAD_REQUEST, f"bad request: {exc}\n".encode())
            return
        self.close_connection = False
        try:
            with self.server.requests_lock:
                created = variantrequest.store_request(
                    root, request, max_stored=self.server.options.max_requests
                )
        except variantrequest.InboxFull as exc:
            self._note = str(exc)
            self._reply(HTTPStatus.INSUFFICIENT_STORAGE, b"no room for more requests\n")
            return
        except OSError as exc:
            self._note = f"storing a request: {exc.strerror or exc}"
            self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, b"cannot store the request\n")
            return
        self._note = f"request {request.id[:12]}"
        status = HTTPStatus.CREATED if created else HTTPStatus.OK
        self._reply(status, f"{request.id}\n".encode())


def make_server(
    store: Store, options: ServeOptions, *, log: Callable[[str], None] | None = None
) -> IndexServer:
    """An HTTP server for the index in `store`, listening already (call serve_forever())."""
    write_log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    return IndexServer(store, options, write_log)


def serving_store(directory: Path, *, source: str | None = None, endpoint_url: str | None = None) -> Store:
    """The index `factory serve` serves: `source` (a directory or s3://bucket/prefix) when given, else the
    published index in `directory`."""
    url = storeurl.parse(source, what="--from") if source is not None else None
    if url is not None and url.bucket is not None:
        return S3Store(url.bucket, url.prefix, endpoint_url=endpoint_url)
    directory = Path(source) if source is not None else directory
    if endpoint_url:
        raise ConfigError("--endpoint-url only applies with --from s3://...")
    if not (directory / "simple").is_dir():
        raise ConfigError(f"{directory}: not a published index (no simple/ inside); run factory publish")
    return LocalStore(directory.resolve())


def serve(
    directory: Path,
    *,
    source: str | None = None,
    endpoint_url: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    basic_auth: str | None = None,
    timeout_s: float = 30.0,
    accept_requests: bool = False,
    announce: Callable[[str], None],
) -> None:
    """Serve an index (`serving_store`) until interrupted; `announce` gets the line saying where, once the
    server listens."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be 0-65535, not {port}")
    if not 0 < timeout_s < math.inf:
        raise ConfigError(f"--timeout must be more than 0 seconds, not {timeout_s}")
    store = serving_store(directory, source=source, endpoint_url=endpoint_url)
    if accept_requests and not isinstance(store, LocalStore):
        raise ConfigError("--accept-requests needs a local index directory (requests are written into it)")
    options = ServeOptions(
        host=host,
        port=port,
        basic_auth=parse_basic_auth(basic_auth) if basic_auth is not None else None,
        timeout_s=timeout_s,
        requests_root=store.root if accept_requests and isinstance(store, LocalStore) else None,
    )
    try:
        server = make_server(store, options)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    bound_host, bound_port = server.server_address[:2]
    announce(f"serving {store.description} at http://{bound_host!s}:{bound_port}/simple/")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
