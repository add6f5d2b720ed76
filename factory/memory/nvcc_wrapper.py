#!/usr/bin/env python3
"""nvcc admission wrapper: every nvcc call of a build passes through here (PYTORCH_NVCC, or `nvcc` first on
PATH).

A compile starts only when its predicted peak fits the cgroup's remaining memory, or, when its profile shows
a low front end (preprocessing, parsing), when that fits: it is then stopped (SIGSTOP of its process group)
as it rises past it, until its peak fits. Its real peak RSS, wall and CPU time and course are measured and
appended to a profile. Standard library only: it runs with the build container's Python, next to admission.py
and cgroup.py (copied alongside it), which hold the decision and the cgroup reading.

One waiting wrapper at a time (the holder of FACTORY_STATE_DIR/dispatch.lock) decides for every waiting
compile of the build and starts each that may start; the others only look for their grant file. It predicts
them from their keys and estimates with its own profile and recipe figures: the wrappers of one build share
their environment. Between polls each wrapper naps on its doorbell (`Bell`): a compile that ends rings the
waiting ones, a dispatcher rings those it started, so a core passes from one compile to the next within
milliseconds, not a poll or two.

Environment:
  FACTORY_REAL_NVCC            the real nvcc (default $CUDA_HOME/bin/nvcc)
  FACTORY_STATE_DIR            directory shared by all compiles of one build; without it nvcc runs unadmitted
  FACTORY_PROFILE_IN           learned profile JSON ({"entries": {key: {"peak_bytes", "wall_s"}}})
  FACTORY_PROFILE_JSON         the same profile inline (wins over FACTORY_PROFILE_IN)
  FACTORY_PROFILE_OUT          JSON lines file the measurements are appended to
  FACTORY_MEM_LIMIT            bytes (default: the cgroup's limit)
  FACTORY_EST_PER_ARCH_BYTES   estimate per arch per nvcc thread for files without a profile entry
  FACTORY_EST_BY_FILE          per-file estimates before that one: JSON [[glob on the base name, bytes], ...],
                               the first match wins
  FACTORY_AFTER_PEAK           the recipe's compile_after_peak: what an unprofiled compile holds at most
                               past its peak, as a fraction of it
  FACTORY_SECONDS_BY_FILE      the recipe's compile_seconds_by_file: JSON [[glob, seconds], ...]; unprofiled
                               compiles wait in its order, longest first
  FACTORY_EST_BASE_BYTES       nvcc's own share of a compile's peak
  FACTORY_HEADROOM_BYTES       memory kept free for linking and Python
  FACTORY_CPUS                 CPUs (default: cgroup quota or affinity)
  FACTORY_CGROUP_ROOT          where the cgroup file system is mounted (default /sys/fs/cgroup)
  FACTORY_POLL_S               seconds between admission checks (default 0.5)
  FACTORY_ADMISSION            "off": measure and record only, start at once (for comparisons)
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import resource
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

import admission
import cgroup

DEFAULT_EST_PER_ARCH = 4 << 30
MARKER = "::factory-compile::"
PAGE = os.sysconf("SC_PAGE_SIZE")


def log(message: str) -> None:
    if os.environ.get("FACTORY_WRAPPER_QUIET") != "1":
        print(f"factory-nvcc: {message}", file=sys.stderr, flush=True)


def real_nvcc() -> str:
    real = os.environ.get("FACTORY_REAL_NVCC") or os.path.join(
        os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"
    )
    if os.path.realpath(real) == os.path.realpath(__file__):
        sys.exit("factory-nvcc: FACTORY_REAL_NVCC points at the wrapper itself")
    if not (os.path.isfile(real) and os.access(real, os.X_OK)):
        sys.exit(f"factory-nvcc: no nvcc at {real} (set FACTORY_REAL_NVCC, or CUDA_HOME)")
    return real


def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        # the command name may hold spaces and parentheses: fields start after the last ')'
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(name))
    return kids


# /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN) lists a thread's children: walking down from a compile
# reads a few files, where scanning /proc reads one per process of the machine (hundreds in a large build)
CHILDREN_FILES = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def kids_of(pid: int) -> list[int]:
    """The children of one process (by CHILDREN_FILES); [] when it ended."""
    found: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                found.extend(int(c) for c in fh.read().split())
    except (OSError, ValueError):
        pass  # it ended meanwhile
    return found


def tree_kids(roots: Iterable[int]) -> dict[int, list[int]]:
    """The children of every process under `roots`."""
    if not CHILDREN_FILES:
        return children_map()
    kids: dict[int, list[int]] = {}
    stack = list(roots)
    while stack:
        pid = stack.pop()
        kids[pid] = kids_of(pid)
        stack.extend(kids[pid])
    return kids


# What may stand between ninja and a wrapper as the parent of the next: the shell ninja (and make, and a
# subprocess with shell=True) runs each command with, and launchers a command may start the compiler through.
LAUNCHERS = frozenset({"sh", "dash", "bash", "busybox", "ccache", "timeout", "time"})
SELF = os.path.realpath(__file__)


@dataclasses.dataclass(frozen=True)
class Proc:
    comm: str
    parent: int
    started: int  # clock ticks after boot


def proc(pid: int) -> Proc | None:
    """A process's name, parent and start; None when it ended."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    comm, _, rest = stat.partition(" (")[2].rpartition(")")
    fields = rest.split()  # from the 3rd field of proc_pid_stat(5) on
    return Proc(comm=comm, parent=int(fields[1]), started=int(fields[19]))


