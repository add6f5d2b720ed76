"""A hostile package through the whole factory (dockerd, the pypi image, real nvcc, an S3-protocol server):
its setup.py, running in the build container, plants links, FIFOs, oversized files, forged cache entries and
forged log lines everywhere the container can write, and the host then syncs, checks and publishes.

Nothing outside those places is read or written by the host (a host "secret" file and the host's own
environment, AWS credentials in it, never reach the local cache, the store, the index or a log; a host
directory a link points to stays empty), nothing of the cache is a link or a special file, and no entry the
container forged is a hit for another package's build on the same runner, with the same key, or is taken
at all by a runner with another key. About 5 minutes on 2 cores (two demo builds)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from homes import fresh_home

from bench.matrices import DEMO, write_matrix
from factory.cache import sync
from factory.cache.sync import LAYOUT, parse_store_key
from factory.publish.stores import S3Store
from factory.trust import cachekeys, signing

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DEMO_SRC = ROOT / "examples" / "demo-ext"
FACTORY = [sys.executable, "-m", "factory.cli"]
MARK = b"PLANTED-BY-A-HOSTILE-SETUP-PY"
KEY = signing.generate_key()[0].decode()  # the private key the runners of the store hold

# Appended to the demo's setup.py: everything a build's code can do to the host through what it may write.
HOSTILE = r'''

def _hostile() -> None:
    import hashlib, json, os
    from pathlib import Path

    secret, victim = os.environ["HOSTILE_SECRET_FILE"], os.environ["HOSTILE_VICTIM_DIR"]
    places = [Path(p) for p in (os.environ.get("FACTORY_CACHE_OUT"), "/out") if p]
    places.append(Path(os.environ["FACTORY_JOB_DIR"]))
    for root in places:
        for target, rel in (
            (secret, "o/ab/ab" + "1" * 62),
            ("/proc/self/environ", "o/ac/ac" + "2" * 62),
            (secret, "m/ad/ad" + "3" * 62 + "/" + "4" * 64 + ".json"),
            (secret, "h/" + "ad" + "3" * 62 + "-" + "4" * 64),
            (secret, "evil.whl"),
        ):
            path = root / rel
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.symlink_to(target)
            except OSError:
                pass
        try:  # a directory the host would write into
            (root / "m").mkdir(exist_ok=True)
            (root / "m" / "ae").symlink_to(victim, target_is_directory=True)
            (root / "o" / "af").mkdir(parents=True, exist_ok=True)
            os.mkfifo(root / "o" / "af" / ("af" + "5" * 62))
            (root / "o" / "b0").mkdir(parents=True, exist_ok=True)
            with open(root / "o" / "b0" / ("b0" + "6" * 62), "wb") as fh:
                fh.truncate(5 << 30)  # sparse: over any object bound
        except OSError:
            pass
    # the cache itself is read-only here
    cache_dir = os.environ.get("FACTORY_CACHE_DIR")
    if cache_dir:
        try:
            (Path(cache_dir) / "planted").write_bytes(b"x")
            print("HOSTILE: wrote into the cache")
        except OSError:
            pass
    # forged log lines: a wheel outside /out, a check that names an entry
    print('::factory:: {"wheel": "../../../../etc/passwd"}', flush=True)


def _forge() -> None:
    """After the compiles: for every entry made, one with the same key and a planted object."""
    import hashlib, json, os
    from pathlib import Path
    from factory.container import compilecache

    out, seen = os.environ.get("FACTORY_CACHE_OUT"), os.environ.get("FACTORY_CACHE_DIR")
    if not out:
        return
    for root in (Path(out), Path(seen or out)):
        for manifest in sorted(root.glob("m/*/*/*.json")):
            if manifest.is_symlink():
                continue
            try:
                raw = json.loads(manifest.read_text())
                obj = Path(seen or out) / "o" / raw["object_sha256"][:2] / raw["object_sha256"]
                planted = obj.read_bytes() + MARK_BYTES
            except (OSError, ValueError, KeyError):
                continue
            inputs = [list(i) for i in raw["inputs"]]
            first = inputs[0][0]
            inputs.append([first.replace("/", "/./", 1), inputs[0][1]])  # the same file: still a match
            sha = hashlib.sha256(planted).hexdigest()
            entry = compilecache.Entry(
                direct_key=raw["direct_key"], result_key=compilecache.result_key(raw["direct_key"], inputs),
                inputs=tuple(tuple(i) for i in inputs), object_sha256=sha, object_size=len(planted),
                depfile=raw.get("depfile"), created=1.0,
            )
            target = Path(out) / "o" / sha[:2] / sha
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(planted)
            path = Path(out) / compilecache.manifest_relative(entry.direct_key, entry.result_key)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(compilecache.manifest_json(entry))


MARK_BYTES = b"PLANTED-BY-A-HOSTILE-SETUP-PY"
_hostile()
'''

FORGE_AFTER_SETUP = "\n_forge()\n"


def hostile_source(tmp: Path) -> Path:
    src = tmp / "hostile-ext"
    shutil.copytree(DEMO_SRC, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    text = (src / "setup.py").read_text()
    head, sep, tail = text.partition("\nsetup(\n")
    (src / "setup.py").write_text(head + HOSTILE + sep + tail + FORGE_AFTER_SETUP)
    return src


def matrix(
    tmp: Path,
    name: str,
    source: Path,
    *,
    env: dict[str, str],
    publish: Mapping[str, str],
    build: Mapping[str, str] | None = None,
) -> Path:
    """The demo matrix (`examples/demo.yaml`) of `source`, one job, `env` the recipe's."""
    return write_matrix(
        DEMO,
        tmp / f"{name}.yaml",
        source=source,
        recipe={"env": env},
        matrix={"arch": ["8.0"]},
        build={"memory": None, **(build or {})},
        publish=publish,
    )


