"""What the torch wheels on an index say about themselves: the format of torch's files on a simple index.

The facts compat.json holds by hand, read from where torch publishes them:

- the wheel's filename: its version and local label (`+cu130` a CUDA 13.0 build, `+cpu` no CUDA build), its
  Pythons and platform tags, and the glibc its manylinux tag needs (and with it the C++11 ABI: torch's
  manylinux_2_28 builds use the new one);
- its metadata (a PEP 658 file when the index offers one, else the wheel's own METADATA): the CUDA of a build
  without a local label, from its `cuda-toolkit==X.Y.*` or `nvidia-cuda-runtime(-cuNN)==X.Y.*` requirement;
- `torch/version.py` in the wheel (`cuda = '13.0'`), and the C++ standard torch's headers require, from the
  `#error` guard of `torch/include/ATen/ATen.h` (`__cplusplus < 202002L` -> C++20).

A wheel is read, when nothing smaller tells, by HTTP range requests: the zip's central directory and the three
small members, a few MiB of a 900 MB file (lazy-wheel style); a server without ranges gets a bounded full
download, a local index's file is read in place. Every page, request, member and download is bounded, and
whatever an index sends is validated before use: a page, a metadata file or a wheel refused is a fact
missing, named in the reasons, never a traceback.

Pages are cached under $FACTORY_HOME/torch-index keyed by their URL, revalidated with their ETag or
Last-Modified (a page without either is reused for PAGE_TTL_S); what a wheel says is cached forever, keyed by
what was read: a remote wheel by its URL and the sha256 its index gives for it (a wheel downloaded whole must
hash to it), a local file by its path, size and mtime. Never by a sha256 alone: an index that claims another
index's hash for its own wheel would have that index's torch read as its own (a lying index's CUDA 12.1 /
C++14 build named as an honest index's 2.14).
"""

from __future__ import annotations

import ast
import contextlib
import email.parser
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.client import HTTPException
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from factory.core import bounded, leftovers, safefs
from factory.core.platforms import DEFAULT_PLATFORM, Platform
from factory.core.simpleapi import PYPI_JSON_TYPE, parse_anchors
from factory.core.urls import without_credentials
from factory.plan.pipindex import (
    ACCEPT,
    LOCAL_LINK_SCHEMES,
    REMOTE_LINK_SCHEMES,
    IndexClient,
    IndexPageError,
    PipSettings,
    _copy_local,
    _links_checked,
    _NotFound,
    _reason,
    _TooLarge,
    parse_project_page,
)
from factory.spec.options import FetchLimits

PROJECT = "torch"
HEADER = "torch/include/ATen/ATen.h"  # its `#error` guard names the C++ standard torch's headers need
VERSION_PY = "torch/version.py"
PAGE_TTL_S = 600.0  # a page without an ETag or Last-Modified is read again after this long
MAX_MEMBER = 4 * 2**20  # METADATA, version.py, ATen.h: a few KiB each
MAX_METADATA = 1 * 2**20  # a PEP 658 metadata file
MAX_HEADER = 256 * 2**10  # ATen.h: a few KiB (its guard is read line by line, never by a backtracking regex)
MAX_FACTS_BYTES = 64 * 2**10  # a wheel's cached facts: a few hundred bytes
# all range requests of one wheel together: torch's central directory is ~1.3 MiB for 13,000 files
RANGE_BUDGET = 48 * 2**20
MAX_RANGE_REQUESTS = 64
BLOCK = 256 * 2**10  # one range request reads at least this much
MAX_WHEELS_READ = 48  # wheels opened in one run (most come from the cache)
# __cplusplus values of the standards, as a header's guard compares them
_STANDARDS = {201103: "11", 201402: "14", 201703: "17", 202002: "20", 202302: "23"}
# A guard, line by line (each pattern anchored and free of nested repetition: linear in the line): an `#if`
# comparing __cplusplus below a standard, then an `#error` within the next GUARD_LINES lines.
_IF = re.compile(r"[ \t]*#[ \t]*if\b")
_BELOW = re.compile(r"__cplusplus[ \t]*<[ \t]*(\d{6})L?\b")
_ERROR = re.compile(r"[ \t]*#[ \t]*error\b")
GUARD_LINES = 4
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_MANYLINUX = re.compile(r"manylinux_(\d+)_(\d+)_\w+")
_CU = re.compile(r"cu(\d{2,4})")
_CP = re.compile(r"cp3(\d{1,2})")
_RUNTIME = re.compile(r"nvidia-cuda-runtime(?:-cu\d+)?")
_NVIDIA_CU = re.compile(r"nvidia-[a-z0-9-]+-cu(\d+)")

