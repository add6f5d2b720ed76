"""Ed25519 signatures of published wheels, for consumers that cannot use GitHub's attestations: the one owner
of the signature file's format (composed and parsed here only) and of loading the keys.

What is signed binds a wheel's name to its bytes, so a signature cannot be moved to another wheel: the
canonical JSON `{"filename": <canonical wheel filename>, "format": "wheel-factory-signature", "sha256":
<hex>, "version": 1}` (sorted keys, no spaces). The file published beside the wheel (`index.signature_path`)
is a small JSON object carrying that payload's fields, the signing key's id and the signature:

    {"algorithm": "ed25519", "filename": "...whl", "format": "wheel-factory-signature",
     "key": "SHA256:...", "sha256": "...", "signature": "<base64 of 64 bytes>", "version": 1}

The key id is the key's OpenSSH fingerprint (what `ssh-keygen -l -f KEY.pub` prints), so a person can tell
keys apart; it is a hint for the error message only: the signature check decides.

Keys: a private key is an unencrypted Ed25519 key in PKCS#8 PEM or OpenSSH form (`factory keygen`, or
`ssh-keygen -t ed25519 -N ''`), from a file or an environment variable; it stays in this process on the host
(never written, logged, or handed to a build container). A public key is PEM (SubjectPublicKeyInfo) or an
OpenSSH line (`ssh-ed25519 AAAA... comment`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from packaging.utils import InvalidWheelFilename

from factory.core import bounded, strictjson
from factory.core.errors import ConfigError, FactoryError
from factory.core.tags import canonical_wheel_filename
from factory.core.urls import printable

FORMAT = "wheel-factory-signature"
VERSION = 1
ALGORITHM = "ed25519"
KEY_ENV = "FACTORY_SIGN_KEY"
# A signature file is ~300 bytes; anything much bigger is not one, and is not read further.
MAX_SIGNATURE_BYTES = 4096
# An Ed25519 key file, PEM or OpenSSH, is well under 1 KiB.
MAX_KEY_BYTES = 16384
_SHA256 = re.compile(r"[0-9a-f]{64}")
_KEY_ID = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")
_FIELDS = frozenset({"algorithm", "filename", "format", "key", "sha256", "signature", "version"})


class SignatureError(FactoryError):
    """A wheel's signature is missing, is not one, or does not vouch for this wheel with this key."""


@dataclass(frozen=True, kw_only=True)
class Signature:
    """A parsed signature file: what it claims was signed, by which key, and the signature bytes."""

    filename: str
    sha256: str
    key_id: str
    signature: bytes


