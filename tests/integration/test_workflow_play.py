"""The reusable workflow (.github/workflows/factory.yml) played locally, no mocks: its plan, build and index
steps' own `run:` scripts and `env:`, read from the YAML, run in bash as GitHub's runners would.

The plan's real output is the build matrix, each job naming the runner labels of a host of its platform (an
aarch64 job an Arm runner's: the play plans those, and builds the x86_64 ones here); each of its jobs gets a
"runner" of its own (its own checkout, $RUNNER_TEMP, $FACTORY_HOME, output), all building the demo extension
at once in real containers and publishing to one S3-protocol server (moto, over HTTP); then the index step.
Every wheel is published exactly once and none is lost, the secrets show in no output or file, and a second
run plans nothing.

The factory is the project's wheel, installed by the workflow's own "Install the factory" step (a fresh venv,
not editable) on the plan's runner; the other runners use that venv, as each would install the same wheel.
The runners share the host's wheelhouse cache (torch's GBs, keyed by their inputs, never changed once made)
and its dockerd: on GitHub each runner would download its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from publish_helpers import relabelled
from ruamel.yaml import YAML

# The S3-protocol server fixture (moto in server mode) of the publish tests.
from test_publish_s3 import Moto, moto  # noqa: F401

from bench import matrices
from factory.core.tags import canonical_wheel_filename
from factory.publish import index
from factory.publish.publisher import publish_wheels
from factory.trust import signing

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "factory.yml"
BUCKET, PREFIX = "play-wheels", "ci"
# What the step scripts may expand: the workflow's inputs, its secrets and the build matrix's values; and the
# compile cache's private key behind the plan's verdict on the event (tests/unit/test_workflows.py).
EXPRESSION = re.compile(r"\$\{\{\s*(inputs|secrets|matrix)\.([A-Za-z0-9_-]+)\s*\}\}")
GATED = re.compile(
    r"\$\{\{ needs\.plan\.outputs\.(cache_writer) == 'true' && secrets\.([A-Za-z0-9_-]+) \|\| '' \}\}"
)


@dataclass(frozen=True, kw_only=True)
class Step:
    job: str
    run: str
    env: Mapping[str, str]


def workflow_steps() -> dict[str, Step]:
    """The steps that run the factory in the plan, build and index jobs (each its job's last `run:`)."""
    doc = YAML(typ="safe").load(WORKFLOW.read_text())
    jobs = doc["jobs"]
    assert jobs["build"]["if"] == (
        "!cancelled() && needs.plan.result == 'success' && needs.plan.outputs.count != '0'"
    )
    assert jobs["build"]["needs"] == ["plan", "shard"]
    # each shard and build on the runner the plan names for its job: a host of its platform
    assert jobs["build"]["runs-on"] == jobs["shard"]["runs-on"] == "${{ matrix.runs_on }}"
    assert jobs["shard"]["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.shards) }}"
    assert jobs["build"]["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    assert jobs["index"]["needs"] == ["plan", "build"]
    assert jobs["index"]["if"] == (
        "always() && needs.plan.result == 'success' && needs.plan.outputs.count != '0'"
    )
    installs = {
        name: [(s["run"], s.get("env")) for s in job["steps"] if s.get("name") == "Install the factory"]
        for name, job in jobs.items()
    }
    # every job that runs the factory installs it the same way, before its factory step; the attest job,
    # which alone holds the attestation token, never runs it (tests/unit/test_workflows.py)
    assert installs.pop("attest") == []
    assert all(found == installs["plan"] and len(found) == 1 for found in installs.values()), installs
    (install,) = (s for s in jobs["plan"]["steps"] if s.get("name") == "Install the factory")
    steps = {"install": Step(job="plan", run=install["run"], env=install.get("env", {}))}
    assert jobs["audit"]["needs"] == ["plan", "build", "index"]
    for name in ("plan", "build", "index", "audit"):
        # the factory's step: the one after its install
        runs = [s for s in jobs[name]["steps"] if "run" in s]
        factory_step = runs[[s.get("name") for s in runs].index("Install the factory") + 1]
        steps[name] = Step(job=name, run=factory_step["run"], env=factory_step.get("env", {}))
    (digests,) = (
        s for s in jobs["build"]["steps"] if s.get("name", "").startswith("List the published wheels")
    )
    steps["digests"] = Step(job="build", run=digests["run"], env=digests.get("env", {}))
    assert jobs["plan"]["steps"][-1]["id"] == "plan"
    return steps


def inputs_of() -> dict[str, str]:
    doc = YAML(typ="safe").load(WORKFLOW.read_text())
    declared = doc["on"]["workflow_call"]["inputs"]
    return {name: str(spec.get("default", "")) for name, spec in declared.items()}


def expand(value: str, context: Mapping[str, Mapping[str, str]]) -> str:
    def one(match: re.Match[str]) -> str:
        return context[match.group(1)][match.group(2)]

    def gated(match: re.Match[str]) -> str:
        return context["secrets"][match.group(2)] if context["needs"][match.group(1)] == "true" else ""

    out = EXPRESSION.sub(one, GATED.sub(gated, str(value)))
    assert "${{" not in out, f"the play cannot evaluate {value!r}"
    return out


def clean_env() -> dict[str, str]:
    """This process's environment without AWS credentials and with nothing of the checkout on the factory's
    path: it runs as installed."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "PYTHONPATH"}


@dataclass
class Runner:
    """One machine of the workflow: its checkout, $RUNNER_TEMP and $FACTORY_HOME."""

    root: Path

    @classmethod
    def make(cls, root: Path, matrix_text: str, *, factory: Path | None = None) -> Runner:
        """A runner; `factory`: the venv an "Install the factory" step made, else the runner installs it."""
        checkout = root / "checkout"
        shutil.copytree(ROOT / "examples" / "demo-ext", checkout / "demo-ext")
        (checkout / "matrix.yaml").write_text(matrix_text)
        (root / "temp").mkdir()
        if factory is not None:
            (root / "temp" / "factory").symlink_to(factory, target_is_directory=True)
        home = root / "home"
        home.mkdir()
        shared = Path(os.environ["FACTORY_HOME"]) / "wheelhouses"
        (home / "wheelhouses").symlink_to(shared.resolve(), target_is_directory=True)
        return cls(root=root)

    def start(self, step: Step, context: Mapping[str, Mapping[str, str]]) -> subprocess.Popen[str]:
        env = clean_env()
        env.update({k: expand(v, context) for k, v in step.env.items()})
        output = self.root / "github_output"
        output.write_text("")
        env.update(
            RUNNER_TEMP=str(self.root / "temp"),
            GITHUB_OUTPUT=str(output),
            FACTORY_HOME=str(self.root / "home"),
            GITHUB_ACTIONS="true",
        )
        # GitHub's `shell: bash` on Linux
        argv = ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", expand(step.run, context)]
        return subprocess.Popen(
            argv,
            cwd=self.root / "checkout",
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def outputs(self) -> dict[str, str]:
        lines = (self.root / "github_output").read_text().splitlines()
        return dict(line.split("=", 1) for line in lines)


def finish(proc: subprocess.Popen[str], timeout: float, *, returncode: int = 0) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == returncode, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    return out


def problems_by_key(out: str) -> dict[str, list[str]]:
    """The audit's problem lines ("problem: KEY: CHECK: what") as the checks that found each key's."""
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        if line.startswith("problem: "):
            where, check, _what = line.removeprefix("problem: ").split(": ", 2)
            found.setdefault(where, []).append(check)
    return found


def plant_wrong_wheels(
    built: Mapping[str, Path], directory: Path, *, publish: Any, tamper: Any, unsign: Any
) -> dict[str, str]:
    """Wrong wheels in an index the play published: the sm80 build relabelled as an sm86 wheel (wrong archs)
    and the sm90 build as a torch 2.13 one (its pin still torch 2.14's), both published and signed as any
    other (`publish`); the sm80 wheel's bytes swapped (`tamper`); the sm90 wheel's signature removed
    (`unsign`). The store key of each and the check that must find it."""
    sm80, sm90 = built["cu130-torch2.14-abi1-sm80"], built["cu130-torch2.14-abi1-sm90"]
    archs = relabelled(sm80, "cu13.0.torch2.14.abi1.sm86", directory)
    pin = relabelled(sm90, "cu13.0.torch2.13.abi1.sm90", directory)
    publish([archs, pin])

    def key(variant_id: str, wheel: Path) -> str:
        return index.files_path(variant_id, canonical_wheel_filename(wheel.name))

    tampered, unsigned = key("cu130-torch2.14-abi1-sm80", sm80), key("cu130-torch2.14-abi1-sm90", sm90)
    data = bytearray(sm80.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tamper(tampered, bytes(data))
    unsign(index.signature_path("cu130-torch2.14-abi1-sm90", canonical_wheel_filename(sm90.name)))
    return {
        key("cu130-torch2.14-abi1-sm86", archs): "device-code",
        key("cu130-torch2.13-abi1-sm90", pin): "torch-pin",
        tampered: "page",
        unsigned: "signature",
    }


def assert_found(out: str, planted: Mapping[str, str]) -> None:
    found = problems_by_key(out)
    for key, check in planted.items():
        assert check in found.get(key, []), (key, check, out[-4000:])
    assert set(found) == set(planted), out[-4000:]  # the wheels the play built, untouched, are clean
    assert found[next(k for k, c in planted.items() if c == "signature")] == ["signature"], out[-4000:]


def files_containing(root: Path, needle: bytes) -> list[str]:
    found = []
    for top, _dirs, names in os.walk(root):  # not into the shared wheelhouse (a symlink)
        for name in names:
            path = Path(top) / name
            if not path.is_symlink() and needle in path.read_bytes():
                found.append(str(path))
    return found


def test_the_workflow_played_by_parallel_runners_publishes_every_wheel_once(
    tmp_path: Path,
    moto: Moto,  # noqa: F811
    docker_client: Any,
    factory_wheel: Path,
) -> None:
    steps = workflow_steps()
    moto.bucket(BUCKET)
    matrix_text = matrices.matrix_text(
        matrices.DEMO,
        absolute_source=False,  # the checkout's demo-ext, beside the matrix
        matrix={"arch": ["8.0", "9.0"]},
        build={"memory": "4GiB", "cpus": 1},
        publish={"to": f"s3://{BUCKET}/{PREFIX}", "endpoint_url": moto.endpoint},
    )
    secret = "play-" + secrets.token_hex(16)
    cache_private, cache_public = signing.generate_key()
    cache_key = cache_private.decode().splitlines()[1]  # what of the cache's private key must never show
    sign_key, sign_pub = signing.generate_key()
    context: dict[str, dict[str, str]] = {
        "inputs": {
            **inputs_of(),
            "matrix": "matrix.yaml",
            "factory": str(factory_wheel),
            "verify-key": "play.pub",
            "cache-public-keys": cache_public.decode(),
        },
        "secrets": {
            "AWS_ACCESS_KEY_ID": "AKIAPLAYRUNNER",
            "AWS_SECRET_ACCESS_KEY": secret,
            "FACTORY_CACHE_SIGN_KEY": cache_private.decode(),
            "FACTORY_SIGN_KEY": sign_key.decode(),
        },
        "matrix": {},
        "needs": {"cache_writer": "true"},  # a scheduled run: trusted, it writes the shared compile cache
    }
    started = time.monotonic()

    # plan: the factory installed from its wheel; the plan's real output is the build matrix
    planner = Runner.make(tmp_path / "plan", matrix_text)
    finish(planner.start(steps["install"], context), timeout=1800)
    factory = planner.root / "temp" / "factory"
    said = finish(planner.start(steps["plan"], context), timeout=300)
    plan = planner.outputs()
    include = json.loads(plan["matrix"])["include"]
    job_ids = sorted(j["job_id"] for j in include)
    assert job_ids == ["cu130-torch2.14-abi1-sm80-py311", "cu130-torch2.14-abi1-sm90-py311"], said
    assert plan["count"] == "2"
    # one runner per job by default: no shard job runs
    assert plan["shard_count"] == "0", plan
    # each on a runner of its platform: x86_64 jobs on build-runs-on (the plan emits, GitHub reads it)
    x86_runner = json.loads(context["inputs"]["build-runs-on"])
    assert [j["runs_on"] for j in include] == [x86_runner] * 2, include

    # the same plan for both platforms, the caller naming its own Arm runner: each aarch64 job gets that one,
    # so that it builds natively there, never emulated (planned only: the play builds the x86_64 jobs)
    both = matrices.matrix_text(
        matrices.DEMO,
        absolute_source=False,
        matrix={"arch": ["8.0", "9.0"], "platform": ["x86_64", "aarch64"]},
        build={"memory": "4GiB", "cpus": 1},
        publish={"to": f"s3://{BUCKET}/{PREFIX}", "endpoint_url": moto.endpoint},
    )
    arm = Runner.make(tmp_path / "plan-arm", both, factory=factory)
    arm_inputs = {**context["inputs"], "aarch64-build-runs-on": '["self-hosted", "linux", "ARM64"]'}
    said_arm = finish(arm.start(steps["plan"], {**context, "inputs": arm_inputs}), timeout=300)
    runs_on = {j["job_id"]: j["runs_on"] for j in json.loads(arm.outputs()["matrix"])["include"]}
    assert runs_on == {
        "cu130-torch2.14-abi1-sm80-py311": x86_runner,
        "cu130-torch2.14-abi1-sm90-py311": x86_runner,
        "cu130-torch2.14-abi1-sm80-py311-aarch64": ["self-hosted", "linux", "ARM64"],
        "cu130-torch2.14-abi1-sm90-py311-aarch64": ["self-hosted", "linux", "ARM64"],
    }, said_arm

    # build: one runner per matrix job, all at once
    runners = {
        j["job_id"]: Runner.make(tmp_path / f"runner-{n}", matrix_text, factory=factory)
        for n, j in enumerate(include)
    }
    procs = {
        job["job_id"]: runners[job["job_id"]].start(
            steps["build"], {**context, "matrix": {k: str(v) for k, v in job.items()}}
        )
        for job in include
    }
    outs = {job_id: finish(proc, timeout=1800) for job_id, proc in procs.items()}
    built = time.monotonic()

    reports = {
        job_id: json.loads((r.root / "temp" / "wheelhouse" / "report.json").read_text())
        for job_id, r in runners.items()
    }
    local: dict[str, str] = {}  # wheel filename -> sha256 of what its runner built
    wheels: dict[str, Path] = {}  # variant id -> the wheel its runner built
    for job_id, report in reports.items():
        assert [j["job_id"] for j in report["jobs"]] == [job_id]
        (job,) = report["jobs"]
        assert job["result"] == "ok", job.get("log_tail")
        wheel = runners[job_id].root / "temp" / "wheelhouse" / job["wheel"]
        local[canonical_wheel_filename(wheel.name)] = hashlib.sha256(wheel.read_bytes()).hexdigest()
        wheels[job["variant_id"]] = wheel
        assert re.search(rf"^published +{job['variant_id']}/\S+\.whl$", outs[job_id], re.M), outs[job_id]
        # the attest job's subjects: the sha256 of exactly the wheel this runner published
        context_of_job = {**context, "matrix": {"job_id": job_id}}
        finish(runners[job_id].start(steps["digests"], context_of_job), timeout=60)
        subjects = (runners[job_id].root / "temp" / "subjects" / f"{job_id}.sha256").read_text()
        assert subjects == f"{local[canonical_wheel_filename(wheel.name)]}  {wheel.name}\n", subjects

    # index: after every build
    indexer = Runner.make(tmp_path / "index", matrix_text, factory=factory)
    said = finish(indexer.start(steps["index"], context), timeout=300)
    assert "2 of 2 planned jobs published" in said, said
    assert said.rstrip().endswith("2 wheels in 2 variant indexes, 0 problems"), said
    # audit: after the index, every published wheel checked with the public key the caller names
    (indexer.root / "checkout" / "play.pub").write_bytes(sign_pub)
    audited = finish(indexer.start(steps["audit"], context), timeout=300)
    key_id = signing.key_id(signing.load_public_key(sign_pub, shown="the play's key"))
    assert f"2 wheels, 0 problems; signatures checked with {key_id}" in audited, audited
    assert json.loads((indexer.root / "temp" / "audit.json").read_text())["ok"] is True

    # every wheel exactly once, none lost, each the bytes its runner built
    keys = moto.keys(BUCKET, PREFIX)
    stored = [wheel for k in keys if (wheel := index.parse_wheel_key(k))]
    assert sorted(filename for _variant, filename in stored) == sorted(local)
    get = moto.getter(BUCKET, PREFIX)
    listed: list[str] = []
    project_states = [
        k for k in keys if (p := index.parse_page_key(k)) and p[0].kind == "project" and p[1] == "state"
    ]
    for key in project_states:
        data = get(key)
        assert data is not None
        for rec in index.records_from_project_json(data):
            listed.append(rec.filename)
            assert rec.sha256 == local[rec.filename]
    assert sorted(listed) == sorted(local)
    cells = index.cells_from_json(get("matrix.json") or b"")
    assert {(c.variant_id, c.status) for c in cells} == {
        ("cu130-torch2.14-abi1-sm80", "built"),
        ("cu130-torch2.14-abi1-sm90", "built"),
    }
    assert not [k for k in keys if "/." in k or k.startswith(".")], keys  # no temporaries left

    # each wheel signed on its runner with the workflow's key, the signature beside it
    public = signing.load_public_key(sign_pub, shown="the play's key")
    for variant, filename in stored:
        signature = get(index.signature_path(variant, filename))
        assert signature is not None, filename
        signing.check(signature, filename=filename, sha256=local[filename], key=public)

    # wrong wheels planted in the bucket: the audit step finds each, and exits 1
    signer = signing.make_signer(signing.load_private_key(sign_key, shown="play"), source="play")
    to, endpoint = f"s3://{BUCKET}/{PREFIX}", moto.endpoint
    planted = plant_wrong_wheels(
        wheels,
        tmp_path / "planted",
        publish=lambda found: publish_wheels(found, to=to, endpoint_url=endpoint, signer=signer),
        # the sha256 the upload recorded kept: only hashing the bytes tells
        tamper=lambda key, data: moto.client.put_object(
            Bucket=BUCKET, Key=f"{PREFIX}/{key}", Body=data, Metadata={"sha256": local[key.split("/")[-1]]}
        ),
        unsign=lambda key: moto.client.delete_object(Bucket=BUCKET, Key=f"{PREFIX}/{key}"),
    )
    audited = finish(indexer.start(steps["audit"], context), timeout=300, returncode=1)
    assert_found(audited, planted)
    report = json.loads((indexer.root / "temp" / "audit.json").read_text())
    assert report["ok"] is False and {p["where"] for p in report["problems"]} == set(planted)

    # the same in a local index: the runners' wheels and the planted ones published to a directory
    local_index = tmp_path / "local-index"
    publish_wheels(list(wheels.values()), to=str(local_index), signer=signer)

    def tamper_local(key: str, data: bytes) -> None:
        (local_index / key).write_bytes(data)

    planted = plant_wrong_wheels(
        wheels,
        tmp_path / "planted-local",
        publish=lambda found: publish_wheels(found, to=str(local_index), signer=signer),
        tamper=tamper_local,
        unsign=lambda key: (local_index / key).unlink(),
    )
    pub = indexer.root / "checkout" / "play.pub"
    audit_local = [
        str(factory / "bin" / "factory"),
        "index",
        "audit",
        "--to",
        str(local_index),
        "--key",
        str(pub),
    ]
    proc = subprocess.run(audit_local, capture_output=True, text=True, timeout=300, env=clean_env())
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert_found(proc.stdout, planted)

    # the secrets reached no output and no file a runner kept
    key_body = sign_key.decode().splitlines()[1]
    for out in [*outs.values(), said, audited]:
        assert secret not in out and cache_key not in out and key_body not in out
    assert files_containing(tmp_path, secret.encode()) == []
    assert files_containing(tmp_path, cache_key.encode()) == []
    assert files_containing(tmp_path, key_body.encode()) == []

    # a second scheduled run plans nothing: the `if:` of build and index leave them out, no runner starts
    again = Runner.make(tmp_path / "plan-again", matrix_text, factory=factory)
    said = finish(again.start(steps["plan"], context), timeout=300)
    assert again.outputs() == {
        "matrix": '{"include":[]}',
        "count": "0",
        "shards": '{"include":[]}',
        "shard_count": "0",
    }
    assert "chunk 1/1: 0 of its 2 jobs to build (2 in the matrix)" in said
    print(f"plan + 2 parallel builds: {built - started:.0f} s, all: {time.monotonic() - started:.0f} s")
