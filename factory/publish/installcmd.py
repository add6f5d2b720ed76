"""The one owner of the install commands the factory prints (`factory which`, with and without
`--verify-key`, with and without torch) and renders (the index's human page), and of the choice they rest on:
which file of a project page an installer takes for a host (`choose`).

Every command installs exactly what the factory chose, never something an index offers beside it:
- pip takes the highest version over every index it is given and builds an sdist when that is the highest
  (a `0.2.0` sdist on PyPI beats our `0.1.0+cu13` wheel). So where the factory knows the file (`which`), the
  project is a direct reference to that file with its sha256 (`name @ URL#sha256=...`): pip and uv fetch that
  one URL, check the hash and never look the project up on any index; the other indexes serve only torch and
  the project's dependencies. Where it knows only the release (the human page, which cannot know the
  visitor's Python), the project is pinned to its full version with its local label (`name==2.8.3+cu13.0...`):
  no index that refuses local versions (PyPI) can offer it, and `--only-binary` leaves no sdist to build.
- uv takes a package from the first index that has it (`--index-strategy first-index`, its default, written
  out so that a `UV_INDEX_STRATEGY` in the consumer's environment cannot change it); the variant index comes
  first (`--index`), PyTorch's next, the default index last (`--default-index`).
- torch is pinned too (the installed release, or the variant's), so that no resolver swaps it under the
  wheel, from PyTorch's index of the variant's CUDA where that is not the default build.
- The wheel-variant channel (PEP 825, experimental; `factory.publish.wheelvariants`) has a uv command only
(pip takes
  no variant wheel): uv picks the variant by the driver and GPU, so neither a file nor a label is pinned;
  the project comes from the variant index alone (first-index, the variant index first, `--only-binary`).
Everything is shell-quoted (`shlex.join`): a command is one copy-paste line for sh and bash.
"""

from __future__ import annotations

import platform
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from factory.core.platforms import host_platform
from factory.core.simpleapi import parse_anchors
from factory.core.tags import parse_glibc, parse_manylinux, python_tag
from factory.core.urls import INDEX_SCHEMES
from factory.core.variants import VariantKey
from factory.spec.options import PYTORCH_INDEX
from factory.spec.torchreq import torch_requirement

DEFAULT_INDEX = "https://pypi.org/simple"
# uv's preview feature that makes it read PEP 825 variant wheels (uv >= 0.13.6)
PREVIEW_FEATURE = "wheel-variants"
_SHA256_HEX = frozenset("0123456789abcdef")


# this host's machine as wheel tags name it (`platform.machine()` may say another of its names)
_THIS_MACHINE = host.name if (host := host_platform()) is not None else platform.machine()


@dataclass(frozen=True, kw_only=True)
class Host:
    """What decides whether an installer on a host takes a wheel: its CPython ("3.11"), glibc ("2.36"; None
    where unknown: any manylinux tag is taken), machine (`platform.machine()`: a `factory.core.platforms`
    name)."""

    python: str
    glibc: str | None = None
    machine: str = _THIS_MACHINE


@dataclass(frozen=True, kw_only=True)
class Wheel:
    """One file of an index: its name, its URL (no fragment) and the sha256 its bytes must have."""

    filename: str
    url: str
    sha256: str

    @property
    def version(self) -> Version:
        return parse_wheel_filename(self.filename)[1]

    @property
    def pinned_url(self) -> str:
        return f"{self.url}#sha256={self.sha256}"


@dataclass(frozen=True, kw_only=True)
class Torch:
    """The torch a variant is built for: its requirement ("torch==2.14.*", "torch==2.14.1") and PyTorch's
    index of its CUDA build (None: the default index has it)."""

    requirement: str
    index: str | None = None


