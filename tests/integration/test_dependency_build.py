"""A wheel that depends on another factory-built wheel (issue 42 §2), through the real factory: dockerd, the
forky builder image, real nvcc, torch 2.14, uv in the install check, pip in a fresh container.

Two fixtures for Python 3.13: the dependency (tests/fixtures/dependency, given a recipe here; its wheel needs
glibc 2.36, above manylinux_2_28, as one built on forky does) and a dependent
(tests/fixtures/dependent) that imports it at run time while its PKG-INFO forgets to say so
(`recipe.extra_requires` adds it) and builds its CUDA module only under its own env switch (the recipe's env).
One `factory build --publish` is given both matrices, the dependent's first: the run builds and publishes
the dependency first, the dependent's install check takes that very wheel (pinned to it, with the tags the
check's forky container accepts, not manylinux_2_28's), and pip installs both beside torch in a fresh
container of the builder's base (forky, glibc 2.43), where both import.

The floor variant (issue 42's "done when") is the same pair with `build.glibc: "2.36"`: the bookworm-cpython
builder makes both wheels at or below manylinux_2_36, its check reads the factory's wheels with 2_36's tags,
and pip installs both beside torch in a fresh factory-base:bookworm-cpython (Debian 12's glibc, the oldest
base this machine makes for 3.13). Gated like test_floor_builder_image.py (its image takes minutes to make):
`make test-floor-builder` runs it.

One run of two small jobs (five small compiles, two torch installs of the checks) and one pip install of
torch: 4-7 minutes on 2 busy cores with the image and the cp313 wheelhouse there.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import require
from packaging.utils import parse_wheel_filename
from test_build import FACTORY, ROOT
from test_floor_builder_image import FLOOR_BUILDER

from factory.build import engine
from factory.core.tags import parse_manylinux

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@dataclass(frozen=True)
class Variant:
    image: str  # the builder the plan picks
    fresh: str  # the builder's base: its glibc and Python 3.13, no toolkit, no compiler
    glibc: str  # the builder's glibc: the check's tags, and the wheels' ceiling
    floor: str | None = None  # build.glibc, where the matrix declares one


FORKY = Variant(image="factory-builder:cu13.0-forky-pypi", fresh="factory-base:forky", glibc="2.43")
FLOOR = Variant(
    image="factory-builder:cu13.0-bookworm-cpython-pypi",
    fresh="factory-base:bookworm-cpython",
    glibc="2.36",
    floor="2.36",
)
LABEL = "cu13.0.torch2.14.abi1.sm80"
MATRIX = """\
    matrix:
      cuda: ["13.0"]
      torch: ["2.14"]
      python: ["3.13"]
      cxx11_abi: [true]
      arch: ["8.0"]
    build:
      flavor: pypi
      memory: 6GiB
      cpus: 2
      torch_index: {{"13.0": default}}
    {floor}
    publish:
      to: {index}
