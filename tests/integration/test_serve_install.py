"""Real pip and uv, each in a fresh venv, installing from a local index served by `factory serve`."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from packaging.utils import parse_wheel_filename
from publish_helpers import (
    LABEL_NEW,
    LABEL_OLD,
    VID_NEW,
    VID_OLD,
    fresh_venv,
    installed_label,
    make_wheel,
    pip_install,
    sha256_file,
    torch_wheelhouse,
    uv_install,
)

from factory.build.wheelhouse import wheel_files
from factory.core import simpleapi
from factory.publish import index
from factory.publish.publisher import publish_wheels

pytestmark = pytest.mark.integration
FACTORY = str(Path(sys.executable).with_name("factory"))
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Served:
    url: str  # http://127.0.0.1:PORT/
    root: Path
    log: Path
    wheels: dict[str, Path]

    def access_log(self) -> str:
        return self.log.read_text()


def start_server(root: Path, log: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [FACTORY, "serve", str(root), "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("serving "), line
    return proc, line.split(" at ", 1)[1].strip().removesuffix("simple/")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("serve")
    new = make_wheel(tmp / "wh", label=LABEL_NEW)
    old = make_wheel(tmp / "wh", label=LABEL_OLD)
    publish_wheels([new, old], to=str(tmp / "idx"))
    proc, url = start_server(tmp / "idx", tmp / "access.log")
    try:
        yield Served(url=url, root=tmp / "idx", log=tmp / "access.log", wheels={VID_NEW: new, VID_OLD: old})
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def get(url: str, accept: str | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@pytest.mark.parametrize("tool", ["pip", "uv"])
@pytest.mark.parametrize("vid", [VID_OLD, VID_NEW])
def test_install_from_served_variant_index(served: Served, tmp_path: Path, tool: str, vid: str) -> None:
    venv = fresh_venv(tmp_path / "venv", tool=tool)
    index_url = f"{served.url}simple/{vid}/"
    proc = (pip_install if tool == "pip" else uv_install)(venv, index_url, "tinyvar")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Both variants share version 0.1.0; only the chosen index decides which one arrives.
    assert installed_label(venv) == (LABEL_OLD if vid == VID_OLD else LABEL_NEW)
    wheel = served.wheels[vid]
    assert f"GET /files/{vid}/{wheel.name.replace('+', '%2B')}.metadata" in served.access_log()
    if tool == "pip":
        assert "Obtaining dependency information for tinyvar from" in proc.stdout
        assert ".whl.metadata" in proc.stdout


def test_pip_require_hashes(served: Served, tmp_path: Path) -> None:
    wheel = served.wheels[VID_OLD]
    venv = fresh_venv(tmp_path / "venv", tool="pip")
    req = tmp_path / "req.txt"
    req.write_text(f"tinyvar==0.1.0+{LABEL_OLD} --hash=sha256:{'0' * 64}\n")
    bad = pip_install(venv, f"{served.url}simple/{VID_OLD}/", "--require-hashes", "-r", str(req))
    assert bad.returncode != 0 and "DO NOT MATCH THE HASHES" in bad.stderr
    req.write_text(f"tinyvar==0.1.0+{LABEL_OLD} --hash=sha256:{sha256_file(wheel)}\n")
    good = pip_install(venv, f"{served.url}simple/{VID_OLD}/", "--require-hashes", "-r", str(req))
    assert good.returncode == 0, good.stdout + good.stderr
    assert installed_label(venv) == LABEL_OLD


def test_pip_rejects_a_file_that_does_not_match_the_index_hash(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "wh", label=LABEL_OLD)
    publish_wheels([wheel], to=str(tmp_path / "idx"))
    stored = tmp_path / "idx" / "files" / VID_OLD / wheel.name
    stored.write_bytes(make_wheel(tmp_path / "other", label=LABEL_OLD, payload="tampered").read_bytes())
    proc, url = start_server(tmp_path / "idx", tmp_path / "log")
    try:
        venv = fresh_venv(tmp_path / "venv", tool="pip")
        result = pip_install(venv, f"{url}simple/{VID_OLD}/", "tinyvar")
        assert result.returncode != 0
        assert "DO NOT MATCH THE HASHES" in result.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_content_negotiation_and_headers(served: Served) -> None:
    page = f"{served.url}simple/{VID_NEW}/tinyvar/"
    status, headers, body = get(page)
    assert status == 200 and headers["Content-Type"] == index.HTML_TYPE and b"Links for tinyvar" in body
    status, headers, body = get(page, "application/vnd.pypi.simple.v1+json")
    assert headers["Content-Type"] == simpleapi.PYPI_JSON_TYPE
    assert json.loads(body)["meta"]["api-version"] == "1.1"
    assert "max-age=60" in headers["Cache-Control"] and headers["Vary"] == "Accept"
    status, headers, _ = get(page, "application/vnd.pypi.simple.v1+html")
    assert headers["Content-Type"] == simpleapi.PYPI_HTML_TYPE
    status, headers, body = get(f"{served.url}simple/{VID_NEW}/", "application/vnd.pypi.simple.v1+json")
    assert json.loads(body)["projects"] == [{"name": "tinyvar"}]
    wheel = served.wheels[VID_NEW].name
    status, headers, body = get(f"{served.url}files/{VID_NEW}/{wheel.replace('+', '%2B')}")
    assert status == 200 and "immutable" in headers["Cache-Control"]
    assert headers["Content-Type"] == "application/octet-stream"
    assert body == served.wheels[VID_NEW].read_bytes()
    # directory URLs without the slash redirect; hidden files and unknown paths are not served
    req = urllib.request.Request(f"{served.url}simple/{VID_NEW}/tinyvar", method="HEAD")
    opener = urllib.request.build_opener(NoRedirect)
    with pytest.raises(urllib.error.HTTPError) as info:
        opener.open(req, timeout=30)
    assert info.value.code == 301 and info.value.headers["Location"].endswith("/tinyvar/")
    assert get(f"{served.url}.lock")[0] == 400
    assert get(f"{served.url}simple/{VID_NEW}/nothing/")[0] == 404
    status, headers, body = get(served.url)
    assert status == 200 and b"Wheel index" in body


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def test_basic_auth(tmp_path: Path, served: Served) -> None:
    proc, url = start_server(served.root, tmp_path / "log", "--basic-auth", "alice:s3cret")
    try:
        assert get(f"{url}simple/")[0] == 401
        venv = fresh_venv(tmp_path / "venv", tool="pip")
        # -v twice: pip logs why it could not fetch a page only at debug level
        denied = pip_install(venv, f"{url}simple/{VID_OLD}/", "--no-input", "-v", "tinyvar")
        assert denied.returncode != 0
        page = f"{url}simple/{VID_OLD}/tinyvar/"
        assert f"401 Client Error: Unauthorized for url: {page}" in denied.stdout, denied.stdout[-3000:]
        assert "No matching distribution found for tinyvar" in denied.stderr
        authed = url.replace("http://", "http://alice:s3cret@")
        ok = pip_install(venv, f"{authed}simple/{VID_OLD}/", "tinyvar")
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert installed_label(venv) == LABEL_OLD
        time.sleep(0.2)  # let the server flush its last log line before reading it
        assert "s3cret" not in (tmp_path / "log").read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_bad_directory_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([FACTORY, "serve", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not a published index" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def torch_wheel_version(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The demo build's wheelhouse and the version of the torch wheel in it."""
    house = torch_wheelhouse(ROOT / "examples" / "demo.yaml", tmp_path_factory.mktemp("torch-wheelhouse"))
    versions = [parse_wheel_filename(w.name)[1] for w in wheel_files(house) if w.name.startswith("torch-")]
    assert len(versions) == 1, versions
    return house, str(versions[0])


