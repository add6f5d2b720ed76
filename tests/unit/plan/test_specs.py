"""torch:/python: specifiers resolved against the index at plan time, with compatibility derived from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from factory.core.errors import BuildError, ConfigError
from factory.core.validate import is_specifier, parse_specifier, specifier_problem
from factory.plan.pipindex import IndexClient, PipSettings
from factory.plan.plan import plan_matrix
from factory.plan.torchindex import TorchFile, TorchIndex, TorchSource, WheelFacts, parse_torch_file
from factory.spec.compat import CompatData
from factory.spec.config import MAX_PLANNED_JOBS, load_matrix_file
from tests.torch_index_helpers import TorchWheel, make_index

PYTHONS = ("3.10", "3.11", "3.12", "3.13", "3.14")
WHEELS = [
    TorchWheel("2.12.1", "13.0", pythons=PYTHONS),
    TorchWheel("2.13.0", "13.0", pythons=PYTHONS),
    TorchWheel("2.13.0+cpu", None, pythons=("3.11",)),
    TorchWheel("2.14.0", "13.0", cxx_std="20", pythons=PYTHONS),
    TorchWheel("2.14.1", "13.0", cxx_std="20", pythons=PYTHONS),
    TorchWheel("2.15.0+cpu", None, cxx_std="20", pythons=("3.12",)),
    TorchWheel("2.10.0", "12.8", pythons=("3.11",), platform="manylinux_2_28_aarch64"),
]


@pytest.fixture(scope="module")
def simple(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_index(tmp_path_factory.mktemp("torch-index"), WHEELS)


@pytest.fixture
def pip_env(simple: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The host's pip configuration replaced by one index: the fixture's (pip reads it as it reads any)."""
    for var in [v for v in os.environ if v.startswith("PIP_")]:
        monkeypatch.delenv(var)
    env = {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": simple.as_uri(),
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        "PIP_CONSTRAINT": "",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def matrix(tmp_path: Path, torch: str, python: str = '["3.11", "3.12"]', extra: str = "") -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(
        'package: {name: demo, version: "0.1.0", source: {path: .}}\n'
        'recipe: {name: demo, cxx_std: "20"}\n'
        "matrix:\n"
        '  cuda: ["13.0"]\n'
        f"  torch: {torch}\n"
        f"  python: {python}\n"
        "  cxx11_abi: [true]\n"
        '  arch: ["8.0"]\n'
        f"{extra}"
        "build:\n"
        '  torch_index: {"13.0": default}\n'
    )
    return path


def without_torch(compat: CompatData, *minors: str) -> CompatData:
    data = dict(compat.data)
    data["torch"] = {k: v for k, v in data["torch"].items() if k not in minors}
    return CompatData(data=data)


# ---------------------------------------------------------------------------------------------- syntax


@pytest.mark.parametrize(
    "text", [">=2.12", "2.14.*", "~=2.13", ">=2.12,<2.15", "!=2.13.0, >=2.12", "==2.14.1"]
)
def test_specifiers_parse(text: str) -> None:
    assert is_specifier(text) and specifier_problem(text) is None


@pytest.mark.parametrize("text", ["2.14", "3.11", "2.14.1"])
def test_exact_versions_are_not_specifiers(text: str) -> None:
    assert not is_specifier(text)


@pytest.mark.parametrize("text", [">=2.x", "=>2.12", ">=", "~=2", "2.14.*.*", ">=2.12;<3", "<" * 101])
def test_bad_specifiers_say_why(text: str) -> None:
    assert specifier_problem(text)
    with pytest.raises(ValueError):
        parse_specifier(text)


def test_loader_refuses_a_bad_specifier_in_one_line_naming_file_and_line(tmp_path: Path) -> None:
    path = matrix(tmp_path, '[">=2.x"]')
    with pytest.raises(ConfigError) as caught:
        load_matrix_file(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:5: torch version '>=2.x' is not a PEP 440 specifier")
    assert "\n" not in message


def test_loading_a_specifier_reads_no_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "nowhere").as_uri())
    mf = load_matrix_file(matrix(tmp_path, '[">=2.13"]', '[">=3.12"]'))
    assert mf.matrix.axes["torch"] == (">=2.13",) and mf.matrix.axes["python"] == (">=3.12",)


