"""abi3 recipes: the recipe value, the plan's one job per variant, the wheel's tags and stable-ABI audit, and
what is published counting for the job."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename
from typer.testing import CliRunner

from factory.cli import app
from factory.container.driver import limited_api_args
from factory.core.errors import CheckError, ConfigError
from factory.plan.plan import plan_matrix
from factory.publish.publisher import published_wheel
from factory.spec import abi3
from factory.spec.config import load_matrix_file
from factory.spec.recipes import load_recipe_dir
from factory.wheel.checks import _check_python_tags, check_wheel

runner = CliRunner()


def matrix_file(tmp_path: Path, *, limited: str = "true", pythons: str = '["3.13", "3.11", "3.12"]',
                extra: str = "") -> Path:  # fmt: skip
    path = tmp_path / "m.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            package: {{name: demo-abi3, version: "1.0"}}
            recipe:
              name: demo
              py_limited_api: {limited}
            matrix:
              cuda: ["13.0"]
              torch: ["2.14"]
              python: {pythons}
              cxx11_abi: [true]
              arch: ["8.0", "9.0"]
            """
        )
        + extra
    )
    return path


# -- the recipe value


@pytest.mark.parametrize(
    ("value", "parsed"),
    [(True, "auto"), (False, None), (None, None), ("cp39", "cp39"), ("cp312", "cp312"), ("3.10", "cp310")],
)
def test_parse_limited_api(value: object, parsed: str | None) -> None:
    assert abi3.parse_limited_api(value) == parsed


@pytest.mark.parametrize("value", ["cp2", "py3", "abi3", "3", "cp39-abi3", 39, "yes", "cp3"])
def test_parse_limited_api_refuses(value: object) -> None:
    with pytest.raises(ValueError, match="must be true, false or a CPython tag like 'cp39'"):
        abi3.parse_limited_api(value)


def test_a_bad_value_in_a_matrix_file_is_one_line_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_matrix_file(matrix_file(tmp_path, limited='"py39"'))
    message = str(info.value)
    assert "\n" not in message and "m.yaml:4:" in message
    assert "recipe.py_limited_api 'py39' must be true, false or a CPython tag like 'cp39'" in message


def test_a_bad_value_exits_2_from_the_cli(
    tmp_path: Path, factory_cli: Callable[..., tuple[int, str]]
) -> None:
    code, output = factory_cli(["matrix", "-m", str(matrix_file(tmp_path, limited="3"))])
    assert code == 2
    assert output.strip().endswith(
        "m.yaml:4: recipe.py_limited_api 3 must be true, false or a CPython tag like 'cp39'"
    )
    assert len(output.strip().splitlines()) == 1


def test_recipe_toml_reads_it(tmp_path: Path) -> None:
    (tmp_path / "fa3").mkdir()
    (tmp_path / "fa3" / "recipe.toml").write_text('py_limited_api = "cp39"\n')
    assert load_recipe_dir(tmp_path / "fa3").py_limited_api == "cp39"
    (tmp_path / "fa3" / "recipe.toml").write_text("py_limited_api = true\n")
    assert load_recipe_dir(tmp_path / "fa3").py_limited_api == "auto"
    (tmp_path / "fa3" / "recipe.toml").write_text('py_limited_api = "abi3"\n')
    with pytest.raises(ValueError, match=r"recipe.toml: py_limited_api 'abi3' must be"):
        load_recipe_dir(tmp_path / "fa3")


# -- the plan


def test_one_job_per_variant_with_the_lowest_python(tmp_path: Path) -> None:
    plan = plan_matrix(load_matrix_file(matrix_file(tmp_path)))
    assert [(j.id, j.limited_api, j.covers) for j in plan.jobs] == [
        ("cu130-torch2.14-abi1-sm80-py311", "cp311", ("3.12", "3.13")),
        ("cu130-torch2.14-abi1-sm90-py311", "cp311", ("3.12", "3.13")),
    ]
    job = plan.jobs[0]
    assert job.interpreter == "cp311" and job.pythons == ("3.11", "3.12", "3.13")
    assert not plan.dropped


