"""factory/'s import graph has no cycle of any kind: module by module, counting an import inside a function or
under TYPE_CHECKING as the arrow it is (a deferred import hides a cycle from Python, not from the design).
The layers and who may import what are import-linter's contracts ([tool.importlinter] in pyproject.toml,
checked by `make lint`); this reads the same graph (grimp, which import-linter is built on) for cycles
between any two modules, a package and its own modules included."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path

import grimp
import pytest


def import_graph(package: str) -> dict[str, set[str]]:
    """Each module of `package` -> the modules of `package` it imports, wherever the import statement is."""
    graph = grimp.build_graph(package, cache_dir=None, exclude_type_checking_imports=False)
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, without recursion), each sorted,
    in sorted order; a module that imports itself is one too."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for succ in edges:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph.get(succ, ())))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph.get(node, ()):
                        found.append(sorted(component))
    return sorted(found)


def test_no_module_of_the_factory_is_part_of_an_import_cycle() -> None:
    graph = import_graph("factory")
    assert len(graph) > 100  # the whole package was read
    found = cycles(graph)
    shown = ["{" + ", ".join(c) + "}" for c in found]
    # move what they share down; deferring an import hides a cycle, and is seen here all the same
    assert not found, "modules that import each other, in a circle:\n" + "\n".join(shown)


def write_package(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


@pytest.mark.parametrize(
    ("how", "importer"),
    [
        ("at the top", "from cyclepkg import a\n"),
        ("in a function", "def f():\n    from cyclepkg import a\n    return a\n"),
        (
            "under TYPE_CHECKING",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cyclepkg import a\n",
        ),
    ],
)
def test_a_cycle_is_found_however_its_import_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, importer: str
) -> None:
    write_package(
        tmp_path,
        {
            "cyclepkg/__init__.py": "",
            "cyclepkg/a.py": "from cyclepkg import b\n",
            "cyclepkg/b.py": importer,
            "cyclepkg/c.py": "from cyclepkg import a\n",  # imports the cycle, is no part of it
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cycles(import_graph("cyclepkg")) == [["cyclepkg.a", "cyclepkg.b"]], how


def test_a_package_and_its_own_module_make_a_cycle_too() -> None:
    graph = {"p": {"p.m"}, "p.m": {"p"}, "q": {"p"}}
    assert cycles(graph) == [["p", "p.m"]]
    assert cycles({"p": {"p.m"}, "p.m": set()}) == []
    assert cycles({"p": {"p"}}) == [["p"]]
