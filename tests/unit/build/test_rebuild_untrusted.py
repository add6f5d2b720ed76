"""`factory rebuild`: the wheel is the attacker. Its provenance's rebuild document is read as
untrusted input: only the keys the factory writes there, the network off, patches only as the wheel's own
files by sha256, sources only as recorded (or `--source`), and no image or torch index the user's
configuration does not name without `--allow-foreign`. Each hostile wheel here is the demo's provenance with
its rebuild document rewritten; nothing may be planned, fetched or built from it (a spy stands in for the
build, `factory.build.request.run_planned`, and records what it would have built)."""

from __future__ import annotations

import hashlib
import http.server
import json
import shutil
import threading
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from factory.build import facts as buildfacts
from factory.build import rebuild
from factory.build.report import BuildReport, JobResult
from factory.core.errors import CheckError, ConfigError
from factory.plan.plan import plan_matrix
from factory.spec.config import load_matrix_file
from factory.wheel import provenance, sbom

ROOT = Path(__file__).resolve().parents[3]
DEMO_YAML = ROOT / "examples" / "demo.yaml"
DEMO_SRC = ROOT / "examples" / "demo-ext"
DIST = "factory_demo_ext-0.1.0.dist-info"
WHEEL = "factory_demo_ext-0.1.0+cu13.0.torch2.14.abi1.sm80-cp311-cp311-linux_x86_64.whl"
PATCH = b"--- a/README\n+++ b/README\n@@ -0,0 +1 @@\n+patched\n"
NEEDED: dict[str, tuple[str, ...]] = {"factory_demo_ext/_C.so": ("libc10.so",)}


def user_matrix(tmp: Path, *, patch: bytes | None = PATCH, build: str = "") -> Path:
    """The user's own matrix: the demo's, with a patch beside it (and `build` lines added)."""
    tmp.mkdir(parents=True, exist_ok=True)
    text = DEMO_YAML.read_text()
    if patch is not None:
        (tmp / "fix.patch").write_bytes(patch)
        text = text.replace("  env: {}\n", "  env: {}\n  patches: [fix.patch]\n")
    text = text.replace('arch: ["8.0", "9.0;12.0"]', 'arch: ["8.0"]')
    if build:
        text = text.replace("build:\n", f"build:\n{build}")
    shutil.copytree(DEMO_SRC, tmp / "demo-ext", dirs_exist_ok=True)
    (tmp / "matrix.yaml").write_text(text)
    return tmp / "matrix.yaml"


def facts_of(matrix: Path) -> provenance.BuildFacts:
    mf = load_matrix_file(matrix)
    (job,) = plan_matrix(mf).jobs
    source = provenance.SourceFacts(
        kind="path", path="demo-ext", tree_sha256="a" * 64, patches=buildfacts.patch_facts(mf.recipe.patches)
    )
    inputs = buildfacts.InputFacts(
        source=source, image=buildfacts.image_identity(mf, job, {}), build_requirements=()
    )
    return buildfacts.build_facts(
        mf, job, inputs=inputs, version=f"0.1.0+{job.variant.local_version}", torch_version="2.14.1",
        toolchain=None, toolkit=None, factory_version="0.1.0",
    )  # fmt: skip


def wheel_of(
    path: Path, facts: provenance.BuildFacts, change: Callable[[dict[str, Any]], None] | None = None
) -> Path:
    """A wheel carrying the provenance of `facts`, its document changed by `change` first."""
    doc = provenance.compose(facts)
    if change is not None:
        change(doc)
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("factory_demo_ext/__init__.py", "")
        archive.writestr(
            f"{DIST}/METADATA", "Metadata-Version: 2.1\nName: factory-demo-ext\nVersion: 0.1.0\n"
        )
        archive.writestr(f"{DIST}/{provenance.FILE_NAME}", provenance.dumps(doc))
        archive.writestr(f"{DIST}/{facts.sbom}", sbom.compose(facts, NEEDED))
    return path


def report_of(result: JobResult) -> BuildReport:
    return BuildReport(run_id="r", matrix="rebuild.yaml", started=0.0, jobs=[result])


class Spy:
    """Stands in for the build (`factory.build.request.run_planned`): records what would have been built."""

    def __init__(self) -> None:
        self.planned: list[Any] = []

    def __call__(self, planned: Any, **_hooks: Any) -> Any:
        from factory.build.pipeline import RunOutcome

        self.planned.append(planned)
        job = planned.jobs[0]
        result = JobResult(job_id=job.id, variant_id=job.variant.id, python=job.python)
        result.result, result.reason = "failed", "the spy builds nothing"
        return RunOutcome(report=report_of(result))


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Spy:
    import factory.build.request

    found = Spy()
    monkeypatch.setattr(factory.build.request, "run_planned", found)
    return found