Build = tuple[Literal["cuda", "cpu", "other"], str]  # ("cuda", "13.0"), ("cpu", ""), ("other", "rocm6.4")


# ---------------------------------------------------------------------------------------------- parsing


def build_of_local(local: str | None) -> Build | None:
    """What a local version label says a build is: "cu130" -> ("cuda", "13.0"), "cpu" -> ("cpu", ""),
    "rocm6.4" -> ("other", "rocm6.4"); None without a label (the index's plain build says nothing)."""
    if not local:
        return None
    if local == "cpu":
        return ("cpu", "")
    match = _CU.fullmatch(local)
    if match is None:
        return ("other", local)
    digits = match.group(1)
    major, minor = (digits[:-1], digits[-1]) if len(digits) <= 3 else (digits[:2], digits[2:])
    return ("cuda", f"{int(major)}.{int(minor)}")


def glibc_of(platform: str) -> tuple[int, int] | None:
    """The glibc a manylinux platform tag needs ("manylinux_2_28_<machine>" -> (2, 28)); None for others."""
    for legacy, needed in _LEGACY_MANYLINUX.items():
        if platform.startswith(legacy + "_"):
            return needed
    match = _MANYLINUX.fullmatch(platform)
    return (int(match.group(1)), int(match.group(2))) if match else None


def cuda_of_metadata(text: str) -> tuple[str | None, int | None]:
    """(CUDA "X.Y", CUDA major) a torch METADATA's requirements say: `cuda-toolkit==13.0.3` or
    `nvidia-cuda-runtime-cu12==12.8.90` give the release; `nvidia-*-cuNN` alone only the major."""
    message = email.parser.Parser().parsestr(text, headersonly=True)
    release: str | None = None
    major: int | None = None
    for line in message.get_all("Requires-Dist") or []:
        try:
            req = Requirement(str(line))
        except InvalidRequirement:
            continue
        if req.marker is not None and "extra" in str(req.marker):
            continue
        name = canonicalize_name(req.name)
        if name == "cuda-toolkit" or _RUNTIME.fullmatch(name):
            for spec in req.specifier:
                if spec.operator in ("==", "~=", ">="):
                    with contextlib.suppress(InvalidVersion):
                        v = Version(spec.version.rstrip(".*"))
                        release = release or f"{v.major}.{v.minor}"
        if match := _NVIDIA_CU.fullmatch(name):
            major = major or int(match.group(1))
    if release is not None:
        major = int(release.split(".")[0])
    return release, major


def build_of_version_py(text: str) -> Build | None:
    """What torch/version.py says: `cuda = '13.0'` -> ("cuda", "13.0"); `cuda = None` with no `hip` ->
    ("cpu", ""); None when it says neither (read as data: nothing in it is run)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    values: dict[str, object] = {}
    for node in tree.body:
        target: ast.expr | None = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        elif isinstance(node, ast.AnnAssign):
            target = node.target
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            values[target.id] = value.value
    cuda = values.get("cuda", "missing")
    if isinstance(cuda, str) and re.fullmatch(r"\d{1,2}\.\d{1,2}", cuda):
        return ("cuda", cuda)
    if cuda is None:
        hip = values.get("hip")
        return ("other", f"rocm{hip}") if isinstance(hip, str) else ("cpu", "")
    return None


def cxx_std_of_header(text: str) -> str | None:
    """The C++ standard a header's guard demands: `#if __cplusplus < 202002L` then `#error` -> "20"."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        below = _BELOW.search(line) if _IF.match(line) else None
        if below and any(_ERROR.match(after) for after in lines[i + 1 : i + 1 + GUARD_LINES]):
            found.append(int(below.group(1)))
    standards = [_STANDARDS[v] for v in found if v in _STANDARDS]
    return max(standards, key=int) if standards else None


