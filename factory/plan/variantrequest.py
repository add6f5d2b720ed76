"""Build requests: a consumer's "no published variant fits my host, please build this one".

This module owns the request format (compose, parse, validate), its name (the sha256 of its canonical
form), the matrix lines it stands for, and the rate limiter `factory serve --accept-requests` applies.

A request comes from any HTTP client, so it is hostile until parsed here: a JSON object of at most
`MAX_BYTES` with only the keys below, each value a string of the grammar the factory itself writes (ASCII
digits only: `\\d` would take other scripts' digits), a bool, a short list of archs, or the name of a
platform of `factory.core.platforms`. A parsed request holds nothing else, so its values can only be
versions, archs, a platform and a PEP 508 project name; its file name is its content hash, never text the
client chose.

    {"format": "factory-request/1", "package": "flash-attn", "python": "3.11", "cuda": "13.0",
     "torch": "2.14", "cxx11_abi": true, "archs": ["9.0"], "platform": "<name>"}

`package` may be null (any package the matrix builds) and `archs` empty (the GPUs are unknown: any arch set
the matrix builds). `platform` is the host's (the machine of the wheel it asks for); without it a request is
for the default platform, which is what every request written before the platform axis meant. A request for
the default platform is composed without the key, so its bytes, and so its id and file name, are what they
were before the axis: a stored request keeps its name, and a factory that predates the axis reads it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from factory.core import safefs, strictjson
from factory.core.errors import ConfigError
from factory.core.platforms import DEFAULT_PLATFORM, NAMES, Platform, by_name
from factory.core.variants import Arch

FORMAT = "factory-request/1"
MAX_BYTES = 4096  # a request body or file larger than this is refused unread
MAX_ARCHS = 16
MAX_PACKAGE = 100
DIRECTORY = "_requests"  # under an index's root; `factory serve` never serves it
MAX_STORED = 1000  # requests an index keeps at most: past that, new ones are refused (507)
MAX_READ = 2 * MAX_STORED  # entries of a _requests/ directory `factory matrix --requests` reads at most
KEYS = frozenset({"format", "package", "python", "cuda", "torch", "cxx11_abi", "archs", "platform"})
REQUIRED = frozenset({"format", "python", "cuda", "torch"})

_PYTHON = re.compile(r"3\.(?:0|[1-9][0-9]?)", re.ASCII)
_CUDA = re.compile(r"[1-9][0-9]?\.(?:0|[1-9][0-9]?)", re.ASCII)
_TORCH = re.compile(r"(?:0|[1-9][0-9]{0,2})(?:\.(?:0|[1-9][0-9]{0,2})){1,2}", re.ASCII)
_ARCH = re.compile(r"[1-9][0-9]?\.[0-9][af]?", re.ASCII)
# PEP 508 names, ASCII only
_PACKAGE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?", re.ASCII)
_FILE_NAME = re.compile(r"[0-9a-f]{64}\.json", re.ASCII)


class RequestError(ValueError):
    """A request that is not one: the message says which key or value, never echoing much of it."""


@dataclass(frozen=True, kw_only=True)
class VariantRequest:
    package: str | None
    python: str  # "3.11"
    cuda: str  # "13.0"
    torch: str  # "2.14" or "2.14.1"
    cxx11_abi: bool = True
    archs: tuple[str, ...] = ()  # dotted, sorted, de-duplicated; () when the GPUs are unknown
    # the platform the wheel is for (the requesting host's); a row of the platform table, never a copy
    platform: Platform = DEFAULT_PLATFORM

    def __post_init__(self) -> None:
        # Built only from valid parts, so that composing and parsing are inverse and every value is safe.
        _check(self)

    @property
    def id(self) -> str:
        """The sha256 of the canonical form: equal requests have equal ids (and share one file)."""
        return hashlib.sha256(compose(self)).hexdigest()

    @property
    def file_name(self) -> str:
        return f"{self.id}.json"

    @property
    def arch(self) -> str:
        """The `arch` axis value: "8.0;9.0" ("" when the GPUs are unknown)."""
        return ";".join(self.archs)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check(request: VariantRequest) -> None:
    if request.package is not None and (
        not isinstance(request.package, str)
        or len(request.package) > MAX_PACKAGE
        or not _PACKAGE.fullmatch(request.package)
    ):
        raise RequestError(f"package {_short(request.package)} is not a project name")
    for key, pattern, like in (
        ("python", _PYTHON, "3.11"),
        ("cuda", _CUDA, "13.0"),
        ("torch", _TORCH, "2.14 or 2.14.1"),
    ):
        value = getattr(request, key)
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise RequestError(f"{key} {_short(value)} is not a version like {like}")
    if not isinstance(request.cxx11_abi, bool):
        raise RequestError(f"cxx11_abi {_short(request.cxx11_abi)} is not true or false")
    archs = request.archs
    if not isinstance(archs, tuple) or len(archs) > MAX_ARCHS:
        raise RequestError(f"archs: at most {MAX_ARCHS} compute capabilities")
    for arch in archs:
        if not isinstance(arch, str) or not _ARCH.fullmatch(arch):
            raise RequestError(f"archs: {_short(arch)} is not a compute capability like 9.0")
    if archs != tuple(a.dotted for a in sorted({Arch.parse_dotted(a) for a in archs})):
        raise RequestError("archs: not sorted and de-duplicated")
    if not isinstance(request.platform, Platform) or by_name(request.platform.name) != request.platform:
        raise RequestError(f"platform {_short(request.platform)} is not a platform of the table")


def platform_named(name: object) -> Platform:
    """A request's `platform` value -> the platform; RequestError naming the known ones."""
    found = by_name(name) if isinstance(name, str) else None
    if found is None:
        raise RequestError(f"platform {_short(name)} is not one of {', '.join(NAMES)}")
    return found


