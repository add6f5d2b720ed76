"""The compile cache on the host: build.cache and build.cache_max, where the cache lives, its sync with a
store (a directory here; S3 through moto in tests/integration/test_cache_s3.py), counts and display."""

from __future__ import annotations

import json
import os
import textwrap
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from factory import build, cache, jobrun, leftovers, report
from factory.cli.progress import progress_line, summary_lines
from factory.config import load_matrix_file
from factory.container import driver, protocol
from factory.container.protocol import measurement_line
from factory.errors import ConfigError
from factory.memory import jobmemory
from factory.plan import plan_matrix
from factory.stores import LocalStore

ROOT = Path(__file__).resolve().parents[2]
MATRIX = """\
package: {name: demo-ext, version: "0.1.0", source: {path: src}}
recipe: {name: demo, import_name: demo_ext}
matrix: {cuda: ["13.0"], torch: ["2.14"], python: ["3.11"], cxx11_abi: [true], arch: ["9.0"]}
"""


def load(tmp_path: Path, extra: str = ""):  # type: ignore[no-untyped-def]
    (tmp_path / "src").mkdir(exist_ok=True)
    path = tmp_path / "m.yaml"
    path.write_text(MATRIX + textwrap.dedent(extra))
    return load_matrix_file(path)


# --- build.cache, build.cache_max, --cache ---------------------------------------------------------------


def test_the_cache_is_on_and_local_by_default(tmp_path: Path) -> None:
    mf = load(tmp_path)
    assert mf.build.cache is True and mf.build.cache_max == cache.DEFAULT_MAX_BYTES
    config = cache.resolve(mf, publishing=False, home=tmp_path / "home")
    assert config == cache.CacheConfig(local=tmp_path / "home" / "cache" / "compile")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("false", False),
        ("true", True),
        ("s3://bucket/team/cc", "s3://bucket/team/cc"),
        ("/srv/cc", "/srv/cc"),
    ],
)
def test_build_cache_values(tmp_path: Path, value: str, expected: object) -> None:
    mf = load(tmp_path, f"build: {{cache: {value}, cache_max: 5GiB}}\n")
    assert mf.build.cache == expected
    assert mf.build.cache_max == 5 * 2**30


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("build: {cache: 3}", "build.cache must be true, false, s3://bucket/prefix or a directory"),
        ("build: {cache: 'https://x/y'}", "build.cache 'https://x/y': use a directory or s3://bucket/prefix"),
        ("build: {cache: 's3://B_ad/x'}", "bucket 'B_ad'"),
        ("build: {cache_max: 12Q}", "build.cache_max: size '12Q' is not a size"),
        ("build: {cache_max: 1.5}", "build.cache_max must be a size like 16GiB"),
        ("build: {cache_max: 0}", "build.cache_max: size 0 must be positive"),
    ],
)
def test_bad_build_cache_is_one_line_naming_the_key(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, extra + "\n")
    assert message in str(err.value) and "m.yaml:4" in str(err.value)
    assert "\n" not in str(err.value)


def test_publishing_puts_the_store_under_the_publish_store(tmp_path: Path) -> None:
    mf = load(tmp_path, "publish: {to: 's3://wheels/team/idx', endpoint_url: 'http://127.0.0.1:9000'}\n")
    config = cache.resolve(mf, publishing=True, home=tmp_path)
    assert config is not None
    assert config.store == "s3://wheels/team/idx/_cache/compile"
    assert config.endpoint_url == "http://127.0.0.1:9000"
    local = cache.resolve(
        load(tmp_path, f"publish: {{to: '{tmp_path}/idx'}}\n"), publishing=True, home=tmp_path
    )
    assert local is not None and local.store == str(tmp_path / "idx" / "_cache" / "compile")
    assert cache.resolve(mf, publishing=False, home=tmp_path).store is None  # type: ignore[union-attr]