"""


def write(path: Path, package: str, index: Path, variant: Variant) -> Path:
    floor = "" if variant.floor is None else f'  glibc: "{variant.floor}"'
    path.write_text(textwrap.dedent(package) + textwrap.dedent(MATRIX.format(index=index, floor=floor)))
    return path


# One build per variant, shared by the tests; the floor variant's skip (by marker, never `require`) stays a
# skip under CI=true and skips its fixture with it.
@pytest.fixture(
    scope="module",
    params=[
        pytest.param(FORKY, id="forky"),
        pytest.param(FLOOR, id="bookworm", marks=FLOOR_BUILDER),
    ],
)
def pair_build(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    docker_client: Any,
    session_factory_home: Path,
) -> dict[str, Any]:
    variant: Variant = request.param
    make = "make floor-image" if variant.floor else "make images"
    require(engine.get_image(docker_client, variant.image) is not None, f"{variant.image} ({make})")
    require(engine.get_image(docker_client, variant.fresh) is not None, f"{variant.fresh} ({make})")
    tmp = tmp_path_factory.mktemp("dependency")
    index, out = tmp / "index", tmp / "wheels"
    dep = write(
        tmp / "dep.yaml",
        f"""\
        package:
          name: factory-dependency
          version: "0.1.0"
          source: {{path: {ROOT / "tests" / "fixtures" / "dependency"}}}
        recipe: {{name: dependency, import_name: factory_dependency}}
        """,
        index,
        variant,
    )
    app = write(
        tmp / "app.yaml",
        f"""\
        package:
          name: factory-dependent
          version: "0.1.0"
          source: {{path: {ROOT / "tests" / "fixtures" / "dependent"}}}
        recipe:
          name: dependent
          env: {{DEPENDENT_CUDA: "1"}}
          extra_requires: ["factory-dependency>=0.1"]
        """,
        index,
        variant,
    )
    proc = subprocess.run(
        [*FACTORY, "build", "--trust-paths", "--matrix", str(app), "--matrix", str(dep), "--output", str(out),
         "--publish"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "FACTORY_HOME": str(session_factory_home)},
    )  # fmt: skip
    reports = {}
    for name in ("factory-dependency", "factory-dependent"):
        path = out / name / "report.json"
        assert path.is_file(), proc.stderr[-3000:]
        (reports[name],) = json.loads(path.read_text())["jobs"]
    return {"proc": proc, "out": out, "index": index, "jobs": reports, "variant": variant}


def test_the_dependency_is_built_first_and_the_dependent_s_check_takes_its_wheel(
    pair_build: dict[str, Any],
) -> None:
    proc, jobs, variant = pair_build["proc"], pair_build["jobs"], pair_build["variant"]
    dep, app = jobs["factory-dependency"], jobs["factory-dependent"]
    assert dep["result"] == "ok", dep["reason"] + "\n" + "\n".join(dep["log_tail"])
    assert app["result"] == "ok", app["reason"] + "\n" + "\n".join(app["log_tail"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    # both wheels at or below the builder's glibc (the declared floor's, where there is one); the
    # dependency's needs glibc 2.36 (arc4random), above manylinux_2_28: the former host-side download target
    # would have left it out of the dependent's check (the dependent's is manylinux1, glibc 2.5)
    ceiling = tuple(int(p) for p in variant.glibc.split("."))
    glibcs = {}
    for job in (dep, app):
        parsed = [parse_manylinux(t.platform) for t in parse_wheel_filename(job["wheel"])[3]]
        assert parsed and all(g is not None and g.glibc <= ceiling for g in parsed), job["wheel"]
        glibcs[job["wheel"]] = min(g.glibc for g in parsed if g is not None)
    assert glibcs[dep["wheel"]] >= (2, 36), dep["wheel"]
    # the dependent's install check named it from this run (so it was built first), pinned to its version
    assert app["check_requirements"] == ["factory-dependency>=0.1"]
    log = Path(app["log"]).read_text(errors="replace")
    assert f"built in this run: {dep['wheel']}" in log
    # and imported it: the dependent's own import prints the dependency's version beside its own
    assert f"factory_dependent metadata version 0.1.0+{LABEL} beside factory_dependency 0.1.0+{LABEL}" in log
    # both published to the one index, on their variant's page
    for project in ("factory-dependency", "factory-dependent"):
        assert (pair_build["index"] / "simple" / app["variant_id"] / project / "index.html").is_file()


def test_pip_installs_both_beside_torch_in_a_fresh_container(
    pair_build: dict[str, Any], docker_client: Any, session_factory_home: Path
) -> None:
    jobs, out, variant = pair_build["jobs"], pair_build["out"], pair_build["variant"]
    dep, app = jobs["factory-dependency"], jobs["factory-dependent"]
    # torch, CUDA's wheels and six: the dependent's check wheelhouse has them all (its download took them)
    sha256 = hashlib.sha256((out / "factory-dependency" / dep["wheel"]).read_bytes()).hexdigest()
    made = {h: h / "inputs.json" for h in (session_factory_home / "wheelhouses").iterdir()}
    # (the wheelhouse cache is shared by sessions, and the dependency's build is reproducible: an earlier
    # session's wheelhouse of the same bytes is the same wheelhouse; the other variant's check, had its
    # dependency the same bytes, would have another wheelhouse of the same wheel, for its own tags)
    checks = {
        json.loads(inputs.read_text())["platform"]: h
        for h, inputs in made.items()
        if inputs.is_file() and json.loads(inputs.read_text()).get("wheels") == {dep["wheel"]: sha256}
    }
    # downloaded with the tags the check's container (the job's builder) accepts
    platform = f"manylinux_{variant.glibc.replace('.', '_')}_x86_64"
    assert platform in checks, checks
    check = checks[platform]
    assert (check / dep["wheel"]).is_file()
    script = (
        "python3.13 -m venv /tmp/v && /tmp/v/bin/pip install -q --no-index --find-links /deps "
        f"/w/factory-dependency/{dep['wheel']} /w/factory-dependent/{app['wheel']} "
        "&& /tmp/v/bin/python -c 'import torch, factory_dependent; print(torch.__version__)'"
    )
    output = docker_client.containers.run(
        variant.fresh,
        ["sh", "-c", script],
        volumes={
            str(out): {"bind": "/w", "mode": "ro"},
            str(check.resolve()): {"bind": "/deps", "mode": "ro"},
        },
        network_mode="none",
        remove=True,
    )
    lines = output.decode().strip().splitlines()
    assert (
        f"factory_dependent metadata version 0.1.0+{LABEL} beside factory_dependency 0.1.0+{LABEL}" in lines
    )
    assert lines[-1].startswith("2.14.1")
