"""Fetching a package's source on the host and applying the recipe's patches.

The build container mounts the result read-only; fetching on the host means the host's index configuration,
mirrors and CA certificates apply, and the container's network can stay off.

An sdist is looked up the way pip would find it, through the host's pip configuration (index-url,
extra-index-url, find-links, cert, client-cert, proxy, trusted-host, timeout, from every pip.conf and the
PIP_* variables), but without running pip's resolver: `pip download` of an sdist runs its setup.py to read
metadata, which fails for packages whose setup.py imports torch. The project's simple page (PEP 691 JSON
when offered, else PEP 503 HTML) names the files; the sdist of the exact version is downloaded and its
sha256 checked against the one the index gives.
"""

from __future__ import annotations

import ast
import base64
import filecmp
import hashlib
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from factory.errors import BuildError, ConfigError
from factory.index import PYPI_JSON_TYPE, parse_anchors
from factory.options import PackageSpec, Recipe
from factory.urls import urls_without_credentials, without_credentials

PYPI_SIMPLE = "https://pypi.org/simple"
IGNORED = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".venv")
# PEP 691 JSON first, PEP 503 HTML otherwise (and from indexes that know neither media type).
ACCEPT = f"{PYPI_JSON_TYPE}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"
# pip's own sections, weakest first; environment variables (":env:") beat every file.
PIP_SECTIONS = ("global", "download", ":env:")
SHOWN_VERSIONS = 12  # the newest versions named when the asked one is missing
CHUNK = 1 << 20


@dataclass(frozen=True, kw_only=True)
class PreparedSource:
    """The patched tree a build mounts, and for `source: pypi` the sdist it came from (for the report)."""

    tree: Path
    sdist: str | None = None  # the sdist's filename
    sha256: str | None = None  # of the sdist, checked against the index's hash where it gives one


# ---------------------------------------------------------------------------------------------- pip settings


@dataclass(frozen=True, kw_only=True)
class PipSettings:
    """What finding and fetching an sdist needs of the host's pip configuration."""

    index_url: str = PYPI_SIMPLE
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    cert: str | None = None  # CA bundle
    client_cert: str | None = None  # PEM with the client's key and certificate
    proxy: str | None = None
    trusted_hosts: tuple[str, ...] = ()  # host or host:port whose TLS certificate is not checked
    timeout: float = 15.0

    @property
    def indexes(self) -> tuple[str, ...]:
        return () if self.no_index else (self.index_url, *self.extra_index_urls)


# pip option names a configuration may use for the same setting
_ALIASES = {"pypi-url": "index-url", "default-timeout": "timeout"}


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "y", "yes", "t", "true", "on")


def parse_pip_config(text: str) -> PipSettings:
    """`pip config list` output -> the settings, sections merged as pip merges them for `pip download`.

    pip has already merged the files (global, user, site, PIP_CONFIG_FILE) key by key; its output names each
    key's section, and PIP_* variables appear as the ":env:" section, which wins over every file.
    """
    by_section: dict[str, dict[str, str]] = {s: {} for s in PIP_SECTIONS}
    for line in text.splitlines():
        key, sep, raw = line.partition("=")
        section, _, name = key.strip().rpartition(".")
        if not sep or section not in by_section:
            continue
        try:
            value = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            value = raw.strip()
        by_section[section][_ALIASES.get(name, name)] = str(value)
    merged: dict[str, str] = {}
    for section in PIP_SECTIONS:
        merged.update(by_section[section])

    def listed(name: str) -> tuple[str, ...]:
        return tuple(merged.get(name, "").split())

    timeout = merged.get("timeout")
    try:
        seconds = float(timeout) if timeout else PipSettings.timeout
    except ValueError:
        raise BuildError(f"pip configuration: timeout {timeout!r} is not a number of seconds") from None
    return PipSettings(
        index_url=merged.get("index-url") or PYPI_SIMPLE,
        extra_index_urls=listed("extra-index-url"),
        find_links=listed("find-links"),
        no_index=_truthy(merged.get("no-index", "")),
        cert=merged.get("cert") or None,
        client_cert=merged.get("client-cert") or None,
        proxy=merged.get("proxy") or None,
        trusted_hosts=listed("trusted-host"),
        timeout=seconds,
    )