@dataclasses.dataclass(frozen=True)
class Job:
    starter: int  # the process that started the job: ninja
    # the order ninja started its jobs in: when the job's process (the shell ninja started, or this wrapper)
    # started, then its pid (allocated in that order)
    order: int


PID_LIMIT = 1 << 22  # the kernel's most pids (pid_max at most)


def this_job() -> Job:
    """This compile's job: its process is this wrapper, or the shell (or launcher) above it that ninja
    started."""
    pid = os.getpid()
    me = proc(pid)
    if me is None:  # no /proc: nothing to tell the jobs apart by but when they ask
        return Job(starter=os.getppid(), order=time.time_ns())
    job, at = pid, me
    for _ in range(4):
        parent = proc(at.parent)
        if parent is None or parent.comm not in LAUNCHERS or parent.parent <= 1:
            break
        job, at = at.parent, parent
    return Job(starter=at.parent, order=at.started * PID_LIMIT + job)


def is_wrapper(pid: int) -> bool:
    """Whether a process runs this wrapper: `python3 [OPTIONS] WRAPPER ...`, as its shebang starts it, the
    path as the process was given it (through a link named nvcc, or relative to its own directory)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            args = [os.fsdecode(a) for a in fh.read().split(b"\0")[1:4]]
        script = next((a for a in args if not a.startswith("-")), None)
        if script is None:
            return False
        return os.path.realpath(os.path.join(os.readlink(f"/proc/{pid}/cwd"), script)) == SELF
    except OSError:
        return False  # it ended, or is not ours to read


def sibling_wrappers(starter: int) -> set[int]:
    """The wrappers among the jobs `starter` runs: its children, or theirs under a shell and a launcher; not
    what runs under a wrapper (nvcc, cicc)."""
    found: set[int] = set()
    table = None if CHILDREN_FILES else children_map()  # one scan of /proc for the whole walk
    level = [starter]
    for _ in range(3):
        below: list[int] = []
        for pid in level:
            for kid in kids_of(pid) if table is None else table.get(pid, []):
                if is_wrapper(kid):
                    found.add(kid)
                else:
                    below.append(kid)
        level = below
    return found


def tree_rss(pid: int, kids: dict[int, list[int]] | None = None) -> int:
    """Summed resident memory of a process and its descendants."""
    kids = tree_kids([pid]) if kids is None else kids
    total = 0
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/statm") as fh:
                total += int(fh.read().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            pass
        stack.extend(kids.get(p, ()))
    return total


def tree_workers(pid: int, kids: dict[int, list[int]], most: int) -> int:
    """Busy threads of a compile now: the leaves of its process tree (nvcc runs one cicc or ptxas per arch
    side by side), at least 1 and at most the threads it was admitted with."""
    leaves = 0
    stack = list(kids.get(pid, ()))
    while stack:
        p = stack.pop()
        below = kids.get(p, ())
        if below:
            stack.extend(below)
        else:
            leaves += 1
    return max(1, min(most, leaves))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def locked_state(state_dir: str) -> Iterator[dict[str, Any]]:
    """The reservations file, read and written under an exclusive lock; dead pids are dropped."""
    os.makedirs(state_dir, exist_ok=True)
    path = os.path.join(state_dir, "admission.json")
    with open(os.path.join(state_dir, "admission.lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        raw, state = read_state(path)
        state.setdefault("running", {})
        state.setdefault("waiting", {})
        for table in ("running", "waiting"):
            for pid in [p for p in state[table] if not alive(int(p))]:
                del state[table][pid]
        yield state
        text = json.dumps(state)  # json.dumps encodes in C; json.dump to a file, in Python, 10x slower
        if text != raw:
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as fh:
                fh.write(text)
            os.replace(tmp, path)


def peek_state(state_dir: str) -> dict[str, Any]:
    """The reservations file as last written, without the lock; {} when there is none."""
    return read_state(os.path.join(state_dir, "admission.json"))[1]


def read_state(path: str) -> tuple[str, dict[str, Any]]:
    """The reservations file's text and what it holds; {} when it is missing or not a state."""
    try:
        with open(path) as fh:
            raw = fh.read()
        state = json.loads(raw)
    except (OSError, ValueError):
        return "", {}
    return raw, state if isinstance(state, dict) else {}


