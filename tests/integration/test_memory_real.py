"""The memext fixture under a real cgroup memory limit with the host's nvcc: OOM without control, none with
it,
and recovery with resume after a deliberately low estimate."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # bench/ is not an installed package

from bench import real  # noqa: E402

pytestmark = pytest.mark.integration

MIB = 2**20


@pytest.fixture(scope="module")
def ready() -> None:
    require(real.host_nvcc() is not None, "nvcc on the host")
    require(shutil.which("ninja") is not None, "ninja")
    require(real.cgroup_v1_available(), "a writable cgroup v1 memory controller (root)")


def check(build_dir: Path) -> None:
    subprocess.run([sys.executable, str(real.FIXTURE / "build.py"), "--check", str(build_dir)], check=True)


@pytest.mark.timeout(900)
def test_cores_oom_and_factory_does_not(ready: None, tmp_path: Path) -> None:
    # without control, MAX_JOBS=cores starts both heavy TUs together and the kernel kills one
    fixed = real.run_build(tmp_path / "fixed", limit_bytes=real.DEFAULT_LIMIT, max_jobs=2, work=tmp_path,
                           admission_on=False)  # fmt: skip
    assert fixed.oom_kills > 0
    assert fixed.rc != 0
    assert fixed.peak_bytes >= real.DEFAULT_LIMIT - 64 * MIB

    # the factory, with ninja allowed more jobs than that, is never killed
    build = real.factory_build(tmp_path / "factory", limit_bytes=real.DEFAULT_LIMIT, cpus=2, work=tmp_path)
    assert [r.oom_kills for r in build.runs] == [0]
    assert build.runs[0].rc == 0
    assert build.result.jobs is not None and build.result.jobs > 2
    assert build.result.peak_bytes < real.DEFAULT_LIMIT
    assert len(build.profile.entries) == real.OBJECTS  # every compile was measured
    heavy = next(e for k, e in build.profile.entries.items() if k.startswith("heavy1.cu|"))
    assert heavy.peak_bytes > 1000 * MIB
    check(tmp_path / "factory")


@pytest.mark.timeout(900)
def test_low_estimate_recovers_with_resume(ready: None, tmp_path: Path) -> None:
    # ninja -j 2 (an explicit MAX_JOBS, as flash-attn's setup.py passes) starts the two heavy TUs first; an
    # estimate far too low admits both at once and the kernel kills one; ninja keeps going (-k 0) with the
    # rest, so attempt 2 resumes with only what was killed left to compile
    build = real.factory_build(tmp_path / "b", limit_bytes=real.DEFAULT_LIMIT, cpus=2, work=tmp_path,
                               est_per_arch=32 * MIB, keep_going=True, ninja_jobs=2)  # fmt: skip
    first, second = build.runs[0], build.runs[-1]
    assert first.oom_kills > 0
    assert len(build.runs) == 2
    assert second.oom_kills == 0 and second.rc == 0
    assert second.objects_kept == first.objects_total > 0  # resumed from what attempt 1 left
    assert second.compiled < first.compiled
    assert second.objects_total == real.OBJECTS
    assert build.lines[1].startswith("attempt 2: OOM at ")
    check(tmp_path / "b")
