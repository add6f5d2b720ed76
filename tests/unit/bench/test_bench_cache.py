"""bench/cache.py's pure parts: the phase clock over a growing log, ratios, the flash-attn matrix model."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import cache as C
from factory.container.protocol import mark_line


def test_phase_clock_times_the_build_phase_from_the_log(tmp_path: Path) -> None:
    log = tmp_path / "runs" / "r1" / "logs" / "job-py313.log"
    log.parent.mkdir(parents=True)
    log.write_text(mark_line(phase="env") + "\n" + mark_line(phase="build") + "\n")
    clock = C.PhaseClock(tmp_path)
    clock._poll()
    with log.open("a") as fh:
        fh.write("a half-written line without its newline")
    clock._poll()
    assert clock.build_phase_s("job-py313") is None  # no phase after the build yet
    with log.open("a") as fh:
        fh.write("\n" + mark_line(phase="collect") + "\n")
    clock._poll()
    assert set(clock.seen["job-py313"]) == {"env", "build", "collect"}
    assert clock.build_phase_s("job-py313") is not None
    assert clock.build_phase_s("other") is None


def test_phase_clock_stops_when_its_context_ends(tmp_path: Path) -> None:
    with C.PhaseClock(tmp_path) as clock:
        assert clock._thread.is_alive()
    assert not clock._thread.is_alive()


def test_ratio_and_brief() -> None:
    assert C.ratio(1.0, 4.0) == 0.25
    assert C.ratio(None, 4.0) is None and C.ratio(1.0, 0.0) is None
    run = {"run_wall_s": 3.0, "jobs": [{"python": "3.13", "compiles": [{"tool": "nvcc"}]}]}
    assert C.brief(run) == {"run_wall_s": 3.0, "jobs": [{"python": "3.13"}]}
    assert C.brief({"jobs": 16}) == {"jobs": 16}


def test_model_matrix_with_the_cache_compiles_the_kernels_once_per_variant() -> None:
    m = C.model_matrix(10.0, 5.0)
    full = m["full_build_kernels_makespan_s"] + 5.0
    assert m["jobs"] == 16 and m["kernel_files"] == 72
    assert m["without_cache"]["makespan_s"] == pytest.approx(16 * full, abs=1.0)
    assert m["with_cache"]["makespan_s"] == pytest.approx(4 * (full + 3 * 15.0), abs=1.0)
    kernels_cpu = m["full_build_kernels_cpu_s"]
    saved = m["without_cache"]["cpu_s"] - m["with_cache"]["cpu_s"]
    assert saved == pytest.approx(12 * kernels_cpu, rel=1e-4)
