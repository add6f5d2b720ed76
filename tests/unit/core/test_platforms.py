"""The platform table (factory.core.platforms) and the platform axis: facts, lookups, the matrix key, the job
field, and the rule that no other module spells a platform."""

from __future__ import annotations

import re
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from factory.build.images import compiler_links
from factory.build.runtimereqs import for_job, target_environment
from factory.build.wheelhouse import DEFAULT_PLATFORM as WHEELHOUSE_PLATFORM
from factory.core import platforms
from factory.core.errors import ConfigError
from factory.core.platforms import (
    BUILDABLE,
    DEFAULT_PLATFORM,
    PLATFORMS,
    build_problem,
    named,
    of_machine,
    of_tag,
)
from factory.core.variants import Variant
from factory.plan.plan import DroppedJob, Job, Plan, limited_api_plan, plan_matrix, stable_abi_plan
from factory.plan.torchindex import parse_torch_file
from factory.spec.config import load_matrix_file
from factory.wheel.checks import check_wheel

ROOT = Path(__file__).resolve().parents[3]
FACTORY = ROOT / "factory"
# The names a platform goes by (matrix and wheel tags, Debian and Docker); case-insensitive, so `AMD64` too.
SPELLINGS = re.compile(r"x86_64|aarch64|amd64|arm64", re.IGNORECASE)
AARCH64 = named("aarch64")


def spelled(text: str) -> list[tuple[int, str]]:
    """(line, text) of each line of a source that spells a platform."""
    return [(n, t.strip()) for n, t in enumerate(text.splitlines(), 1) if SPELLINGS.search(t)]


def test_no_module_but_the_platform_table_spells_a_platform() -> None:
    """Adding a platform is a row in factory/core/platforms.py: every other module (code, comments and
    docstrings
    alike, so that a grep finds one place) takes a `Platform` and reads its columns."""
    sources = [p for p in sorted(FACTORY.rglob("*.py")) if p != FACTORY / "core" / "platforms.py"]
    assert len(sources) > 60  # the whole package, container/, cli/ and memory/ included
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line}"
        for path in sources
        for n, line in spelled(path.read_text(encoding="utf-8"))
    ]
    assert found == [], "route these through factory.core.platforms:\n" + "\n".join(found)


def test_the_scan_sees_what_it_looks_for() -> None:
    # the rule above would pass vacuously if the pattern matched nothing: the table spells every name, and a
    # module writing one in any case, in code or in a comment, is caught at its line
    table = (FACTORY / "core" / "platforms.py").read_text(encoding="utf-8")
    for word in ("x86_64", "aarch64", "amd64", "arm64"):
        assert word in " ".join(line for _, line in spelled(table)), word
    module = 'import os\nTAG = "manylinux_2_28_" + os.uname().machine\n# not on AMD64\nARM = "linux/arm64"\n'
    assert [n for n, _ in spelled(module)] == [3, 4]


def test_the_x86_64_row() -> None:
    p = DEFAULT_PLATFORM
    assert p.name == "x86_64"
    assert p.wheel_tag == "linux_x86_64"
    assert p.wheelhouse_tag == "manylinux_2_28_x86_64"
    assert p.manylinux_tag((2, 34)) == "manylinux_2_34_x86_64"
    assert p.musllinux_tag((1, 2)) == "musllinux_1_2_x86_64"
    assert (p.docker, p.debian_arch, p.gnu_triplet) == ("linux/amd64", "amd64", "x86_64-linux-gnu")
    assert (p.elf_machine, p.auditwheel_arch) == (62, "x86_64")


def test_the_aarch64_row() -> None:
    p = AARCH64
    assert p.wheel_tag == "linux_aarch64"
    assert p.wheelhouse_tag == "manylinux_2_28_aarch64"  # torch's CUDA wheels for Arm
    assert (p.docker, p.debian_arch, p.gnu_triplet) == ("linux/arm64", "arm64", "aarch64-linux-gnu")
    assert (p.elf_machine, p.auditwheel_arch) == (183, "aarch64")


def test_the_table_is_consistent() -> None:
    names = [p.name for p in PLATFORMS]
    assert len(set(names)) == len(names) and tuple(names) == platforms.NAMES
    columns = ("docker", "debian_arch", "gnu_triplet", "elf_machine")
    for column in columns:
        values = [getattr(p, column) for p in PLATFORMS]
        assert len(set(values)) == len(values), column
    machines = [m for p in PLATFORMS for m in p.machines]
    assert len(set(machines)) == len(machines)
    for p in PLATFORMS:
        assert p.name in p.machines and p.gnu_triplet.startswith(p.name + "-")
        assert p.docker == f"linux/{p.debian_arch}"
    assert BUILDABLE == PLATFORMS


