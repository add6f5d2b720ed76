"""The compile cache's sync with an S3 store (moto in server mode over HTTP): the union, never an overwrite,
and nothing but the layout's files; about 2 s."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from factory import cache
from factory.stores import S3Store

pytestmark = pytest.mark.integration
CREDS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="module")
def s3() -> Iterator[tuple[str, Any]]:
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        from conftest import require

        require(False, f"moto server mode ({exc.name})")
        raise
    saved = {k: os.environ.get(k) for k in CREDS}
    os.environ.update(CREDS)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="cache-store")
        yield endpoint, client
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


RK, DK, OTHER = "ab" + "1" * 62, "cd" + "3" * 62, "ef" + "5" * 62
OBJ, MANIFEST, THEIRS = f"v1/o/ab/{RK}", f"v1/m/cd/{DK}/{RK}.json", f"v1/o/ef/{OTHER}"


def put(root: Path, key: str, data: bytes) -> None:
    (root / key).parent.mkdir(parents=True, exist_ok=True)
    (root / key).write_bytes(data)


def test_two_machines_share_a_cache_through_s3(s3: tuple[str, Any], tmp_path: Path) -> None:
    endpoint, client = s3
    prefix = "team/idx/_cache/compile"
    client.put_object(Bucket="cache-store", Key=f"{prefix}/{THEIRS}", Body=b"theirs")
    client.put_object(Bucket="cache-store", Key="team/idx/simple/index.html", Body=b"the index's")
    a, b = tmp_path / "a", tmp_path / "b"
    put(a, OBJ, b"object")
    put(a, MANIFEST, b"{}")
    put(a, f"v1/o/ab/.tmp-{RK}-7-x", b"half")
    put(a, THEIRS, b"mine")
    config = cache.CacheConfig(local=a, store=f"s3://cache-store/{prefix}", endpoint_url=endpoint)
    with cache.CacheSync(config) as sync:
        sync.before_job("j1")
        sent = sync.upload()
    assert sent.files == 2 and sent.failed == 0
    listed = sorted(o["Key"] for o in client.list_objects_v2(Bucket="cache-store", Prefix=prefix)["Contents"])
    assert listed == [f"{prefix}/{MANIFEST}", f"{prefix}/{OBJ}", f"{prefix}/{THEIRS}"]
    assert client.get_object(Bucket="cache-store", Key=f"{prefix}/{THEIRS}")["Body"].read() == b"theirs"
    assert (a / THEIRS).read_bytes() == b"mine"
    got = cache.pull(S3Store("cache-store", prefix, endpoint_url=endpoint), b)
    assert (got.files, got.failed) == (3, 0)
    assert (b / OBJ).read_bytes() == b"object"
    assert cache.local_files(b) == cache.local_files(a)
