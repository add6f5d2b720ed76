"""`factory serve`: a published index over HTTP, from a local directory or from a (private) S3 prefix.

Static hosting cannot negotiate; this server can, so a project URL answers PEP 691 JSON to clients that ask
for it (uv, recent pip) and PEP 503 HTML to the rest, with directory URLs, content types, Cache-Control and
optional HTTP basic auth. The access log goes to stderr and never contains credentials.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import shutil
import sys
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from factory import index
from factory.errors import ConfigError
from factory.stores import Store

_JSON_TYPES = {index.PYPI_JSON_TYPE, "application/vnd.pypi.simple.latest+json"}
_HTML_TYPES = {index.PYPI_HTML_TYPE, "application/vnd.pypi.simple.latest+html", "text/html", "*/*"}


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
            choice = (q, 2, index.PYPI_JSON_TYPE)
        elif media in {index.PYPI_HTML_TYPE, "application/vnd.pypi.simple.latest+html"}:
            choice = (q, 1, index.PYPI_HTML_TYPE)
        elif media in _HTML_TYPES:
            choice = (q, 0, index.HTML_TYPE)
        else:
            continue
        if best is None or choice[:2] > best[:2]:
            best = choice
    return best[2] if best else index.HTML_TYPE


def content_type_of(key: str) -> str:
    if key.endswith(".whl"):
        return "application/octet-stream"
    if key.endswith(".metadata"):
        return "text/plain; charset=utf-8"
    if key.endswith(".html"):
        return index.HTML_TYPE
    if key.endswith("/index.json") and key.startswith("simple/") and key != "simple/variants.json":
        return index.PYPI_JSON_TYPE
    if key.endswith(".json"):
        return "application/json"
    return "application/octet-stream"


def cache_control_of(key: str) -> str:
    return index.FILE_CACHE_CONTROL if key.startswith("files/") else index.PAGE_CACHE_CONTROL


def parse_basic_auth(value: str) -> tuple[str, str]:
    user, sep, password = value.partition(":")
    if not sep or not user:
        raise ConfigError("--basic-auth takes USER:PASSWORD")
    return user, password


def make_server(
    store: Store,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    basic_auth: tuple[str, str] | None = None,
    log: Callable[[str], None] | None = None,
) -> ThreadingHTTPServer:
    """An HTTP server for the index in `store` (call serve_forever(); port 0 picks a free port)."""
    write_log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    expected = None
    if basic_auth is not None:
        expected = base64.b64encode(f"{basic_auth[0]}:{basic_auth[1]}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        server_version = "wheel-factory"
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            write_log(f"{self.client_address[0]} {format % args}")

        def _authorized(self) -> bool:
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
            return hmac.compare_digest(token.strip().encode(), expected.encode())

        def _reply(
            self, status: HTTPStatus, body: bytes = b"", headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            if not self._authorized():
                self._reply(
                    HTTPStatus.UNAUTHORIZED,
                    b"authentication required\n",
                    {"WWW-Authenticate": 'Basic realm="wheel index"', "Content-Type": "text/plain"},
                )
                return
            raw_path = urlsplit(self.path).path
            path = unquote(raw_path).lstrip("/")
            if any(part.startswith(".") for part in path.split("/")) or "\\" in path:
                self._reply(HTTPStatus.BAD_REQUEST, b"bad path\n", {"Content-Type": "text/plain"})
                return
            headers = {"Vary": "Accept"}
            if path == "" or path.endswith("/"):
                kind = negotiate(self.headers.get("Accept"))
                is_simple_page = path.startswith("simple/") and path != "simple/"
                if kind == index.PYPI_JSON_TYPE and is_simple_page:
                    key = f"{path}index.json"
                else:
                    key = f"{path}index.html"
                    kind = kind if kind != index.PYPI_JSON_TYPE else index.HTML_TYPE
                headers["Content-Type"] = kind
            else:
                key = path
                headers["Content-Type"] = content_type_of(key)
            opened = store.open(key)
            if opened is None:
                if not key.endswith("index.html") and store.head(f"{key}/index.html") is not None:
                    self._reply(
                        HTTPStatus.MOVED_PERMANENTLY,
                        b"",
                        {"Location": raw_path + "/", "Content-Type": "text/plain"},
                    )
                    return
                self._reply(HTTPStatus.NOT_FOUND, b"not found\n", {"Content-Type": "text/plain"})
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

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server
