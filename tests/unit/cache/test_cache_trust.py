"""Who may add to the compile cache (factory/cache/sync.py, issue 31): the keys and the signatures that bind a
manifest to its trust domain, what the host takes from a build's outbox (a container that plants links,
FIFOs, lies about content or sizes), what it takes from a store someone else can write, and what a job's
domain directory may hold."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
from pathlib import Path, PurePosixPath

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from factory.cache import sync as cache
from factory.container import compilecache
from factory.core import leftovers
from factory.core.errors import ConfigError
from factory.publish.stores import LocalStore
from factory.trust import cachekeys, signing

KEY = cachekeys.Keyring(signing=Ed25519PrivateKey.generate(), writes_store=True)
OTHER_KEY = cachekeys.Keyring(signing=Ed25519PrivateKey.generate(), writes_store=True)
DOMAIN, OTHER_DOMAIN = "d" * 64, "e" * 64
SECRET = b"AWS_SECRET_ACCESS_KEY=do-not-leak-0123456789"


def dk(n: int) -> str:
    return hashlib.sha256(f"dk{n}".encode()).hexdigest()


def make_entry(
    data: bytes, n: int = 0, *, inputs: tuple[tuple[str, str], ...] | None = None
) -> compilecache.Entry:
    inputs = inputs or (("@JOB@/src/a.cu", hashlib.sha256(f"input{n}".encode()).hexdigest()),)
    return compilecache.Entry(
        direct_key=dk(n),
        result_key=compilecache.result_key(dk(n), inputs),
        inputs=inputs,
        object_sha256=hashlib.sha256(data).hexdigest(),
        object_size=len(data),
        depfile="@OUT@: @JOB@/src/a.cu\n",
        created=1_700_000_000.5,
    )


def manifest_of(entry: compilecache.Entry) -> PurePosixPath:
    return compilecache.manifest_relative(entry.direct_key, entry.result_key)


def object_of(entry: compilecache.Entry) -> PurePosixPath:
    return compilecache.object_relative(entry.object_sha256)


def write(root: Path, relative: str | PurePosixPath, data: bytes) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def put_outbox(outbox: Path, entry: compilecache.Entry, data: bytes) -> None:
    """What a build container's compile leaves: the object, then its unsigned manifest."""
    write(outbox, object_of(entry), data)
    write(outbox, manifest_of(entry), compilecache.manifest_json(entry).encode())


def every_byte(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink())


@pytest.fixture
def box(tmp_path: Path) -> dict[str, Path]:
    outbox, dest = tmp_path / "outbox", tmp_path / "local" / cache.LAYOUT / DOMAIN
    outbox.mkdir()
    dest.mkdir(parents=True)
    secret = write(tmp_path / "host", "environ", SECRET)
    return {"outbox": outbox, "dest": dest, "secret": secret, "tmp": tmp_path}


def take(box: dict[str, Path]) -> cache.ImportResult:
    return cache.import_outbox(box["outbox"], box["dest"], domain=DOMAIN, keyring=KEY)


# --- signatures --------------------------------------------------------------------------------------------


def signed(entry: compilecache.Entry, *, domain: str = DOMAIN, keyring: cachekeys.Keyring = KEY) -> bytes:
    return cachekeys.signed_manifest(entry, domain=domain, keyring=keyring)


def ring(*, writes_store: bool = True, trusted: tuple[Ed25519PublicKey, ...] = ()) -> cachekeys.Keyring:
    return cachekeys.Keyring(signing=Ed25519PrivateKey.generate(), writes_store=writes_store, trusted=trusted)


def verified(
    data: bytes, keyring: cachekeys.Keyring = KEY, *, from_store: bool = False
) -> compilecache.Entry | None:
    return cachekeys.verified_entry(data, domain=DOMAIN, keyring=keyring, from_store=from_store)


def test_a_signed_manifest_verifies_for_its_domain_with_its_key_only() -> None:
    entry = make_entry(b"obj")
    data = signed(entry)
    assert verified(data) == entry
    assert compilecache.parse_manifest(data) == entry  # the container reads it as any manifest
    assert verified(data, OTHER_KEY) is None
    assert cachekeys.verified_entry(data, domain=OTHER_DOMAIN, keyring=KEY) is None  # moved to another domain
    assert verified(compilecache.manifest_json(entry).encode()) is None
    raw = json.loads(data)
    assert raw["key"] == signing.key_id(KEY.signing.public_key())  # the OpenSSH fingerprint of wheels' keys