def test_exact_versions_plan_without_the_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "nowhere").as_uri())
    plan = plan_matrix(load_matrix_file(matrix(tmp_path, '["2.14"]')))
    assert [j.id for j in plan.jobs] == ["cu130-torch2.14-abi1-sm80-py311", "cu130-torch2.14-abi1-sm80-py312"]
    assert plan.resolved == () and plan.notes == ()


# ---------------------------------------------------------------------------------------------- resolution


@pytest.mark.usefixtures("pip_env")
def test_torch_at_least_2_13_plans_every_such_torch_and_compat_json_changes_nothing(tmp_path: Path) -> None:
    """The issue's "done when": every torch >= 2.13 on the configured index is planned, with compatibility
    derived from it; without compat.json's entries for those versions the plan is the same."""
    mf = load_matrix_file(matrix(tmp_path, '[">=2.13"]'))
    plan = plan_matrix(mf)
    assert [j.id for j in plan.jobs] == [
        "cu130-torch2.13-abi1-sm80-py311",
        "cu130-torch2.13-abi1-sm80-py312",
        "cu130-torch2.14-abi1-sm80-py311",
        "cu130-torch2.14-abi1-sm80-py312",
    ]
    assert all(j.known for j in plan.jobs)
    (resolved,) = plan.resolved
    assert resolved.values == ("2.13", "2.14") and resolved.detail == ("2.13 = 2.13.0", "2.14 = 2.14.1")
    bare = plan_matrix(replace(mf, compat=without_torch(mf.compat, "2.13", "2.14")))
    assert bare.jobs == plan.jobs and bare.dropped == plan.dropped and bare.resolved == plan.resolved
    # and with compat.json knowing nothing of those torches, what the index says is what prunes: torch 2.14's
    # headers need C++20, which a C++17 recipe cannot compile
    cxx17 = replace(mf, recipe=replace(mf.recipe, cxx_std="17"))
    for compat in (mf.compat, without_torch(mf.compat, "2.13", "2.14")):
        pruned = plan_matrix(replace(cxx17, compat=compat))
        assert {j.variant.torch for j in pruned.jobs} == {"2.13"}
        assert {d.reason for d in pruned.dropped} == {
            "demo compiles as C++17 but torch 2.14 headers need C++20 (patch the source and set the recipe's "
            "cxx_std)"
        }


@pytest.mark.usefixtures("pip_env")
def test_a_cpu_build_is_no_cuda_build_and_is_noted(tmp_path: Path) -> None:
    plan = plan_matrix(load_matrix_file(matrix(tmp_path, '["2.13.*"]')))
    assert {j.variant.torch for j in plan.jobs} == {"2.13"}
    assert any("2.13.0+cpu" in n and "no CUDA 13.0 build" in n for n in plan.notes)
    with pytest.raises(ConfigError) as caught:
        plan_matrix(load_matrix_file(matrix(tmp_path, '[">=2.15"]')))
    assert "2.15.0+cpu (no CUDA build)" in str(caught.value)


@pytest.mark.usefixtures("pip_env")
@pytest.mark.parametrize(
    ("spec", "values"),
    [
        ('["2.14.*"]', {"2.14"}),
        ('["~=2.13"]', {"2.13", "2.14"}),
        ('["<2.14.1, >=2.14"]', {"2.14.0"}),  # not the minor: "2.14" would install 2.14.1
        ('[">=2.12, !=2.13.*"]', {"2.12", "2.14"}),
        ('[">=2.14", "2.14"]', {"2.14"}),  # the same job twice is one job
    ],
)
def test_torch_specifiers_resolve_to_minors_or_exact_versions(
    tmp_path: Path, spec: str, values: set[str]
) -> None:
    plan = plan_matrix(load_matrix_file(matrix(tmp_path, spec)))
    assert {j.variant.torch for j in plan.jobs} == values


@pytest.mark.usefixtures("pip_env")
def test_python_specifier_resolves_against_the_pythons_torch_ships_for(tmp_path: Path) -> None:
    plan = plan_matrix(load_matrix_file(matrix(tmp_path, '["2.14"]', '[">=3.13"]')))
    assert [j.python for j in plan.jobs] == ["3.13", "3.14"]
    (resolved,) = plan.resolved
    assert (resolved.axis, resolved.torch, resolved.values) == ("python", "2.14", ("3.13", "3.14"))
    with pytest.raises(ConfigError, match=r"python '<3.9' matches no Python torch 2.14 \(CUDA 13.0\)"):
        plan_matrix(load_matrix_file(matrix(tmp_path, '["2.14"]', '["<3.9"]')))


