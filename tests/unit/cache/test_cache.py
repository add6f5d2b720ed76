"""The compile cache on the host: build.cache and build.cache_max, where the cache lives, its sync with a
store (a directory here; S3 through moto in tests/integration/test_cache_s3.py), counts and display."""

from __future__ import annotations

import hashlib
import io
import json
import os
import textwrap
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path, PurePosixPath

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from factory.build import jobrun, report
from factory.build import runner as build
from factory.cache import sync as cache
from factory.cli.progress import progress_line, summary_lines
from factory.container import compilecache, driver, protocol
from factory.container.protocol import measurement_line
from factory.core import leftovers
from factory.core.errors import ConfigError
from factory.memory import jobmemory
from factory.plan.plan import plan_matrix
from factory.publish.stores import LocalStore
from factory.spec.config import load_matrix_file
from factory.trust import cachekeys, signing

ROOT = Path(__file__).resolve().parents[3]
MATRIX = """\
package: {name: demo-ext, version: "0.1.0", source: {path: src}}
recipe: {name: demo, import_name: demo_ext}
matrix: {cuda: ["13.0"], torch: ["2.14"], python: ["3.11"], cxx11_abi: [true], arch: ["9.0"]}
"""


def load(tmp_path: Path, extra: str = ""):  # type: ignore[no-untyped-def]
    (tmp_path / "src").mkdir(exist_ok=True)
    path = tmp_path / "m.yaml"
    path.write_text(MATRIX + textwrap.dedent(extra))
    return load_matrix_file(path)


# --- build.cache, build.cache_max, --cache ---------------------------------------------------------------


def test_the_cache_is_on_and_local_by_default(tmp_path: Path) -> None:
    mf = load(tmp_path)
    assert mf.build.cache is True and mf.build.cache_max == cache.DEFAULT_MAX_BYTES
    config = cache.resolve(mf, publishing=False, home=tmp_path / "home")
    assert config == cache.CacheConfig(local=tmp_path / "home" / "cache" / "compile")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("false", False),
        ("true", True),
        ("s3://bucket/team/cc", "s3://bucket/team/cc"),
        ("/srv/cc", "/srv/cc"),
    ],
)
def test_build_cache_values(tmp_path: Path, value: str, expected: object) -> None:
    mf = load(tmp_path, f"build: {{cache: {value}, cache_max: 5GiB}}\n")
    assert mf.build.cache == expected
    assert mf.build.cache_max == 5 * 2**30


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("build: {cache: 3}", "build.cache must be true, false, s3://bucket/prefix or a directory"),
        ("build: {cache: 'https://x/y'}", "build.cache 'https://x/y': use a directory or s3://bucket/prefix"),
        ("build: {cache: 's3://B_ad/x'}", "bucket 'B_ad'"),
        ("build: {cache_max: 12Q}", "build.cache_max: size '12Q' is not a size"),
        ("build: {cache_max: 1.5}", "build.cache_max must be a size like 16GiB"),
        ("build: {cache_max: 0}", "build.cache_max: size 0 must be positive"),
    ],
)
def test_bad_build_cache_is_one_line_naming_the_key(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, extra + "\n")
    assert message in str(err.value) and "m.yaml:4" in str(err.value)
    assert "\n" not in str(err.value)


def test_publishing_puts_the_store_under_the_publish_store(tmp_path: Path) -> None:
    mf = load(tmp_path, "publish: {to: 's3://wheels/team/idx', endpoint_url: 'http://127.0.0.1:9000'}\n")
    config = cache.resolve(mf, publishing=True, home=tmp_path)
    assert config is not None
    assert config.store == "s3://wheels/team/idx/_cache/compile"
    assert config.endpoint_url == "http://127.0.0.1:9000"
    local = cache.resolve(
        load(tmp_path, f"publish: {{to: '{tmp_path}/idx'}}\n"), publishing=True, home=tmp_path
    )
    assert local is not None and local.store == str(tmp_path / "idx" / "_cache" / "compile")
    assert cache.resolve(mf, publishing=False, home=tmp_path).store is None  # type: ignore[union-attr]


def test_an_explicit_store_and_the_flag_win(tmp_path: Path) -> None:
    mf = load(tmp_path, f"build: {{cache: '{tmp_path}/cc'}}\npublish: {{to: 's3://wheels/idx'}}\n")
    config = cache.resolve(mf, publishing=True, home=tmp_path)
    assert config is not None and config.store == f"{tmp_path}/cc" and config.endpoint_url is None
    assert cache.resolve(mf, publishing=True, override="off", home=tmp_path) is None
    flag = cache.resolve(mf, publishing=True, override="s3://other/cc", home=tmp_path)
    assert flag is not None and flag.store == "s3://other/cc"
    with pytest.raises(ConfigError, match=r"^--cache 'ftp://x': use a directory"):
        cache.resolve(mf, publishing=True, override="ftp://x", home=tmp_path)
    off = load(tmp_path, "build: {cache: false}\n")
    assert cache.resolve(off, publishing=True, home=tmp_path) is None


@pytest.mark.parametrize(("text", "size"), [("20GiB", 20 * 2**30), ("512M", 512 * 2**20), (1024, 1024)])
def test_parse_max(text: str | int, size: int) -> None:
    assert cache.parse_max(text, what="--max") == size


