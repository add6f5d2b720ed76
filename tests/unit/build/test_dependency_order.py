"""A wheel that depends on another factory-built wheel (issue 42 §2): several matrices in one run ordered by
their runtime requirements, the bad inputs (two matrices of one package, a cycle) in one line, a dependent
whose dependency's job failed failing at once with one line, the dependency's wheel pinned for the install
check's download, and `build.check_indexes: [publish]`."""

from __future__ import annotations

import json
import os
import textwrap
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from factory.build import jobrun, report, runtimereqs, wheelhouse
from factory.build import runner as build
from factory.build.pipeline import RunOutcome
from factory.build.request import BuildRequest, PlannedRun, built_dependency, plan_build, run_ordered
from factory.core.errors import ConfigError, FactoryError
from factory.core.platforms import DEFAULT_PLATFORM
from factory.plan.plan import plan_matrix
from factory.plan.schedule import Needs, matrix_order
from factory.spec.config import load_matrix_file

ROOT = Path(__file__).resolve().parents[3]
VID = "cu13.0.torch2.14.abi1.sm80"


def needs(project: str, *requires: str) -> Needs:
    return Needs(project=project, requires=frozenset(requires), matrix=f"{project}.yaml")


def test_a_dependency_is_built_first_whatever_the_order_given() -> None:
    given = [needs("pyg-app", "torch-scatter", "six"), needs("torch-scatter"), needs("other")]
    assert matrix_order(given) == [1, 0, 2]
    # a chain, and independent matrices keep the command line's order
    chain = [needs("c", "b"), needs("b", "a"), needs("a"), needs("d")]
    assert matrix_order(chain) == [2, 1, 0, 3]
    assert matrix_order([needs("x"), needs("y")]) == [0, 1]
    assert matrix_order([needs("self", "self")]) == [0]  # its own name is no dependency


def test_a_dependency_cycle_is_one_line_naming_each_matrix() -> None:
    with pytest.raises(ConfigError) as exc:
        matrix_order([needs("free"), needs("a", "b"), needs("b", "c"), needs("c", "a")])
    assert str(exc.value) == (
        "a dependency cycle between the matrices: a.yaml (a) needs b, b.yaml (b) needs c, c.yaml (c) needs a"
    )


def test_two_matrices_of_one_package_are_refused_in_one_line() -> None:
    twice = [needs("a"), Needs(project="a", requires=frozenset(), matrix="again.yaml")]
    with pytest.raises(ConfigError, match=r"^a.yaml and again.yaml both build a: one matrix per package"):
        matrix_order(twice)


def dependency(**kw: object) -> runtimereqs.Dependency:
    return runtimereqs.Dependency(project="torch-scatter", matrix="scatter.yaml", **kw)  # type: ignore[arg-type]


def test_a_dependency_whose_job_failed_is_one_line() -> None:
    dep = dependency(failed={(VID, "3.13"): "its job x-py3.13 failed (build exited with code 1)"})
    problem = runtimereqs.dependency_problem([dep], variant_id=VID, python="3.13")
    assert problem == (
        "runtime requirement torch-scatter (scatter.yaml) was not built in this run: its job x-py3.13 failed "
        "(build exited with code 1); its install check would have nothing to take it from"
    )
    assert runtimereqs.dependency_problem([dep], variant_id=VID, python="3.12") is None


def test_only_the_dependencies_a_job_requires_count() -> None:
    declared = runtimereqs.Declared(
        requirements=("Torch_Scatter>=2.1", 'torch-sparse; python_version < "3.10"', "six"), where="PKG-INFO"
    )
    scatter, sparse = dependency(), runtimereqs.Dependency(project="torch-sparse", matrix="sparse.yaml")
    got = runtimereqs.needed(
        [scatter, sparse], declared, package="app", python="3.13", platform=DEFAULT_PLATFORM
    )
    assert got == (scatter,)
    assert runtimereqs.project_names(declared) == frozenset({"torch-scatter", "torch-sparse", "six"})


def test_a_built_dependency_is_pinned_to_its_exact_wheel(tmp_path: Path) -> None:
    wheel = tmp_path / f"torch_scatter-2.1.2+{VID}-cp313-cp313-manylinux_2_39_x86_64.whl"
    assert runtimereqs.pinned(["torch-scatter[x]>=2.1", "six"], [wheel]) == (
        f"torch-scatter[x]==2.1.2+{VID}",
        "six",
    )
    with pytest.raises(FactoryError, match=r"^runtime requirement torch-scatter>=3: this run built"):
        runtimereqs.pinned(["torch-scatter>=3"], [wheel])


def test_the_check_wheelhouse_key_follows_the_dependency_s_bytes(tmp_path: Path) -> None:
    plain = wheelhouse.wheelhouse_key(["six"], python="3.13")
    assert wheelhouse.wheelhouse_key(["six"], python="3.13", wheels={}, find_links=()) == plain
    one = wheelhouse.wheelhouse_key(["six"], python="3.13", wheels={"a.whl": "1" * 64})
    other = wheelhouse.wheelhouse_key(["six"], python="3.13", wheels={"a.whl": "2" * 64})
    assert len({plain, one, other}) == 3


