"""bench/new_torch.py's pure parts: the local torch index it offers versions on, its lock, its table."""

from __future__ import annotations

import fcntl
import hashlib
import json
from pathlib import Path

import pytest

from bench import docs as D
from bench import new_torch
from factory.core import simpleapi

WHEELS = {
    "2.12.1": "torch-2.12.1-cp311-cp311-manylinux_2_28_x86_64.whl",
    "2.14.1": "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl",
}


def torch_index(root: Path) -> new_torch.TorchIndex:
    files = new_torch.torch_files(root)
    files.mkdir(parents=True)
    for version, name in WHEELS.items():
        (files / name).write_bytes(f"not really torch {version}".encode())
    return new_torch.TorchIndex(root=root, wheels={v: files / n for v, n in WHEELS.items()})


def listed(root: Path) -> list[tuple[str, str]]:
    """(file name, the page's href resolved to a path) of each anchor on the torch project page."""
    page = root / "simple" / "cu130" / "torch" / "index.html"
    out = []
    for anchor in simpleapi.parse_anchors(page.read_text()):
        href, _, digest = anchor.href.partition("#sha256=")
        target = (page.parent / href).resolve()
        assert digest == hashlib.sha256(target.read_bytes()).hexdigest()
        out.append((anchor.text, str(target.relative_to(root))))
    return out


def test_the_index_offers_exactly_the_versions_given_each_time(tmp_path: Path) -> None:
    t = torch_index(tmp_path)
    assert t.url == (tmp_path / "simple" / "cu130").as_uri() + "/"
    t.offer(["2.12.1"])
    assert listed(tmp_path) == [(WHEELS["2.12.1"], f"files/cu130/{WHEELS['2.12.1']}")]
    t.offer(["2.12.1", "2.14.1"])
    assert [name for name, _ in listed(tmp_path)] == [WHEELS["2.12.1"], WHEELS["2.14.1"]]
    t.offer(["2.12.1"])  # a repeat of the play starts from one torch again
    assert [name for name, _ in listed(tmp_path)] == [WHEELS["2.12.1"]]
    root_page = (tmp_path / "simple" / "cu130" / "index.html").read_text()
    assert [a.text for a in simpleapi.parse_anchors(root_page)] == ["torch"]
    assert not list(tmp_path.rglob(".*.tmp"))


def test_wheels_already_kept_are_not_downloaded_again(tmp_path: Path) -> None:
    t = torch_index(tmp_path)
    assert new_torch.fetch_torch_wheels(tmp_path) == t.wheels


def test_the_index_is_held_by_one_process_at_a_time(tmp_path: Path) -> None:
    with (
        new_torch.held(tmp_path),
        (tmp_path / ".lock").open("w") as other,
        pytest.raises(BlockingIOError),
    ):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with (tmp_path / ".lock").open("w") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again


def repeat(total: float, **parts: float) -> dict[str, float]:
    base = {"plan_s": 1.0, "wheelhouse_s": 2.0, "job_s": 3.0, "build_rest_s": 4.0, "index_check_s": 0.5}
    return {"new_torch_to_published_s": total, **base, **parts}


def test_the_table_gives_the_median_and_spread_of_each_part(tmp_path: Path) -> None:
    runs = [repeat(200.0), repeat(100.0, job_s=5.0), repeat(150.0)]
    (tmp_path / "new-torch.json").write_text(json.dumps({"repeats": runs}))
    lines = D.new_torch(tmp_path).splitlines()
    assert lines[0] == "| part | median of 3 | min-max |"
    assert (
        lines[2]
        == "| the whole: new torch on the index to its wheel published | **150.0 s** | 100.0-200.0 s |"
    )
    assert "| the job in its container (install, compile, checks) | 3.0 s | 3.0-5.0 s |" in lines


def test_one_run_is_shown_as_one_run(tmp_path: Path) -> None:
    (tmp_path / "new-torch.json").write_text(json.dumps({"repeats": [repeat(90.0)]}))
    lines = D.new_torch(tmp_path).splitlines()
    assert lines[0] == "| part | median of 1 | min-max |"
    assert lines[2].endswith("| **90.0 s** | one run |")
