"""`factory build` as a library call: the request checked and planned, then run behind a display."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from factory.build import engine, request, runner
from factory.build.report import BuildReport, JobResult
from factory.cli.progress import BuildDisplay
from factory.core.errors import ConfigError
from factory.plan.plan import Job
from factory.plan.shard import Shard

DEMO = Path(__file__).resolve().parents[3] / "examples" / "demo.yaml"


def plan(**given: Any) -> request.PlannedBuild:
    warnings: list[str] = []
    return request.plan_build(request.BuildRequest(matrix=DEMO, **given), warn=warnings.append)


def test_a_request_is_planned_into_jobs_and_settings(tmp_path: Path) -> None:
    planned = plan(output=tmp_path / "w", memory=2**31, cpus=2.0, keep_going=True, cache="off")
    assert [j.id for j in planned.jobs] == [
        "cu130-torch2.14-abi1-sm80-py311",
        "cu130-torch2.14-abi1-sm90.120-py311",
    ]
    s = planned.settings
    assert (s.output, s.memory, s.cpus, s.keep_going, s.compile_cache) == (
        tmp_path / "w",
        2**31,
        2.0,
        True,
        None,
    )
    assert request.dry_run_line(planned.jobs[0]).split("\t")[:3] == [
        "cu130-torch2.14-abi1-sm80-py311",
        "python 3.11",
        "arch 8.0",
    ]


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"preflight": True, "publish": True}, "--preflight makes no wheel to publish: drop --publish"),
        ({"preflight": True, "shard": Shard(index=1, count=2)}, "--preflight and --shard each choose"),
        ({"rebuild": True}, "--rebuild only applies with --publish"),
        ({"only": "nothing*"}, f"{DEMO}: no job matches --only 'nothing*'"),
        (
            {"check_cache": 2, "cache": "off"},
            "--check-cache checks the compile cache's hits, and the cache is off",
        ),
        (
            {"shard": Shard(index=1, count=2), "cache": "off"},
            "--shard compiles into the compile cache, which is off",
        ),
    ],
)
def test_contradictions_are_refused_before_anything_runs(given: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        plan(**given)
    assert str(caught.value).startswith(said) and caught.value.exit_code == 2


def test_run_planned_builds_behind_the_display(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    planned = plan(output=tmp_path / "w", cache="off")
    events: list[str] = []

    def fake_run_build(
        client: Any, mf: Any, jobs: Sequence[Job], settings: runner.BuildSettings, **kw: Any
    ) -> BuildReport:
        events.append(f"build {len(jobs)} in {settings.output.name}")
        results = [
            JobResult(job_id=j.id, variant_id=j.variant.id, python=j.python, package="p", version="1")
            for j in jobs
        ]
        for r in results:
            r.result = r.phase = "ok"
            kw["on_change"](r)
        return BuildReport(run_id="r", matrix=str(mf.path), started=0.0, jobs=results)

    monkeypatch.setattr(engine, "connect", lambda: events.append("docker") or object())
    monkeypatch.setattr(runner, "run_build", fake_run_build)

    @contextlib.contextmanager
    def showing() -> Iterator[None]:
        events.append("show")
        yield
        events.append("hide")

    outcome = request.run_planned(
        planned,
        on_change=lambda r: events.append(f"{r.job_id} {r.phase}"),
        log=events.append,
        showing=showing,
        finished=lambda report: events.append(f"report ok={report.ok}"),
    )
    assert outcome.ok
    assert events == [
        "docker",
        "show",
        "build 2 in w",
        "cu130-torch2.14-abi1-sm80-py311 ok",
        "cu130-torch2.14-abi1-sm90.120-py311 ok",
        "hide",
        "report ok=True",
    ]


def test_the_plain_display_prints_a_line_per_phase_and_the_report() -> None:
    out = io.StringIO()
    display = BuildDisplay(Console(file=out, force_terminal=False, width=200), report_path="w/report.json")
    r = JobResult(job_id="j1", variant_id="v", python="3.11", package="p", version="1")
    with display.showing():
        r.phase = "build"
        display.on_change(r)
        display.on_change(r)  # the same phase: no second line
        r.phase = r.result = "ok"
        display.on_change(r)
    display.finished(BuildReport(run_id="r", matrix="m", started=0.0, jobs=[r]))
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["j1: build", "j1: ok"]
    assert lines[-1] == "report: w/report.json"
