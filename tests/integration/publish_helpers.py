"""Tiny real wheels for the publish/serve tests, and one real matrix build with its report (no tests here;
imported by the test modules beside it)."""

from __future__ import annotations

import base64
import hashlib
import html
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote

LABEL_NEW = "cu13.0.torch2.14.abi1.sm80.90"
LABEL_OLD = "cu12.8.torch2.10.abi1.sm80.90"
VID_NEW = "cu130-torch2.14-abi1-sm80.90"
VID_OLD = "cu128-torch2.10-abi1-sm80.90"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(
    directory: Path,
    *,
    name: str = "tinyvar",
    version: str = "0.1.0",
    label: str = LABEL_NEW,
    requires_python: str = ">=3.8",
    payload: str = "",
    tag: str = "py3-none-any",
) -> Path:
    """A pure-Python wheel whose module records its variant label: the installed file shows which won. An
    empty `label` makes a plain release (what PyPI could hold: an impostor, a stand-in torch)."""
    module = name.replace("-", "_")
    full = f"{version}+{label}" if label else version
    dist_info = f"{module}-{full}.dist-info"
    files = {
        f"{module}/__init__.py": f'LABEL = "{label}"\nPAYLOAD = "{payload}"\n'.encode(),
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {full}\nRequires-Python: {requires_python}\n"
            "Summary: test wheel\n\n"
        ).encode(),
        f"{dist_info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n".encode()
        ),
    }
    record = [_record_line(n, d) for n, d in files.items()] + [f"{dist_info}/RECORD,,"]
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{module}-{full}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, d in files.items():
            zf.writestr(zipfile.ZipInfo(n, date_time=(2024, 1, 1, 0, 0, 0)), d)
    return path


def make_sdist(directory: Path, *, name: str, version: str, marker: Path) -> Path:
    """An sdist whose build writes `marker` and fails: its in-tree backend needs nothing installed, so any
    attempt to build it (even for its metadata) leaves the marker behind."""
    base = f"{name}-{version}"
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
        "backend.py": f"import pathlib\npathlib.Path({str(marker)!r}).write_text('built')\n"
        "raise SystemExit('this sdist was built')\n",
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{base}.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for member, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{base}/{member}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def file_link(path: Path, href: str, attrs: str = "") -> str:
    """A PEP 503 anchor to `path` at `href`, with its sha256."""
    return f'<a href="{href}#sha256={sha256_file(path)}"{attrs}>{html.escape(path.name)}</a><br>\n'


