"""Which torch, Python and CUDA exist per platform, read off the index's file names: an aarch64 job whose
torch has no aarch64 wheel for its Python is dropped with its reason; the x86_64 jobs plan as before."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from factory.core.platforms import DEFAULT_PLATFORM, named
from factory.plan.plan import flavor_problem, plan_matrix
from factory.plan.torchcompat import platform_offer, platform_problem
from factory.plan.torchindex import TorchSource, parse_torch_file
from factory.spec.config import load_matrix_file
from tests.torch_index_helpers import TorchWheel, make_index

AARCH64 = named("aarch64")
ARM = "manylinux_2_28_aarch64"
WHEELS = [
    TorchWheel("2.13.0", "13.0", pythons=("3.11", "3.12")),
    TorchWheel("2.14.1", "13.0", cxx_std="20", pythons=("3.11", "3.12")),
    TorchWheel("2.14.0", "13.0", cxx_std="20", pythons=("3.12",), platform=ARM),
    TorchWheel("2.14.1", "13.0", cxx_std="20", pythons=("3.12",), platform=ARM),
]
SOURCE = TorchSource(pages=("https://i/simple/torch/",), label="https://i/simple")


def files(wheels: list[TorchWheel]) -> list:  # type: ignore[type-arg]
    out = []
    for wheel in wheels:
        for name in wheel.filenames():
            parsed = parse_torch_file(name, f"https://i/{name}", None, "https://i/simple/torch/")
            assert parsed is not None
            out.append(parsed)
    return out


def test_offer_per_platform_from_file_names() -> None:
    found = files(WHEELS)
    assert platform_offer(found, SOURCE, AARCH64, torch="2.14") == {"3.12": ["2.14.1", "2.14.0"]}
    assert platform_offer(found, SOURCE, AARCH64, torch="2.14.0") == {"3.12": ["2.14.0"]}
    assert platform_offer(found, SOURCE, AARCH64, torch="2.13") == {}
    assert platform_offer(found, SOURCE, DEFAULT_PLATFORM, torch="2.14") == {
        "3.11": ["2.14.1"],
        "3.12": ["2.14.1"],
    }


def test_problem_names_what_the_index_has() -> None:
    found = files(WHEELS)
    assert platform_problem(found, SOURCE, AARCH64, torch="2.14", python="3.12") is None
    assert platform_problem(found, SOURCE, AARCH64, torch="2.14", python="3.11") == (
        "no torch 2.14 wheel for Python 3.11 on aarch64 on https://i/simple (it has Python 3.12)"
    )
    assert platform_problem(found, SOURCE, AARCH64, torch="2.13", python="3.12") == (
        "no torch 2.13 wheel for aarch64 on https://i/simple (its manylinux_2_28_aarch64 wheels)"
    )


@pytest.fixture
def pip_index(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    simple = make_index(tmp_path_factory.mktemp("torch-index"), WHEELS)
    for var in [v for v in os.environ if v.startswith("PIP_")]:
        monkeypatch.delenv(var)
    for key, value in {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": simple.as_uri(),
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        "PIP_CONSTRAINT": "",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path_factory.mktemp("home")))
    return simple


def test_plan_drops_a_platform_without_torch_with_its_reason(tmp_path: Path, pip_index: Path) -> None:
    path = tmp_path / "matrix.yaml"
    path.write_text(
        'package: {name: demo, version: "0.1.0", source: {path: .}}\n'
        'recipe: {name: demo, cxx_std: "20"}\n'
        "matrix:\n"
        '  cuda: ["13.0"]\n'
        '  torch: ["2.14"]\n'
        '  python: ["3.11", "3.12"]\n'
        "  cxx11_abi: [true]\n"
        '  arch: ["9.0"]\n'
        "  platform: [x86_64, aarch64]\n"
        "build:\n"
        '  torch_index: {"13.0": default}\n'
    )
    plan = plan_matrix(load_matrix_file(path))
    assert [(j.python, j.platform.name) for j in plan.jobs] == [
        ("3.11", "x86_64"),
        ("3.12", "x86_64"),
        ("3.12", "aarch64"),
    ]
    assert [j.id for j in plan.jobs][2].endswith("-py312-aarch64")
    (dropped,) = plan.dropped
    assert dropped.values["python"] == "3.11" and dropped.values["platform"] == "aarch64"
    assert dropped.reason.startswith("no torch 2.14 wheel for Python 3.11 on aarch64 on ")
    assert dropped.reason.endswith("(it has Python 3.12)")


def build_one_aarch64_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, factory_cli: Any, *, torch: str
) -> tuple[int, str]:
    """`factory build` of a matrix of one aarch64 job (CUDA 13.0, Python 3.12, `torch`) from
    `tmp_path/matrix.yaml`, with Docker's connection an assertion: what must fail does so before it."""
    from factory.build import engine

    def no_docker(*args: object, **kwargs: object) -> None:
        raise AssertionError("Docker was asked")

    monkeypatch.setattr(engine, "connect", no_docker)
    (tmp_path / "src").mkdir()
    path = tmp_path / "matrix.yaml"
    path.write_text(
        'package: {name: demo, version: "0.1.0", source: {path: src}}\n'
        'recipe: {name: demo, cxx_std: "20"}\n'
        f'matrix: {{cuda: ["13.0"], torch: ["{torch}"], python: ["3.12"], cxx11_abi: [true], arch: ["9.0"],'
        " platform: [aarch64]}\n"
        'build: {torch_index: {"13.0": default}}\n'
    )
    return factory_cli(["build", "--matrix", str(path), "--output", str(tmp_path / "out")])


