"""Builder images: a base bootstrapped from the distribution mirror, and builder flavors built via docker.

Flavors:
- "devel": NVIDIA's `nvidia/cuda:<cuda>-devel-<os>` image (pulled when missing) plus the job's Python from
  the OS packages (or, on Ubuntu without it, the deadsnakes PPA). Where no registry is reachable, a stand-in
  with the same layout (`factory-standin:cuda<cuda>-devel`, from the PyPI toolkit wheels on the bootstrapped
  base) takes the devel image's place.
- "manylinux": PyTorch's `pytorch/manylinux2_28-builder:cuda<cuda>` image (an old glibc, every CPython in
  /opt/python, the toolkit in /usr/local/cuda), as the portable-wheel projects use; the job's Python is the
  image's /opt/python/cpXY-cpXY.
- "pypi": any base with the job's Python plus the CUDA toolkit from NVIDIA's PyPI wheels (CUDA >= 13), built
  with the network off from a host-side wheelhouse. The default base, `factory-base:<suite>`, is made locally
  with debootstrap, so this flavor works on hosts that reach no container registry. For a Python its suite
  does not ship on a glibc old enough for the job's floor (3.13 below forky's 2.43), the base is
  `factory-base:bookworm-cpython`: bookworm plus that CPython compiled from the Debian mirror's source tarball
  (`ensure_cpython_base`, docker/Dockerfile.cpython, factory/build/cpythonsrc.py).
- "debian": the distribution's own CUDA, `nvidia-cuda-toolkit` from Debian's non-free archive (trixie: CUDA
  12.4, g++-13), installed with apt on the bootstrapped `factory-base:trixie`; it builds the CUDA 12 variants
  (torch 2.9/2.10 are CUDA 12.8 builds: a lower toolkit minor is a warning to torch's extension builder, and
  the wheel links the same libcudart.so.12) without a registry. One image per suite, named by its toolkit
  (`factory-builder:cu12.4-trixie-debian`); archs the toolkit cannot compile are refused at plan time.

Images carry labels with their kind, versions and a hash of their inputs, so an image whose inputs have not
changed is reused instead of rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from factory.build import emulation, engine
from factory.build.wheelhouse import download_wheelhouse, link_wheels, wheel_files
from factory.core.errors import ConfigError, DockerError, ImageError
from factory.core.home import factory_home
from factory.core.platforms import DEFAULT_PLATFORM, Platform, host_platform
from factory.core.resources import data_path
from factory.spec.imageref import check_image_reference
from factory.spec.toolchains import (
    _SUITE_RE,
    _VERSION_RE,
    BASE_REPOSITORY,
    DEFAULT_DEVEL_OS,
    DEFAULT_SUITE,
    MANYLINUX_REPOSITORY,
    STANDIN_REPOSITORY,
    Toolchain,
    _check_flavor,
    _check_pypi_toolkit,
    _check_version,
    base_image_name,
    base_platform_of,
    base_suite_of,
    builder_image_for,
    cuda_major,
    debian_toolchain,
    job_toolchain,
    platform_image_name,
    platform_suffix,
    pypi_toolchain,
    python_suite_for,
    standin_cuda_of,
    toolchain_image_name,
    toolchain_named,
)

Progress = Callable[[str], None]

# kind: "base", "standin" or "builder"; the factory's images are found by this key
LABEL = "io.wheel-factory.image"
LABEL_INPUTS = "io.wheel-factory.inputs"
LABEL_CUDA = "io.wheel-factory.cuda"
LABEL_TOOLKIT = "io.wheel-factory.toolkit"
LABEL_PYTHON = "io.wheel-factory.python"
LABEL_FLAVOR = "io.wheel-factory.flavor"
LABEL_BASE = "io.wheel-factory.base"
LABEL_SUITE = "io.wheel-factory.suite"
LABEL_MIRROR = "io.wheel-factory.mirror"
# The GCC every compile in the image uses ("14"); absent where the suite's one default g++ is it.
LABEL_GCC = "io.wheel-factory.gcc"
# The platform of an image's binaries; absent on the default platform's (their labels predate the axis).
LABEL_PLATFORM = "io.wheel-factory.platform"

DEFAULT_BASE_IMAGE = f"{BASE_REPOSITORY}:{DEFAULT_SUITE}"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_INCLUDE = ("python3", "python3-venv", "python3-dev", "g++", "ca-certificates")
FACTORY_UID = 10001


# nvidia/cuda tags carry the full version; a matrix names major.minor.
_DEVEL_CUDA_RELEASES = {
    "11.8": "11.8.0",
    "12.1": "12.1.1",
    "12.4": "12.4.1",
    "12.6": "12.6.3",
    "12.8": "12.8.1",
    "12.9": "12.9.1",
    "13.0": "13.0.1",
}


_STEP_ID_RE = re.compile(r"^---> ([0-9a-f]{12})$")
# The legacy builder wraps a step's stderr in colour codes; a `factory:` line must still be found.
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
_ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True, kw_only=True)
class AptSource:
    """One `deb` entry of the host's apt configuration."""

    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class ImageInfo:
    """One of the factory's images, as `factory images list` shows it."""

    tags: tuple[str, ...]
    id: str
    kind: str
    labels: Mapping[str, str]
    size: int
    created: str


# ---------------------------------------------------------------------------------------------- pure parts


def base_include(suite: str) -> tuple[str, ...]:
    """The packages debootstrap adds to a suite's base: every Python of its toolchain with -dev and -venv, and
    its pinned g++ (never the `g++` metapackage, which is the suite's newest GCC)."""
    toolchain = toolchain_named(suite)
    if toolchain is None or toolchain.gcc is None:
        return DEFAULT_INCLUDE
    pythons = [f"python{p}{part}" for p in toolchain.pythons for part in ("", "-dev", "-venv")]
    return ("python3", *pythons, f"g++-{toolchain.gcc}", "ca-certificates")


def compiler_links(gcc: str, target: Platform = DEFAULT_PLATFORM) -> dict[str, str]:
    """/usr/local/bin links that make GCC `gcc` the only compiler: nvcc runs `gcc`/`g++` from PATH, torch's
    cpp_extension `c++` (or $CXX), setuptools the `<triplet>-g++` of Python's sysconfig."""
    cc, cxx = f"/usr/bin/gcc-{gcc}", f"/usr/bin/g++-{gcc}"
    links = {"gcc": cc, "cc": cc, "g++": cxx, "c++": cxx, "cpp": f"/usr/bin/cpp-{gcc}"}
    for name in ("gcc", "g++", "cpp"):
        links[f"{target.gnu_triplet}-{name}"] = links[name]
    return links