@pytest.fixture(scope="module")
def torch_python(
    tmp_path_factory: pytest.TempPathFactory, torch_wheel_version: tuple[Path, str]
) -> Iterator[Path]:
    """A venv with the real torch of the demo build (2.14.1 for CUDA 13.0), as a consumer has; removed after
    the module (GBs)."""
    house, version = torch_wheel_version
    venv = fresh_venv(tmp_path_factory.mktemp("torch-venv") / "venv", tool="uv")
    try:
        proc = uv_install(venv, None, "--find-links", str(house), f"torch=={version}")
        assert proc.returncode == 0, proc.stderr[-2000:]
        yield venv / "bin" / "python"
    finally:
        shutil.rmtree(venv, ignore_errors=True)


def run_which(index: str, python: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`factory which` with this host's GPUs hidden (from torch and from nvidia-smi, which the empty PATH
    leaves out): the chosen variant depends on the interpreter's torch alone, on any test host."""
    (tmp_path / "no-tools").mkdir(exist_ok=True)
    env = {**os.environ, "PATH": str(tmp_path / "no-tools"), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [FACTORY, "which", "--index-url", index, "--python", str(python)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


PYTHON = "{}.{}".format(*sys.version_info[:2])


def test_which_prints_the_matching_install_commands(
    served: Served, tmp_path: Path, torch_python: Path, torch_wheel_version: tuple[Path, str]
) -> None:
    proc = run_which(served.url, torch_python, tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    torch = torch_wheel_version[1].split("+")[0]
    assert lines[0] == f"python {PYTHON}, torch {torch}, CUDA 13.0, cxx11 ABI 1, GPUs none (from none)"
    assert f"variant: {VID_NEW}" in lines
    # the wheel by URL and hash, torch pinned to the release installed (factory.publish.installcmd; installed
    # by these commands in tests/integration/test_safe_commands.py)
    wheel = served.wheels[VID_NEW]
    pinned = f"tinyvar @ {served.url}files/{VID_NEW}/{quote(wheel.name)}#sha256={sha256_file(wheel)}"
    pip = "pip install --only-binary tinyvar --index-url https://pypi.org/simple"
    assert shlex.join([*shlex.split(pip), f"torch=={torch}", pinned]) in lines
    uv = "uv pip install --only-binary tinyvar --index-strategy first-index --default-index"
    assert shlex.join([*shlex.split(uv), "https://pypi.org/simple", f"torch=={torch}", pinned]) in lines


def test_which_says_none_matches_and_names_the_nearest(
    served: Served, tmp_path: Path, torch_python: Path, torch_wheel_version: tuple[Path, str]
) -> None:
    publish_wheels([served.wheels[VID_OLD]], to=str(tmp_path / "idx"))  # only the torch 2.10 variant
    proc = run_which(str(tmp_path / "idx"), torch_python, tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    torch = torch_wheel_version[1].split("+")[0]
    assert proc.stderr.strip() == (
        f"error: no variant index matches this host; nearest: {VID_OLD} (built for torch 2.10, this host has "
        f"torch {torch}; built for CUDA 12.8, torch here uses CUDA 13.0)"
    )


def test_which_without_torch_and_a_driver_too_old(served: Served, tmp_path: Path) -> None:
    # the driver from a stand-in nvidia-smi (first of the driver's sources), so that the host's own, if any,
    # does not decide: CUDA 11.8 runs none of the published CUDA 12.8 and 13.0 variants
    (tmp_path / "no-tools").mkdir()
    smi = tmp_path / "no-tools" / "nvidia-smi"
    smi.write_text(
        '#!/bin/sh\ncase "$1" in --query-gpu=*) echo 9.0 ;; *) echo "| CUDA Version: 11.8 |" ;; esac\n'
    )
    smi.chmod(0o755)
    venv = fresh_venv(tmp_path / "venv", tool="uv")
    proc = run_which(served.url, venv / "bin" / "python", tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.startswith(
        f"python {PYTHON}, torch not installed, CUDA none, cxx11 ABI unknown, GPUs 9.0 (from nvidia-smi), "
        "driver CUDA 11.8 (from nvidia-smi)"
    )
    assert proc.stderr.startswith("error: no variant index matches this host; nearest: ")
    assert proc.stderr.strip().endswith(" at most (a newer driver would))")
    # what a build for this host would be: the newest torch with a CUDA 11 build (compat.json)
    assert ", CUDA 11.8, torch 2." in proc.stdout.splitlines()[1]


STUB_TORCH_12_10 = """
__version__ = "2.10.0+cu1210"
class version:
    cuda = "12.10"
class _C:
    _GLIBCXX_USE_CXX11_ABI = True
class cuda:
    @staticmethod
    def is_available():
        return True
    @staticmethod
    def device_count():
        return 1
    @staticmethod
    def get_device_capability(i):
        return (10, 3)
"""


def python_with_stub_torch(tmp_path: Path, source: str) -> Path:
    """An interpreter that imports a stand-in torch module (the probe reads only these attributes): for a
    host no real torch wheel makes, as a CUDA 12.10 one."""
    (tmp_path / "stub" / "torch").mkdir(parents=True)
    (tmp_path / "stub" / "torch" / "__init__.py").write_text(source)
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path / "stub"} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def test_a_cuda_12_10_host_is_offered_the_12_10_index_and_installs_from_it(tmp_path: Path) -> None:
    # Two-digit minors everywhere: CUDA 12.10 (not 121.0, not the 12.9 index), torch 2.10, sm_100/sm_103.
    label = "cu12.10.torch2.10.abi1.sm80.100.103"
    wheels = [make_wheel(tmp_path / "wh", label=label), make_wheel(tmp_path / "wh", label=LABEL_OLD)]
    publish_wheels(wheels, to=str(tmp_path / "idx"))
    vid = "cu12.10-torch2.10-abi1-sm80.100.103"
    assert (tmp_path / "idx" / "simple" / vid / "tinyvar" / "index.html").is_file()
    python = python_with_stub_torch(tmp_path, STUB_TORCH_12_10)
    proc = subprocess.run(
        [FACTORY, "which", "--index-url", str(tmp_path / "idx"), "--python", str(python)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "python 3.11, torch 2.10.0, CUDA 12.10, cxx11 ABI 1, GPUs 10.3 (from torch)"
    assert f"variant: {vid}" in lines and not any(line.startswith("note:") for line in lines)
    (pip_line,) = [line for line in lines if line.startswith("pip install ")]
    requirement = shlex.split(pip_line)[-1]
    files = (tmp_path / "idx" / "files" / vid).resolve().as_uri()
    assert requirement.startswith(f"tinyvar @ {files}/tinyvar-0.1.0%2B{label}-py3-none-any.whl#sha256=")
    venv = fresh_venv(tmp_path / "venv", tool="pip")
    index_url = (tmp_path / "idx" / "simple" / vid).resolve().as_uri() + "/"
    proc = pip_install(venv, index_url, requirement)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert installed_label(venv) == label


def host_platforms(arch: str, glibc_minor: int = 34) -> list[str]:
    """pip's --platform options for a glibc 2.`glibc_minor` host of `arch`: pip takes a given platform as it
    is (manylinux_2_34 alone would refuse a manylinux_2_28 wheel such a host runs), so every manylinux tag
    the host runs is given, newest first, as `packaging.tags` lists them on that host."""
    return [f"--platform=manylinux_2_{minor}_{arch}" for minor in range(glibc_minor, 16, -1)]


def pip_picks(venv: Path, index_url: str, arch: str, target: Path) -> tuple[Path, dict[str, object]]:
    """What real pip takes for a glibc 2.34 host of `arch` (this CPython) from a variant index: the file
    `pip download` fetches, and what `pip install --dry-run --report` would install (pip takes platform
    options only with a --target, which a dry run leaves untouched)."""
    cp = "cp" + PYTHON.replace(".", "")
    picks = [*host_platforms(arch), "--only-binary", ":all:", "--implementation", "cp", "--abi", cp]
    picks += ["--python-version", PYTHON, "--index-url", index_url, "--no-deps"]
    pip = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "--isolated",
        "--no-cache-dir",
        "--disable-pip-version-check",
    ]
    got = subprocess.run(
        [*pip, "download", *picks, "-d", str(target), "tinyvar"], capture_output=True, text=True, timeout=300
    )
    assert got.returncode == 0, got.stdout + got.stderr
    (downloaded,) = target.iterdir()
    report = target.parent / f"{target.name}.json"
    dry = subprocess.run(
        [
            *pip,
            "install",
            "--dry-run",
            "--target",
            str(target / "t"),
            "--report",
            str(report),
            *picks,
            "tinyvar",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert dry.returncode == 0, dry.stdout + dry.stderr
    (install,) = json.loads(report.read_text())["install"]
    return downloaded, install


def test_an_aarch64_wheel_published_beside_its_x86_64_sibling_is_what_pip_takes_on_aarch64(
    tmp_path: Path,
) -> None:
    """Both platforms' wheels of one variant and Python on the same variant page, the second published after
    the first: nothing of the first is lost, both are listed, and real pip for either platform takes its
    own from the served index by the platform tag alone."""
    cp = "cp" + PYTHON.replace(".", "")
    wheels = {
        arch: make_wheel(tmp_path / f"wh-{arch}", label=LABEL_NEW, tag=f"{cp}-{cp}-manylinux_2_28_{arch}")
        for arch in ("x86_64", "aarch64")
    }
    reports = {}
    for arch, wheel in wheels.items():
        job = {"job_id": "j", "variant_id": VID_NEW, "python": PYTHON, "result": "ok", "wheel": wheel.name}
        reports[arch] = wheel.parent / "report.json"
        reports[arch].write_text(json.dumps({"jobs": [{**job, "platform": arch, "package": "tinyvar"}]}))
    idx = tmp_path / "idx"
    publish_wheels([wheels["x86_64"]], to=str(idx), report=reports["x86_64"])
    first = {p.relative_to(idx): p.read_bytes() for p in (idx / "files").rglob("*") if p.is_file()}
    publish_wheels([wheels["aarch64"]], to=str(idx), report=reports["aarch64"])
    for path, data in first.items():  # the x86_64 wheel and everything beside it, as published
        assert (idx / path).read_bytes() == data, path
    page = json.loads((idx / "simple" / VID_NEW / "tinyvar" / "index.json").read_text())
    assert {f["filename"]: f["hashes"]["sha256"] for f in page["files"]} == {
        w.name: sha256_file(w) for w in wheels.values()
    }
    # the grid: a built cell for each platform, the human page a row for each
    cells = index.cells_from_json((idx / "matrix.json").read_bytes())
    assert sorted((c.platform, c.status, c.detail) for c in cells) == [
        ("aarch64", "built", wheels["aarch64"].name),
        ("x86_64", "built", wheels["x86_64"].name),
    ]
    human = (idx / "index.html").read_text()
    assert f"<td>{VID_NEW}</td><td>x86_64</td>" in human and f"<td>{VID_NEW}</td><td>aarch64</td>" in human
    proc, url = start_server(idx, tmp_path / "access.log")
    try:
        venv = fresh_venv(tmp_path / "venv", tool="pip")
        for arch in ("aarch64", "x86_64"):
            downloaded, install = pip_picks(venv, f"{url}simple/{VID_NEW}/", arch, tmp_path / arch)
            assert downloaded.name == wheels[arch].name and sha256_file(downloaded) == sha256_file(
                wheels[arch]
            )
            download_info = install["download_info"]
            assert isinstance(download_info, dict)
            assert download_info["url"].endswith(quote(wheels[arch].name)), download_info
            assert download_info["archive_info"]["hashes"]["sha256"] == sha256_file(wheels[arch])
        # a platform no wheel is for: pip finds none, and builds nothing
        got = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "--isolated", "download", "--only-binary", ":all:",
             *host_platforms("ppc64le"), "--python-version", PYTHON, "--no-deps",
             "--index-url", f"{url}simple/{VID_NEW}/", "-d", str(tmp_path / "none"), "tinyvar"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert got.returncode != 0 and "No matching distribution found for tinyvar" in got.stderr, got.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=30)
