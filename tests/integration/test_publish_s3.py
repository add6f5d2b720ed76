"""Publishing to S3 (moto in server mode over HTTP); pip and uv install straight from the bucket URL."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from publish_helpers import (
    KILL_AFTER_METADATA,
    LABEL_NEW,
    LABEL_OLD,
    VID_NEW,
    VID_OLD,
    assert_consistent,
    fresh_venv,
    installed_label,
    make_wheel,
    page_files,
    pip_install,
    publisher_script,
    sha256_file,
    uv_install,
)

from factory.core import simpleapi
from factory.core.errors import PublishError
from factory.publish import index
from factory.publish.publisher import publish_wheels, published_files
from factory.publish.stores import S3Store
from factory.wheel import record as buildrecord

pytestmark = pytest.mark.integration
HERE = Path(__file__).resolve().parent
FACTORY = str(Path(sys.executable).with_name("factory"))
CREDS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class _Requests(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@dataclass
class Moto:
    endpoint: str
    client: Any
    requests: _Requests
    buckets: list[str] = field(default_factory=list)

    def bucket(self, name: str) -> str:
        """A new public-read bucket (anonymous GETs, as a static index host would allow)."""
        self.client.create_bucket(Bucket=name, ACL="public-read")
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": "*",
                    "Action": "s3:GetObject",
                    "Resource": f"arn:aws:s3:::{name}/*",
                }
            ],
        }
        self.client.put_bucket_policy(Bucket=name, Policy=json.dumps(policy))
        return name

    def keys(self, bucket: str, prefix: str) -> list[str]:
        out: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
            out += [o["Key"].removeprefix(prefix + "/") for o in page.get("Contents", [])]
        return out

    def getter(self, bucket: str, prefix: str) -> Callable[[str], bytes | None]:
        def get(key: str) -> bytes | None:
            try:
                return self.client.get_object(Bucket=bucket, Key=f"{prefix}/{key}")["Body"].read()
            except self.client.exceptions.NoSuchKey:
                return None

        return get


@pytest.fixture(scope="module")
def moto() -> Iterator[Moto]:
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        from conftest import require

        require(False, f"moto server mode ({exc.name})")
        raise
    saved = {k: os.environ.get(k) for k in CREDS}
    os.environ.update(CREDS)
    handler = _Requests()
    logging.getLogger("werkzeug").addHandler(handler)
    logging.getLogger("werkzeug").setLevel(logging.INFO)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        yield Moto(endpoint=endpoint, client=boto3.client("s3", endpoint_url=endpoint), requests=handler)
    finally:
        server.stop()
        logging.getLogger("werkzeug").removeHandler(handler)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def published(moto: Moto, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("s3wheels")
    wheels = {VID_NEW: make_wheel(tmp, label=LABEL_NEW), VID_OLD: make_wheel(tmp, label=LABEL_OLD)}
    moto.bucket("wheels")
    publish_wheels(list(wheels.values()), to="s3://wheels/team/idx", endpoint_url=moto.endpoint)
    return wheels


def test_layout_content_types_and_directory_keys(moto: Moto, published: dict[str, Path]) -> None:
    keys = moto.keys("wheels", "team/idx")
    page_dir = f"simple/{VID_NEW}/tinyvar/"
    for key in (
        page_dir,
        f"{page_dir}index.html",
        f"{page_dir}index.json",
        f"simple/{VID_NEW}/",
        "simple/",
        "",
    ):
        assert key in keys, key
    assert_consistent(moto.getter("wheels", "team/idx"), keys)

    def head(key: str) -> dict[str, Any]:
        return moto.client.head_object(Bucket="wheels", Key=f"team/idx/{key}")

    wheel = published[VID_NEW].name
    assert head(f"files/{VID_NEW}/{wheel}")["ContentType"] == "application/octet-stream"
    assert "immutable" in head(f"files/{VID_NEW}/{wheel}")["CacheControl"]
    assert "immutable" in head(f"files/{VID_NEW}/{wheel}.metadata")["CacheControl"]
    assert head(f"files/{VID_NEW}/{wheel}")["Metadata"]["sha256"] == sha256_file(published[VID_NEW])
    for key in (page_dir, f"{page_dir}index.html"):
        assert head(key)["ContentType"] == index.HTML_TYPE
        assert head(key)["CacheControl"] == index.PAGE_CACHE_CONTROL
    assert head(f"{page_dir}index.json")["ContentType"] == simpleapi.PYPI_JSON_TYPE
    get = moto.getter("wheels", "team/idx")
    assert get(page_dir) == get(f"{page_dir}index.html")


def test_wheel_variants_on_s3_install_straight_from_the_bucket(
    moto: Moto, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The experimental variant channel (publish --variants) on S3: its pages under their directory keys
    too, the variant wheels immutable and each release's variants.json revalidated (it grows), and real uv
    (its preview; a stood-in GPU, NV_VARIANT_PROVIDER_FORCE_*) picks the variant from the bucket URL."""
    from factory.publish import wheelvariants

    wheels = [make_wheel(tmp_path / "w", label=LABEL_NEW), make_wheel(tmp_path / "w", label=LABEL_OLD)]
    moto.bucket("variants")
    publish_wheels(wheels, to="s3://variants/idx", endpoint_url=moto.endpoint, variants=True)
    keys = moto.keys("variants", "idx")
    group = "variants/torch2.10-abi1/"
    for key in (
        "variants/",
        group + "simple/",
        group + "simple/tinyvar/",
        group + "simple/tinyvar/index.html",
    ):
        assert key in keys, key

    def head(key: str) -> dict[str, Any]:
        return moto.client.head_object(Bucket="variants", Key=f"idx/{key}")

    (wheel,) = [k for k in keys if k.startswith(group + "files/") and k.endswith(".whl")]
    assert "immutable" in head(wheel)["CacheControl"]
    assert head(group + "files/tinyvar-0.1.0-variants.json")["CacheControl"] == index.PAGE_CACHE_CONTROL
    assert head(group + "simple/tinyvar/")["ContentType"] == index.HTML_TYPE
    monkeypatch.setenv("NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION", "12.8")
    monkeypatch.setenv("NV_VARIANT_PROVIDER_FORCE_SM_ARCH", "9.0")
    venv = fresh_venv(tmp_path / "venv", tool="uv")
    url = f"{moto.endpoint}/variants/idx/{group}simple/"
    proc = uv_install(venv, url, "--preview-features", wheelvariants.PREVIEW_FEATURE, "tinyvar")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert installed_label(venv) == LABEL_OLD


