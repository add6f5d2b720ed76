"""A git source that fails to clone never shows the credentials in its URL, in the message or in git's."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from factory.build.source import prepare_source
from factory.core.errors import BuildError


def test_failed_clone_hides_credentials(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on: git fails fast with the URL in its message
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://user:SECRETTOKEN@127.0.0.1:{port}/repo.git"
    with pytest.raises(BuildError) as info:
        prepare_source(kind="git", name="p", version="1", cache=tmp_path / "c", url=url, ref="v1")
    message = str(info.value)
    assert "SECRETTOKEN" not in message
    assert "user:" not in message
    assert f"http://127.0.0.1:{port}/repo.git" in message
