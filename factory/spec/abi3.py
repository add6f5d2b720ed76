"""Limited-API (abi3) wheels: the recipe's `py_limited_api` value, the tag a variant's one wheel carries, and
the checks that the wheel is what that tag promises.

A recipe with `py_limited_api` builds one wheel per variant, with the lowest Python of the matrix, tagged
`cp3X-abi3`; CPython 3.X and every later one install it (the other Pythons are "covered" by it). The value is
`"cp39"` (the tag the package builds, as FA3 and xformers hard-code in setup.py) or `true` (the tag of the
variant's lowest Python). The build passes it to bdist_wheel (`--py-limited-api`); the package's Extensions
must say `py_limited_api=True` (torch's cpp_extension then compiles with `-DPy_LIMITED_API` and leaves out
libtorch_python), which also names its modules `*.abi3.so`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from factory.core.errors import CheckError

AUTO = "auto"  # `py_limited_api = true`: the tag of each variant's lowest Python
ABI3 = "abi3"
_TAG = re.compile(r"cp3(?:[0-9]|[1-9][0-9])")
_DOTTED = re.compile(r"3\.(?:[0-9]|[1-9][0-9])")
# CPython suffixes that tie a module to one minor version: `_C.cpython-311-<triplet>.so`. CPython
# 3.12 would not import a module named for 3.11 from an abi3 wheel it installed.
_VERSIONED_SO = re.compile(r"\.cpython-\d+[a-z]*-[^/]*\.so$")
_TIMEOUT_S = 1800


def parse_limited_api(value: object) -> str | None:
    """A recipe's `py_limited_api`: true -> "auto", false -> None, "cp39" or "3.9" -> "cp39".

    ValueError (a message without the key's name) for anything else."""
    if value is True:
        return AUTO
    if value is False or value is None:
        return None
    if isinstance(value, str):
        if _TAG.fullmatch(value):
            return value
        if _DOTTED.fullmatch(value):
            return "cp3" + value.split(".")[1]
    raise ValueError(f"{value!r} must be true, false or a CPython tag like 'cp39'")


def tag_python(tag: str) -> tuple[int, int]:
    """ "cp39" -> (3, 9)."""
    return 3, int(tag[3:])


def python_key(python: str) -> tuple[int, ...]:
    """ "3.9" -> (3, 9), so "3.10" sorts after "3.9"."""
    return tuple(int(p) for p in python.split("."))


def wheel_tag(limited_api: str, lowest_python: str) -> str:
    """The interpreter tag of a variant's abi3 wheel: the recipe's, or that of the variant's lowest Python."""
    if limited_api == AUTO:
        major, minor = python_key(lowest_python)[:2]
        return f"cp{major}{minor}"
    return limited_api


def covers(tag: str, python: str) -> bool:
    """Does a `tag`-abi3 wheel install on CPython `python`?"""
    return python_key(python)[:2] >= tag_python(tag)


def versioned_modules(members: Iterable[str]) -> list[str]:
    """The extension modules of a wheel named for one CPython version (not `.abi3.so` nor plain `.so`)."""
    return sorted(m for m in members if _VERSIONED_SO.search(m))


def _results(report: Any) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(object name, result) of every object abi3audit's JSON report scanned, whatever the nesting."""
    if isinstance(report, Mapping):
        if isinstance(report.get("result"), Mapping):
            yield str(report.get("name", "?")), report["result"]
            return
        for value in report.values():
            yield from _results(value)
    elif isinstance(report, list):
        for value in report:
            yield from _results(value)


def audit_problems(report: Any) -> list[str]:
    """One line per object of an abi3audit report that uses symbols outside the stable ABI, or stable-ABI
    symbols newer than the wheel's tag."""
    problems: list[str] = []
    for name, result in _results(report):
        bad = sorted(str(s) for s in result.get("non_abi3_symbols") or ())
        if bad:
            shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            problems.append(f"{name}: uses symbols outside the limited API: {shown} (abi3audit)")
        future = result.get("future_abi3_objects") or {}
        later = sorted(future) if isinstance(future, Mapping) else sorted(str(s) for s in future)
        if later:
            baseline = result.get("baseline", "?")
            problems.append(
                f"{name}: uses limited-API symbols newer than its tag's Python {baseline}: "
                f"{', '.join(map(str, later[:5]))} (abi3audit)"
            )
    return problems


def audit(wheel: Path) -> list[str]:
    """abi3audit's findings on `wheel`, one line each; [] when every module keeps to its tag's stable ABI."""
    command = [sys.executable, "-m", "abi3audit", "--report", "--strict", str(wheel)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CheckError(f"{wheel.name}: abi3audit did not run ({exc})") from None
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        lines = [line.strip() for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
        raise CheckError(
            f"{wheel.name}: abi3audit printed no report ({lines[-1] if lines else f'exit {proc.returncode}'})"
        ) from None
    problems = audit_problems(report)
    if proc.returncode != 0 and not problems:
        problems.append(f"abi3audit failed with exit code {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return problems
