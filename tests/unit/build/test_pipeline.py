"""Pure parts of factory.build.pipeline: a run without --publish touches no store; a store that fails while
taking a compile profile costs only the head start."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from factory.build.pipeline import RunOutcome, build_matrix, sync_profile
from factory.build.report import BuildReport, JobResult
from factory.build.reuse import Reuse
from factory.memory import profiles
from factory.plan.plan import Job, plan_matrix
from factory.publish.stores import LocalStore
from factory.spec.config import load_matrix_file
from factory.spec.options import PublishOptions

ROOT = Path(__file__).resolve().parents[3]


def report_of(*results: str) -> BuildReport:
    jobs = [JobResult(job_id=f"j{i}", variant_id="v", python="3.11", result=r) for i, r in enumerate(results)]
    return BuildReport(run_id="r", matrix="m.yaml", started=0.0, jobs=jobs)


def test_without_publish_the_build_alone_runs(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.write_text("not a directory: opening it as a store would fail")
    mf = load_matrix_file(ROOT / "examples" / "demo.yaml")
    mf = dataclasses.replace(mf, publish=PublishOptions(to=str(taken)))
    jobs = plan_matrix(mf).jobs
    asked: list[Sequence[Job]] = []

    def build(todo: Sequence[Job], reuse: Mapping[str, Reuse]) -> BuildReport:
        assert reuse == {}
        asked.append(todo)
        return report_of("ok", "failed")

    said: list[str] = []
    outcome = build_matrix(mf, jobs, build=build, output=tmp_path / "out", log=said.append)
    assert asked == [jobs] and said == []
    assert outcome.published is None and not outcome.ok


def test_outcome_ok() -> None:
    assert RunOutcome(report=None).ok  # nothing was left to build
    assert RunOutcome(report=report_of("ok", "ok")).ok
    assert not RunOutcome(report=report_of("ok", "oom")).ok


def test_a_store_that_cannot_take_the_profile_costs_only_the_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "home"))
    mf = load_matrix_file(ROOT / "examples" / "demo.yaml")
    name, version = mf.package.name, mf.package.version
    learned = profiles.merge(
        profiles.Profile(package=name, version=version),
        [profiles.Measurement(key="k", peak_bytes=1, wall_s=1)],
    )
    profiles.save_profile(learned, profiles.profile_path(name, version))
    (tmp_path / "file").write_text("a file where the index directory would be")
    said: list[str] = []
    sync_profile(LocalStore(tmp_path / "file" / "index"), mf, said.append, pull=False)
    assert len(said) == 1 and said[0].startswith("compile profile not shipped: "), said
