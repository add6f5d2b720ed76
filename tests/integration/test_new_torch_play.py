"""Issue 34's play: a new torch on the index is built and published by the next scheduled run, nobody having
touched the matrix (bench/new_torch.py holds the play; this test asserts what each run does).

The matrix asks for `torch: [">=2.12"]` from a local torch index (real CUDA 13.0 torch wheels for CPython
3.11, kept across sessions beside the wheelhouse cache: the index's URL never changes, so neither do the
wheelhouses keyed by it). Run 1, with torch 2.12.1 alone on the index, plans and publishes torch 2.12's one
job; torch 2.14.1 appears; run 2 plans exactly torch 2.14's job and publishes it; run 3 plans nothing. Each
torch is one real demo-extension build (one Python, one arch set).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import pytest

from bench import new_torch
from factory.publish import index

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FIRST_JOB = "cu130-torch2.12-abi1-sm80-py311"
NEW_JOB = "cu130-torch2.14-abi1-sm80-py311"


@pytest.fixture(scope="module")
def torch_index(session_factory_home: Path) -> Iterator[new_torch.TorchIndex]:
    shared = (session_factory_home / "wheelhouses").resolve().parent / new_torch.CACHE_DIR
    with new_torch.held(shared):
        yield new_torch.TorchIndex(root=shared, wheels=new_torch.fetch_torch_wheels(shared))


def published_wheel(published: Path, job_id: str, tmp: Path) -> Path:
    """The demo wheel of `job_id`'s variant as pip finds it on the published index (a real `pip download`
    from the variant's page: the index serves it to a consumer)."""
    variant = job_id.rsplit("-", 1)[0]
    dest = tmp / variant
    # --isolated: the published index alone, none of the host's pip configuration; this host is the consumer
    args = [sys.executable, "-m", "pip", "--isolated", "download", "--no-deps", "--dest", str(dest)]
    args += ["--index-url", (published / index.variant_dir(variant)).as_uri(), "factory-demo-ext"]
    args += ["--only-binary=:all:", "--python-version", new_torch.PYTHON]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (wheel,) = dest.glob("*.whl")
    return wheel


def torch_requirement(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(name).decode())
    (torch,) = [r for r in metadata.get_all("Requires-Dist") or [] if r.startswith("torch")]
    return torch


def test_a_new_torch_on_the_index_is_built_and_published_by_the_next_scheduled_run(
    tmp_path: Path, torch_index: new_torch.TorchIndex, docker_client: object
) -> None:
    published = tmp_path / "index"
    matrix = new_torch.play_matrix(
        tmp_path / "matrix.yaml", torch_index=torch_index.url, publish_to=published
    )
    text = matrix.read_text()

    torch_index.offer([new_torch.FIRST])
    first = new_torch.scheduled_run(matrix, tmp_path / "run1")
    assert first.job_ids == (FIRST_JOB,), first.plan_output
    assert first.ok, [b.log_tail for b in first.builds]

    # the new torch appears on the index; nobody edits the matrix
    torch_index.offer([new_torch.FIRST, new_torch.NEW])
    second = new_torch.scheduled_run(matrix, tmp_path / "run2")
    assert second.job_ids == (NEW_JOB,), second.plan_output
    assert second.ok, [b.log_tail for b in second.builds]

    third = new_torch.scheduled_run(matrix, tmp_path / "run3")
    assert third.job_ids == (), third.plan_output
    assert third.index_s is None  # the workflow's index job is skipped on an empty plan
    assert matrix.read_text() == text

    # both torches' wheels on the index, each pinned to its torch
    wheels = {job: published_wheel(published, job, tmp_path / "downloads") for job in (FIRST_JOB, NEW_JOB)}
    assert torch_requirement(wheels[FIRST_JOB]).replace(" ", "") == "torch==2.12.*"
    assert torch_requirement(wheels[NEW_JOB]).replace(" ", "") == "torch==2.14.*"