def test_verifying_needs_only_the_public_key() -> None:
    """What an untrusted build holds: the store's public key verifies the store's entries, and the entries
    it signs itself (with its home's own key) are not the store's."""
    entry = make_entry(b"obj")
    reader = ring(writes_store=False, trusted=(KEY.signing.public_key(),))
    assert verified(signed(entry), reader, from_store=True) == entry
    own = signed(entry, keyring=reader)
    assert verified(own, reader) == entry  # its own local cache
    assert verified(own, reader, from_store=True) is None  # never taken from a store
    assert verified(own, KEY) is None and verified(own, KEY, from_store=True) is None  # nor by anyone else
    # a writer's home key is not the store's either: only its signing key is
    assert verified(signed(entry), KEY, from_store=True) == entry


def tampered(entry: compilecache.Entry, **fields: object) -> bytes:
    """The manifest signed for `entry`, its fields then changed (and its result key made consistent again, so
    the change is one only the signature can catch)."""
    raw = json.loads(signed(entry))
    raw.update(fields)
    raw["result_key"] = compilecache.result_key(raw["direct_key"], raw["inputs"])
    data = json.dumps(raw).encode()
    assert compilecache.parse_manifest(data) is not None
    return data


@pytest.mark.parametrize(
    "fields",
    [
        {"inputs": [["@JOB@/src/a.cu", "0" * 64]]},
        {"object_sha256": hashlib.sha256(b"planted").hexdigest()},
        {"object_size": 4},
        {"depfile": "@OUT@: /etc/passwd\n"},
        {"created": 2.0},
        {"direct_key": dk(9)},
    ],
)
def test_a_tampered_field_breaks_the_signature(fields: dict[str, object]) -> None:
    assert verified(tampered(make_entry(b"obj"), **fields)) is None


@pytest.mark.parametrize(
    "change",
    [
        {"signature": None},
        {"key": None},
        {"signature": 7},
        {"signature": ""},
        {"signature": base64.b64encode(b"\0" * 64).decode()},
        {"signature": base64.b64encode(b"\0" * 63).decode()},
        {"signature": "not base64!"},
        {"key": ["x"]},
        {"key": {"a": 1}},
        {"key": signing.key_id(OTHER_KEY.signing.public_key())},
    ],
)
def test_a_missing_or_malformed_signature_is_refused(change: dict[str, object]) -> None:
    raw = json.loads(signed(make_entry(b"obj")))
    for name, value in change.items():
        if value is None:
            del raw[name]
        else:
            raw[name] = value
    assert verified(json.dumps(raw).encode()) is None


def test_an_hmac_tag_of_an_earlier_factory_is_refused() -> None:
    """A manifest of the HMAC days (its `key_id` and `tag`): refused, whatever it claims."""
    raw = json.loads(compilecache.manifest_json(make_entry(b"obj")))
    raw.update(key_id="0" * 16, tag="0" * 64)
    assert verified(json.dumps(raw).encode()) is None


def test_a_non_ascii_signature_is_refused_not_an_error() -> None:
    """A store writer controls every byte of a manifest: a signature or key of non-ASCII characters must be a
    refusal (None), not an exception out of pull/before_job."""
    for field in ("signature", "key"):
        raw = json.loads(signed(make_entry(b"obj")))
        raw[field] = "é" * 64
        try:
            got = verified(json.dumps(raw, ensure_ascii=False).encode())
        except (TypeError, ValueError) as exc:
            pytest.fail(f"BUG factory/trust/cachekeys.py verified_entry: a non-ASCII {field} raises: {exc}")
        assert got is None


def test_a_key_being_rotated_in_is_accepted_and_not_signed_with() -> None:
    entry = make_entry(b"obj")
    old, new = ring(), ring()
    by_old = signed(entry, keyring=old)
    assert verified(by_old, new) is None
    rotating = ring(trusted=(old.signing.public_key(),))
    assert verified(by_old, rotating) == entry and verified(by_old, rotating, from_store=True) == entry
    assert json.loads(signed(entry, keyring=rotating))["key"] == rotating.key_id
    assert verified(signed(entry, keyring=rotating), old) is None


# --- the keys -----------------------------------------------------------------------------------------------


def key_pair() -> tuple[str, str]:
    private, public = signing.generate_key()
    return private.decode(), public.decode()


def test_the_environment_key_makes_a_writer_and_no_file_is_made(tmp_path: Path) -> None:
    private, public = key_pair()
    keys = cachekeys.load_keyring(tmp_path, {cachekeys.SIGN_KEY_ENV: f"{private}\n"})
    assert keys.writes_store and keys.trusted == ()
    assert keys.key_id == signing.key_id(signing.load_public_key(public.encode(), shown="pub"))
    assert set(keys.store_keys()) == {keys.key_id}
    assert not (tmp_path / cachekeys.KEY_FILE).exists()
    assert cachekeys.writes_store({cachekeys.SIGN_KEY_ENV: private})
    assert not cachekeys.writes_store({cachekeys.PUBLIC_KEYS_ENV: public})


