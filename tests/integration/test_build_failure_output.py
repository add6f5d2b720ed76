"""`factory build` without a terminal, for real (dockerd), on a failure that comes before any container: the
job's builder image cannot be pulled. Its output and report must name the job's log, and the log say why."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.matrices import DEMO, write_matrix

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# Nothing listens on port 1: the pull is refused at once, no registry is ever asked.
MISSING_IMAGE = "127.0.0.1:1/factory-test/missing:1"


@pytest.mark.parametrize(
    ("build", "says"),
    [
        ({"images": {"13.0": MISSING_IMAGE}}, "use flavor pypi"),
        # the devel flavor on a host that reaches no registry: its reason names the flavor that needs none
        ({"flavor": "devel", "base_image": MISSING_IMAGE}, "set `build.flavor: pypi` in the matrix file"),
    ],
)
def test_a_job_whose_image_cannot_be_pulled_names_its_log_and_says_why_once(
    tmp_path: Path,
    docker_client: Any,
    factory_cli: Callable[[list[str]], tuple[int, str]],
    build: dict[str, Any],
    says: str,
) -> None:
    matrix = write_matrix(
        DEMO,
        tmp_path / "matrix.yaml",
        matrix={"arch": ["9.0"], "python": ["3.11", "3.13"]},
        build=build,
        publish=None,
    )
    out = tmp_path / "out"
    code, text = factory_cli(["build", "-m", str(matrix), "--trust-paths", "-o", str(out), "--keep-going"])
    assert code == 1, text
    jobs = json.loads((out / "report.json").read_text())["jobs"]
    job = jobs[0]
    log = Path(job["log"])
    assert job["result"] == "failed" and job["reason"].startswith(f"cannot pull {MISSING_IMAGE}")
    assert says in job["reason"]
    assert log.read_text().startswith(f"factory: cannot pull {MISSING_IMAGE}")
    lines = text.splitlines()
    assert f"  log: {log}" in lines  # the summary
    assert f"{job['job_id']}: failed (why: in the summary; log: {log})" in lines  # as it failed
    # said once, in the summary, though every job failed of it (the second one names the first)
    assert text.count(f"cannot pull {MISSING_IMAGE}") == 1, text
    assert [j["result"] for j in jobs] == ["failed", "failed"]
    assert any(line.startswith(jobs[1]["job_id"]) and f"as {job['job_id']}" in line for line in lines)
    assert json.loads((out / "report.json").read_text())["source"] == {
        "kind": "path", "sdist": None, "sha256": None, "commit": None
    }  # fmt: skip
