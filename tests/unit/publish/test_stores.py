"""The local store's compare-and-swap contract (the S3 store is tested against moto in integration tests)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from factory.core.errors import ConfigError
from factory.publish.stores import LocalStore, PreconditionFailed, S3Store, compare_and_swap, open_store

KW = {"content_type": "text/html", "cache_control": "no-cache"}


def test_put_get_and_etag_is_sha256(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    etag = store.put("a/b.txt", b"hello", **KW)
    assert etag == hashlib.sha256(b"hello").hexdigest()
    blob = store.get("a/b.txt")
    assert blob is not None and (blob.data, blob.etag) == (b"hello", etag)
    assert store.get("missing") is None
    head = store.head("a/b.txt")
    assert head is not None and head.size == 5 and head.sha256 == etag


def test_if_none_match_refuses_existing(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put("k", b"one", if_none_match=True, **KW)
    with pytest.raises(PreconditionFailed):
        store.put("k", b"two", if_none_match=True, **KW)
    assert (tmp_path / "k").read_bytes() == b"one"


def test_if_match_needs_current_etag(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    first = store.put("k", b"one", **KW)
    second = store.put("k", b"two", if_match=first, **KW)
    with pytest.raises(PreconditionFailed):
        store.put("k", b"three", if_match=first, **KW)
    assert store.put("k", b"three", if_match=second, **KW)
    with pytest.raises(PreconditionFailed):
        store.put("absent", b"x", if_match=first, **KW)


def test_put_from_file_and_no_temporaries_left(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 3_000_000)
    store = LocalStore(tmp_path / "idx")
    store.put("files/v/w.whl", src, **KW)
    with pytest.raises(PreconditionFailed):
        store.put("files/v/w.whl", src, if_none_match=True, **KW)
    assert sorted(p.name for p in (tmp_path / "idx/files/v").iterdir()) == ["w.whl"]
    assert store.sha256_of("files/v/w.whl") == hashlib.sha256(src.read_bytes()).hexdigest()


def test_directory_key_reads_index_html(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put("simple/index.html", b"<html>", **KW)
    blob = store.get("simple/")
    assert blob is not None and blob.data == b"<html>"
    opened = store.open("simple/")
    assert opened is not None
    opened[0].close()


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "./a"])
def test_bad_keys_rejected(tmp_path: Path, key: str) -> None:
    with pytest.raises(ValueError):
        LocalStore(tmp_path).get(key)


def test_open_store_choices(tmp_path: Path) -> None:
    assert isinstance(open_store(str(tmp_path / "new")), LocalStore)
    s3 = open_store("s3://bkt/p", endpoint_url="http://127.0.0.1:1")
    assert isinstance(s3, S3Store) and s3.description == "s3://bkt/p"
    with pytest.raises(ConfigError, match="endpoint-url"):
        open_store(str(tmp_path), endpoint_url="http://x")
    with pytest.raises(ConfigError):
        open_store("https://example.com/idx")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        open_store(str(tmp_path / "file"))


@pytest.mark.parametrize("url", ["notaurl", "ftp://host", "http://", "s3.example.com"])
def test_an_endpoint_that_is_not_an_http_url_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError, match=r"^endpoint URL .*: not a URL of http:// or https://$"):
        S3Store("bucket", "prefix", endpoint_url=url)
    with pytest.raises(ConfigError, match="not a URL of"):
        open_store("s3://bucket/prefix", endpoint_url=url)


@pytest.mark.parametrize(
    ("url", "why"), [("http://a b", "Invalid endpoint"), ("http://[::1", "Invalid IPv6 URL")]
)
def test_an_endpoint_urllib_or_botocore_refuses_is_a_config_error(url: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        S3Store("bucket", "prefix", endpoint_url=url)


def test_compare_and_swap_creates_updates_and_leaves_alone(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    seen: list[bytes | None] = []

    def append(current: bytes | None) -> bytes:
        seen.append(current)
        return (current or b"") + b"x"

    assert compare_and_swap(store, "k", append, **KW)
    assert compare_and_swap(store, "k", append, **KW)
    assert seen == [None, b"x"]
    assert not compare_and_swap(store, "k", lambda current: None, **KW)
    blob = store.get("k")
    assert blob is not None and blob.data == b"xx"


def test_compare_and_swap_rereads_after_losing_a_race(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put("k", b"a", **KW)
    calls: list[bytes | None] = []

    def update(current: bytes | None) -> bytes:
        calls.append(current)
        if len(calls) == 1:  # another writer replaces the key between this read and this write
            store.put("k", b"b", **KW)
        return (current or b"") + b"+"

    assert compare_and_swap(store, "k", update, **KW)
    assert calls == [b"a", b"b"]
    blob = store.get("k")
    assert blob is not None and blob.data == b"b+"


def test_a_link_in_a_directory_store_is_never_followed(tmp_path: Path) -> None:
    # whoever else can write the store cannot make the factory read or write a host file through it
    secret = tmp_path / "secret"
    secret.write_bytes(b"host secret")
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "store"
    store = LocalStore(root)
    store.put("files/v/real.whl", b"wheel", **KW)
    (root / "files" / "v" / "evil.whl").symlink_to(secret)
    (root / "simple").mkdir()
    (root / "simple" / "x").symlink_to(outside, target_is_directory=True)
    (root / "linked").symlink_to(outside, target_is_directory=True)
    (outside / "inside.whl").write_bytes(b"not the store's")
    for read in (store.get, store.open, store.head, store.sha256_of):
        assert read("files/v/evil.whl") is None
        assert read("simple/x/") is None
    assert sorted(store.keys("files/")) == ["files/v/real.whl"]
    with pytest.raises(OSError):
        store.put("simple/x/index.html", b"page", **KW)
    with pytest.raises(OSError):
        store.put("linked/a.whl", b"w", **KW)
    assert sorted(p.name for p in outside.iterdir()) == ["inside.whl"]
    assert secret.read_bytes() == b"host secret"


def test_a_fifo_in_a_directory_store_is_no_file(tmp_path: Path) -> None:
    root = tmp_path / "store"
    LocalStore(root).put("files/v/a.whl", b"w", **KW)
    os.mkfifo(root / "files" / "v" / "b.whl")
    store = LocalStore(root)
    assert store.open("files/v/b.whl") is None and store.get("files/v/b.whl") is None  # no blocking open
    assert sorted(store.keys("files/")) == ["files/v/a.whl"]
