"""The glibc floor (build.glibc): parsed, resolved per torch, met or refused at plan time naming a flavor
that can, shown by `factory matrix`, and enforced by the wheel check."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from factory.core.errors import ConfigError, ImageError
from factory.core.platforms import named
from factory.plan import glibcfloor
from factory.plan.plan import plan_matrix
from factory.spec import toolchains
from factory.spec.compat import CompatData
from factory.spec.config import load_matrix_file, parse_glibc_floor
from factory.spec.options import BuildOptions
from factory.wheel.checks import floor_problems


def matrix(tmp_path: Path, build: str, *, pythons: str = '"3.11", "3.13"', cuda: str = "13.0") -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            package: {{name: demo-ext, version: "0.1.0"}}
            matrix:
              cuda: ["{cuda}"]
              torch: ["2.14"]
              python: [{pythons}]
              cxx11_abi: [true]
              arch: ["8.0"]
            build:
            """
        )
        + textwrap.indent(build, "  ")
    )
    return path


@pytest.mark.parametrize(
    ("value", "floor"),
    [("2.28", "2.28"), (" 2.36 ", "2.36"), ("2.5", "2.5"), ("torch", "torch"), ("builder", None)],
)
def test_parse_glibc_floor(value: str, floor: str | None) -> None:
    assert parse_glibc_floor(value) == floor


@pytest.mark.parametrize("value", ["2.3", "2.4", "3.1", "2", "2.28.1", "two", "", "Torch", "1.9"])
def test_a_bad_floor_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match=r"is not a glibc version like 2\.28"):
        parse_glibc_floor(value)


def test_each_flavor_knows_its_builders_glibc() -> None:
    def glibc(flavor: str, python: str = "3.13", cuda: str = "13.0", base: str | None = None) -> str | None:
        return toolchains.builder_glibc(cuda=cuda, python=python, flavor=flavor, base_image=base)

    assert glibc("pypi", "3.11") == "2.36"  # bookworm
    assert glibc("pypi", "3.13") == glibc("pypi", "3.14") == "2.43"  # forky
    assert glibc("pypi", "3.13", base="factory-base:bookworm") == "2.36"
    assert glibc("pypi", "3.13", base="registry.example/mine:1") is None  # the user's own base
    assert glibc("debian", "3.13", cuda="12.8") == "2.41"  # trixie's own toolkit
    assert glibc("devel") == "2.35"  # nvidia/cuda:*-devel-ubuntu22.04
    assert glibc("devel", base="factory-standin:cuda13.0-devel") == "2.36"  # made on bookworm
    assert glibc("devel", base="factory-base:bookworm") == "2.35"  # a factory base is not devel's
    assert glibc("manylinux") == glibc("manylinux", "3.11", "12.8") == "2.28"
    assert glibc("manylinux", base="registry.example/mine:1") is None
    with pytest.raises(ImageError):
        glibc("pypi", cuda="12.8")  # no PyPI toolkit before CUDA 13
    with pytest.raises(ImageError):
        glibc("pypi", "3.9")  # no suite ships it


def test_the_flavors_meeting_a_floor_oldest_first() -> None:
    assert glibcfloor.flavors_meeting("2.28", cuda="13.0", python="3.13") == [("manylinux", "2.28")]
    assert glibcfloor.flavors_meeting("2.36", cuda="13.0", python="3.11") == [
        ("manylinux", "2.28"),
        ("devel", "2.35"),
        ("pypi", "2.36"),
    ]
    assert glibcfloor.flavors_meeting("2.27", cuda="13.0", python="3.13") == []