@pytest.fixture
def user(tmp_path: Path) -> Path:
    """The user's matrix, without a patch: a hostile wheel's rebuild needs nothing but `--source`."""
    return user_matrix(tmp_path / "user", patch=None)


@pytest.fixture
def patched(tmp_path: Path) -> Path:
    """The user's matrix with a patch beside it."""
    return user_matrix(tmp_path / "patched")


def verify(wheel: Path, **options: Any) -> rebuild.RebuildResult:
    return rebuild.rebuild_and_compare(str(wheel), rebuild.RebuildOptions(**options), log=lambda _line: None)


def in_document(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """A change of the provenance's rebuild document, as a change of the provenance."""
    return lambda doc: change(doc["rebuild"]["matrix"])


# --- the honest wheel: planned, its patch taken from the user's matrix by sha256 ---------------------------


def test_an_honest_wheel_is_planned_with_its_patch_from_the_users_matrix(
    tmp_path: Path, patched: Path, spy: Spy
) -> None:
    wheel = wheel_of(tmp_path / "w" / WHEEL, facts_of(patched))
    result = verify(wheel, source=DEMO_SRC, matrix=patched, workdir=tmp_path / "work")
    assert result.failure == "the spy builds nothing"
    (planned,) = spy.planned
    assert planned.mf.build.offline is True
    (patch,) = planned.mf.recipe.patches
    assert patch == tmp_path / "work" / "patches" / "fix.patch" and patch.read_bytes() == PATCH
    assert planned.mf.package.source.path.resolve() == DEMO_SRC.resolve()


def test_the_source_and_patch_come_from_the_users_matrix_or_the_work_directory(
    tmp_path: Path, patched: Path, spy: Spy
) -> None:
    wheel = wheel_of(tmp_path / "w" / WHEEL, facts_of(patched))
    verify(wheel, matrix=patched)  # no --source: the matrix's own directory of the same name
    assert spy.planned[-1].mf.package.source.path.resolve() == (patched.parent / "demo-ext").resolve()
    work = tmp_path / "work"
    (work / "patches").mkdir(parents=True)
    (work / "patches" / "fix.patch").write_bytes(PATCH)  # put there by hand: its sha256 is the recorded one
    verify(wheel, source=DEMO_SRC, workdir=work)
    assert spy.planned[-1].mf.recipe.patches == (work / "patches" / "fix.patch",)
    (work / "patches" / "fix.patch").write_bytes(b"another patch\n")
    with pytest.raises(ConfigError, match=r"fix\.patch \(sha256 [0-9a-f]{64}\)"):
        verify(wheel, source=DEMO_SRC, workdir=work)
    assert len(spy.planned) == 2


def test_a_missing_patch_names_the_file_and_its_sha256(tmp_path: Path, patched: Path, spy: Spy) -> None:
    wheel = wheel_of(tmp_path / "w" / WHEEL, facts_of(patched))
    digest = hashlib.sha256(PATCH).hexdigest()
    with pytest.raises(ConfigError) as info:
        verify(wheel, source=DEMO_SRC)
    line = str(info.value)
    assert "fix.patch" in line and digest in line and "--matrix" in line and "\n" not in line
    other = user_matrix(tmp_path / "other", patch=b"something else\n")
    with pytest.raises(ConfigError, match=f"fix.patch.*{digest}"):
        verify(wheel, source=DEMO_SRC, matrix=other)
    assert spy.planned == []


# --- the hostile wheels of issue 41 -------------------------------------------------------------------------


def _offline(m: dict[str, Any]) -> None:
    m["build"]["offline"] = False


def test_a_wheel_cannot_turn_the_network_on(tmp_path: Path, user: Path, spy: Spy) -> None:
    wheel = wheel_of(tmp_path / "w" / WHEEL, facts_of(user), in_document(_offline))
    with pytest.raises((ConfigError, CheckError), match=r"build\.offline"):
        verify(wheel, source=DEMO_SRC)
    assert spy.planned == []


def test_a_wheel_cannot_make_the_host_read_an_absolute_patch_path(
    tmp_path: Path, user: Path, spy: Spy
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")

    def absolute(m: dict[str, Any]) -> None:
        m["recipe"]["patches"] = [str(secret)]

    wheel = wheel_of(tmp_path / "w" / WHEEL, facts_of(user), in_document(absolute))
    with pytest.raises((ConfigError, CheckError), match="patch"):
        verify(wheel, source=DEMO_SRC)
    assert spy.planned == []


def test_a_home_source_path_is_refused(
    tmp_path: Path, user: Path, spy: Spy, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))

    def tilde(m: dict[str, Any]) -> None:
        m["package"]["source"] = {"path": "~"}

    wheel = wheel_of(tmp_path / "w" / WHEEL, facts_of(user), in_document(tilde))
    with pytest.raises((ConfigError, CheckError), match="~"):
        verify(wheel, source=DEMO_SRC, workdir=tmp_path / "work")
    assert spy.planned == []


def test_a_local_git_clone_is_refused(tmp_path: Path, user: Path, spy: Spy) -> None:
    facts = facts_of(user)
    repo = tmp_path / "private-repo"
    repo.mkdir()
    facts = replace(
        facts,
        source=replace(facts.source, kind="git", git_url=f"file://{repo}", git_ref="v1", commit="c" * 40),
    )

    def local_git(m: dict[str, Any]) -> None:
        m["package"]["source"] = {"git": f"file://{repo}", "ref": "c" * 40}

    wheel = wheel_of(tmp_path / "w" / WHEEL, facts, in_document(local_git))
    with pytest.raises((ConfigError, CheckError), match="file://"):
        verify(wheel)
    assert spy.planned == []


def _image(m: dict[str, Any]) -> None:
    m["build"]["images"] = {"13.0": "registry.evil.example/builder:1"}


def test_a_builder_image_from_another_registry_needs_allow_foreign(
    tmp_path: Path, user: Path, spy: Spy
) -> None:
    wheel = wheel_of(tmp_path / "w" / WHEEL, facts_of(user), in_document(_image))
    with pytest.raises(
        ConfigError, match=r"registry\.evil\.example/builder:1.*--allow-foreign image"
    ) as info:
        verify(wheel, source=DEMO_SRC)
    assert "\n" not in str(info.value)
    assert spy.planned == []
    verify(wheel, source=DEMO_SRC, allow_foreign=frozenset({"image"}))
    (planned,) = spy.planned
    assert planned.mf.build.images["13.0"] == "registry.evil.example/builder:1"


def test_an_image_the_users_matrix_names_is_not_foreign(tmp_path: Path, spy: Spy) -> None:
    mine = user_matrix(tmp_path / "user", build='  images: {"13.0": "registry.mine.example/builder:1"}\n')
    wheel = wheel_of(tmp_path / "w" / WHEEL, facts_of(mine))
    verify(wheel, source=DEMO_SRC, matrix=mine)
    (planned,) = spy.planned
    assert planned.mf.build.images["13.0"] == "registry.mine.example/builder:1"


@pytest.fixture
def torch_index() -> Iterator[tuple[str, list[str]]]:
    """An index the wheel names, which records every request it gets."""
    asked: list[str] = []

    class Recording(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recording)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/whl/cu130", asked
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_torch_index_the_wheel_names_needs_allow_foreign(
    tmp_path: Path, user: Path, spy: Spy, torch_index: tuple[str, list[str]]
) -> None:
    url, asked = torch_index

    def index(m: dict[str, Any]) -> None:
        m["build"]["torch_index"] = {"13.0": url}

    wheel = wheel_of(tmp_path / "w" / WHEEL, facts_of(user), in_document(index))
    with pytest.raises(ConfigError, match=r"torch index.*127\.0\.0\.1.*--allow-foreign torch-index"):
        verify(wheel, source=DEMO_SRC)
    assert spy.planned == [] and asked == []
    verify(wheel, source=DEMO_SRC, allow_foreign=frozenset({"torch-index"}))
    (planned,) = spy.planned
    assert planned.mf.build.torch_index_url("13.0") == url


# --- more of the document: only the factory's keys, values as strict as the loader's ---------------------


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda m: m.__setitem__("publish", {"to": "/tmp/x"}), "publish"),
        (lambda m: m.__setitem__("compat", {}), "compat"),
        (lambda m: m["build"].__setitem__("cache", "s3://evil/cache"), "build.cache"),
        (lambda m: m["build"].__setitem__("memory", "1TiB"), "build.memory"),
        (lambda m: m["package"].__setitem__("max_download", "1TiB"), "package.max_download"),
        (lambda m: m["recipe"].__setitem__("base", "flash-attn"), "recipe.base"),
        (lambda m: m["recipe"].__setitem__("patches", ["patches/../../x.patch"]), "patch"),
        (lambda m: m["recipe"].__setitem__("patches", ["patches/other.patch"]), "patch"),
        (lambda m: m["recipe"].__setitem__("extra_build_requires", ["x @ https://evil/x.whl"]), "direct URL"),
        (lambda m: m["package"].__setitem__("name", "a" * 10_000), "package.name"),
        (lambda m: m["package"]["source"].__setitem__("path", "../up"), "source"),
        (lambda m: m["package"]["source"].__setitem__("path", "/etc"), "source"),
        (lambda m: m["package"].__setitem__("source", {"path": "demo-ext", "ref": "x"}), "package.source"),
        (lambda m: m["matrix"].__setitem__("include", [{"cuda": "13.0", "shards": 4}]), "include"),
        (lambda m: m["matrix"]["arch"].append("9.0"), "matrix.arch"),
    ],
)
def test_anything_the_factory_does_not_write_is_refused(
    tmp_path: Path, user: Path, spy: Spy, change: Callable[[dict[str, Any]], None], says: str
) -> None:
    wheel = wheel_of(tmp_path / "w" / WHEEL, facts_of(user), in_document(change))
    with pytest.raises((ConfigError, CheckError)) as info:
        verify(wheel, source=DEMO_SRC)
    line = str(info.value)
    assert says in line and "\n" not in line and len(line) < 600, line
    assert spy.planned == []


