"""The project's own rules for .github/workflows, beyond what actionlint and zizmor (`make lint`) check:
no expression expanded inside a script, actions pinned by commit, the AWS secrets only in the env of the
steps that run the factory, and wheels.yml calling the reusable workflow with them; the wheels attested by
one job that alone holds the attestation permissions."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

WORKFLOWS = Path(__file__).resolve().parents[2] / ".github" / "workflows"
PINNED = re.compile(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}")
# actions/attest-build-provenance v4.1.0: `git rev-parse v4.1.0^{commit}` of its repository
ATTEST = "actions/attest-build-provenance@a2bbfa25375fe432b6a289bc6b6cd05ecd0c4c32"
ATTEST_PERMISSIONS = {"id-token": "write", "attestations": "write"}


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
    for name, job in doc["jobs"].items():
        assert "env" not in job  # secrets and inputs go to single steps
        if name == "attest":
            assert job["permissions"] == ATTEST_PERMISSIONS
        elif "uses" in job:  # a caller grants what the called workflow's jobs ask for, at most
            assert job["permissions"] == {"contents": "read", **ATTEST_PERMISSIONS}
        else:
            assert job.get("permissions") == {"contents": "read"}


# The private keys (the compile cache's, the wheels') reach a step only through this gate: the plan's verdict
# on the event.
CACHE_KEY = "FACTORY_CACHE_SIGN_KEY"
PRIVATE_KEYS = {CACHE_KEY, "FACTORY_SIGN_KEY"}


def gated(secret: str) -> str:
    return f"${{{{ needs.plan.outputs.cache_writer == 'true' && secrets.{secret} || '' }}}}"


TRUSTED_EVENTS = (
    "${{ github.event_name == 'schedule' || ((github.event_name == 'push' || github.event_name == "
    "'workflow_dispatch') && github.ref == format('refs/heads/{0}', "
    "github.event.repository.default_branch)) }}"
)


def test_the_secrets_reach_only_the_steps_that_run_the_factory() -> None:
    text = (WORKFLOWS / "factory.yml").read_text()
    doc = load("factory.yml")
    declared = set(doc["on"]["workflow_call"]["secrets"])
    aws = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    assert declared == {*aws, CACHE_KEY, "FACTORY_SIGN_KEY"}
    users, signers, wheel_signers = [], [], []
    for step in steps(doc):
        env = step.get("env", {})
        passed = {k for k, v in env.items() if "secrets." in str(v)}
        assert all(env[k] == (gated(k) if k in PRIVATE_KEYS else f"${{{{ secrets.{k} }}}}") for k in passed)
        if passed:
            # the cache's key only where compiles are signed: the steps that build; the wheels' signing key
            # only where wheels are published: the build that is no shard
            builds = " build " in step["run"]
            publishes = builds and "--publish" in step["run"] and "--shard" not in step["run"]
            assert passed == (declared if publishes else {*aws, CACHE_KEY} if builds else aws)
            users.append(step)
            if CACHE_KEY in passed:
                signers.append(step)
                # and every step that builds verifies the shared cache with the public keys
                assert env["FACTORY_CACHE_PUBLIC_KEYS"] == "${{ inputs.cache-public-keys }}"
            if "FACTORY_SIGN_KEY" in passed:
                wheel_signers.append(step)
        assert "secrets." not in str(step.get("with", "")) and "secrets." not in str(step.get("run", ""))
    assert len(users) == 5 and len(signers) == 2  # plan, shard, build, index, audit; shard and build sign
    assert len(wheel_signers) == 1  # build
    assert text.count("secrets.") == len(users) * 2 + len(signers) + len(wheel_signers)
    assert all(s["run"].lstrip().startswith('"$RUNNER_TEMP/factory/bin/factory" ') for s in users)


def test_the_cache_s_private_key_goes_only_to_trusted_events() -> None:
    """Issue 41 §5: push, schedule and workflow_dispatch of the default branch write the shared compile
    cache; a pull request (a fork's or not) or another branch's run gets the public keys only."""
    doc = load("factory.yml")
    plan = doc["jobs"]["plan"]
    assert plan["outputs"]["cache_writer"] == TRUSTED_EVENTS
    for name in ("shard", "build"):
        assert "plan" in doc["jobs"][name]["needs"]  # the gate's verdict is the plan's
    assert "pull_request" not in TRUSTED_EVENTS and "merge_group" not in TRUSTED_EVENTS
    inputs = doc["on"]["workflow_call"]["inputs"]
    assert inputs["cache-public-keys"]["default"] == "" and inputs["cache-public-keys"]["type"] == "string"


def test_wheels_yml_calls_the_reusable_workflow_on_schedule_and_dispatch() -> None:
    doc = load("wheels.yml")
    assert set(doc["on"]) == {"schedule", "workflow_dispatch"}
    (job,) = doc["jobs"].values()
    assert job["uses"] == "./.github/workflows/factory.yml"
    assert set(job["secrets"]) == {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "FACTORY_CACHE_SIGN_KEY",
        "FACTORY_SIGN_KEY",
    }
    assert job["with"]["cache-public-keys"] == "${{ vars.WHEELS_FACTORY_CACHE_PUBLIC_KEYS }}"
    matrix = Path(__file__).resolve().parents[2] / job["with"]["matrix"]
    publish = YAML(typ="safe").load(matrix.read_text())["publish"]
    assert publish["to"].startswith("s3://")  # a per-runner directory cannot tell one runner what another did


def test_one_job_attests_the_published_wheels_and_alone_may() -> None:
    """The attest job holds the OIDC and attestation permissions and nothing else: no checkout, no secret,
    no factory; the build jobs, which run third-party build code, hand it only their wheels' digests."""
    text = (WORKFLOWS / "factory.yml").read_text()
    doc = load("factory.yml")
    jobs = doc["jobs"]
    holders = [n for n, j in jobs.items() if set(j.get("permissions", {})) & set(ATTEST_PERMISSIONS)]
    assert holders == ["attest"]
    attest = jobs["attest"]
    assert set(attest["needs"]) == {"plan", "build"} and attest["if"].startswith("always() && ")
    uses = [s["uses"] for s in attest["steps"] if "uses" in s]
    assert uses[0].startswith("actions/download-artifact@") and uses[-1] == ATTEST
    assert f"{ATTEST} # v4.1.0" in text
    (step,) = [s for s in attest["steps"] if s.get("uses") == ATTEST]
    assert step["with"] == {"subject-checksums": "${{ runner.temp }}/subjects.txt"}
    assert "secrets." not in str(attest) and "factory/bin/factory" not in str(attest)
    # what it attests: the digests each build job uploads after a publish that succeeded
    download = attest["steps"][0]["with"]
    handed = [
        s for s in jobs["build"]["steps"] if str(s.get("with", {}).get("name", "")).startswith("subjects-")
    ]
    assert len(handed) == 1 and download["pattern"] == "subjects-*"
    listing = jobs["build"]["steps"][jobs["build"]["steps"].index(handed[0]) - 1]
    assert "sha256sum" in listing["run"] and "if" not in listing and "if" not in handed[0]


def test_the_index_is_audited_after_publishing_and_weekly() -> None:
    """The audit job runs after the builds and the index check whatever their result, and on a run that asks
    for it when nothing was built; wheels.yml asks for it on its weekly schedule (and by hand)."""
    doc = load("factory.yml")
    audit = doc["jobs"]["audit"]
    assert audit["needs"] == ["plan", "build", "index"]
    assert audit["if"] == (
        "always() && needs.plan.result == 'success' && (needs.plan.outputs.count != '0' || inputs.audit)"
    )
    (step,) = [s for s in audit["steps"] if "index audit" in s.get("run", "")]
    assert step["run"].startswith('"$RUNNER_TEMP/factory/bin/factory" index audit --matrix "$MATRIX" ')
    assert '${VERIFY_KEY:+--key "$VERIFY_KEY"}' in step["run"] and "--report" in step["run"]
    assert step["env"]["VERIFY_KEY"] == "${{ inputs.verify-key }}"
    inputs = doc["on"]["workflow_call"]["inputs"]
    assert inputs["audit"] == {**inputs["audit"], "type": "boolean", "default": False}
    assert inputs["verify-key"]["default"] == "" and inputs["audit-rebuild"]["default"] == 0
    wheels = load("wheels.yml")
    crons = [c["cron"] for c in wheels["on"]["schedule"]]
    weekly = [c for c in crons if c.split()[4] != "*"]
    assert len(weekly) == 1 and len(crons) == 2
    (job,) = wheels["jobs"].values()
    assert job["with"]["audit"] == (
        f"${{{{ github.event.schedule == '{weekly[0]}' || github.event_name == 'workflow_dispatch' }}}}"
    )


def test_each_build_runs_on_a_host_of_its_platform() -> None:
    """Issue 45 §5: the shard and build jobs run where the plan says (`runs_on`, a host of the job's own
    platform: an aarch64 job on an Arm runner, never emulated); the plan gets every platform's runner from
    the caller's inputs, whose defaults are the factory's own (`Platform.ci_runner`)."""
    from factory.core.platforms import PLATFORMS
    from factory.plan.ci import RUNS_ON, parse_runners

    doc = load("factory.yml")
    jobs = doc["jobs"]
    for name in ("shard", "build"):
        assert jobs[name]["runs-on"] == f"${{{{ matrix.{RUNS_ON} }}}}", name
    inputs = doc["on"]["workflow_call"]["inputs"]
    (plan,) = [s for s in jobs["plan"]["steps"] if s.get("id") == "plan"]
    given = re.findall(r'--runner "(\w+)=\$(\w+)"', plan["run"])
    assert sorted(platform for platform, _var in given) == sorted(p.name for p in PLATFORMS)
    defaults = []
    for platform, var in given:
        expression = plan["env"][var]
        found = re.fullmatch(r"\$\{\{ inputs\.([\w-]+) \}\}", expression)
        assert found is not None, expression
        spec = inputs[found.group(1)]
        assert spec["type"] == "string"
        defaults.append(f"{platform}={spec['default']}")
    # the defaults are valid `--runner` values, and the platform's own runner
    runners = parse_runners(defaults)
    assert all(runners.chosen[p] == p.ci_runner for p in PLATFORMS)
    assert inputs["aarch64-build-runs-on"]["default"] == '"ubuntu-24.04-arm"'
