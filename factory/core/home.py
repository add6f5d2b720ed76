"""The factory's state and cache directory (wheelhouses, logs, learned compile profiles)."""

from __future__ import annotations

import os
from pathlib import Path


def factory_home() -> Path:
    """`$FACTORY_HOME` or `~/.cache/wheel-factory`."""
    env = os.environ.get("FACTORY_HOME")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "wheel-factory"