@dataclass(frozen=True, kw_only=True)
class TorchFile:
    """One torch wheel an index lists, and what its filename says."""

    filename: str
    url: str
    digest: tuple[str, str] | None
    where: str  # the index or find-links location, as it may be shown
    version: Version
    pythons: tuple[str, ...]  # "3.11" for each cp311 tag
    platforms: tuple[str, ...]
    metadata: bool = False  # the index offers its PEP 658 metadata file

    @property
    def label_build(self) -> Build | None:
        return build_of_local(self.version.local)

    @property
    def glibc(self) -> tuple[int, int] | None:
        needs = [g for p in self.platforms if (g := glibc_of(p)) is not None]
        return min(needs) if needs else None

    def runs_on(self, platform: Platform = DEFAULT_PLATFORM) -> bool:
        """A manylinux wheel of `platform` (what the factory's builders install)."""
        return any(platform.manylinux_glibc(p) is not None for p in self.platforms)


def parse_torch_file(
    filename: str, url: str, digest: tuple[str, str] | None, where: str, *, metadata: bool = False
) -> TorchFile | None:
    """A torch wheel's record, or None for any other file (another project's, an sdist, a bad name)."""
    if not filename.endswith(".whl"):
        return None
    try:
        name, version, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    if name != PROJECT:
        return None
    pythons = sorted(
        {f"3.{m.group(1)}" for t in tags if (m := _CP.fullmatch(t.interpreter))}, key=lambda p: int(p[2:])
    )
    return TorchFile(
        filename=filename,
        url=url,
        digest=digest,
        where=where,
        version=version,
        pythons=tuple(pythons),
        platforms=tuple(sorted({t.platform for t in tags})),
        metadata=metadata,
    )


def metadata_offered(body: bytes, content_type: str) -> frozenset[str]:
    """The files whose PEP 658 metadata a simple page says it serves (`data-core-metadata`,
    `data-dist-info-metadata`, PEP 691's `core-metadata`/`dist-info-metadata`)."""
    names: set[str] = set()
    if content_type == PYPI_JSON_TYPE:
        with contextlib.suppress(ValueError):
            doc = json.loads(body)
            for item in doc.get("files", []) if isinstance(doc, dict) else []:
                if isinstance(item, dict) and isinstance(item.get("filename"), str):
                    offered = item.get("core-metadata", item.get("dist-info-metadata"))
                    if offered not in (None, False):
                        names.add(item["filename"])
        return frozenset(names)
    for anchor in parse_anchors(body.decode("utf-8", "replace")):
        offered = anchor.attrs.get("data-core-metadata", anchor.attrs.get("data-dist-info-metadata"))
        if offered is not None and offered.lower() != "false" and anchor.href:
            names.add(urllib.request.url2pathname(urlsplit(anchor.href).path.rsplit("/", 1)[-1]))
    return frozenset(names)


# ---------------------------------------------------------------------------------------------- sources