def test_an_explicit_tag_covers_every_python_from_it_and_drops_older_ones(tmp_path: Path) -> None:
    mf = load_matrix_file(matrix_file(tmp_path, limited='"cp312"', pythons='["3.11", "3.12", "3.13"]'))
    plan = plan_matrix(mf)
    assert [(j.python, j.interpreter, j.covers) for j in plan.jobs] == [("3.12", "cp312", ("3.13",))] * 2
    assert {d.reason for d in plan.dropped} == {
        "Python 3.11 is older than the recipe's limited API (cp312-abi3)"
    }
    assert len(plan.dropped) == 2


def test_an_older_tag_is_built_by_the_lowest_python(tmp_path: Path) -> None:
    plan = plan_matrix(load_matrix_file(matrix_file(tmp_path, limited='"cp39"')))
    assert next((j.python, j.interpreter, j.covers) for j in plan.jobs) == ("3.11", "cp39", ("3.12", "3.13"))


def test_a_python_with_its_own_env_is_not_covered(tmp_path: Path) -> None:
    extra = '  include:\n    - python: "3.13"\n      env: {X: "1"}\n'
    plan = plan_matrix(load_matrix_file(matrix_file(tmp_path, extra=extra)))
    assert [j.covers for j in plan.jobs] == [("3.12",), ("3.12",)]
    assert all("differ from cu130-torch2.14-abi1-sm" in d.reason for d in plan.dropped)
    assert len(plan.dropped) == 2


def test_without_the_option_every_python_is_a_job(tmp_path: Path) -> None:
    plan = plan_matrix(load_matrix_file(matrix_file(tmp_path, limited="false")))
    assert len(plan.jobs) == 6 and all(j.limited_api is None and not j.covers for j in plan.jobs)
    assert plan.jobs[0].to_json().get("covers") is None


def test_matrix_formats_show_what_is_covered(tmp_path: Path) -> None:
    path = str(matrix_file(tmp_path))
    result = runner.invoke(app, ["matrix", "-m", path, "--json"])
    assert result.exit_code == 0, result.output
    jobs = json.loads(result.stdout)["jobs"]
    assert [(j["python"], j["abi"], j["covers"]) for j in jobs] == [
        ("3.11", "cp311-abi3", ["3.12", "3.13"])
    ] * 2
    result = runner.invoke(app, ["matrix", "-m", path, "--format", "github"])
    assert json.loads(result.output)["include"][0]["covers"] == ["3.12", "3.13"]
    result = runner.invoke(app, ["matrix", "-m", path])
    assert "3.11 (cp311-abi3, covers 3.12, 3.13)" in result.output
    assert "2 jobs in 2 variants; 0 dropped; 4 more Pythons covered by abi3 wheels" in result.output
    result = runner.invoke(app, ["matrix", "-m", path, "--check"])
    assert "2 jobs in 2 variants, 0 dropped, 0 unknown, 4 Pythons covered by abi3 wheels" in result.output


# -- the build and the wheel


def test_the_driver_passes_the_tag_to_bdist_wheel() -> None:
    assert limited_api_args("") == []
    assert limited_api_args("cp311") == ["--config-settings=--build-option=--py-limited-api=cp311"]


def tags(name: str) -> frozenset[object]:
    return parse_wheel_filename(name)[3]


def test_tag_checks() -> None:
    ok = tags("x-1.0-cp311-abi3-manylinux_2_28_x86_64.whl")
    assert _check_python_tags(ok, interpreter="cp311", abi3=True) == []
    assert _check_python_tags(ok, interpreter="cp39", abi3=True) == [
        "filename: interpreter tag cp311 is not cp39"
    ]
    versioned = tags("x-1.0-cp311-cp311-manylinux_2_28_x86_64.whl")
    [problem] = _check_python_tags(versioned, interpreter="cp311", abi3=True)
    assert problem.startswith("filename: ABI tag cp311 is not abi3")
    assert _check_python_tags(versioned, interpreter="cp311", abi3=False) == []


