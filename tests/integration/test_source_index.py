"""`source: pypi` for real: the host's pip configuration, its configured index, a real CUDA extension's sdist.

causal-conv1d's setup.py imports torch, so `pip download` of it would fail here; the factory reads the
index's simple page instead. Its 1.7.0 sdist is 30 kB, and a published file never changes, so its sha256 is
pinned.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require

from factory.build.source import PreparedSource, prepare_source
from factory.core.errors import BuildError, ConfigError
from factory.core.urls import without_credentials
from factory.plan.pipindex import read_pip_settings

pytestmark = pytest.mark.integration

NAME = "causal-conv1d"
VERSION = "1.7.0"
SDIST = "causal_conv1d-1.7.0.tar.gz"
SHA256 = "3202758494eaa7b597ce1c282dfa188889506bfcb92cad3c407d26736bfcd32b"


def fetch(cache: Path, version: str = VERSION) -> PreparedSource:
    try:
        return prepare_source(kind="pypi", name=NAME, version=version, cache=cache)
    except BuildError as exc:
        require("could not read" not in str(exc), f"the configured package index ({exc})")
        raise


def test_sdist_comes_through_the_configured_index_with_its_hash(tmp_path: Path) -> None:
    got = fetch(tmp_path / "cache")
    assert (got.sdist, got.sha256) == (SDIST, SHA256)
    cached = tmp_path / "cache" / "sdists" / SDIST
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == SHA256
    assert (got.tree / "setup.py").is_file() and (got.tree / "csrc").is_dir()
    assert "import torch" in (got.tree / "setup.py").read_text()  # what `pip download` would have run
    stamp = cached.stat().st_mtime_ns
    assert fetch(tmp_path / "cache") == got
    assert cached.stat().st_mtime_ns == stamp  # the verified download was reused, not fetched again


def test_missing_version_names_the_configured_index(tmp_path: Path) -> None:
    first_index = without_credentials(read_pip_settings().indexes[0]).rstrip("/") + "/"
    with pytest.raises(ConfigError) as err:  # the matrix file's error: exit 2
        fetch(tmp_path / "cache", version="9.9.9")
    message = str(err.value)
    assert message.startswith(f"{NAME} 9.9.9: no such version on {first_index}")
    assert "(versions: " in message


def test_factory_build_of_a_version_the_index_lacks_is_a_matrix_error(
    tmp_path: Path, docker_client: object
) -> None:
    # before any job starts, one line naming the matrix file, exit 2 like every other config error
    matrix = tmp_path / "m.yaml"
    matrix.write_text(
        f'package: {{name: {NAME}, version: "9.9.9"}}\n'
        'matrix: {cuda: ["13.0"], torch: ["2.14"], python: ["3.11"], cxx11_abi: [true], arch: ["8.0"]}\n'
        "build: {flavor: pypi}\n"
    )
    args = ["build", "--matrix", str(matrix), "--output", str(tmp_path / "w")]
    proc = subprocess.run(
        [sys.executable, "-m", "factory.cli", *args],
        capture_output=True, text=True, env={**os.environ, "FACTORY_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    require("could not read" not in proc.stderr, f"the configured package index ({proc.stderr.strip()})")
    assert proc.returncode == 2, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]  # a warning may come first
    assert line.startswith(f"error: {matrix}: {NAME} 9.9.9: no such version"), line
    assert "9.9.9" in line and "Traceback" not in proc.stderr
