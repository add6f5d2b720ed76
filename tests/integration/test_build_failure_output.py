"""`factory build` without a terminal, for real (dockerd), on a failure that comes before any container: the
job's builder image cannot be pulled. Its output and report must name the job's log, and the log say why."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.matrices import DEMO, write_matrix

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# Nothing listens on port 1: the pull is refused at once, no registry is ever asked.
MISSING_IMAGE = "127.0.0.1:1/factory-test/missing:1"


def test_a_job_whose_image_cannot_be_pulled_names_its_log(
    tmp_path: Path, docker_client: Any, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    matrix = write_matrix(
        DEMO,
        tmp_path / "matrix.yaml",
        matrix={"arch": ["9.0"]},
        build={"images": {"13.0": MISSING_IMAGE}},
        publish=None,
    )
    out = tmp_path / "out"
    code, text = factory_cli(["build", "-m", str(matrix), "--trust-paths", "-o", str(out)])
    assert code == 1, text
    [job] = json.loads((out / "report.json").read_text())["jobs"]
    log = Path(job["log"])
    assert job["result"] == "failed" and job["reason"].startswith(f"cannot pull {MISSING_IMAGE}")
    assert log.read_text().startswith(f"factory: cannot pull {MISSING_IMAGE}")
    lines = text.splitlines()
    assert f"  log: {log}" in lines  # the summary
    failure = re.compile(
        rf"^{re.escape(job['job_id'])}: failed: cannot pull .* \(log: {re.escape(str(log))}\)$"
    )
    assert sum(1 for line in lines if failure.match(line)) >= 2  # as it failed, and after the summary
    assert json.loads((out / "report.json").read_text())["source"] == {
        "kind": "path", "sdist": None, "sha256": None, "commit": None
    }  # fmt: skip
