"""`factory which` in a fresh venv without torch (the driver told by a stand-in `nvidia-smi` on PATH: there
may be no GPU here), and its build requests taken by a real `factory serve --accept-requests` over HTTP, then
added to a plan by `factory matrix --requests`."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from packaging.utils import parse_wheel_filename
from publish_helpers import LABEL_NEW, LABEL_OLD, VID_NEW, fresh_venv, make_wheel, torch_wheelhouse

from factory.build.wheelhouse import wheel_files
from factory.plan.variantrequest import FORMAT, make_request, parse, store_request
from factory.publish.publisher import publish_wheels

pytestmark = pytest.mark.integration
FACTORY = str(Path(sys.executable).with_name("factory"))
ROOT = Path(__file__).resolve().parents[2]
PYTHON = "{}.{}".format(*sys.version_info[:2])

FAKE_SMI = """#!/bin/sh
case "$1" in
  --query-gpu=compute_cap) printf '%s\\n' {caps} ;;
  *) printf '| NVIDIA-SMI {driver}   Driver Version: {driver}   CUDA Version: {cuda}     |\\n' ;;
esac
"""


@dataclass
class Served:
    url: str  # http://127.0.0.1:PORT/
    root: Path
    port: int
    proc: subprocess.Popen[str]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("requests")
    wheels = [make_wheel(tmp / "wh", label=LABEL_NEW), make_wheel(tmp / "wh", label=LABEL_OLD)]
    publish_wheels(wheels, to=str(tmp / "idx"))
    proc = subprocess.Popen(
        [FACTORY, "serve", str(tmp / "idx"), "--port", "0", "--accept-requests"],
        stdout=subprocess.PIPE,
        stderr=(tmp / "access.log").open("w"),
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("serving "), line
    url = line.split(" at ", 1)[1].strip().removesuffix("simple/")
    try:
        yield Served(url=url, root=tmp / "idx", port=int(url.rsplit(":", 1)[1].strip("/")), proc=proc)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv without torch."""
    return fresh_venv(tmp_path_factory.mktemp("bare") / "venv", tool="uv") / "bin" / "python"