def test_lookups() -> None:
    assert named("aarch64") is AARCH64 and platforms.by_name("arm") is None
    with pytest.raises(ConfigError, match=r"unknown platform 'arm': expected one of x86_64, aarch64"):
        named("arm")
    assert of_machine("x86_64") is DEFAULT_PLATFORM and of_machine("AMD64") is DEFAULT_PLATFORM
    assert of_machine("aarch64") is AARCH64 and of_machine("arm64") is AARCH64
    assert of_machine("riscv64") is None and of_machine("") is None
    assert platforms.host_platform() in (*PLATFORMS, None)


@pytest.mark.parametrize(
    ("tag", "platform", "glibc"),
    [
        ("linux_x86_64", "x86_64", None),
        ("manylinux_2_28_x86_64", "x86_64", (2, 28)),
        ("manylinux2014_x86_64", "x86_64", (2, 17)),
        ("manylinux1_x86_64", "x86_64", (2, 5)),
        ("musllinux_1_2_x86_64", "x86_64", None),
        ("manylinux_2_28_aarch64", "aarch64", (2, 28)),
        ("manylinux2014_aarch64", "aarch64", (2, 17)),
        ("linux_aarch64", "aarch64", None),
        ("win_amd64", None, None),
        ("macosx_11_0_arm64", None, None),
        ("any", None, None),
        ("manylinux_2_28_ppc64le", None, None),
    ],
)
def test_tags(tag: str, platform: str | None, glibc: tuple[int, int] | None) -> None:
    found = of_tag(tag)
    assert (found.name if found else None) == platform
    for p in PLATFORMS:
        assert p.manylinux_glibc(tag) == (glibc if p.name == platform else None)


def test_build_problem() -> None:
    assert build_problem(DEFAULT_PLATFORM) is None
    assert build_problem(AARCH64) is None
    riscv = replace(AARCH64, name="riscv64", machines=("riscv64",))
    assert build_problem(riscv) == "riscv64 builds are not supported yet (the factory builds x86_64, aarch64)"


def test_x86_64_names_are_as_before() -> None:
    """What the literals the table replaced said: the wheelhouse cache key's platform (its hash), the marker
    environment, setuptools' compiler name, the wheel check's default."""
    assert WHEELHOUSE_PLATFORM == "manylinux_2_28_x86_64"
    assert target_environment("3.11")["platform_machine"] == "x86_64"
    assert compiler_links("12")["x86_64-linux-gnu-g++"] == "/usr/bin/g++-12"
    assert check_wheel.__kwdefaults__["machine"] == "x86_64"


def test_runtime_requirements_follow_the_platform() -> None:
    declared = ["numpy", "pynvml; platform_machine == 'x86_64'", "triton; platform_machine == 'aarch64'"]
    assert for_job(declared, package="p", python="3.11").requirements == ("numpy", "pynvml")
    mine = for_job(declared, package="p", python="3.11", platform=AARCH64)
    assert mine.requirements == ("numpy", "triton")


def test_a_torch_file_runs_on_its_platform() -> None:
    def torch(tag: str):  # type: ignore[no-untyped-def]
        name = f"torch-2.10.0+cu130-cp311-cp311-{tag}.whl"
        found = parse_torch_file(name, f"https://i/{name}", None, "https://i/")
        assert found is not None
        return found

    assert torch("manylinux_2_28_x86_64").runs_on() and not torch("manylinux_2_28_x86_64").runs_on(AARCH64)
    assert torch("manylinux_2_28_aarch64").runs_on(AARCH64) and not torch("manylinux_2_28_aarch64").runs_on()
    assert not torch("linux_x86_64").runs_on()  # promises no glibc: not what the builders install
    assert not torch("win_amd64").runs_on()


# ---------------------------------------------------------------------------------------------- the axis

HEAD = 'package: {name: flash-attn, version: "2.8.3"}\n'
AXES = """\
matrix:
  cuda: ["13.0"]
  torch: ["2.10"]
  python: ["3.11", "3.12"]
  cxx11_abi: [true]
  arch: ["9.0"]
"""


def load(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(text))
    return load_matrix_file(path)