@pytest.mark.usefixtures("pip_env")
@pytest.mark.parametrize("platform", ["", ", platform: x86_64"])  # a job without the axis is x86_64
def test_excludes_apply_to_resolved_values(tmp_path: Path, platform: str) -> None:
    extra = f'  exclude:\n    - {{torch: "2.13", python: "3.12"{platform}}}\n'
    plan = plan_matrix(load_matrix_file(matrix(tmp_path, '[">=2.13"]', extra=extra)))
    assert "cu130-torch2.13-abi1-sm80-py312" not in [j.id for j in plan.jobs]
    assert "cu130-torch2.13-abi1-sm80-py311" in [j.id for j in plan.jobs]


@pytest.mark.usefixtures("pip_env")
def test_an_include_entry_may_hold_specifiers(tmp_path: Path) -> None:
    extra = (
        '  include:\n    - {cuda: "13.0", torch: "2.14.*", python: ">=3.14", cxx11_abi: true, arch: "9.0"}\n'
    )
    plan = plan_matrix(load_matrix_file(matrix(tmp_path, '["2.13"]', extra=extra)))
    assert [j.id for j in plan.jobs] == [
        "cu130-torch2.13-abi1-sm80-py311",
        "cu130-torch2.13-abi1-sm80-py312",
        "cu130-torch2.14-abi1-sm90-py314",
    ]


@pytest.mark.usefixtures("pip_env")
def test_a_contradiction_is_shown_and_compat_json_wins(tmp_path: Path) -> None:
    extra = 'compat:\n  torch:\n    "2.14": {cxx_std: "17", cuda: ["12.8"]}\n'
    path = matrix(tmp_path, '[">=2.14"]')
    path.write_text(path.read_text() + extra)
    plan = plan_matrix(
        replace(load_matrix_file(path), recipe=replace(load_matrix_file(path).recipe, cxx_std="17"))
    )
    assert any(
        n.startswith("torch 2.14 cxx_std: compat.json says 17,") and "says 20" in n for n in plan.notes
    )
    assert any(
        n.startswith("torch 2.14 cuda:") and "has 13.0, which compat.json does not list" in n
        for n in plan.notes
    )
    # compat.json's C++17 wins (so the C++17 recipe is kept), its CUDA list too (complete: false, unknown)
    assert {j.variant.torch for j in plan.jobs} == {"2.14"}
    assert not any(j.known for j in plan.jobs)


# ---------------------------------------------------------------------------------------------- the CLI


def _factory(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "factory", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
        cwd=cwd,
    )


