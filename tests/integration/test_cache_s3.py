"""The compile cache's sync with an S3 store (moto in server mode over HTTP): the union, never an overwrite,
nothing but the layout's files, and nothing its signature or content does not vouch for; about 2 s."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from factory.cache import sync as cache
from factory.container import compilecache
from factory.publish.stores import S3Store
from factory.trust import cachekeys

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


KEY = cachekeys.Keyring(signing=Ed25519PrivateKey.generate(), writes_store=True)
DOMAIN, OTHER_DOMAIN = "d" * 64, "e" * 64


def entry(data: bytes, dk: str) -> tuple[compilecache.Entry, bytes]:
    inputs = (("@JOB@/src/a.cu", "0" * 64),)
    made = compilecache.Entry(
        direct_key=dk,
        result_key=compilecache.result_key(dk, inputs),
        inputs=inputs,
        object_sha256=hashlib.sha256(data).hexdigest(),
        object_size=len(data),
        depfile=None,
        created=1.0,
    )
    return made, data


def keys_of(made: compilecache.Entry, domain: str = DOMAIN) -> tuple[str, str]:
    return (
        cache.store_key(domain, compilecache.object_relative(made.object_sha256)),
        cache.store_key(domain, compilecache.manifest_relative(made.direct_key, made.result_key)),
    )


def put_entry(root: Path, made: compilecache.Entry, data: bytes, *, keyring: cachekeys.Keyring = KEY) -> None:
    obj, manifest = keys_of(made)
    for key, body in (
        (obj, data),
        (manifest, cachekeys.signed_manifest(made, domain=DOMAIN, keyring=keyring)),
    ):
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(body)


def test_two_machines_share_a_cache_through_s3_and_take_only_what_they_can_verify(
    s3: tuple[str, Any], tmp_path: Path
) -> None:
    endpoint, client = s3
    prefix = "team/idx/_cache/compile"
    store = f"s3://cache-store/{prefix}"
    honest, honest_data = entry(b"honest object", "a" * 64)
    a, b = tmp_path / "a", tmp_path / "b"
    put_entry(a, honest, honest_data)
    # a writer of the store without the key: an unsigned manifest, one signed with its own key, and an object
    # whose bytes are not its name's
    forged, forged_data = entry(b"planted object", "b" * 64)
    other_key, _ = entry(b"planted object 2", "c" * 64)
    f_obj, f_manifest = keys_of(forged)
    k_obj, k_manifest = keys_of(other_key)
    bad_obj = cache.store_key(DOMAIN, compilecache.object_relative("f" * 64))
    unsigned = compilecache.manifest_json(forged).encode()
    theirs = cachekeys.signed_manifest(
        other_key,
        domain=DOMAIN,
        keyring=cachekeys.Keyring(signing=Ed25519PrivateKey.generate(), writes_store=True),
    )
    for key, body in (
        (f_obj, forged_data), (f_manifest, unsigned), (k_obj, b"planted object 2"), (k_manifest, theirs),
        (bad_obj, b"not the bytes of its name"), ("team/idx/simple/index.html", b"the index's"),
    ):  # fmt: skip
        client.put_object(
            Bucket="cache-store", Key=f"{prefix}/{key}" if "simple" not in key else key, Body=body
        )
    a_config = cache.CacheConfig(local=a, store=store, endpoint_url=endpoint)
    with cache.CacheSync(a_config, keyring=KEY) as sync:
        sync.before_job("j1", DOMAIN)
        sent = sync.upload()
    assert sent.files == 2 and sent.failed == 0
    h_obj, h_manifest = keys_of(honest)
    listed = {o["Key"] for o in client.list_objects_v2(Bucket="cache-store", Prefix=prefix)["Contents"]}
    assert {f"{prefix}/{h_obj}", f"{prefix}/{h_manifest}"} <= listed
    # machine A took no manifest it cannot verify, and no object only such manifests (or none) name
    assert cache.local_files(a) == {h_obj, h_manifest}
    got = cache.pull(S3Store("cache-store", prefix, endpoint_url=endpoint), b, keyring=KEY)
    assert got.failed == 2  # the unsigned manifest, the other key's
    assert cache.local_files(b) == cache.local_files(a)
    # a reader (the store's public key only) takes the same, and sends nothing up
    reader = cachekeys.Keyring(
        signing=Ed25519PrivateKey.generate(), writes_store=False, trusted=(KEY.signing.public_key(),)
    )
    before = {o["Key"] for o in client.list_objects_v2(Bucket="cache-store", Prefix=prefix)["Contents"]}
    with cache.CacheSync(cache.CacheConfig(local=tmp_path / "r", store=store, endpoint_url=endpoint),
                         keyring=reader) as sync:  # fmt: skip
        sync.before_job("j1", DOMAIN)
        put_entry(tmp_path / "r", *entry(b"the reader's own", "d" * 64), keyring=reader)
        assert sync.upload().files == 0
    assert cache.local_files(tmp_path / "r") - cache.local_files(a) != set()
    after = {o["Key"] for o in client.list_objects_v2(Bucket="cache-store", Prefix=prefix)["Contents"]}
    assert after == before and {h_obj, h_manifest} <= cache.local_files(tmp_path / "r")
    assert (b / h_manifest).read_bytes() == (a / h_manifest).read_bytes()
    # another domain's builds see none of it
    assert cache.pull(
        S3Store("cache-store", prefix, endpoint_url=endpoint), tmp_path / "c", keyring=KEY,
        remote=cache.remote_files(S3Store("cache-store", prefix, endpoint_url=endpoint), OTHER_DOMAIN),
    ).files == 0  # fmt: skip
