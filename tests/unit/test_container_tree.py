"""The tree mounted into build containers (`factory/container`) needs nothing but the standard library and
itself: the container's Python has nothing else, and no host module may ride along."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

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


def test_the_launcher_runs_the_module_the_wrappers_are_known_by() -> None:
    launcher = CONTAINER_DIR / "nvcc"
    assert os.access(launcher, os.X_OK)
    assert f"python3 -m {procs.WRAPPER_MODULE} " in launcher.read_text()
    assert (CONTAINER_DIR / f"{procs.WRAPPER_MODULE.rsplit('.', 1)[1]}.py").is_file()