def test_versioned_module_names() -> None:
    members = ["p/_C.abi3.so", "p/_D.so", "p/_E.cpython-311-x86_64-linux-gnu.so", "p/__init__.py"]
    assert abi3.versioned_modules(members) == ["p/_E.cpython-311-x86_64-linux-gnu.so"]


def test_covers() -> None:
    assert abi3.covers("cp39", "3.13") and abi3.covers("cp311", "3.11") and not abi3.covers("cp312", "3.11")
    assert abi3.wheel_tag("auto", "3.10") == "cp310" and abi3.wheel_tag("cp39", "3.12") == "cp39"


def test_audit_report_lines() -> None:
    report = {
        "specs": {
            "w.whl": {
                "kind": "wheel",
                "wheel": [
                    {"name": "_C.abi3.so", "result": {"non_abi3_symbols": ["PyUnicode_AsUTF8"],
                                                      "future_abi3_objects": {}, "baseline": "3.9"}},
                    {"name": "_D.abi3.so", "result": {"non_abi3_symbols": [],
                                                      "future_abi3_objects": {"PyType_GetName": "3.11"},
                                                      "baseline": "3.9"}},
                    {"name": "_E.abi3.so", "result": {"non_abi3_symbols": [], "future_abi3_objects": {}}},
                ],
            }
        }
    }  # fmt: skip
    assert abi3.audit_problems(report) == [
        "_C.abi3.so: uses symbols outside the limited API: PyUnicode_AsUTF8 (abi3audit)",
        "_D.abi3.so: uses limited-API symbols newer than its tag's Python 3.9: PyType_GetName (abi3audit)",
    ]


# A module that references CPython symbols without Python.h: only its dynamic symbols matter to abi3audit.
MODULE_C = """\
typedef struct _object PyObject;
extern PyObject *PyModule_Create2(void *, int);
extern const char *PyUnicode_AsUTF8(PyObject *);
static char def[128];
PyObject *PyInit__C(void) {
  PyObject *m = PyModule_Create2(def, 3);
%s
  return m;
}
"""