def missing_toolchain_files(rootfs: Path, toolchain: Toolchain) -> list[str]:
    """What a bootstrapped root lacks of its toolchain (an interpreter, Python.h, venv, the compiler)."""
    wanted = []
    for python in toolchain.pythons:
        wanted += [
            f"usr/bin/python{python}",
            f"usr/include/python{python}/Python.h",
            f"usr/lib/python{python}/ensurepip/__init__.py",
        ]
    if toolchain.gcc is not None:
        wanted += [f"usr/bin/g++-{toolchain.gcc}", f"usr/bin/gcc-{toolchain.gcc}"]
    return [path for path in wanted if not (rootfs / path).exists()]


def debootstrap_script(suite: str, scripts_dir: Path = Path("/usr/share/debootstrap/scripts")) -> str | None:
    """The script debootstrap should use for `suite`: None when it has one of that name; "sid" for a newer
    suite it does not know yet (testing is bootstrapped like unstable)."""
    if (scripts_dir / suite).exists() or not (scripts_dir / "sid").exists():
        return None
    return "sid"


def debootstrap_commands(
    debootstrap: str,
    *,
    suite: str,
    rootfs: Path,
    mirror: str,
    include: Sequence[str],
    target: Platform = DEFAULT_PLATFORM,
    script: str | None = None,
    foreign: bool = False,
) -> list[list[str]]:
    """The commands that bootstrap `suite` for `target` into `rootfs`: one debootstrap for the host's own
    platform; for another, its first stage (`--foreign`: download and unpack) and the second stage run by
    the root's own debootstrap in a chroot (every binary there runs through QEMU's binfmt_misc entry, whose
    fix-binary flag makes the host's interpreter reach into the chroot)."""
    arch = [] if target == DEFAULT_PLATFORM and not foreign else [f"--arch={target.debian_arch}"]
    first = [
        debootstrap,
        "--variant=minbase",
        *arch,
        *(["--foreign"] if foreign else []),
        f"--include={','.join(include)}",
        suite,
        str(rootfs),
        mirror,
        *([script] if script else []),
    ]
    if not foreign:
        return [first]
    return [first, ["chroot", str(rootfs), "/debootstrap/debootstrap", "--second-stage"]]


def default_base_image(python: str, target: Platform = DEFAULT_PLATFORM) -> str:
    """The bootstrapped base for the pypi flavor with this Python ("factory-base:bookworm" for 3.11)."""
    return base_image_name(python_suite_for(python), target)


def devel_base_image(cuda: str, *, os_name: str = DEFAULT_DEVEL_OS) -> str:
    """NVIDIA's devel image for a CUDA version: "12.8" -> `nvidia/cuda:12.8.1-devel-ubuntu22.04`."""
    _check_version("CUDA", cuda)
    release = cuda if cuda.count(".") == 2 else _DEVEL_CUDA_RELEASES.get(cuda)
    if release is None:
        raise ImageError(
            f"no known nvidia/cuda release for CUDA {cuda}; pass the full version (e.g. {cuda}.0) "
            "or an explicit image"
        )
    return f"nvidia/cuda:{release}-devel-{os_name}"


def manylinux_base_image(cuda: str) -> str:
    """PyTorch's manylinux_2_28 builder image for a CUDA version: "12.8" ->
    `pytorch/manylinux2_28-builder:cuda12.8`."""
    _check_version("CUDA", cuda)
    series = ".".join(cuda.split(".")[:2])
    return f"{MANYLINUX_REPOSITORY}:cuda{series}"


def manylinux_python(python: str) -> str:
    """The interpreter of a manylinux image for a Python version: "3.11" -> /opt/python/cp311-cp311/bin/python
    (the GIL build; the free-threaded one is cp313-cp313t)."""
    _check_version("Python", python)
    tag = "cp" + "".join(python.split(".")[:2])
    return f"/opt/python/{tag}-{tag}/bin/python"


def standin_devel_image(cuda: str, target: Platform = DEFAULT_PLATFORM) -> str:
    """The local stand-in for NVIDIA's devel image: "13.0" -> `factory-standin:cuda13.0-devel`
    (`...-devel-<platform>` for another platform, made on that platform's bootstrapped base)."""
    _check_version("CUDA", cuda)
    return f"{STANDIN_REPOSITORY}:cuda{cuda}-devel{platform_suffix(target)}"