@pytest.fixture(scope="module")
def s3() -> Iterator[tuple[str, Any, dict[str, str]]]:
    import boto3
    from moto.server import ThreadedMotoServer

    creds = {
        "AWS_ACCESS_KEY_ID": "AKIA" + secrets.token_hex(8).upper(),
        "AWS_SECRET_ACCESS_KEY": "aws-secret-" + secrets.token_hex(16),
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    )
    client.create_bucket(Bucket="wheels")
    try:
        yield endpoint, client, creds
    finally:
        server.stop()


def build(matrix_file: Path, out: Path, home: Path, creds: dict[str, str]) -> dict[str, Any]:
    env = {**os.environ, **creds, "FACTORY_HOME": str(home), cachekeys.SIGN_KEY_ENV: KEY}
    proc = subprocess.run(
        [*FACTORY, "build", "--trust-paths", "--matrix", str(matrix_file), "--output", str(out), "--publish"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )
    assert (out / "report.json").is_file(), proc.stderr[-3000:]
    (job,) = json.loads((out / "report.json").read_text())["jobs"]
    assert job["result"] == "ok", (job["reason"], job["log_tail"], proc.stderr[-2000:])
    return job


def tree_bytes(root: Path) -> Iterator[tuple[Path, bytes]]:
    """Every regular file under root with its content; links and special files are reported, not read."""
    for dirpath, dirnames, names in os.walk(root):
        for name in [*names, *dirnames]:
            path = Path(dirpath, name)
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode) and path.is_relative_to(root / "cache"):
                raise AssertionError(f"a link in the cache: {path}")
            if stat.S_ISREG(st.st_mode):
                yield path, path.read_bytes()