def read_pip_settings() -> PipSettings:
    """The host's pip configuration, as pip itself reads it (every pip.conf, PIP_CONFIG_FILE, PIP_*)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    if proc.returncode != 0:
        detail = proc.stderr.strip().splitlines()
        raise BuildError(f"cannot read the pip configuration: {detail[-1] if detail else 'pip failed'}")
    return parse_pip_config(proc.stdout)


# ---------------------------------------------------------------------------------------------- the index


class _NotFound(Exception):
    """The index has no page for the project (HTTP 404/410, no such directory)."""


@dataclass(frozen=True, kw_only=True)
class IndexFile:
    """One file an index page links to."""

    filename: str
    url: str  # without credentials: they travel as a header to their own host only
    digest: tuple[str, str] | None  # (hashlib algorithm, hex digest) as the index gives it
    where: str  # the index or find-links location that listed it, as it may be shown


def _hash_of(fragment: str) -> tuple[str, str] | None:
    algo, sep, digest = fragment.partition("=")
    algo = algo.lower()
    if sep and algo in hashlib.algorithms_guaranteed and digest:
        return algo, digest.lower()
    return None


def parse_project_page(
    body: bytes, content_type: str, page_url: str
) -> list[tuple[str, str, tuple[str, str] | None]]:
    """(filename, absolute URL, hash) of each file a simple page (PEP 691 JSON or PEP 503 HTML) lists."""
    out: list[tuple[str, str, tuple[str, str] | None]] = []
    if content_type == PYPI_JSON_TYPE:
        for item in json.loads(body).get("files", []):
            hashes = item.get("hashes") or {}
            algo = "sha256" if "sha256" in hashes else next(iter(sorted(hashes)), None)
            digest = (algo, str(hashes[algo]).lower()) if algo in hashlib.algorithms_guaranteed else None
            out.append((item["filename"], urljoin(page_url, item["url"]), digest))
        return out
    for anchor in parse_anchors(body.decode("utf-8", "replace")):
        if not anchor.href:
            continue
        url = urljoin(page_url, anchor.href)
        parts = urlsplit(url)
        filename = unquote(parts.path.rsplit("/", 1)[-1])
        if filename:
            out.append((filename, urlunsplit(parts._replace(fragment="")), _hash_of(parts.fragment)))
    return out


class IndexClient:
    """urllib configured as pip is: CA bundle, client certificate, proxy, trusted hosts, credentials."""

    def __init__(self, pip: PipSettings) -> None:
        self.timeout = pip.timeout
        self.trusted = {h.lower() for h in pip.trusted_hosts}
        self.auth: dict[str, str] = {}  # host[:port] -> Authorization header
        try:
            verified = ssl.create_default_context(cafile=pip.cert)
        except OSError as exc:  # ssl.SSLError is one
            raise BuildError(f"pip configuration: cert {pip.cert}: {exc}") from None
        unverified = ssl.create_default_context()
        unverified.check_hostname = False
        unverified.verify_mode = ssl.CERT_NONE
        if pip.client_cert:
            try:
                for ctx in (verified, unverified):
                    ctx.load_cert_chain(pip.client_cert)
            except OSError as exc:
                raise BuildError(f"pip configuration: client-cert {pip.client_cert}: {exc}") from None
        proxies = {"http": pip.proxy, "https": pip.proxy} if pip.proxy else None
        self.openers = {
            trust: urllib.request.build_opener(
                urllib.request.ProxyHandler(proxies),
                urllib.request.HTTPSHandler(context=unverified if trust else verified),
            )
            for trust in (False, True)
        }

    def bare(self, url: str) -> str:
        """`url` without user:password@, remembering them for requests to that host."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or parts.username is None:
            return url
        netloc = parts.netloc.rpartition("@")[2]
        userinfo = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        self.auth[netloc.lower()] = "Basic " + base64.b64encode(userinfo.encode()).decode()
        return urlunsplit(parts._replace(netloc=netloc))

    def open(self, url: str, *, accept: str | None = None) -> Any:  # urllib's response
        parts = urlsplit(url)
        request = urllib.request.Request(url)
        if accept:
            request.add_header("Accept", accept)
        header = self.auth.get(parts.netloc.lower())
        if header:
            # never carried to the host a redirect points to
            request.add_unredirected_header("Authorization", header)
        trust = parts.netloc.lower() in self.trusted or (parts.hostname or "").lower() in self.trusted
        return self.openers[trust].open(request, timeout=self.timeout)

    def page(self, url: str) -> list[tuple[str, str, tuple[str, str] | None]]:
        """The files an index page, or a find-links page or directory, lists."""
        parts = urlsplit(url)
        if parts.scheme == "file" or "://" not in url:
            path = Path(urllib.request.url2pathname(parts.path)) if parts.scheme == "file" else Path(url)
            if path.is_dir() and not (path / "index.html").is_file():
                return [(p.name, p.resolve().as_uri(), None) for p in sorted(path.iterdir()) if p.is_file()]
            page = path / "index.html" if path.is_dir() else path
            if not page.is_file():
                raise _NotFound
            return parse_project_page(page.read_bytes(), "text/html", page.resolve().as_uri())
        try:
            with self.open(url, accept=ACCEPT) as resp:
                body = resp.read()
                content_type = resp.headers.get_content_type()
                return parse_project_page(body, content_type, resp.geturl())
        except urllib.error.HTTPError as exc:
            if exc.code in (404, 410):
                raise _NotFound from None
            raise


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    return str(getattr(exc, "reason", exc))