def test_torch_floor_comes_from_the_compatibility_data() -> None:
    compat = CompatData.load()
    assert compat.torch_glibc("2.14") == compat.torch_glibc("2.7.1") == "2.28"
    assert compat.torch_glibc("2.5") is None  # manylinux1-tagged, built on 2.17: not claimed
    torch = BuildOptions(glibc="torch")
    assert glibcfloor.job_floor(torch, compat, torch="2.14") == "2.28"
    assert glibcfloor.job_floor(BuildOptions(glibc="2.31"), compat, torch="2.14") == "2.31"
    assert glibcfloor.job_floor(BuildOptions(), compat, torch="2.14") is None
    with pytest.raises(ConfigError, match=r"knows no glibc floor for torch 2\.5 .*glibc: \"2\.28\""):
        glibcfloor.job_floor(torch, compat, torch="2.5")
    overridden = CompatData.load({"torch": {"2.5": {"glibc": "2.17"}}})
    assert glibcfloor.job_floor(torch, overridden, torch="2.5") == "2.17"


def test_a_builder_above_the_floor_is_refused_naming_one_that_can() -> None:
    pypi = BuildOptions(flavor="pypi")
    assert glibcfloor.floor_problem(pypi, None, cuda="13.0", python="3.13") is None
    assert glibcfloor.floor_problem(pypi, "2.43", cuda="13.0", python="3.13") is None
    assert glibcfloor.floor_problem(pypi, "2.36", cuda="13.0", python="3.11") is None
    # below every builder made without a registry: the closest is the one named, and the value it meets
    assert glibcfloor.floor_problem(pypi, "2.28", cuda="13.0", python="3.13") == (
        "build.glibc 2.28: flavor pypi compiles CUDA 13.0 / Python 3.13 in "
        "factory-builder:cu13.0-bookworm-cpython-pypi (glibc 2.36), whose wheels may need glibc up to 2.36; "
        "flavor manylinux (glibc 2.28) can (its base comes from a registry: `docker load` it where none is "
        "reachable); without a registry the oldest is flavor pypi "
        '(factory-builder:cu13.0-bookworm-cpython-pypi, glibc 2.36): build.glibc "2.36"'
    )
    # forky's Python 3.13 is above 2.36, the source-built one on bookworm meets it: no problem
    assert glibcfloor.floor_problem(pypi, "2.36", cuda="13.0", python="3.13") is None
    problem = glibcfloor.floor_problem(pypi, "2.35", cuda="13.0", python="3.13")
    assert problem is not None and problem.endswith(
        "flavor manylinux (glibc 2.28) or devel (glibc 2.35) can (its base comes from a registry: "
        "`docker load` it where none is reachable); without a registry the oldest is flavor pypi "
        '(factory-builder:cu13.0-bookworm-cpython-pypi, glibc 2.36): build.glibc "2.36"'
    )
    # a builder named above the floor is told of the pypi flavor's own builder that meets it
    forky_base = BuildOptions(flavor="pypi", base_image="factory-base:forky")
    named = glibcfloor.floor_problem(forky_base, "2.36", cuda="13.0", python="3.13")
    assert named is not None and named.endswith(
        "flavor manylinux (glibc 2.28) or devel (glibc 2.35) or pypi "
        "(factory-builder:cu13.0-bookworm-cpython-pypi, glibc 2.36) can"
    )
    # the pypi flavor on its default base meets it: no registry needed, none said
    forky = BuildOptions(flavor="pypi", base_image="factory-base:forky")
    assert glibcfloor.floor_problem(forky, "2.36", cuda="13.0", python="3.11") == (
        "build.glibc 2.36: flavor pypi compiles CUDA 13.0 / Python 3.11 in "
        "factory-builder:cu13.0-py3.11-pypi (glibc 2.43), whose wheels may need glibc up to 2.43; flavor "
        "manylinux (glibc 2.28) or devel (glibc 2.35) or pypi (factory-builder:cu13.0-py3.11-pypi, "
        "glibc 2.36) can"
    )
    none = glibcfloor.floor_problem(pypi, "2.20", cuda="13.0", python="3.13")
    assert none is not None and none.endswith(
        "no flavor's builder is that old: lower the floor or name an older builder in build.images; without "
        "a registry the oldest is flavor pypi (factory-builder:cu13.0-bookworm-cpython-pypi, glibc 2.36): "
        'build.glibc "2.36"'
    )
    # an image of the user's own: its glibc is not known here, the wheel check decides
    own = BuildOptions(flavor="pypi", images={"13.0": "registry.example/builder:1"})
    assert glibcfloor.floor_problem(own, "2.17", cuda="13.0", python="3.13") is None
    assert (
        glibcfloor.floor_problem(BuildOptions(flavor="manylinux"), "2.28", cuda="13.0", python="3.13") is None
    )


