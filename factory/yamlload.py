"""YAML loading that keeps line numbers, rejects duplicate keys and can quote back a scalar's source text.

Every problem becomes a one-line `ConfigError("FILE:LINE: message")`; ruamel's multi-line marks never
reach a user.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from factory.errors import ConfigError

# A plain scalar ends at a flow indicator, a comment or the end of the line.
_PLAIN_TOKEN = re.compile(r"[^\s,\]\}#]+")
_PLAIN_KEY = re.compile(r"[^\s,\]\}#:]+")


@dataclass(frozen=True, kw_only=True)
class YamlDoc:
    """A parsed YAML document with the text it came from, for line numbers and original spellings."""

    path: Path
    display: str  # the file name as the user wrote it, used in messages
    root: Any
    lines: tuple[str, ...]

    def error(self, message: str, line: int | None) -> ConfigError:
        return ConfigError(message, file=self.display, line=line)

    def line_of(self, node: Any, key: object = None) -> int | None:
        """1-based line of `node[key]`'s value (or of `node` itself when key is None)."""
        pos = self._pos(node, key)
        return None if pos is None else pos[0] + 1

    def key_line(self, node: Any, key: object) -> int | None:
        """1-based line of a mapping key (where an unknown-key error should point)."""
        if isinstance(node, CommentedMap) and key in node:
            return node.lc.key(key)[0] + 1
        return self.line_of(node, key)

    def source_text(self, node: Any, key: object) -> str | None:
        """The scalar as written in the file, e.g. "2.10" where YAML parsed the float 2.1."""
        pos = self._pos(node, key)
        if pos is None or pos[0] >= len(self.lines):
            return None
        match = _PLAIN_TOKEN.match(self.lines[pos[0]], pos[1])
        return match.group(0) if match else None

    def key_text(self, node: Any, key: object) -> str | None:
        """A mapping key as written in the file."""
        try:
            line, col = node.lc.key(key)
        except (KeyError, AttributeError, TypeError):
            return None
        if line >= len(self.lines):
            return None
        match = _PLAIN_KEY.match(self.lines[line], col)
        return match.group(0) if match else None

    @staticmethod
    def _pos(node: Any, key: object) -> tuple[int, int] | None:
        try:
            if key is None:
                return (node.lc.line, node.lc.col) if hasattr(node, "lc") else None
            if isinstance(node, CommentedMap):
                return node.lc.value(key)
            if isinstance(node, CommentedSeq) and isinstance(key, int):
                return node.lc.item(key)
        except (KeyError, IndexError, TypeError, AttributeError):
            return None
        return None


def _one_line(exc: MarkedYAMLError) -> tuple[str, int | None]:
    mark = exc.problem_mark or exc.context_mark
    line = mark.line + 1 if mark is not None else None
    problem = (exc.problem or exc.context or "invalid YAML").strip()
    if exc.__class__.__name__ == "DuplicateKeyError":
        found = re.search(r'duplicate key "([^"]*)"', str(exc))
        key = found.group(1) if found else "?"
        first = exc.context_mark.line + 1 if exc.context_mark is not None else None
        where = f" (the mapping starting at line {first})" if first is not None else ""
        return f"duplicate key {key!r}{where}", line
    context = exc.context.strip() if exc.problem and exc.context else ""
    if problem.startswith("but "):  # "expected a single document ... but found another document"
        return f"YAML syntax error: {context} {problem}".replace("  ", " "), line
    return f"YAML syntax error: {problem}{f' ({context})' if context else ''}", line


def load_yaml(path: str | Path) -> YamlDoc:
    """Load one YAML document; a missing file, a syntax error or a duplicate key is a ConfigError."""
    display = str(path)
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("no such file", file=display) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, not a YAML file", file=display) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", file=display) from None
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    try:
        root = yaml.load(text)
    except MarkedYAMLError as exc:
        message, line = _one_line(exc)
        raise ConfigError(message, file=display, line=line) from None
    except YAMLError as exc:
        raise ConfigError(f"YAML error: {str(exc).splitlines()[0]}", file=display) from None
    return YamlDoc(path=p, display=display, root=root, lines=tuple(text.splitlines()))