@pytest.mark.parametrize("bad", ["12Q", "-1", "0", "", "GiB"])
def test_parse_max_refuses_in_one_line(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"^--max: size"):
        cache.parse_max(bad, what="--max")


# --- the local directory and the sync --------------------------------------------------------------------

KEY = cachekeys.Keyring(signing=Ed25519PrivateKey.generate(), writes_store=True)
DOMAIN, OTHER_DOMAIN = "d" * 64, "e" * 64


def make_entry(data: bytes, n: int = 0) -> compilecache.Entry:
    dk = hashlib.sha256(f"dk{n}".encode()).hexdigest()
    inputs = (("@JOB@/src/a.cu", hashlib.sha256(f"in{n}".encode()).hexdigest()),)
    return compilecache.Entry(
        direct_key=dk,
        result_key=compilecache.result_key(dk, inputs),
        inputs=inputs,
        object_sha256=hashlib.sha256(data).hexdigest(),
        object_size=len(data),
        depfile=None,
        created=1.0,
    )


def keys_of(entry: compilecache.Entry, domain: str = DOMAIN) -> tuple[str, str]:
    """The store keys (and paths under the local cache) of an entry's object and manifest."""
    return (
        cache.store_key(domain, compilecache.object_relative(entry.object_sha256)),
        cache.store_key(domain, compilecache.manifest_relative(entry.direct_key, entry.result_key)),
    )


def put(root: Path, key: str, data: bytes) -> Path:
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def put_entry(
    root: Path, data: bytes, n: int = 0, *, domain: str = DOMAIN, mtime: float | None = None
) -> tuple[str, str]:
    """A signed entry (object, then manifest) as the local cache or a store holds it; its two keys."""
    made = make_entry(data, n)
    obj, manifest = keys_of(made, domain)
    for key, body in ((obj, data), (manifest, cachekeys.signed_manifest(made, domain=domain, keyring=KEY))):
        path = put(root, key, body)
        if mtime is not None:
            os.utime(path, (mtime, mtime))
    return obj, manifest


SHA = hashlib.sha256(b"x").hexdigest()


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (f"{cache.LAYOUT}/{DOMAIN}/o/{SHA[:2]}/{SHA}", (DOMAIN, f"o/{SHA[:2]}/{SHA}", ("o", SHA))),
        (
            f"{cache.LAYOUT}/{DOMAIN}/m/{SHA[:2]}/{SHA}/{'1' * 64}.json",
            (DOMAIN, f"m/{SHA[:2]}/{SHA}/{'1' * 64}.json", ("m", SHA, "1" * 64)),
        ),
        (f"{cache.LAYOUT}/{DOMAIN}/h/{SHA}-{SHA}", None),  # an outbox's mark: never synced
        (f"{cache.LAYOUT}/{DOMAIN}/o/{SHA[:2]}/.tmp-{SHA}-12-ab12", None),
        (f"{cache.LAYOUT}/{DOMAIN}/o/{SHA[:3]}/{SHA}", None),
        (f"{cache.LAYOUT}/{DOMAIN}/o/{SHA[:2]}/{SHA}.tmp", None),
        (f"{cache.LAYOUT}/{DOMAIN}/../etc/passwd", None),
        (f"{cache.LAYOUT}/{DOMAIN[:63]}/o/{SHA[:2]}/{SHA}", None),
        (f"{cache.LAYOUT}/{DOMAIN.upper()}/o/{SHA[:2]}/{SHA}", None),
        (f"v1/o/{SHA[:2]}/{SHA}", None),
        (f"v2/{DOMAIN}/o/{SHA[:2]}/{SHA}", None),  # the HMAC-signed layout: never synced again
        (f"{cache.LAYOUT}/o/{SHA[:2]}/{SHA}", None),
        (cache.LAYOUT, None),
        (f"_cache/{cache.LAYOUT}/{DOMAIN}/o/{SHA[:2]}/{SHA}", None),
    ],
)
def test_parse_store_key(key: str, expected: tuple[str, str, tuple[str, ...]] | None) -> None:
    parsed = cache.parse_store_key(key)
    if expected is None:
        assert parsed is None
    else:
        assert parsed == (expected[0], PurePosixPath(expected[1]), expected[2])
        assert cache.store_key(parsed[0], parsed[1]) == key


def test_local_files_are_committed_files_only(tmp_path: Path) -> None:
    obj, manifest = put_entry(tmp_path, b"object")
    put(tmp_path, f"{cache.LAYOUT}/{DOMAIN}/o/ab/.tmp-{SHA}-1-x", b"half")
    put(tmp_path, f"{cache.LAYOUT}/{DOMAIN}/h/{SHA}-{SHA}", b"")
    put(tmp_path, "stray.txt", b"x")
    put(tmp_path, f"v1/o/{SHA[:2]}/{SHA}", b"x")
    (tmp_path / f"{cache.LAYOUT}/{DOMAIN}/o/{SHA[:2]}").mkdir(parents=True)
    (tmp_path / f"{cache.LAYOUT}/{DOMAIN}/o/{SHA[:2]}/{SHA}").symlink_to(tmp_path / "stray.txt")
    assert cache.local_files(tmp_path) == {obj, manifest}
    assert cache.local_files(tmp_path / "absent") == set()