def test_an_explicit_store_and_the_flag_win(tmp_path: Path) -> None:
    mf = load(tmp_path, f"build: {{cache: '{tmp_path}/cc'}}\npublish: {{to: 's3://wheels/idx'}}\n")
    config = cache.resolve(mf, publishing=True, home=tmp_path)
    assert config is not None and config.store == f"{tmp_path}/cc" and config.endpoint_url is None
    assert cache.resolve(mf, publishing=True, override="off", home=tmp_path) is None
    flag = cache.resolve(mf, publishing=True, override="s3://other/cc", home=tmp_path)
    assert flag is not None and flag.store == "s3://other/cc"
    with pytest.raises(ConfigError, match=r"^--cache 'ftp://x': use a directory"):
        cache.resolve(mf, publishing=True, override="ftp://x", home=tmp_path)
    off = load(tmp_path, "build: {cache: false}\n")
    assert cache.resolve(off, publishing=True, home=tmp_path) is None


@pytest.mark.parametrize(("text", "size"), [("20GiB", 20 * 2**30), ("512M", 512 * 2**20), (1024, 1024)])
def test_parse_max(text: str | int, size: int) -> None:
    assert cache.parse_max(text, what="--max") == size


@pytest.mark.parametrize("bad", ["12Q", "-1", "0", "", "GiB"])
def test_parse_max_refuses_in_one_line(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"^--max: size"):
        cache.parse_max(bad, what="--max")


# --- the local directory and the sync --------------------------------------------------------------------

RK, DK, OTHER = "ab" + "1" * 62, "cd" + "3" * 62, "ef" + "5" * 62
OBJ = f"v1/o/ab/{RK}"
MANIFEST = f"v1/m/cd/{DK}/{RK}.json"
THEIRS = f"v1/o/ef/{OTHER}"


def put(root: Path, key: str, data: bytes) -> Path:
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("relative", "key"),
    [
        (OBJ, OBJ),
        (MANIFEST, MANIFEST),
        (f"v1/o/ab/.tmp-{RK}-12-ab12", None),
        ("v1/o/ab/ab12.tmp", None),
        ("v1/../etc/passwd", None),
        ("v2/o/ab/ab12", None),
        ("v1", None),
        ("_cache/v1/o/ab/ab12", None),
    ],
)
def test_layout_key(relative: str, key: str | None) -> None:
    assert cache.layout_key(relative) == key


def test_local_files_are_committed_files_only(tmp_path: Path) -> None:
    put(tmp_path, OBJ, b"object")
    put(tmp_path, MANIFEST, b"{}")
    put(tmp_path, f"v1/o/ab/.tmp-{RK}-1-x", b"half")
    put(tmp_path, "stray.txt", b"x")
    assert cache.local_files(tmp_path) == {OBJ, MANIFEST}
    assert cache.local_files(tmp_path / "absent") == set()


