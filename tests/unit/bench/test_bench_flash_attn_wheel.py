"""bench.flash_attn_wheel resumes: a shard is done only against the store that holds its compiles."""

from __future__ import annotations

from pathlib import Path

from bench.flash_attn_wheel import forget_other_stores, store_id


def test_store_id_is_made_once_and_kept(tmp_path: Path) -> None:
    first = store_id(tmp_path)
    assert len(first) == 16
    assert store_id(tmp_path) == first


def test_records_of_another_store_move_to_earlier_and_run_again(tmp_path: Path) -> None:
    current = store_id(tmp_path)
    results = {
        "shards": {
            "1/8": {"result": "ok", "wall_s": 1418.3},  # recorded before stores had ids
            "2/8": {"result": "ok", "store": "0123456789abcdef"},
            "3/8": {"result": "ok", "store": current},
        }
    }
    assert sorted(forget_other_stores(results, current)) == ["1/8", "2/8"]
    assert list(results["shards"]) == ["3/8"]
    assert [r["shard"] for r in results["earlier"]] == ["1/8", "2/8"]
    assert results["earlier"][0]["wall_s"] == 1418.3
    assert forget_other_stores(results, current) == []
