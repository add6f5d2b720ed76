"""The nvcc wrapper as a process: pass-through, measurement, exit codes, released reservations, admission.

A stand-in nvcc (a Python script that holds memory for a while, or until the test lets it go) takes the real
one's place; the wrapper itself runs unmodified through its launcher, as it does in a build container. The
tests wait for the events they order (a compile started, waits, was stopped), never for a fixed time, and
leave no process behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from factory.container import CONTAINER_DIR, admission, cgroup, environ, procs
from factory.container.bell import Bell, ring
from factory.container.gate import Admission, Reasons
from factory.container.predictor import Predictor, read_measurements
from factory.container.state import locked_state, peek_state, prediction_entry, prediction_of
from factory.memory import profiles

LAUNCHER = CONTAINER_DIR / "nvcc"

MIB = 2**20

FAKE = textwrap.dedent("""\
    #!{python}
    import os, sys, time
    args = sys.argv[1:]
    if args == ["--version"]:
        print("fake nvcc 13.0"); sys.exit(0)
    time.sleep(float(os.environ.get("FAKE_LOW_S", "0")))  # a front end holding little
    if os.environ.get("FAKE_SPIN_S"):  # a busy cicc of its own, as nvcc runs one
        import subprocess
        subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time()\\n"
                        "while time.process_time() - t < " + os.environ["FAKE_SPIN_S"] + ": pass"])
    hold = bytearray(int(os.environ.get("FAKE_MIB", "64")) * 2**20)
    for i in range(0, len(hold), 4096):
        hold[i] = 1  # touch every page so it is resident
    with open(os.environ["FAKE_LOG"], "a") as fh:
        fh.write(f"start {{args[args.index('-c') + 1]}} {{time.monotonic()}}\\n")
    def hold_until(name, seconds):
        # until the test creates the file named by `name`, for `seconds` at most (or exactly, without one)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not os.path.exists(os.environ.get(name) or ""):
            time.sleep(0.01)
    hold_until("FAKE_UNTIL", float(os.environ.get("FAKE_S", "0.6")))
    if os.environ.get("FAKE_AFTER_S"):  # past its peak: what it held is freed for the rest of its run
        del hold
        hold_until("FAKE_AFTER_UNTIL", float(os.environ["FAKE_AFTER_S"]))
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
    # the launcher runs `python3`: this one, which imports the factory
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    env.update({
        "FACTORY_REAL_NVCC": str(fake), "FACTORY_STATE_DIR": str(tmp_path / "state"),
        "FACTORY_PROFILE_OUT": str(tmp_path / "m.jsonl"), "FACTORY_MEM_LIMIT": str(64 * 2**30),
        "FACTORY_SAMPLE_S": "0.05", "FACTORY_POLL_S": "0.05", "FAKE_LOG": str(tmp_path / "fake.log"),
        "FACTORY_EST_PER_ARCH_BYTES": str(100 * MIB), "FACTORY_EST_BASE_BYTES": "0",
        # no cgroup: what the session's own cgroup holds (other tests, builds) is no compile's business here
        "FACTORY_CGROUP_ROOT": str(tmp_path / "no-cgroup"),
    })  # fmt: skip
    env.update(extra)
    return env


def compile_cmd(tmp_path: Path, name: str) -> list[str]:
    return [str(LAUNCHER), "-c", f"/src/{name}.cu", "-o", str(tmp_path / f"{name}.o"),
            "-gencode", "arch=compute_80,code=sm_80", "--threads", "1"]  # fmt: skip


def fake_times(work: Path) -> dict[tuple[str, str], float]:
    """When the stand-in nvcc started and ended each compile: ("start" | "end", file stem) -> monotonic s."""
    try:
        events = [line.split() for line in (work / "fake.log").read_text().splitlines()]
    except FileNotFoundError:
        return {}
    return {(kind, Path(src).stem): float(t) for kind, src, t in events}


