"""Pinned wheels installed by real pip and uv into fresh venvs: installers see the pin and enforce it."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import venv
from pathlib import Path
from types import ModuleType

import pytest

from factory.wheel.checks import check_wheel, pin_torch_requirement, record_hash

pytestmark = pytest.mark.integration


def _load_sibling(path: Path) -> ModuleType:
    """Import a helper test module by path: works whatever pytest's import mode."""
    name = f"_factory_test_helpers_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is being made
    spec.loader.exec_module(module)
    return module


_helpers = _load_sibling(Path(__file__).resolve().parents[1] / "unit" / "wheel" / "test_wheelcheck.py")
JOB, TAG, VERSION = _helpers.JOB, _helpers.TAG, _helpers.VERSION
members, metadata_text, write_wheel = _helpers.members, _helpers.metadata_text, _helpers.write_wheel

NAME = "factory-demo-ext"
WHEEL = f"factory_demo_ext-{VERSION}-{TAG}.whl"


def fake_dist(directory: Path, name: str, version: str) -> Path:
    """A pure-Python stand-in distribution (torch is gigabytes), enough for an installer's resolver."""
    dist_info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n".encode(),
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    return write_wheel(directory / f"{name}-{version}-py3-none-any.whl", files)


def fresh_venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    return path / "bin" / "python"


def run(*command: str | Path, ok: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, check=False, timeout=300
    )
    if ok:
        assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture
def pinned(tmp_path: Path) -> Path:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = write_wheel(wheels / WHEEL, members(metadata=metadata_text(requires=("torch>=2.0", "demo_dep"))))
    pin_torch_requirement(wheel, "2.14.1+cu130")
    assert check_wheel(wheel, **JOB) == []
    return wheel


def installed_requires(python: Path) -> list[str]:
    code = f"import importlib.metadata as m; print('\\n'.join(m.requires({NAME!r})))"
    return run(python, "-c", code).stdout.splitlines()


def test_pip_installs_the_pinned_wheel_and_reads_the_pin(tmp_path: Path, pinned: Path) -> None:
    python = fresh_venv(tmp_path / "venv")
    run(python, "-m", "pip", "install", "--no-deps", "--no-index", str(pinned))
    assert installed_requires(python) == ["torch==2.14.*", "demo_dep"]
    check = run(python, "-m", "pip", "check", ok=False)
    assert check.returncode == 1
    assert f"{NAME} {VERSION} requires torch, which is not installed." in check.stdout
    # pip rewrote RECORD on install; the files it hashed are the bytes the pinned wheel carried.
    site = next((tmp_path / "venv" / "lib").glob("python3*/site-packages"))
    init = (site / "factory_demo_ext" / "__init__.py").read_bytes()
    record = next(site.glob("factory_demo_ext-*.dist-info")).joinpath("RECORD").read_text()
    assert f"factory_demo_ext/__init__.py,{record_hash(init)},{len(init)}" in record


def test_the_pin_refuses_a_wrong_torch_at_install_time(tmp_path: Path, pinned: Path) -> None:
    index = pinned.parent
    fake_dist(index, "demo_dep", "1.0")
    fake_dist(index, "torch", "2.13.0")
    python = fresh_venv(tmp_path / "venv")
    pip = (python, "-m", "pip", "install", "--no-index", "--find-links", str(index))
    refused = run(*pip, f"{NAME}=={VERSION}", "torch==2.13.0", ok=False)
    assert refused.returncode != 0
    assert "torch==2.14.*" in refused.stdout + refused.stderr

    fake_dist(index, "torch", "2.14.1")
    run(*pip, f"{NAME}=={VERSION}")
    assert run(python, "-c", "import torch; print(torch.__version__)").stdout.strip() == "2.14.1"


def test_uv_installs_the_pinned_wheel(tmp_path: Path, pinned: Path) -> None:
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    assert Path(uv).exists(), "uv is a test dependency"
    target = tmp_path / "uv-venv"
    run(uv, "venv", "--python", sys.executable, str(target))
    run(uv, "pip", "install", "--offline", "--no-deps", "--python", target / "bin" / "python", str(pinned))
    assert installed_requires(target / "bin" / "python") == ["torch==2.14.*", "demo_dep"]
