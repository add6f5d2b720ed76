"""Wheel signatures (factory.trust.signing, factory.consume.verify): the payload, the signature file both
ways, keys, and
every way `factory verify` refuses: a changed byte, a swapped signature, a wrong key, none, a hostile file."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from factory.consume.verify import verify_signature
from factory.core.errors import ConfigError
from factory.publish.index import SIGNATURE_SUFFIX, signature_path
from factory.trust import signing
from factory.trust.signing import (
    MAX_SIGNATURE_BYTES,
    Signature,
    SignatureError,
    check,
    compose_signature,
    key_id,
    load_private_key,
    load_public_key,
    make_signer,
    parse_signature,
    payload,
    signer_from,
)

NAME = "demo_ext-0.1.0+cu13.0.torch2.14.abi1.sm80.90-cp311-cp311-linux_x86_64.whl"
OTHER = "demo_ext-0.1.0+cu13.0.torch2.14.abi1.sm80.90-cp312-cp312-linux_x86_64.whl"
SHA = "ab" * 32


def new_signer() -> signing.Signer:
    return make_signer(Ed25519PrivateKey.generate(), source="test")


def wheel(directory: Path, name: str = NAME, payload_text: str = "x") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("demo_ext/__init__.py", payload_text)
    return path


def signed(directory: Path, signer: signing.Signer, name: str = NAME, payload_text: str = "x") -> Path:
    path = wheel(directory, name, payload_text)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    path.with_name(path.name + SIGNATURE_SUFFIX).write_bytes(signer.sign(name, digest))
    return path


def pub(signer: signing.Signer) -> signing.Ed25519PublicKey:
    return signer._key.public_key()


# ---------------------------------------------------------------------------------------------- format


def test_payload_is_canonical_json_binding_name_and_hash() -> None:
    assert payload(NAME, SHA) == (
        b'{"filename":"'
        + NAME.encode()
        + b'","format":"wheel-factory-signature","sha256":"'
        + SHA.encode()
        + b'","version":1}'
    )
    assert payload(NAME, SHA) != payload(OTHER, SHA)


def test_compose_and_parse_round_trip() -> None:
    sig = Signature(filename=NAME, sha256=SHA, key_id="SHA256:" + "A" * 43, signature=bytes(range(64)))
    data = compose_signature(sig)
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    assert parse_signature(data) == sig
    doc = json.loads(data)
    assert (
        doc["format"] == "wheel-factory-signature" and doc["version"] == 1 and doc["algorithm"] == "ed25519"
    )


def test_signatures_are_deterministic() -> None:
    """Ed25519 signs deterministically: publishing again with the same key makes the same file."""
    signer = new_signer()
    assert signer.sign(NAME, SHA) == signer.sign(NAME, SHA)


def test_key_id_is_the_openssh_fingerprint() -> None:
    key = Ed25519PrivateKey.generate().public_key()
    line = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    blob = base64.b64decode(line.split()[1])
    assert key_id(key) == "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def test_good_signature_checks() -> None:
    signer = new_signer()
    sig = check(signer.sign(NAME, SHA), filename=NAME, sha256=SHA, key=pub(signer))
    assert sig.key_id == signer.key_id


def test_a_non_canonical_local_name_still_checks() -> None:
    signer = new_signer()
    check(signer.sign(NAME, SHA), filename=NAME.replace("demo_ext", "Demo_Ext"), sha256=SHA, key=pub(signer))


def test_changed_bytes_refused() -> None:
    signer = new_signer()
    with pytest.raises(SignatureError, match="changed after it was signed"):
        check(signer.sign(NAME, SHA), filename=NAME, sha256="cd" * 32, key=pub(signer))


def test_swapped_signature_refused() -> None:
    """A valid signature of another wheel, moved beside this one."""
    signer = new_signer()
    with pytest.raises(SignatureError, match=f"of another wheel, {re.escape(OTHER)}"):
        check(signer.sign(OTHER, SHA), filename=NAME, sha256=SHA, key=pub(signer))


def test_wrong_key_refused() -> None:
    signer, other = new_signer(), new_signer()
    said = f"signed by key {re.escape(signer.key_id)}, not by the key given"
    with pytest.raises(SignatureError, match=said):
        check(signer.sign(NAME, SHA), filename=NAME, sha256=SHA, key=pub(other))


def test_altered_claims_refused() -> None:
    """The fields a signature file claims are covered by the signature: editing one breaks it."""
    signer = new_signer()
    doc = json.loads(signer.sign(NAME, SHA))
    doc["sha256"] = "cd" * 32
    with pytest.raises(SignatureError, match="does not verify"):
        check(json.dumps(doc).encode(), filename=NAME, sha256="cd" * 32, key=pub(signer))
    doc = json.loads(signer.sign(NAME, SHA))
    doc["key"] = new_signer().key_id  # the key id is a hint, but one that lies is refused too
    with pytest.raises(SignatureError, match=r"names key .*, but was made with"):
        check(json.dumps(doc).encode(), filename=NAME, sha256=SHA, key=pub(signer))


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "not JSON"),
        (b"\xff\xfe garbage", "not JSON"),
        (b"[" * 100_000, "larger than"),
        (b"[" * 4000, "not JSON"),  # nested deeper than the JSON parser goes
        (b" " * (MAX_SIGNATURE_BYTES + 1), "larger than"),
        (b"[]", "format"),
        (b'{"format": "wheel-factory-signature", "version": 2}', "version 2"),
        (b'{"format": "wheel-factory-signature", "version": true}', "version true"),
        (b'{"format": "wheel-factory-signature", "version": 1}', "its fields are not"),
    ],
)
def test_hostile_signature_files_refused(data: bytes, why: str) -> None:
    with pytest.raises(SignatureError, match=why) as err:
        parse_signature(data)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("algorithm", "rsa", "algorithm"),
        ("filename", 3, '"filename" is not a string'),
        ("filename", "../x.whl", "not a canonical wheel filename"),
        ("filename", NAME.replace("demo_ext", "Demo-Ext"), "not a canonical wheel filename"),
        ("sha256", "AB" * 32, '"sha256"'),
        ("key", "SHA256:\x1b[31m", '"key"'),
        ("signature", "!!", '"signature"'),
        ("signature", base64.b64encode(b"x" * 63).decode(), '"signature"'),
    ],
)
def test_malformed_fields_refused(field: str, value: object, why: str) -> None:
    doc = json.loads(new_signer().sign(NAME, SHA))
    doc[field] = value
    with pytest.raises(SignatureError, match=why):
        parse_signature(json.dumps(doc).encode())


@pytest.mark.parametrize("field", ["sha256", "filename", "signature", "format"])
def test_a_key_given_twice_is_refused(field: str) -> None:
    """json.loads would let the last of two keys win: a reader seeing the first would check other claims
    than the ones the signature was checked against."""
    good = new_signer().sign(NAME, SHA)
    doc = json.loads(good)
    twice = good.rstrip(b"\n}") + b"," + json.dumps({field: doc[field]})[1:].encode()
    assert json.loads(twice) == doc  # the same document to a lenient reader
    with pytest.raises(SignatureError, match=f"duplicate key '{field}'") as err:
        parse_signature(twice)
    assert "\n" not in str(err.value)
    assert parse_signature(good).sha256 == SHA


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity"])
def test_json_constants_are_refused(constant: bytes) -> None:
    good = new_signer().sign(NAME, SHA)
    with pytest.raises(SignatureError, match="not JSON"):
        parse_signature(good.replace(b'"version":1', b'"version":' + constant))


@given(st.binary(max_size=600))
def test_any_bytes_parse_or_refuse_in_one_line(data: bytes) -> None:
    try:
        parse_signature(data)
    except SignatureError as exc:
        assert "\n" not in str(exc)


# ---------------------------------------------------------------------------------------------- keys


def test_keys_load_in_pem_and_openssh_forms() -> None:
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    ssh = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    want = key_id(key.public_key())
    for data in (pem, ssh):
        assert key_id(load_private_key(data, shown="k").public_key()) == want
    pub_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    pub_ssh = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    for data in (pub_pem, pub_ssh + b" comment\n"):
        assert key_id(load_public_key(data, shown="k")) == want


def test_key_loading_errors_name_the_source_never_the_key() -> None:
    key = Ed25519PrivateKey.generate()
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pass"),
    )
    with pytest.raises(ConfigError, match="encrypted"):
        load_private_key(encrypted, shown="--sign-key k")
    ec = generate_private_key(SECP256R1())
    ec_pem = ec.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(ConfigError, match="not an Ed25519 private key"):
        load_private_key(ec_pem, shown="k")
    ec_pub = ec.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    with pytest.raises(ConfigError, match="not an Ed25519 key"):
        load_public_key(ec_pub, shown="k")
    secret = b"-----BEGIN PRIVATE KEY-----\nc2VjcmV0c2VjcmV0\n-----END PRIVATE KEY-----\n"
    with pytest.raises(ConfigError, match="not a private key") as err:
        load_private_key(secret, shown="$FACTORY_SIGN_KEY")
    assert "c2VjcmV0" not in str(err.value)
    with pytest.raises(ConfigError, match="not a public key"):
        load_public_key(b"garbage", shown="k")


def test_signer_from_file_env_or_default(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (tmp_path / "k").write_bytes(pem)
    want = key_id(key.public_key())
    from_file = signer_from(path=tmp_path / "k", environ={})
    assert from_file is not None and from_file.key_id == want
    assert pem.decode() not in repr(from_file)
    from_env = signer_from(env_name="MY_KEY", environ={"MY_KEY": pem.decode()})
    assert from_env is not None and from_env.source == "$MY_KEY"
    default = signer_from(environ={"FACTORY_SIGN_KEY": pem.decode()})
    assert default is not None and default.key_id == want
    assert signer_from(environ={}) is None
    assert signer_from(environ={"FACTORY_SIGN_KEY": ""}) is None  # a CI secret that is not set
    with pytest.raises(ConfigError, match="--sign-key-env MY_KEY: the variable is unset or empty"):
        signer_from(env_name="MY_KEY", environ={})
    with pytest.raises(ConfigError, match="give one"):
        signer_from(path=tmp_path / "k", env_name="MY_KEY", environ={})
    with pytest.raises(ConfigError, match="cannot read"):
        signer_from(path=tmp_path / "missing", environ={})
    (tmp_path / "huge").write_bytes(b"x" * (signing.MAX_KEY_BYTES + 1))
    with pytest.raises(ConfigError, match="not a key file"):
        signer_from(path=tmp_path / "huge", environ={})


def test_signature_file_sits_beside_the_wheel() -> None:
    assert signature_path("v", NAME) == f"files/v/{NAME}.sig.json"


# ---------------------------------------------------------------------------------------------- verify


def test_verify_local_wheel_and_its_three_bad_cases(tmp_path: Path) -> None:
    signer = new_signer()
    good = signed(tmp_path / "good", signer)
    assert verify_signature(str(good), key=pub(signer)).key_id == signer.key_id
    # a changed byte
    changed = signed(tmp_path / "changed", signer)
    data = bytearray(changed.read_bytes())
    data[-30] ^= 1
    changed.write_bytes(bytes(data))
    with pytest.raises(SignatureError, match="changed after it was signed"):
        verify_signature(str(changed), key=pub(signer))
    # a swapped signature: another wheel's, valid, put beside this one
    other = signed(tmp_path / "swap", signer, OTHER)
    wheel(tmp_path / "swap", NAME)
    (tmp_path / "swap" / (NAME + SIGNATURE_SUFFIX)).write_bytes(
        other.with_name(OTHER + SIGNATURE_SUFFIX).read_bytes()
    )
    with pytest.raises(SignatureError, match="another wheel"):
        verify_signature(str(tmp_path / "swap" / NAME), key=pub(signer))
    # a wrong key
    with pytest.raises(SignatureError, match="not by the key given"):
        verify_signature(str(good), key=pub(new_signer()))
    # none
    bare = wheel(tmp_path / "bare")
    with pytest.raises(SignatureError, match="unsigned"):
        verify_signature(str(bare), key=pub(signer))


def test_verify_cli_one_line_each(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    factory = [sys.executable, "-m", "factory"]
    subprocess.run([*factory, "keygen", str(tmp_path / "k")], check=True, env=env, capture_output=True)
    assert (tmp_path / "k").stat().st_mode & 0o777 == 0o600
    again = subprocess.run([*factory, "keygen", str(tmp_path / "k")], env=env, capture_output=True, text=True)
    assert again.returncode == 2 and "never overwrites" in again.stderr
    signer = signer_from(path=tmp_path / "k", environ={})
    assert signer is not None
    good = signed(tmp_path / "w", signer)
    ok = subprocess.run(
        [*factory, "verify", str(good), "--key", str(tmp_path / "k.pub")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0 and ok.stdout.startswith(f"OK {NAME}"), ok.stderr
    good.write_bytes(good.read_bytes() + b"\0")
    bad = subprocess.run(
        [*factory, "verify", str(good), "--key", str(tmp_path / "k.pub")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "changed after" in bad.stderr
    nokey = subprocess.run([*factory, "verify", str(good)], env=env, capture_output=True, text=True)
    assert nokey.returncode == 2 and "--key" in nokey.stderr


# ---------------------------------------------------------------------------------------------- factory build


def test_build_loads_the_signing_key_before_building(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`factory build --publish --sign-key`: a bad key or a key without --publish is refused at planning,
    before any container; a good one is held for publishing, shown only by its key id."""
    from factory.build import request as buildplan

    demo = Path(__file__).resolve().parents[3] / "examples" / "demo.yaml"
    monkeypatch.delenv("FACTORY_SIGN_KEY", raising=False)

    def plan(**given: Any) -> buildplan.PlannedBuild:
        request = buildplan.BuildRequest(matrix=demo, output=tmp_path / "w", cache="off", **given)
        return buildplan.plan_build(request, warn=lambda _line: None)

    with pytest.raises(ConfigError, match="add --publish"):
        plan(sign_key=tmp_path / "k")
    (tmp_path / "bad").write_text("not a key")
    with pytest.raises(ConfigError, match=re.escape(f"--sign-key {tmp_path / 'bad'}: not a private key")):
        plan(publish=True, sign_key=tmp_path / "bad")
    assert plan(publish=True).signer is None
    signing.write_key_pair(tmp_path / "k")
    planned = plan(publish=True, sign_key=tmp_path / "k")
    assert planned.signer is not None
    assert planned.signer.key_id in repr(planned) and (tmp_path / "k").read_text() not in repr(planned)
