"""`factory serve` as users run it, against an S3 endpoint that is down or reached with credentials in its
URL, and an over-long path: each answered, one log line, no traceback, no password in any output."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from publish_helpers import LABEL_NEW, VID_NEW, make_wheel
from test_publish_s3 import CREDS, Moto, moto  # noqa: F401 -- moto is the S3 server fixture

from factory.publish.publisher import publish_wheels

pytestmark = pytest.mark.integration
FACTORY = str(Path(sys.executable).with_name("factory"))
PASSWORD = "Hunter2-secret"


@dataclass
class Serving:
    url: str  # http://127.0.0.1:PORT/
    stdout: str  # the first line
    stderr: Path

    def output(self) -> str:
        return self.stdout + self.stderr.read_text()


@contextmanager
def serving(tmp_path: Path, *args: str) -> Iterator[Serving]:
    stderr = tmp_path / "stderr"
    proc = subprocess.Popen(
        [FACTORY, "serve", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=stderr.open("w"),
        text=True,
        env={**os.environ, **CREDS},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("serving "), line + stderr.read_text()
        yield Serving(
            url=line.split(" at ", 1)[1].strip().removesuffix("simple/"), stdout=line, stderr=stderr
        )
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_s3_endpoint_down_is_502_in_one_line_without_the_password(tmp_path: Path) -> None:
    port = closed_port()
    endpoint = f"http://alice:{PASSWORD}@127.0.0.1:{port}"
    with serving(tmp_path, "--from", "s3://wheels/idx", "--endpoint-url", endpoint) as served:
        assert get(f"{served.url}simple/") == (502, b"index store unavailable\n")
        assert get(f"{served.url}files/v/x.whl")[0] == 502
    output = served.output()
    assert PASSWORD not in output and "alice" not in output and "Traceback" not in output
    lines = served.stderr.read_text().splitlines()
    assert len(lines) == 2, lines  # one per request
    assert '"GET /simple/ HTTP/1.1" 502' in lines[0] and f"http://127.0.0.1:{port}/" in lines[0]


def test_s3_endpoint_with_credentials_serves_and_never_shows_them(moto: Moto, tmp_path: Path) -> None:  # noqa: F811
    wheel = make_wheel(tmp_path / "wh", label=LABEL_NEW)
    moto.bucket("credentialed")
    publish_wheels([wheel], to="s3://credentialed/idx", endpoint_url=moto.endpoint)
    endpoint = moto.endpoint.replace("http://", f"http://alice:{PASSWORD}@")
    with serving(tmp_path, "--from", "s3://credentialed/idx", "--endpoint-url", endpoint) as served:
        status, body = get(f"{served.url}files/{VID_NEW}/{wheel.name.replace('+', '%2B')}")
        assert status == 200 and body == wheel.read_bytes()
        assert get(f"{served.url}simple/nothing/")[0] == 404
    output = served.output()
    assert output.startswith("serving s3://credentialed/idx at http://127.0.0.1:")
    assert PASSWORD not in output and "Traceback" not in output


def test_a_60000_character_path_is_414_without_a_traceback(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "wh", label=LABEL_NEW)
    publish_wheels([wheel], to=str(tmp_path / "idx"))
    with serving(tmp_path, str(tmp_path / "idx")) as served:
        assert get(f"{served.url}simple/{'a' * 60_000}/")[0] == 414
        assert get(f"{served.url}simple/")[0] == 200
    assert "Traceback" not in served.output()
    assert '" 414 ' in served.stderr.read_text()


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_bad_timeout_is_one_line(tmp_path: Path, value: str) -> None:
    proc = subprocess.run(
        [FACTORY, "serve", str(tmp_path), "--timeout", value], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "--timeout must be more than 0 seconds" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