def test_the_home_key_is_made_once_0600_reused_and_trusted_by_no_store(tmp_path: Path) -> None:
    first = cachekeys.load_keyring(tmp_path, {})
    path = tmp_path / cachekeys.KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not first.writes_store and first.store_keys() == {}
    text = path.read_bytes()
    assert cachekeys.load_keyring(tmp_path, {}).key_id == first.key_id and path.read_bytes() == text
    assert cachekeys.load_keyring(tmp_path / "elsewhere", {}).key_id != first.key_id  # made, not fixed


def test_public_keys_make_a_reader_and_are_added_for_rotation(tmp_path: Path) -> None:
    (_, pub_a), (_, pub_b), (_, pub_c) = key_pair(), key_pair(), key_pair()
    pem = (
        signing.load_public_key(pub_c.encode(), shown="c")
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    env = {cachekeys.PUBLIC_KEYS_ENV: f"{pub_a.strip()}, {pub_b.strip()}\n{pem}\n{pub_a}"}
    reader = cachekeys.load_keyring(tmp_path, env)
    ids = [signing.key_id(signing.load_public_key(p.encode(), shown="p")) for p in (pub_a, pub_b, pub_c)]
    assert not reader.writes_store and set(reader.store_keys()) == set(ids)  # the duplicate once
    assert set(reader.accepts()) == {*ids, reader.key_id}
    private, _ = key_pair()
    writer = cachekeys.load_keyring(tmp_path, {**env, cachekeys.SIGN_KEY_ENV: private})
    assert writer.writes_store and set(writer.store_keys()) == {*ids, writer.key_id}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({cachekeys.SIGN_KEY_ENV: "s" * 40}, r"^\$FACTORY_CACHE_SIGN_KEY: not a private key"),
        ({cachekeys.SIGN_KEY_ENV: "x" * 20000}, r"^\$FACTORY_CACHE_SIGN_KEY: larger than"),
        ({cachekeys.PUBLIC_KEYS_ENV: "ssh-ed25519 AAAA"}, r"^\$FACTORY_CACHE_PUBLIC_KEYS \(key 1\): not a"),
        ({cachekeys.PUBLIC_KEYS_ENV: "ssh-ed25519 AAAA\n" * 65}, r"^\$FACTORY_CACHE_PUBLIC_KEYS: 65 keys"),
        # an earlier factory's HMAC key: never read, never a silent fallback to the home's own key
        (
            {"FACTORY_CACHE_KEY": "s" * 40},
            r"^\$FACTORY_CACHE_KEY: the compile cache is now signed with an Ed",
        ),
        ({"FACTORY_CACHE_TRUSTED_KEYS": "a" * 40}, r"^\$FACTORY_CACHE_TRUSTED_KEYS: the compile cache is"),
    ],
)
def test_a_bad_or_old_key_setting_is_one_config_error(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    private, _ = key_pair()
    for given in (env, {cachekeys.SIGN_KEY_ENV: private, **env}):
        with pytest.raises(ConfigError, match=message) as raised:
            cachekeys.load_keyring(tmp_path, given)
        assert "\n" not in str(raised.value) and "s" * 40 not in str(raised.value)
        with pytest.raises(ConfigError, match=message):
            cachekeys.check_environment(given)
    assert not (tmp_path / cachekeys.KEY_FILE).exists()


def test_a_bad_or_linked_key_file_is_a_config_error(tmp_path: Path) -> None:
    write(tmp_path / "a", cachekeys.KEY_FILE, b"0123456789abcdef" * 4 + b"\n")  # an HMAC key of old
    with pytest.raises(ConfigError, match="not a private key"):
        cachekeys.load_keyring(tmp_path / "a", {})
    planted = write(tmp_path, "planted", signing.generate_key()[0])
    (tmp_path / "b").mkdir(parents=True)
    (tmp_path / "b" / cachekeys.KEY_FILE).symlink_to(planted)
    with pytest.raises(ConfigError):  # a link is never followed, not even to a good key
        cachekeys.load_keyring(tmp_path / "b", {})


# --- what the host takes from a build's outbox ----------------------------------------------------------


def test_an_outbox_entry_is_imported_signed_and_the_outbox_emptied(box: dict[str, Path]) -> None:
    entry = make_entry(b"object bytes")
    put_outbox(box["outbox"], entry, b"object bytes")
    got = take(box)
    assert (got.objects, got.entries, got.refused) == (1, 1, 0)
    assert (box["dest"] / object_of(entry)).read_bytes() == b"object bytes"
    data = (box["dest"] / manifest_of(entry)).read_bytes()
    assert cachekeys.verified_entry(data, domain=DOMAIN, keyring=KEY) == entry
    assert cachekeys.verified_entry(data, domain=DOMAIN, keyring=OTHER_KEY) is None
    assert cachekeys.verified_entry(data, domain=OTHER_DOMAIN, keyring=KEY) is None
    assert not [p for p in box["outbox"].rglob("*") if p.is_file()]
    assert take(box) == cache.ImportResult()  # read once


def test_outbox_links_to_a_host_file_are_never_read(box: dict[str, Path]) -> None:
    """Links named as an object (with the sha256 of the secret, so a hash check alone would pass) and as a
    manifest (the secret a manifest a follower would accept) stand for /proc/self/environ."""
    honest = make_entry(b"honest")
    write(box["outbox"], object_of(honest), b"honest")
    raw = json.loads(compilecache.manifest_json(honest))
    raw["environ"] = SECRET.decode()
    secret_manifest = json.dumps(raw).encode()
    box["secret"].write_bytes(secret_manifest)
    assert compilecache.parse_manifest(secret_manifest) is not None
    link_obj = box["outbox"] / compilecache.object_relative(hashlib.sha256(secret_manifest).hexdigest())
    link_obj.parent.mkdir(parents=True)
    link_obj.symlink_to(box["secret"])
    link_manifest = box["outbox"] / manifest_of(honest)
    link_manifest.parent.mkdir(parents=True)
    link_manifest.symlink_to(box["secret"])
    got = take(box)
    assert got.entries == 0 and got.objects == 1
    assert SECRET not in every_byte(box["tmp"] / "local")
    assert not (box["dest"] / manifest_of(honest)).exists()
    assert box["secret"].read_bytes() == secret_manifest  # and never removed


@pytest.mark.parametrize("kind", ["m", "o"])
def test_an_outbox_directory_linked_to_a_host_directory_is_not_entered(
    box: dict[str, Path], kind: str
) -> None:
    """`m/ab` (or `o/ab`) is a link to a host directory holding files of the cache's grammar: nothing of it
    is imported, nothing written into it, nothing removed from it."""
    entry = make_entry(b"host's", 0)
    host = box["tmp"] / "host-dir"
    if kind == "m":
        write(host, PurePosixPath(*manifest_of(entry).parts[2:]), compilecache.manifest_json(entry).encode())
        write(box["dest"], object_of(entry), b"host's")  # its object is here: only the link is missing
        linked = box["outbox"] / "m" / entry.direct_key[:2]
    else:
        write(host, entry.object_sha256, b"host's")
        linked = box["outbox"] / "o" / entry.object_sha256[:2]
    before = {p: p.read_bytes() for p in host.rglob("*") if p.is_file()}
    linked.parent.mkdir(parents=True)
    linked.symlink_to(host, target_is_directory=True)
    got = take(box)
    assert (got.entries, got.objects) == (0, 0)
    assert {p: p.read_bytes() for p in host.rglob("*") if p.is_file()} == before
    assert not (box["dest"] / manifest_of(entry)).exists()
    assert kind == "m" or not (box["dest"] / object_of(entry)).exists()


@pytest.mark.timeout(10)
def test_outbox_fifos_are_passed_over_without_blocking(box: dict[str, Path]) -> None:
    entry = make_entry(b"x")
    for relative in (object_of(entry), manifest_of(entry)):
        (box["outbox"] / relative).parent.mkdir(parents=True)
        os.mkfifo(box["outbox"] / relative)
    got = take(box)
    assert (got.objects, got.entries) == (0, 0)
    assert not [p for p in box["dest"].rglob("*") if p.is_file()]


def test_an_object_that_is_not_its_name_is_refused_and_so_is_its_manifest(box: dict[str, Path]) -> None:
    entry = make_entry(b"what the manifest says")
    write(box["outbox"], object_of(entry), b"planted bytes")
    write(box["outbox"], manifest_of(entry), compilecache.manifest_json(entry).encode())
    got = take(box)
    assert (got.objects, got.entries, got.refused) == (0, 0, 2)
    assert b"planted bytes" not in every_byte(box["dest"])
    assert not [p for p in box["dest"].rglob("*") if p.is_file()]


def test_a_manifest_without_its_object_or_of_another_size_is_refused(box: dict[str, Path]) -> None:
    missing = make_entry(b"never written", 1)
    write(box["outbox"], manifest_of(missing), compilecache.manifest_json(missing).encode())
    sized = make_entry(b"right bytes", 2)
    wrong_size = compilecache.Entry(**{**sized.__dict__, "object_size": sized.object_size + 1})
    put_outbox(box["outbox"], wrong_size, b"right bytes")
    got = take(box)
    assert (got.objects, got.entries, got.refused) == (1, 0, 2)
    assert not (box["dest"] / "m").exists() or not [p for p in (box["dest"] / "m").rglob("*") if p.is_file()]


def test_a_manifest_of_another_name_or_a_bad_result_key_is_refused(box: dict[str, Path]) -> None:
    entry = make_entry(b"obj", 1)
    write(box["outbox"], object_of(entry), b"obj")
    # named for another result key than its own
    write(box["outbox"], compilecache.manifest_relative(entry.direct_key, "0" * 64),
          compilecache.manifest_json(entry).encode())  # fmt: skip
    # filed under another direct key
    write(box["outbox"], compilecache.manifest_relative(dk(5), entry.result_key),
          compilecache.manifest_json(entry).encode())  # fmt: skip
    # a result key that is not the hash of its inputs
    raw = json.loads(compilecache.manifest_json(make_entry(b"obj", 2)))
    raw["inputs"] = [["@JOB@/other.h", "1" * 64]]
    write(
        box["outbox"],
        compilecache.manifest_relative(raw["direct_key"], raw["result_key"]),
        json.dumps(raw).encode(),
    )
    got = take(box)
    assert (got.entries, got.refused) == (0, 3)
    assert not (box["dest"] / "m").exists() or not [p for p in (box["dest"] / "m").rglob("*") if p.is_file()]


def test_files_outside_the_grammar_are_ignored(box: dict[str, Path]) -> None:
    sha = hashlib.sha256(b"x").hexdigest()
    names = [
        "stray.txt", f"o/{sha[:2]}/.tmp-{sha}", f"o/{sha[:2]}/{sha}.o", f"o/zz/{sha}", f"x/{sha[:2]}/{sha}",
        f"o/{sha[:2]}/{sha}/inner", f"m/{sha[:2]}/{sha}/notakey.json", "verify/0", f"h/{sha}",
    ]  # fmt: skip
    for name in names:
        write(box["outbox"], name, b"x")
    assert take(box) == cache.ImportResult()
    assert not [p for p in box["dest"].rglob("*") if p.is_file()]


def test_a_hit_mark_touches_its_entry_and_one_for_nothing_is_harmless(box: dict[str, Path]) -> None:
    entry = make_entry(b"obj")
    put_outbox(box["outbox"], entry, b"obj")
    take(box)
    old = 1_000_000.0
    for relative in (manifest_of(entry), object_of(entry)):
        os.utime(box["dest"] / relative, (old, old))
    write(box["outbox"], compilecache.hit_relative(entry.direct_key, entry.result_key), b"")
    write(box["outbox"], compilecache.hit_relative(dk(7), "7" * 64), b"")
    got = take(box)
    assert got.hits == 1
    assert all((box["dest"] / r).stat().st_mtime > old for r in (manifest_of(entry), object_of(entry)))
    assert not (box["dest"] / "m" / dk(7)[:2]).exists()
    assert not [p for p in box["outbox"].rglob("*") if p.is_file()]


def test_oversized_outbox_files_are_refused(box: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache, "MAX_OBJECT_BYTES", 100)
    big = make_entry(b"x" * 101, 1)
    put_outbox(box["outbox"], big, b"x" * 101)
    small = make_entry(b"small", 2)
    put_outbox(box["outbox"], small, b"small")
    monkeypatch.setattr(cache, "MAX_MANIFEST_BYTES", len(compilecache.manifest_json(small)))
    many = make_entry(b"small", 3, inputs=tuple((f"@JOB@/h{n}.h", "0" * 64) for n in range(50)))
    write(box["outbox"], manifest_of(many), compilecache.manifest_json(many).encode())
    got = take(box)
    assert (got.objects, got.entries) == (1, 1)
    assert not (box["dest"] / object_of(big)).exists() and not (box["dest"] / manifest_of(many)).exists()


def test_a_deeply_nested_manifest_in_the_outbox_is_refused_not_an_error(box: dict[str, Path]) -> None:
    """json.loads raises RecursionError (not a ValueError) on deep nesting: a build that leaves one in its
    outbox must not stop the host's import (and its upload, and the outbox's removal)."""
    entry = make_entry(b"obj")
    put_outbox(box["outbox"], entry, b"obj")
    write(box["outbox"], compilecache.manifest_relative(dk(3), "3" * 64), b"[" * 100_000 + b"]" * 100_000)
    try:
        got = take(box)
    except RecursionError:
        pytest.fail(
            "BUG factory/container/compilecache.py parse_manifest: RecursionError escapes (deep JSON)"
        )
    assert got.entries == 1 and got.refused == 1


# --- the domain's directory --------------------------------------------------------------------------------


def test_verify_domain_removes_what_the_host_did_not_sign_for_it(box: dict[str, Path]) -> None:
    dest = box["dest"]
    honest = make_entry(b"honest", 1)
    write(dest, object_of(honest), b"honest")
    write(dest, manifest_of(honest), signed(honest))
    planted = {
        "unsigned": (make_entry(b"p", 2), lambda e: compilecache.manifest_json(e).encode()),
        "other key": (make_entry(b"p", 3), lambda e: signed(e, keyring=OTHER_KEY)),
        "other domain": (make_entry(b"p", 4), lambda e: signed(e, domain=OTHER_DOMAIN)),
    }
    for made, body in planted.values():
        write(dest, object_of(made), b"p")
        write(dest, manifest_of(made), body(made))
    renamed = make_entry(b"p", 5)
    write(dest, compilecache.manifest_relative(renamed.direct_key, "5" * 64), signed(renamed))
    write(dest, "m/zz/stray", b"x")
    known: set[tuple[str, int, int]] = set()
    assert cache.verify_domain(dest, domain=DOMAIN, keyring=KEY, known=known) == 5
    manifests = sorted(p.relative_to(dest).as_posix() for p in (dest / "m").rglob("*") if p.is_file())
    assert manifests == [manifest_of(honest).as_posix()]
    assert cache.verify_domain(dest, domain=DOMAIN, keyring=KEY, known=known) == 0
    # a planted manifest is found also after a run has checked the directory once
    write(
        dest, manifest_of(planted["unsigned"][0]), compilecache.manifest_json(planted["unsigned"][0]).encode()
    )
    assert cache.verify_domain(dest, domain=DOMAIN, keyring=KEY, known=known) == 1


def test_open_job_checks_the_domain_and_makes_a_fresh_outbox(tmp_path: Path) -> None:
    local = tmp_path / "home" / "cache" / "compile"
    sync = cache.CacheSync(cache.CacheConfig(local=local), keyring=KEY)
    dest = cache.domain_dir(local, DOMAIN)
    planted = make_entry(b"p")
    write(dest, object_of(planted), b"p")
    write(dest, manifest_of(planted), compilecache.manifest_json(planted).encode())
    host = write(tmp_path / "host", "keep", b"host file")
    outbox = cache.outbox_dir(local, run_id="r1", job_id="j1")
    outbox.parent.mkdir(parents=True)
    outbox.symlink_to(host.parent, target_is_directory=True)  # a leftover link where the outbox goes
    job = sync.open_job("j1", domain=DOMAIN, run_id="r1")
    assert not (dest / manifest_of(planted)).exists()
    assert host.read_bytes() == b"host file"
    assert outbox.is_dir() and not outbox.is_symlink() and list(outbox.iterdir()) == []
    assert job.mounts() == {
        str(dest): {"bind": cache.MOUNT, "mode": "ro"},
        str(outbox): {"bind": cache.OUT_MOUNT, "mode": "rw"},
    }


def test_after_job_imports_and_removes_the_outbox_and_suspect_removes_an_entry(tmp_path: Path) -> None:
    local = tmp_path / "cache"
    lines: list[str] = []
    sync = cache.CacheSync(cache.CacheConfig(local=local), keyring=KEY, log=lines.append)
    outbox = cache.outbox_dir(local, run_id="r1", job_id="j1")
    job = sync.open_job("j1", domain=DOMAIN, run_id="r1")
    entry = make_entry(b"obj")
    put_outbox(outbox, entry, b"obj")
    write(outbox, "m/zz/junk", b"x")
    sync.after_job("j1")
    assert not outbox.exists()
    assert (
        cachekeys.verified_entry((job.dest / manifest_of(entry)).read_bytes(), domain=DOMAIN, keyring=KEY)
        == entry
    )
    sync.open_job("j2", domain=DOMAIN, run_id="r1")
    sync.suspect("j2", "../../etc-passwd", "k.cu")  # not an entry's name: nothing
    sync.suspect("j2", f"{entry.direct_key}-{entry.result_key}", "k.cu")
    assert not (job.dest / manifest_of(entry)).exists()
    assert any("suspected poisoned entry" in line and "k.cu" in line for line in lines)


# --- what the host takes from a store ----------------------------------------------------------------------


def put_store(store: Path, domain: str, relative: str | PurePosixPath, data: bytes) -> str:
    key = cache.store_key(domain, relative)
    write(store, key, data)
    return key


def test_a_pull_keeps_only_what_it_can_verify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache, "MAX_OBJECT_BYTES", 1000)
    monkeypatch.setattr(cache, "MAX_MANIFEST_BYTES", 2000)
    store = tmp_path / "store"
    honest = make_entry(b"honest", 1)
    good = {
        put_store(store, DOMAIN, object_of(honest), b"honest"),
        put_store(store, DOMAIN, manifest_of(honest), signed(honest)),
    }
    unsigned, by_other, moved = make_entry(b"u", 2), make_entry(b"o", 3), make_entry(b"v", 4)
    harmless = set()
    for made, body, data in (
        (unsigned, compilecache.manifest_json(unsigned).encode(), b"u"),
        (by_other, signed(by_other, keyring=OTHER_KEY), b"o"),
        (moved, signed(moved, domain=OTHER_DOMAIN), b"v"),
    ):
        harmless.add(put_store(store, DOMAIN, object_of(made), data))  # named by its content, by no verified
        put_store(store, DOMAIN, manifest_of(made), body)  # manifest: never fetched
    put_store(store, DOMAIN, compilecache.object_relative(hashlib.sha256(b"named").hexdigest()), b"not named")
    huge = make_entry(b"h" * 1001, 5)
    put_store(store, DOMAIN, object_of(huge), b"h" * 1001)
    put_store(store, DOMAIN, manifest_of(huge), signed(huge))
    long = make_entry(b"honest", 6, inputs=tuple((f"@JOB@/h{n}.h", "0" * 64) for n in range(40)))
    put_store(store, DOMAIN, manifest_of(long), signed(long))
    assert len(signed(long)) > 2000
    theirs = make_entry(b"theirs", 7)
    put_store(store, OTHER_DOMAIN, object_of(theirs), b"theirs")
    put_store(store, OTHER_DOMAIN, manifest_of(theirs), signed(theirs, domain=OTHER_DOMAIN))
    local = tmp_path / "local"
    remote = cache.remote_files(LocalStore(store), DOMAIN)
    got = cache.pull(LocalStore(store), local, keyring=KEY, remote=remote)
    assert cache.local_files(local) == good
    assert got.files == 2 and got.failed == 5  # three manifests no key of the store signed, huge, long
    for key in cache.local_files(local):
        parsed = cache.parse_store_key(key)
        assert parsed is not None
        if parsed[2][0] == "o":
            assert hashlib.sha256((local / key).read_bytes()).hexdigest() == parsed[2][1]
    assert b"not named" not in every_byte(local)
    assert cache.pull(LocalStore(store), local, keyring=KEY, remote=remote).files == 0  # nothing new