def test_a_matrix_without_platform_plans_what_it_did(tmp_path: Path) -> None:
    before = plan_matrix(load(tmp_path, HEAD + AXES))
    assert [j.id for j in before.jobs] == [
        "cu130-torch2.10-abi1-sm90-py311",
        "cu130-torch2.10-abi1-sm90-py312",
    ]
    assert all(j.platform is DEFAULT_PLATFORM for j in before.jobs)
    assert all("platform" not in j.to_json() for j in before.jobs)  # `factory matrix --json` as before
    named_axis = plan_matrix(load(tmp_path, HEAD + AXES + "  platform: [x86_64]\n"))
    assert [j.to_json() for j in named_axis.jobs] == [j.to_json() for j in before.jobs]


def test_platform_in_exclude_and_include(tmp_path: Path) -> None:
    text = HEAD + AXES + '  exclude:\n    - {python: "3.12", platform: x86_64}\n'
    assert [j.python for j in plan_matrix(load(tmp_path, text)).jobs] == ["3.11"]
    text = HEAD + AXES + '  include:\n    - {python: "3.12", platform: x86_64, runner: big}\n'
    jobs = plan_matrix(load(tmp_path, text)).jobs
    assert [j.to_json().get("runner") for j in jobs] == [None, "big"]
    assert all(j.platform is DEFAULT_PLATFORM and "platform" not in j.extra for j in jobs)


def test_aarch64_loads(tmp_path: Path) -> None:
    mf = load(tmp_path, HEAD + AXES + "  platform: [x86_64, aarch64]\n")
    assert mf.matrix.axes["platform"] == ("x86_64", "aarch64")


def job(python: str, platform: platforms.Platform = DEFAULT_PLATFORM, torch: str = "2.10") -> Job:
    variant = Variant(package="p", version="1.0", cuda="13.0", torch=torch, cxx11_abi=True, archs=("9.0",))
    return Job(variant=variant, python=python, platform=platform)


def test_another_platform_is_named_by_the_job_not_the_variant() -> None:
    x86, arm = job("3.11"), job("3.11", AARCH64)
    assert x86.variant.id == arm.variant.id  # one variant page lists both; the wheel's tag tells them apart
    assert (x86.id, arm.id) == ("cu130-torch2.10-abi1-sm90-py311", "cu130-torch2.10-abi1-sm90-py311-aarch64")
    assert arm.to_json()["platform"] == "aarch64" and "platform" not in x86.to_json()
    row = {"cuda": "13.0", "torch": "2.10", "python": "3.11", "cxx11_abi": True, "arch": "9.0"}
    assert DroppedJob(values={**row, "platform": "aarch64"}, reason="r").id == arm.id
    assert DroppedJob(values={**row, "platform": "x86_64"}, reason="r").id == x86.id


def test_one_abi3_and_one_stable_abi_wheel_per_platform() -> None:
    plan = Plan(jobs=(job("3.11"), job("3.12"), job("3.11", AARCH64), job("3.12", AARCH64)))
    abi3 = limited_api_plan(plan, "cp311")
    assert [(j.id, j.covers) for j in abi3.jobs] == [
        ("cu130-torch2.10-abi1-sm90-py311", ("3.12",)),
        ("cu130-torch2.10-abi1-sm90-py311-aarch64", ("3.12",)),
    ]
    plan = Plan(jobs=(job("3.11", torch="2.10"), job("3.11", torch="2.11"), job("3.11", AARCH64, "2.11")))
    stable = stable_abi_plan(plan, "2.10")
    assert [(j.platform.name, j.torches) for j in stable.jobs] == [
        ("x86_64", ("2.10", "2.11")),
        ("aarch64", ("2.11",)),
    ]
    assert replace(stable.jobs[1], platform=DEFAULT_PLATFORM).id != stable.jobs[1].id


def test_auditwheel_repairs_another_platform_to_auto() -> None:
    """auditwheel's --plat lists the host machine's tags only: an aarch64 wheel on x86_64 is "auto"."""
    from factory.wheel.platform_tag import repair_plat

    assert repair_plat("manylinux_2_34_x86_64", DEFAULT_PLATFORM) == "manylinux_2_34_x86_64"
    assert repair_plat("manylinux_2_34_aarch64", DEFAULT_PLATFORM) == "auto"
    assert repair_plat("manylinux_2_34_aarch64", AARCH64) == "manylinux_2_34_aarch64"
    assert repair_plat("manylinux_2_34_aarch64", None) == "auto"