def load_profile(path: str | None, inline: str | None = None) -> dict[str, dict[str, Any]]:
    """The learned profile's entries; one that cannot be read is said, and the compile is predicted without
    it (by the recipe's figures), never failed for it."""
    try:
        if inline:
            data = json.loads(inline)
        elif path:
            with open(path) as fh:
                data = json.load(fh)
        else:
            return {}
    except (OSError, ValueError) as exc:
        log(f"cannot read the learned profile ({path or 'inline'}): {exc}; predicting without it")
        return {}
    entries = data.get("entries", {}) if isinstance(data, dict) else {}
    return entries if isinstance(entries, dict) else {}


def load_measurements(path: str | None) -> dict[str, dict[str, Any]]:
    """This build's successful compiles so far (FACTORY_PROFILE_OUT), as profile entries."""
    found: dict[str, dict[str, Any]] = {}
    if not path:
        return found
    try:
        with open(path) as fh:
            lines = fh.readlines()
    except OSError:
        return found
    for line in lines:
        try:
            raw = json.loads(line)
            if int(raw.get("rc", 1)) == 0 and raw.get("wall_s"):
                found[str(raw["key"])] = {
                    "peak_bytes": int(raw["peak_bytes"]),
                    "wall_s": float(raw["wall_s"]),
                    "envelope": [int(v) for v in raw.get("envelope") or ()],
                    "rise": [int(v) for v in raw.get("rise") or ()],
                }
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # a line cut short by a kill
    return found