@dataclass(frozen=True, kw_only=True)
class TorchSource:
    """Where torch comes from for some CUDA: the host's pip configuration, or one index URL."""

    pages: tuple[str, ...]  # torch's project pages and find-links locations, in pip's order
    label: str  # as shown: "pip configuration" or the URL
    default: bool = False  # the host's pip configuration (build.torch_index: default)
    constraints: tuple[str, ...] = ()  # pip's constraint files, which cap the versions pip installs

    @classmethod
    def from_pip(cls, pip: PipSettings) -> TorchSource:
        pages = tuple(i.rstrip("/") + f"/{PROJECT}/" for i in pip.indexes) + tuple(pip.find_links)
        label = "the pip configuration's indexes"
        return cls(pages=pages, label=label, default=True, constraints=pip.constraints)

    @classmethod
    def from_url(cls, url: str) -> TorchSource:
        return cls(pages=(url.rstrip("/") + f"/{PROJECT}/",), label=without_credentials(url))


def constraint_specifiers(paths: Iterable[str]) -> tuple[tuple[str, Requirement], ...]:
    """The torch requirements of pip's constraint files ((file, requirement)); a file that cannot be read
    caps nothing here (pip itself will say so)."""
    out: list[tuple[str, Requirement]] = []
    for path in paths:
        if "://" in path:
            continue
        try:
            with bounded.open_file(path, max_bytes=None) as fh:  # a FIFO is refused, never waited on
                text = fh.read(MAX_METADATA).decode("utf-8", "replace")
        except OSError:
            continue
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            with contextlib.suppress(InvalidRequirement):
                req = Requirement(line)
                if canonicalize_name(req.name) == PROJECT:
                    out.append((path, req))
    return tuple(out)


# ---------------------------------------------------------------------------------------------- reading


@dataclass(frozen=True, kw_only=True)
class WheelFacts:
    """What one wheel's metadata and files say; `read` names what was read, `problems` what could not be."""

    build: Build | None = None  # from version.py, else the metadata's CUDA requirement
    build_from: str = ""  # "metadata" or "headers" (the wheel's files)
    cuda_major: int | None = None
    cxx_std: str | None = None
    problems: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "build": list(self.build) if self.build else None,
            "build_from": self.build_from,
            "cuda_major": self.cuda_major,
            "cxx_std": self.cxx_std,
            "problems": list(self.problems),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> WheelFacts:
        build = doc.get("build")
        ok_build = isinstance(build, list) and len(build) == 2 and build[0] in ("cuda", "cpu", "other")
        major = doc.get("cuda_major")
        std = doc.get("cxx_std")
        return cls(
            build=(build[0], str(build[1])) if ok_build else None,  # type: ignore[index]
            build_from=str(doc.get("build_from", "")),
            cuda_major=major if isinstance(major, int) else None,
            cxx_std=std if isinstance(std, str) and std in _STANDARDS.values() else None,
            problems=tuple(str(p) for p in doc.get("problems", []) if isinstance(p, str)),
        )


class _NoRanges(Exception):
    """The server answered a range request with the whole file."""


class _RangeFile:
    """A remote file read by HTTP range requests, as zipfile reads a file: seek, tell, read. Each request
    is bounded, and all of them together (`budget` bytes, MAX_RANGE_REQUESTS)."""

    def __init__(self, http: IndexClient, url: str, *, seconds: float, budget: int = RANGE_BUDGET) -> None:
        self.http, self.url, self.seconds, self.budget = http, url, seconds, budget
        self.fetched = 0
        self.requests = 0
        self.pos = 0
        self.spans: list[tuple[int, bytes]] = []
        start, tail, total = self._get(f"bytes=-{BLOCK}", BLOCK)
        self.size = total
        self.spans.append((start, tail))

    def _get(self, spec: str, want: int) -> tuple[int, bytes, int]:
        self.requests += 1
        if self.requests > MAX_RANGE_REQUESTS:
            raise IndexPageError(f"more than {MAX_RANGE_REQUESTS} range requests")
        if self.fetched + want > self.budget:
            raise IndexPageError(f"reading it needs more than {self.budget >> 20} MiB")
        try:
            status, headers, body = self.http.fetch(
                self.url,
                limit=want,
                seconds=self.seconds,
                headers={"Range": spec, "Accept-Encoding": "identity"},
            )
        except _TooLarge:
            # the whole file where a part was asked for: a server without ranges (the fallback is bounded too)
            raise _NoRanges from None
        if status != 206:
            raise _NoRanges
        match = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", headers.get("content-range", "").strip())
        if match is None:
            raise IndexPageError("a range answer without a Content-Range")
        start, end, total = (int(g) for g in match.groups())
        if end - start + 1 != len(body) or end >= total:
            raise IndexPageError("a range answer of another length than its Content-Range says")
        self.fetched += len(body)
        return start, body, total

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = max(0, min(self.size, base + offset))
        return self.pos

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            n = self.size - self.pos
        n = min(n, self.size - self.pos)
        if n <= 0:
            return b""
        for start, data in self.spans:
            if start <= self.pos and self.pos + n <= start + len(data):
                out = data[self.pos - start : self.pos - start + n]
                self.pos += n
                return out
        end = min(self.size, self.pos + max(n, BLOCK)) - 1
        start, data, _ = self._get(f"bytes={self.pos}-{end}", end - self.pos + 1)
        if start != self.pos:
            raise IndexPageError("a range answer from another offset than asked")
        self.spans.append((start, data))
        out = data[:n]
        self.pos += len(out)
        return out


