"""`factory index audit` on the S3 server (moto over HTTP): the wheels the unit tests zip by hand, published
to a bucket, then a store writer's swap of a wheel's bytes (its recorded sha256 kept, so only hashing the
bytes finds it), a deleted signature and a wheel relabelled for another arch set, found by the command."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from publish_helpers import relabelled
from test_publish_s3 import Moto, moto  # noqa: F401

from factory.core.tags import canonical_wheel_filename
from factory.publish import index
from factory.publish.publisher import publish_wheels
from factory.trust import signing

pytestmark = pytest.mark.integration
BUCKET, PREFIX = "audit", "idx"


def _unit_helpers() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "unit" / "publish" / "test_index_audit.py"
    name = "_factory_test_helpers_test_index_audit"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def audit(moto: Moto, *args: str) -> subprocess.CompletedProcess[str]:  # noqa: F811
    argv = [sys.executable, "-m", "factory.cli", "index", "audit", "--to", f"s3://{BUCKET}/{PREFIX}"]
    argv += ["--endpoint-url", moto.endpoint, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def test_the_audit_finds_swapped_bytes_a_missing_signature_and_wrong_archs_on_s3(
    moto: Moto,  # noqa: F811
    tmp_path: Path,
) -> None:
    helpers = _unit_helpers()
    moto.bucket(BUCKET)
    private = Ed25519PrivateKey.generate()
    pub = tmp_path / "key.pub"
    pub.write_bytes(
        private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    )
    signer = signing.make_signer(private, source="test")
    sm80 = helpers.ext_wheel(tmp_path / "a")
    sm90 = helpers.ext_wheel(tmp_path / "b", label="cu13.0.torch2.14.abi1.sm90", cubins=(90,), archs=("9.0",))
    to = f"s3://{BUCKET}/{PREFIX}"
    publish_wheels([sm80, sm90], to=to, endpoint_url=moto.endpoint, signer=signer)

    clean = audit(moto, "--key", str(pub), "--json")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    doc = json.loads(clean.stdout)
    assert doc["ok"] and doc["wheels"] == 2 and doc["signatures"]["checked"]

    # planted: the sm80 build relabelled as an sm86 wheel, published and signed as any other
    planted = relabelled(sm80, "cu13.0.torch2.14.abi1.sm86", tmp_path / "planted")
    publish_wheels([planted], to=to, endpoint_url=moto.endpoint, signer=signer)
    k80 = index.files_path(helpers.VID, canonical_wheel_filename(sm80.name))
    k90 = index.files_path("cu130-torch2.14-abi1-sm90", canonical_wheel_filename(sm90.name))
    k86 = index.files_path("cu130-torch2.14-abi1-sm86", canonical_wheel_filename(planted.name))
    # a store writer swaps the sm80 wheel's bytes and keeps the sha256 its upload recorded
    data = bytearray(sm80.read_bytes())
    data[len(data) // 2] ^= 0xFF
    recorded = hashlib.sha256(sm80.read_bytes()).hexdigest()
    moto.client.put_object(
        Bucket=BUCKET, Key=f"{PREFIX}/{k80}", Body=bytes(data), Metadata={"sha256": recorded}
    )
    moto.client.delete_object(Bucket=BUCKET, Key=f"{PREFIX}/{k90}{index.SIGNATURE_SUFFIX}")

    found = audit(moto, "--key", str(pub), "--report", str(tmp_path / "audit.json"))
    assert found.returncode == 1, found.stdout + found.stderr
    problems = [
        line.removeprefix("problem: ") for line in found.stdout.splitlines() if line.startswith("problem: ")
    ]
    by_key: dict[str, list[str]] = {}
    for line in problems:
        where, check, _message = line.split(": ", 2)
        by_key.setdefault(where, []).append(check)
    assert by_key[k80] == ["page", "signature"], problems  # hashed: the swap is found, its signature fails
    assert by_key[k90] == ["signature"], problems
    assert "device-code" in by_key[k86] and "provenance" in by_key[k86], problems
    assert f"{k90}: signature: no signature ({k90}.sig.json is missing)" in problems
    (device,) = [line for line in problems if line.startswith(f"{k86}: device-code: ")]
    assert "cubins for sm_80, expected sm_86" in device
    report = json.loads((tmp_path / "audit.json").read_text())
    assert report["ok"] is False and len(report["problems"]) == len(problems)
    assert "Traceback" not in found.stderr
