"""The admission state file of a build (FACTORY_STATE_DIR/admission.json): the compiles that wait and those
that run, with what each was promised; read and written under the directory's lock by every wrapper."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from typing import Any

from . import admission
from .procs import alive


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
