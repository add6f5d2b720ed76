"""The tree mounted into build containers (`factory/container`) needs nothing but the standard library and
itself: the container's Python has nothing else, and no host module may ride along."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from factory.container import CONTAINER_DIR, procs

MODULES = sorted(CONTAINER_DIR.glob("*.py"))


def imports(path: Path) -> list[tuple[int, int, str]]:
    """Every import of a module, wherever it is (in a function, under a condition): (line, level, name),
    with `from . import a, b` as one entry per name."""
    found: list[tuple[int, int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, 0, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level and node.module is None:
                found.extend((node.lineno, node.level, alias.name) for alias in node.names)
            else:
                found.append((node.lineno, node.level, node.module or ""))
    return found


def test_the_tree_imports_only_the_standard_library_and_itself() -> None:
    own = {p.stem for p in MODULES}
    wrong = []
    for path in MODULES:
        for line, level, name in imports(path):
            top = name.split(".")[0]
            if level == 0 and top not in sys.stdlib_module_names:
                wrong.append(f"{path.name}:{line}: {name} is not in the standard library")
            elif level > 1:
                wrong.append(f"{path.name}:{line}: {'.' * level}{name} reaches out of the tree")
            elif level == 1 and top not in own:
                wrong.append(f"{path.name}:{line}: .{name} is no module of the tree")
    assert not wrong
    assert len(MODULES) > 5 and not [
        p for p in CONTAINER_DIR.iterdir() if p.is_dir() and p.name != "__pycache__"
    ]


def test_every_module_of_the_tree_imports_in_a_python_without_site_packages(tmp_path: Path) -> None:
    # as in a build container: the tree under IMPORT_ROOT/factory/container, `factory` no package of its own,
    # and nothing installed (-S: no site-packages, -P: not the working directory)
    root = tmp_path / "opt"
    (root / "factory").mkdir(parents=True)
    (root / "factory" / "container").symlink_to(CONTAINER_DIR)
    names = [f"factory.container.{p.stem}" for p in MODULES if p.stem != "__init__"]
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "assert 'factory.memory' not in sys.modules and not any(m.startswith('factory.') and "
        "not m.startswith('factory.container') for m in sys.modules)\n"
    )
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-S", "-P", "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


# A builder image's python3 runs the tree: Ubuntu 22.04's 3.10 under NVIDIA's devel images is the oldest.
OLDEST = (3, 10)
# What the standard library gained after OLDEST and the tree must not use
NEWER_NAMES = {"Self", "StrEnum", "tomllib", "TaskGroup", "ExceptionGroup", "LiteralString", "Never", "UTC"}


def test_the_tree_is_written_for_the_oldest_python_a_builder_image_runs() -> None:
    wrong = []
    for path in MODULES:
        tree = ast.parse(path.read_text(), filename=str(path), feature_version=OLDEST)
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import | ast.ImportFrom) else []
            if isinstance(node, ast.Attribute):
                names = [node.attr]
            wrong += [f"{path.name}:{node.lineno}: {n}" for n in names if n.split(".")[0] in NEWER_NAMES]
    assert not wrong


def oldest_python() -> str | None:
    """A Python OLDEST that runs (pyenv's shims answer for versions they do not select), or None."""
    name = "python{}.{}".format(*OLDEST)
    pyenv = sorted(Path.home().glob(f".pyenv/versions/{OLDEST[0]}.{OLDEST[1]}.*/bin/{name}"))
    for candidate in [shutil.which(name), *map(str, pyenv)]:
        if candidate and subprocess.run([candidate, "-c", ""], capture_output=True).returncode == 0:
            return candidate
    return None


def test_every_module_imports_in_the_oldest_python(tmp_path: Path) -> None:
    oldest = oldest_python()
    if oldest is None:
        pytest.skip("no python{}.{} on this host".format(*OLDEST))
    root = tmp_path / "opt"
    (root / "factory").mkdir(parents=True)
    (root / "factory" / "container").symlink_to(CONTAINER_DIR)
    names = [f"factory.container.{p.stem}" for p in MODULES if p.stem != "__init__"]
    code = f"import importlib\nfor name in {names!r}:\n    importlib.import_module(name)\n"
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(root)}
    out = subprocess.run([oldest, "-S", "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr


def test_the_launcher_runs_the_module_the_wrappers_are_known_by() -> None:
    launcher = CONTAINER_DIR / "nvcc"
    assert os.access(launcher, os.X_OK)
    assert f"python3 -m {procs.WRAPPER_MODULE} " in launcher.read_text()
    assert (CONTAINER_DIR / f"{procs.WRAPPER_MODULE.rsplit('.', 1)[1]}.py").is_file()
