"""Publishing into a local index directory: layout, immutability, incremental pages, races, interruption."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from publish_helpers import (
    KILL_AFTER_METADATA,
    LABEL_NEW,
    LABEL_OLD,
    VID_NEW,
    VID_OLD,
    assert_consistent,
    make_wheel,
    page_files,
    publisher_script,
)

from factory.core.errors import ConfigError, PublishError
from factory.plan.plan import plan_matrix
from factory.publish import index
from factory.publish.publisher import inspect_wheel, publish_wheels, published_files, published_wheel
from factory.publish.stores import LocalStore
from factory.spec.config import load_matrix_file

pytestmark = pytest.mark.integration
HERE = Path(__file__).resolve().parent
FACTORY = str(Path(sys.executable).with_name("factory"))


def local_get(root: Path) -> Callable[[str], bytes | None]:
    def get(key: str) -> bytes | None:
        path = root / key
        return path.read_bytes() if path.is_file() else None

    return get


def keys_of(root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]


def test_layout_and_pages(tmp_path: Path) -> None:
    new = make_wheel(tmp_path / "wh", label=LABEL_NEW)
    old = make_wheel(tmp_path / "wh", label=LABEL_OLD)
    events: list[tuple[str, str]] = []
    result = publish_wheels([new, old], to=str(tmp_path / "idx"), progress=lambda e, k: events.append((e, k)))
    idx = tmp_path / "idx"
    assert {f.status for f in result.files} == {"published"}
    assert result.variant_ids == (VID_OLD, VID_NEW)
    for vid, wheel in ((VID_NEW, new), (VID_OLD, old)):
        assert (idx / "files" / vid / wheel.name).read_bytes() == wheel.read_bytes()
        assert (idx / "files" / vid / (wheel.name + ".metadata")).read_bytes().startswith(b"Metadata-Version")
        assert page_files(local_get(idx), vid, "tinyvar") == {
            f"simple/{vid}/tinyvar/index.json": {wheel.name},
            f"simple/{vid}/tinyvar/index.html": {wheel.name},
        }
        assert "tinyvar/" in (idx / "simple" / vid / "index.html").read_text()
    assert f'href="{VID_NEW}/"' in (idx / "simple" / "index.html").read_text()
    assert "tinyvar" in (idx / "index.html").read_text()
    assert_consistent(local_get(idx), keys_of(idx))
    # Safety order: every file and its metadata before any page.
    kinds = [e for e, _ in events]
    assert kinds.index("page") > max(i for i, e in enumerate(kinds) if e in {"file", "metadata"})


def test_same_bytes_is_a_noop_and_rewrites_nothing(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "wh")
    publish_wheels([wheel], to=str(tmp_path / "idx"))
    before = {k: (tmp_path / "idx" / k).stat().st_mtime_ns for k in keys_of(tmp_path / "idx")}
    result = publish_wheels([wheel], to=str(tmp_path / "idx"))
    assert [f.status for f in result.files] == ["unchanged"]
    assert result.pages_written == ()
    after = {k: (tmp_path / "idx" / k).stat().st_mtime_ns for k in keys_of(tmp_path / "idx")}
    assert after == before


def test_different_bytes_refused(tmp_path: Path) -> None:
    publish_wheels([make_wheel(tmp_path / "a")], to=str(tmp_path / "idx"))
    other = make_wheel(tmp_path / "b", payload="different")
    with pytest.raises(PublishError, match=r"refusing to overwrite files/.*a different file of that name"):
        publish_wheels([other], to=str(tmp_path / "idx"))
    published = tmp_path / "idx" / "files" / VID_NEW / other.name
    assert published.read_bytes() == (tmp_path / "a" / other.name).read_bytes()


def test_incremental_only_changed_project_pages(tmp_path: Path) -> None:
    publish_wheels(
        [make_wheel(tmp_path / "a", name="alpha"), make_wheel(tmp_path / "a", name="beta")],
        to=str(tmp_path / "idx"),
    )
    result = publish_wheels(
        [make_wheel(tmp_path / "b", name="alpha", version="0.2.0")], to=str(tmp_path / "idx")
    )
    touched = {k for k in result.pages_written if (p := index.parse_page_key(k)) and p[0].kind == "project"}
    assert touched == {f"simple/{VID_NEW}/alpha/index.json", f"simple/{VID_NEW}/alpha/index.html"}
    assert not any("/beta/" in k for k in result.pages_written)


def test_human_page_uses_report(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "wh")
    report = tmp_path / "wh" / "report.json"
    report.write_text(
        json.dumps(
            [
                {"job_id": "a", "variant_id": VID_NEW, "python": "py3", "result": "ok", "wheel": wheel.name},
                {"job_id": "b", "variant_id": VID_OLD, "python": "py3", "result": "oom", "wheel": None},
            ]
        )
    )
    subprocess.run([FACTORY, "publish", str(tmp_path / "wh"), "--to", str(tmp_path / "idx")], check=True)
    page = (tmp_path / "idx" / "index.html").read_text()
    assert page.count('class="built"') == 1 and page.count('class="failed"') == 1
    assert f"--index-url simple/{VID_NEW}/" in page


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nowhere"], "nowhere: no such directory"),
        (["{empty}"], "no .whl files"),
        (["{wh}", "--to", "s3://"], "not an s3://bucket/prefix URL"),
        (["{wh}", "--report", "{wh}/bad.json"], "bad.json:1: not JSON"),
    ],
)
def test_cli_errors_are_one_line_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    make_wheel(tmp_path / "wh")
    (tmp_path / "wh" / "bad.json").write_text("{nope")
    (tmp_path / "empty").mkdir()
    argv = [a.format(wh=tmp_path / "wh", empty=tmp_path / "empty") for a in args]
    proc = subprocess.run([FACTORY, "publish", *argv], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_wheel_without_variant_label_refused(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, label="local1")
    with pytest.raises(ConfigError, match="not a factory local version label"):
        inspect_wheel(wheel)


def test_refused_publish_exits_1_one_line(tmp_path: Path) -> None:
    publish_wheels([make_wheel(tmp_path / "a")], to=str(tmp_path / "idx"))
    make_wheel(tmp_path / "b", payload="x")
    proc = subprocess.run(
        [FACTORY, "publish", str(tmp_path / "b"), "--to", str(tmp_path / "idx")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert (
        proc.stderr.startswith("error: refusing to overwrite") and len(proc.stderr.strip().splitlines()) == 1
    )


def test_interrupted_publish_is_consistent_and_rerun_completes(tmp_path: Path) -> None:
    first = make_wheel(tmp_path / "a", version="0.1.0")
    publish_wheels([first], to=str(tmp_path / "idx"))
    second = make_wheel(tmp_path / "b", version="0.2.0")
    proc = subprocess.run([sys.executable, "-c", KILL_AFTER_METADATA, str(tmp_path / "idx"), "", str(second)])
    assert proc.returncode == -9  # killed between the wheel upload and the page
    idx = tmp_path / "idx"
    assert (idx / "files" / VID_NEW / second.name).is_file()
    listed = page_files(local_get(idx), VID_NEW, "tinyvar")
    assert all(names == {first.name} for names in listed.values())
    assert_consistent(local_get(idx), keys_of(idx))
    result = publish_wheels([second], to=str(idx))
    assert [f.status for f in result.files] == ["unchanged"]
    listed = page_files(local_get(idx), VID_NEW, "tinyvar")
    assert all(names == {first.name, second.name} for names in listed.values())
    assert_consistent(local_get(idx), keys_of(idx))


def test_concurrent_publishers_lose_nothing(tmp_path: Path) -> None:
    workers, rounds = 4, 20
    to = str(tmp_path / "idx")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", publisher_script(HERE, to, None, tmp_path / "wheels", w, rounds)],
            env={**os.environ, "PYTHONPATH": str(HERE)},
        )
        for w in range(workers)
    ]
    assert [p.wait() for p in procs] == [0] * workers
    expected = {
        f"tinyvar-1.{w}.{r}+{LABEL_NEW}-py3-none-any.whl" for w in range(workers) for r in range(rounds)
    }
    listed = page_files(local_get(tmp_path / "idx"), VID_NEW, "tinyvar")
    assert set(listed) == {f"simple/{VID_NEW}/tinyvar/index.json", f"simple/{VID_NEW}/tinyvar/index.html"}
    for names in listed.values():
        assert names == expected
    assert_consistent(local_get(tmp_path / "idx"), keys_of(tmp_path / "idx"))


def test_a_published_wheel_is_found_by_project_version_variant_and_python(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "w", name="tiny-var", label=LABEL_NEW, tag="cp311-cp311-linux_x86_64")
    store = LocalStore(tmp_path / "index")
    assert published_files(store, project="tiny-var", variant_id=VID_NEW) == ()  # nothing published yet
    publish_wheels([wheel], to=str(tmp_path / "index"))
    assert published_files(store, project="Tiny_Var", variant_id=VID_NEW) == (wheel.name,)
    assert published_files(store, project="tiny-var", variant_id=VID_OLD) == ()
    job = {"project": "Tiny_Var", "version": f"0.1.0+{LABEL_NEW}", "python": "3.11"}
    assert published_wheel([wheel.name], **job) == wheel.name
    for other in ({"python": "3.12"}, {"version": f"0.1.1+{LABEL_NEW}"}, {"project": "other"}):
        assert published_wheel([wheel.name], **{**job, **other}) is None, other
    assert published_wheel(["not-a-wheel.txt", "x-1.0.tar.gz"], **job) is None
    # a page this factory did not write is no evidence of anything published
    (tmp_path / "index" / "simple" / VID_NEW / "tiny-var" / "index.json").write_text("{not json")
    assert published_files(store, project="tiny-var", variant_id=VID_NEW) == ()


def test_build_skips_the_jobs_whose_wheel_is_already_published(
    tmp_path: Path, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    # a scheduled run of the same matrix builds nothing again: a rebuilt wheel differs in its bytes, and
    # publishing it would be refused
    demo = Path(__file__).resolve().parents[2] / "examples"
    text = (demo / "demo.yaml").read_text().replace("{path: demo-ext}", f"{{path: {demo / 'demo-ext'}}}")
    matrix = tmp_path / "m.yaml"
    matrix.write_text(text.replace("to: ./index", f"to: {tmp_path / 'index'}"))
    jobs = plan_matrix(load_matrix_file(matrix, trust_paths=True)).jobs
    assert len(jobs) == 2
    wheels = [
        make_wheel(tmp_path / "w", name="factory-demo-ext", label=j.variant.local_version,
                   tag="cp311-cp311-linux_x86_64")
        for j in jobs
    ]  # fmt: skip
    publish_wheels(wheels, to=str(tmp_path / "index"))
    code, output = factory_cli(
        ["build", "--trust-paths", "--matrix", str(matrix), "--publish", "-o", str(tmp_path / "out")]
    )
    assert code == 0, output
    for job, wheel in zip(jobs, wheels, strict=True):
        assert f"{job.id}: already published as {wheel.name}; skipped" in output
    assert "nothing to build" in output
    assert not (tmp_path / "out").exists()  # no container was started
    code, output = factory_cli(["build", "--trust-paths", "--matrix", str(matrix), "--rebuild", "--dry-run"])
    assert code == 2 and "--rebuild only applies with --publish" in output