def test_matrix_shows_what_each_specifier_resolved_to(tmp_path: Path, pip_env: dict[str, str]) -> None:
    path = matrix(tmp_path, '[">=2.13"]', '[">=3.14"]')
    proc = _factory("matrix", "-m", str(path), "--json", env=pip_env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [r["values"] for r in doc["resolved"]] == [["2.13", "2.14"], ["3.14"], ["3.14"]]
    assert [j["job_id"] for j in doc["jobs"]] == [
        "cu130-torch2.13-abi1-sm80-py314",
        "cu130-torch2.14-abi1-sm80-py314",
    ]
    table = _factory("matrix", "-m", str(path), env=pip_env, cwd=tmp_path)
    said = "resolved: torch '>=2.13' (CUDA 13.0, the pip configuration's indexes) -> "
    assert said + "2.13 = 2.13.0, 2.14 = 2.14.1" in table.stdout


def test_a_specifier_matching_nothing_is_one_line_and_exit_2(tmp_path: Path, pip_env: dict[str, str]) -> None:
    path = matrix(tmp_path, '[">=2.16"]')
    proc = _factory("matrix", "-m", str(path), env=pip_env, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(
        f"error: {path}: torch '>=2.16' matches no torch with a CUDA 13.0 build on the pip configuration's "
        "indexes; it has 2.15.0+cpu (no CUDA build), 2.14.1"
    )
    assert "2.12.1" in proc.stderr and "2.10.0" not in proc.stderr  # an aarch64-only version is no candidate


def test_compat_show_names_each_facts_source(tmp_path: Path, pip_env: dict[str, str]) -> None:
    proc = _factory("compat", "show", "--torch", "2.14", "--json", env=pip_env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    (row,) = doc["torch"]
    derived = {f["key"]: f for f in row["facts"] if f["source"] != "compat.json"}
    assert derived["cxx_std"]["value"] == "20" and "torch/include/ATen/ATen.h" in derived["cxx_std"]["source"]
    assert derived["cuda"]["value"] == ["13.0"] and "metadata of torch-2.14.1-" in derived["cuda"]["source"]
    assert derived["python"]["value"] == list(PYTHONS)
    assert derived["glibc"]["value"] == "2.28" and derived["cxx11_abi"]["value"] == [True]
    assert {f["key"] for f in row["facts"] if f["source"] == "compat.json"} >= {"cuda", "python", "cxx_std"}
    assert row["contradictions"] == []
    text = _factory("compat", "show", "--torch", "2.14", env=pip_env, cwd=tmp_path)
    assert "  cxx_std: 20  [headers (torch/include/ATen/ATen.h) of torch-2.14.1-cp311" in text.stdout
    bad = _factory("compat", "show", "--torch", "two", env=pip_env, cwd=tmp_path)
    assert (
        bad.returncode == 2
        and bad.stderr == "error: --torch 'two' is not a torch version like 2.14 or 2.14.1\n"
    )


def test_an_index_that_cannot_be_read_is_not_the_matrix_files_error(tmp_path: Path) -> None:
    path = matrix(tmp_path, '[">=2.13"]')
    path.write_text(path.read_text().replace('{"13.0": default}', '{"13.0": "http://127.0.0.1:9/whl/cu130"}'))
    with pytest.raises(BuildError) as caught:
        plan_matrix(load_matrix_file(path))
    message = str(caught.value)
    assert message.startswith(f"{path}: torch '>=2.13' matches no torch with a CUDA 13.0 build on ")
    assert "could not read http://127.0.0.1:9/whl/cu130/torch/: " in message


def test_compat_show_refuses_an_index_that_is_no_url(tmp_path: Path, pip_env: dict[str, str]) -> None:
    proc = _factory("compat", "show", "--index", "ftp://mirror.example/whl", env=pip_env, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("error: --index ftp://mirror.example/whl")
    assert proc.stderr.count("\n") == 1


# ---------------------------------------------------------------------------------------------- bounded


class ManyMinors(TorchIndex):
    """An index listing one CUDA 13.0 wheel of each of `count` torch minors (builds said by their labels, so
    no wheel is opened)."""

    def __init__(self, home: Path, count: int) -> None:
        super().__init__(http=IndexClient(PipSettings()), home=home)
        self.listed = [
            f
            for i in range(count)
            if (
                f := parse_torch_file(
                    f"torch-{1 + i // 1000}.{i % 1000}.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl",
                    f"https://example.invalid/t{i}.whl",
                    None,
                    "example",
                )
            )
        ]

    def files(self, source: TorchSource) -> list[TorchFile]:
        return list(self.listed)

    def facts(self, f: TorchFile) -> WheelFacts:
        return WheelFacts()  # nothing more than the labels say (no wheel is fetched)


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("pip_env")
def test_twenty_thousand_torch_minors_are_refused_past_the_job_cap(tmp_path: Path) -> None:
    index = ManyMinors(tmp_path, 20_000)
    with pytest.raises(ConfigError, match=f"resolves to more than {MAX_PLANNED_JOBS} torches"):
        plan_matrix(load_matrix_file(matrix(tmp_path, '[">=1.0"]', '["3.11"]')), index=index)


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("pip_env")
def test_the_job_cap_applies_to_what_the_specifiers_resolved_to(tmp_path: Path) -> None:
    index = ManyMinors(tmp_path, MAX_PLANNED_JOBS // 2 + 1)  # under the cap alone, over it with two Pythons
    with pytest.raises(ConfigError, match=f"its specifiers resolve to more than {MAX_PLANNED_JOBS} jobs"):
        plan_matrix(load_matrix_file(matrix(tmp_path, '[">=1.0"]')), index=index)


@pytest.mark.timeout(60)
def test_compat_show_of_twenty_thousand_torch_minors_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import factory.plan.torchcompat as torchcompat

    index = ManyMinors(tmp_path, 20_000)
    monkeypatch.setattr(torchcompat, "open_index", lambda **_: (index, PipSettings()))
    report = torchcompat.compat_report()
    rows = {row["torch"]: row for row in report["torch"]}
    assert {"key": "cuda", "value": ["13.0"]} in [
        {k: f[k] for k in ("key", "value")} for f in rows["20.999"]["facts"]
    ]