def job_result(job_id: str, python: str, result: str, **kw: object) -> report.JobResult:
    return report.JobResult(job_id=job_id, variant_id=VID, python=python, result=result, **kw)  # type: ignore[arg-type]


def test_the_run_hands_each_matrix_what_the_earlier_ones_built(tmp_path: Path) -> None:
    dep_mf, app_mf = (
        load_matrix_file(matrix(tmp_path, "torch-scatter")),
        load_matrix_file(matrix(tmp_path, "app")),
    )
    settings = build.BuildSettings(output=tmp_path / "out" / "torch-scatter")
    planned_dep = plan_build(BuildRequest(matrix=dep_mf.path, output=tmp_path / "out"), warn=print)
    planned_dep = type(planned_dep)(
        mf=dep_mf, jobs=planned_dep.jobs, settings=settings, publish=True, rebuild=False
    )
    planned_app = plan_build(BuildRequest(matrix=app_mf.path), warn=print)
    seen: list[tuple[runtimereqs.Dependency, ...]] = []

    def fake_build(planned: object) -> RunOutcome:
        seen.append(planned.settings.dependencies)  # type: ignore[attr-defined]
        rep = report.BuildReport(run_id="r", matrix="m", started=0.0)
        rep.jobs = [
            job_result("a-py3.13", "3.13", "ok", wheel="torch_scatter-1.whl", covers=["3.14"]),
            job_result("a-py3.12", "3.12", "failed", reason="build exited with code 1\nmore"),
            job_result("a-py3.11", "3.11", "ok"),  # a preflight's: no wheel, no failure
        ]
        return RunOutcome(report=rep)

    run_ordered(PlannedRun(builds=(planned_dep, planned_app)), build=fake_build)
    assert seen[0] == ()
    (dep,) = seen[1]
    assert dep.project == "torch-scatter" and dep.matrix == dep_mf.display
    assert dep.wheels == {
        (VID, "3.13"): settings.output / "torch_scatter-1.whl",
        (VID, "3.14"): settings.output / "torch_scatter-1.whl",
    }
    assert dep.failed == {(VID, "3.12"): "its job a-py3.12 failed (build exited with code 1)"}
    assert dep.index == (Path("./index").resolve() / "simple").as_uri() + "/"
    nothing = built_dependency(planned_dep, RunOutcome(report=None))  # all published already: the index
    assert (nothing.wheels, nothing.failed, nothing.index) == ({}, {}, dep.index)