def _versions_shown(versions: Iterable[Version]) -> str:
    ordered = [str(v) for v in sorted(set(versions))]
    if len(ordered) > SHOWN_VERSIONS:
        return "…, " + ", ".join(ordered[-SHOWN_VERSIONS:])
    return ", ".join(ordered)


def find_sdist(name: str, version: str, pip: PipSettings, http: IndexClient | None = None) -> IndexFile:
    """The sdist of exactly `name` `version` on the configured indexes and find-links, in pip's order."""
    http = http or IndexClient(pip)
    try:
        wanted = Version(version)
    except InvalidVersion:
        raise BuildError(f"{name} {version}: not a PEP 440 version") from None
    project = canonicalize_name(name)
    locations = [(http.bare(i).rstrip("/") + f"/{project}/", i.rstrip("/") + "/") for i in pip.indexes]
    locations += [(http.bare(link), link) for link in pip.find_links]
    asked: list[str] = []
    unreadable: list[str] = []
    versions: set[Version] = set()
    sdists: list[IndexFile] = []
    for url, location in locations:
        shown = without_credentials(location)
        asked.append(shown)
        try:
            files = http.page(url)
        except _NotFound:
            continue
        except (OSError, ValueError, KeyError, TypeError) as exc:  # URLError is an OSError
            unreadable.append(f"{shown}: {_reason(exc)}")
            continue
        for filename, file_url, digest in files:
            try:
                if filename.endswith(".whl"):
                    dist, found = parse_wheel_filename(filename)[:2]
                    is_sdist = False
                else:
                    dist, found = parse_sdist_filename(filename)
                    is_sdist = True
            except (InvalidWheelFilename, InvalidSdistFilename):
                continue
            if dist != project:
                continue
            versions.add(found)
            if found == wanted and is_sdist:
                sdists.append(
                    IndexFile(filename=filename, url=http.bare(file_url), digest=digest, where=shown)
                )
    if sdists:
        # a .tar.gz is what `python -m build --sdist` makes; a .zip only where nothing else is offered
        return next((f for f in sdists if f.filename.endswith(".tar.gz")), sdists[0])
    where = ", ".join(asked) if asked else "no index (pip's no-index is set and find-links is empty)"
    if wanted in versions:
        message = f"{name} {version} has no sdist on {where} (only wheels)"
    elif versions:
        message = f"{name} {version}: no such version on {where} (versions: {_versions_shown(versions)})"
    else:
        message = f"{name} {version}: no such project on {where}"
    if unreadable:
        message += f"; could not read {'; '.join(unreadable)}"
    raise BuildError(message)


