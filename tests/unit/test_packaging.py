"""The factory as a tool: its wheel carries every file it reads at run time, `--version`, `-h` everywhere, the
version in report.json, and `pytest` run from a checkout without `python -m`."""

from __future__ import annotations

import email
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

import pytest
import typer

import factory
from factory.build import images
from factory.build.report import BuildReport
from factory.cli import app
from factory.container import CONTAINER_DIR
from factory.core import resources
from factory.spec import recipes
from factory.spec.options import FLAVORS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "factory"


def names_in(wheel: Path) -> dict[str, zipfile.ZipInfo]:
    with zipfile.ZipFile(wheel) as zf:
        return {info.filename: info for info in zf.infolist()}


def in_wheel(path: Path) -> str:
    """The name a file of the package has in the wheel."""
    return path.resolve().relative_to(ROOT).as_posix()


def test_the_wheel_carries_every_file_of_the_package(factory_wheel: Path) -> None:
    names = names_in(factory_wheel)
    shipped = sorted(
        p.relative_to(ROOT).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )
    assert len(shipped) > 100
    assert [name for name in shipped if name not in names] == []


def test_the_wheel_carries_what_the_factory_locates_at_run_time(factory_wheel: Path) -> None:
    names = names_in(factory_wheel)
    located = [
        *(images.dockerfile_path(flavor) for flavor in (*FLAVORS, images.STANDIN_DEVEL)),
        resources.data_path("docker", images.TOOLCHAIN_STEPS),
        *(resources.data_path("docker", name) for name in images.TOOLCHAIN_CONTEXT),
        resources.data_path("compat.json"),
        resources.data_path("flash-attn-compiles.csv"),
        *(d / recipes.RECIPE_FILE for d in recipes.recipes_dir().iterdir()),
        *(p for p in recipes.recipes_dir().rglob("*.patch")),
    ]
    for path in located:
        assert path.is_file(), path
        assert in_wheel(path) in names, path
    assert {d.name for d in recipes.recipes_dir().iterdir()} >= set(recipes.BUILTIN_RECIPES)
    # run in the builders as PYTORCH_NVCC and CXX: executable once installed
    for launcher in ("nvcc", "c++"):
        mode = names[in_wheel(CONTAINER_DIR / launcher)].external_attr >> 16
        assert mode & 0o111, oct(mode)


def test_the_wheel_is_the_factory_command_at_its_version(factory_wheel: Path) -> None:
    with zipfile.ZipFile(factory_wheel) as zf:
        dist_info = next(n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(zf.read(f"{dist_info}/METADATA"))
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
    assert meta["Name"] == "wheel-factory"
    assert meta["Version"] == factory.__version__
    assert "factory = factory.cli:main" in entry_points.splitlines()


def test_data_files_are_found_inside_the_package() -> None:
    assert resources.DATA_DIR == PACKAGE / "data"
    assert resources.data_path("docker", "Dockerfile.pypi") == images.dockerfile_path("pypi")
    assert recipes.recipes_dir() == resources.data_path("recipes")
    assert resources.read_data("compat.json").lstrip().startswith("{")
    assert not (ROOT / "docker").exists()


def test_version_prints_the_installed_version(factory_cli: Callable[[list[str]], tuple[int, str]]) -> None:
    code, out = factory_cli(["--version"])
    assert (code, out) == (0, f"factory {factory.version()}\n")


def test_version_is_the_distributions_else_the_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metadata, "version", lambda name: "9.8.7" if name == "wheel-factory" else "")
    assert factory.version() == "9.8.7"

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert factory.version() == factory.__version__


def command_paths() -> Iterator[list[str]]:
    """Every command and command group of the CLI, the top one first, as the words that name it."""

    def walk(command: object, path: list[str]) -> Iterator[list[str]]:
        yield path
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            yield from walk(sub, [*path, name])

    yield from walk(typer.main.get_command(app), [])


def test_every_command_takes_dash_h_as_help(factory_cli: Callable[[list[str]], tuple[int, str]]) -> None:
    paths = list(command_paths())
    assert ["images", "build"] in paths and ["build"] in paths
    for path in paths:
        for flag in ("-h", "--help"):
            code, out = factory_cli([*path, flag])
            assert code == 0, (path, flag, out)
            assert " ".join(["Usage: factory", *path]) in " ".join(out.split()), (path, flag, out)


def test_report_json_names_the_factory_that_built() -> None:
    data = BuildReport(run_id="r", matrix="m.yaml", started=0.0).to_json()
    assert data["factory_version"] == factory.version()
    # after the keys readers already know, in their order (each newer key after the older ones)
    assert list(data)[-3:] == ["factory_version", "compile_cache", "ci_run_url"]


def test_pytest_alone_imports_the_checkout() -> None:
    """`pytest tests/unit` as well as `python -m pytest`: the tests import bench/ from the checkout."""
    pytest_script = Path(sys.executable).with_name("pytest")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    files = ["tests/unit/bench/test_bench_model.py", "tests/unit/bench/test_bench_compiles_export.py"]
    proc = subprocess.run(
        [str(pytest_script), "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "No module named" not in proc.stdout
