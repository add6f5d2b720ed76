"""One compile's part in its build's admission: waiting for its start, publishing what it reached, and
stopping it at its rise until its peak is granted."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

from . import admission, cgroup, protocol
from .bell import Bell, ring
from .environ import log, read_cgroup
from .measure import signal_group
from .predictor import Predictor
from .procs import sibling_wrappers, this_job, tree_kids, tree_rss, tree_workers
from .state import locked_state, peek_state, prediction_entry, prediction_of


def running_states(
    state: dict[str, Any], kids: dict[int, list[int]], now: float
) -> dict[str, admission.Running]:
    """What admission sees of each running compile; records in `state` the most RSS seen of each, and since
    when it holds steady (`admission.STEADY_GROWTH`)."""
    found: dict[str, admission.Running] = {}
    for pid, r in state["running"].items():
        rss = tree_rss(int(pid), kids)
        # the most RSS seen of a running compile tells whether its peak is behind it
        r["seen"] = max(int(r.get("seen", 0)), rss)
        if rss > int(r.get("steady", 0)) * admission.STEADY_GROWTH:
            r["steady"], r["steady_at"] = rss, now
        front = r.get("front")
        line = r.get("line")
        found[pid] = admission.running(
            int(pid),
            prediction_of(r),
            elapsed_s=now - float(r["start"]) - float(r.get("paused_s", 0.0)),
            seen_bytes=r["seen"],
            rss_bytes=rss,
            threads=tree_workers(int(pid), kids, int(r.get("threads", 1))),
            waves=int(r.get("waves", 2)),
            front_bytes=None if front is None else int(front),
            paused=bool(r.get("paused")),
            line_bytes=None if line is None else int(line),
            steady_s=now - float(r.get("steady_at", now)),
        )
    return found


def line_path(state_dir: str, pid: str) -> str:
    """The file holding a running compile's line (`admission.metered`), which its wrapper reads at every
    sample; none while it has no line."""
    return os.path.join(state_dir, f"line-{pid}")


def set_line(state_dir: str, pid: str, line: int | None) -> None:
    path = line_path(state_dir, pid)
    if line is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        fh.write(str(line))
    os.replace(tmp, path)


def read_line(state_dir: str, pid: str) -> int | None:
    try:
        with open(line_path(state_dir, pid)) as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return None


# How often the first dispatcher looks for sibling jobs that have not asked yet (their Python is starting).
BURST_CHECK_S = 0.02
# A new peak is published to the other wrappers once it is this much above the last one published.
PUBLISH_STEP = 1.05


class Admission:
    """One compile's part in the build's admission: waiting for its start, then, while it runs, publishing
    what it reached and, when it was admitted for its front end only, stopping it at its rise until its peak
    is granted (two-stage admission, `admission.choose` and `admission.grant_peak`)."""

    def __init__(
        self,
        state_dir: str,
        *,
        limit: int,
        info: cgroup.CgroupInfo,
        threads: int,
        waves: int,
        settings: protocol.WrapperEnv | None = None,
    ) -> None:
        settings = settings or protocol.WrapperEnv()
        self.state_dir = state_dir
        self.me = str(os.getpid())
        self.limit = limit
        headroom = settings.headroom_bytes
        self.headroom = admission.default_headroom(limit) if headroom is None else headroom
        self.cpus = settings.cpus or cgroup.effective_cpus(info)
        self.poll = settings.poll_s
        self.cgroup_root = settings.cgroup_root
        self.threads = threads
        self.waves = waves
        self.front: int | None = None
        self.stopped_s = 0.0
        self.published = 0
        self.promised: admission.Prediction | None = None
        self.dispatch_lock: IO[str] | None = None
        self.bell = Bell(state_dir, self.me)
        self.job = this_job()

    def limits(self) -> dict[str, Any]:
        return {"limit_bytes": self.limit, "headroom_bytes": self.headroom, "cpus": self.cpus}

    @contextlib.contextmanager
    def observe(self) -> Iterator[tuple[dict[str, Any], dict[str, admission.Running], int]]:
        """The locked state, what admission sees of the running compiles, and the cgroup's usage."""
        used = read_cgroup(self.cgroup_root).in_use or 0
        with locked_state(self.state_dir) as state:
            kids = tree_kids(int(pid) for pid in state["running"])
            yield state, running_states(state, kids, time.time()), used

    def wait(self, key: str, estimate_bytes: int, predictor: Predictor) -> tuple[float, admission.Prediction]:
        """Wait for this compile's start: seconds waited, and the prediction it was admitted with.

        One waiting wrapper at a time dispatches (it holds `dispatch.lock`): each poll it starts every
        waiting compile that may start, in priority order (`admission.dispatch`, which the simulator runs
        too). The others only
        look for their grant, so with hundreds of compiles waiting (flash-attn: 288 on 128 cores) the build
        reads and decides once per poll, not once per waiter and poll."""
        t0 = time.monotonic()
        self.register(key, estimate_bytes)
        burst_until: float | None = t0 + self.poll
        said = Reasons("waiting")
        try:
            while True:
                if self.dispatching():
                    if burst_until is not None:
                        self.await_burst(burst_until)
                    burst_until = None
                    self.dispatch(predictor, said)
                granted = self.granted(key, estimate_bytes)
                if granted is not None:
                    break
                self.bell.nap(self.poll)
        finally:
            self.stop_dispatching()
        prediction = prediction_of(granted)
        mine = predictor.predict(key, estimate_bytes)
        if prediction == mine:
            prediction = mine  # the object `sampled` tells changes by
        self.promised = prediction
        self.front = None if granted.get("front") is None else int(granted["front"])
        if self.front is not None:
            log(
                f"started for its front end ({self.front / 2**30:.2f} GiB); its peak "
                f"({prediction.peak_bytes / 2**30:.2f} GiB) is granted when it rises"
            )
        return time.monotonic() - t0, prediction

    def await_burst(self, until: float) -> None:
        """Until every wrapper among this one's sibling jobs has asked, or until `until`: ninja starts its
        jobs in a burst, and the first to ask would otherwise start before the others have asked, whatever
        their priority. A job that is not a compile (a C++ file, nvcc --version) never runs as a wrapper for
        long, so it is never waited for."""
        while time.monotonic() < until:
            state = peek_state(self.state_dir)
            asked = {int(pid) for table in ("waiting", "running") for pid in state.get(table, {})}
            if sibling_wrappers(self.job.starter) <= asked | {os.getpid()}:
                return
            time.sleep(BURST_CHECK_S)

    def dispatching(self) -> bool:
        """Whether this wrapper dispatches: it already does, or no other wrapper does (the lock of one that
        died is free again)."""
        if self.dispatch_lock is None:
            fh = open(os.path.join(self.state_dir, "dispatch.lock"), "a+")  # noqa: SIM115 (held across polls)
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                fh.close()
                return False
            self.dispatch_lock = fh
        return True

    def stop_dispatching(self) -> None:
        if self.dispatch_lock is not None:
            self.dispatch_lock.close()  # releases the lock: the next waiter to poll takes it over
            self.dispatch_lock = None

    def dispatch(self, predictor: Predictor, said: Reasons) -> None:
        """Start every waiting compile that may start now, in priority order: each moves to `running` and
        finds its grant file at its next poll."""
        # predicted before the lock is taken (the state file is replaced whole, so a read without it is a
        # consistent one): in a first build every waiting compile's prediction changes after each compile
        # that ends, and the running compiles' wrappers must not wait for that
        for w in peek_state(self.state_dir).get("waiting", {}).values():
            with contextlib.suppress(KeyError, TypeError, ValueError):
                predictor.predict(str(w["key"]), int(w["estimate_bytes"]))
        with self.observe() as (state, running, used):
            state["dispatcher"] = self.me  # for whoever reads the state: which wrapper decides
            state["rounds"] = int(state.get("rounds", 0)) + 1
            waiting = [
                admission.Waiting(
                    key=pid,
                    prediction=predictor.predict(str(w["key"]), int(w["estimate_bytes"])),
                    threads=int(w.get("threads", 1)),
                    ticket=int(w["ticket"]),
                    pid=int(pid),
                    waves=int(w.get("waves", 1)),
                )
                for pid, w in state["waiting"].items()
            ]
            decided = admission.dispatch(
                waiting, used_bytes=used, running=list(running.values()), **self.limits()
            )
            for start in decided.starts:
                for pid, line in start.decision.lines:
                    # a running compile's line, set before the new one can start: its wrapper stops it there
                    state["running"][str(pid)]["line"] = line
                    set_line(self.state_dir, str(pid), line)
                chosen = start.waiting
                del state["waiting"][chosen.key]
                state["running"][chosen.key] = {
                    **prediction_entry(chosen.prediction), "threads": chosen.threads, "waves": chosen.waves,
                    "start": time.time(), "front": start.front_bytes, "line": start.decision.line_bytes,
                }  # fmt: skip
                set_line(self.state_dir, chosen.key, start.decision.line_bytes)
                with open(self.grant_path(chosen.key), "w"):
                    pass
        ring(self.state_dir, (s.waiting.key for s in decided.starts if s.waiting.key != self.me))
        if decided.left:
            reason = decided.why.reason if decided.why is not None else "no compile fits"
            n = len(decided.left)
            said.note(reason if n == 1 else f"{reason}; {n} compiles wait")

    def register(self, key: str, estimate_bytes: int) -> None:
        self.bell.hang()  # before anyone can see it waiting and ring
        with locked_state(self.state_dir) as state:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.grant_path(self.me))  # left by a dead wrapper of the same pid
            state["waiting"][self.me] = {
                "key": key, "estimate_bytes": estimate_bytes, "threads": self.threads, "waves": self.waves,
                "ticket": self.job.order,
            }  # fmt: skip

    def grant_path(self, pid: str) -> str:
        return os.path.join(self.state_dir, f"granted-{pid}")

    def granted(self, key: str, estimate_bytes: int) -> dict[str, Any] | None:
        """This compile's running entry once a dispatcher started it, else None (one stat per poll)."""
        path = self.grant_path(self.me)
        if not os.path.exists(path):
            return None
        with locked_state(self.state_dir) as state:
            os.unlink(path)
            entry: dict[str, Any] | None = state["running"].get(self.me)
        if entry is None:  # the state was lost since (a state file cut short reads as empty): ask again
            self.register(key, estimate_bytes)
        return entry

    def sampled(
        self, rss: int, child: subprocess.Popen[bytes], refresh: Callable[[], admission.Prediction]
    ) -> float:
        """After each RSS sample of the running compile: publish a new peak and a refreshed prediction (the
        build's finished siblings give an unprofiled compile a time course); stop the compile at its rise, or
        once it passes its line (`admission.metered`), until its peak is granted. Returns the seconds it was
        stopped."""
        latest = refresh()  # the same object until a sibling's measurement changes it
        changed = latest is not self.promised
        line = read_line(self.state_dir, self.me)
        rising = (self.front is not None and admission.rises(self.front, rss)) or (
            line is not None and rss > line
        )
        if not (changed or rising or rss > self.published * PUBLISH_STEP):
            return 0.0
        self.promised = latest
        self.published = max(self.published, rss)
        with locked_state(self.state_dir) as state:
            mine = state["running"].get(self.me)
            if mine is not None:
                mine["seen"] = max(int(mine.get("seen", 0)), rss)
                mine.update(prediction_entry(latest))
        return self.grant_peak(child, rss) if rising else 0.0

    def grant_peak(self, child: subprocess.Popen[bytes], rss: int) -> float:
        """Stop the compile (its process group) until its peak fits; its front-end reservation becomes its
        envelope's."""
        t0 = time.monotonic()
        stopped = False
        said = Reasons(f"stopped at its rise ({rss / 2**30:.2f} GiB)")
        while True:
            with self.observe() as (state, running, used):
                own = running.get(self.me)
                if own is None:
                    break
                decision = admission.grant_peak(
                    own,
                    used_bytes=used,
                    others=[r for pid, r in running.items() if pid != self.me],
                    threads=self.threads,
                    **self.limits(),
                )
                mine = state["running"][self.me]
                if decision.admit:
                    mine.update(front=None, paused=False, line=decision.line_bytes)
                    set_line(self.state_dir, self.me, decision.line_bytes)
                    mine["paused_s"] = float(mine.get("paused_s", 0.0)) + time.monotonic() - t0
                    break
                if not stopped:
                    signal_group(child, signal.SIGSTOP)
                    stopped = True
                    mine["paused"] = True
            said.note(decision.reason)
            self.bell.nap(self.poll)
        self.front = None
        if not stopped:
            return 0.0
        signal_group(child, signal.SIGCONT)
        waited = time.monotonic() - t0
        self.stopped_s += waited
        log(f"peak granted after {waited:.1f} s")
        return waited

    def release(self) -> None:
        """Give back what this compile held, and wake those that wait for it: the dispatcher (every waiting
        wrapper when none is waiting: one of them takes its place) and every compile stopped at its rise."""
        with locked_state(self.state_dir) as state:
            state["running"].pop(self.me, None)
            state["waiting"].pop(self.me, None)
            set_line(self.state_dir, self.me, None)
            waiting = state["waiting"]
            dispatcher: str | None = state.get("dispatcher")
            wake = [dispatcher] if dispatcher is not None and dispatcher in waiting else list(waiting)
            wake += [pid for pid, r in state["running"].items() if r.get("paused")]
        self.bell.take_down()
        ring(self.state_dir, wake)


class Reasons:
    """Why a compile waits, logged when it changes but at most every REASON_EVERY_S: with many compiles
    coming and going the reason changes at nearly every poll."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.last = ""
        self.at = -REASON_EVERY_S

    def note(self, reason: str) -> None:
        now = time.monotonic()
        if reason != self.last and now - self.at >= REASON_EVERY_S:
            self.last, self.at = reason, now
            log(f"{self.what} ({reason})")


REASON_EVERY_S = 30.0
