"""factory.core.urls: URLs from the command line, checked in one place and shown without credentials."""

from __future__ import annotations

import pytest

from factory.core.errors import ConfigError
from factory.core.urls import checked_url, without_credentials

WEB = ("http", "https")


def test_a_good_url_is_returned_split() -> None:
    parts = checked_url("https://user:pw@s3.example.com:9000/x", schemes=WEB, what="endpoint URL")
    assert (parts.hostname, parts.port, parts.path) == ("s3.example.com", 9000, "/x")
    assert checked_url("file:///srv/index", schemes=("file",), what="--index").path == "/srv/index"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("notaurl", "--x notaurl: not a URL of http:// or https://"),
        ("ftp://u:secret@h/p", "--x ftp://h/p: not a URL of http:// or https://"),
        ("http://", "--x http://: not a URL of http:// or https://"),
        ("http://u:secret@h:99999/", "--x http://h:99999/: Port out of range 0-65535"),
        ("http://u:secret@[::1/", "--x http://[::1/: Invalid IPv6 URL"),
    ],
)
def test_a_bad_url_is_one_line_without_its_password(url: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        checked_url(url, schemes=WEB, what="--x")
    assert str(exc.value) == message
    assert "secret" not in str(exc.value)


def test_without_credentials() -> None:
    assert without_credentials("https://u:p@h:8443/simple/?q=1#f") == "https://h:8443/simple/"
    assert without_credentials("http://u:p@[::1/x") == "http://[::1/x"
