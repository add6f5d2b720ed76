"""Signed publishing end to end: `factory publish --sign-key` to a directory and to S3 (moto over HTTP), the
signature file beside each wheel, written once; then `factory verify` and `factory which --verify-key` as a
consumer runs them against the index served over real HTTP (`factory serve`, the bucket's URL), and every
refusal: a changed byte, a swapped signature, a wrong key, an unsigned wheel."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from publish_helpers import LABEL_NEW, VID_NEW, make_wheel
from test_publish_s3 import Moto, moto  # noqa: F401 -- the module's moto server fixture

from factory.publish.index import SIGNATURE_SUFFIX, signature_path
from factory.trust.signing import write_key_pair

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
FACTORY = [sys.executable, "-m", "factory"]

# A stand-in torch for `factory which --python` (its probe reads only these): the host VID_NEW is for.
STUB_TORCH = """
__version__ = "2.14.1"
class version:
    cuda = "13.0"
class _C:
    _GLIBCXX_USE_CXX11_ABI = True
class cuda:
    @staticmethod
    def is_available():
        return False
"""


def environ(**extra: str) -> dict[str, str]:
    """This process's environment (the moto fixture's credentials too), running this checkout's factory
    whichever one the interpreter has installed, with no signing key but those given."""
    env = {k: v for k, v in os.environ.items() if k != "FACTORY_SIGN_KEY"}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def factory(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FACTORY, *args], capture_output=True, text=True, timeout=300, env=env or environ()
    )


def refused(proc: subprocess.CompletedProcess[str], why: str) -> None:
    """Exit 1, one line on stderr saying `why`, no install command on stdout."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and why in proc.stderr, proc.stderr
    assert "install" not in proc.stdout


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("keys")
    write_key_pair(tmp / "signer")
    write_key_pair(tmp / "other")
    return {"private": tmp / "signer", "public": tmp / "signer.pub", "wrong": tmp / "other.pub"}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("signedwheels")
    return {
        "tinyvar": make_wheel(tmp / "a", label=LABEL_NEW),
        "othervar": make_wheel(tmp / "b", name="othervar", label=LABEL_NEW),
        "unsigned": make_wheel(tmp / "c", name="plainvar", label=LABEL_NEW),
    }


