"""Runs one job's phases inside a build container: `python3 -m factory.container.driver build|check|clean`.

Stdlib only: it runs with the image's system Python before any venv exists. The host reads progress from
its marked lines on stdout (`protocol.mark_line`); everything else is the build log. When the host sets a
heartbeat (`heartbeat`), a factory that died without stopping this container is noticed here: the build's
processes are killed and the driver exits with `heartbeat.EXIT_ORPHANED`, which ends the container.

Layout inside the shared work volume (so uv can hardlink from its cache into the venvs):
  $FACTORY_JOB_DIR/venv     build environment (torch, build backend), kept across attempts
  $FACTORY_JOB_DIR/src      writable copy of /src; its build/ directory is what later attempts resume from
  $FACTORY_JOB_DIR/dist     the built wheel before it is handed to /out
  $FACTORY_JOB_DIR/cuda-gaps links to the venv's CUDA headers and libraries the toolkit lacks (`cudagaps`)
  $FACTORY_JOB_DIR/.owner   the factory process the job belongs to (`protocol.OWNER_FILE`): `factory clean`

`jobs ROOT` lists the job directories under ROOT for `factory clean`, `remove-jobs ROOT NAME...` removes those
it chose (the host alone can tell whether their factory still runs).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from . import cudagaps, heartbeat, nvcccall, preflightcompiles, protocol

WHEELHOUSE = Path(protocol.WHEELHOUSE_MOUNT)
CHECK_WHEELHOUSE = Path(protocol.CHECK_WHEELHOUSE_MOUNT)
SOURCE = Path(protocol.SOURCE_MOUNT)
OUT = Path(protocol.OUTPUT_MOUNT)
OBJECT_SUFFIXES = (".o", ".obj")
CXX_LAUNCHER = Path(__file__).resolve().parent / "c++"
NVCC_LAUNCHER = CXX_LAUNCHER.parent / "nvcc"


def mark(**fields: object) -> None:
    print(protocol.mark_line(**fields), flush=True)


CHILDREN = heartbeat.Children()


def run(cmd: list[str], **kwargs: object) -> None:
    print("+ " + " ".join(cmd), flush=True)
    CHILDREN.run(cmd, **kwargs)


def environment() -> protocol.DriverEnv:
    """What the host set for this phase (`factory.build.jobspec`)."""
    return protocol.DriverEnv.from_env(os.environ)


def required(value: str | None, name: str) -> str:
    if not value:
        sys.exit(f"factory: {name} is not set")
    return value


def job_dir() -> Path:
    return Path(required(environment().job_dir, protocol.ENV_JOB_DIR))


def claim(jd: Path) -> None:
    """Record the factory process this job belongs to in its directory, the first thing there: a directory
    without one is old enough to tell only by its age."""
    jd.mkdir(parents=True, exist_ok=True)
    owner = environment().owner
    if owner:
        (jd / protocol.OWNER_FILE).write_text(owner)


def uv_install(python: Path, args: list[str], *, wheelhouses: tuple[Path, ...] = (WHEELHOUSE,)) -> None:
    links = [arg for w in wheelhouses for arg in ("--find-links", str(w))]
    run(["uv", "pip", "install", "--python", str(python), "--offline", "--no-index", *links, *args])


def make_venv(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    # No --seed: seeding would fetch pip from the network; pip comes from the wheelhouse when needed.
    run(["uv", "venv", "--python", required(environment().python, protocol.ENV_PYTHON), str(path)])
    return path / "bin" / "python"


def count_objects(root: Path) -> int:
    build = root / "build"
    if not build.is_dir():
        return 0
    return sum(1 for p in build.rglob("*") if p.suffix in OBJECT_SUFFIXES and p.is_file())


def check_torch_cuda(python: Path) -> None:
    """A toolkit that does not match torch's CUDA is a classic silent failure: stop before compiling."""
    out = (
        subprocess.run(
            [
                str(python),
                "-c",
                "import json, torch; print(json.dumps([torch.__version__, torch.version.cuda]))",
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    torch_version, torch_cuda = json.loads(out)
    mark(torch=torch_version, torch_cuda=torch_cuda)
    want = environment().cuda or ""
    if torch_cuda is None:
        sys.exit(f"factory: torch {torch_version} is a CPU build; CUDA {want} was expected")
    if want and torch_cuda.split(".")[:2] != want.split(".")[:2]:
        sys.exit(
            f"factory: torch {torch_version} was built for CUDA {torch_cuda}, "
            f"but this job's toolkit is CUDA {want}"
        )


NVCC_RELEASE = re.compile(r"\bV(\d+(?:\.\d+)+)")
TOOL_TEXT_MAX = 120


def nvcc_release(version_text: str) -> str | None:
    """nvcc's full release ("13.0.88") from `nvcc --version`'s `Cuda compilation tools, release 13.0,
    V13.0.88`."""
    found = NVCC_RELEASE.search(version_text)
    return found.group(1) if found else None


def tool_version(cmd: list[str]) -> str:
    """What a tool prints for its version ("" when it cannot be run): what built the objects, for the host's
    records of each measured compile."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out


def mark_toolchain(env: dict[str, str]) -> None:
    """Which nvcc and host compiler this build's compiles ran with: `{"toolchain": {"nvcc": "13.0.88",
    "cxx": "g++ (Debian 14.2.0-19) 14.2.0"}}` (the nvcc the wrapper runs, the c++ the build would)."""
    nvcc = env.get(protocol.ENV_REAL_NVCC) or os.path.join(
        env.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"
    )
    cxx = env.get("CXX") or "c++"
    lines = tool_version([cxx, "--version"]).splitlines()
    mark(
        toolchain={
            "nvcc": nvcc_release(tool_version([nvcc, "--version"])) or "",
            "cxx": (lines[0].strip() if lines else "")[:TOOL_TEXT_MAX],
        }
    )


def cache_env(env: dict[str, str]) -> dict[str, str]:
    """CXX is the `c++` launcher, which runs the CXX the build had (FACTORY_REAL_CXX): with the compile cache
    on, the host compiler's compiles go through it; cache or not, it records each shared link (`links`), from
    which the host tells the modules that carry no kernels, and in a preflight it stands in for the links."""
    if env.get("CXX") == str(CXX_LAUNCHER):
        return {}
    extra = {"CXX": str(CXX_LAUNCHER)}
    if env.get("CXX"):
        extra[protocol.ENV_REAL_CXX] = env["CXX"]
    return extra


def limited_api_args(tag: str) -> list[str]:
    """pip's arguments that make setuptools' bdist_wheel tag the wheel `<tag>-abi3` (over the tag a setup.py
    may hard-code in its bdist_wheel options): [] when the job builds no abi3 wheel."""
    if not tag:
        return []
    return [f"--config-settings=--build-option=--py-limited-api={tag}"]


def build() -> None:
    jd = job_dir()
    claim(jd)
    venv = jd / "venv"
    python = venv / "bin" / "python"
    mark(phase="env")
    ready = venv / ".factory-ready"
    if not ready.exists():
        python = make_venv(venv)
        requirements = list(environment().requirements)
        uv_install(python, requirements)
        ready.touch()
    check_torch_cuda(python)

    mark(phase="source")
    src = jd / "src"
    copied = jd / ".source-copied"
    if not copied.exists():
        if src.exists():
            shutil.rmtree(src)
        shutil.copytree(SOURCE, src, symlinks=True)
        copied.touch()
    kept = count_objects(src)
    mark(objects_kept=kept)

    mark(phase="build")
    dist = jd / "dist"
    if dist.exists():
        shutil.rmtree(dist)
    env = dict(os.environ)
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env, headers, libraries = cudagaps.fill_gaps(env, venv=venv, into=jd / "cuda-gaps")
    if headers or libraries:
        print(cudagaps.summary(headers, libraries), flush=True)
    mark_toolchain(env)
    env.update(cache_env(env))
    run(
        [
            str(python),
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "--no-index",
            "-v",
            *limited_api_args(environment().limited_api or ""),
            "--wheel-dir",
            str(dist),
            ".",
        ],
        cwd=src,
        env=env,
    )
    mark(objects_total=count_objects(src))
    if preflightcompiles.candidates() is not None:
        mark(phase="preflight")
        mark(preflight=preflight_device(jd / preflightcompiles.DIR_NAME))
        return  # its wheel is of stand-ins: nothing is handed back

    mark(phase="collect")
    wheels = sorted(dist.glob("*.whl"))
    if len(wheels) != 1:
        sys.exit(f"factory: expected one wheel, found {[w.name for w in wheels]}")
    shutil.copy2(wheels[0], OUT / wheels[0].name)
    mark(wheel=wheels[0].name)


def preflight_device(state: Path) -> dict[str, object]:
    """A preflight's device compile, once its build has run: the one the build made, else the recorded call
    that ranks first, compiled now for one arch through the wrapper (its cache and admission); no source for
    a build without nvcc compiles."""
    done = preflightcompiles.device_done(str(state))
    if done is not None:
        return {**done, "deferred": False}
    ranked = preflightcompiles.candidates() or ()
    call = preflightcompiles.choose(preflightcompiles.recorded(str(state)), ranked)
    if call is None:
        return {"source": None, "arch": None, "deferred": False}
    device = preflightcompiles.one_arch(nvcccall.parse(call.argv))
    arch = preflightcompiles.arch_label(device.archs)
    env = {k: v for k, v in call.env.items() if k != protocol.ENV_PREFLIGHT}  # a compile like any other
    print(f"factory-preflight: the build did not compile {ranked[0] if ranked else 'a ranked source'}; "
          f"compiling {call.source} for {arch or 'its arch'} instead", flush=True)  # fmt: skip
    run([str(NVCC_LAUNCHER), *device.argv], cwd=call.cwd, env=env)
    return {"source": call.source, "arch": arch, "deferred": True}


def check() -> None:
    """Install the accepted wheel with its torch into a fresh venv and import it (no GPU needed)."""
    jd = job_dir()
    claim(jd)
    mark(phase="install-check")
    wheel = OUT / required(environment().wheel, protocol.ENV_WHEEL)
    python = make_venv(jd / "check-venv")
    found = (WHEELHOUSE, CHECK_WHEELHOUSE) if CHECK_WHEELHOUSE.is_dir() else (WHEELHOUSE,)
    uv_install(python, [str(wheel)], wheelhouses=found)
    script = required(environment().import_check, protocol.ENV_IMPORT_CHECK)
    run([str(python), "-I", "-c", script], cwd="/")
    mark(phase="done")


def clean() -> None:
    shutil.rmtree(job_dir(), ignore_errors=True)


def idle_s(path: Path, now: float) -> float:
    """Seconds since an entry was last added or removed anywhere under `path` (its newest directory mtime): a
    live build's compiles write objects into its build tree."""
    newest = path.lstat().st_mtime
    for root, dirs, _files in os.walk(path):
        for name in dirs:
            try:
                newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
            except OSError:
                continue
    return max(0.0, now - newest)


def list_jobs(root: Path) -> None:
    """One mark listing the job directories under `root` with their owners (`protocol.job_listing_line`)."""
    dirs: list[protocol.JobDir] = []
    now = time.time()
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if path.is_symlink() or not path.is_dir():
            continue
        try:
            owner: str | None = (path / protocol.OWNER_FILE).read_text()
        except OSError:
            owner = None
        try:
            idle = 0.0 if owner is not None and protocol.parse_owner(owner) else idle_s(path, now)
        except OSError:  # removed meanwhile
            continue
        dirs.append(protocol.JobDir(name=path.name, owner=owner, idle_s=idle))
    print(protocol.job_listing_line(dirs), flush=True)


def remove_jobs(root: Path, names: list[str]) -> None:
    """Remove the named job directories under `root`, a mark for each one gone."""
    for name in names:
        if not protocol.is_job_dir_name(name):
            sys.exit(f"factory: {name!r} is not a job directory name")
        path = root / name
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            print(protocol.removed_line(name), flush=True)


if __name__ == "__main__":
    heartbeat.start_watch(CHILDREN, os.environ)
    try:
        phases: dict[str, Callable[[], object]] = {
            "build": build,
            "check": check,
            "clean": clean,
            "jobs": lambda: list_jobs(Path(sys.argv[2])),
            "remove-jobs": lambda: remove_jobs(Path(sys.argv[2]), sys.argv[3:]),
        }
        phases[sys.argv[1]]()
    except subprocess.CalledProcessError as exc:
        print(f"factory: {' '.join(map(str, exc.cmd))!r} failed with exit code {exc.returncode}", flush=True)
        sys.exit(exc.returncode or 1)