def which(
    index: str, python: Path, tmp_path: Path, *args: str, cuda: str, caps: str
) -> subprocess.CompletedProcess[str]:
    """`factory which` with a stand-in nvidia-smi alone on PATH (driver CUDA `cuda`, GPUs `caps`)."""
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    smi = tools / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(caps=caps, driver="580.65.06", cuda=cuda))
    smi.chmod(0o755)
    env = {**os.environ, "PATH": str(tools), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [FACTORY, "which", "--index-url", index, "--python", str(python), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def post(
    served: Served, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def get(served: Served, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def stored(served: Served) -> list[str]:
    directory = served.root / "_requests"
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


def test_without_torch_one_command_installs_torch_and_the_extension(
    served: Served, bare_python: Path, tmp_path: Path
) -> None:
    proc = which(served.url, bare_python, tmp_path, cuda="13.0", caps="9.0")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == (
        f"python {PYTHON}, torch not installed, CUDA none, cxx11 ABI unknown, GPUs 9.0 (from nvidia-smi), "
        "driver CUDA 13.0 (from nvidia-smi)"
    )
    assert lines[1] == f"variant: {VID_NEW}"  # the newest torch the driver runs, covering the GPU
    (command,) = [line for line in lines if line.startswith("pip ")]
    # torch 2.14's default build is the CUDA 13.0 one: from the default index; the variant's wheel by URL
    # and hash (factory.publish.installcmd)
    (wheel,) = (served.root / "files" / VID_NEW).glob("*.whl")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert shlex.split(command) == [
        "pip",
        "install",
        "--only-binary",
        "tinyvar",
        "--index-url",
        "https://pypi.org/simple",
        "torch==2.14.*",
        f"tinyvar @ {served.url}files/{VID_NEW}/{quote(wheel.name)}#sha256={sha}",
    ]
    # Real pip resolves that command to the torch 2.14 build and the variant's wheel: PyPI stands in as the
    # demo build's wheelhouse of real torch (no network), nothing else of the command changes.
    house = torch_wheelhouse(ROOT / "examples" / "demo.yaml", tmp_path / "house")
    (torch_wheel,) = [w for w in wheel_files(house) if w.name.startswith("torch-")]
    args = shlex.split(command)[2:]
    args[args.index("https://pypi.org/simple")] = house.resolve().as_uri()
    report = tmp_path / "report.json"
    venv = fresh_venv(tmp_path / "pip-venv", tool="pip")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--isolated", "--disable-pip-version-check"]
    dry = [*pip, *args, "--find-links", str(house), "--no-deps", "--dry-run", "--report", str(report)]
    done = subprocess.run(dry, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    chosen = {
        i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report.read_text())["install"]
    }
    assert chosen == {
        "torch": str(parse_wheel_filename(torch_wheel.name)[1]),
        "tinyvar": f"0.1.0+{LABEL_NEW}",
    }
    # a 12.8 driver runs no CUDA 13 build: the torch 2.10 variant, its torch again the default build
    proc = which(served.url, bare_python, tmp_path, cuda="12.8", caps="9.0")
    assert proc.returncode == 0, proc.stderr
    assert "variant: cu128-torch2.10-abi1-sm80.90" in proc.stdout.splitlines()
    assert "'torch==2.10.*' 'tinyvar @ " in proc.stdout


def test_a_host_no_variant_fits_gets_matrix_lines_and_its_request_is_stored(
    served: Served, bare_python: Path, tmp_path: Path
) -> None:
    # sm_75: no published variant has code for it
    proc = which(served.url, bare_python, tmp_path, "tinyvar", cuda="13.0", caps="7.5")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1] == f"missing: tinyvar for Python {PYTHON}, CUDA 13.0, torch 2.14, cxx11 ABI 1, GPUs 7.5"
    assert lines[-1] == (
        f'    - {{cuda: "13.0", torch: "2.14", python: "{PYTHON}", cxx11_abi: true, arch: "7.5"}}'
    )
    assert "no code for this GPU (compute capability 7.5)" in proc.stderr
    assert stored(served) == []

    proc = which(served.url, bare_python, tmp_path, "tinyvar", "--request", cuda="13.0", caps="7.5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (name,) = stored(served)
    request = parse((served.root / "_requests" / name).read_bytes())
    assert name == request.file_name
    assert (request.package, request.python, request.cuda, request.torch, request.archs) == (
        "tinyvar",
        PYTHON,
        "13.0",
        "2.14",
        ("7.5",),
    )
    assert proc.stdout.splitlines()[-1] == f"request {request.id[:12]} recorded at {served.url}_requests/"
    # the same request again: the same file
    proc = which(served.url, bare_python, tmp_path, "tinyvar", "--request", cuda="13.0", caps="7.5")
    assert proc.returncode == 0 and "was recorded already" in proc.stdout
    assert stored(served) == [name]
    # never served
    assert get(served, "/_requests/") == 404 and get(served, f"/_requests/{name}") == 404


def test_hostile_requests_are_refused_and_a_flood_is_429(served: Served) -> None:
    before = stored(served)
    good = json.dumps({"format": FORMAT, "python": "3.12", "cuda": "13.0", "torch": "2.14", "archs": ["9.0"]})
    status, _, said = post(served, "/_requests/", b"x" * 5000)
    assert status == 413
    status, _, said = post(served, "/_requests/", b"{not json")
    assert status == 400 and said.startswith(b"bad request: not JSON")
    status, _, said = post(served, "/_requests/", good.replace("3.12", "../../../etc/passwd").encode())
    assert status == 400 and b"python" in said
    status, _, _ = post(served, "/_requests/", good.encode(), {"Content-Type": "text/plain"})
    assert status == 415
    for path in ("/_requests/../simple/", "/_requests/x.json", "/simple/", "/_requests/%2e%2e/x"):
        status, _, _ = post(served, path, good.encode())
        assert status == 404, path
    assert stored(served) == before
    assert not any((served.root / "simple").glob("**/*.json.tmp*"))
    statuses = []
    for python in range(10, 40):  # each a new, valid request
        status, headers, _ = post(served, "/_requests/", good.replace("3.12", f"3.{python}").encode())
        statuses.append(status)
        if status == 429:
            assert int(headers["Retry-After"]) >= 1
            break
    assert statuses[-1] == 429 and set(statuses[:-1]) <= {201}
    # what was taken is whole: every file parses and is named by its hash; no temporary is left
    for name in stored(served):
        assert parse((served.root / "_requests" / name).read_bytes()).file_name == name
    assert served.proc.poll() is None


def test_matrix_requests_adds_the_allowed_combos(served: Served, tmp_path: Path) -> None:
    # the request the which test above sends (the same file when that test ran), and one written by hand
    request = make_request(package="tinyvar", python=PYTHON, cuda="13.0", torch="2.14", archs=["7.5"])
    store_request(served.root, request)
    (served.root / "_requests" / "hand-written.json").write_text('{"format": "factory-request/1"}')
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(
        "package: {name: tinyvar, version: '0.1.0'}\n"
        "recipe: torch-ext\n"
        "matrix:\n"
        "  cuda: ['13.0']\n"
        "  torch: ['2.14']\n"
        f"  python: ['{PYTHON}']\n"
        "  cxx11_abi: [true]\n"
        "  arch: ['8.0;9.0']\n"
        "build:\n"
        "  torch_index: {'13.0': default}\n"
    )
    proc = subprocess.run(
        [FACTORY, "matrix", "-m", str(matrix), "--json", "--requests", str(served.root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    ids = [job["job_id"] for job in out["jobs"]]
    tag = PYTHON.replace(".", "")
    assert ids[0] == f"cu130-torch2.14-abi1-sm80.90-py{tag}"
    # its GPU (7.5) is covered by no arch set of the matrix: it is built for its own
    assert f"cu130-torch2.14-abi1-sm75-py{tag}" in ids
    requested = [job for job in out["jobs"] if any(n.startswith("requested (") for n in job.get("notes", []))]
    assert requested and all(job["known"] for job in requested)
    reasons = [d["reason"] for d in out["dropped"]]
    assert any(r.startswith("request hand-written: refused: not a request file name") for r in reasons)
