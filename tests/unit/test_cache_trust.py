"""Who may add to the compile cache (factory/cache.py, issue 31): the keys and the signatures that bind a
manifest to its trust domain, what the host takes from a build's outbox (a container that plants links,
FIFOs, lies about content or sizes), what it takes from a store someone else can write, and what a job's
domain directory may hold."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path, PurePosixPath

import pytest

from factory import cache, leftovers
from factory.container import compilecache
from factory.errors import ConfigError
from factory.stores import LocalStore

KEY = cache.Keyring(signing=b"k" * 40)
OTHER_KEY = cache.Keyring(signing=b"x" * 40)
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
    outbox, dest = tmp_path / "outbox", tmp_path / "local" / "v2" / DOMAIN
    outbox.mkdir()
    dest.mkdir(parents=True)
    secret = write(tmp_path / "host", "environ", SECRET)
    return {"outbox": outbox, "dest": dest, "secret": secret, "tmp": tmp_path}


def take(box: dict[str, Path]) -> cache.ImportResult:
    return cache.import_outbox(box["outbox"], box["dest"], domain=DOMAIN, keyring=KEY)


# --- signatures --------------------------------------------------------------------------------------------


def signed(entry: compilecache.Entry, *, domain: str = DOMAIN, keyring: cache.Keyring = KEY) -> bytes:
    return cache.signed_manifest(entry, domain=domain, keyring=keyring)


def test_a_signed_manifest_verifies_for_its_domain_with_its_key_only() -> None:
    entry = make_entry(b"obj")
    data = signed(entry)
    assert cache.verified_entry(data, domain=DOMAIN, keyring=KEY) == entry
    assert compilecache.parse_manifest(data) == entry  # the container reads it as any manifest
    assert cache.verified_entry(data, domain=DOMAIN, keyring=OTHER_KEY) is None
    assert cache.verified_entry(data, domain=OTHER_DOMAIN, keyring=KEY) is None  # moved to another domain
    assert (
        cache.verified_entry(compilecache.manifest_json(entry).encode(), domain=DOMAIN, keyring=KEY) is None
    )


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
    assert cache.verified_entry(tampered(make_entry(b"obj"), **fields), domain=DOMAIN, keyring=KEY) is None


@pytest.mark.parametrize(
    "change",
    [
        {"tag": None},
        {"key_id": None},
        {"tag": 7},
        {"tag": ""},
        {"key_id": ["x"]},
        {"key_id": cache.key_id(OTHER_KEY.signing)},
    ],
)
def test_a_missing_or_malformed_tag_is_refused(change: dict[str, object]) -> None:
    raw = json.loads(signed(make_entry(b"obj")))
    for name, value in change.items():
        if value is None:
            del raw[name]
        else:
            raw[name] = value
    assert cache.verified_entry(json.dumps(raw).encode(), domain=DOMAIN, keyring=KEY) is None


def test_a_non_ascii_tag_is_refused_not_an_error() -> None:
    """A store writer controls every byte of a manifest: hmac.compare_digest raises TypeError on a str with
    non-ASCII characters, which must be a refusal (None), not an exception out of pull/before_job."""
    raw = json.loads(signed(make_entry(b"obj")))
    raw["tag"] = "é" * 64
    try:
        got = cache.verified_entry(json.dumps(raw).encode(), domain=DOMAIN, keyring=KEY)
    except TypeError as exc:
        pytest.fail(f"BUG factory/cache.py verified_entry: a non-ASCII tag raises instead of refusing: {exc}")
    assert got is None


def test_a_key_being_rotated_in_is_accepted_and_not_signed_with() -> None:
    entry = make_entry(b"obj")
    old, new = b"o" * 40, b"n" * 40
    by_old = signed(entry, keyring=cache.Keyring(signing=old))
    assert cache.verified_entry(by_old, domain=DOMAIN, keyring=cache.Keyring(signing=new)) is None
    rotating = cache.Keyring(signing=new, trusted=(old,))
    assert cache.verified_entry(by_old, domain=DOMAIN, keyring=rotating) == entry
    assert json.loads(signed(entry, keyring=rotating))["key_id"] == cache.key_id(new)
    assert (
        cache.verified_entry(
            signed(entry, keyring=rotating), domain=DOMAIN, keyring=cache.Keyring(signing=old)
        )
        is None
    )


# --- the key ------------------------------------------------------------------------------------------------


def test_the_environment_key_wins_and_no_file_is_made(tmp_path: Path) -> None:
    key = "s" * 40
    ring = cache.load_keyring(tmp_path, {cache.KEY_ENV: f" {key}\n"})
    assert ring == cache.Keyring(signing=key.encode())
    assert not (tmp_path / "cache" / cache.KEY_FILE).exists()


def test_the_key_file_is_made_once_0600_and_reused(tmp_path: Path) -> None:
    first = cache.load_keyring(tmp_path, {})
    path = tmp_path / "cache" / cache.KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(first.signing) >= cache.MIN_KEY_CHARS
    text = path.read_bytes()
    assert cache.load_keyring(tmp_path, {}) == first and path.read_bytes() == text
    assert cache.load_keyring(tmp_path / "elsewhere", {}).signing != first.signing  # made, not fixed


def test_trusted_keys_are_added(tmp_path: Path) -> None:
    env = {cache.KEY_ENV: "s" * 40, cache.TRUSTED_KEYS_ENV: f"{'a' * 32}, {'b' * 33}"}
    ring = cache.load_keyring(tmp_path, env)
    assert ring.trusted == (b"a" * 32, b"b" * 33)
    assert set(ring.accepts()) == {cache.key_id(k) for k in (b"s" * 40, b"a" * 32, b"b" * 33)}


@pytest.mark.parametrize(
    "env",
    [
        {cache.KEY_ENV: "short"},
        {cache.KEY_ENV: "s" * 20 + " " + "s" * 20},
        {cache.KEY_ENV: "s" * 40, cache.TRUSTED_KEYS_ENV: "tooshort"},
    ],
)
def test_a_weak_key_is_a_config_error(tmp_path: Path, env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="at least 32"):
        cache.load_keyring(tmp_path, env)


def test_a_short_or_linked_key_file_is_a_config_error(tmp_path: Path) -> None:
    write(tmp_path / "a" / "cache", cache.KEY_FILE, b"short\n")
    with pytest.raises(ConfigError):
        cache.load_keyring(tmp_path / "a", {})
    planted = write(tmp_path, "planted", b"p" * 64)
    (tmp_path / "b" / "cache").mkdir(parents=True)
    (tmp_path / "b" / "cache" / cache.KEY_FILE).symlink_to(planted)
    with pytest.raises(ConfigError):  # a link is never followed, not even to a good key
        cache.load_keyring(tmp_path / "b", {})


# --- what the host takes from a build's outbox ----------------------------------------------------------


def test_an_outbox_entry_is_imported_signed_and_the_outbox_emptied(box: dict[str, Path]) -> None:
    entry = make_entry(b"object bytes")
    put_outbox(box["outbox"], entry, b"object bytes")
    got = take(box)
    assert (got.objects, got.entries, got.refused) == (1, 1, 0)
    assert (box["dest"] / object_of(entry)).read_bytes() == b"object bytes"
    data = (box["dest"] / manifest_of(entry)).read_bytes()
    assert cache.verified_entry(data, domain=DOMAIN, keyring=KEY) == entry
    assert cache.verified_entry(data, domain=DOMAIN, keyring=OTHER_KEY) is None
    assert cache.verified_entry(data, domain=OTHER_DOMAIN, keyring=KEY) is None
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
        cache.verified_entry((job.dest / manifest_of(entry)).read_bytes(), domain=DOMAIN, keyring=KEY)
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
        harmless.add(put_store(store, DOMAIN, object_of(made), data))  # named by its content: kept, unused
        put_store(store, DOMAIN, manifest_of(made), body)
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
    assert cache.local_files(local) == good | harmless
    assert got.files == 5 and got.failed == 7
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


@pytest.mark.parametrize("what", ["deep", "non-ascii tag"])
def test_a_hostile_store_manifest_is_a_failed_file_not_an_error(tmp_path: Path, what: str) -> None:
    """Unverifiable is not kept and counted failed, never an error: a manifest of the store whose bytes make
    the parser or the tag check raise must not fail the job (before_job catches OSError and FactoryError
    only)."""
    store = tmp_path / "store"
    made = make_entry(b"obj")
    put_store(store, DOMAIN, object_of(made), b"obj")
    if what == "deep":
        body = b"[" * 100_000 + b"]" * 100_000
    else:
        raw = json.loads(signed(made))
        raw["tag"] = "é" * 64
        body = json.dumps(raw, ensure_ascii=False).encode()
    put_store(store, DOMAIN, manifest_of(made), body)
    try:
        got = cache.pull(LocalStore(store), tmp_path / "local", keyring=KEY)
    except (RecursionError, TypeError) as exc:
        where = "compilecache.parse_manifest" if what == "deep" else "cache.verified_entry"
        pytest.fail(f"BUG factory/{where}: a hostile store manifest ({what}) raises {type(exc).__name__}")
    assert (got.files, got.failed) == (1, 1)


def test_a_linked_local_domain_directory_gets_nothing_from_a_pull(tmp_path: Path) -> None:
    """Not a container's doing (the local cache is the host's), but the writes go through safefs all the same:
    a local `v2/<domain>/o/ab` that is a link to another directory gets nothing written into it."""
    store = tmp_path / "store"
    made = make_entry(b"obj")
    put_store(store, DOMAIN, object_of(made), b"obj")
    local = tmp_path / "local"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked = local / "v2" / DOMAIN / "o" / made.object_sha256[:2]
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