def _file_digests(path: Path, algo: str) -> tuple[str, str]:
    """The file's `algo` and sha256 hex digests, in one read."""
    hashers = {name: hashlib.new(name) for name in (algo, "sha256")}
    with path.open("rb") as fh:
        while block := fh.read(CHUNK):
            for h in hashers.values():
                h.update(block)
    return hashers[algo].hexdigest(), hashers["sha256"].hexdigest()


def fetch_sdist(found: IndexFile, dest: Path, http: IndexClient) -> tuple[Path, str]:
    """`found` in `dest` (a cached copy whose hash still matches is reused), and its sha256."""
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / found.filename
    algo, expected = found.digest or ("sha256", None)
    if expected is not None and target.is_file():
        got, sha256 = _file_digests(target, algo)
        if got == expected:
            return target, sha256
    shown = f"{found.filename} from {found.where}"
    fd, tmp_name = tempfile.mkstemp(dir=dest, prefix=".partial-")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            if urlsplit(found.url).scheme == "file":
                with Path(urllib.request.url2pathname(urlsplit(found.url).path)).open("rb") as src:
                    shutil.copyfileobj(src, out, CHUNK)
            else:
                with http.open(found.url) as resp:
                    shutil.copyfileobj(resp, out, CHUNK)
    except (OSError, ValueError) as exc:  # URLError is an OSError
        tmp.unlink(missing_ok=True)
        raise BuildError(f"cannot download {shown}: {_reason(exc)}") from None
    got, sha256 = _file_digests(tmp, algo)
    if expected is not None and got != expected:
        tmp.unlink()
        raise BuildError(f"{shown}: {algo} of the download is {got}, the index says {expected}")
    os.replace(tmp, target)
    return target, sha256


# ---------------------------------------------------------------------------------------------- trees


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()[:16]


def _single_top_dir(root: Path) -> Path:
    entries = [p for p in root.iterdir()]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else root


def _unpack(archive: Path, dest: Path) -> Path:
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(dest)
    else:
        with tarfile.open(archive) as tf:
            tf.extractall(dest, filter="data")
    return _single_top_dir(dest)


_FAILED_HUNK = re.compile(r"^Hunk #(\d+) FAILED at (\d+)")
_CHECKING = re.compile(r"^(?:checking|patching) file (.+)$")
_MISSING_FILE = re.compile(r"can't find file to patch at input line (\d+)")


def _header_name(line: str) -> str | None:
    """The file a `--- ` or `+++ ` line names, as -p1 leaves it; None for /dev/null."""
    name = line[4:].split("\t", 1)[0].strip()
    if name == "/dev/null":
        return None
    return name.split("/", 1)[-1] if "/" in name else name


def _hunk_headers(patch: Path) -> dict[tuple[str, int], str]:
    """(file as the patch names it after -p1, hunk number) -> its `@@ ... @@` line, to name a failed hunk."""
    headers: dict[tuple[str, int], str] = {}
    current, number, old = "", 0, ""
    for line in patch.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("--- "):
            old = _header_name(line) or ""
        elif line.startswith("+++ "):
            current, number = _header_name(line) or old, 0  # a deleted file: its old name
        elif line.startswith("@@ ") and current:
            number += 1
            headers[(current, number)] = line
    return headers


def _file_at(patch: Path, line_number: int) -> str:
    """The file named by the header before `line_number` (the "input line" patch reports a hunk at)."""
    lines = patch.read_text(encoding="utf-8", errors="replace").splitlines()
    for line in reversed(lines[:line_number]):
        if (line.startswith("+++ ") or line.startswith("--- ")) and (name := _header_name(line)):
            return name
    return "?"


