"""bench/serve_load.py: its percentiles, its index, and that its check of each response can fail."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from bench.serve_load import load, make_index, percentile, start_server, targets_of, workload


def test_percentile_is_nearest_rank() -> None:
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    assert percentile([float(i) for i in range(1, 101)], 100) == 100.0
    assert percentile([5.0], 99) == 5.0


def test_a_small_load_checks_every_response(tmp_path: Path) -> None:
    root = make_index(tmp_path)
    targets = targets_of(root)
    assert any(t.accept for t in targets)  # PEP 691 JSON pages
    assert any(t.path.endswith(".whl") for t in targets)
    assert any(t.path.endswith(".metadata") for t in targets)
    proc, port = start_server(root, tmp_path / "access.log")
    try:
        for keep_alive in (False, True):
            run = asyncio.run(load(port, workload(targets, 60), 4, keep_alive, 60.0, 300.0))
            assert (run.requests, run.errors) == (60, 0), run.error_samples
            assert run.p50_s is not None and run.p99_s is not None and run.max_s is not None
            assert 0 < run.p50_s <= run.p99_s <= run.max_s
        wrong = [replace(t, body=t.body + b"!") for t in targets[:5]]
        run = asyncio.run(load(port, wrong, 2, True, 60.0, 300.0))
        assert run.errors == 5 and "status 200" in run.error_samples[0]  # the bytes, not the status
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_what_the_run_limit_leaves_unsent_counts_as_errors(tmp_path: Path) -> None:
    root = make_index(tmp_path)
    proc, port = start_server(root, tmp_path / "access.log")
    try:
        run = asyncio.run(load(port, workload(targets_of(root), 50), 2, False, 60.0, 0.0))
        assert run.errors == 50 and run.p99_s is None
        assert run.error_samples[0].endswith("not sent within the run limit")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
