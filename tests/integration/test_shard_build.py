"""One job's compile sharded over two "runners" through the real factory (dockerd, the pypi builder image,
real nvcc): each shard its own `$FACTORY_HOME` and one CPU, side by side, one directory store between them;
then the final build from a third, empty home compiles nothing and its wheel passes every check (2.5-3.5 min
warm on the shared 2-core host).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from homes import fresh_home
from test_build import ROOT
from test_cache_build import WRITER, cubin_archs, factory_build, run_build, store_entries
from test_memory_build import SCALE, memext_matrix

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TUS = "light1,light2,medium1"  # built by setup.py; the shards split all eight .cu files of the tree by count


def test_two_shards_fill_the_cache_and_the_final_build_only_links(
    tmp_path: Path, docker_client: Any, session_factory_home: Path
) -> None:
    store = tmp_path / "store"
    env = {"MEMEXT_TUS": TUS, **SCALE}
    matrix = memext_matrix(tmp_path, gib_per_arch=0.7, env=env, max_attempts=1, memory="4GiB")
    matrix.write_text(matrix.read_text() + f"  cache: {store}\n")
    shards = [
        subprocess.Popen(
            [*factory_build(matrix, tmp_path / f"s{i}"), "--shard", f"{i}/2", "--cpus", "1"],
            cwd=ROOT,
            env={
                **os.environ,
                "FACTORY_HOME": str(fresh_home(tmp_path, f"home{i}", session_factory_home)),
                **WRITER,  # the runners of one store sign with its private key
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in (1, 2)
    ]
    errors = [p.communicate(timeout=1800)[1] for p in shards]
    compiled = 0
    for i, (proc, err) in enumerate(zip(shards, errors, strict=True), start=1):
        out = tmp_path / f"s{i}"
        assert proc.returncode == 0, err[-3000:]
        (job,) = json.loads((out / "report.json").read_text())["jobs"]
        assert job["result"] == "ok" and job["shard"] == f"{i}/2" and job["wheel"] is None, job
        match = re.fullmatch(rf"shard {i}/2: (\d+) compiled, (\d+) cached", job["reason"])
        assert match, job["reason"]
        compiled += int(match.group(1))
        assert not list(out.glob("*.whl"))  # a shard's wheel is of empty objects: never kept
    assert compiled >= len(TUS.split(","))
    assert len(store_entries(store)) >= len(TUS.split(","))
    # the final job: every compile from the store, then the link, the wheel and its checks
    _, job = run_build(matrix, tmp_path / "final", fresh_home(tmp_path, "home3", session_factory_home))
    assert job["result"] == "ok", (job["reason"], job["log_tail"])
    assert job["compiles_compiled"] == 0 and job["compiles_cached"] >= len(TUS.split(",")), job
    assert job["shard"] is None
    assert cubin_archs(tmp_path / "final" / job["wheel"]) == frozenset({80})
