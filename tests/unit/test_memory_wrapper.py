"""The nvcc wrapper as a process: pass-through, measurement, exit codes, released reservations, admission.

A stand-in nvcc (a Python script that holds memory for a while) takes the real one's place; the wrapper itself
runs unmodified, as it does in a build container.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

WRAPPER = Path(__file__).resolve().parents[2] / "factory" / "memory" / "nvcc_wrapper.py"
MIB = 2**20

FAKE = textwrap.dedent("""\
    #!{python}
    import os, sys, time
    args = sys.argv[1:]
    if args == ["--version"]:
        print("fake nvcc 13.0"); sys.exit(0)
    hold = bytearray(int(os.environ.get("FAKE_MIB", "64")) * 2**20)
    for i in range(0, len(hold), 4096):
        hold[i] = 1  # touch every page so it is resident
    with open(os.environ["FAKE_LOG"], "a") as fh:
        fh.write(f"start {{args[args.index('-c') + 1]}} {{time.monotonic()}}\\n")
    time.sleep(float(os.environ.get("FAKE_S", "0.6")))
    with open(os.environ["FAKE_LOG"], "a") as fh:
        fh.write(f"end {{args[args.index('-c') + 1]}} {{time.monotonic()}}\\n")
    open(args[args.index("-o") + 1], "w").close()
    sys.exit(int(os.environ.get("FAKE_RC", "0")))
""")


def setup(tmp_path: Path, **extra: str) -> dict[str, str]:
    fake = tmp_path / "fake-nvcc"
    fake.write_text(FAKE.format(python=sys.executable))
    fake.chmod(0o755)
    env = dict(os.environ)
    env.update({
        "FACTORY_REAL_NVCC": str(fake), "FACTORY_STATE_DIR": str(tmp_path / "state"),
        "FACTORY_PROFILE_OUT": str(tmp_path / "m.jsonl"), "FACTORY_MEM_LIMIT": str(64 * 2**30),
        "FACTORY_SAMPLE_S": "0.05", "FACTORY_POLL_S": "0.05", "FAKE_LOG": str(tmp_path / "fake.log"),
        "FACTORY_EST_PER_ARCH_BYTES": str(100 * MIB), "FACTORY_EST_BASE_BYTES": "0",
    })  # fmt: skip
    env.update(extra)
    return env


def compile_cmd(tmp_path: Path, name: str) -> list[str]:
    return [sys.executable, str(WRAPPER), "-c", f"/src/{name}.cu", "-o", str(tmp_path / f"{name}.o"),
            "-gencode", "arch=compute_80,code=sm_80", "--threads", "1"]  # fmt: skip


def test_pass_through_for_non_compiles(tmp_path: Path) -> None:
    env = setup(tmp_path)
    out = subprocess.run([sys.executable, str(WRAPPER), "--version"], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "fake nvcc 13.0"
    assert not (tmp_path / "m.jsonl").exists()


def test_measures_and_propagates_exit_code(tmp_path: Path) -> None:
    env = setup(tmp_path, FAKE_MIB="80", FAKE_RC="3")
    out = subprocess.run(compile_cmd(tmp_path, "k"), env=env, capture_output=True, text=True)
    assert out.returncode == 3
    rec = json.loads((tmp_path / "m.jsonl").read_text())
    assert rec["key"] == "k.cu|compute_80|1"
    assert rec["rc"] == 3
    assert rec["peak_bytes"] >= 80 * MIB
    assert rec["wall_s"] >= 0.5
    assert rec["predicted_bytes"] == 100 * MIB
    assert "::factory-compile::" in out.stderr  # the build log carries it too
    state = json.loads((tmp_path / "state" / "admission.json").read_text())
    assert state["running"] == {} and state["waiting"] == {}


def test_admission_serializes_what_does_not_fit(tmp_path: Path) -> None:
    # capacity 1.5 GiB - 0.5 GiB headroom: two compiles predicted at 0.6 GiB each cannot run together
    env = setup(tmp_path, FACTORY_MEM_LIMIT=str(1536 * MIB), FACTORY_HEADROOM_BYTES=str(512 * MIB),
                FACTORY_EST_PER_ARCH_BYTES=str(600 * MIB), FACTORY_CPUS="8", FAKE_MIB="16")  # fmt: skip
    a = subprocess.Popen(compile_cmd(tmp_path, "a"), env=env)
    time.sleep(0.3)
    b = subprocess.Popen(compile_cmd(tmp_path, "b"), env=env)
    assert a.wait(timeout=60) == 0 and b.wait(timeout=60) == 0
    events = [line.split() for line in (tmp_path / "fake.log").read_text().splitlines()]
    times = {(kind, Path(src).stem): float(t) for kind, src, t in events}
    assert times[("start", "b")] >= times[("end", "a")]
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    waited = {r["source"]: r["waited_s"] for r in records}
    assert waited["b.cu"] > 0.2


def test_admission_runs_together_what_fits(tmp_path: Path) -> None:
    env = setup(tmp_path, FACTORY_MEM_LIMIT=str(4096 * MIB), FACTORY_HEADROOM_BYTES=str(512 * MIB),
                FACTORY_EST_PER_ARCH_BYTES=str(600 * MIB), FACTORY_CPUS="8", FAKE_MIB="16",
                FAKE_S="1.5")  # fmt: skip
    a = subprocess.Popen(compile_cmd(tmp_path, "a"), env=env)
    time.sleep(0.3)
    b = subprocess.Popen(compile_cmd(tmp_path, "b"), env=env)
    assert a.wait(timeout=60) == 0 and b.wait(timeout=60) == 0
    events = [line.split() for line in (tmp_path / "fake.log").read_text().splitlines()]
    times = {(kind, Path(src).stem): float(t) for kind, src, t in events}
    assert times[("start", "b")] < times[("end", "a")]
