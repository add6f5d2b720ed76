"""A compile run and measured: its process tree's RSS over time, its wall and CPU time."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import resource
import select
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping

from . import protocol
from .procs import tree_rss


def signal_group(child: subprocess.Popen[bytes], signum: int) -> None:
    """nvcc and the cicc/ptxas it runs are one process group (`run_measured` starts it in its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signum)


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
    cmd: list[str],
    on_sample: Callable[[int, subprocess.Popen[bytes]], float] | None = None,
    *,
    interval: float = protocol.WrapperEnv().sample_s,
) -> Measured:
    """A child run in its own process group, sampled every `interval` s, forwarding termination signals.
    `on_sample` hears of each sample and returns how long it kept the child stopped; stopped time counts
    neither in the samples' times nor in the total."""
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


def append_measurement(path: str, record: Mapping[str, object]) -> None:
    """One line of FACTORY_PROFILE_OUT, appended under its lock: the build's compiles end side by side."""
    line = protocol.measurement_json(record) + "\n"
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.write(line)
