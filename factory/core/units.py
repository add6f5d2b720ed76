"""Sizes in bytes as people write and read them: "16GiB" in a matrix file or an option, "7.7 GiB" in a
message or a table."""

from __future__ import annotations

import math
import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)(B?)\s*$", re.IGNORECASE)


def parse_size(value: str | int) -> int:
    """ "16GiB", "16G", "512M", "1.5GiB", 17179869184 -> bytes. K/M/G/T are binary; "GB"/"MB" are decimal."""
    if isinstance(value, bool):
        raise ValueError(f"size {value!r} is not a size like 16GiB")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"size {value} must be positive")
        return value
    match = _SIZE.fullmatch(str(value))
    if match is None:
        raise ValueError(f"size {value!r} is not a size like 16GiB, 512MiB or a byte count")
    number, unit, binary, byte = match.groups()
    power = "KMGT".find(unit.upper()) + 1 if unit else 0
    base = 1000 if (unit and byte and not binary) else 1024
    scaled = float(number) * base**power
    if not math.isfinite(scaled):
        raise ValueError(f"size {value!r} is not a finite size")
    size = int(scaled)
    if size <= 0:
        raise ValueError(f"size {value!r} must be positive")
    return size


def format_size(n: int) -> str:
    """Bytes for people: 8224690176 -> "7.7 GiB", 734003200 -> "700 MiB", 2**46 -> "64.0 TiB"."""
    if n >= 2**40:
        return f"{n / 2**40:.1f} TiB"
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n} bytes"


def format_gib(n: float) -> str:
    """Bytes in GiB with one decimal, for messages that compare sizes: 6442450944 -> "6.0 GiB"."""
    return f"{n / 2**30:.1f} GiB"
