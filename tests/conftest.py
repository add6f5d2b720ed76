"""Shared fixtures. Integration tests need real services: under CI=true a missing one fails, never skips."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Test modules share helpers by module name (`from test_memory_wrapper import setup`) across the folders
# tests/unit/<package>/ that mirror factory/: every test folder is on the path, whichever subset runs, as
# pytest's prepend import mode puts a test's own folder there (module names are unique across tests/).
for _folder in sorted({p.parent for p in Path(__file__).parent.rglob("test_*.py")}):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
ROOT = Path(__file__).resolve().parents[1]
# What building the project's wheel reads (pyproject.toml's readme and packages); nothing else of the checkout
WHEEL_INPUTS = ("pyproject.toml", "README.md", "factory")


# The work volume's uv cache keeps an unpacked torch, with its CUDA wheels (5-7 GB), for each torch and Python
# the suite builds for (about 11 GB in all). Where the disk runs short of this, a module's end empties the
# cache and the next build unpacks again: the suite must fit a CI machine whose free disk is shared with
# others. 20 GiB covers the most one module adds (the workflow play's three runners, each a job with torch);
# at 40 the cache was emptied after most modules on a machine with 42 GiB free, and unpacking again cost
# minutes of the suite (test_build.py: its SIGTERM test 53 s -> 4 s, test_cache_pythons.py 105 s -> 62 s).
KEEP_FREE_BYTES = int(float(os.environ.get("FACTORY_TEST_KEEP_FREE_GIB", "20")) * 2**30)


def disk_free(path: Path = Path("/var/lib/docker")) -> int:
    return shutil.disk_usage(path if path.is_dir() else "/").free


def empty_work_cache() -> bool:
    """Empty the uv cache in the factory's work volume (with a local builder image); False when there is no
    volume or image. Only between modules: no build runs then."""
    import docker

    from factory.build import jobspec

    client = docker.from_env(timeout=600)
    try:
        if not client.volumes.list(filters={"name": jobspec.WORK_VOLUME}):
            return False
        builders = [t for i in client.images.list() for t in i.tags if t.startswith("factory-builder:")]
        if not builders:
            return False
        cache = f"{jobspec.WORK_MOUNT}/uv-cache"
        client.containers.run(
            sorted(builders)[0],
            ["sh", "-c", f"find {cache} -mindepth 1 -maxdepth 1 -exec rm -rf {{}} +"],
            user="0",
            network_disabled=True,
            remove=True,
            volumes={jobspec.WORK_VOLUME: {"bind": jobspec.WORK_MOUNT, "mode": "rw"}},
        )
        return True
    finally:
        client.close()


@pytest.fixture(scope="module", autouse=True)
def bounded_work_cache(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if request.node.get_closest_marker("integration") is None or disk_free() >= KEEP_FREE_BYTES:
        return
    before = disk_free()
    if empty_work_cache():
        freed = (disk_free() - before) / 2**30
        print(f"\nthe work volume's uv cache emptied: {freed:.1f} GiB freed", file=sys.stderr)


@pytest.fixture
def factory_cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[[list[str]], tuple[int, str]]:
    """Run `factory ARGV` in this process as the console script does: its exit code, its stdout + stderr."""
    from factory.cli import main

    def run(argv: list[str]) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", ["factory", *argv])
        code = 0
        try:
            main()
        except SystemExit as exc:
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    return run


def require(condition: bool, what: str) -> None:
    """Skip locally when a real component is missing; fail under CI, where a skip hides untested features."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"CI=true but {what} is unavailable: integration tests must run in CI", pytrace=False)
    pytest.skip(f"{what} is unavailable")


@pytest.fixture(scope="session")
def docker_client() -> Iterator[object]:
    try:
        import docker

        client = docker.from_env(timeout=600)
        client.ping()
    except Exception as exc:  # the SDK raises several unrelated types when no daemon answers
        require(False, f"Docker ({exc.__class__.__name__})")
        raise
    yield client
    client.close()


@pytest.fixture(scope="session", autouse=True)
def session_factory_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A FACTORY_HOME of the session's own, for this process and every `factory` it starts.

    State from `make demo` or an earlier session (a learned compile profile, runs, sources) must not change
    the path a test takes. The wheelhouse cache is shared: its entries are keyed by a hash of their inputs,
    never change once made, and hold GBs of torch wheels that each session would otherwise download again.
    """
    from factory.core.home import factory_home

    shared = factory_home() / "wheelhouses"
    shared.mkdir(parents=True, exist_ok=True)
    home = tmp_path_factory.mktemp("factory-home")
    (home / "wheelhouses").symlink_to(shared.resolve(), target_is_directory=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FACTORY_HOME", str(home))
        yield home


@pytest.fixture(scope="session")
def cuda_home() -> Path:
    """The CUDA toolkit the tests compile with: NVIDIA's PyPI wheels in the test venv (`make toolkit`), as in
    the builder image; FACTORY_TEST_CUDA_HOME names another on purpose. Never the host's /usr/local/cuda by
    chance, which a fresh machine does not have."""
    chosen = os.environ.get("FACTORY_TEST_CUDA_HOME")
    if chosen:
        home = Path(chosen)
    else:
        found = sorted((Path(sysconfig.get_paths()["purelib"]) / "nvidia").glob("cu*/bin/nvcc"))
        home = found[-1].parent.parent if found else Path(sys.prefix)
    require((home / "bin" / "nvcc").is_file(), f"nvcc in {home} (`make toolkit` installs it)")
    return home


@pytest.fixture(scope="session")
def toolkit_nvcc(cuda_home: Path) -> str:
    return str(cuda_home / "bin" / "nvcc")


@pytest.fixture(scope="session")
def factory_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel as `pip wheel` builds it from a checkout, made from a copy of its build inputs so
    that the checkout gets no build/ or .egg-info and a file the build needs from elsewhere is missed."""
    tmp = tmp_path_factory.mktemp("factory-wheel")
    source = tmp / "source"
    source.mkdir()
    for name in WHEEL_INPUTS:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, source / name)
    dist = tmp / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(dist), str(source)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = dist.glob("*.whl")
    return wheel