def toolkit_requirements(cuda: str) -> tuple[str, ...]:
    """The PyPI wheels that together form a CUDA toolkit tree (site-packages/nvidia/cu<major>)."""
    _check_pypi_toolkit(cuda)
    series = ".".join(cuda.split(".")[:2])
    names = ("nvidia-cuda-nvcc", "nvidia-cuda-cccl", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-runtime")
    return tuple(f"{name}=={series}.*" for name in names)


TOOL_REQUIREMENTS = ("ninja", "uv")


def image_requirements(*, cuda: str, flavor: str) -> tuple[str, ...]:
    """Everything a flavor installs from the host-side wheelhouse."""
    _check_flavor(flavor)
    if flavor == "pypi":
        return (*toolkit_requirements(cuda), *TOOL_REQUIREMENTS)
    return TOOL_REQUIREMENTS


STANDIN_DEVEL = "standin-devel"  # the Dockerfile of the devel stand-in: docker/Dockerfile.standin-devel


def dockerfile_path(flavor: str) -> Path:
    """factory/data/docker/Dockerfile.<flavor>; `flavor` may also be STANDIN_DEVEL."""
    if flavor != STANDIN_DEVEL:
        _check_flavor(flavor)
    return data_path("docker", f"Dockerfile.{flavor}")


def dockerfile_text(flavor: str) -> str:
    path = dockerfile_path(flavor)
    try:
        return path.read_text()
    except OSError as exc:
        raise ImageError(f"cannot read {path}: {exc.strerror}") from None


def _docker_file(name: str) -> str:
    path = data_path("docker", name)
    try:
        return path.read_text()
    except OSError as exc:
        raise ImageError(f"cannot read {path}: {exc.strerror}") from None


# A toolchain image is Dockerfile.pypi plus these steps (its Pythons and GCC checked, CUDA's headers fitted to
# the suite's glibc); the one-Python images keep Dockerfile.pypi alone, so their inputs are unchanged.
TOOLCHAIN_STEPS = "pypi-toolchain.dockerfile"
TOOLCHAIN_CONTEXT = ("cuda-headers-glibc.py",)


def toolchain_dockerfile_text() -> str:
    """The Dockerfile of a toolchain image: docker/Dockerfile.pypi, then docker/pypi-toolchain.dockerfile."""
    return dockerfile_text("pypi").rstrip("\n") + "\n\n" + _docker_file(TOOLCHAIN_STEPS)


def toolchain_context_files() -> dict[str, str]:
    """Name -> text of the files a toolchain image's build context carries besides wheels/; image inputs."""
    return {name: _docker_file(name) for name in TOOLCHAIN_CONTEXT}


def toolchain_build_args(
    *, cuda: str, toolchain: Toolchain, base_image: str, target: Platform = DEFAULT_PLATFORM
) -> dict[str, str]:
    """The `--build-arg` values of a toolchain image: Dockerfile.pypi's for its first Python (the toolkit
    venv's), and the Pythons and GCC its steps check."""
    python = toolchain.pythons[0]
    args = build_args(cuda=cuda, python=python, flavor="pypi", base_image=base_image, target=target)
    args["TRIPLET"] = target.gnu_triplet
    args["PYTHONS"] = " ".join(toolchain.pythons)
    if toolchain.gcc is not None:
        args["GCC"] = toolchain.gcc
    return args


def declared_build_args(dockerfile: str) -> frozenset[str]:
    """The ARG names a Dockerfile declares (with or without defaults)."""
    return frozenset(
        m.group(1) for m in re.finditer(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)", dockerfile, flags=re.MULTILINE)
    )


def build_args(
    *, cuda: str, python: str, flavor: str, base_image: str, target: Platform = DEFAULT_PLATFORM
) -> dict[str, str]:
    """The `--build-arg` values of a flavor's Dockerfile (`target`: the platform whose GNU triplet names its
    compilers)."""
    _check_flavor(flavor)
    _check_version("Python", python)
    args = {"BASE_IMAGE": base_image, "PYTHON": python, "FACTORY_UID": str(FACTORY_UID)}
    if flavor == "pypi":
        args["CUDA_MAJOR"] = str(cuda_major(cuda))
    if flavor == "devel":
        # the image checks its compilers are the platform's (a base of another platform fails its build)
        args["TRIPLET"] = target.gnu_triplet
    if flavor == "debian":
        toolchain = debian_toolchain(cuda=cuda, python=python)
        assert toolchain.cuda is not None and toolchain.gcc is not None
        args["TOOLKIT"] = toolchain.cuda
        args["GCC"] = toolchain.gcc
    if flavor == "manylinux":
        args["PYTHON_BIN"] = manylinux_python(python)
    return args


def standin_build_args(*, cuda: str, base_image: str) -> dict[str, str]:
    """The `--build-arg` values of docker/Dockerfile.standin-devel; bad values are errors before any build."""
    _check_pypi_toolkit(cuda)
    check_image_reference(base_image, "base image")
    return {"BASE_IMAGE": base_image, "CUDA": cuda, "CUDA_MAJOR": str(cuda_major(cuda))}


def inputs_hash(
    *,
    dockerfile: str,
    args: Mapping[str, str],
    base_id: str | None,
    wheels: Iterable[str],
    extra: Mapping[str, str] | None = None,
) -> str:
    """A content hash of everything an image is made from; a different hash means a rebuild."""
    payload = {
        "dockerfile": dockerfile,
        "args": dict(sorted(args.items())),
        "base_id": base_id,
        "wheels": sorted(wheels),
        "extra": dict(sorted((extra or {}).items())),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def toolkit_version(wheel_names: Iterable[str]) -> str | None:
    """The toolkit release an image carries: the version of its nvidia-cuda-nvcc wheel."""
    from packaging.utils import parse_wheel_filename

    for name in wheel_names:
        dist, version, _build, _tags = parse_wheel_filename(name)
        if dist == "nvidia-cuda-nvcc":
            return str(version)
    return None


def parse_apt_sources(text: str, *, deb822: bool) -> list[AptSource]:
    """The `deb` entries of an apt sources file (one-line `sources.list` or deb822 `*.sources`)."""
    sources: list[AptSource] = []
    if deb822:
        for stanza in re.split(r"\n\s*\n", text):
            fields: dict[str, str] = {}
            key = None
            for raw in stanza.splitlines():
                if raw.startswith("#") or not raw.strip():
                    continue
                if raw[0].isspace() and key is not None:
                    fields[key] += " " + raw.strip()
                    continue
                key, _, value = raw.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
            if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
                continue
            for uri in fields.get("uris", "").split():
                sources.append(
                    AptSource(
                        uri=uri,
                        suites=tuple(fields.get("suites", "").split()),
                        components=tuple(fields.get("components", "").split()),
                    )
                )
        return sources
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        line = re.sub(r"\[[^\]]*\]", " ", line[4:])  # drop `[arch=... signed-by=...]` options
        parts = line.split()
        if len(parts) >= 2:
            sources.append(AptSource(uri=parts[0], suites=(parts[1],), components=tuple(parts[2:])))
    return sources


def pick_mirror(sources: Sequence[AptSource]) -> str | None:
    """The mirror of the main archive: the first source carrying a plain suite (not -security/-updates)."""
    for source in sources:
        if not source.uri.startswith(("http://", "https://", "file:")):
            continue
        if any("-" not in suite and "/" not in suite for suite in source.suites):
            return source.uri.rstrip("/")
    return None


def host_apt_mirror(etc_apt: Path = Path("/etc/apt")) -> str | None:
    """The host's Debian mirror, read from its apt configuration."""
    sources: list[AptSource] = []
    main = etc_apt / "sources.list"
    if main.is_file():
        sources += parse_apt_sources(main.read_text(errors="replace"), deb822=False)
    parts = etc_apt / "sources.list.d"
    if parts.is_dir():
        for path in sorted(parts.iterdir()):
            if path.suffix == ".sources":
                sources += parse_apt_sources(path.read_text(errors="replace"), deb822=True)
            elif path.suffix == ".list":
                sources += parse_apt_sources(path.read_text(errors="replace"), deb822=False)
    return pick_mirror(sources)


def base_changes(
    *,
    suite: str,
    mirror: str,
    include: Sequence[str],
    gcc: str | None = None,
    target: Platform = DEFAULT_PLATFORM,
) -> list[str]:
    """The Dockerfile instructions `docker import` applies to a bootstrapped root filesystem."""
    inputs: list[Any] = [suite, sorted(include)]
    extra = []
    if gcc is not None:
        inputs.append(gcc)
        extra.append(f"LABEL {LABEL_GCC}={gcc}")
    if target != DEFAULT_PLATFORM:  # the default platform's inputs predate the axis: its images stay valid
        inputs.append(target.name)
        extra.append(f"LABEL {LABEL_PLATFORM}={target.name}")
    return [
        f"ENV PATH={_ROOT_PATH}",
        "ENV LANG=C.UTF-8",
        'CMD ["/bin/bash"]',
        f"LABEL {LABEL}=base",
        f"LABEL {LABEL_SUITE}={suite}",
        f"LABEL {LABEL_MIRROR}={mirror}",
        f"LABEL {LABEL_INPUTS}={hashlib.sha256(json.dumps(inputs).encode()).hexdigest()}",
        *extra,
    ]


# ---------------------------------------------------------------------------------------------- docker


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


def bootstrap_base(
    client: Any,
    *,
    suite: str = DEFAULT_SUITE,
    name: str = DEFAULT_BASE_IMAGE,
    mirror: str | None = None,
    include: Sequence[str] | None = None,
    progress: Progress | None = None,
    target: Platform = DEFAULT_PLATFORM,
) -> str:
    """Make a base image from the distribution mirror: `debootstrap --variant=minbase`, then `docker import`.

    The mirror defaults to the host's apt mirror, so a host that can install packages can also make images.
    `include` defaults to the suite's toolchain (`base_include`); a toolchain's pinned GCC is made the root's
    only gcc/g++/cc/c++ (`compiler_links`). Returns the image's tag.

    Another platform than the host's (`target`, an Arm base on an Intel host) is bootstrapped with
    `--arch` and `--foreign` (the packages unpacked), then its second stage (the packages configured) runs
    in the root under QEMU, which `emulation` checks first.
    """
    if not _SUITE_RE.fullmatch(suite):
        raise ConfigError(f"invalid suite name {suite!r}")
    include = tuple(include) if include is not None else base_include(suite)
    toolchain = toolchain_named(suite)
    check_image_reference(name, "image name")
    debootstrap = shutil.which("debootstrap") or (
        "/usr/sbin/debootstrap" if os.path.exists("/usr/sbin/debootstrap") else None
    )
    if debootstrap is None:
        raise ImageError(f"cannot bootstrap {name}: debootstrap is not installed (apt-get install it)")
    if os.geteuid() != 0:
        raise ImageError(f"cannot bootstrap {name}: debootstrap needs root")
    foreign = emulation.needs_emulation(target, host_platform())
    if foreign:
        emulation.require([target])
    mirror = mirror or host_apt_mirror() or DEFAULT_MIRROR
    repository, _, tag = name.rpartition(":")
    if not repository:
        repository, tag = name, "latest"
    log_dir = factory_home() / "logs" / "images"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"bootstrap-{suite}{platform_suffix(target)}.log"
    rootfs = Path(tempfile.mkdtemp(prefix=f"factory-rootfs-{suite}-"))
    try:
        _say(progress, f"debootstrap {suite} ({target.debian_arch}) from {mirror} (log: {log_path})")
        with log_path.open("w") as log:
            script = debootstrap_script(suite)
            for command in debootstrap_commands(
                debootstrap,
                suite=suite,
                rootfs=rootfs,
                mirror=mirror,
                include=include,
                target=target,
                script=script,
                foreign=foreign,
            ):
                if command[0] == "chroot":
                    _say(progress, f"debootstrap's second stage of {suite} under QEMU")
                proc = subprocess.run(
                    command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, check=False
                )
                if proc.returncode != 0:
                    break
        if proc.returncode != 0:
            raise ImageError(
                f"debootstrap of {suite} from {mirror} failed: {_last_line(log_path)} (log: {log_path})"
            )
        if toolchain is not None and include == base_include(suite):
            missing = missing_toolchain_files(rootfs, toolchain)
            if missing:
                raise ImageError(
                    f"the bootstrapped {suite} lacks {', '.join(missing)} (log: {log_path}); "
                    f"its toolchain needs {', '.join(include)}"
                )
            if toolchain.gcc is not None:
                for link, to in compiler_links(toolchain.gcc, target).items():
                    (rootfs / "usr/local/bin" / link).symlink_to(to)
        # Package caches only make the image bigger; apt in a container fetches fresh lists anyway.
        for pattern in ("var/cache/apt/archives/*.deb", "var/lib/apt/lists/*", "var/log/*.log"):
            for path in rootfs.glob(pattern):
                if path.is_file():
                    path.unlink()
        _say(progress, f"importing {name}")
        _import_rootfs(
            client,
            rootfs,
            repository=repository,
            tag=tag,
            changes=base_changes(
                suite=suite,
                mirror=mirror,
                include=include,
                gcc=toolchain.gcc if toolchain else None,
                target=target,
            ),
            platform=None if target == DEFAULT_PLATFORM else target.docker,
        )
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
    if engine.get_image(client, name) is None:
        raise ImageError(f"importing {name} reported success but the image is not there")
    _say(progress, f"made {name}")
    return name


def _last_line(path: Path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "no output"


def _import_rootfs(
    client: Any, rootfs: Path, *, repository: str, tag: str, changes: list[str], platform: str | None = None
) -> None:
    # /dev, /proc and /sys are the runtime's business; debootstrap's device nodes must not land in the image.
    tar = subprocess.Popen(
        [
            "tar",
            "-C",
            str(rootfs),
            "--numeric-owner",
            "--xattrs",
            "--exclude=./dev/*",
            "--exclude=./proc/*",
            "--exclude=./sys/*",
            "-c",
            ".",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert tar.stdout is not None

    def chunks() -> Iterator[bytes]:
        assert tar.stdout is not None
        while chunk := tar.stdout.read(1 << 20):
            yield chunk

    try:
        text = engine.import_image(
            client, chunks(), repository=repository, tag=tag, changes=changes, platform=platform
        )
    except DockerError:
        tar.kill()
        tar.wait()
        raise
    _, stderr = tar.communicate()
    if tar.returncode != 0:
        raise ImageError(f"tar of the bootstrapped root failed: {stderr.decode(errors='replace').strip()}")
    if '"error"' in text:
        raise ImageError(f"docker import of {repository}:{tag} failed: {text.strip()[:300]}")


def pull_image(
    client: Any,
    ref: str,
    *,
    progress: Progress | None = None,
    hint: str = "use flavor pypi or `factory images bootstrap`",
    target: Platform | None = None,
    local: str | None = None,
) -> None:
    """Pull `ref` (`target`'s variant of a multi-platform image where one is given); an unreachable registry
    is an ImageError that says what to do instead. `local` is the tag the variant is kept under
    (`platform_image_name`) where that is not `ref`: the pull moves `ref` to the variant, so `ref` is given
    back to the image it named before (or untagged), under `_PULL_LOCK`, which every look-up of a pulled
    base takes too."""
    repository, _, tag = ref.rpartition(":")
    if not repository or "/" in tag:
        repository, tag = ref, "latest"
    # the default platform's pull reads as it always has
    where = f" for {target.docker}" if target not in (None, DEFAULT_PLATFORM) else ""
    _say(progress, f"pulling {ref}{where}")
    with _PULL_LOCK:
        before = engine.get_image(client, ref) if local not in (None, ref) else None
        try:
            engine.pull_image(
                client, repository, tag=tag, platform=target.docker if target is not None else None
            )
        except DockerError as exc:
            # what to do first, then docker's own words (a long line of a DNS or TLS failure)
            raise ImageError(
                f"cannot pull {ref}{where}: no registry reachable; {hint} (docker: {exc})"
            ) from None
        if local in (None, ref):
            return
        assert local is not None
        pulled = engine.get_image(client, ref)
        if pulled is None:
            raise ImageError(f"pulling {ref}{where} reported success but the image is not there")
        engine.tag_image(client, pulled.id, local)
        if before is not None and before.id != pulled.id:
            engine.tag_image(client, before.id, ref)
        elif before is None:
            engine.remove_image(client, ref)  # only the tag: `local` keeps the image


# One pull at a time in this process: pulling another platform's variant moves the shared tag for a moment.
_PULL_LOCK = threading.RLock()


def _platform_mismatch(image: engine.LocalImage, target: Platform) -> bool:
    """Whether a pulled image is another platform's than `target` (its config's os/architecture; images the
    factory imports or builds are not judged by it, as a daemon may record its own architecture for them)."""
    return bool(image.platform) and image.platform != target.docker


def flavor_without_registry(cuda: str | None) -> str:
    """The flavor that builds `cuda` on a host that reaches no registry: pypi (NVIDIA's PyPI toolkit on a
    bootstrapped Debian) from CUDA 13, Debian's own toolkit package (12.4) before."""
    if cuda is not None and cuda_major(cuda) < 13:
        return "debian"
    return "pypi"


def pull_hint(*, flavor: str, image: str, cuda: str | None = None) -> str:
    """What to do when a flavor's base image cannot be pulled: first the flavor that needs no registry."""
    if flavor == "pypi":
        return f"use a bootstrapped base ({DEFAULT_BASE_IMAGE}, made by `factory images bootstrap`)"
    other = flavor_without_registry(cuda)
    works = f"set `build.flavor: {other}` in the matrix file (it needs no registry"
    works += f", CUDA {cuda})" if cuda else ")"
    offline = (
        f"{works}; or `docker save {image}` on a host that reaches the registry and `docker load` it here"
    )
    if flavor == "manylinux":
        return f"{offline}, or set build.base_image to an image with its layout"
    return (
        f"{offline}, or use the local stand-in (`factory images standin-devel --cuda <cuda>`, "
        f"build.base_image: {STANDIN_REPOSITORY}:cuda<cuda>-devel)"
    )


def _source_built_default_only(toolchain: Toolchain, target: Platform) -> None:
    # the source-built CPython base is compiled on the host: another platform's would need its compile
    # under QEMU, which nothing does yet
    if target != DEFAULT_PLATFORM:
        raise ImageError(
            f"the {toolchain.name} base (a source-built CPython) is made for {DEFAULT_PLATFORM.name} only, "
            f"not {target.name}"
        )


def _ensure_base(
    client: Any,
    base_image: str,
    *,
    flavor: str,
    bootstrap: bool,
    progress: Progress | None,
    cuda: str | None = None,
    pull: tuple[str, Platform] | None = None,
) -> engine.LocalImage:
    """The base image `base_image`, made when missing: a factory base bootstrapped, the stand-in built, any
    other image pulled; `pull` is (the reference, the platform) that `base_image` is pulled as where it is a
    registry image's platform variant (`platform_image_name`)."""
    suite = base_suite_of(base_image)
    standin_cuda = standin_cuda_of(base_image)
    if suite is None and standin_cuda is None:
        ref, target = pull or (base_image, None)
        with _PULL_LOCK:
            image = engine.get_image(client, base_image)
            if image is None or (target is not None and _platform_mismatch(image, target)):
                hint = pull_hint(flavor=flavor, image=ref, cuda=cuda)
                pull_image(client, ref, progress=progress, hint=hint, target=target, local=base_image)
                image = engine.get_image(client, base_image)
        if image is None:
            raise ImageError(f"base image {base_image} is still missing after it was pulled")
        return image
    image = engine.get_image(client, base_image)
    if image is not None:
        return image
    target = base_platform_of(base_image)
    source_built = toolchain_named(suite) if suite is not None else None
    if source_built is not None and source_built.source_built:
        _source_built_default_only(source_built, target)
        ensure_cpython_base(client, source_built, bootstrap=bootstrap, progress=progress)
    elif suite is not None:
        if not bootstrap:
            raise ImageError(
                f"base image {base_image} is missing; make it with `factory images bootstrap --suite {suite}"
                + (f" --platform {target.name}`" if target != DEFAULT_PLATFORM else "`")
            )
        bootstrap_base(client, suite=suite, name=base_image, progress=progress, target=target)
    else:
        assert standin_cuda is not None
        ensure_standin_devel(client, cuda=standin_cuda, bootstrap=bootstrap, progress=progress, target=target)
    image = engine.get_image(client, base_image)
    if image is None:
        raise ImageError(f"base image {base_image} is still missing after it was made")
    return image


def base_image_for(
    *,
    cuda: str,
    python: str,
    flavor: str,
    base_image: str | None,
    floor: str | None = None,
    target: Platform = DEFAULT_PLATFORM,
) -> str:
    """The image a builder image is made on: for pypi, `base_image` or the factory base of the job's
    toolchain (`pypi_toolchain`: the suite that ships `python`, or for a glibc `floor` below its glibc the
    base with a source-built `python`) for `target`; for devel and manylinux, NVIDIA's devel image or
    PyTorch's manylinux builder for `cuda` unless `base_image` names another image that is not a factory base
    (the devel stand-in, say); for another platform than the default, its variant's local tag
    (`platform_image_name`: `nvidia/cuda:12.8.1-devel-ubuntu22.04-<platform>`, pulled with the platform by
    `_ensure_base`) or that platform's stand-in (`factory-standin:cuda13.0-devel-<platform>`)."""
    if base_image is not None:
        check_image_reference(base_image, "base image")
    _check_flavor(flavor)
    if flavor == "pypi":
        toolchain = None if base_image else pypi_toolchain(python, base_image=None, floor=floor)
        if toolchain is not None:
            return base_image_name(toolchain.name, target)
        return base_image or default_base_image(python, target)
    if flavor == "debian":
        # the toolkit is the suite's own package: only that suite's bootstrapped base carries it
        return f"{BASE_REPOSITORY}:{debian_toolchain(cuda=cuda, python=python).suite}"
    if base_image and base_suite_of(base_image) is None:
        standin = standin_cuda_of(base_image)
        if standin is not None:  # the stand-in of the job's platform, made on its bootstrapped base
            return standin_devel_image(standin, target)
        return platform_image_name(base_image, target)
    ref = devel_base_image(cuda) if flavor == "devel" else manylinux_base_image(cuda)
    return platform_image_name(ref, target)


def build_images(
    *,
    cuda: str,
    pythons: Sequence[str],
    flavor: str,
    base_image: str | None = None,
    bootstrap: bool = True,
    progress: Progress | None = None,
    floor: str | None = None,
    target: Platform = DEFAULT_PLATFORM,
) -> list[str]:
    """`factory images build`: each Python's builder image (`ensure_builder_image`; for a glibc `floor`,
    the one a job with that floor gets), an image that several of `pythons` share built once; its tags, in the
    order of their first Python. Bad values (and another platform's missing emulation) are one line before
    the daemon is asked anything."""
    first_python: dict[str, str] = {}
    for python in pythons:
        tag = builder_image_for(
            cuda=cuda, python=python, flavor=flavor, base_image=base_image, floor=floor, target=target
        )
        first_python.setdefault(tag, python)
    emulation.require([target])
    client = engine.connect()
    return [
        ensure_builder_image(
            client,
            cuda=cuda,
            python=python,
            flavor=flavor,
            base_image=base_image,
            bootstrap=bootstrap,
            progress=progress,
            floor=floor,
            target=target,
        )
        for python in first_python.values()
    ]


def ensure_builder_image(
    client: Any,
    *,
    cuda: str,
    python: str,
    flavor: str,
    base_image: str | None = None,
    bootstrap: bool = True,
    progress: Progress | None = None,
    floor: str | None = None,
    target: Platform = DEFAULT_PLATFORM,
) -> str:
    """The tag of a builder image for (cuda, python, flavor), built only when missing or its inputs changed.

    `base_image` is the pypi flavor's base (None: `factory-base:<suite for python>`, bootstrapped when absent
    and `bootstrap` allows it); where that suite ships several Pythons, the image is the toolchain's
    (`ensure_toolchain_image`, named by `builder_image_for`), shared by all of them. The devel and manylinux
    flavors use NVIDIA's devel image or PyTorch's manylinux builder for `cuda` unless `base_image` names
    another image that is not a factory base; the devel stand-in (`factory-standin:cuda<cuda>-devel`) is made
    when missing.
    """
    toolchain = job_toolchain(python=python, flavor=flavor, base_image=base_image, floor=floor)
    if toolchain is not None:
        return ensure_toolchain_image(
            client,
            cuda=cuda,
            suite=toolchain.name,
            flavor=flavor,
            bootstrap=bootstrap,
            progress=progress,
            target=target,
        )
    name = builder_image_for(cuda=cuda, python=python, flavor=flavor, base_image=base_image, target=target)
    base = base_image_for(cuda=cuda, python=python, flavor=flavor, base_image=base_image, target=target)
    # another platform's variant of a registry image is pulled as the default platform's reference
    origin = base_image_for(cuda=cuda, python=python, flavor=flavor, base_image=base_image)
    base_obj = _ensure_base(
        client,
        base,
        flavor=flavor,
        bootstrap=bootstrap,
        progress=progress,
        cuda=cuda,
        pull=(origin, target) if flavor != "pypi" else None,
    )
    labels = {LABEL: "builder", LABEL_CUDA: cuda, LABEL_PYTHON: python, LABEL_FLAVOR: flavor}
    if target != DEFAULT_PLATFORM:
        labels[LABEL_PLATFORM] = target.name
    if flavor == "debian":
        # named and labelled by its toolkit (the Dockerfile checks nvcc is that release), not by a variant
        toolchain = debian_toolchain(cuda=cuda, python=python)
        assert toolchain.cuda is not None and toolchain.gcc is not None
        labels.update(
            {
                LABEL_CUDA: toolchain.cuda,
                LABEL_TOOLKIT: toolchain.cuda,
                LABEL_SUITE: toolchain.suite,
                LABEL_GCC: toolchain.gcc,
            }
        )
    return _make_image(
        client,
        name=name,
        base=base,
        base_id=base_obj.id,
        dockerfile=dockerfile_text(flavor),
        args=build_args(cuda=cuda, python=python, flavor=flavor, base_image=base, target=target),
        requirements=image_requirements(cuda=cuda, flavor=flavor),
        python=python,
        labels=labels,
        # Everything is in the context, so the build cannot reach anything; devel needs apt for Python,
        # debian for the toolkit (the distribution's mirror).
        network_mode=None if flavor in ("devel", "debian") else "none",
        progress=progress,
        target=target,
    )


def ensure_toolchain_image(
    client: Any,
    *,
    cuda: str,
    suite: str,
    flavor: str = "pypi",
    bootstrap: bool = True,
    progress: Progress | None = None,
    target: Platform = DEFAULT_PLATFORM,
) -> str:
    """The tag of the builder image carrying every Python of `suite`'s toolchain and its one GCC
    (`factory-builder:cu13.0-forky-pypi`), built only when missing or its inputs changed. Its toolkit venv
    (/opt/toolkit) runs on the toolchain's first Python; each job's venv uses the job's own. `suite` is the
    toolchain's name: a source-built one's base (`factory-base:bookworm-cpython`) is
    `ensure_cpython_base`'s."""
    toolchain = toolchain_named(suite)
    if toolchain is None or not toolchain.own_image or flavor != "pypi":
        raise ImageError(f"no multi-Python {flavor} toolchain for suite {suite!r}")
    name = toolchain_image_name(cuda=cuda, suite=suite, flavor=flavor, target=target)
    base = base_image_name(suite, target)
    if toolchain.source_built:
        _source_built_default_only(toolchain, target)
        ensure_cpython_base(client, toolchain, bootstrap=bootstrap, progress=progress)
    base_obj = _ensure_base(client, base, flavor=flavor, bootstrap=bootstrap, progress=progress)
    toolkit_python = toolchain.pythons[0]
    labels = {
        LABEL: "builder",
        LABEL_CUDA: cuda,
        LABEL_PYTHON: " ".join(toolchain.pythons),
        LABEL_FLAVOR: flavor,
        LABEL_SUITE: toolchain.suite,
    }
    if toolchain.gcc is not None:
        labels[LABEL_GCC] = toolchain.gcc
    if target != DEFAULT_PLATFORM:
        labels[LABEL_PLATFORM] = target.name
    return _make_image(
        client,
        name=name,
        base=base,
        base_id=base_obj.id,
        dockerfile=toolchain_dockerfile_text(),
        files=toolchain_context_files(),
        args=toolchain_build_args(cuda=cuda, toolchain=toolchain, base_image=base, target=target),
        requirements=image_requirements(cuda=cuda, flavor=flavor),
        python=toolkit_python,
        labels=labels,
        network_mode="none",
        progress=progress,
        target=target,
    )


CPYTHON_DOCKERFILE = "Dockerfile.cpython"


def cpython_build_args(toolchain: Toolchain) -> dict[str, str]:
    """The `--build-arg` values of docker/Dockerfile.cpython for a source-built toolchain."""
    return {"BASE_IMAGE": f"{BASE_REPOSITORY}:{toolchain.suite}", "PYTHONS": " ".join(toolchain.pythons)}


def ensure_cpython_base(
    client: Any, toolchain: Toolchain, *, bootstrap: bool = True, progress: Progress | None = None
) -> str:
    """The tag of a source-built toolchain's base (`factory-base:bookworm-cpython`): the suite's bootstrapped
    base plus each of its Pythons compiled from the pinned source tarball (factory/build/cpythonsrc.py),
    fetched and verified on the host; built only when missing or its inputs (Dockerfile, suite base,
    tarballs) changed. The build reaches the mirror for the libraries' headers."""
    from factory.build import cpythonsrc

    if not toolchain.source_built:
        raise ImageError(f"toolchain {toolchain.name} has no source-built Python")
    sources = [cpythonsrc.source_for(python) for python in toolchain.pythons]
    name = f"{BASE_REPOSITORY}:{toolchain.name}"
    suite_base = f"{BASE_REPOSITORY}:{toolchain.suite}"
    base_obj = _ensure_base(client, suite_base, flavor="pypi", bootstrap=bootstrap, progress=progress)
    dockerfile = _docker_file(CPYTHON_DOCKERFILE)
    args = cpython_build_args(toolchain)
    digest = inputs_hash(
        dockerfile=dockerfile,
        args=args,
        base_id=base_obj.id,
        wheels=(),
        extra={f"cpython:{s.python}": s.sha256 for s in sources},
    )
    existing = engine.get_image(client, name)
    if existing is not None and existing.labels.get(LABEL_INPUTS) == digest:
        _say(progress, f"reusing {name}")
        return name
    mirror = base_obj.labels.get(LABEL_MIRROR) or host_apt_mirror() or DEFAULT_MIRROR
    tarballs = {}
    for source in sources:
        _say(progress, f"fetching CPython {source.version}'s source from {mirror}")
        tarballs[source.python] = cpythonsrc.fetch(source, mirror=mirror)
    _say(progress, f"building {name} on {suite_base}: CPython {', '.join(s.version for s in sources)}")
    labels = {
        LABEL: "base",
        LABEL_SUITE: toolchain.suite,
        LABEL_PYTHON: " ".join(toolchain.pythons),
        LABEL_INPUTS: digest,
        LABEL_BASE: suite_base,
    }
    with tempfile.TemporaryDirectory(prefix="factory-image-") as tmp:
        context = Path(tmp)
        (context / "Dockerfile").write_text(dockerfile)
        (context / "sources").mkdir()
        for python, tarball in tarballs.items():
            shutil.copyfile(tarball, context / "sources" / f"python{python}.tar.xz")
        stage_ids = _build(
            client, context, tag=name, buildargs=args, labels=labels, network_mode=None, progress=progress
        )
    built = engine.get_image(client, name)
    if built is None:
        raise ImageError(f"building {name} reported success but the image is not there")
    if existing is not None and existing.id != built.id:
        _remove_quietly(client, existing.id)
    _remove_stage_images(client, built, stage_ids)
    _say(progress, f"built {name}")
    return name


def ensure_standin_devel(
    client: Any,
    *,
    cuda: str,
    base_image: str | None = None,
    bootstrap: bool = True,
    progress: Progress | None = None,
    target: Platform = DEFAULT_PLATFORM,
) -> str:
    """The tag of the local stand-in for `nvidia/cuda:<cuda>-devel` (docker/Dockerfile.standin-devel), built
    only when missing or its inputs (Dockerfile, base, toolkit wheels) changed. For another platform than
    the default it is that platform's (`factory-standin:cuda13.0-devel-<platform>`: the toolkit's wheels of
    the platform on its bootstrapped base, `factory-base:bookworm-<platform>` unless `base_image` names one),
    labelled with it."""
    base_image = base_image or base_image_name(DEFAULT_SUITE, target)
    args = standin_build_args(cuda=cuda, base_image=base_image)
    base_obj = _ensure_base(client, base_image, flavor="pypi", bootstrap=bootstrap, progress=progress)
    # The toolkit wheels are `py3-none`; the base's own Python only runs pip while the image is built.
    toolchain = toolchain_named(base_suite_of(base_image) or DEFAULT_SUITE)
    python = toolchain.pythons[0] if toolchain is not None else "3.11"
    labels = {LABEL: "standin", LABEL_CUDA: cuda}
    if target != DEFAULT_PLATFORM:
        labels[LABEL_PLATFORM] = target.name
    return _make_image(
        client,
        name=standin_devel_image(cuda, target),
        base=base_image,
        base_id=base_obj.id,
        dockerfile=dockerfile_text(STANDIN_DEVEL),
        args=args,
        requirements=toolkit_requirements(cuda),
        python=python,
        labels=labels,
        network_mode="none",
        progress=progress,
        target=target,
    )


def _make_image(
    client: Any,
    *,
    name: str,
    base: str,
    base_id: str,
    dockerfile: str,
    args: Mapping[str, str],
    requirements: Sequence[str],
    python: str,
    labels: Mapping[str, str],
    network_mode: str | None,
    progress: Progress | None,
    files: Mapping[str, str] | None = None,
    target: Platform = DEFAULT_PLATFORM,
) -> str:
    """Build `name` from `dockerfile` with `requirements` as wheels/ in its context (and `files`, name ->
    text, beside the Dockerfile), unless an image of that name carries the same inputs hash already. The
    wheels are `target`'s (the toolkit's wheels of that platform)."""
    files = dict(files or {})
    wheelhouse = download_wheelhouse(requirements, python=python, platform=target.wheelhouse_tag)
    wheels = [w.name for w in wheel_files(wheelhouse)]
    digest = inputs_hash(
        dockerfile=dockerfile,
        args=args,
        base_id=base_id,
        wheels=wheels,
        extra={"requirements": "\n".join(requirements), **{f"file:{n}": t for n, t in files.items()}},
    )
    existing = engine.get_image(client, name)
    if existing is not None and existing.labels.get(LABEL_INPUTS) == digest:
        _say(progress, f"reusing {name}")
        return name
    _say(progress, f"building {name} on {base}" + (" (inputs changed)" if existing is not None else ""))
    all_labels = {**labels, LABEL_INPUTS: digest, LABEL_BASE: base}
    version = toolkit_version(wheels)
    if version is not None:
        all_labels[LABEL_TOOLKIT] = version
    with tempfile.TemporaryDirectory(prefix="factory-image-") as tmp:
        context = Path(tmp)
        (context / "Dockerfile").write_text(dockerfile)
        (context / "requirements.txt").write_text("\n".join(requirements) + "\n")
        for file_name, text in files.items():
            (context / file_name).write_text(text)
        link_wheels(wheelhouse, context / "wheels")
        stage_ids = _build(
            client,
            context,
            tag=name,
            buildargs=args,
            labels=all_labels,
            network_mode=network_mode,
            progress=progress,
        )
    built = engine.get_image(client, name)
    if built is None:
        raise ImageError(f"building {name} reported success but the image is not there")
    if existing is not None and existing.id != built.id:
        _remove_quietly(client, existing.id)
    _remove_stage_images(client, built, stage_ids)
    _say(progress, f"built {name}")
    return name


def _remove_quietly(client: Any, image_id: str) -> None:
    # The old image may still back a running container; it is then left for a later cleanup.
    with contextlib.suppress(DockerError):
        engine.remove_image(client, image_id)


def _build(
    client: Any,
    context: Path,
    *,
    tag: str,
    buildargs: Mapping[str, str],
    labels: Mapping[str, str],
    network_mode: str | None,
    progress: Progress | None,
) -> list[str]:
    """Run a build, streaming its steps to `progress`; returns the ids of the images it stepped through.
    Another platform's image is built as any other: the legacy builder runs its steps in containers of
    its base, whose binaries QEMU runs; no `--platform` is passed, because a daemon that records the host's
    architecture for an imported base (20.10 does) would then look for another base and try to pull it."""
    log_dir = factory_home() / "logs" / "images"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{tag.replace(':', '_').replace('/', '_')}.log"
    tail: list[str] = []
    step_ids: list[str] = []
    error: str | None = None
    with log_path.open("w") as log:
        try:
            stream = engine.build_image(
                client,
                context,
                tag=tag,
                buildargs=buildargs,
                labels=labels,
                network_mode=network_mode,
            )
            for chunk in stream:
                if "error" in chunk:
                    error = str(chunk.get("error", "")).strip()
                    log.write(error + "\n")
                    break
                text = chunk.get("stream")
                if not text:
                    continue
                log.write(text)
                for line in text.splitlines():
                    line = _ANSI_RE.sub("", line).strip()
                    if not line:
                        continue
                    tail = [*tail[-19:], line]
                    if line.startswith("Step "):
                        _say(progress, line if len(line) <= 100 else line[:99] + "…")
                    elif match := _STEP_ID_RE.fullmatch(line):
                        step_ids.append(match.group(1))
        except DockerError as exc:
            error = str(exc)
    if error is not None:
        context_line = next((line for line in reversed(tail) if line.startswith("factory:")), None)
        detail = f"{context_line}; " if context_line else ""
        raise ImageError(f"building {tag} failed: {detail}{' '.join(error.split())[:300]} (log: {log_path})")
    return step_ids


def _remove_stage_images(client: Any, built: engine.LocalImage, step_ids: Sequence[str]) -> None:
    # The legacy builder keeps each earlier stage (the toolkit stage, with the wheels) as an untagged
    # image; nothing reuses it because unchanged inputs reuse the final image, so it is only wasted disk.
    try:
        kept = engine.image_layers(client, built.id)
    except DockerError:
        return
    for short_id in reversed(step_ids):
        if short_id not in kept:
            _remove_quietly(client, short_id)


def image_toolkit(client: Any, name: str) -> str | None:
    """The CUDA release of an image's nvcc: the factory's label, else the CUDA_VERSION NVIDIA's images set
    ("12.8.1" -> "12.8"); None when the image says neither."""
    image = engine.get_image(client, name)
    if image is None:
        return None
    label = image.labels.get(LABEL_TOOLKIT)
    if label:
        return str(label)
    for item in image.env:
        key, _, value = str(item).partition("=")
        if key == "CUDA_VERSION" and _VERSION_RE.fullmatch(value):
            return ".".join(value.split(".")[:2])
    return None


def list_images(client: Any) -> list[ImageInfo]:
    """The factory's images (bases and builders), newest first."""
    found = [
        ImageInfo(
            tags=image.tags,
            id=image.short_id,
            kind=image.labels.get(LABEL, "?"),
            labels=image.labels,
            size=image.size,
            created=image.created,
        )
        for image in engine.list_images(client, label=LABEL)
    ]
    return sorted(found, key=lambda i: i.created, reverse=True)


def housekeeping_image(found: Sequence[ImageInfo], host: Platform | None = None) -> str | None:
    """A local image to run the driver's housekeeping phases in (`list_images`' order): a tagged builder,
    whose system python3 the driver runs with, of the host's platform (`host`, default this host's) where
    there is one, as another platform's runs under QEMU (or not at all); None when this host has none."""
    builders = [image for image in found if image.kind == "builder" and image.tags]
    here = (host or host_platform() or DEFAULT_PLATFORM).name
    native = [i for i in builders if i.labels.get(LABEL_PLATFORM, DEFAULT_PLATFORM.name) == here]
    chosen = native or builders
    return chosen[0].tags[0] if chosen else None