def test_what_factory_matrix_shows_of_a_floor() -> None:
    pypi = BuildOptions(flavor="pypi")
    assert glibcfloor.shown(pypi, None, cuda="13.0", python="3.13", torch_floor="2.28") == (
        "<= 2.43 (factory-builder:cu13.0-forky-pypi, glibc 2.43; torch: 2.28)"
    )
    assert glibcfloor.shown(pypi, None, cuda="13.0", python="3.11", torch_floor="2.36") == (
        "<= 2.36 (factory-builder:cu13.0-py3.11-pypi, glibc 2.36)"
    )
    manylinux = BuildOptions(flavor="manylinux", glibc="torch")
    assert glibcfloor.shown(manylinux, "2.28", cuda="12.8", python="3.12", torch_floor="2.28") == (
        "2.28 (factory-builder:cu12.8-py3.12-manylinux, glibc 2.28)"
    )
    own = BuildOptions(images={"12.8": "mine:1"})
    assert glibcfloor.shown(own, None, cuda="12.8", python="3.12", torch_floor=None) == (
        "not declared (mine:1, glibc not known)"
    )
    # an aarch64 job's builder is its platform's image, of the same glibc
    devel = BuildOptions(flavor="devel")
    aarch64 = named("aarch64")
    assert glibcfloor.shown(devel, None, cuda="12.8", python="3.12", torch_floor="2.28", target=aarch64) == (
        "<= 2.35 (factory-builder:cu12.8-py3.12-devel-aarch64, glibc 2.35; torch: 2.28)"
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("[2.28]", 'build.glibc must be a glibc version like "2.28", torch or builder, not a list'),
        ("2.3", "build.glibc: '2.3' is not a glibc version like 2.28"),
        ("latest", "build.glibc: 'latest' is not a glibc version like 2.28"),
        ("true", "build.glibc must be a glibc version"),
    ],
)
def test_build_glibc_in_a_matrix_file_is_checked_with_its_line(
    tmp_path: Path, value: str, message: str
) -> None:
    path = matrix(tmp_path, f"flavor: pypi\nglibc: {value}\n")
    with pytest.raises(ConfigError) as exc:
        load_matrix_file(path)
    assert str(exc.value).startswith(f"{path}:10: {message}"), exc.value


@pytest.mark.parametrize(
    ("value", "floor"), [("2.28", "2.28"), ('"2.36"', "2.36"), ("torch", "torch"), ("builder", None)]
)
def test_build_glibc_loads(tmp_path: Path, value: str, floor: str | None) -> None:
    assert load_matrix_file(matrix(tmp_path, f"glibc: {value}\n")).build.glibc == floor


def test_a_plan_whose_builder_cannot_meet_the_floor_is_refused(tmp_path: Path) -> None:
    refused = load_matrix_file(matrix(tmp_path, "flavor: pypi\nglibc: torch\n"))
    with pytest.raises(ConfigError) as exc:
        plan_matrix(refused)
    line = str(exc.value)
    assert "\n" not in line
    assert line.endswith(
        "build.glibc 2.28: flavor pypi compiles CUDA 13.0 / Python 3.11 in "
        "factory-builder:cu13.0-py3.11-pypi (glibc 2.36), whose wheels may need glibc up to 2.36; "
        "flavor manylinux (glibc 2.28) can (its base comes from a registry: `docker load` it where none is "
        "reachable); without a registry the oldest is flavor pypi (factory-builder:cu13.0-py3.11-pypi, "
        'glibc 2.36): build.glibc "2.36"'
    )
    met = plan_matrix(load_matrix_file(matrix(tmp_path, "flavor: manylinux\nglibc: torch\n")))
    assert [(j.python, j.glibc, j.to_json()["glibc"]) for j in met.jobs] == [
        ("3.11", "2.28", "2.28"),
        ("3.13", "2.28", "2.28"),
    ]
    bookworm = plan_matrix(
        load_matrix_file(matrix(tmp_path, 'flavor: pypi\nglibc: "2.36"\n', pythons='"3.11"'))
    )
    assert [j.glibc for j in bookworm.jobs] == ["2.36"]