def test_a_long_package_name_is_cut_in_the_one_line(tmp_path: Path, user: Path, spy: Spy) -> None:
    def long_name(doc: dict[str, Any]) -> None:
        doc["wheel"]["name"] = doc["rebuild"]["matrix"]["package"]["name"] = "a" * 10_000

    wheel = wheel_of(tmp_path / "w" / WHEEL, facts_of(user), long_name)
    with pytest.raises(ConfigError, match=r"package\.name") as info:
        verify(wheel, source=DEMO_SRC)
    line = str(info.value)
    assert "a" * 64 not in line and "…" in line and "10000 characters" in line and "\n" not in line, line
    assert spy.planned == []


def test_a_pypi_source_must_be_the_recorded_sdist(tmp_path: Path, user: Path, spy: Spy) -> None:
    facts = facts_of(user)
    facts = replace(facts, source=replace(facts.source, kind="pypi", sdist="x-0.1.0.tar.gz", sha256="b" * 64))

    def pypi(sha: str | None) -> Callable[[dict[str, Any]], None]:
        def change(m: dict[str, Any]) -> None:
            m["package"]["source"] = "pypi"
            if sha is None:
                m["package"].pop("sha256", None)
            else:
                m["package"]["sha256"] = sha

        return change

    for sha in (None, "d" * 64):
        wheel = wheel_of(tmp_path / str(sha) / WHEEL, facts, in_document(pypi(sha)))
        with pytest.raises(ConfigError, match="sdist"):
            verify(wheel)
    assert spy.planned == []
    wheel = wheel_of(tmp_path / "ok" / WHEEL, facts, in_document(pypi("b" * 64)))
    verify(wheel)
    assert spy.planned[0].mf.package.sha256 == "b" * 64