def matrix(tmp_path: Path, name: str, *, extra: str = "", publish: str = "") -> Path:
    src = tmp_path / f"{name}-src"
    src.mkdir(exist_ok=True)
    (src / "PKG-INFO").write_text(f"Metadata-Version: 2.2\nName: {name}\nVersion: 1.0\n")
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            package: {{name: {name}, version: "1.0", source: {{path: {src.name}}}}}
            recipe: {{name: r, extra_requires: {extra or "[]"}}}
            matrix: {{cuda: ["13.0"], torch: ["2.14"], python: ["3.13"], cxx11_abi: [true], arch: ["8.0"]}}
            build: {{flavor: pypi}}
            """
        )
        + publish
    )
    return path


def test_a_job_whose_dependency_failed_fails_before_anything_is_made_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "home"))
    mf = load_matrix_file(matrix(tmp_path, "app", extra='["torch-scatter>=2"]'))
    (job,) = plan_matrix(mf).jobs
    dep = dependency(failed={(job.variant.id, "3.13"): "its job s-py3.13 oom (out of memory)"})
    runner = build.Runner(
        None, mf, build.BuildSettings(output=tmp_path / "out", run_id="r1", dependencies=(dep,))
    )
    result = report.JobResult(job_id=job.id, variant_id=job.variant.id, python=job.python)
    jobrun.JobRun(runner.context, job, result).run(runner.inputs)  # client None: Docker is never reached
    assert result.result == "failed"
    assert result.reason == (
        "runtime requirement torch-scatter (scatter.yaml) was not built in this run: its job s-py3.13 oom "
        "(out of memory); its install check would have nothing to take it from"
    )


def test_build_orders_the_matrices_given_and_refuses_a_cycle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "home"))
    app = matrix(tmp_path, "app", extra='["dep>=1"]')
    dep = matrix(tmp_path, "dep")
    code, out = factory_cli(
        ["build", "--trust-paths", "--matrix", str(app), "--matrix", str(dep), "--dry-run", "--json"]
    )
    assert code == 0, out
    assert [j["package"] for j in json.loads(out)] == ["dep", "app"]
    code, out = factory_cli(["build", "--trust-paths", "-m", str(app), "-m", str(dep), "--dry-run"])
    assert code == 0, out
    assert [line.split("\t")[0] for line in out.splitlines()] == ["dep", "app"]
    matrix(tmp_path, "dep", extra='["app"]')
    code, out = factory_cli(
        ["build", "--trust-paths", "--matrix", str(app), "--matrix", str(dep), "--dry-run"]
    )
    assert code == 2
    assert out.strip().splitlines() == [
        f"error: a dependency cycle between the matrices: {app} (app) needs dep, {dep} (dep) needs app"
    ]


def test_check_indexes_may_name_the_index_the_matrix_publishes_to(tmp_path: Path) -> None:
    mf = load_matrix_file(matrix(tmp_path, "app", publish=f"publish: {{to: {tmp_path / 'idx'}}}\n"))
    assert mf.publish.pip_index() == (tmp_path / "idx" / "simple").as_uri() + "/"
    text = (
        (tmp_path / "app.yaml")
        .read_text()
        .replace("build: {flavor: pypi}", "build: {flavor: pypi, check_indexes: [publish]}")
    )
    (tmp_path / "app.yaml").write_text(text)
    mf = load_matrix_file(tmp_path / "app.yaml")
    assert mf.build.check_index_urls(VID, own=mf.publish.pip_index()) == (
        (tmp_path / "idx" / "simple" / VID).as_uri() + "/",
    )
    (tmp_path / "app.yaml").write_text(text.replace(str(tmp_path / "idx"), "s3://bucket/idx"))
    with pytest.raises(ConfigError) as exc:
        load_matrix_file(tmp_path / "app.yaml")
    assert str(exc.value) == (
        f"{tmp_path / 'app.yaml'}:4: build.check_indexes item 'publish' is the index publish.to names, "
        "and pip cannot read 's3://bucket/idx': name its public simple/ URL (https://…/simple/) instead"
    )


def wheel(directory: Path, name: str, version: str, *requires: str) -> Path:
    dist = f"{name.replace('-', '_')}-{version}"
    path = directory / f"{dist}-py3-none-any.whl"
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
        zf.writestr(
            f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{meta}"
        )
        zf.writestr(
            f"{dist}.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        zf.writestr(f"{dist}.dist-info/RECORD", "")
    return path


def test_the_check_takes_the_wheel_this_run_built_over_a_newer_one_an_index_offers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real pip, offline: the dependency built in this run (a local label) beats the index's higher version,
    and what it requires comes from the build's wheelhouse (`find_links`), as torch does."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    built = wheel(tmp_path / "out", "fdo-dep", f"0.1.0+{VID}", "fdo-base==1.0")
    house = tmp_path / "build-house"
    wheel(house, "fdo-base", "1.0")
    newer = wheel(tmp_path / "files", "fdo-dep", "9.0")
    page = tmp_path / "idx" / "simple" / "fdo-dep"
    page.mkdir(parents=True)
    (page / "index.html").write_text(f'<a href="{newer.as_uri()}">{newer.name}</a>\n')
    declared = runtimereqs.Declared(requirements=("fdo-dep>=0.1",), where="recipe.extra_requires")
    got = runtimereqs.check_wheelhouse(
        declared, package="app", python="3.13", dest=tmp_path / "houses", platform="manylinux_2_43_x86_64",
        extra_index_urls=[(tmp_path / "idx" / "simple").as_uri() + "/"], built=[built], find_links=[house],
    )  # fmt: skip
    assert got.path is not None
    assert sorted(p.name for p in wheelhouse.wheel_files(got.path)) == [
        "fdo_base-1.0-py3-none-any.whl",
        built.name,
    ]
    assert got.note.endswith(f"built in this run: {built.name}")
    assert not [p for p in (tmp_path / "houses").iterdir() if p.name.startswith(".given.")]


def test_the_check_takes_a_dependency_from_this_run_else_from_its_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "home"))
    mf = load_matrix_file(matrix(tmp_path, "app", extra='["torch-scatter>=2"]'))
    (job,) = plan_matrix(mf).jobs
    made = tmp_path / "out" / "torch_scatter-2.1.2-py3-none-any.whl"
    calls: list[dict[str, object]] = []

    def fake(declared: object, **kw: object) -> runtimereqs.CheckWheelhouse:
        calls.append(kw)
        return runtimereqs.CheckWheelhouse(path=None, requirements=(), note="")

    monkeypatch.setattr(runtimereqs, "check_wheelhouse", fake)
    for dep in (
        dependency(wheels={(job.variant.id, "3.13"): made}),
        dependency(index="file:///srv/scatter/simple/"),
    ):
        settings = build.BuildSettings(output=tmp_path / "out", run_id="r1", dependencies=(dep,))
        runner = build.Runner(None, mf, settings)
        monkeypatch.setattr(runner, "wheelhouse_for", lambda _job: tmp_path / "build-house")
        runner.check_wheelhouse_for(job)
    from_run, from_index = calls
    assert from_run["built"] == (made,) and from_run["find_links"] == (tmp_path / "build-house",)
    assert from_index["built"] == () and from_index["find_links"] == ()
    assert f"file:///srv/scatter/simple/{job.variant.id}/" in from_index["extra_index_urls"]  # type: ignore[operator]
    # both with the tags the check's container (forky's glibc, for Python 3.13) accepts
    assert from_run["platform"] == from_index["platform"] == "manylinux_2_43_x86_64"