def test_a_matrix_without_a_floor_plans_as_before(tmp_path: Path) -> None:
    plan = plan_matrix(load_matrix_file(matrix(tmp_path, "flavor: pypi\n")))
    assert [j.glibc for j in plan.jobs] == [None, None]
    assert all("glibc" not in j.to_json() for j in plan.jobs)


def test_factory_matrix_shows_each_floor_and_its_builder(
    tmp_path: Path, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    code, out = factory_cli(["matrix", "-m", str(matrix(tmp_path, "flavor: pypi\n"))])
    assert code == 0, out
    flat = " ".join(out.replace("│", " ").split())
    assert "glibc" in flat
    assert "3.11: <= 2.36 (factory-builder:cu13.0-py3.11-pypi, glibc 2.36; torch: 2.28)" in flat
    assert "3.13: <= 2.43 (factory-builder:cu13.0-forky-pypi, glibc 2.43; torch: 2.28)" in flat
    code, out = factory_cli(["matrix", "-m", str(matrix(tmp_path, "flavor: pypi\nglibc: torch\n"))])
    assert code == 2, out
    (line,) = out.strip().splitlines()
    assert line.startswith("error: ") and "flavor manylinux (glibc 2.28) can" in line
    code, out = factory_cli(
        ["matrix", "-m", str(matrix(tmp_path, "glibc: torch\n")), "--flavor", "manylinux", "--json"]
    )
    assert code == 0, out
    assert {j["glibc"] for j in json.loads(out)["jobs"]} == {"2.28"}


@pytest.mark.parametrize(
    ("platforms", "floor", "problems"),
    [
        ({"manylinux_2_28_x86_64"}, "2.28", 0),
        ({"manylinux_2_17_x86_64", "manylinux2014_x86_64"}, "2.28", 0),
        ({"manylinux_2_34_x86_64"}, "2.36", 0),
        ({"manylinux_2_39_x86_64"}, "2.28", 1),
        ({"manylinux_2_39_x86_64"}, None, 0),
        ({"manylinux_2_39_aarch64"}, "2.28", 0),  # another machine's tag: the filename check says so
        ({"linux_x86_64"}, "2.28", 0),  # not manylinux: refused by the filename check already
    ],
)
def test_the_wheel_check_refuses_a_tag_above_the_floor(
    platforms: set[str], floor: str | None, problems: int
) -> None:
    found = floor_problems(platforms, machine="x86_64", glibc=floor)
    assert len(found) == problems, found
    if problems:
        assert found[0] == (
            "filename: platform tag manylinux_2_39_x86_64 needs glibc 2.39, above the matrix's floor "
            "build.glibc 2.28 (manylinux_2_28_x86_64): hosts of glibc 2.28 cannot install it; build it "
            "with a flavor whose builder's glibc is not above the floor"
        )


def test_a_job_the_flavor_has_no_builder_for_is_shown_not_fatal() -> None:
    shown = glibcfloor.shown(
        BuildOptions(flavor="pypi"), None, cuda="12.8", python="3.11", torch_floor="2.28"
    )
    assert shown.startswith("no builder: the PyPI toolkit (flavor pypi, the devel stand-in) needs CUDA >= 13")


def test_the_check_containers_platform_is_its_builders_glibc() -> None:
    pypi = BuildOptions(flavor="pypi")
    assert glibcfloor.check_platform(pypi, cuda="13.0", python="3.11") == "manylinux_2_36_x86_64"
    assert glibcfloor.check_platform(pypi, cuda="13.0", python="3.14") == "manylinux_2_43_x86_64"
    assert (
        glibcfloor.check_platform(BuildOptions(images={"13.0": "mine:1"}), cuda="13.0", python="3.11") is None
    )
    assert glibcfloor.check_platform(pypi, cuda="12.8", python="3.11") is None  # no builder: the default
