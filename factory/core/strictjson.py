"""JSON read from bytes someone else wrote (a wheel's provenance, a build record beside it on an index, a
variant request): UTF-8, no NaN or Infinity, no key given twice (which `json` would let the last one win), no
nesting deeper than Python's recursion allows; each refusal one line (`loads`). And the one checker of a
document's shape (`shape_problem`): each format declares its shape as data and checks only its own kinds of
value (`leaf`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from factory.core.validate import shown_name

Leaf = Callable[[Any, Any, str], "str | None"]


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
    except UnicodeDecodeError as exc:
        raise StrictJSONError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise StrictJSONError("nested too deeply") from None
    except ValueError as exc:
        raise StrictJSONError(str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__) from None


def shape_problem(
    value: Any, shape: Any, where: str, *, leaf: Leaf | None = None, closed: str = ""
) -> str | None:
    """The first way the JSON `value` is not of `shape`, naming its path (`where.key`, `where[i]`); None
    when it is one.

    A shape is a dict (a mapping with those keys, each of its shape; a key ending in "?" may be left out;
    with `closed` a key the shape does not name is a problem too: "`where.key` `closed`"), a list of one
    shape (a list of such items), a tuple whose first item is a shape (that, or null), a type (an instance of
    it; a bool is no int here, as in JSON), or anything else: a format's own kind of value, which
    `leaf(value, shape, where)` checks."""
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{where} must be a mapping"
        keys = {k.removesuffix("?"): k for k in shape}
        if closed:
            unknown = sorted(str(k) for k in value if k not in keys)
            if unknown:
                return f"{where}.{shown_name(unknown[0])} {closed}"
        for key, spelled in keys.items():
            if key not in value:
                if spelled.endswith("?"):
                    continue
                return f"{where}.{key} is missing"
            problem = shape_problem(value[key], shape[spelled], f"{where}.{key}", leaf=leaf, closed=closed)
            if problem:
                return problem
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"{where} must be a list"
        for i, item in enumerate(value):
            problem = shape_problem(item, shape[0], f"{where}[{i}]", leaf=leaf, closed=closed)
            if problem:
                return problem
        return None
    if isinstance(shape, tuple):
        return None if value is None else shape_problem(value, shape[0], where, leaf=leaf, closed=closed)
    if isinstance(shape, type):
        if not isinstance(value, shape) or (shape is int and isinstance(value, bool)):
            return f"{where} must be {shape.__name__}, not {type(value).__name__}"
        return None
    if leaf is None:
        raise TypeError(f"{where}: a shape {shape!r} needs a leaf checker")
    return leaf(value, shape, where)
