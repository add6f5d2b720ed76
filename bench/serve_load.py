"""`factory serve` under load: many clients at once on loopback, every response's bytes checked.

Publishes a small but realistic index (3 projects x 2 variants x 2 versions, wheels of incompressible
bytes) with the publish code, starts `factory serve` on 127.0.0.1 over it, and sends REQUESTS requests from
CLIENTS concurrent clients: project pages (HTML and PEP 691 JSON), variant and root pages, .metadata files
and wheels, in a fixed shuffled order. Each client opens a new connection per request by default (the case
that fills the listen queue); --keep-alive keeps one connection per client. Every request has a deadline
and each run a bound in time (what is unsent then counts as errors), so it stops by itself. Writes
bench/results/serve.json.

    python -m bench.serve_load --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from factory.publish.publisher import publish_wheels
from factory.wheel.checks import record_hash

RESULTS = Path(__file__).resolve().parent / "results" / "serve.json"
HOST = "127.0.0.1"  # loopback only: the load never leaves this machine
JSON_ACCEPT = (
    "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"
)
PROJECTS = ("flashy-attn", "fused-norm", "tiny-kernels")
LABELS = ("cu13.0.torch2.14.abi1.sm80.90", "cu12.8.torch2.10.abi1.sm80.90")
VERSIONS = ("1.0.0", "1.1.0")
WHEEL_BYTES = 256 * 1024


@dataclass(frozen=True, kw_only=True)
class Target:
    path: str  # the URL path, percent-encoded
    accept: str | None
    body: bytes  # what the response must carry


@dataclass(frozen=True, kw_only=True)
class Run:
    requests: int
    clients: int
    keep_alive: bool
    errors: int
    error_samples: tuple[str, ...]
    wall_s: float
    requests_per_s: float
    p50_s: float | None  # of the requests answered right; None when none was
    p99_s: float | None
    max_s: float | None


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)  # seconds, of the requests answered right
    errors: list[str] = field(default_factory=list)


def make_wheel(directory: Path, project: str, version: str, label: str, rng: random.Random) -> Path:
    """A pure-Python wheel carrying WHEEL_BYTES of random (incompressible) data, as big extensions do."""
    module = project.replace("-", "_")
    dist_info = f"{module}-{version}+{label}.dist-info"
    files = {
        f"{module}/__init__.py": b"",
        f"{module}/_kernels.bin": rng.randbytes(WHEEL_BYTES),
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}+{label}\nRequires-Python: >=3.9\n\n"
        ).encode(),
        f"{dist_info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = [f"{name},{record_hash(data)},{len(data)}" for name, data in files.items()]
    files[f"{dist_info}/RECORD"] = "\n".join([*record, f"{dist_info}/RECORD,,", ""]).encode()
    path = directory / f"{module}-{version}+{label}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0)), data)
    return path


def make_index(work: Path) -> Path:
    rng = random.Random(0)
    (work / "wheels").mkdir(parents=True)
    wheels = [
        make_wheel(work / "wheels", p, v, label, rng) for p in PROJECTS for v in VERSIONS for label in LABELS
    ]
    publish_wheels(wheels, to=str(work / "index"))
    return work / "index"


def targets_of(root: Path) -> list[Target]:
    """Every page (in both forms where it has two) and every file of the index, with its expected bytes."""
    out: list[Target] = [Target(path="/simple/", accept=None, body=(root / "simple/index.html").read_bytes())]
    for page in sorted(root.glob("simple/*/**/index.html")):
        url = "/" + page.parent.relative_to(root).as_posix() + "/"
        out.append(Target(path=url, accept=None, body=page.read_bytes()))
        as_json = page.with_name("index.json")
        if as_json.is_file() and url.count("/") > 3:  # a project page: uv and pip ask for JSON
            out.append(Target(path=url, accept=JSON_ACCEPT, body=as_json.read_bytes()))
    for file in sorted((root / "files").glob("*/*")):
        name = file.name.replace("+", "%2B")
        out.append(Target(path=f"/files/{file.parent.name}/{name}", accept=None, body=file.read_bytes()))
    return out


def workload(targets: list[Target], count: int) -> list[Target]:
    """`count` requests: pages four times as often as wheels, as an installer resolving asks them."""
    rng = random.Random(1)
    weights = [1 if t.path.endswith(".whl") else 4 for t in targets]
    return rng.choices(targets, weights=weights, k=count)


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    status_line = await reader.readline()
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise ConnectionError(f"bad status line {status_line[:80]!r}")
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(parts[1]), headers, body


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _request(port: int, conn: Connection | None, target: Target, keep_alive: bool) -> Connection | None:
    """One request, its response checked; the connection to reuse, if the server keeps it open."""
    reader, writer = conn or await asyncio.open_connection(HOST, port)
    accept = f"Accept: {target.accept}\r\n" if target.accept else ""
    close = "" if keep_alive else "Connection: close\r\n"
    writer.write(f"GET {target.path} HTTP/1.1\r\nHost: {HOST}\r\n{accept}{close}\r\n".encode())
    status, headers, body = await _read_response(reader)
    if status != 200 or body != target.body:
        writer.close()
        raise ValueError(f"status {status}, {len(body)} bytes, {len(target.body)} expected")
    if not keep_alive or headers.get("connection", "").lower() == "close":
        writer.close()
        return None
    return reader, writer


async def _client(
    port: int, queue: list[Target], keep_alive: bool, timeout_s: float, deadline: float, out: Tally
) -> None:
    conn: Connection | None = None
    while queue and time.perf_counter() < deadline:
        target = queue.pop()
        start = time.perf_counter()
        try:
            limit = min(timeout_s, deadline - start)
            conn = await asyncio.wait_for(_request(port, conn, target, keep_alive), limit)
            out.latencies.append(time.perf_counter() - start)
        except (OSError, EOFError, ValueError, TimeoutError, asyncio.IncompleteReadError) as exc:
            out.errors.append(f"{target.path}: {exc.__class__.__name__} {exc}"[:200])
            if conn is not None:
                conn[1].close()
                conn = None
    if conn is not None:
        conn[1].close()


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (q in 0-100) of a non-empty list."""
    ranked = sorted(values)
    return ranked[max(0, min(len(ranked), math.ceil(q / 100 * len(ranked))) - 1)]


