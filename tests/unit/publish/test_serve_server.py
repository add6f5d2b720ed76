"""`factory serve`'s server on loopback, in this process, against odd clients: half-sent and dripped
requests, over-long paths, control characters, an S3 endpoint that is down."""

from __future__ import annotations

import http.client
import os
import queue
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from factory.core.urls import MAX_LOG_LINE, printable
from factory.publish.serve import ServeOptions, make_server
from factory.publish.stores import LocalStore, S3Store, Store

WAIT_S = 30.0  # generous: the events below take well under a second on an idle machine


@dataclass
class Running:
    port: int
    log: queue.Queue[str]

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=WAIT_S)

    def get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT_S)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def wait_for_line(self, needle: str) -> str:
        deadline = time.monotonic() + WAIT_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.log.get(timeout=left)
            except queue.Empty:
                break
            if needle in line:
                return line
        raise AssertionError(f"no log line with {needle!r} within {WAIT_S} s")


@pytest.fixture
def index_root(tmp_path: Path) -> Path:
    (tmp_path / "simple").mkdir()
    (tmp_path / "simple" / "index.html").write_text("<a href='v1/'>v1</a>\n")
    return tmp_path


@contextmanager
def start(store: Store, timeout_s: float = 30.0) -> Iterator[Running]:
    log: queue.Queue[str] = queue.Queue()
    server = make_server(store, ServeOptions(port=0, timeout_s=timeout_s), log=log.put)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Running(port=server.server_address[1], log=log)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(WAIT_S)


@pytest.fixture
def served(index_root: Path) -> Iterator[Running]:
    with start(LocalStore(index_root), timeout_s=0.5) as running:
        yield running


def closed_by_server(sock: socket.socket, drip: bytes = b"") -> bool:
    """Whether the server closes `sock` within WAIT_S; `drip` is sent a byte every 0.1 s meanwhile."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        readable, _, _ = select.select([sock], [], [], 0.1)
        if readable:
            try:
                return sock.recv(65536) == b""
            except ConnectionResetError:
                return True
        if drip:
            try:
                sock.sendall(drip[:1])
            except (BrokenPipeError, ConnectionResetError):
                return True
            drip = drip[1:] or drip
    return False


def test_a_half_sent_request_is_timed_out(served: Running) -> None:
    with served.connect() as sock:
        sock.sendall(b"GET /simple/ HTTP/1.1\r\nHost: x\r\n")  # no blank line: the head never ends
        assert closed_by_server(sock)
    served.wait_for_line("timed out")
    assert served.get("/simple/")[0] == 200  # and the server goes on serving


def test_a_dripped_request_head_is_timed_out_as_a_whole(served: Running) -> None:
    """A byte every 0.1 s keeps each read under the timeout; the head as a whole still runs out of time."""
    with served.connect() as sock:
        sock.sendall(b"GET /simple/ HTTP/1.1\r\n")
        assert closed_by_server(sock, drip=b"X-Slow: yes\r\n")
    served.wait_for_line("timed out")


def test_an_idle_keep_alive_connection_is_closed(served: Running) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=WAIT_S)
    conn.request("GET", "/simple/")
    assert conn.getresponse().read().startswith(b"<a href")
    assert conn.sock is not None
    assert closed_by_server(conn.sock)
    conn.close()


@pytest.mark.parametrize(
    "path",
    [
        "/simple/" + "a" * 60_000 + "/",
        "/files/v1/" + "b" * 300 + ".whl",
        "/simple/" + "c/" * 600,
    ],
)
def test_an_over_long_path_is_414(served: Running, path: str, capfd: pytest.CaptureFixture[str]) -> None:
    status, body = served.get(path)
    assert status == 414 and body == b"request-uri too long\n"
    line = served.wait_for_line('" 414 ')
    assert len(line) <= MAX_LOG_LINE
    assert "Traceback" not in capfd.readouterr().err


def test_control_characters_are_escaped_in_the_log(served: Running) -> None:
    with served.connect() as sock:
        sock.sendall(b"GET /\x1b[2Jx\x9b\rz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 400")
    line = served.wait_for_line('" 400 ')
    assert "\x1b" not in line and "\r" not in line and "\x9b" not in line
    assert "/\\x1b[2Jx\\x9b\\x0dz" in line


def test_printable() -> None:
    assert printable("a\x1bb\nc\\d\x7f") == "a\\x1bb\\x0ac\\x5cd\\x7f"
    assert printable("reading: http://me:hunter2@host:9/b/k failed") == "reading: http://host:9/b/k failed"
    assert len(printable("x" * 100_000)) == MAX_LOG_LINE


def test_an_s3_endpoint_that_is_down_is_502_in_one_line(
    index_root: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    store = S3Store("wheels", "idx", endpoint_url=f"http://alice:PASSWORD@127.0.0.1:{closed_port}")
    with start(store) as running:
        status, body = running.get("/simple/")
        assert status == 502 and body == b"index store unavailable\n"
        line = running.wait_for_line('"GET /simple/ HTTP/1.1" 502')
        assert f"127.0.0.1:{closed_port}" in line and "PASSWORD" not in line and "alice" not in line
        assert running.log.empty()  # one line for the request, nothing besides it
    assert "Traceback" not in capfd.readouterr().err


def test_no_symbolic_link_leads_out_of_the_index(
    index_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Links to a file or a directory outside the root, at the end of a path or inside it, are not found;
    the files beside them still are."""
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret").write_text("SECRET\n")
    (outside / "index.html").write_text("SECRET PAGE\n")
    (index_root / "files" / "v1").mkdir(parents=True)
    (index_root / "files" / "v1" / "ok.whl").write_bytes(b"wheel")
    (index_root / "files" / "v1" / "evil.whl").symlink_to(outside / "secret")
    (index_root / "simple" / "etc").symlink_to(outside, target_is_directory=True)
    (index_root / "simple" / "inner.html").symlink_to(index_root / "simple" / "index.html")
    os.mkfifo(index_root / "files" / "v1" / "fifo.whl")
    with start(LocalStore(index_root)) as running:
        assert running.get("/files/v1/ok.whl") == (200, b"wheel")
        for path in (
            "/files/v1/evil.whl",
            "/simple/etc/secret",
            "/simple/etc/",
            "/simple/etc",
            "/simple/inner.html",  # even a link that stays inside: links are not the index's
            "/files/v1/fifo.whl",  # and what is not a regular file is not served (nor blocks the server)
        ):
            status, body = running.get(path)
            assert (status, b"SECRET" in body) == (404, False), path
    assert sorted(LocalStore(index_root).keys("files/")) == ["files/v1/ok.whl"]