def test_push_then_pull_is_the_union_and_never_overwrites(tmp_path: Path) -> None:
    a, b, store_dir = tmp_path / "a", tmp_path / "b", tmp_path / "store"
    store = LocalStore(store_dir)
    obj, manifest = put_entry(a, b"object", 1)
    put(a, f"{cache.LAYOUT}/{DOMAIN}/o/ab/.tmp-{SHA}-1-x", b"half")
    theirs = put_entry(store_dir, b"theirs", 2)  # another machine's
    put(store_dir, "profiles/x.json", b"not the cache's")
    put_entry(b, b"theirs", 2)  # a name is its content: never replaced either way
    os.utime(b / theirs[0], (1000.0, 1000.0))
    remote = cache.remote_files(store)
    assert remote == set(theirs)
    sent = cache.push(store, a, keyring=KEY, remote=remote)
    assert (sent.files, sent.failed) == (2, 0)
    assert sent.bytes == (a / obj).stat().st_size + (a / manifest).stat().st_size
    assert remote == {obj, manifest, *theirs}
    assert cache.push(store, a, keyring=KEY, remote=cache.remote_files(store)).files == 0
    got = cache.pull(store, b, keyring=KEY)
    assert (got.files, got.failed) == (2, 0)
    assert cache.local_files(b) == {obj, manifest, *theirs}
    assert (b / obj).read_bytes() == b"object" and (b / manifest).read_bytes() == (a / manifest).read_bytes()
    assert (b / theirs[0]).stat().st_mtime == 1000.0  # not written again
    assert not list(b.rglob(".tmp-*")) and not (b / "profiles").exists()


def test_the_local_cache_is_the_host_s_alone(tmp_path: Path) -> None:
    """Build containers read their domain (read-only) and never write the local cache: its directories and
    files are not writable by anyone but the host (the old layout made them 0777/0666 for the containers)."""
    store_dir = tmp_path / "store"
    obj, manifest = put_entry(store_dir, b"object")
    cache.pull(LocalStore(store_dir), tmp_path / "local", keyring=KEY)
    local = tmp_path / "local"
    assert cache.local_files(local) == {obj, manifest}
    for path in [local, *local.rglob("*")]:
        assert path.stat().st_mode & 0o022 == 0, path


@pytest.mark.parametrize("cut", ["o", "m"])
def test_a_download_cut_short_is_not_committed(tmp_path: Path, cut: str) -> None:
    class Short(LocalStore):
        def open(self, key: str):  # type: ignore[no-untyped-def]
            opened = super().open(key)
            assert opened is not None
            if f"/{cut}/" not in key:
                return opened
            data = opened[0].read()
            opened[0].close()
            return io.BytesIO(data[:-3]), opened[1]  # the store said more than came

    put_entry(tmp_path / "store", b"object")
    got = cache.pull(Short(tmp_path / "store"), tmp_path / "local", keyring=KEY)
    assert (got.files, got.failed) == (0, 1)  # the entry: its manifest, or its object and so its manifest
    assert cache.local_files(tmp_path / "local") == set()
    assert not [p for p in (tmp_path / "local").rglob("*") if p.is_file()]