async def load(
    port: int, requests: list[Target], clients: int, keep_alive: bool, timeout_s: float, run_limit_s: float
) -> Run:
    """Send `requests` from `clients` concurrent clients; what is unsent after `run_limit_s` is an error."""
    queue = list(reversed(requests))
    tally = Tally()
    start = time.perf_counter()
    deadline = start + run_limit_s
    await asyncio.gather(
        *(_client(port, queue, keep_alive, timeout_s, deadline, tally) for _ in range(clients))
    )
    latencies, errors = (
        tally.latencies,
        tally.errors + [f"{t.path}: not sent within the run limit" for t in queue],
    )
    wall = time.perf_counter() - start
    return Run(
        requests=len(requests),
        clients=clients,
        keep_alive=keep_alive,
        errors=len(errors),
        error_samples=tuple(errors[:5]),
        wall_s=round(wall, 3),
        requests_per_s=round(len(requests) / wall, 1),
        p50_s=round(percentile(latencies, 50), 4) if latencies else None,
        p99_s=round(percentile(latencies, 99), 4) if latencies else None,
        max_s=round(max(latencies), 4) if latencies else None,
    )


def start_server(root: Path, log: Path) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "factory", "serve", str(root), "--host", HOST, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("serving "):
        proc.kill()
        raise SystemExit(f"factory serve did not start: {line!r}; see {log}")
    return proc, int(line.rsplit(":", 1)[1].split("/", 1)[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.serve_load", description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3, help="runs, each against a fresh server")
    parser.add_argument("--keep-alive", action="store_true", help="one connection per client, reused")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds one request may take")
    parser.add_argument("--run-limit", type=float, default=300.0, help="seconds one run may take")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if min(args.clients, args.requests, args.repeat) < 1 or min(args.timeout, args.run_limit) <= 0:
        parser.error("--clients, --requests, --repeat, --timeout and --run-limit must be positive")
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="serve-load-") as tmp:
        root = make_index(Path(tmp))
        requests = workload(targets_of(root), args.requests)
        for i in range(args.repeat):
            proc, port = start_server(root, Path(tmp) / f"access-{i}.log")
            try:
                run = load(port, requests, args.clients, args.keep_alive, args.timeout, args.run_limit)
                runs.append(asyncio.run(run))
            finally:
                proc.terminate()
                proc.wait(timeout=30)
            print(json.dumps(asdict(runs[-1])), flush=True)

    def spread(field: str) -> dict[str, float] | None:
        values = [getattr(r, field) for r in runs]
        if None in values:
            return None
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "load_average_1min_after": round(os.getloadavg()[0], 2),  # others share this machine
        },
        "workload": {
            "clients": args.clients,
            "requests": args.requests,
            "keep_alive": args.keep_alive,
            "timeout_s": args.timeout,
            "run_limit_s": args.run_limit,
            "distinct_urls": len({(t.path, t.accept) for t in requests}),
            "wheel_bytes": WHEEL_BYTES,
        },
        "runs": [asdict(r) for r in runs],
        "summary": {f: spread(f) for f in ("errors", "p50_s", "p99_s", "max_s", "requests_per_s")},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(json.dumps(result["summary"]))
    return 1 if any(r.errors for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
