"""A new torch on the index to its wheels published, with nobody touching the matrix: the play of issue 34.

A local PEP 503 index stands for PyTorch's per-CUDA index (the matrix's `build.torch_index`): it first offers
torch 2.12.1, then 2.12.1 and 2.14.1 (real CUDA 13.0 wheels for CPython 3.11, fetched once with the host's pip
configuration and kept beside the wheelhouse cache; their nvidia-* dependencies still come from the host's
indexes, which pip reads besides this one). The demo matrix asks for `torch: [">=2.12"]`, one Python and one
arch set, so each torch is one real build. A scheduled run is what the reusable workflow runs
(.github/workflows/factory.yml): the plan of the jobs not yet published (`factory matrix --format github
--unpublished`), one `factory build --only JOB --keep-going --publish` per planned job, then `factory index
check`.

tests/integration/test_new_torch_play.py plays it for correctness; `python -m bench.new_torch` times the
second run: from the moment the new torch's page is written to its wheel published, and its parts. Each
repeat starts from the published index run 1 left (a copy) and an empty $FACTORY_HOME (wheelhouse and compile
cache cold), so the new torch's wheelhouse is really downloaded and its objects really compiled. Writes
bench/results/new-torch.json.

    python -m bench.new_torch --repeat 3
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from packaging.utils import parse_wheel_filename

from bench import matrices
from factory.build import wheelhouse
from factory.core.home import factory_home
from factory.publish import index

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "new-torch.json"
PYTHON = "3.11"  # the demo image's Python (factory-builder:cu13.0-py3.11-pypi)
CUDA = "13.0"
FIRST, NEW = "2.12.1", "2.14.1"  # both CUDA 13.0 builds on the host's index
TORCH_SPEC = ">=2.12"
ARCH = "8.0"
FIRST_JOB = "cu130-torch2.12-abi1-sm80-py311"  # the one job each torch makes
NEW_JOB = "cu130-torch2.14-abi1-sm80-py311"
LABEL = "cu130"  # the index's one "variant": its URL ends in /simple/cu130/, like PyTorch's per-CUDA indexes
# Beside the wheelhouse cache in the factory's home: survives test sessions, as the wheelhouses do.
CACHE_DIR = "torch-play"


class PlayError(Exception):
    """A command of the play failed: its argv and the tail of its output."""


def torch_files(root: Path) -> Path:
    return root / "files" / LABEL


def fetch_torch_wheels(root: Path, versions: Sequence[str] = (FIRST, NEW)) -> dict[str, Path]:
    """The torch wheel of each version for CPython 3.11 on manylinux x86_64, downloaded (no dependencies)
    with the host's pip configuration the first time, then kept under `root`."""
    files = torch_files(root)
    files.mkdir(parents=True, exist_ok=True)
    found: dict[str, Path] = {}
    for version in versions:
        have = [p for p in wheelhouse.wheel_files(files) if str(parse_wheel_filename(p.name)[1]) == version]
        if not have:
            tmp = Path(tempfile.mkdtemp(prefix=".download.", dir=files))
            try:
                args = wheelhouse.pip_download_args([f"torch=={version}"], tmp, python=PYTHON)
                proc = subprocess.run(
                    [sys.executable, *args, "--no-deps"],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if proc.returncode != 0:
                    raise PlayError(
                        f"pip download torch=={version}: {wheelhouse.last_error_line(proc.stdout)}"
                    )
                (wheel,) = wheelhouse.wheel_files(tmp)
                os.replace(wheel, files / wheel.name)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            have = [files / wheel.name]
        (found[version],) = have
    return found


@contextmanager
def held(root: Path) -> Iterator[None]:
    """The torch index under `root` is this process's until the block ends: its URL is the same for every
    session (so the wheelhouses keyed by it are reused), its pages are not."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@dataclass(frozen=True, kw_only=True)
class TorchIndex:
    """The local torch index: `root`/simple/cu130/torch/ lists what `offer` was last given."""

    root: Path
    wheels: Mapping[str, Path]  # version -> its wheel under root/files/cu130/

    @property
    def url(self) -> str:
        return (self.root / "simple" / LABEL).as_uri() + "/"

    def offer(self, versions: Sequence[str]) -> None:
        """Write the project page (and the index's root page) listing the wheels of `versions`; each page
        replaced whole, as an index publishes."""
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        records = [
            index.FileRecord(
                filename=self.wheels[v].name,
                sha256=_sha256(self.wheels[v]),
                size=self.wheels[v].stat().st_size,
                upload_time=stamp,
            )
            for v in versions
        ]
        pages = {
            f"{index.project_dir(LABEL, 'torch')}index.html": index.project_html(
                "torch", records, variant_id=LABEL
            ),
            f"{index.variant_dir(LABEL)}index.html": index.variant_root_html(["torch"]),
        }
        for key, text in pages.items():
            path = self.root / key
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(text)
            os.replace(tmp, path)


def play_matrix(dest: Path, *, torch_index: str, publish_to: Path) -> Path:
    """The demo matrix of the play: torch `>=2.12` from `torch_index`, Python 3.11, sm_80, published to
    `publish_to`; the demo extension's source copied beside it, as in a checkout."""
    source = matrices.DEMO.parent / "demo-ext"
    shutil.copytree(source, dest.parent / source.name, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    return matrices.write_matrix(
        matrices.DEMO,
        dest,
        absolute_source=False,
        matrix={"torch": [TORCH_SPEC], "python": [PYTHON], "arch": [ARCH]},
        build={"torch_index": {CUDA: torch_index}},
        publish={"to": str(publish_to)},
    )


@dataclass(frozen=True, kw_only=True)
class Build:
    job_id: str
    result: str
    wheel: str | None
    wall_s: float  # the `factory build --only JOB --publish` command
    job_s: float  # the job in its container: install, compile, checks (report.json's wall_s)
    wheelhouse_s: float | None  # the build wheelhouse's download, timed before the command when asked
    downloaded_again: bool  # the command downloaded the build wheelhouse after all (the prefetch missed it)
    # the wheelhouses the command downloaded itself (each one's requirements): the builder image's toolkit
    # wheels, say, which the image check reads from a cold $FACTORY_HOME
    other_downloads: tuple[tuple[str, ...], ...]
    log_tail: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Run:
    job_ids: tuple[str, ...]
    plan_s: float
    builds: tuple[Build, ...]
    index_s: float | None  # `factory index check`, run only when the plan holds jobs
    plan_output: str

    @property
    def ok(self) -> bool:
        return all(b.result == "ok" for b in self.builds)


def _factory(argv: Sequence[str], env: Mapping[str, str], *, timeout: float = 3600) -> tuple[float, str]:
    """`factory ARGV` from this checkout: its wall time and output; PlayError when it fails."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "factory", *argv],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    wall = time.monotonic() - started
    if proc.returncode != 0 or "Traceback" in proc.stdout:
        raise PlayError(f"factory {' '.join(argv)}: exit {proc.returncode}\n{proc.stdout[-4000:]}")
    return wall, proc.stdout


def requirements_of(matrix: Path, job_id: str) -> list[str]:
    """The requirements of the job's build wheelhouse (`factory.build.jobspec.requirements`)."""
    from factory.build.jobspec import requirements
    from factory.plan.plan import plan_file

    mf, plan = plan_file(matrix, only=job_id, warn=lambda _line: None)
    (job,) = plan.jobs
    return requirements(mf, job)


def _inputs(made: Path) -> tuple[str, ...]:
    """The requirements a wheelhouse was downloaded for (its inputs.json); () for what is no wheelhouse."""
    try:
        return tuple(json.loads((made / "inputs.json").read_text())["requirements"])
    except (OSError, ValueError, KeyError, TypeError):
        return ()


def prefetch_wheelhouse(matrix: Path, job_id: str, home: Path) -> float:
    """Download the job's build wheelhouse as its build would (the same inputs, so the same cache entry);
    the seconds it took."""
    from factory.build.jobspec import requirements
    from factory.plan.plan import plan_file

    started = time.monotonic()
    mf, plan = plan_file(matrix, only=job_id, warn=lambda _line: None)
    (job,) = plan.jobs
    url = mf.build.torch_index_url(job.variant.cuda)
    wheelhouse.download_wheelhouse(
        requirements(mf, job),
        home / "wheelhouses",
        python=job.python,
        extra_index_urls=() if url is None else (url,),
    )
    return time.monotonic() - started


def _entries(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()} if directory.is_dir() else set()


def scheduled_run(
    matrix: Path, work: Path, *, home: Path | None = None, prefetch: bool = False, timeout: float = 3600
) -> Run:
    """One scheduled run of the workflow on this host: plan the unpublished jobs, build and publish each,
    check the index. `home`: the $FACTORY_HOME its commands get (else this process's); `prefetch`: time each
    job's wheelhouse download on its own before its build."""
    work.mkdir(parents=True)
    env = dict(os.environ)
    if home is not None:
        env["FACTORY_HOME"] = str(home)
    factory_dir = Path(env.get("FACTORY_HOME") or factory_home())
    outputs = work / "github_output"
    outputs.write_text("")
    plan_s, said = _factory(
        [
            "matrix",
            "--matrix",
            str(matrix),
            "--format",
            "github",
            "--unpublished",
            "--github-output",
            str(outputs),
        ],
        env,
        timeout=timeout,
    )
    values = dict(line.split("=", 1) for line in outputs.read_text().splitlines() if "=" in line)
    include = json.loads(values["matrix"])["include"]
    builds = []
    for job in include:
        job_id = str(job["job_id"])
        fetched = prefetch_wheelhouse(matrix, job_id, factory_dir) if prefetch else None
        before = _entries(factory_dir / "wheelhouses")
        out = work / job_id
        wall, _ = _factory(
            [
                "build",
                "--matrix",
                str(matrix),
                "--only",
                job_id,
                "--keep-going",
                "--publish",
                "--output",
                str(out),
            ],
            env,
            timeout=timeout,
        )
        made = [
            _inputs(factory_dir / "wheelhouses" / name)
            for name in sorted(_entries(factory_dir / "wheelhouses") - before)
        ]
        wanted = tuple(sorted(requirements_of(matrix, job_id))) if prefetch else ()
        again = prefetch and any(tuple(sorted(reqs)) == wanted for reqs in made)
        report = json.loads((out / "report.json").read_text())
        (result,) = report["jobs"]
        builds.append(
            Build(
                job_id=job_id,
                result=result["result"],
                wheel=result.get("wheel"),
                wall_s=wall,
                job_s=float(result.get("wall_s") or 0.0),
                wheelhouse_s=fetched,
                downloaded_again=again,
                other_downloads=tuple(r for r in made if tuple(sorted(r)) != wanted),
                log_tail=tuple(result.get("log_tail") or ()),
            )
        )
    index_s = None
    if include:
        index_s, _ = _factory(["index", "check", "--matrix", str(matrix)], env, timeout=timeout)
    return Run(
        job_ids=tuple(str(j["job_id"]) for j in include),
        plan_s=plan_s,
        builds=tuple(builds),
        index_s=index_s,
        plan_output=said,
    )


# --- the benchmark ---


def _repeat(
    torch_index: TorchIndex, matrix: Path, published: Path, after_first: Path, tmp: Path
) -> dict[str, object]:
    """Run 2 once: from run 1's published index and an empty $FACTORY_HOME, the new torch offered, then
    the scheduled run; its timings."""
    shutil.rmtree(published, ignore_errors=True)
    shutil.copytree(after_first, published, symlinks=True)
    home = Path(tempfile.mkdtemp(prefix="home.", dir=tmp))
    torch_index.offer([FIRST])
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    torch_index.offer([FIRST, NEW])
    offered = time.monotonic()
    run = scheduled_run(
        matrix, Path(tempfile.mkdtemp(prefix="run2.", dir=tmp)) / "work", home=home, prefetch=True
    )
    done = time.monotonic()
    shutil.rmtree(home, ignore_errors=True)  # GBs of wheelhouse
    if not run.ok or not run.job_ids:
        raise PlayError(
            f"run 2 built nothing or failed: {run.job_ids} {[b.log_tail[-5:] for b in run.builds]}"
        )
    (build,) = run.builds
    return {
        "job_ids": list(run.job_ids),
        "new_torch_to_published_s": round(done - started, 2),
        "offer_s": round(offered - started, 3),
        "plan_s": round(run.plan_s, 2),
        "wheelhouse_s": round(build.wheelhouse_s or 0.0, 2),
        "job_s": round(build.job_s, 2),
        # the build command beyond its job: source, image check, compile cache sync, publish
        "build_rest_s": round(build.wall_s - build.job_s, 2),
        "index_check_s": round(run.index_s or 0.0, 2),
        "downloaded_again": build.downloaded_again,
        "other_downloads": [list(r) for r in build.other_downloads],
        "wheel": build.wheel,
        # the machine is shared: its 1-minute load average before and after
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def linked_index(root: Path, wheels: Mapping[str, Path]) -> TorchIndex:
    """A torch index of the bench's own under `root`, its wheels hard links to the kept ones: no other
    process's pages change under it, and its URL need not stay (each repeat's wheelhouse is cold anyway)."""
    files = torch_files(root)
    files.mkdir(parents=True)
    linked = {}
    for version, wheel in wheels.items():
        try:
            os.link(wheel, files / wheel.name)
        except OSError:
            shutil.copy2(wheel, files / wheel.name)
        linked[version] = files / wheel.name
    return TorchIndex(root=root, wheels=linked)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.new_torch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--first-published",
        type=Path,
        metavar="DIR",
        help="an index where run 1 of this play already published torch 2.12's wheel: run 1 is not run again",
    )
    args = parser.parse_args(argv)
    # no lock: the kept wheels are only added, each renamed into place whole; the pages are the bench's own
    kept = fetch_torch_wheels(factory_home() / CACHE_DIR)
    with tempfile.TemporaryDirectory(prefix="new-torch-") as tmp_name:
        tmp = Path(tmp_name)
        torch_index = linked_index(tmp / "torch-index", kept)
        published = tmp / "index"
        matrix = play_matrix(
            tmp / "checkout" / "matrix.yaml", torch_index=torch_index.url, publish_to=published
        )
        torch_index.offer([FIRST])
        if args.first_published is None:
            first = scheduled_run(matrix, tmp / "run1", home=tmp / "home1")
            if not first.ok or first.job_ids != (FIRST_JOB,):
                raise PlayError(f"run 1 planned {first.job_ids} or failed")
            shutil.rmtree(tmp / "home1", ignore_errors=True)
            first_run = {"job_ids": list(first.job_ids), "plan_s": round(first.plan_s, 2)}
        else:
            shutil.copytree(args.first_published, published, symlinks=True)
            first_run = {"from": str(args.first_published)}
        after_first = tmp / "after-first"
        shutil.copytree(published, after_first, symlinks=True)
        repeats = []
        for _ in range(args.repeat):
            repeats.append(_repeat(torch_index, matrix, published, after_first, tmp))
            print(json.dumps(repeats[-1]), flush=True)
    totals = [float(r["new_torch_to_published_s"]) for r in repeats]  # type: ignore[arg-type]
    doc = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
        },
        "play": {
            "torch_spec": TORCH_SPEC,
            "first": FIRST,
            "new": NEW,
            "python": PYTHON,
            "cuda": CUDA,
            "arch": ARCH,
            "first_run": first_run,
        },
        "repeats": repeats,
        "median_s": round(statistics.median(totals), 2),
        "min_s": round(min(totals), 2),
        "max_s": round(max(totals), 2),
    }
    args.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
