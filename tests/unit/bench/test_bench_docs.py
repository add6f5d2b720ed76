"""docs/BENCHMARKS.md's tables are what bench/results renders (bench.docs); the marker rewriting itself."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # bench/ is not an installed package

from bench import docs as D  # noqa: E402


def test_benchmarks_md_is_what_the_results_render() -> None:
    text = D.DOC.read_text()
    assert D.render(text, D.RESULTS) == text, "docs/BENCHMARKS.md is stale: run `make bench-docs`"


def test_every_table_is_in_the_doc() -> None:
    text = D.DOC.read_text()
    missing = [name for name in D.TABLES if f"<!-- bench:{name} -->" not in text]
    assert missing == []


def fake(results: Path) -> str:
    return table_of(json.loads((results / "x.json").read_text()))


def table_of(data: dict[str, int]) -> str:
    return D.table(["k", "v"], sorted(data.items()))


def test_render_rewrites_only_between_markers(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text(json.dumps({"b": 2, "a": 1}))
    text = "# Title\n\nprose stays\n\n<!-- bench:x -->\nold table\n<!-- /bench:x -->\n\nmore prose\n"
    out = D.render(text, tmp_path, {"x": fake})
    assert out == (
        "# Title\n\nprose stays\n\n<!-- bench:x -->\n\n| k | v |\n|---|---|\n| a | 1 |\n| b | 2 |\n\n"
        "<!-- /bench:x -->\n\nmore prose\n"
    )
    assert D.render(out, tmp_path, {"x": fake}) == out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a\n<!-- bench:x -->\nb\n", "line 2: <!-- bench:x --> is not closed by <!-- /bench:x -->"),
        ("<!-- bench:x -->\n<!-- bench:x -->\n<!-- /bench:x -->\n", "line 1: <!-- bench:x --> is not closed"),
        ("<!-- /bench:x -->\n", "line 1: <!-- /bench:x --> without its opening marker"),
        ("\n\n<!-- bench:nope -->\n<!-- /bench:nope -->\n", "line 3: no table named 'nope'"),
    ],
)
def test_bad_markers_are_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(D.DocsError) as e:
        D.render(text, tmp_path, {"x": fake})
    assert str(e.value).startswith(message)
    assert "\n" not in str(e.value)


def test_a_missing_or_garbled_results_file_is_one_line(tmp_path: Path) -> None:
    text = "<!-- bench:x -->\n<!-- /bench:x -->\n"
    with pytest.raises(D.DocsError, match=r"x\.json: No such file"):
        D.render(text, tmp_path, {"x": lambda r: str(D.load(r, "x.json"))})
    (tmp_path / "x.json").write_text("{")
    with pytest.raises(D.DocsError, match=r"x\.json: not JSON"):
        D.render(text, tmp_path, {"x": lambda r: str(D.load(r, "x.json"))})
    (tmp_path / "memory.json").write_text(json.dumps({"model": {}}))
    with pytest.raises(D.DocsError, match=r"line 1: table x: its results lack or garble 'lower_bound_s'"):
        D.render(text, tmp_path, {"x": D.memory_model})


def test_check_fails_on_a_stale_file_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "shard_real.json").write_text((D.RESULTS / "shard_real.json").read_text())
    doc = tmp_path / "B.md"
    doc.write_text("x\n<!-- bench:shard-real -->\nstale\n<!-- /bench:shard-real -->\n")
    argv = ["--doc", str(doc), "--results", str(results)]
    assert D.main([*argv, "--check"]) == 1
    assert "run make bench-docs" in capsys.readouterr().err
    assert "stale" in doc.read_text()
    assert D.main(argv) == 0
    assert "| sharded: slowest shard + final | 154.0 s |" in doc.read_text()
    assert D.main([*argv, "--check"]) == 0


def test_figures_round_half_up() -> None:
    assert D.fixed(1026.5, 0) == "1027"
    assert D.fixed(0.245, 2) == "0.25"
    assert D.fixed(0.9805, 3) == "0.981"
    assert D.num(31.0) == "31.0"
    assert D.num(41.15) == "41.15"
    assert D.num(32.1) == "32.1"