def test_before_job_brings_only_the_job_s_domain(tmp_path: Path) -> None:
    store = tmp_path / "store"
    mine, theirs = make_entry(b"mine", 1), make_entry(b"theirs", 2)
    for domain, made, data in ((DOMAIN, mine, b"mine"), (OTHER_DOMAIN, theirs, b"theirs")):
        put_store(store, domain, object_of(made), data)
        put_store(store, domain, manifest_of(made), signed(made, domain=domain))
    lines: list[str] = []
    local = tmp_path / "local"
    sync = cache.CacheSync(cache.CacheConfig(local=local, store=str(store)), keyring=KEY, log=lines.append)
    job = sync.open_job("j1", domain=DOMAIN, run_id="r1")
    sync.before_job("j1", DOMAIN)
    assert cache.local_files(local) == {
        cache.store_key(DOMAIN, object_of(mine)),
        cache.store_key(DOMAIN, manifest_of(mine)),
    }
    assert (job.dest / manifest_of(mine)).is_file()
    assert lines == [f"j1: compile cache: 2 file(s) fetched from {store}"]


def test_a_store_writer_cannot_fill_the_local_cache_past_its_bound(tmp_path: Path) -> None:
    """Issue 41 §4: objects no verified manifest names, however many and big, are never fetched; a verified
    manifest's object is fetched only at the size it names, and the pull keeps to its bound."""
    store = tmp_path / "store"
    for n in range(20):
        data = bytes([n]) * 100_000
        put_store(store, DOMAIN, compilecache.object_relative(hashlib.sha256(data).hexdigest()), data)
    honest = make_entry(b"honest", 1)
    put_store(store, DOMAIN, object_of(honest), b"honest")
    put_store(store, DOMAIN, manifest_of(honest), signed(honest))
    # a verified manifest whose object in the store is another size than it names: not downloaded
    swapped = make_entry(b"small", 2)
    put_store(store, DOMAIN, object_of(swapped), b"small" * 50_000)
    put_store(store, DOMAIN, manifest_of(swapped), signed(swapped))
    local = tmp_path / "local"
    got = cache.pull(LocalStore(store), local, keyring=KEY, max_bytes=50_000)
    assert (got.files, got.failed) == (2, 1)
    assert cache.local_files(local) == {
        cache.store_key(DOMAIN, object_of(honest)),
        cache.store_key(DOMAIN, manifest_of(honest)),
    }
    assert sum(p.stat().st_size for p in local.rglob("*") if p.is_file()) < 50_000
    # the bound: an entry that would go past it stops the pull
    big = make_entry(b"b" * 60_000, 3)
    put_store(tmp_path / "big", DOMAIN, object_of(big), b"b" * 60_000)
    put_store(tmp_path / "big", DOMAIN, manifest_of(big), signed(big))
    capped = tmp_path / "capped"
    assert cache.pull(LocalStore(tmp_path / "big"), capped, keyring=KEY, max_bytes=50_000).files == 0
    assert cache.local_files(capped) == set()