def test_a_git_source_must_be_the_recorded_commit_over_a_remote_transport(
    tmp_path: Path, user: Path, spy: Spy
) -> None:
    facts = facts_of(user)
    url = "https://git.example/demo.git"
    facts = replace(
        facts, source=replace(facts.source, kind="git", git_url=url, git_ref="v1", commit="c" * 40)
    )
    for source, says in [
        ({"git": url, "ref": "v1"}, "commit"),
        ({"git": url, "ref": "d" * 40}, "commit"),
        ({"git": "ext::sh -c touch% /tmp/pwned", "ref": "c" * 40}, "ext::"),
        ({"git": "/srv/private.git", "ref": "c" * 40}, "/srv/private.git"),
        ({"git": "fd::17", "ref": "c" * 40}, "fd::"),
    ]:

        def change(m: dict[str, Any], source: dict[str, str] = source) -> None:
            m["package"]["source"] = source

        wheel = wheel_of(tmp_path / says / WHEEL, facts, in_document(change))
        with pytest.raises(ConfigError, match=says):
            verify(wheel)
    assert spy.planned == []


def test_source_is_only_for_a_path_source(tmp_path: Path, user: Path, spy: Spy) -> None:
    facts = facts_of(user)
    facts = replace(facts, source=replace(facts.source, kind="pypi", sdist="x-0.1.0.tar.gz", sha256="b" * 64))

    def pypi(m: dict[str, Any]) -> None:
        m["package"]["source"] = "pypi"
        m["package"]["sha256"] = "b" * 64

    wheel = wheel_of(tmp_path / "w" / WHEEL, facts, in_document(pypi))
    with pytest.raises(ConfigError, match="--source"):
        verify(wheel, source=DEMO_SRC)
    assert spy.planned == []


