"""`factory build --publish` as one run against a local-directory index: what is skipped, what is published,
where the compile profile goes, and that a bad destination stops the run before anything is built.

The build step is a stand-in that writes real factory wheels and a real report: Docker builds have their own
tests, these are about what happens around them."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest
from publish_helpers import make_wheel

from bench.matrices import DEMO, write_matrix
from factory.build.pipeline import build_matrix
from factory.build.report import BuildReport, JobResult
from factory.build.reuse import Reuse
from factory.core.errors import ConfigError
from factory.memory import profiles
from factory.memory.shipping import profile_key
from factory.plan.plan import Job, plan_matrix
from factory.publish.stores import LocalStore
from factory.spec.config import MatrixFile, load_matrix_file

pytestmark = pytest.mark.integration


def demo_matrix(tmp_path: Path, to: Path) -> MatrixFile:
    path = write_matrix(DEMO, tmp_path / "m.yaml", publish={"to": str(to)})
    return load_matrix_file(path, trust_paths=True)


class Builder:
    """Writes each job's wheel and report.json to `output` as a build does; remembers what it was asked."""

    def __init__(self, mf: MatrixFile, output: Path) -> None:
        self.mf, self.output = mf, output
        self.calls: list[list[str]] = []

    def __call__(self, jobs: Sequence[Job], reuse: Mapping[str, Reuse]) -> BuildReport:
        assert reuse == {}  # no stable-ABI job here
        self.calls.append([j.id for j in jobs])
        report = BuildReport(run_id="test", matrix=str(self.mf.path), started=time.time())
        for job in jobs:
            wheel = make_wheel(
                self.output, name=self.mf.package.name, label=job.variant.local_version,
                tag="cp311-cp311-linux_x86_64",
            )  # fmt: skip
            report.jobs.append(
                JobResult(
                    job_id=job.id, variant_id=job.variant.id, python=job.python, result="ok", wheel=wheel.name
                )
            )
        report.finished = time.time()
        (self.output / "report.json").write_text(json.dumps(report.to_json()))
        return report


def learn(home: Path, mf: MatrixFile, key: str, peak: int) -> None:
    name, version = mf.package.name, mf.package.version
    path = profiles.profile_path(name, version, home=home)
    base = profiles.load_profile(path, package=name, version=version)
    profiles.save_profile(
        profiles.merge(base, [profiles.Measurement(key=key, peak_bytes=peak, wall_s=1.0)]), path
    )


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_run_publishes_ships_its_profile_and_the_next_run_builds_nothing(
    tmp_path: Path, home: Path
) -> None:
    index = tmp_path / "index"
    mf = demo_matrix(tmp_path, index)
    jobs = plan_matrix(mf).jobs
    assert len(jobs) == 2
    learn(home, mf, "demo.cu|8.0|1", 1 << 30)
    build = Builder(mf, tmp_path / "out")
    said: list[str] = []
    outcome = build_matrix(mf, jobs, build=build, output=tmp_path / "out", publish=True, log=said.append)
    assert outcome.ok and build.calls == [[j.id for j in jobs]]
    assert outcome.published is not None
    assert {f.status for f in outcome.published.files} == {"published"}
    assert {f.variant_id for f in outcome.published.files} == {j.variant.id for j in jobs}
    assert (index / "matrix.json").is_file()
    shipped = LocalStore(index).get(profile_key(mf.package.name, mf.package.version))
    assert shipped is not None and "demo.cu|8.0|1" in json.loads(shipped.data)["entries"]
    assert f"compile profile shipped to {index}: 1 compiles" in said

    # the next scheduled run: everything is published, nothing is built
    said.clear()
    again = Builder(mf, tmp_path / "out2")
    outcome = build_matrix(mf, jobs, build=again, output=tmp_path / "out2", publish=True, log=said.append)
    assert outcome.ok and outcome.report is None and again.calls == []
    for job in jobs:
        assert any(line.startswith(f"{job.id}: already published as ") for line in said), said
    assert said[-1] == f"nothing to build: every job's wheel is already published to {index}"

    # --rebuild builds them all again; the same bytes publish as unchanged
    outcome = build_matrix(
        mf, jobs, build=again, output=tmp_path / "out2", publish=True, rebuild=True, log=said.append
    )
    assert again.calls == [[j.id for j in jobs]]
    assert outcome.published is not None
    assert {f.status for f in outcome.published.files} == {"unchanged"}


def test_the_shipped_profile_is_fetched_before_the_build(tmp_path: Path, home: Path) -> None:
    mf = demo_matrix(tmp_path, tmp_path / "index")
    learn(tmp_path / "other-runner", mf, "demo.cu|9.0|1", 2 << 30)
    from factory.memory.shipping import push_profile

    push_profile(
        LocalStore(tmp_path / "index"), package=mf.package.name, version=mf.package.version,
        home=tmp_path / "other-runner",
    )  # fmt: skip
    seen: list[set[str]] = []
    builder = Builder(mf, tmp_path / "out")

    def build(jobs: Sequence[Job], reuse: Mapping[str, Reuse]) -> BuildReport:
        path = profiles.profile_path(mf.package.name, mf.package.version)
        seen.append(set(profiles.load_profile(path).entries))
        return builder(jobs, reuse)

    said: list[str] = []
    build_matrix(
        mf, plan_matrix(mf).jobs, build=build, output=tmp_path / "out", publish=True, log=said.append
    )
    assert seen == [{"demo.cu|9.0|1"}]
    assert f"compile profile fetched from {tmp_path / 'index'}: 1 compiles" in said


def test_a_destination_that_cannot_be_a_store_stops_the_run_before_any_build(
    tmp_path: Path, home: Path, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    taken = tmp_path / "taken"
    mf = demo_matrix(tmp_path, taken)
    # made after the load, which refuses a destination that is a file already; the run checks it again
    taken.write_text("a file, not an index directory")
    build = Builder(mf, tmp_path / "out")
    with pytest.raises(ConfigError, match="exists and is not a directory"):
        build_matrix(
            mf, plan_matrix(mf).jobs, build=build, output=tmp_path / "out", publish=True, rebuild=True,
            log=lambda _m: None,
        )  # fmt: skip
    assert build.calls == []
    code, output = factory_cli(
        [
            "build",
            "--trust-paths",
            "--matrix",
            str(mf.path),
            "--publish",
            "--rebuild",
            "-o",
            str(tmp_path / "out"),
        ]
    )
    assert code == 2, output
    # through the CLI the loader says it first, at the file's line
    assert output.strip().endswith(f"publish.to '{taken}' exists and is not a directory"), output
    assert output.startswith(f"error: {mf.path}:")
    assert not (tmp_path / "out").exists()