def _member(zf: zipfile.ZipFile, name: str, limit: int = MAX_MEMBER) -> str | None:
    """A small member's text, or None when the wheel lacks it; a member declared larger than `limit` is
    refused, and one whose stream holds more than it declares is read no further than that."""
    try:
        data = bounded.read_member(zf, name, max_bytes=limit)
    except KeyError:
        return None
    except bounded.Refused:
        raise IndexPageError(f"{name} is larger than {bounded.size_text(limit)}") from None
    return data.decode("utf-8", "replace")


def facts_of_zip(zf: zipfile.ZipFile) -> WheelFacts:
    """What a torch wheel's version.py, METADATA and ATen.h say."""
    problems: list[str] = []
    infos = zf.infolist()
    dist_info = [i.filename for i in infos if re.fullmatch(r"torch-[^/]+\.dist-info/METADATA", i.filename)]
    metadata = _member(zf, dist_info[0]) if len(dist_info) == 1 else None
    release, major = cuda_of_metadata(metadata) if metadata else (None, None)
    build: Build | None = None
    build_from = ""
    version_py = _member(zf, VERSION_PY)
    if version_py is not None:
        build = build_of_version_py(version_py)
        build_from = "headers" if build else ""
    if build is None and release is not None:
        build, build_from = ("cuda", release), "metadata"
    header = _member(zf, HEADER, MAX_HEADER)
    if header is None:
        problems.append(f"no {HEADER}")
    std = cxx_std_of_header(header) if header is not None else None
    if header is not None and std is None:
        problems.append(f"{HEADER} has no C++ standard guard")
    return WheelFacts(
        build=build, build_from=build_from, cuda_major=major, cxx_std=std, problems=tuple(problems)
    )


# ---------------------------------------------------------------------------------------------- the reader