@pytest.mark.parametrize("what", ["deep", "non-ascii signature"])
def test_a_hostile_store_manifest_is_a_failed_file_not_an_error(tmp_path: Path, what: str) -> None:
    """Unverifiable is not kept and counted failed, never an error: a manifest of the store whose bytes make
    the parser or the signature check raise must not fail the job (before_job catches OSError and FactoryError
    only)."""
    store = tmp_path / "store"
    made = make_entry(b"obj")
    put_store(store, DOMAIN, object_of(made), b"obj")
    if what == "deep":
        body = b"[" * 100_000 + b"]" * 100_000
    else:
        raw = json.loads(signed(made))
        raw["signature"] = "é" * 64
        body = json.dumps(raw, ensure_ascii=False).encode()
    put_store(store, DOMAIN, manifest_of(made), body)
    try:
        got = cache.pull(LocalStore(store), tmp_path / "local", keyring=KEY)
    except (RecursionError, TypeError, ValueError) as exc:
        where = "compilecache.parse_manifest" if what == "deep" else "cachekeys.verified_entry"
        pytest.fail(f"BUG factory/{where}: a hostile store manifest ({what}) raises {type(exc).__name__}")
    assert (got.files, got.failed) == (0, 1)  # nor its object: no verified manifest names it


def test_a_linked_local_domain_directory_gets_nothing_from_a_pull(tmp_path: Path) -> None:
    """Not a container's doing (the local cache is the host's), but the writes go through safefs all the same:
    a local `v3/<domain>/o/ab` that is a link to another directory gets nothing written into it."""
    store = tmp_path / "store"
    made = make_entry(b"obj")
    put_store(store, DOMAIN, object_of(made), b"obj")
    put_store(store, DOMAIN, manifest_of(made), signed(made))
    local = tmp_path / "local"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked = local / cache.LAYOUT / DOMAIN / "o" / made.object_sha256[:2]
    linked.parent.mkdir(parents=True)
    linked.symlink_to(elsewhere, target_is_directory=True)
    got = cache.pull(LocalStore(store), local, keyring=KEY)
    assert (got.files, got.failed) == (0, 1)
    assert list(elsewhere.iterdir()) == []
    shutil.rmtree(local)