@dataclass(frozen=True, kw_only=True)
class Install:
    """What one install command installs: `project` as `wheel` (that file, by URL and hash) or, where no
    file is known, as the release `version` (full, with its local label) from `variant_index` alone; `torch`
    beside it; every dependency from `default_index`. With `wheel_variants`, `variant_index` is a PEP 825
    variant index (uv only): the variant is uv's to pick; `version` (public, optional) pins the release."""

    project: str
    torch: Torch | None
    wheel: Wheel | None = None
    version: str | None = None
    variant_index: str | None = None
    default_index: str = DEFAULT_INDEX
    wheel_variants: bool = False

    def __post_init__(self) -> None:
        if self.wheel_variants:
            if self.wheel is not None or self.variant_index is None:
                raise ValueError("a wheel-variant install names its variant index, never a wheel")
        elif (self.wheel is None) == (self.version is None or self.variant_index is None):
            raise ValueError("an install names either a wheel or a version and its variant index")

    @property
    def requirement(self) -> str:
        if self.wheel is not None:
            return f"{self.project} @ {self.wheel.pinned_url}"
        return f"{self.project}=={self.version}" if self.version is not None else self.project


def pip_command(install: Install) -> str:
    """`pip install ...` for `install` (see the module's docstring for why each option is there)."""
    if install.wheel_variants:
        raise ValueError("pip installs no variant wheels: a wheel-variant install has a uv command only")
    args = ["pip", "install", "--only-binary", install.project]
    if install.wheel is not None:
        args += ["--index-url", install.default_index]
    else:
        assert install.variant_index is not None
        args += ["--index-url", install.variant_index]
    if install.torch is not None and install.torch.index is not None:
        args += ["--extra-index-url", install.torch.index]
    if install.wheel is None:
        args += ["--extra-index-url", install.default_index]
    if install.torch is not None:
        args.append(install.torch.requirement)
    return shlex.join([*args, install.requirement])


def uv_command(install: Install) -> str:
    """`uv pip install ...` for `install`: the first index that has a package is the only one uv reads it
    from, the variant index first; for a wheel-variant install, with uv's preview of them."""
    args = ["uv", "pip", "install"]
    if install.wheel_variants:
        args += ["--preview-features", PREVIEW_FEATURE]
    args += ["--only-binary", install.project, "--index-strategy", "first-index"]
    if install.variant_index is not None and install.wheel is None:
        args += ["--index", install.variant_index]
    if install.torch is not None and install.torch.index is not None:
        args += ["--index", install.torch.index]
    args += ["--default-index", install.default_index]
    if install.torch is not None:
        args.append(install.torch.requirement)
    return shlex.join([*args, install.requirement])


def commands(install: Install) -> tuple[str, str]:
    """The pip and the uv command for `install`."""
    return pip_command(install), uv_command(install)


# ------------------------------------------------------------------------------------ what pip would take


def _interpreter_fits(tag: Tag, python: str) -> int:
    """How well a tag's interpreter and ABI fit CPython `python`, as pip ranks them (higher is better);
    0 where pip would not install it."""
    mine = python_tag(python)
    major, minor = (int(p) for p in python.split(".")[:2])
    if tag.interpreter == mine and tag.abi in (mine, "abi3", "none"):
        return 300 if tag.abi == mine else 200
    if tag.abi == "abi3" and tag.interpreter.startswith(f"cp{major}"):
        digits = tag.interpreter[len(f"cp{major}") :]
        if digits.isascii() and digits.isdigit() and int(digits) <= minor:
            return 100 + int(digits)
        return 0
    if tag.abi == "none" and tag.interpreter in (f"py{major}", f"py{major}{minor}"):
        return 10 if tag.interpreter == f"py{major}{minor}" else 5
    return 0


def _platform_fits(tag: Tag, host: Host) -> int:
    """How well a tag's platform fits the host (higher is better: the newest manylinux it runs); 0 where pip
    would not install it."""
    if tag.platform == "any":
        return 1
    if tag.platform == f"linux_{host.machine}":
        return 2
    parsed = parse_manylinux(tag.platform)
    if parsed is None or parsed.machine != host.machine:
        return 0
    have = parse_glibc(host.glibc) if host.glibc else None
    if have is not None and parsed.glibc > have:
        return 0
    return 3 + parsed.glibc[0] * 1000 + parsed.glibc[1]