def test_immutability_on_s3(moto: Moto, published: dict[str, Path], tmp_path: Path) -> None:
    again = publish_wheels([published[VID_NEW]], to="s3://wheels/team/idx", endpoint_url=moto.endpoint)
    assert [f.status for f in again.files] == ["unchanged"] and again.pages_written == ()
    other = make_wheel(tmp_path, label=LABEL_NEW, payload="other bytes")
    with pytest.raises(PublishError, match="refusing to overwrite"):
        publish_wheels([other], to="s3://wheels/team/idx", endpoint_url=moto.endpoint)
    stored = moto.getter("wheels", "team/idx")(f"files/{VID_NEW}/{other.name}")
    assert stored == published[VID_NEW].read_bytes()


@pytest.mark.parametrize("tool", ["pip", "uv"])
def test_install_straight_from_bucket_url(
    moto: Moto, published: dict[str, Path], tmp_path: Path, tool: str
) -> None:
    venv = fresh_venv(tmp_path / "venv", tool=tool)
    index_url = f"{moto.endpoint}/wheels/team/idx/simple/{VID_OLD}/"
    start = len(moto.requests.lines)
    proc = (pip_install if tool == "pip" else uv_install)(venv, index_url, "tinyvar")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        installed_label(venv) == LABEL_OLD
    )  # the lower label: a shared index would have handed out the other
    served = "\n".join(moto.requests.lines[start:])
    assert (
        f"GET /wheels/team/idx/files/{VID_OLD}/tinyvar-0.1.0+{LABEL_OLD}-py3-none-any.whl.metadata" in served
    )
    if tool == "pip":
        assert "Obtaining dependency information for tinyvar from" in proc.stdout