def static_index(root: Path, projects: dict[str, list[Path]]) -> str:
    """A plain PEP 503 index in a directory (what PyPI or a mirror serves): each project's files under
    files/, linked from simple/<project>/ with their sha256; its simple/ URL."""
    (root / "files").mkdir(parents=True, exist_ok=True)
    for project, paths in projects.items():
        page = root / "simple" / project
        page.mkdir(parents=True, exist_ok=True)
        links = []
        for path in paths:
            shutil.copyfile(path, root / "files" / path.name)
            links.append(file_link(path, f"../../files/{quote(path.name)}"))
        (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{''.join(links)}</body></html>\n")
    anchors = "".join(f'<a href="{p}/">{p}</a>\n' for p in projects)
    (root / "simple" / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{anchors}</body></html>\n")
    return (root / "simple").resolve().as_uri() + "/"


def page_files(get: Callable[[str], bytes | None], variant_id: str, project: str) -> dict[str, set[str]]:
    """The filenames each stored form of a project page lists (JSON state, HTML), by key."""
    from factory.core import simpleapi
    from factory.publish import index

    out: dict[str, set[str]] = {}
    page = index.project_page(variant_id, project)
    json_page = get(page.state_key)
    if json_page is not None:
        out[page.state_key] = {r.filename for r in index.records_from_project_json(json_page)}
    html_page = get(page.html_key)
    if html_page is not None:
        out[page.html_key] = {a.text for a in simpleapi.parse_anchors(html_page.decode())}
    return out


def assert_consistent(get: Callable[[str], bytes | None], keys: Iterable[str]) -> None:
    """Every project page lists only files (and their .metadata) that exist, each link's hash right."""
    from factory.core import simpleapi
    from factory.publish import index

    keys = set(keys)
    for key in sorted(keys):
        parsed = index.parse_page_key(key)
        if parsed is not None and parsed[0].kind == "project" and key == parsed[0].html_key:
            variant_id = parsed[0].variant_id
            page = get(key)
            assert page is not None
            for a in simpleapi.parse_anchors(page.decode()):
                target = index.files_path(variant_id, a.text)
                assert target in keys, f"{key} lists {a.text}, which is not in the store"
                assert index.metadata_path(variant_id, a.text) in keys, (
                    f"{key} lists {a.text} without its .metadata"
                )
                data = get(target)
                assert data is not None
                assert a.href.endswith("#sha256=" + hashlib.sha256(data).hexdigest())


def publisher_script(
    helpers: Path, to: str, endpoint: str | None, workdir: Path, worker: int, rounds: int
) -> str:
    """Python source of one concurrent publisher: `rounds` publishes of new versions of the same project."""
    return (
        "import sys\n"
        f"sys.path.insert(0, {str(helpers)!r})\n"
        "from pathlib import Path\n"
        "from publish_helpers import make_wheel\n"
        "from factory.publish.publisher import publish_wheels\n"
        f"for r in range({rounds}):\n"
        f"    w = make_wheel(Path({str(workdir)!r}) / f'w{worker}-{{r}}', version=f'1.{worker}.{{r}}')\n"
        f"    publish_wheels([w], to={to!r}, endpoint_url={endpoint!r})\n"
    )


KILL_AFTER_METADATA = (
    "import os, signal, sys\n"
    "from pathlib import Path\n"
    "from factory.publish.publisher import publish_wheels\n"
    "def progress(event, key):\n"
    "    if event == 'metadata':\n"
    "        os.kill(os.getpid(), signal.SIGKILL)\n"
    "publish_wheels([Path(p) for p in sys.argv[3:]], to=sys.argv[1], endpoint_url=sys.argv[2] or None,\n"
    "               progress=progress)\n"
)


UV = str(Path(sys.executable).with_name("uv"))
# The machine's normal package index (a local mirror here): the --extra-index-url of a real install command.
NORMAL_INDEX = "file:///opt/pypi/simple" if Path("/opt/pypi/simple").is_dir() else None


def fresh_venv(path: Path, *, tool: str) -> Path:
    """A new virtual environment: pip's own (python -m venv) or uv's."""
    if tool == "pip":
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    else:
        subprocess.run([UV, "venv", "--no-config", "-q", "--python", sys.executable, str(path)], check=True)
    return path


def pip_install(venv: Path, index_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Real pip, isolated from this host's pip configuration so only the given indexes are used."""
    extra = ["--extra-index-url", NORMAL_INDEX] if NORMAL_INDEX else []
    cmd = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "--isolated",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "-v",
        "--index-url",
        index_url,
        *extra,
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def uv_install(venv: Path, index_url: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    """Real uv, isolated from this host's configuration; no index at all when `index_url` is None (only the
    --find-links given)."""
    extra = ["--extra-index-url", NORMAL_INDEX] if NORMAL_INDEX else []
    indexes = ["--no-index"] if index_url is None else ["--index-url", index_url, *extra]
    cmd = [
        UV,
        "pip",
        "install",
        "--no-config",
        "--no-cache",
        "-v",
        "--python",
        str(venv / "bin" / "python"),
        *indexes,
        *args,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_"))}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def installed_label(venv: Path) -> str:
    """The variant label of the tinyvar module that got installed."""
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import tinyvar; print(tinyvar.LABEL)"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def torch_wheelhouse(matrix: Path, output: Path, platform: str | None = None) -> Path:
    """The wheelhouse a build of `matrix`'s first job (of `platform`, when given) installs from: torch and
    its CUDA wheels (GBs, downloaded once into the wheelhouse cache that every session shares)."""
    from factory.build import runner as build
    from factory.plan.plan import plan_matrix
    from factory.spec.config import load_matrix_file

    mf = load_matrix_file(matrix, trust_paths=True)
    jobs = [j for j in plan_matrix(mf).jobs if platform is None or j.platform.name == platform]
    return build.Runner(None, mf, build.BuildSettings(output=output)).wheelhouse_for(jobs[0])


ROOT = Path(__file__).resolve().parents[2]
FACTORY = [sys.executable, "-m", "factory.cli"]


def plan_and_build(matrix: Path, *, index: Path) -> dict[str, Any]:
    """`factory matrix --json` and `factory build --publish --keep-going` of a matrix file, output beside it:
    the plan's and the build's processes, the output directory, the report and its jobs by id, the index."""
    plan = subprocess.run(
        [*FACTORY, "matrix", "--trust-paths", "-m", str(matrix), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    out = matrix.parent / "wheels"
    build = [
        *FACTORY,
        "build",
        "--trust-paths",
        "-m",
        str(matrix),
        "--output",
        str(out),
        "--publish",
        "--keep-going",
    ]
    proc = subprocess.run(build, capture_output=True, text=True, cwd=ROOT)
    assert (out / "report.json").is_file(), proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    jobs = {j["job_id"]: j for j in report["jobs"]}
    return {"plan": plan, "proc": proc, "out": out, "report": report, "jobs": jobs, "index": index}


# The human page's browser test and its screenshot (scripts/selector_screenshot.py): a small, realistic index
# of fake flash-attn wheels (no build), signed, with build records, a failed job (its record too) and a
# skipped one.
SELECTOR_ARCHS = "sm80.90.100.120"
SELECTOR_GRID: tuple[tuple[str, str, dict[str, str]], ...] = (
    # (CUDA label part, torch, {python: job result})
    ("12.8", "2.10", {"3.10": "ok", "3.11": "ok", "3.12": "ok", "3.13": "ok"}),
    ("13.0", "2.13", {"3.10": "ok", "3.11": "ok", "3.12": "ok", "3.13": "oom"}),
    ("13.0", "2.14", {"3.10": "ok", "3.11": "ok", "3.12": "ok", "3.13": "skipped"}),
)


def selector_index(tmp: Path) -> Path:
    """Publish SELECTOR_GRID to tmp/idx (wheels in tmp/wh, the report beside them); the index's path."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from factory.publish.publisher import publish_wheels
    from factory.trust.signing import make_signer

    jobs: list[dict[str, Any]] = []
    wheels = []
    for cuda, torch, results in SELECTOR_GRID:
        label = f"cu{cuda}.torch{torch}.abi1.{SELECTOR_ARCHS}"
        vid = f"cu{cuda.replace('.', '')}-torch{torch}-abi1-{SELECTOR_ARCHS}"
        for python, result in results.items():
            wheel = None
            if result == "ok":
                cp = "cp" + python.replace(".", "")
                path = make_wheel(
                    tmp / "wh",
                    name="flash-attn",
                    version="2.8.3.post2",
                    label=label,
                    tag=f"{cp}-{cp}-manylinux_2_28_x86_64",
                )
                wheels.append(path)
                wheel = path.name
            job_id = f"{vid}-py{python.replace('.', '')}"
            job = {"job_id": job_id, "variant_id": vid, "python": python, "result": result, "wheel": wheel}
            jobs.append({**job, "package": "flash-attn"})
    report = tmp / "wh" / "report.json"
    report.write_text(json.dumps({"jobs": jobs, "factory_version": "demo"}))
    signer = make_signer(Ed25519PrivateKey.generate(), source="demo")
    publish_wheels(wheels, to=str(tmp / "idx"), report=report, signer=signer)
    return tmp / "idx"


def chromium(*, width: int = 1280, height: int = 1000) -> Any:
    """Headless Chromium under Selenium (Debian's `chromium` and `chromium-driver`; scripts/host-tools.sh
    installs them); RuntimeError naming what is missing."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        raise RuntimeError(
            "chromium and chromedriver are not installed (apt-get install chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}"):  # fmt: skip
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(driver))


def relabelled(wheel: Path, label: str, directory: Path) -> Path:
    """A copy of `wheel` in `directory` as another variant's wheel: its local label replaced (file name,
    .dist-info, METADATA's Version, RECORD) by the factory's own rewrite (`wheelcheck.set_version`), all
    else as built: device code, torch pin and provenance still the first variant's. A planted wrong wheel."""
    from packaging.utils import parse_wheel_filename
    from packaging.version import Version

    from factory.wheel import checks

    version = parse_wheel_filename(wheel.name)[1]
    new_version = Version(f"{version.public}+{label}")
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / checks.relabelled_name(wheel.name, new_version)
    checks.set_version(wheel, target, new_version)
    return target