class Predictor:
    """Predictions of this build's compiles, refreshed as its compiles finish: their measurements
    (FACTORY_PROFILE_OUT) shape the prediction of a file the profile does not know. Every wrapper of a build
    has the same profile and recipe figures, so any of them can predict any compile from its key and
    estimate; a prediction is the same object until a measurement changes it."""

    def __init__(
        self,
        profile: dict[str, dict[str, Any]],
        *,
        after_peak: float | None = None,
        seconds_by_file: tuple[tuple[str, float], ...] = (),
    ) -> None:
        self.profile = profile
        self.entries = profile
        self.known: dict[str, Any] = {"after_peak": after_peak, "seconds_by_file": seconds_by_file}
        self.out = os.environ.get("FACTORY_PROFILE_OUT")
        self.stamp: tuple[int, int] | None = None
        self.cache: dict[tuple[str, int], admission.Prediction] = {}

    def predict(self, key: str, estimate_bytes: int) -> admission.Prediction:
        if key not in self.profile:
            self._refresh()
        found = self.cache.get((key, estimate_bytes))
        if found is None:
            found = admission.predict_from(self.entries, key, estimate_bytes=estimate_bytes, **self.known)
            self.cache[(key, estimate_bytes)] = found
        return found

    def _refresh(self) -> None:
        if not self.out:
            return
        try:
            st = os.stat(self.out)
        except OSError:
            return
        stamp = (st.st_size, st.st_mtime_ns)
        if stamp != self.stamp:
            self.stamp = stamp
            self.entries = {**load_measurements(self.out), **self.profile}
            # what the profile knows does not change with the build's measurements
            self.cache = {k: v for k, v in self.cache.items() if k[0] in self.profile}


def read_cgroup() -> cgroup.CgroupInfo:
    """The limits and usage of the cgroup this compile runs in (FACTORY_CGROUP_ROOT: where the cgroup file
    system is, when not at /sys/fs/cgroup)."""
    return cgroup.read_cgroup(os.environ.get("FACTORY_CGROUP_ROOT") or "/sys/fs/cgroup")


def env_int(name: str, default: int | None) -> int | None:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return int(float(value))
    except ValueError:
        return default


def env_fraction(name: str) -> float | None:
    """A fraction in (0, 1] from the environment; anything else is ignored (None), never fatal."""
    try:
        value = float(os.environ.get(name) or "nan")
    except ValueError:
        return None
    return value if 0 < value <= 1 else None


def prediction_entry(p: admission.Prediction) -> dict[str, Any]:
    """A prediction as the state file holds it, for waiting and running compiles alike."""
    return {
        "bytes": p.peak_bytes,
        "seconds": p.wall_s,
        "envelope": list(p.envelope),
        "inferred": p.inferred,
        "rise": list(p.rise),
        "after_peak": p.after_peak,
        "order_s": p.order_s,
    }


def prediction_of(entry: dict[str, Any]) -> admission.Prediction:
    """The prediction a state file entry holds (`prediction_entry`)."""
    return admission.Prediction(
        peak_bytes=int(entry["bytes"]),
        wall_s=entry.get("seconds"),
        envelope=tuple(int(v) for v in entry.get("envelope") or ()),
        inferred=bool(entry.get("inferred")),
        rise=tuple(int(v) for v in entry.get("rise") or ()),
        after_peak=entry.get("after_peak"),
        order_s=entry.get("order_s"),
    )


def running_states(
    state: dict[str, Any], kids: dict[int, list[int]], now: float
) -> dict[str, admission.Running]:
    """What admission sees of each running compile; records the most RSS seen of each in `state`."""
    found: dict[str, admission.Running] = {}
    for pid, r in state["running"].items():
        rss = tree_rss(int(pid), kids)
        # the most RSS seen of a running compile tells whether its peak is behind it
        r["seen"] = max(int(r.get("seen", 0)), rss)
        front = r.get("front")
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
        )
    return found


# How often the first dispatcher looks for sibling jobs that have not asked yet (their Python is starting).
BURST_CHECK_S = 0.02
# A new peak is published to the other wrappers once it is this much above the last one published.
PUBLISH_STEP = 1.05