def test_a_truncated_local_object_is_replaced_by_the_next_build_that_makes_it(box: dict[str, Path]) -> None:
    data = b"object bytes" * 100
    entry = make_entry(data)
    put_outbox(box["outbox"], entry, data)
    assert take(box).entries == 1
    (box["dest"] / object_of(entry)).write_bytes(data[:10])  # a disk that lost its tail
    second = make_entry(data, 1)  # another compile with the same object
    put_outbox(box["outbox"], second, data)
    got = take(box)
    assert (got.objects, got.entries, got.refused) == (1, 1, 0)
    assert (box["dest"] / object_of(entry)).read_bytes() == data


def test_a_dead_run_s_outbox_is_removed_and_a_live_one_s_kept(tmp_path: Path) -> None:
    local = tmp_path / "cache" / "compile"
    sync = cache.CacheSync(cache.CacheConfig(local=local), keyring=KEY)
    live = sync.open_job("j1", domain=DOMAIN, run_id="live")
    dead = sync.open_job("j2", domain=DOMAIN, run_id="dead")
    write(dead.outbox, "o/ab/" + "ab" * 32, b"never imported")
    owner = dead.outbox.with_name(dead.outbox.name + cache.OWNER_SUFFIX)
    # a process that is gone: pid 2**22 + 1 is above the kernel's pid_max
    owner.write_text(leftovers.owner_json(leftovers.Owner(pid=2**22 + 1, host=leftovers.host_tag())))
    (dead.outbox / "link").symlink_to(tmp_path / "host", target_is_directory=True)
    write(tmp_path / "host", "keep", b"host")
    assert cache.remove_stale_outboxes(local) == [dead.outbox]
    assert not dead.outbox.exists() and not owner.exists()
    assert live.outbox.is_dir() and (tmp_path / "host" / "keep").read_bytes() == b"host"
