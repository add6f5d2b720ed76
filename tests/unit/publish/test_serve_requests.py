"""`factory serve --accept-requests` on loopback, in this process: what it refuses and how."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from factory.core.errors import ConfigError
from factory.plan.variantrequest import FORMAT, parse
from factory.publish.serve import ServeOptions, make_server, serve
from factory.publish.stores import LocalStore

WAIT_S = 30.0
GOOD = json.dumps({"format": FORMAT, "python": "3.12", "cuda": "13.0", "torch": "2.14"}).encode()


@pytest.fixture
def index_root(tmp_path: Path) -> Path:
    (tmp_path / "simple").mkdir()
    (tmp_path / "simple" / "index.html").write_text("\n")
    return tmp_path


@contextmanager
def start(root: Path, **options: object) -> Iterator[int]:
    server = make_server(LocalStore(root), ServeOptions(port=0, **options), log=lambda line: None)  # type: ignore[arg-type]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(WAIT_S)


def post(port: int, body: bytes = GOOD, path: str = "/_requests/", **headers: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **headers})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_without_accept_requests_a_post_is_405(index_root: Path) -> None:
    with start(index_root) as port:
        assert post(port)[0] == 405
    assert not (index_root / "_requests").exists()


def test_a_request_is_stored_once_by_its_hash(index_root: Path) -> None:
    with start(index_root, requests_root=index_root) as port:
        status, said = post(port)
        assert status == 201
        name = said.decode().strip() + ".json"
        assert post(port)[0] == 200
    assert [p.name for p in (index_root / "_requests").iterdir()] == [name]
    assert parse((index_root / "_requests" / name).read_bytes()).python == "3.12"


def test_the_store_is_bounded(index_root: Path) -> None:
    with start(index_root, requests_root=index_root, max_requests=1) as port:
        assert post(port)[0] == 201
        assert post(port, GOOD.replace(b"3.12", b"3.13"))[0] == 507


def test_a_chunked_body_is_411_and_a_bad_length_400(index_root: Path) -> None:
    with (
        start(index_root, requests_root=index_root) as port,
        socket.create_connection(("127.0.0.1", port)) as s,
    ):
        s.sendall(
            b"POST /_requests/ HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        )
        assert s.recv(100).startswith(b"HTTP/1.1 411 ")
    with (
        start(index_root, requests_root=index_root) as port,
        socket.create_connection(("127.0.0.1", port)) as s,
    ):
        s.sendall(b"POST /_requests/ HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400 ")


def test_a_short_body_is_timed_out_not_stored(index_root: Path) -> None:
    with (
        start(index_root, requests_root=index_root, timeout_s=0.5) as port,
        socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as s,
    ):
        s.sendall(
            b"POST /_requests/ HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        assert s.recv(100) == b""  # the server ends the connection at its deadline, answering nothing
    assert not (index_root / "_requests").exists() or not any((index_root / "_requests").iterdir())


def test_requests_need_the_basic_auth_user(index_root: Path) -> None:
    with start(index_root, requests_root=index_root, basic_auth=("u", "p")) as port:
        assert post(port)[0] == 401
        token = base64.b64encode(b"u:p").decode()
        assert post(port, Authorization=f"Basic {token}")[0] == 201


def test_a_flood_from_one_client_is_429(index_root: Path) -> None:
    with start(index_root, requests_root=index_root, request_rate=(2, 100, 3600.0)) as port:
        assert post(port)[0] == 201
        assert post(port, b"nonsense")[0] == 400  # counted too
        assert post(port)[0] == 429


def test_accept_requests_needs_a_local_index() -> None:
    with pytest.raises(ConfigError, match="--accept-requests needs a local index"):
        serve(Path("."), source="s3://bucket/prefix", accept_requests=True, announce=print)


def test_a_request_for_another_platform_is_stored_as_such_and_a_bad_platform_is_400(index_root: Path) -> None:
    arm = json.dumps({**json.loads(GOOD), "platform": "aarch64"}).encode()
    with start(index_root, requests_root=index_root) as port:
        status, said = post(port, arm)
        assert status == 201
        name = said.decode().strip() + ".json"
        assert post(port)[0] == 201  # the default platform's request is another one
        status, said = post(port, arm.replace(b"aarch64", b"sparc"))
        assert status == 400
        assert said == b"bad request: platform 'sparc' is not one of x86_64, aarch64\n"
    assert len(list((index_root / "_requests").iterdir())) == 2
    assert parse((index_root / "_requests" / name).read_bytes()).platform.name == "aarch64"