@dataclass
class TorchIndex:
    """Reads torch's pages and wheels for one run, through the cache under `home`."""

    http: IndexClient
    home: Path
    limits: FetchLimits = field(default_factory=FetchLimits)
    ttl: float = PAGE_TTL_S
    wheels_read: int = 0
    problems: list[str] = field(default_factory=list)  # pages and wheels that could not be read
    unreadable: dict[str, str] = field(default_factory=dict)  # page -> why it could not be read
    _pages: dict[str, list[TorchFile]] = field(default_factory=dict)
    _facts: dict[str, WheelFacts] = field(default_factory=dict)

    @property
    def cache(self) -> Path:
        return self.home / "torch-index"

    # --- pages

    def files(self, source: TorchSource) -> list[TorchFile]:
        """Every torch wheel `source`'s pages list (a page that cannot be read is a problem, and skipped)."""
        out: list[TorchFile] = []
        for page in source.pages:
            if page not in self._pages:
                try:
                    self._pages[page] = self._read_page(page)
                except _NotFound:
                    self._pages[page] = []
                except (OSError, ValueError, HTTPException) as exc:
                    self.unreadable[page] = f"{without_credentials(page)}: {_reason(exc)}"
                    self.problems.append(self.unreadable[page])
                    self._pages[page] = []
            out.extend(self._pages[page])
        return out

    def _read_page(self, page: str) -> list[TorchFile]:
        shown = without_credentials(page)
        parts = urlsplit(page)
        if parts.scheme in ("http", "https"):
            return self._remote_page(self.http.bare(page), shown)
        entries = self.http.page(page, self.limits)
        path = Path(urllib.request.url2pathname(parts.path)) if parts.scheme == "file" else Path(page)
        html = path / "index.html" if path.is_dir() else path
        offered: frozenset[str] = frozenset()
        if html.is_file():
            with bounded.open_file(html, max_bytes=None) as fh:  # a FIFO is refused, never waited on
                offered = metadata_offered(fh.read(self.limits.page_bytes), "text/html")
        return self._torch_files(entries, shown, offered)

    def _torch_files(
        self, entries: Iterable[tuple[str, str, tuple[str, str] | None]], shown: str, offered: frozenset[str]
    ) -> list[TorchFile]:
        files = []
        for filename, url, digest in entries:
            found = parse_torch_file(filename, url, digest, shown, metadata=filename in offered)
            if found is not None:
                files.append(found)
        return files

    def _page_cache(self, url: str) -> Path:
        return self.cache / "pages" / (hashlib.sha256(url.encode()).hexdigest()[:32] + ".json")

    def _cached_page(self, url: str) -> dict[str, Any] | None:
        """The cache's entry for the page `url`, or None (a miss) for one that is not there, not a regular
        file (a link or FIFO planted there is not followed nor waited on), larger than a page may be, or
        not of the shape this reader writes."""
        path = self._page_cache(url)
        try:
            data = safefs.read_bytes(
                self.cache, str(path.relative_to(self.cache)), max_bytes=self.limits.page_bytes
            )
            doc = json.loads(data)
        except (OSError, ValueError, RecursionError):
            return None
        return doc if _page_entry_ok(doc, url) else None

    def _remote_page(self, url: str, shown: str) -> list[TorchFile]:
        cached_path = self._page_cache(url)
        cached = self._cached_page(url)
        headers = {"Accept": ACCEPT}
        if cached is not None:
            if cached.get("etag"):
                headers["If-None-Match"] = str(cached["etag"])
            if cached.get("last_modified"):
                headers["If-Modified-Since"] = str(cached["last_modified"])
            fresh = time.time() - float(cached.get("fetched", 0)) < self.ttl
            if len(headers) == 1 and fresh:
                return self._from_cache(cached, shown)
        try:
            status, got, body = self.http.fetch(
                url, limit=self.limits.page_bytes, seconds=self.limits.page_seconds, headers=headers
            )
        except urllib.error.HTTPError as exc:
            if exc.code in (404, 410):
                raise _NotFound from None
            raise
        if status == 304 and cached is not None:
            return self._from_cache(cached, shown)
        content_type = got.get("content-type", "text/html").split(";")[0].strip().lower()
        entries = _links_checked(parse_project_page(body, content_type, url), REMOTE_LINK_SCHEMES)
        offered = metadata_offered(body, content_type)
        doc = {
            "url": url,
            "etag": got.get("etag"),
            "last_modified": got.get("last-modified"),
            "fetched": time.time(),
            "files": [[f, u, list(d) if d else None] for f, u, d in entries if f.endswith(".whl")],
            "metadata": sorted(offered),
        }
        _write_json(cached_path, doc)
        return self._torch_files(entries, shown, offered)

    def _from_cache(self, doc: Mapping[str, Any], shown: str) -> list[TorchFile]:
        entries = []
        for item in doc["files"]:
            if isinstance(item, list) and len(item) == 3 and all(isinstance(x, str) for x in item[:2]):
                d = item[2]
                digest = (str(d[0]), str(d[1])) if isinstance(d, list) and len(d) == 2 else None
                entries.append((item[0], item[1], digest))
        _links_checked(entries, REMOTE_LINK_SCHEMES)
        offered = frozenset(str(n) for n in doc.get("metadata", []) if isinstance(n, str))
        return self._torch_files(entries, shown, offered)

    # --- wheels

    def _facts_key(self, f: TorchFile) -> str | None:
        """The cache entry of what `f` says, named by what is read (see the module's docstring); None where
        nothing names the bytes (a remote wheel without a sha256: read in each run)."""
        local = _local_path(f.url)
        if local is not None:
            with contextlib.suppress(OSError):
                st = local.stat()
                read = f"local\0{os.path.abspath(local)}\0{st.st_size}\0{st.st_mtime_ns}"
                return hashlib.sha256(read.encode()).hexdigest()
            return None
        claimed = _claimed_sha256(f)
        return None if claimed is None else hashlib.sha256(f"url\0{f.url}\0{claimed}".encode()).hexdigest()

    def facts(self, f: TorchFile) -> WheelFacts:
        """What `f`'s metadata and files say, from the cache when the same file was read before."""
        key = self._facts_key(f) or f.url
        if key in self._facts:
            return self._facts[key]
        path = self.cache / "wheels" / f"{key}.json" if self._facts_key(f) else None
        if path is not None:
            with contextlib.suppress(OSError, ValueError, TypeError, AttributeError, RecursionError):
                data = safefs.read_bytes(
                    self.cache, str(path.relative_to(self.cache)), max_bytes=MAX_FACTS_BYTES
                )
                found = WheelFacts.from_json(json.loads(data))
                self._facts[key] = found
                return found
        facts = self._read_wheel(f)
        self._facts[key] = facts
        if path is not None and not any(p.startswith("cannot read") for p in facts.problems):
            _write_json(path, facts.to_json())
        return facts

    def _metadata_facts(self, f: TorchFile) -> WheelFacts | None:
        """The CUDA its PEP 658 metadata file names, when the index offers one."""
        if not f.metadata:
            return None
        url = f.url + ".metadata"
        try:
            local = _local_path(url)
            if local is not None:
                received = io.BytesIO()
                _copy_local(local, received, MAX_METADATA)  # a regular file only: not a FIFO, not /dev/zero
                body = received.getvalue()
            else:
                _, _, body = self.http.fetch(
                    self.http.bare(url), limit=MAX_METADATA, seconds=self.limits.page_seconds
                )
        except (OSError, ValueError, HTTPException) as exc:
            self.problems.append(f"{f.filename}.metadata: {_reason(exc)}")
            return None
        release, major = cuda_of_metadata(body.decode("utf-8", "replace"))
        if release is None:
            return None
        return WheelFacts(build=("cuda", release), build_from="metadata", cuda_major=major)

    def _read_wheel(self, f: TorchFile) -> WheelFacts:
        from_metadata = self._metadata_facts(f)
        self.wheels_read += 1
        if self.wheels_read > MAX_WHEELS_READ:
            problem = f"cannot read {f.filename}: more than {MAX_WHEELS_READ} wheels in one run"
            return from_metadata or WheelFacts(problems=(problem,))
        try:
            facts = self._open_wheel(f)
        except (OSError, ValueError, HTTPException, zipfile.BadZipFile, EOFError, RuntimeError) as exc:
            facts = WheelFacts(problems=(f"cannot read {f.filename}: {_reason(exc)}",))
        if from_metadata is not None:
            return WheelFacts(
                build=from_metadata.build,
                build_from="metadata",
                cuda_major=from_metadata.cuda_major,
                cxx_std=facts.cxx_std,
                problems=facts.problems,
            )
        return facts

    def _open_wheel(self, f: TorchFile) -> WheelFacts:
        local = _local_path(f.url)
        if local is not None:
            if not local.is_file():
                raise IndexPageError("not a regular file")
            with bounded.open_zip(local) as zf:
                return facts_of_zip(zf)
        url = self.http.bare(f.url)
        try:
            remote = _RangeFile(self.http, url, seconds=self.limits.page_seconds)
            if remote.size > self.limits.download_bytes:
                raise IndexPageError(f"larger than {self.limits.download_bytes >> 20} MiB")
            # the central directory, however large it says it is, comes within the range budget
            with bounded.open_zip(remote) as zf:
                return facts_of_zip(zf)
        except _NoRanges:
            pass
        # a server without range requests: the whole wheel, bounded, in a temporary file
        self.cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.cache, prefix=leftovers.partial_prefix()))
        try:
            target = tmp / "wheel.zip"
            digest = hashlib.sha256()
            with target.open("wb") as out:

                def write(block: bytes) -> None:
                    digest.update(block)
                    out.write(block)

                self.http.get(
                    url, write, limit=self.limits.download_bytes, seconds=self.limits.download_seconds
                )
            claimed = _claimed_sha256(f)
            if claimed is not None and digest.hexdigest() != claimed:
                # its facts would be cached under the hash its index gives: they must be those bytes' facts
                raise IndexPageError(
                    f"its bytes hash to {digest.hexdigest()[:16]}…, its index says {claimed[:16]}…"
                )
            with bounded.open_zip(target) as zf:
                return facts_of_zip(zf)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _claimed_sha256(f: TorchFile) -> str | None:
    """The sha256 `f`'s index gives for it, when it gives one that is one."""
    if f.digest is not None and f.digest[0] == "sha256" and re.fullmatch(r"[0-9a-f]{64}", f.digest[1]):
        return f.digest[1]
    return None


