"""Shared fixtures. Integration tests need real services: under CI=true a missing one fails, never skips."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator

import pytest

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


@pytest.fixture
def factory_cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[[list[str]], tuple[int, str]]:
    """Run `factory ARGV` in this process as the console script does: its exit code, its stdout + stderr."""
    from factory.cli import main

    def run(argv: list[str]) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", ["factory", *argv])
        code = 0
        try:
            main()
        except SystemExit as exc:
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    return run


def require(condition: bool, what: str) -> None:
    """Skip locally when a real component is missing; fail under CI, where a skip hides untested features."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"CI=true but {what} is unavailable: integration tests must run in CI", pytrace=False)
    pytest.skip(f"{what} is unavailable")


@pytest.fixture(scope="session")
def docker_client() -> Iterator[object]:
    try:
        import docker

        client = docker.from_env(timeout=600)
        client.ping()
    except Exception as exc:  # the SDK raises several unrelated types when no daemon answers
        require(False, f"Docker ({exc.__class__.__name__})")
        raise
    yield client
    client.close()


@pytest.fixture(scope="session")
def host_nvcc() -> str:
    path = shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None
    )
    require(path is not None, "nvcc on the host")
    assert path is not None
    return path