def test_cache_sync_pulls_before_a_job_and_imports_and_uploads_when_nudged(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    pulled = put_entry(store_dir, b"from the store", 1)
    lines: list[str] = []
    config = cache.CacheConfig(local=tmp_path / "local", store=str(store_dir))
    with cache.CacheSync(config, log=lines.append, keyring=KEY) as sync:
        job = sync.open_job("job1", domain=DOMAIN, run_id="r1")
        sync.before_job("job1", DOMAIN)
        assert all((tmp_path / "local" / k).is_file() for k in pulled)
        made = make_entry(b"compiled now", 2)
        put(job.outbox, compilecache.object_relative(made.object_sha256).as_posix(), b"compiled now")
        put(job.outbox, compilecache.manifest_relative(made.direct_key, made.result_key).as_posix(),
            compilecache.manifest_json(made).encode())  # fmt: skip
        sync.nudge()  # a compile finished: it is imported and goes up while the job runs, before any job end
        obj, manifest = keys_of(made)
        deadline = time.monotonic() + 30
        while not (store_dir / manifest).is_file():
            assert time.monotonic() < deadline, "the nudged import and upload never came"
            time.sleep(0.05)
        assert (store_dir / obj).read_bytes() == b"compiled now"
        stored = (store_dir / manifest).read_bytes()
        assert cachekeys.verified_entry(stored, domain=DOMAIN, keyring=KEY) == made  # signed on the way in
    assert lines == [f"job1: compile cache: 2 file(s) fetched from {store_dir}"]


def test_a_pull_stops_at_the_bound_and_fetches_a_file_once_a_run(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    one = put_entry(store_dir, b"x" * 1000, 1)
    two = put_entry(store_dir, b"y" * 1000, 2)
    bound = sum((store_dir / k).stat().st_size for k in one) + 100  # one entry fits, not two
    capped = cache.pull(LocalStore(store_dir), tmp_path / "capped", keyring=KEY, max_bytes=bound)
    assert capped.files == 2 and capped.bytes <= bound  # one entry, its object and manifest; then the bound
    assert len(cache.local_files(tmp_path / "capped")) == 2
    config = cache.CacheConfig(local=tmp_path / "local", store=str(store_dir))
    sync = cache.CacheSync(config, keyring=KEY)
    sync.open_job("j1", domain=DOMAIN, run_id="r1")
    sync.before_job("j1", DOMAIN)
    assert cache.local_files(tmp_path / "local") == {*one, *two}
    (tmp_path / "local" / two[1]).unlink()  # pruned after the job
    sync.before_job("j2", DOMAIN)
    assert cache.local_files(tmp_path / "local") == {*one, two[0]}


def test_an_unreachable_store_costs_only_the_head_start(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    lines: list[str] = []
    config = cache.CacheConfig(local=tmp_path / "local", store=str(blocker))
    sync = cache.CacheSync(config, log=lines.append, keyring=KEY)
    sync.open_job("j", domain=DOMAIN, run_id="r1")
    sync.before_job("j", DOMAIN)
    assert sync.upload().files == 0
    assert len(lines) == 1 and lines[0].startswith("compile cache store not opened: ")


def test_cache_sync_without_a_keyring_uses_the_home_s_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (cachekeys.SIGN_KEY_ENV, cachekeys.PUBLIC_KEYS_ENV, *cachekeys.HMAC_KEY_ENVS):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    sync = cache.CacheSync(cache.CacheConfig(local=cache.local_dir(home)))
    assert sync.keyring.key_id == cachekeys.load_keyring(home / "cache", {}).key_id
    assert not sync.keyring.writes_store
    assert (home / "cache" / cachekeys.KEY_FILE).is_file()
    assert not (cache.local_dir(home) / cachekeys.KEY_FILE).exists()  # never inside what containers see


def test_an_untrusted_build_reads_the_store_and_never_writes_it(tmp_path: Path) -> None:
    """Public keys only (a pull request, a fork, a laptop): the store's signed entries come down, what the
    build compiles is imported into its own local cache, signed with its home's key, and nothing goes up,
    not even after the job or when nudged."""
    store_dir = tmp_path / "store"
    pulled = put_entry(store_dir, b"from the store", 1)
    before = sorted(p for p in store_dir.rglob("*"))
    reader = cachekeys.Keyring(
        signing=Ed25519PrivateKey.generate(), writes_store=False, trusted=(KEY.signing.public_key(),)
    )
    lines: list[str] = []
    config = cache.CacheConfig(local=tmp_path / "local", store=str(store_dir))
    with cache.CacheSync(config, log=lines.append, keyring=reader) as sync:
        job = sync.open_job("job1", domain=DOMAIN, run_id="r1")
        sync.before_job("job1", DOMAIN)
        assert all((tmp_path / "local" / k).is_file() for k in pulled)
        made = make_entry(b"compiled here", 2)
        put(job.outbox, compilecache.object_relative(made.object_sha256).as_posix(), b"compiled here")
        put(job.outbox, compilecache.manifest_relative(made.direct_key, made.result_key).as_posix(),
            compilecache.manifest_json(made).encode())  # fmt: skip
        sync.nudge()
        sync.after_job("job1")
        assert sync.upload() == cache.SyncResult()
    obj, manifest = keys_of(made)
    mine = (tmp_path / "local" / manifest).read_bytes()
    assert cachekeys.verified_entry(mine, domain=DOMAIN, keyring=reader) == made  # its own next builds hit
    assert cachekeys.verified_entry(mine, domain=DOMAIN, keyring=KEY) is None  # no one else takes it
    assert sorted(p for p in store_dir.rglob("*")) == before
    assert lines[0] == (
        f"compile cache store {store_dir}: read only (no $FACTORY_CACHE_SIGN_KEY): the entries its keys "
        "signed are used, this host's compiles stay in its local cache"
    )
    assert not [line for line in lines if "sent to" in line]
    # and a writer that shares its home later sends none of it: the home key's entry is not the store's
    with cache.CacheSync(config, keyring=KEY) as writer:
        writer.open_job("job2", domain=DOMAIN, run_id="r2")
        writer.before_job("job2", DOMAIN)
        writer.after_job("job2")
    assert not (store_dir / manifest).exists() and not (store_dir / obj).exists()
    assert not (tmp_path / "local" / manifest).exists()  # not the writer's to use either


def test_without_any_key_of_the_store_it_is_not_used(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    put_entry(store_dir, b"from the store", 1)
    lines: list[str] = []
    own = cachekeys.Keyring(signing=Ed25519PrivateKey.generate(), writes_store=False)
    sync = cache.CacheSync(cache.CacheConfig(local=tmp_path / "local", store=str(store_dir)), keyring=own,
                           log=lines.append)  # fmt: skip
    sync.open_job("j", domain=DOMAIN, run_id="r1")
    sync.before_job("j", DOMAIN)
    sync.after_job("j")
    assert cache.local_files(tmp_path / "local") == set()
    assert len(lines) == 1 and "not used: no key to verify its entries with" in lines[0], lines


def test_sync_writes_objects_before_their_manifests(tmp_path: Path) -> None:
    """A manifest is accepted only once its object is here: never send one early."""
    order: list[str] = []

    class Recording(LocalStore):
        def put(self, key: str, data: bytes | Path, **kwargs: object) -> str:  # type: ignore[override]
            order.append(key)
            return super().put(key, data, **kwargs)  # type: ignore[arg-type]

    obj, manifest = put_entry(tmp_path / "a", b"object")
    stray, _ = keys_of(make_entry(b"no manifest names it", 5))
    put(tmp_path / "a", stray, b"no manifest names it")
    cache.push(Recording(tmp_path / "store"), tmp_path / "a", keyring=KEY, remote=set())
    assert order == [obj, manifest]  # and never an object no manifest it vouches for names


# --- factory cache stats|prune ------------------------------------------------------------------------------


def size_of(root: Path, *keys: str) -> int:
    return sum((root / k).stat().st_size for k in keys)


def test_cli_stats_and_prune(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path))
    root = cache.local_dir()
    code, out = factory_cli(["cache", "stats", "--json"])
    assert code == 0 and json.loads(out)["entries"] == 0
    now = time.time()
    made = [put_entry(root, bytes([n]) * 1000, n, mtime=now - 100 + n) for n in range(3)]  # 0: least recent
    code, out = factory_cli(["cache", "stats", "--json"])
    data = json.loads(out)
    assert code == 0, out
    assert (data["entries"], data["objects"]) == (3, 3)
    assert data["bytes"] == size_of(root, *(k for keys in made for k in keys))
    assert data["path"] == str(root) and data["oldest"] < data["newest"]
    code, out = factory_cli(["cache", "stats"])
    assert code == 0 and f"compile cache: {root}" in out and "entries: 3" in out
    code, out = factory_cli(["cache", "prune", "--max", str(size_of(root, *made[1], *made[2]))])
    assert code == 0, out
    assert "removed 1 entries" in out
    assert not (root / made[0][0]).exists() and not (root / made[0][1]).exists()
    assert cache.stats(root).entries == 2


def test_stats_count_every_domain(tmp_path: Path) -> None:
    assert cache.stats(tmp_path) == cache.CacheStats(entries=0, objects=0, bytes=0, oldest=None, newest=None)
    a = put_entry(tmp_path, b"a" * 100, 1, mtime=1000.0)
    b = put_entry(tmp_path, b"b" * 50, 2, domain=OTHER_DOMAIN, mtime=2000.0)
    put(tmp_path, f"{cache.LAYOUT}/{DOMAIN}/o/ab/.tmp-half-written", b"x")
    put(tmp_path, f"v1/o/{SHA[:2]}/{SHA}", b"old layout")
    s = cache.stats(tmp_path)
    assert (s.entries, s.objects, s.oldest, s.newest) == (2, 2, 1000.0, 2000.0)
    assert s.bytes == size_of(tmp_path, *a, *b)


def test_prune_removes_the_least_recently_used_first_across_domains(tmp_path: Path) -> None:
    now = time.time()
    made = [
        put_entry(tmp_path, bytes([n]) * 1000, n, domain=(DOMAIN, OTHER_DOMAIN)[n % 2], mtime=now - 100 + n)
        for n in range(6)
    ]
    # a hit (its mark imported) makes the oldest the newest
    outbox, dest = tmp_path / "outbox", cache.domain_dir(tmp_path, DOMAIN)
    first = make_entry(bytes([0]) * 1000, 0)
    put(outbox, compilecache.hit_relative(first.direct_key, first.result_key).as_posix(), b"")
    assert cache.import_outbox(outbox, dest, domain=DOMAIN, keyring=KEY).hits == 1
    total = cache.stats(tmp_path).bytes
    keep = total - size_of(tmp_path, *made[1], *made[2])
    result = cache.prune(keep, tmp_path, now=now)
    assert result.removed_entries == 2 and result.kept_bytes == cache.stats(tmp_path).bytes <= keep
    assert cache.local_files(tmp_path) == {k for n in (0, 3, 4, 5) for k in made[n]}
    assert cache.prune(0, tmp_path, now=now).kept_bytes == 0
    assert cache.stats(tmp_path).entries == 0 and cache.local_files(tmp_path) == set()


def test_prune_removes_other_layouts_and_stray_files_whatever_the_size(tmp_path: Path) -> None:
    root = tmp_path / "local"
    now = time.time()
    kept = put_entry(root, b"kept", 1, mtime=now)
    outside = put(tmp_path / "outside", "precious", b"not the cache's")
    strays = [
        put(root, f"v1/o/{SHA[:2]}/{SHA}", b"old layout"),
        put(root, "stray.txt", b"x"),
        put(root, f"{cache.LAYOUT}/{DOMAIN}/stray", b"x"),
        put(root, f"{cache.LAYOUT}/{DOMAIN}/m/zz/junk", b"x"),
        put(root, f"{cache.LAYOUT}/{DOMAIN}/h/{SHA}-{SHA}", b""),
        put(root, f"{cache.LAYOUT}/{'f' * 63}/o/{SHA[:2]}/{SHA}", b"x"),
    ]
    (root / "v0").symlink_to(outside.parent, target_is_directory=True)  # an old tree that is a link
    for path in strays:
        os.utime(path, (now, now))
    cache.prune(10**9, root, now=now)
    assert [p for p in strays if p.exists()] == []
    assert not os.path.lexists(root / "v0") and outside.read_bytes() == b"not the cache's"
    assert cache.local_files(root) == set(kept)


def test_an_object_two_entries_share_stays_while_one_uses_it(tmp_path: Path) -> None:
    now = time.time()
    shared = b"the same object"
    first = make_entry(shared, 1)
    second = make_entry(shared, 2)
    obj, m1 = keys_of(first)
    _, m2 = keys_of(second)
    put(tmp_path, obj, shared)
    put(tmp_path, m1, cachekeys.signed_manifest(first, domain=DOMAIN, keyring=KEY))
    put(tmp_path, m2, cachekeys.signed_manifest(second, domain=DOMAIN, keyring=KEY))
    for key, age in ((obj, 300), (m1, 200), (m2, 100)):
        os.utime(tmp_path / key, (now - age, now - age))
    total = cache.stats(tmp_path).bytes
    result = cache.prune(total - 1, tmp_path, now=now)
    assert result.removed_entries == 1 and not (tmp_path / m1).exists()
    assert (tmp_path / obj).read_bytes() == shared and (tmp_path / m2).is_file()
    assert result.kept_bytes == size_of(tmp_path, obj, m2)
    assert cache.prune(size_of(tmp_path, obj, m2) - 1, tmp_path, now=now).removed_entries == 1
    assert cache.local_files(tmp_path) == set()


def test_prune_keeps_a_writer_at_work_and_removes_what_one_that_died_left(tmp_path: Path) -> None:
    now = time.time()
    grace = compilecache.TEMP_GRACE_S
    lost_obj, lost = put_entry(tmp_path, b"lost", 1, mtime=now)
    (tmp_path / lost_obj).unlink()  # a manifest without its object, just now: an import may be under way
    old_obj, old = put_entry(tmp_path, b"old", 2, mtime=now - 2 * grace)
    (tmp_path / old_obj).unlink()  # and long ago
    young_obj, young_m = put_entry(tmp_path, b"young", 3, mtime=now)
    (tmp_path / young_m).unlink()  # its manifest is about to follow
    stale_obj, stale_m = put_entry(tmp_path, b"stale", 4, mtime=now - 2 * grace)
    (tmp_path / stale_m).unlink()
    fresh_tmp = put(tmp_path, f"{cache.LAYOUT}/{DOMAIN}/o/ab/.tmp-x.1.aa", b"x")
    stale_tmp = put(tmp_path, f"{cache.LAYOUT}/{DOMAIN}/o/ab/.tmp-x.2.bb", b"x")
    os.utime(stale_tmp, (now - 2 * grace, now - 2 * grace))
    result = cache.prune(10**9, tmp_path, now=now)
    assert result.removed_entries == 1
    assert (tmp_path / lost).is_file() and not (tmp_path / old).exists()
    assert (tmp_path / young_obj).is_file() and fresh_tmp.exists()
    assert not (tmp_path / stale_obj).exists() and not stale_tmp.exists()


@pytest.mark.parametrize("bad", ["12Q", "0", "-5GiB"])
def test_cli_prune_with_a_bad_size_is_one_line(
    bad: str, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    code, out = factory_cli(["cache", "prune", "--max", bad])
    assert code == 2
    assert out.strip().count("\n") == 0 and out.startswith("error: --max: size")


# --- counts, report, display ------------------------------------------------------------------------------


def measured(state: str | None) -> str:
    record: dict[str, object] = {"key": "k.cu|9.0|1", "peak_bytes": 1, "wall_s": 1.0}
    if state is not None:
        record["cache"] = state
    return measurement_line(record)


def test_count_compiles_from_measurement_lines() -> None:
    lines = [measured("hit")] * 12 + [measured("miss")] * 2 + [measured("off"), measured(None)]
    lines += ["[3/15] nvcc ...", "::factory-compile:: {cut short", '::factory:: {"phase": "build"}']
    assert cache.count_compiles(lines) == (12, 4)


def test_report_and_progress_show_cached_and_compiled() -> None:
    r = report.JobResult(job_id="j", variant_id="v", python="3.11", compiles_cached=12, compiles_compiled=3)
    data = r.to_json()
    assert data["compiles_cached"] == 12 and data["compiles_compiled"] == 3
    r.phase, r.started = "build", 0.0
    assert "12 cached / 3 compiled" in progress_line(r, 10.0)
    r.result, r.phase = "ok", "ok"
    rep = report.BuildReport(run_id="r", matrix="m", started=0.0, jobs=[r])
    assert "12 cached / 3 compiled" in summary_lines(rep)[1]
    fresh = report.JobResult(job_id="j", variant_id="v", python="3.11")
    fresh.phase, fresh.started = "build", 0.0
    assert "cached" not in progress_line(fresh, 1.0)


# --- what the build container gets ------------------------------------------------------------------------


@pytest.mark.parametrize("check_hits", [0, 3])
def test_the_container_gets_its_domain_read_only_and_an_outbox_and_no_store_key_or_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, check_hits: int
) -> None:
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "home"))
    secret_key = signing.generate_key()[0].decode()
    monkeypatch.setenv(cachekeys.SIGN_KEY_ENV, secret_key)
    wheel_key = "-----BEGIN PRIVATE KEY-----the-wheel-signing-key"
    monkeypatch.setenv("FACTORY_SIGN_KEY", wheel_key)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.setenv(name, "do-not-leak")
    mf = load_matrix_file(ROOT / "examples" / "demo.yaml")
    config = cache.CacheConfig(
        local=cache.local_dir(),
        store="s3://wheels/secret-prefix/_cache/compile",
        endpoint_url="http://s3.x",
        check_hits=check_hits,
    )
    settings = build.BuildSettings(output=tmp_path / "out", run_id="r1", compile_cache=config)
    runner = build.Runner(None, mf, settings)
    assert runner.compile_cache is not None and runner.compile_cache.keyring.writes_store
    job = plan_matrix(mf).jobs[0]
    run = jobrun.JobRun(runner.context, job, report.JobResult(job_id=job.id, variant_id="v", python="3.11"))
    run.job_cache = runner.compile_cache.open_job(job.id, domain=DOMAIN, run_id="r1")
    outbox = run.job_cache.outbox
    parallel = jobmemory.initial_parallelism(
        recipe=mf.recipe, archs=1, limit_bytes=8 * 2**30, cpus=2, package="p", version="1"
    )
    env = run.container_env(parallel)
    assert env[cache.ENV_DIR] == cache.MOUNT and env[cache.ENV_OUT] == cache.OUT_MOUNT
    assert env.get(cache.ENV_CHECK_HITS) == (str(check_hits) if check_hits else None)
    assert "CXX" not in env  # the driver sets CXX (driver.cache_env)
    assert cachekeys.SIGN_KEY_ENV not in env and "FACTORY_SIGN_KEY" not in env
    assert not [k for k in env if k.startswith("AWS_")]
    leaks = ("secret-prefix", "s3.x", "do-not-leak", secret_key.splitlines()[1], wheel_key)
    assert not [k for k, v in env.items() if any(x in v for x in leaks)]
    inputs = jobrun.JobInputs(image="img", source=tmp_path, wheelhouse=tmp_path, cache_domain=DOMAIN)
    mounts = run.mounts(inputs, tmp_path / "out")
    cached = {m["bind"]: (h, m["mode"]) for h, m in mounts.items() if m["bind"].startswith(cache.MOUNT)}
    assert cached == {
        cache.MOUNT: (str(cache.domain_dir(cache.local_dir(), DOMAIN)), "ro"),
        cache.OUT_MOUNT: (str(outbox), "rw"),
    }
    # neither the whole local cache (every domain), nor its layout's directory, nor where the key file lives
    local = cache.local_dir()
    assert not {local, local.parent, local / cache.LAYOUT} & {Path(h) for h in mounts}
    assert Path(cached[cache.MOUNT][0]).is_dir() and outbox.is_dir()


def cache_job_run(tmp_path: Path, job_env: dict[str, str]) -> tuple[jobrun.JobRun, dict[str, str]]:
    """A job of the demo matrix with the cache on and `job_env` as its matrix env, and its container env."""
    mf = load_matrix_file(ROOT / "examples" / "demo.yaml")
    config = cache.CacheConfig(local=cache.local_dir(tmp_path / "home"))
    settings = build.BuildSettings(output=tmp_path / "out", run_id="r1", compile_cache=config)
    job = replace(plan_matrix(mf).jobs[0], env=job_env)
    run = jobrun.JobRun(
        build.Runner(None, mf, settings).context,
        job,
        report.JobResult(job_id=job.id, variant_id="v", python="3.11"),
    )
    parallel = jobmemory.initial_parallelism(
        recipe=mf.recipe, archs=1, limit_bytes=8 * 2**30, cpus=2, package="p", version="1"
    )
    return run, run.container_env(parallel)


def in_the_container(image_env: dict[str, str], host_env: dict[str, str]) -> dict[str, str]:
    """The build's env as the driver makes it: the image's env under the host's (docker's rule), then the
    driver's own cache settings."""
    env = {**image_env, **host_env}
    return {**env, **driver.cache_env(env)}


def test_a_matrix_cxx_is_the_real_compiler_behind_the_launcher(tmp_path: Path) -> None:
    _, env = cache_job_run(tmp_path, {"CXX": "g++-13"})
    assert env["CXX"] == "g++-13"  # the matrix's, untouched by the host
    built = in_the_container({"PATH": "/usr/bin"}, env)
    assert built["CXX"] == str(driver.CXX_LAUNCHER) and built["FACTORY_REAL_CXX"] == "g++-13"


def test_the_host_sets_no_cxx_so_the_image_cxx_is_kept(tmp_path: Path) -> None:
    """A CXX from the host would replace the image's before the driver could keep it as the real compiler."""
    run, env = cache_job_run(tmp_path, {})
    assert "CXX" not in run.driver_env() and "CXX" not in env
    built = in_the_container({"CXX": "g++-14"}, env)
    assert built["CXX"] == str(driver.CXX_LAUNCHER) and built["FACTORY_REAL_CXX"] == "g++-14"
    assert in_the_container({}, env)["CXX"] == str(driver.CXX_LAUNCHER)


def test_a_verified_hit_that_differs_is_reported_and_its_entry_removed(tmp_path: Path) -> None:
    """`build --check-cache`: the line handler counts each checked hit; one whose bytes differ is named in
    the job's result and its entry removed from the local cache (a suspected poisoned entry)."""
    run, _ = cache_job_run(tmp_path, {})
    sync = run.ctx.compile_cache
    assert sync is not None
    job = sync.open_job(run.job.id, domain=DOMAIN, run_id="r1")
    same, differs = make_entry(b"same", 1), make_entry(b"differs", 2)
    for made in (same, differs):
        obj, manifest = keys_of(made)
        put(sync.local, obj, b"x")
        put(sync.local, manifest, cachekeys.signed_manifest(made, domain=DOMAIN, keyring=sync.keyring))
    for made, check in ((same, "same"), (differs, "differs")):
        line = measurement_line(
            {"key": "k", "peak_bytes": 1, "wall_s": 1.0, "cache": "miss", "cache_check": check,
             "entry": f"{made.direct_key}-{made.result_key}", "source": f"{check}.cu"}
        )  # fmt: skip
        run.lines.cache_checked(line)
    run.lines.cache_checked(measured("miss"))  # an ordinary compile: not a check
    assert run.result.cache_checked == 2 and run.result.cache_suspects == ["differs.cu"]
    assert (job.dest / compilecache.manifest_relative(same.direct_key, same.result_key)).is_file()
    assert not (job.dest / compilecache.manifest_relative(differs.direct_key, differs.result_key)).exists()


def test_the_job_dir_records_its_factory_process(tmp_path: Path) -> None:
    """For `factory clean`: the driver writes it into the job's directory in the work volume."""
    run, env = cache_job_run(tmp_path, {})
    assert leftovers.parse_owner(env[protocol.ENV_JOB_OWNER]) == leftovers.this_process()
    assert run.driver_env()[protocol.ENV_JOB_OWNER] == env[protocol.ENV_JOB_OWNER]


def test_with_the_cache_off_the_container_has_neither(tmp_path: Path) -> None:
    mf = load_matrix_file(ROOT / "examples" / "demo.yaml")
    runner = build.Runner(None, mf, build.BuildSettings(output=tmp_path, run_id="r1", compile_cache=None))
    job = plan_matrix(mf).jobs[0]
    run = jobrun.JobRun(runner.context, job, report.JobResult(job_id=job.id, variant_id="v", python="3.11"))
    env = run.driver_env()
    assert cache.ENV_DIR not in env and cache.ENV_OUT not in env and "CXX" not in env
    inputs = jobrun.JobInputs(image="img", source=tmp_path, wheelhouse=tmp_path)
    binds = [m["bind"] for m in run.mounts(inputs, tmp_path).values()]
    assert cache.MOUNT not in binds and cache.OUT_MOUNT not in binds


def test_measured_cache_reads_one_line() -> None:
    """What the job's line handler counts as lines stream."""
    assert cache.measured_cache(measured("hit")) == "hit"
    assert cache.measured_cache(measured("weird")) == "off"
    assert cache.measured_cache("plain line") is None
    assert cache.measured_cache("::factory-compile:: [1]") is None


def test_build_with_a_bad_cache_flag_is_a_usage_error(
    factory_cli: Callable[[list[str]], tuple[int, str]],
) -> None:
    matrix = str(ROOT / "examples" / "demo.yaml")
    code, out = factory_cli(["build", "--matrix", matrix, "--dry-run", "--cache", "ftp://host/x"])
    assert code == 2 and out.strip() == "error: --cache 'ftp://host/x': use a directory or s3://bucket/prefix"
    code, out = factory_cli(["build", "--matrix", matrix, "--dry-run", "--cache", "off"])
    assert code == 0, out


def test_a_forged_check_line_names_its_source_on_one_line_and_removes_nothing_of_another_domain(
    tmp_path: Path,
) -> None:
    # the build's own output can print measurement lines: the name is shown escaped, the entry must be a
    # pair of keys, and only the job's own domain is touched
    run, _ = cache_job_run(tmp_path, {})
    lines: list[str] = []
    sync = run.ctx.compile_cache
    assert sync is not None
    sync.log = lines.append
    sync.open_job(run.job.id, domain=DOMAIN, run_id="r1")
    other, elsewhere = make_entry(b"theirs", 3), "e" * 64
    obj, manifest = keys_of(other, elsewhere)
    for key in (obj, manifest):
        put(sync.local, key, b"x")
    forged = {"key": "k", "peak_bytes": 1, "wall_s": 1.0, "cache": "miss", "cache_check": "differs"}
    forged["source"] = "a.cu\nfactory: published evil.whl\x1b[2J"
    for entry in (f"{other.direct_key}-{other.result_key}", "../../x-y"):
        run.lines.cache_checked(measurement_line({**forged, "entry": entry}))
    assert run.result.cache_suspects == ["a.cu\\x0afactory: published evil.whl\\x1b[2J"] * 2
    assert len(lines) == 1 and "\n" not in lines[0] and "\x1b" not in lines[0]
    assert (sync.local / manifest).is_file()
