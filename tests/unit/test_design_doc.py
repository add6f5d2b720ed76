"""docs/DESIGN.md's claims about the tree that can be checked: a section per package of factory/ that names
every module of it, no module named that is not there, each package's import rule as its `__init__` says it,
the picture of the layers as the import contracts declare them; and no file the docs name gone."""

from __future__ import annotations

import ast
import importlib
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "factory"
DESIGN = ROOT / "docs" / "DESIGN.md"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# factory/'s packages: each directory with an __init__.py (factory/data is package data, not code)
PACKAGES = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
# files the docs name that are no part of this repository
FOREIGN = {"setup.py", "torch/version.py", "torch/utils/cpp_extension.py"}

CODE = re.compile(r"`([^`\n]+)`")


def sections(text: str, level: str) -> dict[str, str]:
    """The sections of `text` under headings of `level` ("## ", "### "), by heading, each up to the next
    heading of the same level or above."""
    out: dict[str, str] = {}
    heading: str | None = None
    lines: list[str] = []
    stop = tuple("#" * n + " " for n in range(1, len(level)))
    for line in text.splitlines():
        if line.startswith(level) or line.startswith(stop):
            if heading is not None:
                out[heading] = "\n".join(lines)
            heading = line[len(level) :] if line.startswith(level) else None
            lines = []
        elif heading is not None:
            lines.append(line)
    if heading is not None:
        out[heading] = "\n".join(lines)
    return out


def design() -> str:
    return DESIGN.read_text(encoding="utf-8")


def modules_section() -> str:
    return sections(design(), "## ")["Modules"]


def package_sections() -> dict[str, str]:
    """DESIGN.md's package sections (headed "### `pkg/`: ..."), by package."""
    out = {}
    for heading, body in sections(modules_section(), "### ").items():
        m = re.match(r"`([a-z_]+)/`", heading)
        assert m, f"a section under Modules that names no package: {heading!r}"
        assert m.group(1) not in out, f"two sections for {m.group(1)}/"
        out[m.group(1)] = body
    return out


def row_modules(body: str) -> list[str]:
    """The modules a section's table rows are about: the `pkg/name.py` names in each row's first cell."""
    names = []
    for line in body.splitlines():
        cells = line.split(" | ")
        if line.startswith("| `") and len(cells) > 1:
            names += [n for n in CODE.findall(cells[0]) if n.endswith(".py")]
    return names


def modules() -> dict[str, list[str]]:
    """factory/'s modules by package, as `pkg/name.py` (no __init__ or __main__)."""
    return {
        pkg: sorted(
            f"{pkg}/{p.name}"
            for p in (PACKAGE / pkg).glob("*.py")
            if p.name not in ("__init__.py", "__main__.py")
        )
        for pkg in PACKAGES
    }


def test_factory_has_packages_and_the_doc_a_section_for_each() -> None:
    assert {"core", "build", "container", "cli"} <= set(PACKAGES)  # the glob found the tree
    assert sorted(package_sections()) == PACKAGES


def test_every_module_has_its_row_in_its_packages_section() -> None:
    found = package_sections()
    missing = [
        m for pkg, names in modules().items() for m in names if m not in row_modules(found.get(pkg, ""))
    ]
    assert missing == [], "modules without a row in their package's section of docs/DESIGN.md"


def test_every_row_is_a_module_of_its_package() -> None:
    wrong = [
        f"{pkg}: {name}"
        for pkg, body in package_sections().items()
        for name in row_modules(body)
        if not name.startswith(f"{pkg}/") or not (PACKAGE / name).is_file()
    ]
    assert wrong == [], "rows of docs/DESIGN.md naming no module of their section's package"


def named_paths(text: str) -> set[str]:
    """The repository's Python files a text names in code spans: `factory/...`, `pkg/...` (a package of
    factory/), `tests/...`, `bench/...`, `scripts/...`; globs too (`factory/cli/*.py`)."""
    out = set()
    for span in CODE.findall(text):
        span = span.strip()
        if not re.fullmatch(r"[\w./*-]+\.py", span) or "/" not in span or span in FOREIGN:
            continue
        top = span.split("/")[0]
        if top in PACKAGES:
            out.add(f"factory/{span}")
        elif top in ("factory", "tests", "bench", "scripts"):
            out.add(span)
    return out


