"""One dispatch round (`admission.dispatch`): the nvcc wrapper's dispatcher and the build simulator both run
it, so that the benchmark's model cannot drift from the wrapper."""

from __future__ import annotations

import inspect
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from factory.container import admission, cgroup, protocol
from factory.container.admission import Prediction, Round, Waiting
from factory.container.gate import Admission, Reasons
from factory.container.predictor import Predictor
from factory.container.state import locked_state
from factory.memory import simulate as S

GIB = 1 << 30
MIB = 1 << 20
LIMITS: dict[str, Any] = {"limit_bytes": 8 * GIB, "headroom_bytes": GIB // 2, "cpus": 2.0}


def waiter(n: int, peak: int, *, threads: int = 1, wall_s: float | None = None, **extra: Any) -> Waiting:
    prediction = Prediction(peak_bytes=peak, wall_s=wall_s, **extra)
    return Waiting(key=str(n), prediction=prediction, threads=threads, ticket=n, pid=1000 + n)


def started(r: Round) -> list[str]:
    return [s.waiting.key for s in r.starts]


def test_a_round_starts_in_priority_order_while_compiles_fit() -> None:
    # 7.5 GiB of capacity, 2 CPUs (+25%): two 3 GiB compiles start, the third waits for memory and CPU
    r = admission.dispatch(
        [waiter(2, 3 * GIB), waiter(0, 3 * GIB), waiter(1, 3 * GIB)],
        used_bytes=0,
        running=[],
        measured=False,
        **LIMITS,
    )
    assert started(r) == ["0", "1"] and [w.key for w in r.left] == ["2"]
    assert r.starts[0].decision.reason == "nothing else runs" and r.starts[1].decision.reason == "fits"
    assert r.why is not None and not r.why.admit and r.why.reason.startswith("cpu")
    # the longest known compile goes first
    r = admission.dispatch(
        [waiter(0, GIB, wall_s=10.0), waiter(1, GIB, wall_s=100.0)], used_bytes=0, running=[], **LIMITS
    )
    assert started(r) == ["1", "0"] and r.why is None and r.left == ()


def test_a_round_is_its_choices_one_at_a_time() -> None:
    """Each start runs beside the next choice as a compile that has just started (`admission.running` at
    0 s, nothing seen of it): a round decides as single choices would, one compile at a time."""
    envelope = tuple([3 * GIB] * 40 + [GIB] * 40)
    rise = tuple([GIB // 4] * 20 + [3 * GIB] * 60)
    waiting = [
        waiter(0, 3 * GIB, wall_s=60.0, envelope=envelope, rise=rise),  # profiled, with a low front end
        waiter(1, 2 * GIB, threads=2),
        waiter(2, 3 * GIB, wall_s=30.0, envelope=envelope, rise=rise),
        waiter(3, GIB),
        waiter(4, 4 * GIB),
    ]
    limits = {**LIMITS, "cpus": 8.0}
    whole = admission.dispatch(waiting, used_bytes=GIB, running=[], **limits)
    left, view = list(waiting), []
    for start in whole.starts:
        chosen, decision = admission.choose(left, used_bytes=GIB, running=view, **limits)
        assert chosen == start.waiting and decision == start.decision
        left.remove(chosen)
        for pid, line in decision.lines:
            view = [admission.with_line(r, line) if r.pid == pid else r for r in view]
        view.append(
            admission.running(
                chosen.pid, chosen.prediction, elapsed_s=0.0, seen_bytes=0, rss_bytes=0,
                threads=chosen.threads, waves=chosen.waves, front_bytes=start.front_bytes,
                line_bytes=decision.line_bytes,
            )
        )  # fmt: skip
    assert len(whole.starts) >= 2 and list(whole.left) == left
    assert whole.starts[0].front_bytes is not None  # the profiled one started for its front end


def test_a_line_is_seen_in_the_round_as_the_next_round_sees_it() -> None:
    # a compile started for its front end and then given a line may grow to that line without asking: the
    # rest of the round counts it there, as `admission.running` does from the state file in the next round
    p = Prediction(peak_bytes=4 * GIB)
    for front in (None, GIB):
        now = admission.running(
            7, p, elapsed_s=1.0, seen_bytes=0, rss_bytes=GIB // 2, threads=1, waves=1, front_bytes=front
        )
        lined = admission.running(
            7, p, elapsed_s=1.0, seen_bytes=0, rss_bytes=GIB // 2, threads=1, waves=1, front_bytes=front,
            line_bytes=3 * GIB,
        )  # fmt: skip
        assert admission.with_line(now, 3 * GIB) == lined


def test_estimated_compiles_start_beside_lines() -> None:
    # a compile of an estimated 6 GiB runs at 1 GiB; a second estimated 6 GiB does not fit beside its
    # booking, but starts by what it holds: both get lines, which the round hands back with the start
    first = admission.running(
        1, Prediction(peak_bytes=6 * GIB), elapsed_s=20.0, seen_bytes=GIB, rss_bytes=GIB, threads=1, waves=1
    )
    r = admission.dispatch([waiter(0, 3 * GIB)], used_bytes=GIB, running=[first], **LIMITS)
    assert started(r) == ["0"]
    (start,) = r.starts
    assert dict(start.decision.lines).keys() == {1} and start.decision.line_bytes is not None


# --- both callers run it -----------------------------------------------------------------------------------


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[dict[str, Any], Round]]:
    """Every dispatch round run, with its arguments."""
    calls: list[tuple[dict[str, Any], Round]] = []
    real = admission.dispatch

    def spy(waiting: list[Waiting], **kw: Any) -> Round:
        decided = real(waiting, **kw)
        bound = inspect.signature(real).bind(list(waiting), **kw)
        bound.apply_defaults()  # the arguments as the round saw them, those left out too
        calls.append((dict(bound.arguments), decided))
        return decided

    monkeypatch.setattr(admission, "dispatch", spy)
    return calls


@pytest.fixture
def live_pids() -> Iterator[list[str]]:
    """Three live processes, whose pids stand for waiting wrappers (the state drops dead ones)."""
    sleepers = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    try:
        yield [str(p.pid) for p in sleepers]
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


ESTIMATES = (3 * GIB, 3 * GIB, 2 * GIB)


def gate_round(tmp_path: Path, pids: list[str]) -> None:
    info = cgroup.CgroupInfo(version=0, memory_limit=None, memory_usage=None, memory_peak=None, cpus=2.0)
    # no cgroup to read: what this session's cgroup holds is no compile's business here
    settings = protocol.WrapperEnv(cgroup_root=str(tmp_path / "no-cgroup"))
    me = Admission(str(tmp_path), limit=8 * GIB, info=info, threads=1, waves=1, settings=settings)
    with locked_state(str(tmp_path)) as state:
        state["waiting"] = {
            pid: {"key": f"t{i}.cu|compute_80|1", "estimate_bytes": e, "ticket": i, "threads": 1, "waves": 1}
            for i, (pid, e) in enumerate(zip(pids, ESTIMATES, strict=True))
        }
    assert me.dispatching()
    me.dispatch(Predictor({}), Reasons("waiting"))
    me.stop_dispatching()


def simulator_round() -> None:
    tasks = [S.Task(name=f"t{i}.cu|compute_80|1", phases=((10.0, 100 * MIB, 1),)) for i in range(3)]
    estimates = {t.name: e for t, e in zip(tasks, ESTIMATES, strict=True)}
    model = S.AdmissionModel(limit_bytes=8 * GIB, headroom_bytes=GIB // 2, cpus=2.0, estimates=estimates)
    S.run_attempt(tasks, limit_bytes=8 * GIB, cores=2.0, jobs=3, admit=model)


def test_the_wrapper_and_the_simulator_run_the_same_round(
    tmp_path: Path, live_pids: list[str], recorded: list[tuple[dict[str, Any], Round]]
) -> None:
    gate_round(tmp_path, live_pids)
    assert len(recorded) == 1
    (gate_args, gate_decided) = recorded.pop()
    # the wrapper's dispatcher did what the round said: a grant for each start, the rest still waiting
    granted = {p.name.removeprefix("granted-") for p in tmp_path.glob("granted-*")}
    assert granted == {s.waiting.key for s in gate_decided.starts} and len(granted) == 2
    simulator_round()
    sim_args, sim_decided = recorded[0]  # its first round, at 0 s with nothing running
    # the same compiles, limits and usage on both sides ...
    for args in (gate_args, sim_args):
        args["waiting"] = [(w.ticket, w.prediction, w.threads, w.waves) for w in args["waiting"]]
    assert gate_args == sim_args
    # ... and the same decisions
    assert [(s.waiting.ticket, s.decision, s.front_bytes) for s in gate_decided.starts] == [
        (s.waiting.ticket, s.decision, s.front_bytes) for s in sim_decided.starts
    ]
    assert gate_decided.why == sim_decided.why and [w.ticket for w in gate_decided.left] == [2]
