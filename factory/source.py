"""Fetching a package's source on the host and applying the recipe's patches.

The build container mounts the result read-only; fetching on the host means the host's index configuration,
mirrors and CA certificates apply, and the container's network can stay off.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
import zipfile
from collections.abc import Sequence
from pathlib import Path

from packaging.utils import canonicalize_name

from factory.errors import BuildError

PYPI_JSON = "https://pypi.org/pypi/{name}/{version}/json"
IGNORED = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".venv")


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


def _download_sdist(name: str, version: str, dest: Path) -> Path:
    url = PYPI_JSON.format(name=canonicalize_name(name), version=version)
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            release = json.load(resp)
        sdists = [f for f in release["urls"] if f["packagetype"] == "sdist"]
        if not sdists:
            raise BuildError(f"{name} {version} has no source distribution on PyPI")
        target = dest / sdists[0]["filename"]
        with urllib.request.urlopen(sdists[0]["url"], timeout=600) as resp, target.open("wb") as fh:
            shutil.copyfileobj(resp, fh)
    except OSError as exc:
        raise BuildError(f"cannot download the sdist of {name} {version} from PyPI: {exc}") from exc
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    if digest != sdists[0]["digests"]["sha256"]:
        raise BuildError(f"sha256 mismatch for {target.name}: the download is corrupt")
    return target


def apply_patches(tree: Path, patches: Sequence[Path]) -> None:
    for patch in patches:
        proc = subprocess.run(
            ["patch", "-p1", "--forward", "--batch", "-i", str(patch)],
            cwd=tree,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            detail = (proc.stdout + proc.stderr).strip().splitlines()
            raise BuildError(f"patch {patch} does not apply: {detail[-1] if detail else 'no output'}")


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
) -> Path:
    """Return a directory holding the patched source tree, made once per (source, patches) and reused."""
    patch_hashes = [hashlib.sha256(p.read_bytes()).hexdigest() for p in patches]
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
    else:
        key = _digest(kind, name, version, url, ref, patch_hashes)
    final = cache / "sources" / key
    if final.is_dir():
        return final / "tree"
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
                    raise BuildError(f"git failed for {url}@{ref}: {proc.stderr.strip().splitlines()[-1:]}")
        else:
            archive = _download_sdist(name, version, tmp)
            unpacked = _unpack(archive, tmp / "unpacked")
            unpacked.rename(tree)
        apply_patches(tree, patches)
        # Read-only mounts must still be readable by the container's unprivileged user.
        subprocess.run(["chmod", "-R", "a+rX", str(tree)], check=True)
        tmp.chmod(0o755)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final / "tree"