def test_the_document_must_build_the_wheels_own_job(tmp_path: Path, user: Path, spy: Spy) -> None:
    def other_job(doc: dict[str, Any]) -> None:
        doc["rebuild"]["job"] = "cu130-torch2.14-abi1-sm90-py311"

    wheel = wheel_of(tmp_path / "w" / WHEEL, facts_of(user), other_job)
    with pytest.raises(ConfigError, match="job"):
        verify(wheel, source=DEMO_SRC)
    assert spy.planned == []


def test_the_cli_says_it_in_one_line_with_exit_2(
    tmp_path: Path, user: Path, spy: Spy, factory_cli: Any
) -> None:
    wheel = wheel_of(tmp_path / "w" / WHEEL, facts_of(user), in_document(_image))
    code, out = factory_cli(["rebuild", str(wheel), "--source", str(DEMO_SRC), "--matrix", str(user)])
    assert code == 2 and out.strip().count("\n") == 0 and "--allow-foreign image" in out, out
    code, out = factory_cli(  # the older spelling, `verify --rebuild`, is the same command
        [
            "verify",
            "--rebuild",
            str(wheel),
            "--source",
            str(DEMO_SRC),
            "--matrix",
            str(user),
            "--allow-foreign",
            "x",
        ]
    )
    assert code == 2 and "--allow-foreign" in out and "image" in out, out
    assert spy.planned == []


# --- both results: a rebuild whose check failed still compares the bytes it built ---------------------------


def kept_after_check(built: Path) -> Callable[..., Any]:
    """A build whose wheel (`built`'s bytes) failed its install check: kept under check-failed/."""
    from factory.build.pipeline import RunOutcome

    def run(planned: Any, **_hooks: Any) -> Any:
        out = planned.settings.output / "check-failed"
        out.mkdir(parents=True)
        shutil.copy(built, out / WHEEL)
        job = planned.jobs[0]
        result = JobResult(job_id=job.id, variant_id=job.variant.id, python=job.python)
        result.result, result.reason = "failed", "install check failed: no GPU"
        result.kept_wheel = str(out / WHEEL)
        return RunOutcome(report=report_of(result))

    return run


