"""Who may write the compile cache: its keys, and the signature that binds a manifest to its trust domain (the
one owner of both; `factory/cache/sync.py` moves the files).

A manifest counts only when a key the host trusts signed it: Ed25519 (the key formats and fingerprints of
`factory/trust/signing.py`, which signs wheels), over the domain and the manifest's canonical text, the
signature and its key's fingerprint beside the entry's fields:

    {...the entry's fields..., "key": "SHA256:...", "signature": "<base64 of 64 bytes>"}

Verifying needs only public keys, so who can read the shared cache is not who can write it:
- a trusted writer (a scheduled or default-branch CI run) holds the store's private key
  (FACTORY_CACHE_SIGN_KEY): it signs what its builds compile, and its entries go up to the store;
- an untrusted build (a pull request, a fork, a laptop) holds only the public keys
  (FACTORY_CACHE_PUBLIC_KEYS): it takes the store's entries those keys signed and never writes the store.
  What it compiles itself it signs with this home's own key (`$FACTORY_HOME/cache/local-signing-key`, made
  once, mode 0600), which no other host and no trusted run trusts: a cache of its own, for its own builds.
Rotation: sign with the new private key and list the old public key in FACTORY_CACHE_PUBLIC_KEYS while its
entries are wanted. The HMAC keys of earlier factories (FACTORY_CACHE_KEY, FACTORY_CACHE_TRUSTED_KEYS) are
refused in one line, never read: an HMAC key lets whoever verifies also forge.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from factory.container import compilecache
from factory.core import safefs
from factory.core.errors import ConfigError
from factory.trust import signing

SIGN_KEY_ENV = "FACTORY_CACHE_SIGN_KEY"
PUBLIC_KEYS_ENV = "FACTORY_CACHE_PUBLIC_KEYS"
# an earlier factory's HMAC settings: refused, with the way to the key pair
HMAC_KEY_ENVS = ("FACTORY_CACHE_KEY", "FACTORY_CACHE_TRUSTED_KEYS")
KEY_FILE = "local-signing-key"  # beside the local cache, never inside what a container sees
SIGNATURE_DOMAIN = f"factory-compilecache/{compilecache.LAYOUT_VERSION}/ed25519".encode()
MAX_PUBLIC_KEYS = 64  # a rotation holds two or three
_PEM_PUBLIC = re.compile(rb"-----BEGIN PUBLIC KEY-----.*?-----END PUBLIC KEY-----", re.S)


@dataclass(frozen=True, kw_only=True)
class Keyring:
    """The key this host signs what it imports with, and the keys whose entries it accepts.

    `writes_store`: the signing key is the store's (FACTORY_CACHE_SIGN_KEY), so this host's entries go up;
    else it is this home's own, trusted here alone, and nothing goes up. `trusted`: the store's public keys
    (FACTORY_CACHE_PUBLIC_KEYS: an untrusted build's, or old keys while one is rotated out)."""

    signing: Ed25519PrivateKey = field(repr=False)
    writes_store: bool
    trusted: tuple[Ed25519PublicKey, ...] = ()

    @property
    def key_id(self) -> str:
        return signing.key_id(self.signing.public_key())

    def accepts(self) -> dict[str, Ed25519PublicKey]:
        """The keys of the local cache's entries: this host's signing key and the store's."""
        return {signing.key_id(k): k for k in (self.signing.public_key(), *self.trusted)}

    def store_keys(self) -> dict[str, Ed25519PublicKey]:
        """The keys of the store's entries: the store's, never this home's own."""
        own = (self.signing.public_key(),) if self.writes_store else ()
        return {signing.key_id(k): k for k in (*own, *self.trusted)}


def refuse_hmac_keys(environ: Mapping[str, str]) -> None:
    """One line, exit 2, for an earlier factory's HMAC setting: never a silent fallback to another key."""
    for name in HMAC_KEY_ENVS:
        if environ.get(name, "").strip():
            raise ConfigError(
                f"${name}: the compile cache is now signed with an Ed25519 key pair, not an HMAC key; make "
                f"one with `factory keygen PATH`, give the runners that write the shared cache the private "
                f"key as ${SIGN_KEY_ENV} and every runner the public key (PATH.pub) in ${PUBLIC_KEYS_ENV}, "
                "and "
                f'unset ${name} (docs/DESIGN.md, "Compile cache")'
            )


def public_keys(text: str, *, shown: str = f"${PUBLIC_KEYS_ENV}") -> tuple[Ed25519PublicKey, ...]:
    """Public keys from one setting: OpenSSH lines (`ssh-ed25519 AAAA... comment`, what `factory keygen`
    writes to PATH.pub) one per line or separated by commas, and PEM blocks; ConfigError naming the setting
    and the key's place (never more of the value)."""
    data = text.encode()
    if len(data) > MAX_PUBLIC_KEYS * signing.MAX_KEY_BYTES:
        raise ConfigError(f"{shown}: larger than {MAX_PUBLIC_KEYS} keys")
    blocks = _PEM_PUBLIC.findall(data)
    rest = _PEM_PUBLIC.sub(b"\n", data).replace(b",", b"\n")
    given = [*blocks, *(line.strip() for line in rest.splitlines() if line.strip())]
    if len(given) > MAX_PUBLIC_KEYS:
        raise ConfigError(f"{shown}: {len(given)} keys, at most {MAX_PUBLIC_KEYS}")
    keys: dict[str, Ed25519PublicKey] = {}
    for n, one in enumerate(given, start=1):
        key = signing.load_public_key(one, shown=f"{shown} (key {n})")
        keys.setdefault(signing.key_id(key), key)
    return tuple(keys.values())


def _env_signing_key(environ: Mapping[str, str]) -> Ed25519PrivateKey | None:
    value = environ.get(SIGN_KEY_ENV, "")
    if not value.strip():
        return None
    shown = f"${SIGN_KEY_ENV}"
    if len(value) > signing.MAX_KEY_BYTES:
        raise ConfigError(f"{shown}: larger than {signing.MAX_KEY_BYTES} bytes, not a key")
    return signing.load_private_key(value.encode(), shown=shown)


def check_environment(environ: Mapping[str, str] = os.environ) -> None:
    """The cache's key settings, checked before any build starts (a bad one: ConfigError, exit 2)."""
    refuse_hmac_keys(environ)
    _env_signing_key(environ)
    public_keys(environ.get(PUBLIC_KEYS_ENV, ""))


def writes_store(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this host holds the store's private key (what it compiles goes up to the store)."""
    return bool(environ.get(SIGN_KEY_ENV, "").strip())


def _home_key(cache_home: Path) -> Ed25519PrivateKey:
    """This home's own key, `cache_home/local-signing-key`: made (mode 0600) on first use, never a link
    followed."""
    path = cache_home / KEY_FILE
    cache_home.mkdir(parents=True, exist_ok=True)
    if not path.exists() and not path.is_symlink():
        # written whole aside, then linked into place: a concurrent reader never sees it half made, and of
        # two first runs one key wins
        private, _public = signing.generate_key()
        tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(private)
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    try:
        data = safefs.read_bytes(cache_home, KEY_FILE, max_bytes=signing.MAX_KEY_BYTES)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the compile cache's own key ({exc})") from None
    return signing.load_private_key(data, shown=str(path))


def load_keyring(cache_home: Path, environ: Mapping[str, str] = os.environ) -> Keyring:
    """The host's keyring: FACTORY_CACHE_SIGN_KEY (a trusted writer), else this home's own key in
    `cache_home` (`$FACTORY_HOME/cache`); and the public keys of FACTORY_CACHE_PUBLIC_KEYS."""
    refuse_hmac_keys(environ)
    trusted = public_keys(environ.get(PUBLIC_KEYS_ENV, ""))
    given = _env_signing_key(environ)
    if given is not None:
        return Keyring(signing=given, writes_store=True, trusted=trusted)
    return Keyring(signing=_home_key(cache_home), writes_store=False, trusted=trusted)


# --- the signature ----------------------------------------------------------------------------------------


def _signed_text(domain: str, entry: compilecache.Entry) -> bytes:
    return b"\0".join([SIGNATURE_DOMAIN, domain.encode(), compilecache.manifest_json(entry).encode()])


def signed_manifest(entry: compilecache.Entry, *, domain: str, keyring: Keyring) -> bytes:
    """A manifest as the local cache and the store hold it: the entry's fields, and the key's fingerprint
    and the Ed25519 signature that bind them to the domain."""
    raw = json.loads(compilecache.manifest_json(entry))
    signature = keyring.signing.sign(_signed_text(domain, entry))
    raw.update(key=keyring.key_id, signature=base64.b64encode(signature).decode())
    return json.dumps(raw, sort_keys=True).encode()


def verified_entry(
    data: bytes, *, domain: str, keyring: Keyring, from_store: bool = False
) -> compilecache.Entry | None:
    """The entry of a signed manifest when a key of the keyring signed it for this domain (`from_store`: a
    key of the store's, never this home's own); else None. Every byte of `data` may be hostile."""
    entry = compilecache.parse_manifest(data)
    if entry is None:
        return None
    keys = keyring.store_keys() if from_store else keyring.accepts()
    try:
        raw = json.loads(data)
        key = keys.get(raw["key"])
        signature = base64.b64decode(raw["signature"], validate=True)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError, binascii.Error):
        return None
    if key is None or len(signature) != 64:
        return None
    try:
        key.verify(signature, _signed_text(domain, entry))
    except InvalidSignature:
        return None
    return entry