def test_every_python_file_the_docs_name_exists() -> None:
    gone = [
        f"{doc.relative_to(ROOT)}: {path}"
        for doc in DOCS
        for path in sorted(named_paths(doc.read_text(encoding="utf-8")))
        if not any(ROOT.glob(path))
    ]
    assert gone == []


def test_design_names_modules_by_their_package() -> None:
    """A bare `name.py` says nothing of where it is (six modules share a name with another), and outlives a
    move unnoticed: DESIGN.md names a module with its package; only its section on bench/ names bench's
    modules bare, and those must be there."""
    doc = sections(design(), "## ")
    bare = []
    for heading, body in doc.items():
        for span in CODE.findall(body):
            if not re.fullmatch(r"\w+\.py", span) or span in FOREIGN:
                continue
            if not (heading.startswith("Benchmarks") and (ROOT / "bench" / span).is_file()):
                bare.append(f"{heading}: {span}")
    assert bare == []


def test_dotted_names_in_design_resolve() -> None:
    """`factory.pkg.module.attr` in DESIGN.md: the module imports and has the attribute."""
    unresolved = []
    for span in sorted(set(CODE.findall(design()))):
        if not re.fullmatch(r"factory(\.\w+)+", span):
            continue
        parts = span.split(".")
        for cut in range(len(parts), 1, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            try:
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                unresolved.append(span)
            break
        else:
            unresolved.append(span)
    assert unresolved == []


def may_import(text: str) -> tuple[bool, list[str]] | None:
    """What a text says a package may import: the code spans of its "may import" clause (up to a ";" or the
    sentence's end), and whether it says "every package but" them; None when it says nothing of it."""
    flat = " ".join(text.split())
    m = re.search(r"may import (.*?)(?:;|\.(?:\s|$)|$)", flat)
    if m is None:
        return None
    return "every package but" in m.group(1), sorted(CODE.findall(m.group(1)))


def docstring(pkg: str) -> str:
    return ast.get_docstring(ast.parse((PACKAGE / pkg / "__init__.py").read_text(encoding="utf-8"))) or ""


@pytest.mark.parametrize("pkg", PACKAGES)
def test_each_section_says_what_its_package_may_import_as_its_init_does(pkg: str) -> None:
    intro = package_sections()[pkg].split("\n| ")[0]
    said = may_import(intro)
    assert said is not None, f"docs/DESIGN.md's {pkg}/ section says nothing of what it may import"
    rule = may_import(docstring(pkg))
    if rule is not None:  # the package's own docstring is the rule; the doc says the same
        assert said == rule


def layers_picture() -> list[set[str]]:
    """The layers of DESIGN.md's picture, top first: each row's packages ("build | consume")."""
    m = re.search(r"```text\n(.*?)```", modules_section(), re.S)
    assert m, "the picture of the layers"
    rows = [re.split(r"\s{2,}", line.strip())[0] for line in m.group(1).splitlines() if line.strip()]
    return [{name.strip() for name in row.split("|")} for row in rows]


def test_the_layers_picture_has_every_package_once() -> None:
    names = [name for row in layers_picture() for name in row]
    assert sorted(names) == PACKAGES


def test_the_layers_picture_is_the_import_contracts_order() -> None:
    """Where pyproject.toml declares factory's layers to import-linter, the picture draws those layers."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config.get("tool", {}).get("importlinter", {}).get("contracts", [])
    declared = [
        c["layers"] for c in contracts if c.get("type") == "layers" and c.get("containers") == ["factory"]
    ]
    if not declared:
        pytest.skip("pyproject.toml declares no layers contract for factory")
    layers = [{name.strip() for name in re.split(r"[|:]", layer)} for layer in declared[0]]
    assert [row for row in layers if row != {"__main__"}] == layers_picture()