def _page_entry_ok(doc: object, url: str) -> bool:
    """Whether a page cache entry has the shape `_remote_page` writes: its URL, ETag and Last-Modified strings
    (or null), a number for when it was fetched, files of [filename, http(s) URL, [algo, hex] or null], and
    names of the metadata offered."""
    if not isinstance(doc, dict) or doc.get("url") != url:
        return False
    fetched, files, offered = doc.get("fetched", 0), doc.get("files"), doc.get("metadata", [])
    if not isinstance(fetched, (int, float)) or isinstance(fetched, bool) or fetched != fetched:
        return False
    if any(doc.get(k) is not None and not isinstance(doc.get(k), str) for k in ("etag", "last_modified")):
        return False
    if not isinstance(files, list) or not isinstance(offered, list):
        return False
    for item in files:
        if not (isinstance(item, list) and len(item) == 3 and all(isinstance(x, str) for x in item[:2])):
            return False
        if urlsplit(item[1]).scheme not in REMOTE_LINK_SCHEMES:
            return False
        digest = item[2]
        if digest is not None and not (
            isinstance(digest, list) and len(digest) == 2 and all(isinstance(x, str) for x in digest)
        ):
            return False
    return all(isinstance(n, str) for n in offered)


def _local_path(url: str) -> Path | None:
    parts = urlsplit(url)
    if parts.scheme == "file":
        return Path(urllib.request.url2pathname(parts.path))
    if "://" not in url:
        return Path(url)
    return None


def _write_json(path: Path, doc: object) -> None:
    """Atomically: a reader never sees half a file, and two runs writing the same entry both succeed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=leftovers.partial_prefix())
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def newest_first(files: Sequence[TorchFile]) -> list[TorchFile]:
    return sorted(files, key=lambda f: f.version, reverse=True)


__all__ = [
    "LOCAL_LINK_SCHEMES",
    "TorchFile",
    "TorchIndex",
    "TorchSource",
    "WheelFacts",
    "build_of_local",
    "build_of_version_py",
    "constraint_specifiers",
    "cuda_of_metadata",
    "cxx_std_of_header",
    "glibc_of",
    "metadata_offered",
    "parse_torch_file",
]
