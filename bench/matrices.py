"""The demo and memext matrices of the benchmarks and the integration tests, from their one fixture file each.

`examples/demo.yaml` (the project's demo extension) and `tests/fixtures/memext.yaml` (the memext fixture) are
the matrices; a bench or a test changes what it needs (`matrix_text(DEMO, matrix={"python": [...]})`) and
writes the rest as the fixture has it, so a change to the recipe or the build is made in one place.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "demo.yaml"
MEMEXT = ROOT / "tests" / "fixtures" / "memext.yaml"


def _yaml() -> YAML:
    yaml = YAML()  # round-trip: the fixture's order, quotes and flow style are kept
    yaml.preserve_quotes = True
    yaml.width = 4096  # a long path stays on its line
    return yaml


def matrix_text(
    fixture: Path,
    *,
    source: Path | None = None,
    absolute_source: bool = True,
    **sections: Mapping[str, Any] | None,
) -> str:
    """The fixture's matrix with the keys each of `sections` gives set (a key given None is left out) and a
    section given None left out. Its source is `source` when given, else the fixture's (relative to the
    fixture) made absolute unless `absolute_source` is false. Keys a fixture lacks come after its own, in the
    order given."""
    yaml = _yaml()
    data = yaml.load(fixture.read_text())
    package = data["package"]
    if source is not None or absolute_source:
        path = source if source is not None else (fixture.parent / package["source"]["path"]).resolve()
        package["source"] = {"path": str(path)}
        package.ca.items.pop("source", None)  # "relative to this file" no more
    for name, changes in sections.items():
        if changes is None:
            data.pop(name, None)
            continue
        section = data.setdefault(name, {})
        for key, value in changes.items():
            if value is None:
                section.pop(key, None)
            else:
                section[key] = value
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


def write_matrix(
    fixture: Path,
    dest: Path,
    *,
    source: Path | None = None,
    absolute_source: bool = True,
    **sections: Mapping[str, Any] | None,
) -> Path:
    """`matrix_text` written to `dest`; `dest`."""
    dest.write_text(matrix_text(fixture, source=source, absolute_source=absolute_source, **sections))
    return dest