def payload(filename: str, sha256: str) -> bytes:
    """The bytes that are signed for the wheel `filename` (its canonical spelling) with this sha256."""
    doc = {"filename": filename, "format": FORMAT, "sha256": sha256, "version": VERSION}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def key_id(key: Ed25519PublicKey) -> str:
    """The key's OpenSSH SHA256 fingerprint, "SHA256:" and 43 base64 characters."""
    line = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    blob = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def compose_signature(sig: Signature) -> bytes:
    """The signature file of `sig` (the JSON object the module docstring shows), one line."""
    doc = {
        "algorithm": ALGORITHM,
        "filename": sig.filename,
        "format": FORMAT,
        "key": sig.key_id,
        "sha256": sig.sha256,
        "signature": base64.b64encode(sig.signature).decode(),
        "version": VERSION,
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def parse_signature(data: bytes) -> Signature:
    """A signature file's content (at most MAX_SIGNATURE_BYTES, already read so bounded); SignatureError
    saying why it is not one. Nothing in it is trusted beyond its shape: `check` decides."""
    if len(data) > MAX_SIGNATURE_BYTES:
        raise SignatureError(f"not a signature file: larger than {MAX_SIGNATURE_BYTES} bytes")
    try:
        doc = strictjson.loads(data)  # a key given twice is refused, not decided by the last one
    except strictjson.StrictJSONError as exc:
        raise SignatureError(f"not a signature file: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SignatureError(f'not a signature file: no "format": "{FORMAT}"')
    if doc.get("version") != VERSION or type(doc.get("version")) is not int:
        raise SignatureError(
            f"signature format version {printable(json.dumps(doc.get('version')))[:20]}, this factory "
            f"reads version {VERSION}"
        )
    if set(doc) != _FIELDS:
        raise SignatureError(f"not a signature file: its fields are not {', '.join(sorted(_FIELDS))}")
    if doc["algorithm"] != ALGORITHM:
        raise SignatureError(
            f"signature algorithm {printable(str(doc['algorithm']))[:20]!r}, not {ALGORITHM}"
        )
    values = {k: doc[k] for k in ("filename", "sha256", "key", "signature")}
    bad = [k for k, v in values.items() if not isinstance(v, str)]
    if bad:
        raise SignatureError(f'not a signature file: "{bad[0]}" is not a string')
    try:
        filename = canonical_wheel_filename(values["filename"])
    except InvalidWheelFilename:
        filename = ""
    if filename != values["filename"]:
        raise SignatureError('not a signature file: "filename" is not a canonical wheel filename')
    if not _SHA256.fullmatch(values["sha256"]):
        raise SignatureError('not a signature file: "sha256" is not 64 lower-case hex digits')
    if not _KEY_ID.fullmatch(values["key"]):
        raise SignatureError('not a signature file: "key" is not an OpenSSH SHA256 key fingerprint')
    try:
        raw = base64.b64decode(values["signature"], validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 64:
        raise SignatureError('not a signature file: "signature" is not base64 of 64 bytes')
    return Signature(filename=filename, sha256=values["sha256"], key_id=values["key"], signature=raw)


def check(data: bytes, *, filename: str, sha256: str, key: Ed25519PublicKey) -> Signature:
    """The signature file `data` vouches, with `key`, for the wheel `filename` whose bytes hash to `sha256`;
    else SignatureError saying in one line what does not hold (another key, a signature that does not verify,
    a signature of another wheel, a wheel changed since it was signed)."""
    sig = parse_signature(data)
    try:
        key.verify(sig.signature, payload(sig.filename, sig.sha256))
    except InvalidSignature:
        mine = key_id(key)
        if sig.key_id != mine:
            raise SignatureError(f"signed by key {sig.key_id}, not by the key given ({mine})") from None
        raise SignatureError(
            f"the signature does not verify with key {mine} (the file was altered)"
        ) from None
    if sig.key_id != key_id(key):  # the signature holds, but the file names another key: not ours
        raise SignatureError(f"the signature file names key {sig.key_id}, but was made with {key_id(key)}")
    try:
        wanted = canonical_wheel_filename(filename)
    except InvalidWheelFilename:
        raise SignatureError(f"{printable(filename)[:200]} is not a wheel filename") from None
    if sig.filename != wanted:
        raise SignatureError(f"the signature is of another wheel, {sig.filename}, not {wanted}")
    if sig.sha256 != sha256:
        raise SignatureError(
            f"the wheel's sha256 is {sha256}, the signed one {sig.sha256}: it changed after it was signed"
        )
    return sig


# ---------------------------------------------------------------------------------------------- keys


def load_public_key(data: bytes, *, shown: str) -> Ed25519PublicKey:
    """An Ed25519 public key, PEM or an OpenSSH line; ConfigError naming `shown` otherwise."""
    text = data.strip()
    key: object
    try:
        if text.startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(text)
        else:
            key = serialization.load_ssh_public_key(text)
    except (ValueError, UnsupportedAlgorithm):
        raise ConfigError(
            f"{shown}: not a public key (PEM, or an OpenSSH line like 'ssh-ed25519 AAAA...')"
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(
            f"{shown}: not an Ed25519 key (a {type(key).__name__.removesuffix('PublicKey')} key)"
        )
    return key


def load_private_key(data: bytes, *, shown: str) -> Ed25519PrivateKey:
    """An unencrypted Ed25519 private key, PKCS#8 PEM or OpenSSH; ConfigError naming `shown` (never the
    key)."""
    text = data.strip()
    key: object
    try:
        if text.startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----"):
            key = serialization.load_ssh_private_key(text, password=None)
        else:
            key = serialization.load_pem_private_key(text, password=None)
    except TypeError:  # "Password was not given but private key is encrypted"
        raise ConfigError(f"{shown}: the private key is encrypted; give an unencrypted one") from None
    except (ValueError, UnsupportedAlgorithm):
        raise ConfigError(f"{shown}: not a private key (PKCS#8 PEM or OpenSSH)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"{shown}: not an Ed25519 private key")
    return key


def read_key_file(path: Path, *, what: str) -> bytes:
    """A key file's bytes: a regular file (a FIFO or device is refused, never waited on) of at most
    MAX_KEY_BYTES; ConfigError naming `what` and the path."""
    try:
        return bounded.read_file(path, max_bytes=MAX_KEY_BYTES)  # a FIFO is refused, never waited on
    except bounded.Refused as exc:
        raise ConfigError(f"{what} {exc}; not a key file") from None
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot read ({exc.strerror})") from None


def public_key_file(path: Path, *, what: str = "--key") -> Ed25519PublicKey:
    return load_public_key(read_key_file(path, what=what), shown=f"{what} {path}")


@dataclass(frozen=True, kw_only=True)
class Signer:
    """A loaded private key, kept on the host: it signs wheels and is shown only by its key id."""

    key_id: str
    source: str  # where it came from, as it may be shown ("--sign-key PATH", "$FACTORY_SIGN_KEY")
    _key: Ed25519PrivateKey = field(repr=False)

    def public_key(self) -> Ed25519PublicKey:
        """The key that checks what this signer signs (a file this run re-signs must check with it first)."""
        return self._key.public_key()

    def sign(self, filename: str, sha256: str) -> bytes:
        """The signature file for the wheel `filename` (canonical spelling) whose bytes hash to `sha256`."""
        raw = self._key.sign(payload(filename, sha256))
        return compose_signature(
            Signature(filename=filename, sha256=sha256, key_id=self.key_id, signature=raw)
        )


def make_signer(key: Ed25519PrivateKey, *, source: str) -> Signer:
    return Signer(key_id=key_id(key.public_key()), source=source, _key=key)


def signer_from(
    *, path: Path | None = None, env_name: str | None = None, environ: Mapping[str, str] | None = None
) -> Signer | None:
    """The signing key publishing uses: the file `path` (--sign-key), else the variable `env_name`
    (--sign-key-env; unset or empty is a ConfigError), else FACTORY_SIGN_KEY when it is set and not empty,
    else None (no signing)."""
    env = os.environ if environ is None else environ
    if path is not None and env_name is not None:
        raise ConfigError("--sign-key and --sign-key-env each name the signing key: give one")
    if path is not None:
        shown = f"--sign-key {path}"
        return make_signer(
            load_private_key(read_key_file(path, what="--sign-key"), shown=shown), source=shown
        )
    name = env_name or KEY_ENV
    value = env.get(name, "")
    if not value:
        if env_name is not None:
            raise ConfigError(f"--sign-key-env {env_name}: the variable is unset or empty")
        return None
    shown = f"${name}"
    if len(value) > MAX_KEY_BYTES:
        raise ConfigError(f"{shown}: larger than {MAX_KEY_BYTES} bytes, not a key")
    return make_signer(load_private_key(value.encode(), shown=shown), source=shown)


def generate_key() -> tuple[bytes, bytes]:
    """A new key pair: the private key as unencrypted PKCS#8 PEM, the public key as an OpenSSH line."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public + b" wheel-factory\n"


def write_key_pair(path: Path) -> tuple[Path, str]:
    """`factory keygen PATH`: a new private key at PATH (mode 0600, never overwriting) and its public key
    at PATH.pub; (the public key's path, its key id)."""
    private, public = generate_key()
    pub_path = path.with_name(path.name + ".pub")
    for target in (path, pub_path):
        if target.exists() or target.is_symlink():
            raise ConfigError(f"{target}: exists; keygen never overwrites a key")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(private)
        pub_path.write_bytes(public)
    except OSError as exc:
        raise ConfigError(f"{exc.filename or path}: cannot write ({exc.strerror})") from None
    return pub_path, key_id(load_public_key(public, shown=str(pub_path)))