def test_build_without_emulation_is_one_line_before_any_container(
    tmp_path: Path, pip_index: Path, monkeypatch: pytest.MonkeyPatch, factory_cli: Any
) -> None:
    """`factory build` of an aarch64 job on an x86_64 host without QEMU's entry: exit 2, one line saying
    what to run, and Docker never asked."""
    from factory.build import emulation

    monkeypatch.setattr(emulation, "host_platform", lambda: DEFAULT_PLATFORM)
    monkeypatch.setattr(emulation, "BINFMT_DIR", tmp_path / "binfmt_misc")
    (tmp_path / "binfmt_misc").mkdir()
    (tmp_path / "binfmt_misc" / "status").write_text("enabled\n")

    code, out = build_one_aarch64_job(tmp_path, monkeypatch, factory_cli, torch="2.14")
    assert code == 2, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines[-1].startswith(
        "error: aarch64 containers on this x86_64 host need QEMU emulation: run `apt-get"
    )
    assert "Traceback" not in out


def test_factory_matrix_names_the_platform_of_a_job(tmp_path: Path, pip_index: Path) -> None:
    from factory.cli.matrix_cmd import _pythons

    path = tmp_path / "matrix.yaml"
    path.write_text(
        'package: {name: demo, version: "0.1.0", source: {path: .}}\n'
        'recipe: {name: demo, cxx_std: "20"}\n'
        'matrix: {cuda: ["13.0"], torch: ["2.14"], python: ["3.12"], cxx11_abi: [true], arch: ["9.0"],'
        " platform: [x86_64, aarch64]}\n"
        'build: {torch_index: {"13.0": default}}\n'
    )
    assert [_pythons(j) for j in plan_matrix(load_matrix_file(path)).jobs] == ["3.12", "3.12 aarch64"]


def test_a_platform_torch_has_no_wheel_for_is_one_line_before_any_container(
    tmp_path: Path, pip_index: Path, monkeypatch: pytest.MonkeyPatch, factory_cli: Any
) -> None:
    """`factory build` of a matrix whose only platform has no torch wheel: exit 2, one line saying why (the
    dropped job and its reason), and Docker never asked."""
    path = tmp_path / "matrix.yaml"
    code, out = build_one_aarch64_job(tmp_path, monkeypatch, factory_cli, torch="2.13")
    assert code == 2, out
    assert out.strip().splitlines() == [
        f"error: {path}: the matrix plans no job: cu130-torch2.13-abi1-sm90-py312-aarch64 is dropped: "
        "no torch 2.13 wheel for aarch64 on the pip configuration's indexes "
        "(its manylinux_2_28_aarch64 wheels)"
    ]
    assert not (tmp_path / "out").exists()


