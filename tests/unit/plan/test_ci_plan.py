"""The CI plan (factory.plan.ci, factory.build.pipeline.plan_ci, `factory matrix --format github
--unpublished`): chunks
cover every job once, a plan never exceeds what one GitHub matrix holds, published jobs are left out."""

from __future__ import annotations

import dataclasses
import itertools
import json
import textwrap
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from factory.build.pipeline import plan_ci
from factory.cli import app
from factory.core.errors import ConfigError
from factory.plan.ci import (
    MAX_MATRIX_JOBS,
    Chunk,
    chunk_of,
    chunks_needed,
    github_matrix,
    github_outputs,
    parse_chunk,
    too_many,
)
from factory.plan.plan import plan_matrix
from factory.publish.publisher import publish_wheels, published_wheel
from factory.spec.config import load_matrix_file
from factory.spec.options import PublishOptions
from factory.wheel.checks import record_hash

ROOT = Path(__file__).resolve().parents[3]
runner = CliRunner()


def test_parse_chunk() -> None:
    assert parse_chunk("2/3") == Chunk(index=2, count=3)
    assert parse_chunk(" 1 / 1 ") == Chunk()
    assert str(Chunk(index=2, count=5)) == "2/5"
    for bad in ("0/2", "3/2", "1", "a/b", "1/0", "-1/2"):
        with pytest.raises(ConfigError, match=f"--chunk '{bad}'"):
            parse_chunk(bad)


@given(total=st.integers(0, 2000), count=st.integers(1, 40))
def test_chunks_cover_every_job_once_and_differ_by_at_most_one(total: int, count: int) -> None:
    items = list(range(total))
    parts = [chunk_of(items, Chunk(index=i, count=count)) for i in range(1, count + 1)]
    assert [x for part in parts for x in part] == items
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@given(total=st.integers(0, 5000))
def test_the_chunks_needed_each_fit_one_matrix(total: int) -> None:
    need = chunks_needed(total)
    items = list(range(total))
    assert all(
        len(chunk_of(items, Chunk(index=i, count=need))) <= MAX_MATRIX_JOBS for i in range(1, need + 1)
    )
    assert need == 1 or total > MAX_MATRIX_JOBS * (need - 1)  # the fewest


def test_too_many_says_how_to_chunk() -> None:
    assert too_many(planned=300, left=256, total=300, chunk=Chunk()) is None
    said = too_many(planned=600, left=600, total=600, chunk=Chunk())
    assert said == (
        "chunk 1/1 has 600 jobs to build (of 600 planned), more than the 256 a GitHub matrix allows: "
        "plan the 600 jobs in 3 chunks, calling the workflow with chunk 1/3, 2/3, 3/3"
    )
    said = too_many(planned=1100, left=1100, total=1100, chunk=Chunk())
    assert said is not None and said.endswith(
        "in 5 chunks, calling the workflow with chunk 1/5, 2/5, 3/5, ..."
    )


def test_github_outputs_are_one_line_each() -> None:
    jobs = [{"job_id": "a", "notes": ["two\nlines"]}, {"job_id": "b"}]
    out = github_outputs(jobs)
    lines = out.splitlines()
    assert len(lines) == 2 and out.endswith("\n")
    assert lines[0] == f"matrix={github_matrix(jobs)}"
    assert json.loads(lines[0].removeprefix("matrix=")) == {"include": jobs}
    assert lines[1] == "count=2"
    assert github_outputs([]) == 'matrix={"include":[]}\ncount=0\n'