def so_bytes(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        (so,) = [n for n in zf.namelist() if n.endswith(".so")]
        return zf.read(so)


def test_a_hostile_setup_py_cannot_reach_the_host_the_store_or_another_build(
    tmp_path: Path, docker_client: Any, session_factory_home: Path, s3: tuple[str, Any, dict[str, str]]
) -> None:
    endpoint, client, creds = s3
    secret_text = "host-secret-" + secrets.token_hex(16)
    secret = tmp_path / "host-secret.txt"
    secret.write_text(secret_text)
    victim = tmp_path / "victim-dir"
    victim.mkdir()
    home = fresh_home(tmp_path, "home", session_factory_home)
    env = {"HOSTILE_SECRET_FILE": str(secret), "HOSTILE_VICTIM_DIR": str(victim)}

    publish = {"to": "s3://wheels/idx", "endpoint_url": endpoint}
    hostile = matrix(tmp_path, "hostile", hostile_source(tmp_path), env=env, publish=publish)
    job = build(hostile, tmp_path / "w-hostile", home, creds)
    assert job["compiles_compiled"] >= 5 and job["compiles_cached"] == 0

    # nothing written outside the places the container may write, nothing read from the host into them
    assert secret.read_text() == secret_text and not list(victim.iterdir())
    needles = [secret_text.encode(), creds["AWS_SECRET_ACCESS_KEY"].encode(), KEY.splitlines()[1].encode()]
    listed = client.list_objects_v2(Bucket="wheels", Prefix="")["Contents"]
    stored = {o["Key"]: client.get_object(Bucket="wheels", Key=o["Key"])["Body"].read() for o in listed}
    assert any(k.endswith(".whl") for k in stored), "the hostile package's wheel was published"
    local = [*tree_bytes(home), *tree_bytes(tmp_path / "w-hostile")]
    for needle in needles:
        assert not [k for k, v in stored.items() if needle in v], "a secret reached the store"
        assert not [p for p, v in local if needle in v], "a secret reached the factory's files"
    cache_files = [p for p, _ in tree_bytes(home / "cache" / "compile")]
    assert cache_files and all(
        parse_store_key(str(p.relative_to(home / "cache" / "compile"))) for p in cache_files
    )
    assert not any(p.name == "planted" for p in cache_files), "the container wrote into the read-only cache"
    remote = {k.removeprefix("idx/_cache/compile/") for k in stored if k.startswith("idx/_cache/")}
    assert remote and all(parse_store_key(k) for k in remote)

    # the same wheel published to a directory store too
    proc = subprocess.run(
        [*FACTORY, "publish", str(tmp_path / "w-hostile"), "--to", str(tmp_path / "index")],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "FACTORY_HOME": str(home)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    published = list(tree_bytes(tmp_path / "index"))
    assert any(p.suffix == ".whl" for p, _ in published)
    assert not [p for p, v in published for n in needles if n in v]

    # another package on the same runner, same key, same store: none of the hostile entries is a hit
    honest = matrix(
        tmp_path, "honest", DEMO_SRC, env={}, build={"cache": "s3://wheels/idx/_cache/compile"},
        publish={"to": "s3://wheels/honest", "endpoint_url": endpoint},
    )  # fmt: skip
    victim_job = build(honest, tmp_path / "w-honest", home, creds)
    assert victim_job["compiles_cached"] == 0 and victim_job["compiles_compiled"] >= 5
    assert MARK not in so_bytes(tmp_path / "w-honest" / victim_job["wheel"])
    planted = [p for p, v in tree_bytes(home / "cache" / "compile") if MARK in v]
    hostile_domains = {p.relative_to(home / "cache" / "compile" / LAYOUT).parts[0] for p in planted}
    assert len(hostile_domains) <= 1, "planted objects are in the hostile package's domain alone"

    # a runner with another key takes no manifest of this store
    other = cachekeys.Keyring(signing=Ed25519PrivateKey.generate(), writes_store=True)
    os.environ.update(creds)
    try:
        store = S3Store("wheels", "idx/_cache/compile", endpoint_url=endpoint)
        got = sync.pull(store, tmp_path / "other-runner", keyring=other)
    finally:
        for k in creds:
            os.environ.pop(k, None)
    assert got.failed > 0  # the manifests: each one signed by a key it does not hold
    assert not [k for k in sync.local_files(tmp_path / "other-runner") if "/m/" in k]