def _fit(tags: Iterable[Tag], host: Host) -> tuple[int, int]:
    best = (0, 0)
    for tag in tags:
        fit = (_interpreter_fits(tag, host.python), _platform_fits(tag, host))
        if fit[0] and fit[1]:
            best = max(best, fit)
    return best


def _requires_python_fits(value: str | None, python: str) -> bool:
    """Does a link's data-requires-python admit CPython `python`? One that does not parse is not taken."""
    if not value:
        return True
    try:
        return SpecifierSet(value).contains(python, prereleases=True)
    except InvalidSpecifier:
        return False


def _linked_scheme_ok(page_url: str, url: str) -> bool:
    """A file link stays on the index's schemes, and only a local page links a local file."""
    scheme = urlsplit(url).scheme
    return scheme in INDEX_SCHEMES and (scheme != "file" or urlsplit(page_url).scheme == "file")


def candidates(page: str, *, page_url: str, project: str, host: Host) -> list[Wheel]:
    """The wheels of `project` on a project page that pip would consider for `host`, in the order it
    prefers them: the newest version first (a pre-release only where no final release fits), then the best
    tag. As pip does: the filename is the link's (not the anchor's text); yanked files, files whose
    Requires-Python excludes the host, sdists and wheels of other tags are left out. A file without a sha256
    in its link is left out too: a command must pin the bytes."""
    wanted = canonicalize_name(project)
    found: list[tuple[Version, tuple[int, int], str, Wheel]] = []
    for anchor in parse_anchors(page):
        if "data-yanked" in anchor.attrs:
            continue
        if not _requires_python_fits(anchor.attrs.get("data-requires-python"), host.python):
            continue
        link = urljoin(page_url, anchor.href)
        parts = urlsplit(link)
        if not link.isprintable() or not _linked_scheme_ok(page_url, link):
            continue
        fragment = parts.fragment
        sha256 = fragment.removeprefix("sha256=").lower() if fragment.startswith("sha256=") else ""
        if len(sha256) != 64 or not set(sha256) <= _SHA256_HEX:
            continue
        filename = unquote(parts.path.rpartition("/")[2])
        try:
            name, version, _build, tags = parse_wheel_filename(filename)
        except InvalidWheelFilename:
            continue  # an sdist, or not a distribution at all
        fit = _fit(tags, host)
        if name != wanted or not fit[0]:
            continue
        url = urlunsplit((parts.scheme, parts.netloc, parts.path, parts.query, ""))
        found.append((version, fit, filename, Wheel(filename=filename, url=url, sha256=sha256)))
    if any(not version.is_prerelease for version, *_ in found):
        found = [f for f in found if not f[0].is_prerelease]
    found.sort(key=lambda f: (f[0], f[1], f[2]), reverse=True)
    return [wheel for *_, wheel in found]


def choose(page: str, *, page_url: str, project: str, host: Host) -> Wheel | None:
    """The wheel of `project` pip would install on `host` from this page (`candidates`' first), or None."""
    found = candidates(page, page_url=page_url, project=project, host=host)
    return found[0] if found else None


def newest_release(filenames: Iterable[str]) -> str | None:
    """The newest version (with its local label) among wheel filenames; None when none parses. The human
    page pins a variant's project to it."""
    versions = []
    for filename in filenames:
        try:
            versions.append(parse_wheel_filename(filename)[1])
        except (InvalidWheelFilename, InvalidVersion):
            continue
    return str(max(versions)) if versions else None


def variant_install(project: str, *, version: str, variant_id: str, variant_index: str) -> Install | None:
    """What the human page's commands for a variant's project install: the release `version` from its
    variant index alone, with the variant's torch from PyTorch's index of the variant's CUDA (which carries
    every CUDA build of torch, the default one too, so the page needs no compatibility data and stays a pure
    function of its state). None for a variant id or version outside the grammar."""
    try:
        key = VariantKey.parse_id(variant_id)
        Version(version)
    except (ValueError, InvalidVersion):
        return None
    torch = Torch(
        requirement=str(torch_requirement(key.torch, exact=True)),
        index=PYTORCH_INDEX.format(tag=key.cuda.replace(".", "")),
    )
    return Install(project=project, torch=torch, version=version, variant_index=variant_index)