def test_a_rebuild_that_failed_its_check_still_compares_its_wheel(
    tmp_path: Path, user: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import factory.build.request

    wheel = wheel_of(tmp_path / "w" / WHEEL, facts_of(user))
    monkeypatch.setattr(factory.build.request, "run_planned", kept_after_check(wheel))
    result = verify(wheel, source=DEMO_SRC)
    assert not result.ok and result.failure == "install check failed: no GPU"
    assert result.difference is None and result.rebuilt_sha256 == result.sha256
    assert "install check failed: no GPU" in result.line() and "bit for bit" in result.line()
    assert result.to_json()["identical"] is True

    other = tmp_path / "other" / WHEEL
    other.parent.mkdir()
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(other, "w") as out:
        for info in src.infolist():
            data = src.read(info)
            out.writestr(info, b"changed = 1\n" if info.filename.endswith("__init__.py") else data)
    monkeypatch.setattr(factory.build.request, "run_planned", kept_after_check(other))
    result = verify(wheel, source=DEMO_SRC)
    assert result.failure == "install check failed: no GPU" and result.difference is not None
    assert result.difference.member == "factory_demo_ext/__init__.py"
    assert "no GPU" in result.line() and "factory_demo_ext/__init__.py" in result.line()
    assert result.to_json()["identical"] is False


def test_the_rebuild_shows_the_builds_progress(
    tmp_path: Path, user: Path, monkeypatch: pytest.MonkeyPatch, factory_cli: Any
) -> None:
    import factory.build.request
    from factory.build.pipeline import RunOutcome

    wheel = wheel_of(tmp_path / "w" / WHEEL, facts_of(user))

    def progress(planned: Any, *, on_change: Any, showing: Any, finished: Any, log: Any) -> Any:
        job = planned.jobs[0]
        result = JobResult(job_id=job.id, variant_id=job.variant.id, python=job.python)
        with showing():
            result.phase = "build"
            on_change(result)
            result.phase = result.result = "failed"
            result.reason = "a compile failed"
            on_change(result)
        report = report_of(result)
        finished(report)
        return RunOutcome(report=report)

    monkeypatch.setattr(factory.build.request, "run_planned", progress)
    code, out = factory_cli(["rebuild", str(wheel), "--source", str(DEMO_SRC)])
    assert code == 1, out
    assert f"{planned_id(user)}: build" in out  # the plain progress line `factory build` prints
    assert "summary:" in out and "report: (gone with the temporary work directory" in out, out
    assert out.startswith(f"{WHEEL}: the rebuild of {planned_id(user)} failed: a compile failed\n"), out
    # the older spelling runs the same (in another temporary directory)
    again, said = factory_cli(["verify", "--rebuild", str(wheel), "--source", str(DEMO_SRC)])
    assert (again, said.splitlines()[0]) == (code, out.splitlines()[0]) and "summary:" in said


def planned_id(matrix: Path) -> str:
    (job,) = plan_matrix(load_matrix_file(matrix)).jobs
    return job.id


def test_a_rebuild_without_a_wheel_is_a_failure_and_compares_nothing(
    tmp_path: Path, user: Path, spy: Spy
) -> None:
    wheel = wheel_of(tmp_path / "w" / WHEEL, facts_of(user))
    result = verify(wheel, source=DEMO_SRC)
    assert result.rebuilt is None and result.to_json()["identical"] is None
    assert result.line().endswith("failed: the spy builds nothing")


# --- factory inspect: the wheel is hostile ------------------------------------------------------------------


def test_inspect_refuses_a_hostile_rebuild_document_in_one_line(
    tmp_path: Path, user: Path, factory_cli: Any
) -> None:
    wheel = wheel_of(tmp_path / "w" / WHEEL, facts_of(user), in_document(_offline))
    code, out = factory_cli(["inspect", str(wheel)])
    assert code == 1 and out.strip().count("\n") == 0 and "build.offline" in out, out


def test_inspect_follows_no_redirect_a_server_hands_back(
    tmp_path: Path, user: Path, factory_cli: Any
) -> None:
    wheel = wheel_of(tmp_path / "w" / WHEEL, facts_of(user))
    data = wheel.read_bytes()
    asked: list[str] = []

    class Redirecting(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            if self.path.startswith("/moved/"):
                self.send_response(301)
                self.send_header("Location", f"/{WHEEL}")
                self.end_headers()
            elif self.path.endswith(".whl"):
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            elif self.path.endswith(".build.json"):
                self.send_response(302)
                self.send_header("Location", "/elsewhere/record.json")
                self.end_headers()
            else:
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        code, out = factory_cli(["inspect", f"{base}/{WHEEL}"])
        moved_code, moved = factory_cli(["inspect", f"{base}/moved/{WHEEL}"])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert code == 0, out
    assert "/elsewhere/record.json" not in asked, asked
    assert "build record not shown" in out and "redirect" in out, out
    assert moved_code == 1 and moved.strip().count("\n") == 0, moved
    assert "HTTP 301: a redirect to" in moved and "not followed" in moved, moved
    assert asked.count(f"/{WHEEL}") == 1  # the wheel's URL, asked for once: never by the redirect


def test_inspect_of_garbage_is_one_line(tmp_path: Path, factory_cli: Any) -> None:
    bad = tmp_path / WHEEL
    bad.write_bytes(b"PK\x03\x04" + b"\x00" * 100)
    code, out = factory_cli(["inspect", str(bad)])
    assert code == 1 and out.strip().count("\n") == 0, out
    fake = provenance.compose(facts_of(user_matrix(tmp_path / "u", patch=None)))
    fake["rebuild"]["matrix"]["recipe"] = "DEEP"
    deep = '{"a": ' * 100_000 + "{}" + "}" * 100_000
    deep_wheel = tmp_path / "deep" / WHEEL
    deep_wheel.parent.mkdir()
    with zipfile.ZipFile(deep_wheel, "w") as archive:
        archive.writestr(f"{DIST}/{provenance.FILE_NAME}", json.dumps(fake).replace('"DEEP"', deep))
    code, out = factory_cli(["inspect", str(deep_wheel)])
    assert code == 1 and out.strip().count("\n") == 0, out[-500:]
