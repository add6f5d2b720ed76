"""A wrapper's doorbell: a FIFO its wrapper naps on between polls, that whoever changes what it waits for
rings."""

from __future__ import annotations

import contextlib
import os
import select
import time
from collections.abc import Iterable


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
