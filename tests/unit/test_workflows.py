"""The project's own rules for .github/workflows, beyond what actionlint and zizmor (`make lint`) check:
no expression expanded inside a script, actions pinned by commit, the AWS secrets only in the env of the
steps that run the factory, and wheels.yml calling the reusable workflow with them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

WORKFLOWS = Path(__file__).resolve().parents[2] / ".github" / "workflows"
PINNED = re.compile(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}")


def load(name: str) -> dict[str, Any]:
    return YAML(typ="safe").load((WORKFLOWS / name).read_text())


def steps(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for job in doc["jobs"].values() for s in job.get("steps", [])]


@pytest.mark.parametrize("name", ["factory.yml", "wheels.yml"])
def test_scripts_expand_nothing_and_actions_are_pinned(name: str) -> None:
    doc = load(name)
    assert doc["permissions"] == {}
    for step in steps(doc):
        if "run" in step:
            assert "${{" not in step["run"], step["run"]
        if "uses" in step:
            assert PINNED.fullmatch(step["uses"]), step["uses"]
            if step["uses"].startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False
    for job in doc["jobs"].values():
        assert "env" not in job  # secrets and inputs go to single steps
        assert job.get("permissions") == {"contents": "read"}


def test_the_secrets_reach_only_the_steps_that_run_the_factory() -> None:
    text = (WORKFLOWS / "factory.yml").read_text()
    doc = load("factory.yml")
    declared = set(doc["on"]["workflow_call"]["secrets"])
    aws = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    assert declared == {*aws, "FACTORY_CACHE_KEY"}
    users, signers = [], []
    for step in steps(doc):
        env = step.get("env", {})
        passed = {k for k, v in env.items() if "secrets." in str(v)}
        assert all(env[k] == f"${{{{ secrets.{k} }}}}" for k in passed)
        if passed:
            # the cache's key only where compiles are signed: the steps that build
            assert passed == (declared if " build " in step["run"] else aws)
            users.append(step)
            if "FACTORY_CACHE_KEY" in passed:
                signers.append(step)
        assert "secrets." not in str(step.get("with", "")) and "secrets." not in str(step.get("run", ""))
    assert len(users) == 4 and len(signers) == 2  # plan, shard, build, index; shard and build sign
    assert text.count("secrets.") == len(users) * 2 + len(signers)
    assert all(s["run"].lstrip().startswith('"$RUNNER_TEMP/factory/bin/factory" ') for s in users)


def test_wheels_yml_calls_the_reusable_workflow_on_schedule_and_dispatch() -> None:
    doc = load("wheels.yml")
    assert set(doc["on"]) == {"schedule", "workflow_dispatch"}
    (job,) = doc["jobs"].values()
    assert job["uses"] == "./.github/workflows/factory.yml"
    assert set(job["secrets"]) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "FACTORY_CACHE_KEY"}
    matrix = Path(__file__).resolve().parents[2] / job["with"]["matrix"]
    publish = YAML(typ="safe").load(matrix.read_text())["publish"]
    assert publish["to"].startswith("s3://")  # a per-runner directory cannot tell one runner what another did
