"""Typed checks of values in a loaded YAML document: each returns the value or raises a one-line
`ConfigError("FILE:LINE: message")` pointing at it. They know YAML and Python types, not what a file means;
the rules of each section of a matrix file are `factory.spec.config`'s."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from factory.core.errors import ConfigError
from factory.core.urls import checked_url
from factory.spec.yamlload import YamlDoc

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _frozen(mapping: Mapping[str, str] | None = None) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping or {}))


class Checker:
    """Checks `doc`'s values; relative paths are resolved against the document's directory, and unless
    `trust_paths`, a path (once its symlinks are resolved) must stay inside that directory: a file that names
    /etc/shadow as a patch must not get it read into a build."""

    def __init__(self, doc: YamlDoc, *, trust_paths: bool = False) -> None:
        self.doc = doc
        self.base_dir = doc.path.resolve().parent
        self.trust_paths = trust_paths

    def fail(
        self, message: str, node: Any = None, key: object = None, *, at_key: bool = False
    ) -> ConfigError:
        if node is None:
            return self.doc.error(message, None)
        line = self.doc.key_line(node, key) if at_key else self.doc.line_of(node, key)
        if line is None:
            line = self.doc.line_of(node)
        return self.doc.error(message, line)

    def mapping(self, parent: Any, key: object, what: str) -> Mapping[str, Any]:
        value = parent[key]
        if not isinstance(value, Mapping):
            raise self.fail(f"{what} must be a mapping, not {kind(value)}", parent, key)
        return value

    def keys(self, node: Mapping[str, Any], allowed: Sequence[str], what: str) -> None:
        for key in node:
            if not isinstance(key, str):
                raise self.fail(
                    f"{what}: keys must be strings, not {kind(key)} {key!r}", node, key, at_key=True
                )
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f" (allowed: {', '.join(allowed)})"
                raise self.fail(f"unknown key {key!r} in {what}{hint}", node, key, at_key=True)

    def string(self, node: Any, key: object, what: str, *, allow_empty: bool = False) -> str:
        value = node[key]
        if isinstance(value, bool) or not isinstance(value, str):
            if isinstance(value, int | float) and not isinstance(value, bool):
                written = self.doc.source_text(node, key) or str(value)
                raise self.fail(f'{what} {value} must be a quoted string (write "{written}")', node, key)
            raise self.fail(f"{what} must be a string, not {kind(value)}", node, key)
        if not allow_empty and not value.strip():
            raise self.fail(f"{what} must not be empty", node, key)
        if "\x00" in value:  # no path, URL, environment or command line can carry one
            raise self.fail(f"{what} must not contain a NUL character", node, key)
        return str(value)

    def url(self, node: Any, key: object, what: str, *, schemes: tuple[str, ...], besides: str = "") -> str:
        """A URL with a host (`urls.checked_url`), or the one other word `besides` allows; a bad one is said
        without the credentials it may carry."""
        value = self.string(node, key, what)
        if besides and value == besides:
            return value
        try:
            checked_url(value, schemes=schemes, what=what)
        except ConfigError as exc:
            raise self.fail(f"{exc} (or '{besides}')" if besides else str(exc), node, key) from None
        return value

    def pattern(self, node: Any, key: object, what: str, regex: re.Pattern[str], example: str) -> str:
        value = self.string(node, key, what)
        if not regex.fullmatch(value):
            raise self.fail(f"{what} {value!r} is not a version like {example}", node, key)
        return value

    def boolean(self, node: Any, key: object, what: str) -> bool:
        value = node[key]
        if not isinstance(value, bool):
            raise self.fail(f"{what} must be true or false, not {kind(value)} {value!r}", node, key)
        return value

    def integer(
        self, node: Any, key: object, what: str, *, minimum: int = 1, maximum: int | None = None
    ) -> int:
        value = node[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(f"{what} must be an integer, not {kind(value)} {value!r}", node, key)
        if value < minimum or (maximum is not None and value > maximum):
            bounds = f"at least {minimum}" if maximum is None else f"{minimum} to {maximum}"
            digits = str(value)
            shown = digits if len(digits) <= 30 else f"{digits[:12]}... ({len(digits)} digits)"
            raise self.fail(f"{what} must be {bounds}, not {shown}", node, key)
        return int(value)

    def number(
        self, node: Any, key: object, what: str, *, minimum: float = 0.0, maximum: float | None = None
    ) -> float:
        """A finite number above 0, at least `minimum` if that is above 0, and at most `maximum`."""
        value = node[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(f"{what} must be a number, not {kind(value)} {value!r}", node, key)
        try:
            number = float(value)
        except OverflowError:  # an integer past float's range
            number = math.inf
        if not math.isfinite(number):  # YAML's .nan and .inf are floats too
            raise self.fail(f"{what} must be a finite number, not {number}", node, key)
        if number <= 0:
            raise self.fail(f"{what} must be positive, not {value}", node, key)
        if number < minimum:
            raise self.fail(f"{what} must be at least {minimum:g}, not {number:g}", node, key)
        if maximum is not None and number > maximum:
            raise self.fail(f"{what} must be at most {maximum:g}, not {number:g}", node, key)
        return number

    def str_list(self, node: Any, key: object, what: str) -> tuple[str, ...]:
        value = node[key]
        if not isinstance(value, list):
            raise self.fail(f"{what} must be a list, not {kind(value)}", node, key)
        return tuple(self.string(value, i, f"{what} item") for i in range(len(value)))

    def env(self, node: Any, key: object, what: str) -> Mapping[str, str]:
        value = node[key]
        if value is None:
            return _frozen()
        if not isinstance(value, Mapping):
            raise self.fail(f"{what} must be a mapping of NAME: value, not {kind(value)}", node, key)
        out: dict[str, str] = {}
        for name, item in value.items():
            if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
                raise self.fail(
                    f"{what}: {name!r} is not an environment variable name", value, name, at_key=True
                )
            if isinstance(item, bool):
                raise self.fail(
                    f'{what}.{name} must be a string (write "TRUE" or "1", YAML booleans are ambiguous)',
                    value,
                    name,
                )
            if isinstance(item, int | float):
                item = self.doc.source_text(value, name) or str(item)
            elif not isinstance(item, str):
                raise self.fail(f"{what}.{name} must be a string, not {kind(item)}", value, name)
            if "\x00" in item:  # Docker refuses it only when the container is created
                raise self.fail(f"{what}.{name} must not contain a NUL character", value, name)
            out[name] = str(item)
        return _frozen(out)

    def env_name(self, node: Any, key: object, what: str) -> str:
        value = self.string(node, key, what)
        if not ENV_NAME.fullmatch(value):
            raise self.fail(f"{what} {value!r} is not an environment variable name", node, key)
        return value

    def rel_path(self, node: Any, key: object, what: str, *, directory: bool) -> Path:
        text = self.string(node, key, what)
        path = (self.base_dir / Path(text).expanduser()).resolve()
        if not self.trust_paths and not path.is_relative_to(self.base_dir):
            raise self.fail(
                f"{what} {text!r} is outside the matrix file's directory {self.base_dir} "
                "(pass --trust-paths to allow it)",
                node,
                key,
            )
        if directory and not path.is_dir():
            raise self.fail(f"{what} {text!r}: no such directory ({path})", node, key)
        if not directory and not path.is_file():
            raise self.fail(f"{what} {text!r}: no such file ({path})", node, key)
        return path

    def items(self, node: Any, key: str, what: str) -> list[Any]:
        value = node[key]
        if not isinstance(value, list):
            raise self.fail(f"{what} must be a list, not {kind(value)}", node, key)
        return value

    def lossy(self, node: Any, key: object) -> bool:
        value = node[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        return self.doc.source_text(node, key) not in (None, str(value))


def kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def plain(value: Any) -> object:
    """ruamel's commented containers and scalar subclasses -> plain JSON-able Python values."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return str(value)
