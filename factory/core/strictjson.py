"""JSON read from bytes someone else wrote (a wheel's provenance, a build record beside it on an index):
UTF-8, no NaN or Infinity, no key given twice (which `json` would let the last one win), no nesting deeper
than Python's recursion allows; each refusal one line."""

from __future__ import annotations

import json
from typing import Any


class StrictJSONError(ValueError):
    """Why the bytes are not such JSON, in one line."""


def _no_constants(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key[:40]!r}")
        out[key] = value
    return out


def loads(data: bytes) -> Any:
    """The document; StrictJSONError with the reason otherwise."""
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_no_constants, object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise StrictJSONError(str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__) from None