def _patch_failure(patch: Path, output: str) -> str:
    """What `patch --dry-run` said went wrong, one line: each failed hunk with its file and `@@` header."""
    headers = _hunk_headers(patch)
    current = "?"
    failed: list[str] = []
    other: list[str] = []
    for line in output.splitlines():
        if match := _CHECKING.fullmatch(line):
            current = match.group(1).strip().strip("'\"")
        elif match := _FAILED_HUNK.match(line):
            number, at = int(match.group(1)), match.group(2)
            header = headers.get((current, number), "")
            failed.append(f"{current} hunk #{number} {header} FAILED at line {at}".replace("  ", " "))
        elif match := _MISSING_FILE.search(line):
            other.append(f"{_file_at(patch, int(match.group(1)))}: no such file to patch")
        elif "Reversed (or previously applied)" in line:
            other.append(f"{current}: {line.strip().rstrip('.!')}")
    details = failed + other
    if not details:
        lines = [line for line in output.splitlines() if line.strip()]
        details = lines[-1:] or ["no output"]
    return "; ".join(details)


def apply_patches(tree: Path, patches: Sequence[Path]) -> None:
    """Apply each patch with -p1 in order, each tried with --dry-run first: a patch that does not apply is a
    ConfigError naming the patch and its failed hunks, and leaves no .rej or half-patched file behind.

    No fuzz: a hunk whose context changed upstream fails rather than landing wherever two lines still match
    (an offset, the same lines moved, is fine)."""
    for patch in patches:
        base = ["patch", "-p1", "--forward", "--batch", "--fuzz=0", "--reject-file=-", "-i", str(patch)]
        for step in ([*base, "--dry-run"], base):
            proc = subprocess.run(step, cwd=tree, capture_output=True, text=True)
            if proc.returncode != 0:
                raise ConfigError(
                    f"patch {patch} does not apply: {_patch_failure(patch, proc.stdout + proc.stderr)}"
                )


def prepare_source(
    *,
    kind: str,
    name: str,
    version: str,
    cache: Path,
    url: str | None = None,
    ref: str | None = None,
    path: Path | None = None,
    patches: Sequence[Path] = (),
    pip: PipSettings | None = None,
) -> PreparedSource:
    """The patched source tree, made once per (source, patches) and reused.

    For `source: pypi` the index is asked on every call (`pip` defaults to the host's pip configuration):
    its hash names the tree, so a cached tree is never one of other bytes, and the cached sdist is checked
    against it again.
    """
    patch_hashes = [hashlib.sha256(p.read_bytes()).hexdigest() for p in patches]
    archive: Path | None = None
    sdist: tuple[str, str] | None = None
    if kind == "path":
        assert path is not None
        if not path.is_dir():
            raise BuildError(f"source directory {path} does not exist")
        # Local trees change between runs: key on content so an edit is never built from a stale copy.
        stamp = [
            (str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(path.rglob("*"))
            if p.is_file() and ".git" not in p.parts
        ]
        key = _digest(kind, path, stamp, patch_hashes)
    elif kind == "git":
        key = _digest(kind, name, version, url, ref, patch_hashes)
    else:
        settings = pip or read_pip_settings()
        http = IndexClient(settings)
        found = find_sdist(name, version, settings, http)
        archive, sha256 = fetch_sdist(found, cache / "sdists", http)
        sdist = (found.filename, sha256)
        key = _digest(kind, sha256, patch_hashes)
    result = PreparedSource(
        tree=cache / "sources" / key / "tree",
        sdist=sdist[0] if sdist else None,
        sha256=sdist[1] if sdist else None,
    )
    final = result.tree.parent
    if final.is_dir():
        return result
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".partial-"))
    try:
        tree = tmp / "tree"
        if kind == "path":
            assert path is not None
            shutil.copytree(path, tree, ignore=IGNORED, symlinks=True)
        elif kind == "git":
            assert url is not None
            # a URL or ref that starts with "-" is never taken for one of git's options
            if ref is not None and ref.startswith("-"):
                raise BuildError(f"git ref {ref!r} is not a tag, branch or commit")
            cmd = ["git", "clone", "--recursive", "--quiet", "--", url, str(tree)]
            for step in (
                cmd,
                ["git", "-C", str(tree), "checkout", "--quiet", ref or "HEAD"],
                ["git", "-C", str(tree), "submodule", "update", "--init", "--recursive", "--quiet"],
            ):
                proc = subprocess.run(step, capture_output=True, text=True)
                if proc.returncode != 0:
                    # git repeats the URL, token and all, in its own messages
                    said = urls_without_credentials(" ".join(proc.stderr.strip().splitlines()[-1:]))
                    raise BuildError(f"git failed for {without_credentials(url)}@{ref}: {said}")
        else:
            assert archive is not None
            try:
                unpacked = _unpack(archive, tmp / "unpacked")
            except (OSError, tarfile.TarError, zipfile.BadZipFile) as exc:
                raise BuildError(f"cannot unpack {archive.name}: {exc}") from None
            unpacked.rename(tree)
        apply_patches(tree, patches)
        # Read-only mounts must still be readable by the container's unprivileged user.
        subprocess.run(["chmod", "-R", "a+rX", str(tree)], check=True)
        tmp.chmod(0o755)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result


