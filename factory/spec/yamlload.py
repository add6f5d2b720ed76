"""YAML loading that keeps line numbers, rejects duplicate keys and can quote back a scalar's source text.

Every problem becomes a one-line `ConfigError("FILE:LINE: message")`; ruamel's multi-line marks never
reach a user. A document is bounded before anything walks it: its size in bytes, its nesting depth and the
number of values it holds once YAML aliases are followed (an alias bomb is a few lines that expand to
billions of values).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from factory.core.errors import ConfigError

# A plain scalar ends at a flow indicator, a comment or the end of the line.
_PLAIN_TOKEN = re.compile(r"[^\s,\]\}#]+")
_PLAIN_KEY = re.compile(r"[^\s,\]\}#:]+")

# A matrix file is a few kilobytes; ruamel parses about 60 KB a second, so this bounds a load to seconds.
MAX_BYTES = 256 * 1024
# Deeper than any real file, shallow enough for every recursive walk of the document.
MAX_DEPTH = 32
# ruamel's scanner takes time quadratic in the depth of flow collections ("[[[[...": 18 s at 3000 levels), so
# brackets are counted in the text before it parses (naively: quoted brackets count too, hence the margin).
_MAX_BRACKETS = 200
_BRACKET = re.compile(r"[\[\]{}\n]")
# Values (mappings, lists and scalars) the document holds with each alias counted as often as it is used.
MAX_NODES = 100_000


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
            line = node.lc.key(key)[0]
            if isinstance(line, int):
                return line + 1
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
        except (KeyError, AttributeError, TypeError, ValueError):
            return None
        if not isinstance(line, int) or not isinstance(col, int) or line >= len(self.lines):
            return None
        match = _PLAIN_KEY.match(self.lines[line], col)
        return match.group(0) if match else None

    @staticmethod
    def _pos(node: Any, key: object) -> tuple[int, int] | None:
        pos: Any = None
        try:
            if key is None:
                pos = (node.lc.line, node.lc.col) if hasattr(node, "lc") else None
            elif isinstance(node, CommentedMap):
                pos = node.lc.value(key)
            elif isinstance(node, CommentedSeq) and isinstance(key, int):
                pos = node.lc.item(key)
        except (KeyError, IndexError, TypeError, AttributeError):
            return None
        # ruamel leaves some positions unset (a tagged scalar's)
        if pos is None or not all(isinstance(p, int) for p in pos):
            return None
        return pos[0], pos[1]


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


def _read(path: Path, display: str) -> str:
    """The file's text, at most MAX_BYTES of it (a device like /dev/zero or a pipe is read no further)."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError("no such file", file=display) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, not a YAML file", file=display) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", file=display) from None
    if len(data) > MAX_BYTES:
        raise ConfigError(f"larger than {MAX_BYTES // 1024} KiB, too large for a matrix file", file=display)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.start})", file=display) from None


def _check_brackets(text: str, display: str) -> None:
    depth, line = 0, 1
    for match in _BRACKET.finditer(text):
        char = match.group()
        if char == "\n":
            line += 1
        elif char in "[{":
            depth += 1
            if depth > _MAX_BRACKETS:
                raise ConfigError(f"nested more than {MAX_DEPTH} levels deep", file=display, line=line)
        else:
            depth = max(0, depth - 1)


def _bounded(doc: YamlDoc) -> None:
    """Walk the document without recursion, following aliases, and stop at the first bound it passes."""
    nodes = 0
    stack: list[tuple[Any, int, int | None]] = [(doc.root, 1, None)]
    while stack:
        node, depth, parent_line = stack.pop()
        line = doc.line_of(node) or parent_line
        nodes += 1
        if nodes > MAX_NODES:
            raise doc.error(
                f"more than {MAX_NODES} values once YAML aliases are expanded; write the values out", line
            )
        if isinstance(node, Mapping | list | tuple) and depth > MAX_DEPTH:
            raise doc.error(f"nested more than {MAX_DEPTH} levels deep", line)
        if isinstance(node, Mapping):
            # a key can be a collection too ("? [a, b]: 1"), and so an alias
            stack.extend((k, depth + 1, line) for k in node if isinstance(k, Mapping | tuple))
            stack.extend((v, depth + 1, line) for v in node.values())
        elif isinstance(node, list | tuple):
            stack.extend((v, depth + 1, line) for v in node)


def load_yaml(path: str | Path) -> YamlDoc:
    """Load one YAML document; a missing, unreadable or oversized file, a syntax error, a duplicate key or a
    document past the bounds above is a ConfigError."""
    display = str(path)
    p = Path(path)
    text = _read(p, display)
    _check_brackets(text, display)
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    try:
        root = yaml.load(text)
    except MarkedYAMLError as exc:
        message, line = _one_line(exc)
        raise ConfigError(message, file=display, line=line) from None
    except YAMLError as exc:
        raise ConfigError(f"YAML error: {str(exc).splitlines()[0]}", file=display) from None
    except RecursionError:
        raise ConfigError(f"nested more than {MAX_DEPTH} levels deep", file=display) from None
    except (TypeError, ValueError, OverflowError) as exc:
        # ruamel's constructors fail in plain Python on some valid YAML: a mapping as a key ("? {a: 1}"
        # is unhashable), a timestamp that is no date ("2020-13-45")
        first = (str(exc).splitlines() or [""])[0]
        raise ConfigError(f"YAML this loader cannot read: {first}", file=display) from None
    doc = YamlDoc(path=p, display=display, root=root, lines=tuple(text.splitlines()))
    _bounded(doc)
    return doc