def make_request(
    *,
    package: str | None,
    python: str,
    cuda: str,
    torch: str,
    cxx11_abi: bool = True,
    archs: tuple[str, ...] | list[str] = (),
    platform: Platform = DEFAULT_PLATFORM,
) -> VariantRequest:
    """A request from loose parts: archs in any order or repeated are sorted and de-duplicated."""
    for arch in archs:
        if not isinstance(arch, str) or not _ARCH.fullmatch(arch):
            raise RequestError(f"archs: {_short(arch)} is not a compute capability like 9.0")
    if len(archs) > MAX_ARCHS:
        raise RequestError(f"archs: at most {MAX_ARCHS} compute capabilities")
    canonical = tuple(a.dotted for a in sorted({Arch.parse_dotted(a) for a in archs}))
    return VariantRequest(
        package=package,
        python=python,
        cuda=cuda,
        torch=torch,
        cxx11_abi=cxx11_abi,
        archs=canonical,
        platform=platform,
    )


def compose(request: VariantRequest) -> bytes:
    """The canonical JSON of a request (sorted keys, no spaces): what is sent, stored and hashed."""
    data = {
        "format": FORMAT,
        "package": request.package,
        "python": request.python,
        "cuda": request.cuda,
        "torch": request.torch,
        "cxx11_abi": request.cxx11_abi,
        "archs": list(request.archs),
    }
    if request.platform != DEFAULT_PLATFORM:  # the default platform's request is the one before the axis
        data["platform"] = request.platform.name
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def parse(data: bytes) -> VariantRequest:
    """A request's bytes -> the request; RequestError naming what is wrong."""
    if len(data) > MAX_BYTES:
        raise RequestError(f"over {MAX_BYTES} bytes")
    try:
        value = strictjson.loads(data)
    except strictjson.StrictJSONError as exc:
        raise RequestError(f"not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise RequestError("not a JSON object")
    unknown = sorted(set(value) - KEYS)
    if unknown:
        raise RequestError(f"unknown key {_short(unknown[0])} (known: {', '.join(sorted(KEYS))})")
    missing = sorted(REQUIRED - set(value))
    if missing:
        raise RequestError(f"missing key {missing[0]!r}")
    if value["format"] != FORMAT:
        raise RequestError(f"format {_short(value['format'])} is not {FORMAT!r}")
    archs = value.get("archs", [])
    if not isinstance(archs, list):
        raise RequestError("archs is not a list")
    cxx11_abi = value.get("cxx11_abi", True)
    # absent: a request written before the platform axis, which asked for the default platform's wheel
    platform = platform_named(value.get("platform", DEFAULT_PLATFORM.name))
    return make_request(
        package=value.get("package"),
        python=value["python"],
        cuda=value["cuda"],
        torch=value["torch"],
        cxx11_abi=cxx11_abi,
        archs=archs,
        platform=platform,
    )


def parse_stored(name: str, data: bytes) -> VariantRequest:
    """A stored request file: its name must be the hash of its canonical content (a file someone put there by
    hand, or changed, is refused rather than trusted)."""
    if not _FILE_NAME.fullmatch(name):
        raise RequestError("not a request file name (sha256.json)")
    request = parse(data)
    if request.file_name != name:
        raise RequestError("its name is not the sha256 of its content")
    return request


def matrix_lines(request: VariantRequest) -> list[str]:
    """The matrix-file lines (YAML) that would build what `request` asks for (its platform named where it is
    not the default, which an include entry without one builds)."""
    arch = f', arch: "{request.arch}"' if request.archs else ""
    abi = "true" if request.cxx11_abi else "false"
    platform = f", platform: {request.platform.name}" if request.platform != DEFAULT_PLATFORM else ""
    return [
        "matrix:",
        "  include:",
        f'    - {{cuda: "{request.cuda}", torch: "{request.torch}", python: "{request.python}", '
        f"cxx11_abi: {abi}{arch}{platform}}}",
    ]


@dataclass(kw_only=True)
class RateLimiter:
    """Sliding-window limits on accepted attempts: `per_client` in `window_s` for each client address and
    `total` in `window_s` for all of them. The clock is injected (monotonic seconds); the clients tracked are
    bounded (the least recently seen is forgotten first), so a flood of addresses cannot grow it."""

    per_client: int
    total: int
    window_s: float
    max_clients: int = 10_000
    clock: Callable[[], float] = time.monotonic
    _clients: OrderedDict[str, deque[float]] = field(default_factory=OrderedDict, init=False)
    _all: deque[float] = field(default_factory=deque, init=False)

    def _expire(self, times: deque[float], now: float) -> None:
        while times and times[0] <= now - self.window_s:
            times.popleft()

    def allow(self, client: str) -> float | None:
        """Count an attempt from `client`: None when it is allowed, else the seconds until one would be."""
        now = self.clock()
        self._expire(self._all, now)
        times = self._clients.pop(client, None) or deque()
        self._expire(times, now)
        self._clients[client] = times  # most recently seen last
        while len(self._clients) > self.max_clients:
            self._clients.popitem(last=False)
        waits = []
        if len(times) >= self.per_client:
            waits.append(times[0] + self.window_s - now)
        if len(self._all) >= self.total:
            waits.append(self._all[0] + self.window_s - now)
        if waits:
            return max(1.0, math.ceil(max(waits)))
        times.append(now)
        self._all.append(now)
        return None


class InboxFull(Exception):
    """The index holds `MAX_STORED` requests already."""


def _stored_names(fd: int) -> list[str]:
    return sorted(n for n in os.listdir(fd) if _FILE_NAME.fullmatch(n))


def store_request(index_root: Path, request: VariantRequest, *, max_stored: int = MAX_STORED) -> bool:
    """Write `request` under `index_root/_requests/` atomically (written aside, renamed into place, no link
    followed), named by its hash; True when new, False when the same request was there already. The caller
    serialises calls (the count of stored requests is read, then written to)."""
    with safefs.open_dir(index_root, DIRECTORY, create=True) as fd:
        names = _stored_names(fd)
    if request.file_name in names:
        return False
    if len(names) >= max_stored:
        raise InboxFull(f"{len(names)} requests stored already")
    safefs.write_bytes(index_root, f"{DIRECTORY}/{request.file_name}", compose(request))
    return True


def requests_directory(source: str) -> Path:
    """`factory matrix --requests`'s value (an index directory, its _requests/ directory, or a file:// URL
    of either) -> the _requests/ directory."""
    if "://" in source:
        parts = urlsplit(source)
        if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
            raise ConfigError(
                f"--requests {source}: give the index's directory or a file:// URL (the server never serves "
                "its requests)"
            )
        source = unquote(parts.path)
    path = Path(source).expanduser()
    if path.name != DIRECTORY:
        path = path / DIRECTORY
    if not path.is_dir():
        raise ConfigError(f"--requests {source}: no {DIRECTORY}/ directory there")
    return path


def _more_entries_than(directory: Path, limit: int) -> bool:
    """Whether `directory` holds more than `limit` entries (counted as they stream: at most limit + 1)."""
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        return any(i >= limit for i, _ in enumerate(entries))
    return False


def read_requests(
    directory: Path, *, warn: Callable[[str], None], max_entries: int = MAX_READ
) -> list[tuple[str, VariantRequest | str]]:
    """Every request file of a _requests/ directory (links, FIFOs and other files passed over, each read
    bounded): (name, the request) or (name, why it is refused). Past `max_entries` entries (more than an index
    keeps: someone put them there) the first ones by name are read and `warn` says, in one line, that the
    rest are not."""
    out: list[tuple[str, VariantRequest | str]] = []
    for found in safefs.walk(directory, max_depth=0, max_entries=max_entries):
        name = found.relative.name
        if name.startswith("."):  # a writer's temporary
            continue
        try:
            data = safefs.read_bytes(directory, name, max_bytes=MAX_BYTES)
            out.append((name, parse_stored(name, data)))
        except RequestError as exc:
            out.append((name, str(exc)))
        except OSError as exc:
            out.append((name, f"unreadable ({exc.strerror or exc})"))
    if _more_entries_than(directory, max_entries):
        warn(
            f"{directory}: more than {max_entries} entries (an index keeps at most {MAX_STORED} requests); "
            f"only the first {max_entries} by name were read"
        )
    return out