def prepare_package(package: PackageSpec, recipe: Recipe, cache: Path) -> PreparedSource:
    """The source a build of `package` mounts: fetched as its `source:` says, the recipe's patches applied."""
    src = package.source
    return prepare_source(
        kind=src.kind,
        name=package.name,
        version=package.version,
        cache=cache,
        url=src.url,
        ref=src.ref,
        path=src.path,
        patches=recipe.patches,
    )


# ---------------------------------------------------------------------------------------------- editing


def unpack_for_editing(tree: Path, dest: Path) -> None:
    """A writable copy of a prepared tree in `dest` (which must not exist, or be empty), to edit."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ConfigError(f"{dest} already exists and is not an empty directory")
    shutil.copytree(tree, dest, symlinks=True, dirs_exist_ok=True)
    for path in [dest, *dest.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o200)


def _files(root: Path) -> set[str]:
    """The files under `root` that a build reads, relative, without build outputs and VCS state."""
    out: set[str] = set()
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if any(IGNORED(str(root), [part]) for part in rel.parts):
            continue
        if path.is_file() or path.is_symlink():
            out.add(rel.as_posix())
    return out


def diff_trees(base: Path, edited: Path) -> str:
    """A unified diff (a/ and b/ prefixes, for patch -p1) that turns `base` into `edited`: changed, added and
    removed text files. A changed binary file cannot be a patch: ConfigError naming it."""
    chunks: list[str] = []
    for rel in sorted(_files(base) | _files(edited)):
        old, new = base / rel, edited / rel
        if old.is_file() and new.is_file() and filecmp.cmp(old, new, shallow=False):
            continue
        if (old.is_file() and not new.exists() and old.stat().st_size == 0) or (
            new.is_file() and not old.exists() and new.stat().st_size == 0
        ):
            raise ConfigError(f"{edited / rel}: an empty file cannot be added or removed by a patch")
        # /dev/null names a created or deleted file, so patch creates or removes it rather than emptying it
        labels = (f"a/{rel}" if old.exists() else "/dev/null", f"b/{rel}" if new.exists() else "/dev/null")
        proc = subprocess.run(
            ["diff", "-uN", "--label", labels[0], "--label", labels[1], str(old), str(new)],
            capture_output=True,
        )
        if proc.returncode == 0:
            continue
        text = proc.stdout.decode("utf-8", "surrogateescape")
        if proc.returncode != 1 or text.startswith("Binary files"):
            raise ConfigError(f"{edited / rel}: a binary file differs; a patch can only carry text")
        chunks.append(text)
    return "".join(chunks)