def serve(root: Path, log: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [*FACTORY, "serve", str(root), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
        env=environ(),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("serving "), line
    return proc, line.split(" at ", 1)[1].strip().removesuffix("simple/")


@pytest.fixture(scope="module")
def index_dir(
    tmp_path_factory: pytest.TempPathFactory, keys: dict[str, Path], wheels: dict[str, Path]
) -> Path:
    """A directory index: tinyvar and othervar published signed, plainvar unsigned."""
    idx = tmp_path_factory.mktemp("signedindex") / "idx"
    for name in ("tinyvar", "othervar"):
        proc = factory(
            "publish", str(wheels[name].parent), "--to", str(idx), "--sign-key", str(keys["private"])
        )
        assert proc.returncode == 0, proc.stderr
        assert "1 signature file(s) written" in proc.stdout
    assert factory("publish", str(wheels["unsigned"].parent), "--to", str(idx)).returncode == 0
    return idx


@pytest.fixture(scope="module")
def served(index_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, url = serve(index_dir, tmp_path_factory.mktemp("servelog") / "access.log")
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def file_url(base: str, name: str) -> str:
    return f"{base}files/{VID_NEW}/{quote(name)}"


def test_signature_sits_beside_the_wheel_and_pages_do_not_change(
    index_dir: Path, wheels: dict[str, Path]
) -> None:
    name = wheels["tinyvar"].name
    sig = index_dir / signature_path(VID_NEW, name)
    doc = json.loads(sig.read_bytes())
    assert doc["filename"] == name and doc["format"] == "wheel-factory-signature"
    assert not (index_dir / signature_path(VID_NEW, wheels["unsigned"].name)).exists()
    # the pages say nothing of signatures: an unsigned index's pages are the same
    page = (index_dir / "simple" / VID_NEW / "tinyvar" / "index.json").read_text()
    assert (
        SIGNATURE_SUFFIX not in page
        and ".sig" not in (index_dir / "simple" / VID_NEW / "tinyvar" / "index.html").read_text()
    )


def test_published_signatures_never_change(
    tmp_path: Path, keys: dict[str, Path], wheels: dict[str, Path]
) -> None:
    """Publishing a signed wheel again, even with another key, keeps its signature; a wheel published
    unsigned gets one later without its bytes changing."""
    idx = tmp_path / "idx"
    wheel_dir = str(wheels["tinyvar"].parent)
    assert factory("publish", wheel_dir, "--to", str(idx)).returncode == 0
    stored = idx / "files" / VID_NEW / wheels["tinyvar"].name
    before = (stored.read_bytes(), stored.stat().st_mtime_ns)
    sig = idx / signature_path(VID_NEW, wheels["tinyvar"].name)
    assert not sig.exists()
    signed = factory("publish", wheel_dir, "--to", str(idx), "--sign-key", str(keys["private"]))
    assert (
        signed.returncode == 0
        and "unchanged" in signed.stdout
        and "1 signature file(s) written" in signed.stdout
    )
    assert (stored.read_bytes(), stored.stat().st_mtime_ns) == before
    first = sig.read_bytes()
    other_key = tmp_path / "k2"
    write_key_pair(other_key)
    # the signing key from the environment this time (what the reusable workflow passes)
    env = environ(FACTORY_SIGN_KEY=other_key.read_text())
    again = factory("publish", wheel_dir, "--to", str(idx), env=env)
    assert again.returncode == 0 and "0 signature file(s) written, 1 already there" in again.stdout
    assert sig.read_bytes() == first
    assert factory("verify", str(stored), "--key", str(keys["public"])).returncode == 0


def test_verify_over_http(served: str, keys: dict[str, Path], wheels: dict[str, Path]) -> None:
    url = file_url(served, wheels["tinyvar"].name)
    ok = factory("verify", url, "--key", str(keys["public"]))
    assert ok.returncode == 0 and ok.stdout.startswith(f"OK {wheels['tinyvar'].name}: sha256 "), ok.stderr
    refused(factory("verify", url, "--key", str(keys["wrong"])), "not by the key given")
    refused(
        factory("verify", file_url(served, wheels["unsigned"].name), "--key", str(keys["public"])), "unsigned"
    )


def test_a_tampered_index_is_refused(
    index_dir: Path, tmp_path: Path, keys: dict[str, Path], wheels: dict[str, Path]
) -> None:
    """What a hostile index or a mirror in between could do: change a byte of a wheel, put another wheel's
    (valid) signature beside it, or serve a huge or garbage signature file."""
    copy = tmp_path / "idx"
    shutil.copytree(index_dir, copy)
    files = copy / "files" / VID_NEW
    tiny, other = wheels["tinyvar"].name, wheels["othervar"].name
    changed = bytearray((files / tiny).read_bytes())
    changed[len(changed) // 2] ^= 0x01
    (files / tiny).write_bytes(bytes(changed))
    (files / (other + SIGNATURE_SUFFIX)).unlink()
    (files / (other + SIGNATURE_SUFFIX)).write_bytes((index_dir / signature_path(VID_NEW, tiny)).read_bytes())
    plain = wheels["unsigned"].name
    (files / (plain + SIGNATURE_SUFFIX)).write_bytes(b"{" + b" " * (64 << 20))  # read 4 KiB deep, no more
    proc, url = serve(copy, tmp_path / "access.log")
    try:
        refused(
            factory("verify", file_url(url, tiny), "--key", str(keys["public"])),
            "changed after it was signed",
        )
        refused(factory("verify", file_url(url, other), "--key", str(keys["public"])), "of another wheel")
        which = run_which(url, tmp_path, "--verify-key", str(keys["public"]), "othervar")
        refused(which, "of another wheel")
        refused(
            factory("verify", file_url(url, plain), "--key", str(keys["public"])), "larger than 4096 bytes"
        )
        (files / (plain + SIGNATURE_SUFFIX)).write_bytes(b"\x1b[2J<html>garbage")
        refused(factory("verify", file_url(url, plain), "--key", str(keys["public"])), "not JSON")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def run_which(index: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`factory which` for the host VID_NEW is for (a stand-in torch; no GPU, no nvidia-smi on PATH)."""
    stub = tmp_path / "stub"
    if not stub.exists():
        (stub / "torch").mkdir(parents=True)
        (stub / "torch" / "__init__.py").write_text(STUB_TORCH)
        (tmp_path / "no-tools").mkdir()
        wrapper = tmp_path / "python"
        wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={stub} exec {sys.executable} "$@"\n')
        wrapper.chmod(0o755)
    env = environ(PATH=str(tmp_path / "no-tools"), CUDA_VISIBLE_DEVICES="")
    return factory("which", "--index-url", index, "--python", str(tmp_path / "python"), *args, env=env)


def test_which_prints_commands_only_for_signed_wheels(
    served: str, tmp_path: Path, keys: dict[str, Path], wheels: dict[str, Path]
) -> None:
    ok = run_which(served, tmp_path, "--verify-key", str(keys["public"]), "tinyvar")
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.splitlines()
    assert f"signed: {wheels['tinyvar'].name} (key " in "\n".join(lines)
    assert lines[-2].startswith("pip install ") and lines[-1].startswith("uv pip install ")
    # both install exactly the bytes verified (tests/integration/test_safe_commands.py runs them)
    sha = hashlib.sha256(wheels["tinyvar"].read_bytes()).hexdigest()
    pinned = f"tinyvar @ {file_url(served, wheels['tinyvar'].name)}#sha256={sha}"
    assert shlex.split(lines[-2])[-1] == pinned and shlex.split(lines[-1])[-1] == pinned
    refused(
        run_which(served, tmp_path, "--verify-key", str(keys["wrong"]), "tinyvar"), "not by the key given"
    )
    refused(run_which(served, tmp_path, "--verify-key", str(keys["public"]), "plainvar"), "unsigned")
    # every project of the index, when none is named: plainvar's being unsigned refuses them all
    refused(run_which(served, tmp_path, "--verify-key", str(keys["public"])), "unsigned")
    assert run_which(served, tmp_path, "plainvar").returncode == 0  # without a key, as before


def test_signed_publish_to_s3_and_verify_from_the_bucket_url(
    moto: Moto,  # noqa: F811
    tmp_path: Path,
    keys: dict[str, Path],
    wheels: dict[str, Path],
) -> None:
    moto.bucket("signed")
    to = "s3://signed/team/idx"
    for name in ("tinyvar", "unsigned"):
        sign = ["--sign-key", str(keys["private"])] if name == "tinyvar" else []
        proc = factory(
            "publish", str(wheels[name].parent), "--to", to, "--endpoint-url", moto.endpoint, *sign
        )
        assert proc.returncode == 0, proc.stderr
    key = f"team/idx/{signature_path(VID_NEW, wheels['tinyvar'].name)}"
    head = moto.client.head_object(Bucket="signed", Key=key)
    assert head["ContentType"] == "application/json" and "immutable" in head["CacheControl"]
    again = factory(
        "publish",
        str(wheels["tinyvar"].parent),
        "--to",
        to,
        "--endpoint-url",
        moto.endpoint,
        "--sign-key",
        str(keys["private"]),
    )
    assert again.returncode == 0 and "0 signature file(s) written" in again.stdout
    assert moto.client.head_object(Bucket="signed", Key=key)["ETag"] == head["ETag"]
    base = f"{moto.endpoint}/signed/team/idx/"
    assert (
        factory("verify", file_url(base, wheels["tinyvar"].name), "--key", str(keys["public"])).returncode
        == 0
    )
    refused(
        factory("verify", file_url(base, wheels["tinyvar"].name), "--key", str(keys["wrong"])),
        "not by the key",
    )
    ok = run_which(base, tmp_path, "--verify-key", str(keys["public"]), "tinyvar")
    assert ok.returncode == 0 and "signed: " in ok.stdout, ok.stderr
    refused(run_which(base, tmp_path, "--verify-key", str(keys["public"]), "plainvar"), "unsigned")
