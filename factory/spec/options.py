"""The frozen option types a matrix file resolves to: the package and its source, the recipe, the build and
publish options. The loader (`factory.spec.config`) makes them; recipes, plans and builds read them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from packaging.utils import canonicalize_name

from factory.core import storeurl

PYTORCH_INDEX = "https://download.pytorch.org/whl/cu{tag}"
DEFAULT_CACHE_MAX = 20 * 2**30  # build.cache_max: the local compile cache's bound
# Bounds on fetching an sdist from an index: a broken or hostile index must end in an error, not fill the
# disk, the memory or the clock. The largest CUDA extension sdists are a few hundred MiB and unpack to a few
# GiB.
MAX_PAGE = 64 * 2**20  # a project's simple page (PyPI's largest are a few MiB)
PAGE_DEADLINE_S = 60.0
MAX_DOWNLOAD = 2 * 2**30  # package.max_download
DOWNLOAD_DEADLINE_S = 300.0  # package.download_deadline
MAX_UNPACKED = 16 * 2**30  # package.max_unpacked
MAX_MEMBERS = 200_000  # files, directories and links in an sdist

# Bounds of the numbers a matrix file or an option gives, said in the messages that enforce them. Past them a
# value is a typo or an attack, not a machine: 1e308 GiB overflowed int() in the planner, and a CPU count
# below Docker's nano_cpus resolution (1e-9 CPU, with 1e6 its smallest accepted) read as "no limit".
MAX_SIZE = 64 * 2**40  # any memory, budget or cache size
MIN_CPUS = 0.01
MAX_CPUS = 4096
MIN_PIDS = 64
MAX_PIDS = 4_194_304  # the kernel's own pid_max ceiling
MAX_ATTEMPTS = 20
MAX_COMPILE_GIB = 1024.0  # of one compile, per arch
MAX_COMPILE_SECONDS = 7 * 86400.0  # of one file's compile, per arch
# https://docs.github.com/en/actions/using-jobs/using-a-matrix-for-your-jobs: "at most 256 jobs per run".
MAX_MATRIX_JOBS = 256
MAX_SHARDS = MAX_MATRIX_JOBS  # more shards of one job than a GitHub matrix holds could not run side by side


def frozen_mapping(mapping: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """A read-only copy, for the mappings inside frozen options."""
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True, kw_only=True)
class Source:
    kind: Literal["pypi", "git", "path"] = "pypi"
    url: str | None = None
    ref: str | None = None
    path: Path | None = None


@dataclass(frozen=True, kw_only=True)
class FetchLimits:
    """How much an index may send and how long it may take, per request (a total, not a socket timeout: a
    server that drips a byte a second never times a read out), and how much an sdist may unpack to."""

    page_bytes: int = MAX_PAGE
    page_seconds: float = PAGE_DEADLINE_S
    download_bytes: int = MAX_DOWNLOAD
    download_seconds: float = DOWNLOAD_DEADLINE_S
    unpacked_bytes: int = MAX_UNPACKED
    members: int = MAX_MEMBERS


@dataclass(frozen=True, kw_only=True)
class PackageSpec:
    name: str
    version: str
    source: Source = field(default_factory=Source)
    sha256: str | None = None  # the sdist's, pinned in the matrix file (source: pypi only)
    limits: FetchLimits = field(default_factory=FetchLimits)

    @property
    def canonical_name(self) -> str:
        return canonicalize_name(self.name)


@dataclass(frozen=True, kw_only=True)
class Recipe:
    name: str
    arch_env: str = "TORCH_CUDA_ARCH_LIST"
    arch_format: Literal["flash-attn", "torch"] = "torch"
    local_version_env: str | None = None
    env: Mapping[str, str] = field(default_factory=frozen_mapping)
    patches: tuple[Path, ...] = ()
    import_name: str = ""
    min_arch: str | None = None
    compile_gib_per_arch: float = 4.0
    # Per-file estimates, (glob on the source file's base name, GiB per arch per nvcc thread) in order: the
    # first match wins, files matching none take compile_gib_per_arch. Kernel files of one package differ by
    # nearly 2x (flash-attn: forward 3.7, backward 6.6 GiB), so one worst-case figure starves a first build.
    compile_gib_by_file: tuple[tuple[str, float], ...] = ()
    # After its peak, a compile holds at most this fraction of it (flash-attn: cicc's RSS climbs to the peak
    # in the first 10-25% of the compile, then falls to a third of it), so an unprofiled compile seen past its
    # peak no longer needs its whole estimate reserved; None: it keeps it to the end.
    compile_after_peak: float | None = None
    # How long each file takes to compile, (glob on the base name, seconds of one arch on any one machine) in
    # order: a first build, which has no profile, starts the longest first (flash-attn's split-KV files take
    # twice its shortest forward files; last in setup.py's order, they would end the build alone). Only their
    # ratios count: the wrapper scales them to the build's own measured compiles.
    compile_seconds_by_file: tuple[tuple[str, float], ...] = ()
    # Packages the build needs beyond torch (installed into the build env from the wheelhouse).
    extra_build_requires: tuple[str, ...] = ("setuptools", "wheel", "ninja", "packaging")
    # The C++ standard the package compiles as, when it hard-codes one (flash-attn 2.x: "17"); None: torch's.
    cxx_std: str | None = None
    # The package (canonical name) and the versions (a PEP 440 specifier) the recipe's patches were made for;
    # None: any. A built-in recipe is the default for its package.
    package: str | None = None
    versions: str | None = None
    # A limited-API (abi3) wheel, one per variant (factory.spec.abi3): None: one wheel per Python; "cp39": the
    # tag the package builds; "auto" (`py_limited_api = true`): the tag of each variant's lowest Python.
    py_limited_api: str | None = None
    # A stable-ABI wheel (factory.spec.stable_abi): the torch release ("2.12") the package targets with
    # torch's stable C ABI; one wheel then serves every torch of the matrix from it on. None: one wheel per
    # torch.
    stable_abi: str | None = None
    # Extension modules (globs on their path in the wheel, `wheelcheck.library_glob_matches`) that may carry
    # no device code: PyG's `_version_cuda.so` only reports the CUDA version. Any other module without cubins
    # for the job's archs fails the wheel check.
    host_only_libraries: tuple[str, ...] = ()
    # Runtime requirements the package needs but its metadata forgets (a PyG extension importing
    # torch_scatter): added to the wheel's METADATA (Requires-Dist) and to the install check's wheelhouse,
    # without a patch. PEP 508 by name; never torch (the factory pins it) nor the package itself.
    extra_requires: tuple[str, ...] = ()


# build.check_indexes' word for the index the matrix publishes to (publish.to, a directory)
OWN_INDEX = "publish"

# Builder image flavors (factory/build/images.py): NVIDIA's devel image, NVIDIA's PyPI toolkit on a
# bootstrapped Debian, PyTorch's manylinux builder, Debian's own nvidia-cuda-toolkit package.
FLAVORS = ("devel", "pypi", "manylinux", "debian")


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    memory: int | None = None
    memory_budget: int | None = None
    cpus: float | None = None
    concurrency: int = 1
    flavor: Literal["devel", "pypi", "manylinux", "debian"] = "devel"
    # None: for the pypi flavor, the factory base whose Debian suite ships each job's Python
    base_image: str | None = None
    images: Mapping[str, str] = field(default_factory=frozen_mapping)
    pids_limit: int = 4096
    max_attempts: int = 3
    offline: bool = True
    # CUDA version -> index URL for torch, or "default" for the host's pip configuration.
    torch_index: Mapping[str, str] = field(default_factory=frozen_mapping)
    # The compile cache: True (the local one; with --publish, synced under the publish store), False (off),
    # or the store to sync it with (s3://bucket/prefix or a directory).
    cache: bool | str = True
    cache_max: int = DEFAULT_CACHE_MAX
    # build.glibc, the oldest glibc the wheels must install on: "2.28", "torch" (each torch's own floor, its
    # manylinux tag), or None (not declared: the builder's own glibc bounds the wheels;
    # `factory.plan.glibcfloor`)
    glibc: str | None = None
    # build.check_indexes: the factory's own indexes (the simple/ URL of a published index, file: or http(s),
    # or OWN_INDEX: the one publish.to names) whose variant index of a job's own variant the install check
    # may take its runtime requirements from (a dependency the factory built and published first);
    # `check_index_urls` names them per variant.
    check_indexes: tuple[str, ...] = ()

    def check_index_urls(self, variant_id: str, *, own: str | None = None) -> tuple[str, ...]:
        """The variant indexes of `variant_id` in build.check_indexes: `<simple/>/<variant id>/`; OWN_INDEX
        is `own` (`PublishOptions.pip_index`), left out where that is None."""
        roots = [own if root == OWN_INDEX else root for root in self.check_indexes]
        return tuple(f"{root.rstrip('/')}/{variant_id}/" for root in roots if root is not None)

    def torch_index_url(self, cuda: str) -> str | None:
        """Where torch for `cuda` comes from: a URL, or None meaning the host's own pip configuration."""
        value = self.torch_index.get(cuda)
        if value is None:
            return PYTORCH_INDEX.format(tag=cuda.replace(".", ""))
        return None if value == "default" else value


@dataclass(frozen=True, kw_only=True)
class PublishOptions:
    to: str = "./index"
    endpoint_url: str | None = None
    variants: bool = False  # also the experimental wheel variant channel (factory.publish.wheelvariants)

    def pip_index(self) -> str | None:
        """The `simple/` root pip reads this index at: a directory's as a file: URL (a relative one against
        the working directory, as `stores.open_store` takes it); None for an S3 store, which pip cannot
        read (its public http(s) URL goes in build.check_indexes)."""
        if storeurl.parse(self.to, what="publish.to").is_s3:
            return None
        return (Path(self.to).expanduser().resolve() / "simple").as_uri() + "/"