def wait_for(what: str, done: Callable[[], object], timeout: float = 60.0) -> None:
    """Until `done()` is true; failing, naming `what`, after a timeout no loaded machine reaches."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def started(work: Path, name: str) -> Callable[[], bool]:
    return lambda: ("start", name) in fake_times(work)


def admission_state(work: Path) -> dict[str, Any]:
    return peek_state(str(work / "state"))


def waiting(work: Path, count: int) -> Callable[[], bool]:
    return lambda: len(admission_state(work).get("waiting", {})) >= count


def release(work: Path, name: str = "go") -> None:
    """Let every stand-in held by FAKE_UNTIL (or FAKE_AFTER_UNTIL) = work/name go on."""
    (work / name).touch()


@contextlib.contextmanager
def reaped(*groups: Iterable[subprocess.Popen[Any]]) -> Iterator[None]:
    """End whatever of these processes still runs when the test ends, passed or failed: SIGTERM, which a
    wrapper passes on to its compile, to the whole process group of one started in a session of its own
    (a shell and what it runs)."""
    try:
        yield
    finally:
        for p in (p for group in groups for p in group):
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    if os.getpgid(p.pid) == p.pid:
                        os.killpg(p.pid, signal.SIGTERM)
                    else:
                        p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_pass_through_for_non_compiles(tmp_path: Path) -> None:
    env = setup(tmp_path)
    out = subprocess.run([str(LAUNCHER), "--version"], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "fake nvcc 13.0"
    assert not (tmp_path / "m.jsonl").exists()


@pytest.mark.parametrize("args", [["--version"], ["-c", "a.cu", "-o", "a.o"]])
def test_a_missing_real_nvcc_is_said_in_one_line(tmp_path: Path, args: list[str]) -> None:
    env = setup(tmp_path)
    env["FACTORY_REAL_NVCC"] = str(tmp_path / "no-nvcc")
    out = subprocess.run([str(LAUNCHER), *args], env=env, capture_output=True, text=True)
    assert out.returncode == 1
    assert (
        out.stderr.strip()
        == f"factory-nvcc: no nvcc at {tmp_path / 'no-nvcc'} (set FACTORY_REAL_NVCC, or CUDA_HOME)"
    )


def test_measures_and_propagates_exit_code(tmp_path: Path) -> None:
    env = setup(tmp_path, FAKE_MIB="80", FAKE_RC="3")
    out = subprocess.run(compile_cmd(tmp_path, "k"), env=env, capture_output=True, text=True)
    assert out.returncode == 3
    rec = json.loads((tmp_path / "m.jsonl").read_text())
    assert rec["key"] == "k.cu|compute_80|1"
    assert rec["rc"] == 3
    assert rec["peak_bytes"] >= 80 * MIB
    assert rec["wall_s"] >= 0.5
    assert rec["cpu_s"] < rec["wall_s"] - 0.4  # it slept most of its time
    assert rec["predicted_bytes"] == 100 * MIB
    assert "::factory-compile::" in out.stderr  # the build log carries it too
    state = json.loads((tmp_path / "state" / "admission.json").read_text())
    assert state["running"] == {} and state["waiting"] == {}


def test_cpu_time_counts_the_processes_nvcc_runs(tmp_path: Path) -> None:
    env = setup(tmp_path, FAKE_SPIN_S="0.8", FAKE_S="0.5")
    out = subprocess.run(compile_cmd(tmp_path, "k"), env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rec = json.loads((tmp_path / "m.jsonl").read_text())
    assert 0.8 <= rec["cpu_s"] < rec["wall_s"] - 0.4
    (m,) = profiles.read_measurements(tmp_path / "m.jsonl")
    assert m.cpu_s == rec["cpu_s"] and m.mem_s == rec["mem_s"] > 0


def test_admission_serializes_what_does_not_fit(tmp_path: Path) -> None:
    env = one_at_a_time(tmp_path, FAKE_UNTIL=str(tmp_path / "go"), FAKE_S="60")
    a = subprocess.Popen(compile_cmd(tmp_path, "a"), env=env)
    b: list[subprocess.Popen[bytes]] = []
    with reaped([a], b):
        wait_for("a to start", started(tmp_path, "a"))
        b.append(subprocess.Popen(compile_cmd(tmp_path, "b"), env={**env, "FAKE_S": "0.2"}))
        wait_for("b to wait", waiting(tmp_path, 1))
        release(tmp_path)
        assert a.wait(timeout=60) == 0 and b[0].wait(timeout=60) == 0
    times = fake_times(tmp_path)
    assert times[("start", "b")] >= times[("end", "a")]
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    waited = {r["source"]: r["waited_s"] for r in records}
    assert waited["b.cu"] > 0


def one_at_a_time(tmp_path: Path, **extra: str) -> dict[str, str]:
    """Capacity 1.5 GiB - 0.5 GiB headroom: compiles predicted at 0.6 GiB each run one at a time."""
    return setup(tmp_path, FACTORY_MEM_LIMIT=str(1536 * MIB), FACTORY_HEADROOM_BYTES=str(512 * MIB),
                 FACTORY_EST_PER_ARCH_BYTES=str(600 * MIB), FACTORY_CPUS="8", FAKE_MIB="16",
                 **extra)  # fmt: skip


def test_one_waiting_wrapper_decides_for_all(tmp_path: Path) -> None:
    # five compiles wait behind a first one: one of them reads the state and decides each poll, the others
    # only look for their grant (per-waiter polling would take five rounds per poll)
    env = one_at_a_time(tmp_path, FACTORY_POLL_S="0.1", FAKE_S="0.3")
    first = subprocess.Popen(
        compile_cmd(tmp_path, "first"), env={**env, "FAKE_UNTIL": str(tmp_path / "go"), "FAKE_S": "60"}
    )
    others: list[subprocess.Popen[bytes]] = []
    with reaped([first], others):
        wait_for("the first to start", started(tmp_path, "first"))
        t0 = time.monotonic()
        others.extend(subprocess.Popen(compile_cmd(tmp_path, f"k{i}"), env=env) for i in range(5))
        wait_for("five compiles to wait", waiting(tmp_path, 5))
        release(tmp_path)
        assert first.wait(timeout=60) == 0 and all(p.wait(timeout=60) == 0 for p in others)
        elapsed = time.monotonic() - t0
    final = admission_state(tmp_path)
    assert final["running"] == {} and final["waiting"] == {}
    assert 5 <= final["rounds"] <= elapsed / 0.1 + 5
    assert not list((tmp_path / "state").glob("granted-*"))


def test_many_waiting_compiles_never_overrun_what_fits(tmp_path: Path) -> None:
    # 24 compiles asked at once, four fit at a time (one thread each on 3.2 CPUs shared by a quarter): a
    # dispatching wrapper starts several in one round, never more than fit, and every one starts once
    env = setup(tmp_path, FACTORY_CPUS="3.2", FACTORY_POLL_S="0.1", FAKE_MIB="16", FAKE_S="0.4")
    compiles = [subprocess.Popen(compile_cmd(tmp_path, f"k{i:02}"), env=env) for i in range(24)]
    with reaped(compiles):
        assert all(p.wait(timeout=120) == 0 for p in compiles)
    events = sorted(
        (float(t), kind)
        for kind, _, t in (line.split() for line in (tmp_path / "fake.log").read_text().splitlines())
    )
    assert sum(1 for _, kind in events if kind == "start") == 24
    running = most = 0
    for _, kind in events:
        running += 1 if kind == "start" else -1
        most = max(most, running)
    assert 1 < most <= 4
    final = admission_state(tmp_path)
    assert final["running"] == {} and final["waiting"] == {}


def test_a_dispatcher_that_dies_is_replaced(tmp_path: Path) -> None:
    env = one_at_a_time(tmp_path, FACTORY_POLL_S="0.1", FAKE_S="0.2")
    first = subprocess.Popen(
        compile_cmd(tmp_path, "first"), env={**env, "FAKE_UNTIL": str(tmp_path / "go"), "FAKE_S": "60"}
    )
    waiters: set[subprocess.Popen[bytes]] = set()
    with reaped([first], waiters):
        wait_for("the first to start", started(tmp_path, "first"))
        waiters.update(subprocess.Popen(compile_cmd(tmp_path, f"k{i}"), env=env) for i in range(3))
        wait_for("three compiles to wait", waiting(tmp_path, 3))
        wait_for(
            "a dispatcher",
            lambda: admission_state(tmp_path).get("dispatcher") in {str(p.pid) for p in waiters},
        )
        (dispatcher,) = [p for p in waiters if str(p.pid) == admission_state(tmp_path)["dispatcher"]]
        dispatcher.kill()  # while the first compile still runs: its lock is released with it
        assert dispatcher.wait(timeout=60) != 0
        release(tmp_path)
        assert first.wait(timeout=60) == 0 and all(p.wait(timeout=60) == 0 for p in waiters - {dispatcher})
    final = admission_state(tmp_path)
    assert final["dispatcher"] != str(dispatcher.pid)
    assert final["running"] == {} and final["waiting"] == {}
    starts = [line.split()[1] for line in (tmp_path / "fake.log").read_text().splitlines() if "start" in line]
    assert len(starts) == 3  # the first and the two that lived


def test_admission_runs_together_what_fits(tmp_path: Path) -> None:
    env = setup(tmp_path, FACTORY_MEM_LIMIT=str(4096 * MIB), FACTORY_HEADROOM_BYTES=str(512 * MIB),
                FACTORY_EST_PER_ARCH_BYTES=str(600 * MIB), FACTORY_CPUS="8", FAKE_MIB="16",
                FAKE_UNTIL=str(tmp_path / "go"), FAKE_S="60")  # fmt: skip
    a = subprocess.Popen(compile_cmd(tmp_path, "a"), env=env)
    b: list[subprocess.Popen[bytes]] = []
    with reaped([a], b):
        wait_for("a to start", started(tmp_path, "a"))
        b.append(subprocess.Popen(compile_cmd(tmp_path, "b"), env=env))
        wait_for("b to start while a runs", started(tmp_path, "b"))  # a ends only once b started
        release(tmp_path)
        assert a.wait(timeout=60) == 0 and b[0].wait(timeout=60) == 0
    times = fake_times(tmp_path)
    assert times[("start", "b")] < times[("end", "a")]


def test_unprofiled_compiles_start_in_the_order_of_the_recipe_s_seconds(tmp_path: Path) -> None:
    # one compile fits at a time (two 600 MiB peaks are more than 1.25 x the 888 MiB left, even booked for
    # their front ends); while "first" runs, "short" and then "long" wait: by the recipe's table, "long"
    # starts next although it asked last
    env = setup(tmp_path, FACTORY_MEM_LIMIT=str(1400 * MIB), FACTORY_HEADROOM_BYTES=str(512 * MIB),
                FACTORY_EST_PER_ARCH_BYTES=str(600 * MIB), FACTORY_CPUS="8", FAKE_MIB="16", FAKE_S="0.2",
                FACTORY_SECONDS_BY_FILE=json.dumps([["long*", 300], ["short*", 100]]))  # fmt: skip
    compiles: list[subprocess.Popen[bytes]] = []
    with reaped(compiles):
        held = {**env, "FAKE_UNTIL": str(tmp_path / "go"), "FAKE_S": "60"}
        compiles.append(subprocess.Popen(compile_cmd(tmp_path, "first"), env=held))
        wait_for("the first to start", started(tmp_path, "first"))
        for count, name in enumerate(("short", "long"), 1):
            compiles.append(subprocess.Popen(compile_cmd(tmp_path, name), env=env))
            wait_for(f"{name} to wait", waiting(tmp_path, count))
        release(tmp_path)
        assert all(p.wait(timeout=60) == 0 for p in compiles)
    events = [line.split() for line in (tmp_path / "fake.log").read_text().splitlines()]
    starts = [Path(src).stem for kind, src, _ in events if kind == "start"]
    assert starts == ["first", "long", "short"]


def test_waiting_compiles_learn_from_their_finished_siblings(tmp_path: Path) -> None:
    env = setup(tmp_path, FAKE_S="0.4")
    assert subprocess.run(compile_cmd(tmp_path, "k_hdim64"), env=env).returncode == 0
    assert subprocess.run(compile_cmd(tmp_path, "k_hdim128"), env=env).returncode == 0
    first, second = (json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines())
    assert first["predicted_s"] is None  # nothing measured yet: the estimate alone
    # the second file of the family is predicted with the first one's time course, its peak still estimated
    assert second["predicted_s"] == first["wall_s"] * admission.SIBLING_TIME_MARGIN
    assert second["predicted_bytes"] == 100 * MIB


def test_busy_threads_are_the_leaves_of_a_process_tree() -> None:
    kids = {1: [2], 2: [3, 4, 5], 5: [6]}  # wrapper -> nvcc -> 2 cicc + a shell running ptxas
    assert procs.tree_workers(1, kids, 4) == 3
    assert procs.tree_workers(1, kids, 2) == 2  # never more than it was admitted with
    assert procs.tree_workers(7, kids, 4) == 1  # between processes: still one thread


def test_measurements_of_the_build_skip_failed_and_cut_lines(tmp_path: Path) -> None:
    out = tmp_path / "m.jsonl"
    ok = {
        "key": "a.cu|compute_80|1",
        "peak_bytes": 5,
        "wall_s": 2.0,
        "rc": 0,
        "envelope": [5, 1],
        "rise": [1, 5],
    }
    bad = {"key": "b.cu|compute_80|1", "peak_bytes": 7, "wall_s": 1.0, "rc": 137}
    out.write_text(json.dumps(ok) + "\n" + json.dumps(bad) + "\n" + '{"key": "c.cu|comp')
    assert read_measurements(str(out)) == {
        "a.cu|compute_80|1": {
            "peak_bytes": 5,
            "wall_s": 2.0,
            "samples": 1,
            "envelope": [5, 1],
            "rise": [1, 5],
        }
    }


def test_per_file_estimates_from_the_environment(tmp_path: Path) -> None:
    # the first matching pattern of FACTORY_EST_BY_FILE sets the estimate; an unmatched file keeps the
    # per-arch one
    table = json.dumps([["heavy_*", 300 * MIB], ["*_light.cu", 50 * MIB]])
    env = setup(tmp_path, FAKE_MIB="8", FACTORY_EST_BY_FILE=table)
    for name in ("heavy_k", "k_light", "plain"):
        out = subprocess.run(compile_cmd(tmp_path, name), env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
    recs = {
        r["key"].split("|")[0]: r for r in map(json.loads, (tmp_path / "m.jsonl").read_text().splitlines())
    }
    assert recs["heavy_k.cu"]["predicted_bytes"] == 300 * MIB
    assert recs["k_light.cu"]["predicted_bytes"] == 50 * MIB
    assert recs["plain.cu"]["predicted_bytes"] == 100 * MIB


def test_a_compile_admitted_for_its_front_end_is_stopped_at_its_rise(tmp_path: Path) -> None:
    # capacity 1 GiB: b (unprofiled) holds its 600 MiB estimate; a's profile shows a 60 MiB front end and a
    # 600 MiB peak, so a starts beside b and is stopped when it rises, until b is done
    rise = [60 * MIB] * 10 + [600 * MIB] * 10
    profile = {"entries": {"a.cu|compute_80|1": {
        "peak_bytes": 600 * MIB, "wall_s": 1.0, "envelope": [600 * MIB] * 10, "rise": rise,
    }}}  # fmt: skip
    common = {"FACTORY_MEM_LIMIT": str(1536 * MIB), "FACTORY_HEADROOM_BYTES": str(512 * MIB),
              "FACTORY_EST_PER_ARCH_BYTES": str(600 * MIB), "FACTORY_CPUS": "8"}  # fmt: skip
    # b without the profile: with it, b would take a's course as its sibling's
    b = subprocess.Popen(
        compile_cmd(tmp_path, "b"),
        env=setup(tmp_path, FAKE_MIB="16", FAKE_UNTIL=str(tmp_path / "go"), FAKE_S="60", **common),
    )
    a_env = setup(tmp_path, FAKE_LOW_S="0.6", FAKE_MIB="200", FAKE_S="0.2",
                  FACTORY_PROFILE_JSON=json.dumps(profile), **common)  # fmt: skip
    a: list[subprocess.Popen[str]] = []
    with reaped([b], a):
        wait_for("b to start", started(tmp_path, "b"))
        t0 = time.monotonic()
        a.append(subprocess.Popen(compile_cmd(tmp_path, "a"), env=a_env, stderr=subprocess.PIPE, text=True))

        def a_stopped() -> bool:
            entry = admission_state(tmp_path).get("running", {}).get(str(a[0].pid), {})
            return bool(entry.get("paused"))

        wait_for("a to be stopped at its rise", a_stopped)
        time.sleep(0.5)  # a stays stopped while b holds its peak: that time must not count in a's
        release(tmp_path)
        _, a_err = a[0].communicate(timeout=60)
        a_elapsed = time.monotonic() - t0
        assert a[0].returncode == 0 and b.wait(timeout=60) == 0
    times = fake_times(tmp_path)
    assert "started for its front end" in a_err and "stopped at its rise" in a_err
    assert times[("start", "a")] >= times[("end", "b")]  # its peak came only once b was done
    record = {r["source"]: r for r in map(json.loads, (tmp_path / "m.jsonl").read_text().splitlines())}[
        "a.cu"
    ]
    assert record["stopped_s"] >= 0.5  # stopped at its rise...
    assert record["waited_s"] < record["stopped_s"]  # ...not before its start
    assert record["wall_s"] + record["stopped_s"] <= a_elapsed  # its time leaves the stop out


def test_a_compile_past_its_peak_holds_the_recipe_s_after_peak_fraction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # capacity 1 GiB, every compile estimated at 600 MiB: a reaches its estimate, then frees it for the rest
    # of its run; with the recipe's fraction b starts then, without it only once a is done
    def run(name: str, **extra: str) -> dict[tuple[str, str], float]:
        work = tmp_path / name  # a build of its own: nothing measured yet
        work.mkdir()
        common = {"FACTORY_MEM_LIMIT": str(1536 * MIB), "FACTORY_HEADROOM_BYTES": str(512 * MIB),
                  "FACTORY_EST_PER_ARCH_BYTES": str(600 * MIB), "FACTORY_CPUS": "8", **extra}  # fmt: skip
        # a holds its peak until b waits, then what it holds past its peak until b starts (3 s at most)
        a_env = setup(work, FAKE_MIB="560", FAKE_UNTIL=str(work / "waits"), FAKE_S="60",
                      FAKE_AFTER_UNTIL=str(work / "started"), FAKE_AFTER_S="3", **common)  # fmt: skip
        a = subprocess.Popen(compile_cmd(work, "a"), env=a_env)
        b: list[subprocess.Popen[bytes]] = []
        with reaped([a], b):
            wait_for("a to start", started(work, "a"))
            b.append(subprocess.Popen(compile_cmd(work, "b"), env=setup(work, FAKE_MIB="16", **common)))
            wait_for("b to wait", waiting(work, 1))
            release(work, "waits")
            wait_for("b to start", lambda: started(work, "b")() or a.poll() is not None)
            release(work, "started")
            assert a.wait(timeout=60) == 0 and b[0].wait(timeout=60) == 0
        return fake_times(work)

    with_fraction = run("with", FACTORY_AFTER_PEAK="0.5")
    assert with_fraction[("start", "b")] < with_fraction[("end", "a")]
    without = run("without")
    assert without[("start", "b")] >= without[("end", "a")]
    # a malformed fraction is ignored, never fatal to the compile
    monkeypatch.delenv("FACTORY_AFTER_PEAK", raising=False)
    assert environ.settings().after_peak is None
    for bad in ("1.5", "0", "x"):
        monkeypatch.setenv("FACTORY_AFTER_PEAK", bad)
        assert environ.settings().after_peak is None
    monkeypatch.setenv("FACTORY_AFTER_PEAK", "0.71")
    assert environ.settings().after_peak == 0.71


def test_the_state_file_keeps_a_prediction_s_after_peak_fraction() -> None:
    p = admission.Prediction(peak_bytes=5, wall_s=2.0, envelope=(5, 1), inferred=True, after_peak=0.7)
    assert prediction_of(json.loads(json.dumps(prediction_entry(p)))) == p


def test_an_unreadable_profile_is_said_and_the_compile_goes_on(tmp_path: Path) -> None:
    env = setup(tmp_path, FACTORY_PROFILE_IN=str(tmp_path / "missing.json"), FAKE_S="0.1")
    out = subprocess.run(compile_cmd(tmp_path, "k"), env=env, capture_output=True, text=True)
    assert out.returncode == 0
    assert "cannot read the learned profile" in out.stderr and "missing.json" in out.stderr


def test_a_bell_keeps_its_rings_until_its_next_nap(tmp_path: Path) -> None:
    bell = Bell(str(tmp_path), "7")
    assert bell.nap(0) is False  # made on first use; nobody rang
    ring(str(tmp_path), ["7"])
    ring(str(tmp_path), ["7"])
    assert bell.nap(60) is True  # at once: it was rung before it napped
    assert bell.nap(0) is False  # both rings were one wake
    for _ in range(70_000):  # more than a pipe holds: a full bell neither blocks nor fails the ringer
        ring(str(tmp_path), ["7"])
    assert bell.nap(0) is True
    bell.take_down()
    assert not (tmp_path / "bell-7").exists()
    os.mkfifo(tmp_path / "bell-8")  # a dead wrapper's bell: nobody reads it
    ring(str(tmp_path), ["7", "8", "9"])  # gone, unread, never made: all left to their polls


def test_a_bell_that_cannot_be_made_is_a_poll(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    not_a_dir = tmp_path / "state"
    not_a_dir.write_text("")
    tries: list[str] = []
    makedirs = os.makedirs

    def counted(path: str, **kwargs: bool) -> None:
        tries.append(path)
        makedirs(path, **kwargs)

    monkeypatch.setattr(os, "makedirs", counted)
    bell = Bell(str(not_a_dir), "7")
    t0 = time.monotonic()
    assert bell.nap(0.2) is False
    assert time.monotonic() - t0 >= 0.2  # it slept its poll instead of spinning
    assert bell.nap(0.01) is False
    assert len(tries) == 1  # not tried again at every poll


def test_the_first_bell_of_a_build_makes_the_state_directory(tmp_path: Path) -> None:
    bell = Bell(str(tmp_path / "state"), "7")
    bell.hang()
    assert (tmp_path / "state" / "bell-7").is_fifo()
    ring(str(tmp_path / "state"), ["7"])
    assert bell.nap(5) is True
    bell.take_down()


@pytest.fixture
def others(tmp_path: Path) -> Iterator[dict[str, Bell]]:
    """Four other wrappers, each a live pid (the state drops dead ones) with its bell hung in `tmp_path`."""
    sleepers = [subprocess.Popen(["sleep", "60"]) for _ in range(4)]
    with reaped(sleepers):
        bells = {str(p.pid): Bell(str(tmp_path), str(p.pid)) for p in sleepers}
        for bell in bells.values():
            bell.hang()
        yield bells


def gate(tmp_path: Path) -> Admission:
    info = cgroup.CgroupInfo(version=0, memory_limit=None, memory_usage=None, memory_peak=None, cpus=2.0)
    return Admission(str(tmp_path), limit=8 << 30, info=info, threads=1, waves=1)


def test_a_compile_that_ends_wakes_the_dispatcher_and_the_stopped_compiles(
    tmp_path: Path, others: dict[str, Bell]
) -> None:
    dispatcher, other, stopped, busy = others
    me = gate(tmp_path)
    entry = {"key": "k|compute_80|1", "estimate_bytes": 1, "ticket": 0}
    running = {"bytes": 1, "start": time.time(), "threads": 1}
    with locked_state(str(tmp_path)) as state:
        state["dispatcher"] = dispatcher
        state["waiting"] = {dispatcher: entry, other: entry}
        state["running"] = {me.me: running, stopped: {**running, "paused": True}, busy: running}
    me.release()
    rung = {pid for pid, bell in others.items() if bell.nap(0)}
    assert rung == {dispatcher, stopped}  # the others wait for a grant only a dispatcher gives
    # a dispatcher that was started itself no longer waits: every waiting wrapper is woken, one of them takes
    # its place
    with locked_state(str(tmp_path)) as state:
        state["running"] = {me.me: running, dispatcher: running}
        state["waiting"] = {other: entry, busy: entry}
    me.release()
    assert {pid for pid, bell in others.items() if bell.nap(0)} == {other, busy}
    assert not (tmp_path / f"bell-{me.me}").exists()


def test_a_dispatcher_wakes_the_compiles_it_starts(tmp_path: Path, others: dict[str, Bell]) -> None:
    first, second, *_ = others
    me = gate(tmp_path)
    with locked_state(str(tmp_path)) as state:
        # 5 GiB each on 8 GiB less its 0.5 GiB headroom: one starts, one waits
        state["waiting"] = {
            pid: {"key": f"{pid}.cu|compute_80|1", "estimate_bytes": 5 << 30, "ticket": i}
            for i, pid in enumerate((first, second))
        }
    assert me.dispatching()
    me.dispatch(Predictor({}), Reasons("waiting"))
    me.stop_dispatching()
    assert (tmp_path / f"granted-{first}").exists() and not (tmp_path / f"granted-{second}").exists()
    assert others[first].nap(0) is True and others[second].nap(0) is False


def test_a_waiting_compile_starts_when_the_one_before_it_ends_not_at_its_next_poll(tmp_path: Path) -> None:
    # a poll far longer than the compile: without the ended compile ringing it, the second would start a
    # poll after the first ended
    env = one_at_a_time(tmp_path, FACTORY_POLL_S="30", FAKE_S="0.5")
    a = subprocess.Popen(
        compile_cmd(tmp_path, "a"), env={**env, "FAKE_UNTIL": str(tmp_path / "go"), "FAKE_S": "60"}
    )
    b: list[subprocess.Popen[bytes]] = []
    with reaped([a], b):
        wait_for("a to start", started(tmp_path, "a"))
        b.append(subprocess.Popen(compile_cmd(tmp_path, "b"), env=env))
        wait_for("b to wait", waiting(tmp_path, 1))
        wait_for("b to dispatch", lambda: admission_state(tmp_path).get("dispatcher") == str(b[0].pid))
        release(tmp_path)
        assert a.wait(timeout=60) == 0 and b[0].wait(timeout=60) == 0
    times = fake_times(tmp_path)
    assert times[("end", "a")] <= times[("start", "b")] < times[("end", "a")] + 15


@pytest.mark.parametrize("launcher", ["", "timeout 100"])
def test_the_first_dispatch_waits_for_every_sibling_job_to_ask_not_for_a_poll(
    tmp_path: Path, launcher: str
) -> None:
    # ninja starts its jobs at once through `sh -c`, and their wrappers ask as their Python comes up. The
    # first dispatch waits for every sibling wrapper to ask: "long" (first by the recipe's seconds; one
    # compile fits at a time) starts first although its Python comes up half a second after the others'.
    # It waits neither for a whole poll (20 s here) nor for a sibling job that is no wrapper (the sleep).
    slow = tmp_path / "slow-start"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text("import time\ntime.sleep(0.5)\n")
    env = one_at_a_time(tmp_path, FACTORY_POLL_S="20", FAKE_S="0.2",
                        FACTORY_SECONDS_BY_FILE=json.dumps([["long*", 300], ["short*", 100]]))  # fmt: skip
    launched = time.monotonic()
    other = subprocess.Popen(["sh", "-c", "sleep 30; true"], start_new_session=True)
    jobs = [
        subprocess.Popen(
            # the shell stays between the test and the wrapper, as ninja's does, and exits with its status
            ["sh", "-c", f"{launcher} {' '.join(compile_cmd(tmp_path, name))}; exit $?"],
            env=job_env,
            start_new_session=True,
        )
        for name, job_env in (
            ("short1", env),
            ("short2", env),
            ("long", {**env, "PYTHONPATH": str(slow)}),
        )
    ]
    with reaped([other], jobs):
        assert [p.wait(timeout=120) for p in jobs] == [0, 0, 0]
    times = fake_times(tmp_path)
    assert sorted(times, key=times.__getitem__)[0] == ("start", "long")
    assert times[("start", "long")] - launched < 10  # not after the 20 s poll


def test_a_wrapper_is_known_by_its_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a stand-in for the wrapper's module that only sleeps, started as the launcher starts the wrapper, and
    # processes that only name it
    (tmp_path / "standin.py").write_text("import time\ntime.sleep(30)\n")
    (tmp_path / "other.py").write_text("import time\ntime.sleep(30)\n")
    monkeypatch.setattr(procs, "WRAPPER_MODULE", "standin")
    python = sys.executable
    commands = {
        "as the launcher runs it": [python, "-m", "standin", "-c", "x.cu"],
        "with an option": [python, "-u", "-m", "standin"],
        "joined": [python, "-mstandin"],
        "another module": [python, "-m", "other", "-m", "standin"],
        "a script": [python, str(tmp_path / "other.py"), "-m", "standin"],
        "a command": [python, "-c", "import time; time.sleep(30)", "-m", "standin"],
        "not python": ["sleep", "30"],
    }
    # a started process has its command line once Popen returns (it waits for the exec)
    running = {name: subprocess.Popen(cmd, cwd=tmp_path) for name, cmd in commands.items()}
    with reaped(running.values()):
        found = {name for name, p in running.items() if procs.is_wrapper(p.pid)}
    assert found == {"as the launcher runs it", "with an option", "joined"}
    assert not procs.is_wrapper(running["as the launcher runs it"].pid)  # it ended


def test_compiles_of_unknown_length_start_in_ninja_s_order_not_as_their_wrappers_come_up(
    tmp_path: Path,
) -> None:
    # nothing tells the three apart but the order their jobs were started in; "a"'s wrapper asks last, and
    # starts first
    slow = tmp_path / "slow-start"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text("import time\ntime.sleep(0.5)\n")
    env = one_at_a_time(tmp_path, FACTORY_POLL_S="20", FAKE_S="0.2")
    jobs = []
    for name in ("a", "b", "c"):
        job_env = {**env, "PYTHONPATH": str(slow)} if name == "a" else env
        jobs.append(
            subprocess.Popen(
                ["sh", "-c", f"{' '.join(compile_cmd(tmp_path, name))}; exit $?"],
                env=job_env,
                start_new_session=True,
            )
        )
    with reaped(jobs):
        assert [p.wait(timeout=120) for p in jobs] == [0, 0, 0]
    times = fake_times(tmp_path)
    starts = [name for kind, name in sorted(times, key=times.__getitem__) if kind == "start"]
    # after "a", "b" and "c" may start in one round (their siblings' course gives them a front end)
    assert starts[0] == "a" and sorted(starts) == ["a", "b", "c"]
