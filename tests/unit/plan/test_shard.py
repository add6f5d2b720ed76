"""Sharding one job's compiles: the partition (pure), the wrapper's stand-in for other shards' compiles, the
CLI's --shard checks."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from test_memory_wrapper import compile_cmd, setup

from factory.container import nvcccall, protocol, shardskip
from factory.container.protocol import ProfileEntry
from factory.memory import profiles
from factory.plan import shard as S
from factory.trust import cachekeys, signing

# --- parsing I/N -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["1/1", "2/4", " 8/8 ", "3 / 5"])
def test_parse_shard(text: str) -> None:
    s = S.parse_shard(text)
    assert f"{s}" == text.replace(" ", "")


@pytest.mark.parametrize(
    ("text", "says"),
    [("0/4", "I must be 1 to 4"), ("5/4", "I must be 1 to 4"), ("1/0", "N must be"), ("a/b", "not I/N"),
     ("2", "not I/N"), ("-1/2", "not I/N"), ("1/999", "N must be 1 to 256"), ("", "not I/N")],
)  # fmt: skip
def test_bad_shards_are_refused(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        S.parse_shard(text)


# --- the partition -----------------------------------------------------------------------------------------


def test_partition_is_longest_first_into_the_least_loaded() -> None:
    weights = {"a": 7.0, "b": 5.0, "c": 4.0, "d": 3.0, "e": 1.0}
    # a->1, b->2, c->2 (5<7)... LPT: a:1(7) b:2(5) c:2(9) d:1(10) e:2(10)
    assert S.partition(weights, 2) == (("a", "d"), ("b", "c", "e"))
    assert S.shard_loads(weights, S.partition(weights, 2)) == (10.0, 10.0)


def test_partition_is_deterministic_whatever_the_input_order() -> None:
    rng = random.Random(7)
    weights = {f"f{i}.cu": float(rng.choice((1, 2, 3))) for i in range(40)}
    items = list(weights.items())
    first = S.partition(weights, 6)
    for _ in range(5):
        rng.shuffle(items)
        assert S.partition(dict(items), 6) == first


def test_partition_covers_every_unit_once() -> None:
    weights = {f"u{i}": float(i % 7 + 1) for i in range(50)}
    shards = S.partition(weights, 8)
    flat = [u for s in shards for u in s]
    assert sorted(flat) == sorted(weights) and len(flat) == len(set(flat))


def test_partition_balances_within_the_largest_unit() -> None:
    rng = random.Random(1)
    weights = {f"k{i}": rng.uniform(100, 400) for i in range(72)}
    for n in (2, 4, 8):
        loads = S.shard_loads(weights, S.partition(weights, n))
        assert max(loads) - min(loads) <= max(weights.values())
        assert max(loads) <= sum(weights.values()) / n * 1.1


def test_more_shards_than_units_leaves_the_last_empty() -> None:
    assert S.partition({"a": 1.0, "b": 1.0}, 4) == (("a",), ("b",), (), ())


def test_a_partition_needs_a_shard() -> None:
    with pytest.raises(ValueError):
        S.partition({"a": 1.0}, 0)


# --- the units and their weights ---------------------------------------------------------------------------


def make_tree(root: Path, files: list[str]) -> Path:
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text("// x\n")
    return root


def test_units_are_the_cuda_sources_outside_tests_and_examples(tmp_path: Path) -> None:
    tree = make_tree(
        tmp_path,
        ["src/b.cu", "src/a.cu", "module.cpp", "src/a.cuh", "csrc/cutlass/test/t.cu",
         "csrc/cutlass/examples/e.cu", ".git/x.cu", "kernels/deep/k.cu"],
    )  # fmt: skip
    assert S.compile_units(tree) == ("kernels/deep/k.cu", "src/a.cu", "src/b.cu")


def entry(wall: float) -> ProfileEntry:
    return ProfileEntry(peak_bytes=1, wall_s=wall, samples=1)


def test_weights_from_the_profile_group_naming_every_unit() -> None:
    units = ["src/heavy.cu", "src/light.cu"]
    entries = {
        "heavy.cu|compute_80,compute_90|2": entry(100.0),
        "light.cu|compute_80,compute_90|2": entry(10.0),
        "heavy.cu|compute_80|1": entry(50.0),
        "other.cu|compute_80|1": entry(1.0),
    }
    w = S.unit_weights(units, entries=entries, seconds_by_file=(("light*", 99.0),))
    assert w.basis == "profile"
    assert w.by_unit == {"src/heavy.cu": 100.0, "src/light.cu": 10.0}


def test_a_profile_a_shard_run_left_does_not_move_the_partition(tmp_path: Path) -> None:
    """Shard runs one after another on one host: shard 1 teaches the profile its own files only. Shard 2
    must then cut the same partition as shard 1 did, or files fall between the shards."""
    units = [f"src/k{i}.cu" for i in range(8)]
    tree = make_tree(tmp_path, units)
    table = tuple((f"k{i}.cu", float(10 + i)) for i in range(8))
    before = [S.shard_sources(tree, S.Shard(index=i, count=3), seconds_by_file=table)[0] for i in (1, 2, 3)]
    learned = {f"{u.split('/')[1]}|compute_80|1": entry(1000.0 - i) for i, u in enumerate(before[0])}
    after = [
        S.shard_sources(tree, S.Shard(index=i, count=3), entries=learned, seconds_by_file=table)
        for i in (1, 2, 3)
    ]
    assert [a[0] for a in after] == before and {a[1] for a in after} == {"recipe"}
    assert sorted(u for shard in before for u in shard) == units


def test_weights_fall_back_to_the_recipe_then_to_the_count() -> None:
    units = ["a/flash_bwd_x.cu", "a/flash_fwd_x.cu", "a/other.cu"]
    table = (("flash_bwd_*", 300.0), ("flash_fwd_*", 100.0))
    w = S.unit_weights(units, entries={"unrelated.cu|compute_80|1": entry(5.0)}, seconds_by_file=table)
    assert w.basis == "recipe"
    assert w.by_unit == {"a/flash_bwd_x.cu": 300.0, "a/flash_fwd_x.cu": 100.0, "a/other.cu": 200.0}
    w = S.unit_weights(units, entries={}, seconds_by_file=(("nothing*", 1.0),))
    assert w.basis == "count" and set(w.by_unit.values()) == {1.0}


def test_shard_sources_of_a_tree(tmp_path: Path) -> None:
    tree = make_tree(tmp_path, [f"src/k{i}.cu" for i in range(5)])
    got = [S.shard_sources(tree, S.Shard(index=i, count=2))[0] for i in (1, 2)]
    assert got == [("src/k0.cu", "src/k2.cu", "src/k4.cu"), ("src/k1.cu", "src/k3.cu")]
    assert S.shard_sources(tree, S.Shard(index=1, count=2))[1] == "count"


# --- what a shard did --------------------------------------------------------------------------------------


def measured(**fields: object) -> str:
    return protocol.measurement_line({"key": "k.cu|compute_80|1", "peak_bytes": 5, "wall_s": 1.0, **fields})


def test_count_compiles_by_the_cache_field() -> None:
    lines = [
        measured(cache="miss"),
        measured(),  # a wrapper without a cache
        measured(cache="hit"),
        measured(cache="skipped"),
        measured(cache="skipped"),
        measured(cache="miss", rc=1),
        "[3/9] c++ -c module.cpp",
        "::factory-compile:: {cut",
    ]
    counts = S.count_compiles(lines)
    assert counts == S.CompileCounts(compiled=2, cached=1, skipped=2, failed=1)
    assert S.summary(S.Shard(index=1, count=2), counts) == "shard 1/2: 2 compiled, 1 cached"


def test_a_skipped_compile_teaches_the_profile_nothing() -> None:
    assert protocol.parse_measurement(measured(cache="skipped")) is None
    assert protocol.parse_measurement(measured(cache="miss")) is not None


# --- the wrapper's stand-in --------------------------------------------------------------------------------


def test_in_shard_matches_relative_paths_as_suffixes() -> None:
    assert shardskip.in_shard("/var/factory/jobs/j/src/src/a.cu", ["src/a.cu"])
    assert shardskip.in_shard("src/a.cu", ["src/a.cu"])
    assert not shardskip.in_shard("/x/src/ba.cu", ["src/a.cu", "a.cu/"])
    assert not shardskip.in_shard("/x/other/a.cu", ["src/a.cu"])


def test_shard_sources_from_the_environment() -> None:
    assert shardskip.shard_sources({}) is None
    assert shardskip.shard_sources({protocol.ENV_SHARD_SOURCES: '["a.cu"]'}) == ("a.cu",)
    assert shardskip.shard_sources({protocol.ENV_SHARD_SOURCES: "[]"}) == ()
    # not a list of paths: no sharding (compiling everything is only slower)
    assert shardskip.shard_sources({protocol.ENV_SHARD_SOURCES: '{"a": 1}'}) is None
    assert shardskip.shard_sources({protocol.ENV_SHARD_SOURCES: "nope"}) is None


def test_outputs_of_an_nvcc_line() -> None:
    call = nvcccall.parse(["-c", "a.cu", "-o", "a.o", "--dependency-output", "a.o.d", "-ccbin", "g++"])
    assert (call.output, call.depfile) == ("a.o", "a.o.d")
    other = nvcccall.parse(["-c", "a.cu", "--output-file=b.o", "-MF=b.d"])
    assert (other.output, other.depfile) == ("b.o", "b.d")
    assert shardskip.host_compiler(call) == "g++"


def test_a_compile_of_another_shard_writes_an_empty_object(tmp_path: Path) -> None:
    env = setup(tmp_path, **{protocol.ENV_SHARD_SOURCES: json.dumps(["src/mine.cu"])})
    dep = tmp_path / "theirs.o.d"
    cmd = [*compile_cmd(tmp_path, "theirs"), "--dependency-output", str(dep)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "theirs.o").read_bytes()[:4] == b"\x7fELF"  # an object the linker takes
    assert dep.read_text() == f"{tmp_path / 'theirs.o'}: /src/theirs.cu\n"
    assert not (tmp_path / "fake.log").exists()  # nvcc never ran
    (line,) = [x for x in out.stderr.splitlines() if protocol.MEASUREMENT_MARK in x]
    assert S.count_compiles([line]).skipped == 1
    assert not (tmp_path / "m.jsonl").exists()  # nothing measured, nothing for the profile
    # the shard's own compile runs (the stand-in nvcc) and is measured
    out = subprocess.run(compile_cmd(tmp_path, "mine"), env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "fake.log").exists()
    (m,) = profiles.read_measurements(tmp_path / "m.jsonl")
    assert m.key == "mine.cu|compute_80|1"


# --- the CLI -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0/2", "3/2", "x"])
def test_build_refuses_a_bad_shard_in_one_line(value: str) -> None:
    matrix = Path(__file__).parents[3] / "matrix.yaml"
    cmd = [sys.executable, "-m", "factory", "build", "-m", str(matrix), "--shard", value, "--dry-run"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--shard" in lines[0] and value in lines[0], result.stderr


def test_github_matrices_list_shards_then_finals() -> None:
    jobs = [{"job_id": "a-py311", "python": "3.11"}, {"job_id": "b-py311", "python": "3.11"}]
    m = S.github_matrices(jobs, 3)
    shards = m["shards"]["include"]  # type: ignore[index]
    assert [(e["job"], e["shard"]) for e in shards] == [
        ("a-py311", "1/3"), ("a-py311", "2/3"), ("a-py311", "3/3"),
        ("b-py311", "1/3"), ("b-py311", "2/3"), ("b-py311", "3/3"),
    ]  # fmt: skip
    assert shards[0]["python"] == "3.11"
    assert m["finals"] == {"include": [{**j, "job": j["job_id"]} for j in jobs]}
    assert S.over_limit(m) == []
    big = S.github_matrices([{"job_id": f"j{i}"} for i in range(40)], 8)
    assert S.over_limit(big) == [
        "the shards matrix has 320 entries, above GitHub's 256: "
        "plan fewer jobs at a time with --chunk I/K, or fewer --shards"
    ]


def test_github_shard_outputs_name_the_shards_matrix_and_its_size() -> None:
    m = S.github_matrices([{"job_id": "a", "shards": 2}, {"job_id": "b"}], 1)
    lines = S.github_shard_outputs(m).splitlines()
    assert lines[1] == "shard_count=2"
    assert json.loads(lines[0].removeprefix("shards=")) == m["shards"]


def test_matrix_github_shards_cli() -> None:
    matrix = Path(__file__).parents[3] / "matrix.yaml"
    run = [sys.executable, "-m", "factory", "matrix", "-m", str(matrix), "--format", "github"]
    plain = json.loads(subprocess.run(run, capture_output=True, text=True, check=True).stdout)
    out = subprocess.run([*run, "--shards", "4"], capture_output=True, text=True, check=True)
    m = json.loads(out.stdout)
    assert len(m["shards"]["include"]) == 4 * len(plain["include"])
    assert [e["job"] for e in m["finals"]["include"]] == [e["job_id"] for e in plain["include"]]
    bad = subprocess.run([*run[:-2], "--shards", "4"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--shards" in bad.stderr


def test_a_job_s_own_shards_win() -> None:
    jobs = [{"job_id": "a", "shards": 2}, {"job_id": "b", "shards": 1}, {"job_id": "c"}]
    m = S.github_matrices(jobs, 3)
    assert [(e["job"], e["shard"]) for e in m["shards"]["include"]] == [  # type: ignore[index]
        ("a", "1/2"), ("a", "2/2"), ("c", "1/3"), ("c", "2/3"), ("c", "3/3"),
    ]  # fmt: skip
    assert [e["job"] for e in m["finals"]["include"]] == ["a", "b", "c"]  # type: ignore[index]


@pytest.mark.parametrize("value", ["0", "257", "true", '"4"', "2.5"])
def test_a_bad_shards_key_is_one_line(tmp_path: Path, value: str) -> None:
    from factory.core.errors import ConfigError
    from factory.spec.config import load_matrix_file

    path = tmp_path / "m.yaml"
    path.write_text(
        'package: {name: flash-attn, version: "2.8.3"}\n'
        'matrix:\n  cuda: ["12.8"]\n  torch: ["2.9"]\n  python: ["3.11"]\n  cxx11_abi: [true]\n'
        f'  arch: ["8.0"]\n  include:\n    - python: "3.11"\n      shards: {value}\n'
    )
    with pytest.raises(ConfigError, match=r"matrix.include\[0\].shards must be 1 to 256") as exc:
        load_matrix_file(path)
    assert exc.value.exit_code == 2 and "\n" not in str(exc.value)


def test_a_shard_job_s_container_gets_its_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from factory.build import jobrun, report
    from factory.build import runner as build
    from factory.memory import jobmemory
    from factory.plan.plan import plan_matrix
    from factory.spec.config import load_matrix_file

    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "home"))
    mf = load_matrix_file(Path(__file__).parents[3] / "examples" / "demo.yaml")
    settings = build.BuildSettings(output=tmp_path / "out", run_id="r1", shard=S.Shard(index=2, count=2))
    runner = build.Runner(None, mf, settings)
    job = plan_matrix(mf).jobs[0]
    run = jobrun.JobRun(runner.context, job, report.JobResult(job_id=job.id, variant_id="v", python="3.11"))
    tree = make_tree(tmp_path / "src", ["k/a.cu", "k/b.cu", "k/c.cu", "host.cpp"])
    run.log_path.parent.mkdir(parents=True)
    run.plan_shard(tree)
    parallel = jobmemory.initial_parallelism(
        recipe=mf.recipe, archs=1, limit_bytes=8 * 2**30, cpus=2, package="p", version="1"
    )
    env = run.container_env(parallel)
    assert env[protocol.ENV_SHARD] == "2/2"
    assert json.loads(env[protocol.ENV_SHARD_SOURCES]) == ["k/b.cu"]
    assert "shard 2/2: 1 CUDA file(s), balanced by count: k/b.cu" in run.log_path.read_text()
    # without --shard: nothing of it
    plain = build.Runner(None, mf, build.BuildSettings(output=tmp_path / "out", run_id="r2"))
    env = jobrun.JobRun(plain.context, job, report.JobResult(job_id=job.id, variant_id="v", python="3.11"))
    assert protocol.ENV_SHARD_SOURCES not in env.container_env(parallel)


def test_a_shard_needs_the_cache() -> None:
    matrix = Path(__file__).parents[3] / "matrix.yaml"
    cmd = [sys.executable, "-m", "factory", "build", "-m", str(matrix), "--shard", "1/2", "--cache", "off"]
    result = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: --shard compiles into the compile cache, which is off (build.cache, --cache)"
    )


def test_matrix_github_shards_outputs_and_the_256_limit(tmp_path: Path) -> None:
    matrix = Path(__file__).parents[3] / "matrix.yaml"
    out = tmp_path / "github_output"
    run = [sys.executable, "-m", "factory", "matrix", "-m", str(matrix), "--format", "github"]
    subprocess.run([*run, "--shards", "2", "--github-output", str(out)], capture_output=True, check=True)
    fields = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert set(fields) == {"matrix", "count", "shards", "shard_count"}
    assert (
        int(fields["shard_count"]) == 2 * int(fields["count"]) == len(json.loads(fields["shards"])["include"])
    )
    # never a matrix GitHub refuses: one line, exit 2, nothing written
    out.unlink()
    big = subprocess.run(
        [*run, "--shards", "200", "--github-output", str(out)], capture_output=True, text=True
    )
    assert big.returncode == 2 and big.stderr.strip().count("\n") == 0 and "256" in big.stderr, big.stderr
    assert not out.exists()


@pytest.mark.parametrize(("key", "warned"), [("", True), ("private", False)])
def test_a_shard_without_the_store_s_private_key_is_warned(tmp_path: Path, key: str, warned: bool) -> None:
    # a final build on another runner takes this one's compiles only when the store's key signed them
    matrix = Path(__file__).parents[3] / "matrix.yaml"
    cmd = [sys.executable, "-m", "factory", "build", "-m", str(matrix), "--shard", "1/2", "--dry-run"]
    cmd += ["--cache", str(tmp_path / "store")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FACTORY_CACHE_")}
    value = signing.generate_key()[0].decode() if key else ""
    result = subprocess.run(cmd, capture_output=True, text=True, env={**env, cachekeys.SIGN_KEY_ENV: value})
    assert result.returncode == 0, result.stderr
    assert ("warning: --shard without FACTORY_CACHE_SIGN_KEY" in result.stderr) is warned, result.stderr


def test_an_hmac_cache_key_of_an_earlier_factory_is_one_line_exit_2(tmp_path: Path) -> None:
    matrix = Path(__file__).parents[3] / "matrix.yaml"
    cmd = [sys.executable, "-m", "factory", "build", "-m", str(matrix), "--dry-run"]
    cmd += ["--cache", str(tmp_path / "store")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FACTORY_CACHE_")}
    hmac_key = "an-hmac-key-the-runners-of-this-store-shared-0123"
    result = subprocess.run(cmd, capture_output=True, text=True, env={**env, "FACTORY_CACHE_KEY": hmac_key})
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(
        "error: $FACTORY_CACHE_KEY: the compile cache is now signed with an Ed25519"
    )
    assert hmac_key not in result.stderr and not (tmp_path / "store").exists()
