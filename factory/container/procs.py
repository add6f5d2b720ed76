"""The processes of a build, read from /proc: who started a compile, which of its siblings run the wrapper,
what a compile's process tree holds and how many of its threads are busy."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable

PAGE = os.sysconf("SC_PAGE_SIZE")
# how the wrapper runs (its launcher, `nvcc` beside this file, runs `python3 -m` it)
WRAPPER_MODULE = f"{__package__}.wrapper"


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
class NinjaJob:
    starter: int  # the process that started the job: ninja
    # the order ninja started its jobs in: when the job's process (the shell ninja started, or this wrapper)
    # started, then its pid (allocated in that order)
    order: int


PID_LIMIT = 1 << 22  # the kernel's most pids (pid_max at most)


def this_job() -> NinjaJob:
    """This compile's job: its process is this wrapper, or the shell (or launcher) above it that ninja
    started."""
    pid = os.getpid()
    me = proc(pid)
    if me is None:  # no /proc: nothing to tell the jobs apart by but when they ask
        return NinjaJob(starter=os.getppid(), order=time.time_ns())
    job, at = pid, me
    for _ in range(4):
        parent = proc(at.parent)
        if parent is None or parent.comm not in LAUNCHERS or parent.parent <= 1:
            break
        job, at = at.parent, parent
    return NinjaJob(starter=at.parent, order=at.started * PID_LIMIT + job)


def is_wrapper(pid: int) -> bool:
    """Whether a process runs the wrapper: `python3 [OPTIONS] -m WRAPPER_MODULE ...`, as its launcher
    starts it."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            args = [os.fsdecode(a) for a in fh.read().split(b"\0")[1:5]]
    except OSError:
        return False  # it ended, or is not ours to read
    for i, arg in enumerate(args):
        if arg == "-m":
            return args[i + 1 : i + 2] == [WRAPPER_MODULE]
        if not arg.startswith("-") or arg == "-c":
            return False  # a script or a command
        if arg.startswith("-m"):
            return arg[2:] == WRAPPER_MODULE
    return False


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