def _wheel(directory: Path, name: str, version: str, tag: str) -> Path:
    """A minimal wheel of the demo project at `version` (with its variant label)."""
    module = name.replace("-", "_")
    dist_info = f"{module}-{version}.dist-info"
    files = {
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n".encode(),
        f"{dist_info}/WHEEL": f"Wheel-Version: 1.0\nRoot-Is-Purelib: no\nTag: {tag}\n".encode(),
    }
    record = [f"{n},{record_hash(d)},{len(d)}" for n, d in files.items()]
    files[f"{dist_info}/RECORD"] = ("\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{module}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in files.items():
            zf.writestr(n, d)
    return path


def _demo(tmp_path: Path) -> Path:
    text = (ROOT / "examples" / "demo.yaml").read_text()
    text = text.replace("{path: demo-ext}", f"{{path: {ROOT / 'examples' / 'demo-ext'}}}")
    path = tmp_path / "m.yaml"
    path.write_text(text.replace("to: ./index", f"to: {tmp_path / 'index'}"))
    return path


def test_plan_ci_leaves_out_what_is_published(tmp_path: Path) -> None:
    mf = load_matrix_file(_demo(tmp_path), trust_paths=True)
    jobs = plan_matrix(mf).jobs
    assert len(jobs) == 2
    said: list[str] = []
    plan = plan_ci(mf, jobs, chunk=Chunk(), skip_published=True, log=said.append)
    assert [j.id for j in plan.jobs] == [j.id for j in jobs] and (plan.planned, plan.total) == (2, 2)
    first = jobs[0]
    wheel = _wheel(tmp_path / "w", mf.package.name, first.variant.full_version, "cp311-cp311-linux_x86_64")
    publish_wheels([wheel], to=mf.publish.to)
    plan = plan_ci(mf, jobs, chunk=Chunk(), skip_published=True, log=said.append)
    assert [j.id for j in plan.jobs] == [jobs[1].id]
    assert said == [f"{first.id}: already published as {wheel.name}; skipped (--rebuild builds it again)"]
    # a chunk is a slice of the whole matrix, whatever is published
    assert [
        j.id for j in plan_ci(mf, jobs, chunk=parse_chunk("1/2"), skip_published=True, log=said.append).jobs
    ] == []
    second = plan_ci(mf, jobs, chunk=parse_chunk("2/2"), skip_published=False, log=said.append)
    assert [j.id for j in second.jobs] == [jobs[1].id] and second.planned == 1


def test_plan_ci_without_skipping_opens_no_store(tmp_path: Path) -> None:
    mf = load_matrix_file(_demo(tmp_path), trust_paths=True)
    taken = tmp_path / "taken"
    taken.write_text("a file: opening it as a store would fail")
    mf = dataclasses.replace(mf, publish=PublishOptions(to=str(taken)))
    plan = plan_ci(mf, plan_matrix(mf).jobs, chunk=Chunk(), skip_published=False, log=print)
    assert len(plan.jobs) == 2


def test_cli_plan_writes_the_github_outputs(tmp_path: Path) -> None:
    matrix = _demo(tmp_path)
    out = tmp_path / "github_output"
    out.write_text("earlier=1\n")
    args = ["matrix", "--trust-paths", "-m", str(matrix), "-f", "github", "--unpublished"]
    result = runner.invoke(app, [*args, "--github-output", str(out)])
    assert result.exit_code == 0, result.output
    lines = out.read_text().splitlines()
    assert lines[0] == "earlier=1" and lines[2] == "count=2"
    matrix_json = json.loads(lines[1].removeprefix("matrix="))
    assert [j["job_id"] for j in matrix_json["include"]] == [
        "cu130-torch2.14-abi1-sm80-py311",
        "cu130-torch2.14-abi1-sm90.120-py311",
    ]
    assert "chunk 1/1: 2 of its 2 jobs to build (2 in the matrix)" in result.output


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--json", "--unpublished"], "apply to --format github only"),
        (["-f", "github", "--chunk", "3/2"], "--chunk '3/2': I must be between 1 and K"),
    ],
)
def test_cli_plan_usage_errors(
    tmp_path: Path, extra: list[str], said: str, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    code, output = factory_cli(["matrix", "--trust-paths", "-m", str(_demo(tmp_path)), *extra])
    assert code == 2 and len(output.strip().splitlines()) == 1 and said in output, output


def test_cli_plan_never_emits_more_than_a_github_matrix_holds(
    tmp_path: Path, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    archs = ["8.0", "8.6", "9.0", "10.0", "12.0"]
    sets = [";".join(c) for r in (1, 2, 3) for c in itertools.combinations(archs, r)][:17]
    path = tmp_path / "big.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            package: {{name: flash-attn, version: "2.8.3"}}
            matrix:
              cuda: ["12.8", "13.0"]
              torch: ["2.9", "2.10"]
              python: ["3.10", "3.11", "3.12", "3.13"]
              cxx11_abi: [true]
              arch: {json.dumps(sets)}
            """
        )
    )
    out = tmp_path / "github_output"
    code, output = factory_cli(["matrix", "-m", str(path), "-f", "github", "--github-output", str(out)])
    assert code == 2 and not out.exists()
    assert output.strip() == (
        f"error: {path}: chunk 1/1 has 272 jobs to build (of 272 planned), more than the 256 a GitHub matrix "
        "allows: plan the 272 jobs in 2 chunks, calling the workflow with chunk 1/2, 2/2"
    )
    seen = []
    for chunk in ("1/2", "2/2"):
        code, output = factory_cli(["matrix", "-m", str(path), "-f", "github", "--chunk", chunk])
        assert code == 0, output
        matrix_line = next(line for line in output.splitlines() if line.startswith("{"))
        seen += [j["job_id"] for j in json.loads(matrix_line)["include"]]
    assert len(seen) == len(set(seen)) == 272


def test_unpublished_counts_per_platform(
    tmp_path: Path, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    """One variant's page lists every platform's wheels: an aarch64 job is left to build while only its
    x86_64 sibling's wheel is published, and the other way round."""
    text = _demo(tmp_path).read_text()
    assert 'arch: ["8.0", "9.0;12.0"]' in text
    text = text.replace('arch: ["8.0", "9.0;12.0"]', 'arch: ["8.0"]\n  platform: [x86_64, aarch64]')
    tags = {"x86_64": "cp311-cp311-linux_x86_64", "aarch64": "cp311-cp311-manylinux_2_28_aarch64"}

    def planned(path: Path) -> list[str]:
        code, out = factory_cli(["matrix", "--trust-paths", "-m", str(path), "-f", "github", "--unpublished"])
        assert code == 0, out
        (line,) = [line for line in out.splitlines() if line.startswith("{")]
        return [j["job_id"] for j in json.loads(line)["include"]]

    for first, then in (("x86_64", "aarch64"), ("aarch64", "x86_64")):
        path = tmp_path / first / "m.yaml"
        path.parent.mkdir()
        path.write_text(text.replace(f"to: {tmp_path / 'index'}", f"to: {tmp_path / first / 'index'}"))
        mf = load_matrix_file(path, trust_paths=True)
        jobs = {j.platform.name: j for j in plan_matrix(mf).jobs}
        assert sorted(jobs) == ["aarch64", "x86_64"] and jobs["aarch64"].variant == jobs["x86_64"].variant
        assert planned(path) == [jobs["x86_64"].id, jobs["aarch64"].id]
        version = jobs[first].variant.full_version
        publish_wheels(
            [_wheel(tmp_path / first / "w", mf.package.name, version, tags[first])], to=mf.publish.to
        )
        assert planned(path) == [jobs[then].id], first
        publish_wheels(
            [_wheel(tmp_path / first / "w2", mf.package.name, version, tags[then])], to=mf.publish.to
        )
        assert planned(path) == [], first


def test_published_wheel_is_per_platform() -> None:
    from factory.core.platforms import DEFAULT_PLATFORM, named

    arm = named("aarch64")
    x86 = "demo-1.0+cu13-cp311-cp311-manylinux_2_28_x86_64.whl"
    arm_wheel = "demo-1.0+cu13-cp311-cp311-manylinux_2_28_aarch64.whl"
    job = {"project": "demo", "version": "1.0+cu13", "python": "3.11"}
    assert published_wheel([arm_wheel, x86], **job, platform=DEFAULT_PLATFORM) == x86
    assert published_wheel([x86, arm_wheel], **job, platform=arm) == arm_wheel
    assert published_wheel([x86], **job, platform=arm) is None
    assert published_wheel([arm_wheel], **job, platform=DEFAULT_PLATFORM) is None
    assert published_wheel([arm_wheel], **job) == arm_wheel  # no platform asked: any
    abi3 = "demo-1.0+cu13-cp39-abi3-linux_aarch64.whl"
    assert published_wheel([abi3], **job, limited_api="cp39", platform=arm) == abi3
    assert published_wheel([abi3], **job, limited_api="cp39", platform=DEFAULT_PLATFORM) is None
