"""`factory serve`'s pure parts: PEP 691 negotiation, content types, caching, basic-auth option."""

from __future__ import annotations

import pytest

from factory.core import simpleapi
from factory.core.errors import ConfigError
from factory.publish import index
from factory.publish.serve import cache_control_of, content_type_of, negotiate, parse_basic_auth

PIP_ACCEPT = (
    "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html; q=0.1, text/html; q=0.01"
)
UV_ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, index.HTML_TYPE),
        ("", index.HTML_TYPE),
        ("text/html", index.HTML_TYPE),
        ("*/*", index.HTML_TYPE),
        (PIP_ACCEPT, simpleapi.PYPI_JSON_TYPE),
        (UV_ACCEPT, simpleapi.PYPI_JSON_TYPE),
        ("application/vnd.pypi.simple.latest+json", simpleapi.PYPI_JSON_TYPE),
        ("application/vnd.pypi.simple.v1+html", simpleapi.PYPI_HTML_TYPE),
        ("application/vnd.pypi.simple.v1+json;q=0.5, text/html", index.HTML_TYPE),
        ("application/vnd.pypi.simple.v1+json;q=0, text/html;q=0.1", index.HTML_TYPE),
        ("image/png", index.HTML_TYPE),
    ],
)
def test_negotiate(accept: str | None, expected: str) -> None:
    assert negotiate(accept) == expected


def test_content_types() -> None:
    assert content_type_of("files/v/x-1.0-py3-none-any.whl") == "application/octet-stream"
    assert content_type_of("files/v/x-1.0-py3-none-any.whl.metadata").startswith("text/plain")
    assert content_type_of("simple/v/x/index.json") == simpleapi.PYPI_JSON_TYPE
    assert content_type_of("simple/variants.json") == "application/json"
    assert content_type_of("index.html") == index.HTML_TYPE


def test_files_are_immutable_pages_short_lived() -> None:
    assert "immutable" in cache_control_of("files/v/x.whl")
    assert "immutable" not in cache_control_of("simple/v/x/index.html")
    assert "max-age=60" in cache_control_of("simple/")


def test_basic_auth_option() -> None:
    assert parse_basic_auth("u:p:w") == ("u", "p:w")
    for bad in ("nocolon", ":p"):
        with pytest.raises(ConfigError):
            parse_basic_auth(bad)