def test_pip_require_hashes_from_bucket(moto: Moto, published: dict[str, Path], tmp_path: Path) -> None:
    venv = fresh_venv(tmp_path / "venv", tool="pip")
    req = tmp_path / "req.txt"
    req.write_text(f"tinyvar==0.1.0+{LABEL_NEW} --hash=sha256:{sha256_file(published[VID_NEW])}\n")
    proc = pip_install(
        venv, f"{moto.endpoint}/wheels/team/idx/simple/{VID_NEW}/", "--require-hashes", "-r", str(req)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert installed_label(venv) == LABEL_NEW


def test_uv_require_hashes_from_bucket(moto: Moto, published: dict[str, Path], tmp_path: Path) -> None:
    venv = fresh_venv(tmp_path / "venv", tool="uv")
    req = tmp_path / "req.txt"
    req.write_text(f"tinyvar==0.1.0+{LABEL_OLD} --hash=sha256:{'1' * 64}\n")
    url = f"{moto.endpoint}/wheels/team/idx/simple/{VID_OLD}/"
    bad = uv_install(venv, url, "--require-hashes", "-r", str(req))
    assert bad.returncode != 0 and "hash" in bad.stderr.lower()
    req.write_text(f"tinyvar==0.1.0+{LABEL_OLD} --hash=sha256:{sha256_file(published[VID_OLD])}\n")
    good = uv_install(venv, url, "--require-hashes", "-r", str(req))
    assert good.returncode == 0, good.stdout + good.stderr
    assert installed_label(venv) == LABEL_OLD


def test_serve_from_s3(moto: Moto, published: dict[str, Path], tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [FACTORY, "serve", "--from", "s3://wheels/team/idx", "--endpoint-url", moto.endpoint, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "log").open("w"),
        text=True,
        env={**os.environ, **CREDS},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("serving s3://wheels/team/idx at "), line
        url = line.split(" at ", 1)[1].strip()
        venv = fresh_venv(tmp_path / "venv", tool="uv")
        result = uv_install(venv, f"{url}{VID_NEW}/", "tinyvar")
        assert result.returncode == 0, result.stdout + result.stderr
        assert installed_label(venv) == LABEL_NEW
        assert ".whl.metadata" in (tmp_path / "log").read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_concurrent_publishers_on_s3_lose_nothing(moto: Moto, tmp_path: Path) -> None:
    moto.bucket("race")
    workers, rounds = 4, 20
    to = "s3://race/idx"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", publisher_script(HERE, to, moto.endpoint, tmp_path, w, rounds)],
            env={**os.environ, **CREDS},
        )
        for w in range(workers)
    ]
    assert [p.wait() for p in procs] == [0] * workers
    expected = {
        f"tinyvar-1.{w}.{r}+{LABEL_NEW}-py3-none-any.whl" for w in range(workers) for r in range(rounds)
    }
    get = moto.getter("race", "idx")
    listed = page_files(get, VID_NEW, "tinyvar")
    assert len(listed) == 2
    for names in listed.values():
        assert names == expected
    html_dir_key = get(f"simple/{VID_NEW}/tinyvar/")
    assert html_dir_key == get(f"simple/{VID_NEW}/tinyvar/index.html")
    assert_consistent(get, moto.keys("race", "idx"))


def test_interrupted_publish_on_s3(moto: Moto, tmp_path: Path) -> None:
    moto.bucket("halt")
    first = make_wheel(tmp_path / "a", version="0.1.0")
    publish_wheels([first], to="s3://halt/idx", endpoint_url=moto.endpoint)
    second = make_wheel(tmp_path / "b", version="0.2.0")
    proc = subprocess.run(
        [sys.executable, "-c", KILL_AFTER_METADATA, "s3://halt/idx", moto.endpoint, str(second)],
        env={**os.environ, **CREDS},
    )
    assert proc.returncode == -9
    get = moto.getter("halt", "idx")
    assert get(f"files/{VID_NEW}/{second.name}") == second.read_bytes()
    assert all(names == {first.name} for names in page_files(get, VID_NEW, "tinyvar").values())
    assert_consistent(get, moto.keys("halt", "idx"))
    publish_wheels([second], to="s3://halt/idx", endpoint_url=moto.endpoint)
    assert all(names == {first.name, second.name} for names in page_files(get, VID_NEW, "tinyvar").values())
    assert_consistent(get, moto.keys("halt", "idx"))


