"""`factory verify --key` and `factory which --verify-key`: does a wheel's signature file
(`factory.trust.signing`)
vouch for it with a consumer's public key? A local wheel or one on an index, by URL.

Everything an index hands back is hostile: the signature file is read at most MAX_SIGNATURE_BYTES deep, the
wheel is hashed as it streams (never kept) and at most MAX_WHEEL_BYTES of it, and only links on the index's
own pages that stay on its schemes are followed, each signature at the one URL it has (its wheel's URL and
`index.SIGNATURE_SUFFIX`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from factory.consume.indexhttp import fetch_page, open_url
from factory.core import bounded
from factory.core.errors import ConfigError, FactoryError
from factory.core.simpleapi import parse_anchors
from factory.core.urls import INDEX_SCHEMES, checked_url, printable, without_credentials
from factory.publish.index import SIGNATURE_SUFFIX
from factory.publish.installcmd import Host, choose
from factory.trust.signing import MAX_SIGNATURE_BYTES, SignatureError, check

# The biggest wheel hashed: a CUDA extension's fat wheel is a few hundred MB; far more is not a wheel we made.
MAX_WHEEL_BYTES = 8 << 30
WHEEL_DEADLINE_S = bounded.WHEEL_DEADLINE_S  # a wheel's whole download (docs/PUBLISH.md: ten minutes)
_CHUNK = 1 << 20


@dataclass(frozen=True, kw_only=True)
class Verified:
    """A wheel whose signature held: where it is (as it may be shown), its name, hash and signing key; for
    one on an index, its URL as an installer is to fetch it (credentials kept)."""

    wheel: str
    filename: str
    sha256: str
    key_id: str
    url: str | None = None


def _read_bounded(stream: IO[bytes] | bounded.Body, *, limit: int) -> bytes:
    """At most `limit` + 1 bytes of `stream` (one more than allowed tells a file that is too big)."""
    out = b""
    while len(out) <= limit:
        chunk = stream.read(limit + 1 - len(out))
        if not chunk:
            break
        out += chunk
    return out


def _hash_bounded(stream: IO[bytes] | bounded.Body, *, shown: str) -> str:
    """The sha256 of what `stream` holds; FactoryError past MAX_WHEEL_BYTES."""
    digest = hashlib.sha256()
    size = 0
    for chunk in iter(lambda: stream.read(_CHUNK), b""):
        size += len(chunk)
        if size > MAX_WHEEL_BYTES:
            raise FactoryError(f"{shown}: larger than {MAX_WHEEL_BYTES >> 30} GiB, not a wheel to verify")
        digest.update(chunk)
    return digest.hexdigest()


def _wheel_name(name: str, *, shown: str) -> str:
    try:
        parse_wheel_filename(name)
    except InvalidWheelFilename:
        raise ConfigError(f"{shown}: {printable(name)[:200]!r} is not a wheel filename") from None
    return name


def _verify_local(path: Path, *, key: Ed25519PublicKey, signature: Path | None) -> Verified:
    filename = _wheel_name(path.name, shown=str(path))
    sig_path = signature or path.with_name(path.name + SIGNATURE_SUFFIX)
    try:
        with bounded.open_file(sig_path, max_bytes=None) as fh:  # a FIFO is refused, never waited on
            sig = _read_bounded(fh, limit=MAX_SIGNATURE_BYTES)
    except FileNotFoundError:
        raise SignatureError(f"{path}: unsigned (no signature file {sig_path})") from None
    except bounded.Refused as exc:
        raise SignatureError(f"{path}: unsigned ({exc})") from None
    except OSError as exc:
        raise ConfigError(f"{sig_path}: cannot read ({exc.strerror})") from None
    try:
        with bounded.open_file(path, max_bytes=MAX_WHEEL_BYTES) as fh:
            sha256 = _hash_bounded(fh, shown=str(path))
    except bounded.Refused as exc:
        raise FactoryError(str(exc)) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        found = check(sig, filename=filename, sha256=sha256, key=key)
    except SignatureError as exc:
        raise SignatureError(f"{path}: {exc}") from None
    return Verified(wheel=str(path), filename=filename, sha256=sha256, key_id=found.key_id)


def verify_url(url: str, *, key: Ed25519PublicKey, signature: str | None = None) -> Verified:
    """Verify the wheel at `url` (http(s) or file) with its signature at `signature`, by default the URL
    beside it. A "#sha256=..." fragment (an index link's) must match the bytes too."""
    parts = checked_url(url, schemes=INDEX_SCHEMES, what="WHEEL_OR_URL")
    plain = urlunsplit((parts.scheme, parts.netloc, parts.path, parts.query, ""))
    shown = without_credentials(plain)
    filename = _wheel_name(unquote(parts.path.rpartition("/")[2]), shown=shown)
    claimed = parts.fragment.removeprefix("sha256=") if parts.fragment.startswith("sha256=") else None
    sig_url = signature or urlunsplit(
        (parts.scheme, parts.netloc, parts.path + SIGNATURE_SUFFIX, parts.query, "")
    )
    if signature is not None:
        checked_url(sig_url, schemes=INDEX_SCHEMES, what="--signature")
    try:
        # read one byte more than a signature may have, no further: that tells one too big (check() says)
        with open_url(sig_url, accept="application/json", whole=False) as resp:
            sig = _read_bounded(resp, limit=MAX_SIGNATURE_BYTES)
    except FactoryError as exc:
        raise SignatureError(f"{shown}: unsigned (no signature: {exc})") from None
    # the whole download within WHEEL_DEADLINE_S, however the server paces it (FactoryError otherwise)
    with open_url(
        plain, accept="application/octet-stream", seconds=WHEEL_DEADLINE_S, max_bytes=MAX_WHEEL_BYTES
    ) as resp:
        sha256 = _hash_bounded(resp, shown=shown)
    if claimed is not None and claimed.lower() != sha256:
        raise SignatureError(
            f"{shown}: its bytes hash to {sha256}, not the {printable(claimed)[:64]} its link says"
        )
    try:
        found = check(sig, filename=filename, sha256=sha256, key=key)
    except SignatureError as exc:
        raise SignatureError(f"{shown}: {exc}") from None
    return Verified(wheel=shown, filename=filename, sha256=sha256, key_id=found.key_id)


def verify_signature(source: str, *, key: Ed25519PublicKey, signature: str | None = None) -> Verified:
    """`factory verify WHEEL_OR_URL --key PUB`: the wheel's signature (`signature`, else the file or URL
    beside it) vouches for it with `key`; SignatureError (exit 1), in one line, when it is missing, not a
    signature, made with another key, of another wheel, or the wheel changed after signing."""
    if "://" in source:
        return verify_url(source, key=key, signature=signature)
    path = Path(source)
    if not path.is_file():
        raise ConfigError(f"{source}: no such wheel file")
    return _verify_local(path, key=key, signature=Path(signature) if signature else None)


# ---------------------------------------------------------------------------------------------- which


def verify_project(variant_url: str, project: str, *, host: Host, key: Ed25519PublicKey) -> Verified:
    """`factory which --verify-key`: verify the wheel of `project` in the variant index at `variant_url`
    that an installer would take on `host` (`installcmd.choose`: the newest compatible wheel, yanked files,
    files whose Requires-Python excludes the host and sdists left out). Its bytes must hash to what the
    page says and its signature hold with `key`; SignatureError when they do not, when it is unsigned, or
    when there is none. The command printed for it (`installcmd`) pins these bytes by URL and sha256, so
    that no other file, of this page or of another index, can be installed in its place."""
    wanted = canonicalize_name(project)
    page_url = None
    for anchor in parse_anchors(fetch_page(variant_url)):
        if canonicalize_name(anchor.text) == wanted:
            page_url = urljoin(variant_url, anchor.href)
            break
    if page_url is None or urlsplit(page_url).scheme not in INDEX_SCHEMES:
        raise SignatureError(
            f"{project}: not listed in {without_credentials(variant_url)}; nothing to verify"
        )
    wheel = choose(fetch_page(page_url), page_url=page_url, project=project, host=host)
    if wheel is None:
        raise SignatureError(
            f"{project}: no wheel an installer would take for Python {host.python} on "
            f"{without_credentials(page_url)}; nothing to verify"
        )
    verified = verify_url(wheel.pinned_url, key=key)
    return replace(verified, url=wheel.url)
