"""The simple repository API (PEP 503 HTML, PEP 691 JSON) as every reader of an index sees it: its media
types and the links of an HTML page. Below the index's writer (`factory.publish.index`) and its readers (the
torch index, the sdist finder, `factory which`), so that each reads pages the same way."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from html.parser import HTMLParser

PYPI_HTML_TYPE = "application/vnd.pypi.simple.v1+html"
PYPI_JSON_TYPE = "application/vnd.pypi.simple.v1+json"


@dataclass(frozen=True, kw_only=True)
class Anchor:
    href: str
    text: str
    attrs: Mapping[str, str]


class _AnchorParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.anchors: list[Anchor] = []
        self._open: dict[str, str] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._open = {k: v or "" for k, v in attrs}
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._open is not None:
            self.anchors.append(
                Anchor(href=self._open.get("href", ""), text="".join(self._text).strip(), attrs=self._open)
            )
            self._open = None


def parse_anchors(page: str) -> tuple[Anchor, ...]:
    """The links of a simple-repository HTML page (used by `factory which` and the tests)."""
    parser = _AnchorParser()
    parser.feed(page)
    parser.close()
    return tuple(parser.anchors)