class Bell:
    """A wrapper's doorbell: a FIFO in the state directory (`bell-PID`) that it naps on between polls
    (`nap`), so that whoever changes what it waits for wakes it at once (`ring`). Where a FIFO cannot be
    made, or nobody rings, a nap is the poll's sleep."""

    def __init__(self, state_dir: str, pid: str) -> None:
        self.path = bell_path(state_dir, pid)
        self.fd: int | None = None
        self.failed = False

    def hang(self) -> None:
        """Make the FIFO and open it, so that rings from now on are kept until the next nap."""
        if self.fd is not None or self.failed:
            return
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)  # the first wrapper of a build hangs first
            with contextlib.suppress(FileExistsError):  # left by a dead wrapper of the same pid
                os.mkfifo(self.path, 0o600)
            # read and write: the FIFO always has a writer (this one), so it never reads as closed
            self.fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)
        except OSError:
            self.failed = True  # a file system without FIFOs: every nap is a poll's sleep, with no retry

    def nap(self, seconds: float) -> bool:
        """Sleep until rung or for `seconds`; whether it was rung."""
        self.hang()
        if self.fd is None:
            time.sleep(seconds)
            return False
        ready, _, _ = select.select([self.fd], [], [], seconds)
        if ready:
            with contextlib.suppress(BlockingIOError):
                os.read(self.fd, 4096)  # every ring so far: one wake for all of them
        return bool(ready)

    def take_down(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def bell_path(state_dir: str, pid: str) -> str:
    return os.path.join(state_dir, f"bell-{pid}")


def ring(state_dir: str, pids: Iterable[str]) -> None:
    """Wake the wrappers of `pids` from their naps; one without a bell (it ended, or could not make one) is
    left to its poll."""
    for pid in pids:
        try:
            fd = os.open(bell_path(state_dir, pid), os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue  # no FIFO, or nobody reads it (ENXIO): nothing to wake
        with contextlib.suppress(OSError):  # full (EAGAIN): it has rings to read already
            os.write(fd, b"\0")
        os.close(fd)


class Admission:
    """One compile's part in the build's admission: waiting for its start, then, while it runs, publishing
    what it reached and, when it was admitted for its front end only, stopping it at its rise until its peak
    is granted (two-stage admission, `admission.choose` and `admission.grant_peak`)."""

    def __init__(
        self, state_dir: str, *, limit: int, info: cgroup.CgroupInfo, threads: int, waves: int
    ) -> None:
        self.state_dir = state_dir
        self.me = str(os.getpid())
        self.limit = limit
        headroom = env_int("FACTORY_HEADROOM_BYTES", None)
        self.headroom = admission.default_headroom(limit) if headroom is None else headroom
        cpus_env = os.environ.get("FACTORY_CPUS")
        self.cpus = float(cpus_env) if cpus_env else cgroup.effective_cpus(info)
        self.poll = float(os.environ.get("FACTORY_POLL_S", "0.5"))
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
        used = read_cgroup().in_use or 0
        with locked_state(self.state_dir) as state:
            kids = tree_kids(int(pid) for pid in state["running"])
            yield state, running_states(state, kids, time.time()), used

    def wait(self, key: str, estimate_bytes: int, predictor: Predictor) -> tuple[float, admission.Prediction]:
        """Wait for this compile's start: seconds waited, and the prediction it was admitted with.

        One waiting wrapper at a time dispatches (it holds `dispatch.lock`): each poll it starts every
        waiting compile that may start, in priority order, as the simulator's `_admit` does. The others only
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
                )
                for pid, w in state["waiting"].items()
            ]
            view = list(running.values())
            decision: admission.Decision | None = None
            started: list[str] = []
            while waiting:
                chosen, decision = admission.choose(waiting, used_bytes=used, running=view, **self.limits())
                if chosen is None:
                    break
                waiting.remove(chosen)
                waves = int(state["waiting"].pop(chosen.key).get("waves", 1))
                front = admission.front_bytes(chosen.prediction)
                state["running"][chosen.key] = {
                    **prediction_entry(chosen.prediction), "threads": chosen.threads, "waves": waves,
                    "start": time.time(), "front": front,
                }  # fmt: skip
                view.append(
                    admission.running(
                        int(chosen.key), chosen.prediction, elapsed_s=0.0, seen_bytes=0, rss_bytes=0,
                        threads=chosen.threads, waves=waves, front_bytes=front,
                    )
                )  # fmt: skip
                with open(self.grant_path(chosen.key), "w"):
                    pass
                started.append(chosen.key)
        ring(self.state_dir, (pid for pid in started if pid != self.me))
        if waiting:
            reason = decision.reason if decision is not None else "no compile fits"
            said.note(reason if len(waiting) == 1 else f"{reason}; {len(waiting)} compiles wait")

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
            entry = state["running"].get(self.me)
        if entry is None:  # the state was lost since (a state file cut short reads as empty): ask again
            self.register(key, estimate_bytes)
        return entry

    def sampled(
        self, rss: int, child: subprocess.Popen[bytes], refresh: Callable[[], admission.Prediction]
    ) -> float:
        """After each RSS sample of the running compile: publish a new peak and a refreshed prediction (the
        build's finished siblings give an unprofiled compile a time course); stop the compile at its rise
        until its peak is granted. Returns the seconds it was stopped."""
        latest = refresh()  # the same object until a sibling's measurement changes it
        changed = latest is not self.promised
        rising = self.front is not None and admission.rises(self.front, rss)
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
                    mine.update(front=None, paused=False)
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
            waiting = state["waiting"]
            dispatcher = state.get("dispatcher")
            wake = [dispatcher] if dispatcher in waiting else list(waiting)
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


def signal_group(child: subprocess.Popen[bytes], signum: int) -> None:
    """nvcc and the cicc/ptxas it runs are one process group (`run_measured` starts it in its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signum)


def append_measurement(path: str, record: dict[str, Any]) -> None:
    line = json.dumps(record, sort_keys=True) + "\n"
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.write(line)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Measured:
    code: int
    samples: list[tuple[float, int]]  # (seconds since the start, RSS of the process tree)
    wall_s: float
    # CPU seconds of nvcc and every cicc/ptxas it ran and waited for: unlike wall time, not stretched by
    # other compiles waiting for the same cores
    cpu_s: float


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_measured(
    cmd: list[str], on_sample: Callable[[int, subprocess.Popen[bytes]], float] | None = None
) -> Measured:
    """A child run in its own process group, forwarding termination signals. `on_sample` hears of each
    sample and returns how long it kept the child stopped; stopped time counts neither in the samples' times
    nor in the total."""
    interval = float(os.environ.get("FACTORY_SAMPLE_S", "0.2"))
    cpu0 = children_cpu_s()  # the wrapper's only child is this compile
    t0 = time.monotonic()
    child = subprocess.Popen(cmd, start_new_session=True)  # its own process group, to stop and resume

    def forward(signum: int, _frame: object) -> None:
        signal_group(child, signum)
        signal_group(child, signal.SIGCONT)  # a stopped compile must see it

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    samples: list[tuple[float, int]] = []
    stopped = 0.0
    try:
        with exit_waiter(child) as exited:
            while child.poll() is None:
                rss = tree_rss(child.pid)
                samples.append((time.monotonic() - t0 - stopped, rss))
                if on_sample is not None:
                    stopped += on_sample(rss, child)
                exited(interval)
    finally:
        if child.poll() is None:  # the wrapper itself is failing: never leave a stopped compile behind
            signal_group(child, signal.SIGCONT)
    code = child.returncode
    return Measured(
        code=128 - code if code < 0 else code, samples=samples, wall_s=time.monotonic() - t0 - stopped,
        cpu_s=children_cpu_s() - cpu0,
    )  # fmt: skip


@contextlib.contextmanager
def exit_waiter(child: subprocess.Popen[bytes]) -> Iterator[Callable[[float], object]]:
    """A sleep of up to the given seconds that ends when `child` exits (its pidfd), so that its end is
    released to the waiting compiles at once rather than at the next sample. Without pidfds (Linux before
    5.3), a plain sleep."""
    try:
        pidfd = os.pidfd_open(child.pid)
    except (AttributeError, OSError):
        yield time.sleep
        return
    try:
        yield lambda seconds: select.select([pidfd], [], [], seconds)
    finally:
        os.close(pidfd)


def mem_seconds(samples: list[tuple[float, int]], wall: float) -> float:
    """Byte-seconds of the compile: each sample's RSS held until the next sample."""
    total = 0.0
    for (t, rss), nxt in zip(samples, [*(s[0] for s in samples[1:]), wall], strict=True):
        total += rss * max(0.0, nxt - t)
    return total


def main(argv: list[str]) -> int:
    nvcc = real_nvcc()
    call = admission.parse_nvcc_args(argv)
    state_dir = os.environ.get("FACTORY_STATE_DIR")
    if not call.is_compile or not state_dir:
        os.execv(nvcc, [nvcc, *argv])
    assert call.source is not None
    key = admission.profile_key(call.source, call.archs, call.threads)
    base = env_int("FACTORY_EST_BASE_BYTES", None)
    estimate = admission.compile_estimate(
        call.source,
        per_arch_bytes=env_int("FACTORY_EST_PER_ARCH_BYTES", DEFAULT_EST_PER_ARCH) or DEFAULT_EST_PER_ARCH,
        archs=len(call.archs),
        nvcc_threads=call.threads,
        base_bytes=admission.DEFAULT_BASE_BYTES if base is None else base,
        by_file=admission.parse_by_file(os.environ.get("FACTORY_EST_BY_FILE")),
    )
    predictor = Predictor(
        load_profile(os.environ.get("FACTORY_PROFILE_IN"), os.environ.get("FACTORY_PROFILE_JSON")),
        after_peak=env_fraction("FACTORY_AFTER_PEAK"),
        seconds_by_file=admission.parse_seconds_by_file(os.environ.get("FACTORY_SECONDS_BY_FILE")),
    )
    prediction = predictor.predict(key, estimate)
    threads = max(1, min(call.threads, len(call.archs)))
    info = read_cgroup()
    limit = env_int("FACTORY_MEM_LIMIT", None) or info.memory_limit
    waited = stopped = 0.0
    if os.environ.get("FACTORY_ADMISSION", "on") == "off" or limit is None:
        # measured only: for comparisons, or with no limit anywhere there is nothing to protect
        run = run_measured([nvcc, *argv])
    else:
        gate = Admission(
            state_dir, limit=limit, info=info, threads=threads, waves=-(-len(call.archs) // threads)
        )
        try:
            waited, prediction = gate.wait(key, estimate, predictor)
            refresh = functools.partial(predictor.predict, key, estimate)
            run = run_measured([nvcc, *argv], on_sample=lambda rss, child: gate.sampled(rss, child, refresh))
        finally:
            gate.release()
        stopped = gate.stopped_s
    code, samples, wall = run.code, run.samples, run.wall_s
    peak = max((rss for _, rss in samples), default=0)
    out = os.environ.get("FACTORY_PROFILE_OUT")
    record = {
        "key": key,
        "source": os.path.basename(call.source),
        "archs": list(call.archs),
        "threads": call.threads,
        "peak_bytes": peak,
        "wall_s": round(wall, 3),
        "cpu_s": round(run.cpu_s, 3),
        "rc": code,
        "predicted_bytes": prediction.peak_bytes,
        "predicted_s": prediction.wall_s,
        "waited_s": round(waited, 3),
        "stopped_s": round(stopped, 3),  # at its rise, until its peak was granted (not in wall_s)
        "envelope": list(admission.envelope(samples, wall)),
        "rise": list(admission.rise(samples, wall)),
        "mem_s": round(mem_seconds(samples, wall)),
    }
    if out:
        append_measurement(out, record)
    # the build log carries the measurement too: the host reads it from there when the state dir is out of
    # reach
    print(f"{MARKER} {json.dumps(record, sort_keys=True)}", file=sys.stderr, flush=True)
    if peak > prediction.peak_bytes:
        log(
            f"{os.path.basename(call.source)} peaked at {peak / 2**30:.2f} GiB "
            f"over its {prediction.peak_bytes / 2**30:.2f} GiB estimate"
        )
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