def test_push_then_pull_is_the_union_and_never_overwrites(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    store = LocalStore(tmp_path / "store")
    put(a, OBJ, b"object")
    put(a, MANIFEST, b"{}")
    put(a, f"v1/o/ab/.tmp-{RK}-1-x", b"half")
    put(tmp_path / "store", THEIRS, b"theirs")  # another machine's
    put(tmp_path / "store", "profiles/x.json", b"not the cache's")
    put(b, THEIRS, b"mine, same name")  # a name is its content: never replaced either way
    remote = cache.remote_files(store)
    assert remote == {THEIRS}
    sent = cache.push(store, a, remote=remote)
    assert (sent.files, sent.bytes, sent.failed) == (2, 8, 0)
    assert remote == {OBJ, MANIFEST, THEIRS}
    assert cache.push(store, a, remote=cache.remote_files(store)).files == 0
    got = cache.pull(store, b)
    assert (got.files, got.failed) == (2, 0)
    assert cache.local_files(b) == {OBJ, MANIFEST, THEIRS}
    assert (b / OBJ).read_bytes() == b"object"
    assert (b / THEIRS).read_bytes() == b"mine, same name"
    assert (tmp_path / "store" / THEIRS).read_bytes() == b"theirs"
    assert not list(b.rglob(".tmp-*")) and not (b / "profiles").exists()


def test_directories_the_host_makes_stay_writable_by_the_build_user(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    put(tmp_path / "store", OBJ, b"object")
    cache.pull(store, tmp_path / "local")
    for directory in (tmp_path / "local", tmp_path / "local/v1", tmp_path / "local/v1/o/ab"):
        assert directory.stat().st_mode & 0o777 == 0o777, directory
    assert (
        tmp_path / "local" / OBJ
    ).stat().st_mode & 0o777 == 0o666  # a hit in a container refreshes its mtime (LRU)


def test_a_download_cut_short_is_not_committed(tmp_path: Path) -> None:
    class Short(LocalStore):
        def open(self, key: str):  # type: ignore[no-untyped-def]
            opened = super().open(key)
            assert opened is not None
            return opened[0], opened[1] + 10  # the store said more than came

    put(tmp_path / "store", OBJ, b"object")
    got = cache.pull(Short(tmp_path / "store"), tmp_path / "local")
    assert (got.files, got.failed) == (0, 1)
    assert cache.local_files(tmp_path / "local") == set()
    assert not [p for p in (tmp_path / "local").rglob("*") if p.is_file()]


def test_cache_sync_pulls_before_a_job_and_uploads_when_nudged(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    put(store_dir, MANIFEST, b"{}")
    lines: list[str] = []
    config = cache.CacheConfig(local=tmp_path / "local", store=str(store_dir))
    with cache.CacheSync(config, log=lines.append) as sync:
        sync.before_job("job1")
        assert (tmp_path / "local" / MANIFEST).is_file()
        put(tmp_path / "local", OBJ, b"compiled now")
        sync.nudge()  # a compile finished: it goes up while the job runs, before any job end
        deadline = time.monotonic() + 30
        while not (store_dir / OBJ).is_file():
            assert time.monotonic() < deadline, "the nudged upload never came"
            time.sleep(0.05)
    assert lines == [f"job1: compile cache: 1 file(s) fetched from {store_dir}"]


def test_a_pull_stops_at_the_bound_and_fetches_a_file_once_a_run(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    put(store_dir, OBJ, b"x" * 100)
    put(store_dir, THEIRS, b"y" * 100)
    put(store_dir, MANIFEST, b"{}")
    assert cache.pull(LocalStore(store_dir), tmp_path / "capped", max_bytes=150).files == 2
    config = cache.CacheConfig(local=tmp_path / "local", store=str(store_dir))
    sync = cache.CacheSync(config)
    sync.before_job("j1")
    assert cache.local_files(tmp_path / "local") == {OBJ, THEIRS, MANIFEST}
    (tmp_path / "local" / THEIRS).unlink()  # pruned after the job
    sync.before_job("j2")
    assert cache.local_files(tmp_path / "local") == {OBJ, MANIFEST}


def test_an_unreachable_store_costs_only_the_head_start(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    lines: list[str] = []
    sync = cache.CacheSync(cache.CacheConfig(local=tmp_path / "local", store=str(blocker)), log=lines.append)
    sync.before_job("j")
    assert sync.upload().files == 0
    assert len(lines) == 1 and lines[0].startswith("compile cache store not opened: ")


def test_sync_writes_objects_before_their_manifests(tmp_path: Path) -> None:
    """A build's lookup (and a prune) removes a manifest whose object is missing: never show one early."""
    order: list[str] = []

    class Recording(LocalStore):
        def put(self, key: str, data: bytes | Path, **kwargs: object) -> str:  # type: ignore[override]
            order.append(key)
            return super().put(key, data, **kwargs)  # type: ignore[arg-type]

    put(tmp_path / "a", MANIFEST, b"{}")
    put(tmp_path / "a", OBJ, b"object")
    cache.push(Recording(tmp_path / "store"), tmp_path / "a", remote=set())
    assert order == [OBJ, MANIFEST]
    assert cache.objects_first([MANIFEST, THEIRS, OBJ]) == [OBJ, THEIRS, MANIFEST]


# --- factory cache stats|prune ------------------------------------------------------------------------------


def entry(root: Path, n: int, size: int, mtime: float) -> None:
    rk, dk = f"{n:02x}" * 32, f"{n + 100:02x}" * 32
    for key, data in ((f"v1/o/{rk[:2]}/{rk}", b"x" * size), (f"v1/m/{dk[:2]}/{dk}/{rk}.json", b"{}")):
        path = put(root, key, data)
        os.utime(path, (mtime, mtime))


def test_cli_stats_and_prune(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path))
    root = cache.local_dir()
    code, out = factory_cli(["cache", "stats", "--json"])
    assert code == 0 and json.loads(out)["entries"] == 0
    now = time.time()
    for n in range(3):
        entry(root, n, 1000, now - 100 + n)  # entry 0 least recently used
    code, out = factory_cli(["cache", "stats", "--json"])
    data = json.loads(out)
    assert code == 0, out
    assert (data["entries"], data["objects"], data["bytes"]) == (3, 3, 3 * 1002)
    assert data["path"] == str(root) and data["oldest"] < data["newest"]
    code, out = factory_cli(["cache", "stats"])
    assert code == 0 and f"compile cache: {root}" in out and "entries: 3" in out
    code, out = factory_cli(["cache", "prune", "--max", "2100"])
    assert code == 0, out
    assert "removed 1 entries" in out
    assert not (root / "v1/o/00").exists() or not list((root / "v1/o/00").iterdir())
    assert cache.stats(root).entries == 2


@pytest.mark.parametrize("bad", ["12Q", "0", "-5GiB"])
def test_cli_prune_with_a_bad_size_is_one_line(
    bad: str, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    code, out = factory_cli(["cache", "prune", "--max", bad])
    assert code == 2
    assert out.strip().count("\n") == 0 and out.startswith("error: --max: size")


# --- counts, report, display ------------------------------------------------------------------------------


def measured(state: str | None) -> str:
    record: dict[str, object] = {"key": "k.cu|9.0|1", "peak_bytes": 1, "wall_s": 1.0}
    if state is not None:
        record["cache"] = state
    return measurement_line(record)


def test_count_compiles_from_measurement_lines() -> None:
    lines = [measured("hit")] * 12 + [measured("miss")] * 2 + [measured("off"), measured(None)]
    lines += ["[3/15] nvcc ...", "::factory-compile:: {cut short", '::factory:: {"phase": "build"}']
    assert cache.count_compiles(lines) == (12, 4)


def test_report_and_progress_show_cached_and_compiled() -> None:
    r = report.JobResult(job_id="j", variant_id="v", python="3.11", compiles_cached=12, compiles_compiled=3)
    data = r.to_json()
    assert data["compiles_cached"] == 12 and data["compiles_compiled"] == 3
    r.phase, r.started = "build", 0.0
    assert "12 cached / 3 compiled" in progress_line(r, 10.0)
    r.result, r.phase = "ok", "ok"
    rep = report.BuildReport(run_id="r", matrix="m", started=0.0, jobs=[r])
    assert "12 cached / 3 compiled" in summary_lines(rep)[1]
    fresh = report.JobResult(job_id="j", variant_id="v", python="3.11")
    fresh.phase, fresh.started = "build", 0.0
    assert "cached" not in progress_line(fresh, 1.0)


# --- what the build container gets ------------------------------------------------------------------------


def test_the_container_gets_a_local_mount_and_no_store_or_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "home"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.setenv(name, "do-not-leak")
    mf = load_matrix_file(ROOT / "examples" / "demo.yaml")
    config = cache.CacheConfig(
        local=cache.local_dir(), store="s3://wheels/secret-prefix/_cache/compile", endpoint_url="http://s3.x"
    )
    settings = build.BuildSettings(output=tmp_path / "out", run_id="r1", compile_cache=config)
    runner = build.Runner(None, mf, settings)
    job = plan_matrix(mf).jobs[0]
    run = jobrun.JobRun(runner.context, job, report.JobResult(job_id=job.id, variant_id="v", python="3.11"))
    parallel = jobmemory.initial_parallelism(
        recipe=mf.recipe, archs=1, limit_bytes=8 * 2**30, cpus=2, package="p", version="1"
    )
    env = run.container_env(parallel)
    assert env[cache.ENV_DIR] == cache.MOUNT and "CXX" not in env  # the driver sets CXX (driver.cache_env)
    assert not [k for k in env if k.startswith("AWS_")]
    assert not [k for k, v in env.items() if "secret-prefix" in v or "s3.x" in v or "do-not-leak" in v]
    inputs = jobrun.JobInputs(image="img", source=tmp_path, wheelhouse=tmp_path)
    mounts = run.mounts(inputs, tmp_path / "out")
    host = [h for h, m in mounts.items() if m["bind"] == cache.MOUNT]
    assert host == [str(tmp_path / "home" / "cache" / "compile")] and mounts[host[0]]["mode"] == "rw"
    assert Path(host[0]).is_dir() and Path(host[0]).stat().st_mode & 0o777 == 0o777


def cache_job_run(tmp_path: Path, job_env: dict[str, str]) -> tuple[jobrun.JobRun, dict[str, str]]:
    """A job of the demo matrix with the cache on and `job_env` as its matrix env, and its container env."""
    mf = load_matrix_file(ROOT / "examples" / "demo.yaml")
    config = cache.CacheConfig(local=tmp_path / "cache")
    settings = build.BuildSettings(output=tmp_path / "out", run_id="r1", compile_cache=config)
    job = replace(plan_matrix(mf).jobs[0], env=job_env)
    run = jobrun.JobRun(
        build.Runner(None, mf, settings).context,
        job,
        report.JobResult(job_id=job.id, variant_id="v", python="3.11"),
    )
    parallel = jobmemory.initial_parallelism(
        recipe=mf.recipe, archs=1, limit_bytes=8 * 2**30, cpus=2, package="p", version="1"
    )
    return run, run.container_env(parallel)


def in_the_container(image_env: dict[str, str], host_env: dict[str, str]) -> dict[str, str]:
    """The build's env as the driver makes it: the image's env under the host's (docker's rule), then the
    driver's own cache settings."""
    env = {**image_env, **host_env}
    return {**env, **driver.cache_env(env)}


def test_a_matrix_cxx_is_the_real_compiler_behind_the_launcher(tmp_path: Path) -> None:
    _, env = cache_job_run(tmp_path, {"CXX": "g++-13"})
    assert env["CXX"] == "g++-13"  # the matrix's, untouched by the host
    built = in_the_container({"PATH": "/usr/bin"}, env)
    assert built["CXX"] == str(driver.CXX_LAUNCHER) and built["FACTORY_REAL_CXX"] == "g++-13"


def test_the_host_sets_no_cxx_so_the_image_cxx_is_kept(tmp_path: Path) -> None:
    """A CXX from the host would replace the image's before the driver could keep it as the real compiler."""
    run, env = cache_job_run(tmp_path, {})
    assert "CXX" not in run.driver_env() and "CXX" not in env
    built = in_the_container({"CXX": "g++-14"}, env)
    assert built["CXX"] == str(driver.CXX_LAUNCHER) and built["FACTORY_REAL_CXX"] == "g++-14"
    assert in_the_container({}, env)["CXX"] == str(driver.CXX_LAUNCHER)


def test_the_job_dir_records_its_factory_process(tmp_path: Path) -> None:
    """For `factory clean`: the driver writes it into the job's directory in the work volume."""
    run, env = cache_job_run(tmp_path, {})
    assert leftovers.parse_owner(env[protocol.ENV_JOB_OWNER]) == leftovers.this_process()
    assert run.driver_env()[protocol.ENV_JOB_OWNER] == env[protocol.ENV_JOB_OWNER]


def test_with_the_cache_off_the_container_has_neither(tmp_path: Path) -> None:
    mf = load_matrix_file(ROOT / "examples" / "demo.yaml")
    runner = build.Runner(None, mf, build.BuildSettings(output=tmp_path, run_id="r1", compile_cache=None))
    job = plan_matrix(mf).jobs[0]
    run = jobrun.JobRun(runner.context, job, report.JobResult(job_id=job.id, variant_id="v", python="3.11"))
    assert cache.ENV_DIR not in run.driver_env() and "CXX" not in run.driver_env()
    inputs = jobrun.JobInputs(image="img", source=tmp_path, wheelhouse=tmp_path)
    assert cache.MOUNT not in [m["bind"] for m in run.mounts(inputs, tmp_path).values()]


def test_measured_cache_reads_one_line() -> None:
    """What the job's line handler counts as lines stream."""
    assert cache.measured_cache(measured("hit")) == "hit"
    assert cache.measured_cache(measured("weird")) == "off"
    assert cache.measured_cache("plain line") is None
    assert cache.measured_cache("::factory-compile:: [1]") is None


def test_build_with_a_bad_cache_flag_is_a_usage_error(
    factory_cli: Callable[[list[str]], tuple[int, str]],
) -> None:
    matrix = str(ROOT / "examples" / "demo.yaml")
    code, out = factory_cli(["build", "--matrix", matrix, "--dry-run", "--cache", "ftp://host/x"])
    assert code == 2 and out.strip() == "error: --cache 'ftp://host/x': use a directory or s3://bucket/prefix"
    code, out = factory_cli(["build", "--matrix", matrix, "--dry-run", "--cache", "off"])
    assert code == 0, out