def flavor_matrix(tmp_path: Path, flavor: str, platforms: str) -> Path:
    (tmp_path / "src").mkdir(exist_ok=True)
    path = tmp_path / f"{flavor}.yaml"
    path.write_text(
        'package: {name: demo, version: "0.1.0", source: {path: src}}\n'
        'recipe: {name: demo, cxx_std: "20"}\n'
        'matrix: {cuda: ["13.0"], torch: ["2.14"], python: ["3.12"], cxx11_abi: [true], arch: ["9.0"],'
        f" platform: [{platforms}]}}\n"
        f'build: {{flavor: {flavor}, torch_index: {{"13.0": default}}}}\n'
    )
    return path


@pytest.mark.parametrize("flavor", ["manylinux", "debian"])
def test_a_flavor_without_aarch64_images_drops_those_jobs_when_planned(
    tmp_path: Path, pip_index: Path, flavor: str, factory_cli: Any
) -> None:
    """Found by the plan, not at image choice: `factory matrix` lists the aarch64 job as dropped, with why,
    and plans the x86_64 one (the debian flavor's x86_64 job is left out: its toolkit has no CUDA 13)."""
    path = flavor_matrix(tmp_path, flavor, "x86_64, aarch64" if flavor == "manylinux" else "aarch64")
    reason = f"flavor {flavor} builds x86_64 only; aarch64 jobs use flavor pypi or devel"
    for prune in (True, False):  # not a verdict of the compatibility data: --no-prune drops it too
        plan = plan_matrix(load_matrix_file(path), prune=prune)
        (dropped,) = plan.dropped
        assert dropped.id == "cu130-torch2.14-abi1-sm90-py312-aarch64" and dropped.reason == reason
        assert [j.platform for j in plan.jobs] == ([DEFAULT_PLATFORM] if flavor == "manylinux" else [])
    code, out = factory_cli(["matrix", "--matrix", str(path), "--trust-paths", "--json"])
    assert code == 0, out
    shown = json.loads(out)
    assert shown["dropped"] == [
        {
            "id": "cu130-torch2.14-abi1-sm90-py312-aarch64",
            "reason": reason,
            "values": {**dropped.values, "platform": "aarch64"},
        }
    ]


def test_a_matrix_whose_every_job_no_flavor_image_builds_is_one_line_before_any_container(
    tmp_path: Path, pip_index: Path, monkeypatch: pytest.MonkeyPatch, factory_cli: Any
) -> None:
    """`factory build` of a debian-flavor matrix of aarch64 jobs only: exit 2, one line naming the dropped
    job and why, and Docker never asked (neither the torch index: the flavor is judged first)."""
    from factory.build import engine
    from factory.plan import plan as plan_module

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("asked")

    monkeypatch.setattr(engine, "connect", never)
    monkeypatch.setattr(plan_module, "torch_platform_problem", never)
    path = flavor_matrix(tmp_path, "debian", "aarch64")
    code, out = factory_cli(["build", "--matrix", str(path), "--output", str(tmp_path / "out")])
    assert code == 2, out
    assert out.strip().splitlines() == [
        f"error: {path}: the matrix plans no job: cu130-torch2.14-abi1-sm90-py312-aarch64 is dropped: "
        "flavor debian builds x86_64 only; aarch64 jobs use flavor pypi or devel"
    ]
    assert not (tmp_path / "out").exists()


def test_the_devel_flavor_plans_aarch64_jobs(tmp_path: Path, pip_index: Path) -> None:
    plan = plan_matrix(load_matrix_file(flavor_matrix(tmp_path, "devel", "x86_64, aarch64")))
    assert [j.platform for j in plan.jobs] == [DEFAULT_PLATFORM, AARCH64] and not plan.dropped


def test_an_image_build_images_names_is_taken_at_its_word_for_any_platform(
    tmp_path: Path, pip_index: Path
) -> None:
    path = flavor_matrix(tmp_path, "debian", "aarch64")
    path.write_text(path.read_text().replace("build: {", 'build: {images: {"13.0": "mine/arm:1"}, '))
    mf = load_matrix_file(path)
    assert flavor_problem(mf, cuda="13.0", platform=AARCH64) is None
    assert flavor_problem(mf, cuda="12.8", platform=AARCH64) == (
        "flavor debian builds x86_64 only; aarch64 jobs use flavor pypi or devel"
    )
    assert [j.id for j in plan_matrix(mf).jobs] == ["cu130-torch2.14-abi1-sm90-py312-aarch64"]