def abi3_wheel(tmp_path: Path, *, limited_only: bool) -> Path:
    """A wheel of the right shape tagged cp39-abi3 whose module uses only stable-ABI symbols or also one
    outside it (no device code: only the audit is under test)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    source = tmp_path / "module.c"
    source.write_text(MODULE_C % ("" if limited_only else "  PyUnicode_AsUTF8(m);"))
    module = tmp_path / "_C.abi3.so"
    subprocess.run([compiler, "-shared", "-fPIC", str(source), "-o", str(module)], check=True)
    wheel = tmp_path / "demo_abi3-1.0-cp39-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(module, "demo_abi3/_C.abi3.so")
        zf.writestr(
            "demo_abi3-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo-abi3\nVersion: 1.0\n"
        )
        zf.writestr("demo_abi3-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: cp39-abi3-linux_x86_64\n")
        zf.writestr("demo_abi3-1.0.dist-info/RECORD", "")
    return wheel


def test_abi3audit_accepts_the_stable_abi_and_names_what_is_outside_it(tmp_path: Path) -> None:
    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    assert abi3.audit(abi3_wheel(tmp_path / "good", limited_only=True)) == []
    assert abi3.audit(abi3_wheel(tmp_path / "bad", limited_only=False)) == [
        "_C.abi3.so: uses symbols outside the limited API: PyUnicode_AsUTF8 (abi3audit)"
    ]


def test_abi3audit_on_a_broken_file_is_a_check_error(tmp_path: Path) -> None:
    wheel = tmp_path / "x-1.0-cp39-abi3-linux_x86_64.whl"
    wheel.write_bytes(b"not a zip")
    with pytest.raises(CheckError, match=r"^x-1.0-cp39-abi3-linux_x86_64.whl: abi3audit"):
        abi3.audit(wheel)


def test_check_wheel_refuses_an_abi3_job_wheel_with_a_versioned_tag(tmp_path: Path) -> None:
    wheel = tmp_path / "demo_abi3-1.0+l-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("demo_abi3/_C.cpython-311-x86_64-linux-gnu.so", b"")
    problems = check_wheel(
        wheel, name="demo-abi3", version="1.0", local_version="l", python="3.11", torch_version="2.14.1",
        archs=["8.0"], limited_api="cp311",
    )  # fmt: skip
    assert any(p.startswith("filename: ABI tag cp311 is not abi3") for p in problems), problems
    assert any("a module named for one CPython version in an abi3 wheel" in p for p in problems), problems


# -- publishing


def test_the_published_abi3_wheel_counts_for_its_job() -> None:
    files = ["demo_abi3-1.0+l-cp39-abi3-manylinux_2_28_x86_64.whl"]
    found = published_wheel(files, project="demo-abi3", version="1.0+l", python="3.11", limited_api="cp39")
    assert found == files[0]
    assert published_wheel(files, project="demo-abi3", version="1.0+l", python="3.11") is None
    versioned = ["demo_abi3-1.0+l-cp311-cp311-manylinux_2_28_x86_64.whl"]
    assert published_wheel(versioned, project="demo-abi3", version="1.0+l", python="3.11") == versioned[0]
    assert (
        published_wheel(versioned, project="demo-abi3", version="1.0+l", python="3.11", limited_api="cp311")
        is None
    )


def test_the_index_matrix_shows_covered_pythons_as_built() -> None:
    from factory.publish import index

    wheel = "flash_attn-2.8.3+l-cp311-abi3-manylinux_2_28_x86_64.whl"
    record = index.FileRecord(
        filename=wheel, sha256="0" * 64, size=1, upload_time="2026-01-01T00:00:00.000000Z"
    )
    jobs = [{"variant_id": "v", "python": "3.11", "result": "ok", "wheel": wheel, "covers": ["3.12", "3.13"]}]
    cells = index.matrix_cells(jobs, [("v", record)])
    assert [(c.python, c.status, c.detail) for c in cells] == [
        ("3.11", "built", wheel),
        ("3.12", "built", wheel),
        ("3.13", "built", wheel),
    ]


def test_an_abi3_job_hands_its_tag_to_the_driver_and_its_checks_their_python(tmp_path: Path) -> None:
    from factory.build import jobrun, report
    from factory.build import runner as build
    from factory.container.protocol import LIMITED_API_ENV
    from factory.memory import jobmemory

    mf = load_matrix_file(matrix_file(tmp_path))
    runner_ = build.Runner(None, mf, build.BuildSettings(output=tmp_path / "out", run_id="r1"))
    parallel = jobmemory.initial_parallelism(
        recipe=mf.recipe, archs=1, limit_bytes=8 * 2**30, cpus=2, package="p", version="1"
    )
    abi3_job = plan_matrix(mf).jobs[0]
    result = report.JobResult(job_id="j", variant_id="v", python="3.11")
    run = jobrun.JobRun(runner_.context, abi3_job, result)
    assert run.container_env(parallel)[LIMITED_API_ENV] == "cp311"
    assert run.driver_env()["FACTORY_PYTHON"] == "python3.11"
    assert run.driver_env("3.13")["FACTORY_PYTHON"] == "python3.13"
    plain = plan_matrix(load_matrix_file(matrix_file(tmp_path, limited="false"))).jobs[0]
    run = jobrun.JobRun(runner_.context, plain, report.JobResult(job_id="j", variant_id="v", python="3.11"))
    assert LIMITED_API_ENV not in run.container_env(parallel)


def test_an_include_entry_cannot_set_what_the_plan_computes(tmp_path: Path) -> None:
    extra = '  include:\n    - python: "3.13"\n      covers: ["3.14"]\n'
    with pytest.raises(ConfigError, match=r"'covers' is computed by the factory and cannot be set"):
        load_matrix_file(matrix_file(tmp_path, extra=extra))