def test_credentials_never_printed(tmp_path: Path) -> None:
    make_wheel(tmp_path / "wh")
    secret = "SECRETVALUE-do-not-print-1234"
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "AKIDTESTNOTREAL",
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_MAX_ATTEMPTS": "1",
    }
    proc = subprocess.run(
        [
            FACTORY,
            "publish",
            str(tmp_path / "wh"),
            "--to",
            "s3://bkt/p",
            "--endpoint-url",
            "http://127.0.0.1:9",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: reading s3://bkt/p") or proc.stderr.startswith(
        "error: writing to s3://bkt/p"
    )
    assert len(proc.stderr.strip().splitlines()) == 1
    assert secret not in proc.stdout + proc.stderr and "AKIDTESTNOTREAL" not in proc.stdout + proc.stderr


def test_a_published_wheel_is_found_on_s3(moto: Moto, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, label=LABEL_NEW, tag="cp311-cp311-linux_x86_64")
    moto.bucket("found")
    store = S3Store("found", "idx", endpoint_url=moto.endpoint)
    assert published_files(store, project="tinyvar", variant_id=VID_NEW) == ()  # no page yet: no such key
    publish_wheels([wheel], to="s3://found/idx", endpoint_url=moto.endpoint)
    assert published_files(store, project="tinyvar", variant_id=VID_NEW) == (wheel.name,)


def test_the_build_record_is_written_once_beside_the_wheel_on_s3(moto: Moto, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, label=LABEL_NEW, tag="cp311-cp311-linux_x86_64", payload="record")
    moto.bucket("records")

    def report(name: str, hits: int) -> Path:
        job = {"variant_id": VID_NEW, "python": "3.11", "result": "ok", "package": "tinyvar",
               "wheel": wheel.name, "compiles_cached": hits, "compiles_compiled": 1}  # fmt: skip
        doc = {"started": 1796601600, "finished": 1796601700, "compile_cache": "s3", "jobs": [job]}
        (tmp_path / name).write_text(json.dumps(doc))
        return tmp_path / name

    publish_wheels([wheel], to="s3://records/idx", endpoint_url=moto.endpoint, report=report("a.json", 4))
    get = moto.getter("records", "idx")
    key = index.build_record_path(VID_NEW, wheel.name)
    first = get(key)
    assert first is not None
    record = buildrecord.parse(first)
    assert (record.sha256, record.compile_cache, record.cache_hits) == (sha256_file(wheel), "s3", 4)
    assert record.provenance_sha256 is None  # this wheel carries none
    head = moto.client.head_object(Bucket="records", Key=f"idx/{key}")
    assert head["ContentType"] == "application/json" and "immutable" in head["CacheControl"]
    publish_wheels([wheel], to="s3://records/idx", endpoint_url=moto.endpoint, report=report("b.json", 0))
    assert get(key) == first


def _one_line(proc: subprocess.CompletedProcess[str], code: int) -> str:
    assert proc.returncode == code, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_credentials_in_the_endpoint_url_are_never_shown(tmp_path: Path) -> None:
    make_wheel(tmp_path / "wh")
    endpoint = "http://user:PASSWORD-xyz@127.0.0.1:9"
    proc = subprocess.run(
        [FACTORY, "publish", str(tmp_path / "wh"), "--to", "s3://bkt/x", "--endpoint-url", endpoint],
        capture_output=True,
        text=True,
        env={**os.environ, **CREDS, "AWS_MAX_ATTEMPTS": "1"},
        timeout=300,
    )
    line = _one_line(proc, 1)
    assert "http://127.0.0.1:9/" in line  # the endpoint is named, without what came before the @
    assert "PASSWORD-xyz" not in proc.stdout + proc.stderr and "user" not in line


@pytest.mark.parametrize(
    ("to", "why"),
    [
        ("s3://dotdot/../../etc", "segment ('..')"),
        ("s3://dotdot/a//b", "segment ('')"),
        ("s3://dotdot/./a", "segment ('.')"),
        ("s3://Bad_Bucket!/x", "bucket 'Bad_Bucket!'"),
    ],
)
def test_s3_destinations_that_escape_or_cannot_exist_are_usage_errors(
    moto: Moto, tmp_path: Path, to: str, why: str
) -> None:
    if "dotdot" not in {b["Name"] for b in moto.client.list_buckets().get("Buckets", [])}:
        moto.client.create_bucket(Bucket="dotdot")
    make_wheel(tmp_path / "wh")
    proc = subprocess.run(
        [FACTORY, "publish", str(tmp_path / "wh"), "--to", to, "--endpoint-url", moto.endpoint],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert why in _one_line(proc, 2)
    assert moto.client.list_objects_v2(Bucket="dotdot").get("KeyCount", 0) == 0


def test_damaged_s3_state_is_named_and_repair_rebuilds_it(moto: Moto, tmp_path: Path) -> None:
    moto.bucket("mended")
    first = make_wheel(tmp_path / "a", label=LABEL_NEW)
    publish_wheels([first], to="s3://mended/idx", endpoint_url=moto.endpoint)
    key = f"idx/simple/{VID_NEW}/tinyvar/index.json"
    moto.client.put_object(Bucket="mended", Key=key, Body=b"not json at all")
    moto.client.put_object(Bucket="mended", Key="idx/matrix.json", Body=b'{"cells": "no"}')
    second = make_wheel(tmp_path / "b", label=LABEL_NEW, version="0.2.0")
    with pytest.raises(PublishError, match=r"damaged .*factory index repair --to s3://mended/idx"):
        publish_wheels([second], to="s3://mended/idx", endpoint_url=moto.endpoint)
    proc = subprocess.run(
        [FACTORY, "index", "repair", "--to", "s3://mended/idx", "--endpoint-url", moto.endpoint],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    get = moto.getter("mended", "idx")
    assert page_files(get, VID_NEW, "tinyvar") == {
        f"simple/{VID_NEW}/tinyvar/index.json": {first.name},
        f"simple/{VID_NEW}/tinyvar/index.html": {first.name},
    }
    assert get(f"simple/{VID_NEW}/tinyvar/") == get(f"simple/{VID_NEW}/tinyvar/index.html")
    publish_wheels([second], to="s3://mended/idx", endpoint_url=moto.endpoint)
    assert page_files(get, VID_NEW, "tinyvar")[f"simple/{VID_NEW}/tinyvar/index.html"] == {
        first.name,
        second.name,
    }
    assert_consistent(get, moto.keys("mended", "idx"))
