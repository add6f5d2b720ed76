"""`factory which`: on a consumer host, find the variant index that matches its torch, CUDA, ABI and GPUs.

pip and uv cannot see the installed torch, so the choice of index is the consumer's; this makes it exact.
Detection (`detect_environment`) runs a probe in the target interpreter; matching (`choose_variant`) is pure.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

from factory.errors import ConfigError, FactoryError
from factory.index import parse_anchors
from factory.urls import INDEX_SCHEMES, checked_url, without_credentials

EXTRA_INDEX = "https://pypi.org/simple"
_VARIANT_ID = re.compile(
    r"^cu(?P<cuda>\d+)-torch(?P<torch>\d+(?:\.\d+)*)-abi(?P<abi>[01])-sm(?P<archs>\d+a?(?:\.\d+a?)*)$"
)


@dataclass(frozen=True, kw_only=True)
class Environment:
    """What decides the variant on a consumer host."""

    python: str  # "3.11"
    torch: str | None  # release without local label, "2.14.1"; None without torch
    cuda: str | None  # torch.version.cuda, "13.0"; None for a CPU build of torch
    cxx11_abi: bool | None
    gpus: tuple[str, ...]  # compute capabilities of the visible GPUs, "9.0"
    gpu_source: str = "none"  # "torch", "nvidia-smi" or "none"


@dataclass(frozen=True, kw_only=True)
class VariantKey:
    id: str
    cuda: str  # "13.0"
    torch: str  # "2.14" or "2.14.1"
    cxx11_abi: bool
    archs: tuple[str, ...]  # "8.0", "9.0a"


@dataclass(frozen=True, kw_only=True)
class Choice:
    match: str | None  # the variant id to use
    notes: tuple[str, ...]  # caveats of the match (e.g. CUDA minor differs)
    nearest: str | None  # when nothing matches: the closest variant id
    reasons: tuple[str, ...]  # why the nearest does not match


def parse_variant_id(variant_id: str) -> VariantKey | None:
    """ "cu130-torch2.14-abi1-sm80.90" -> its parts; None for names that are not variant ids."""
    m = _VARIANT_ID.match(variant_id)
    if m is None:
        return None
    cuda_digits = m.group("cuda")
    archs = []
    for digits in m.group("archs").split("."):
        suffix = "a" if digits.endswith("a") else ""
        num = digits.rstrip("a")
        if len(num) < 2:
            return None
        archs.append(f"{num[:-1]}.{num[-1]}{suffix}")
    return VariantKey(
        id=variant_id,
        # CUDA minors are single digits (12.8, 13.0), so the last digit is the minor.
        cuda=f"{cuda_digits[:-1]}.{cuda_digits[-1]}",
        torch=m.group("torch"),
        cxx11_abi=m.group("abi") == "1",
        archs=tuple(archs),
    )


def _cc(arch: str) -> tuple[int, int, bool]:
    specific = arch.endswith("a")
    major, minor = arch.rstrip("a").split(".")
    return int(major), int(minor), specific


def covers(archs: Iterable[str], gpu: str) -> bool:
    """Does code for `archs` run on a GPU of compute capability `gpu`?

    SASS for sm_XY runs on the same major with a minor >= Y (sm_80 code runs on 8.6 and 8.9); arch-specific
    "a" code (sm_90a) runs only on exactly that capability. PTX may be absent, so it is not counted on.
    """
    g_major, g_minor, _ = _cc(gpu)
    for arch in archs:
        major, minor, specific = _cc(arch)
        if specific and (major, minor) == (g_major, g_minor):
            return True
        if not specific and major == g_major and minor <= g_minor:
            return True
    return False


def _release(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split("+")[0].split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        out.append(int(digits.group()))
    return tuple(out)


def mismatches(env: Environment, key: VariantKey) -> tuple[tuple[str, ...], tuple[str, ...], int]:
    """(blocking reasons, caveats, distance) of a variant for an environment; no reasons means usable."""
    reasons: list[str] = []
    notes: list[str] = []
    distance = 0
    if env.torch is None:
        reasons.append("torch is not installed")
        distance += 100
    else:
        want = _release(key.torch)
        have = _release(env.torch)
        if have[: len(want)] != want:
            reasons.append(f"built for torch {key.torch}, this host has torch {env.torch}")
            distance += 30 + 3 * abs((*want, 0, 0)[1] - (*have, 0, 0)[1])
    if env.torch is not None and env.cuda is None:
        reasons.append(f"built for CUDA {key.cuda}, this host's torch is a CPU build")
        distance += 50
    elif env.cuda is not None:
        v_major, v_minor = _release(key.cuda)[:2]
        e_major, e_minor = (*_release(env.cuda), 0)[:2]
        if v_major != e_major:
            reasons.append(f"built for CUDA {key.cuda}, torch here uses CUDA {env.cuda}")
            distance += 40
        elif v_minor != e_minor:
            notes.append(
                f"built with CUDA {key.cuda}, torch here uses CUDA {env.cuda} (same major: compatible)"
            )
            distance += abs(v_minor - e_minor)
    if env.cxx11_abi is not None and env.cxx11_abi != key.cxx11_abi:
        reasons.append(f"built with cxx11 ABI {int(key.cxx11_abi)}, torch here uses {int(env.cxx11_abi)}")
        distance += 20
    for gpu in env.gpus:
        if not covers(key.archs, gpu):
            reasons.append(
                f"no code for this GPU (compute capability {gpu}); built for {', '.join(key.archs)}"
            )
            distance += 10
    return tuple(reasons), tuple(notes), distance


def choose_variant(env: Environment, variant_ids: Iterable[str]) -> Choice:
    """The best usable variant index for `env`, or the nearest one and why it does not fit."""
    scored = []
    for vid in sorted(set(variant_ids)):
        key = parse_variant_id(vid)
        if key is None:
            continue
        reasons, notes, distance = mismatches(env, key)
        # Among usable ones: nearest CUDA minor, then the exact torch release pin, then the smallest arch set.
        exact_torch = 0 if env.torch and _release(key.torch) == _release(env.torch) else 1
        scored.append(((distance, exact_torch, len(key.archs), vid), reasons, notes))
    usable = [s for s in scored if not s[1]]
    if usable:
        best = min(usable, key=lambda s: s[0])
        return Choice(match=best[0][-1], notes=best[2], nearest=None, reasons=())
    if not scored:
        return Choice(match=None, notes=(), nearest=None, reasons=("the index lists no variant indexes",))
    nearest = min(scored, key=lambda s: s[0])
    return Choice(match=None, notes=(), nearest=nearest[0][-1], reasons=nearest[1])


def install_commands(index_url: str, project: str) -> tuple[str, str]:
    """The exact pip and uv commands for one variant index (other dependencies from PyPI)."""
    pip = f"pip install --index-url {index_url} --extra-index-url {EXTRA_INDEX} {project}"
    uv = f"uv pip install --index-url {index_url} --extra-index-url {EXTRA_INDEX} {project}"
    return pip, uv


_PROBE = r"""
import json, sys
out = {"python": "%d.%d" % sys.version_info[:2], "torch": None, "cuda": None, "abi": None, "gpus": []}
out["gpu_source"] = "none"
try:
    import torch
except Exception:
    torch = None
if torch is not None:
    out["torch"] = torch.__version__.split("+")[0]
    out["cuda"] = torch.version.cuda
    out["abi"] = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    try:
        if torch.cuda.is_available():
            caps = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
            out["gpus"] = ["%d.%d" % c for c in caps]
            out["gpu_source"] = "torch"
    except Exception:
        pass
print(json.dumps(out))
"""


def parse_nvidia_smi(output: str) -> tuple[str, ...]:
    """Lines of `nvidia-smi --query-gpu=compute_cap --format=csv,noheader` -> ("9.0", ...)."""
    caps = []
    for line in output.splitlines():
        line = line.strip()
        if re.fullmatch(r"\d+\.\d+", line):
            caps.append(line)
    return tuple(sorted(set(caps), key=_cc))


def detect_environment(python: str | None = None) -> Environment:
    """Probe `python` (default: this interpreter) for torch, its CUDA and ABI, and the GPUs."""
    exe = python or sys.executable
    try:
        proc = subprocess.run([exe, "-c", _PROBE], capture_output=True, text=True, timeout=300, check=False)
    except OSError as exc:
        raise ConfigError(f"--python {exe}: cannot run ({exc.strerror})") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise FactoryError(f"probing {exe} failed: {last}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    gpus = tuple(sorted(set(data["gpus"]), key=_cc))
    source = data["gpu_source"]
    if not gpus and shutil.which("nvidia-smi"):
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if smi.returncode == 0:
            gpus = parse_nvidia_smi(smi.stdout)
            source = "nvidia-smi" if gpus else "none"
    return Environment(
        python=data["python"],
        torch=data["torch"],
        cuda=data["cuda"],
        cxx11_abi=data["abi"],
        gpus=gpus,
        gpu_source=source,
    )


def normalize_index_url(index: str) -> str:
    """A URL or local directory of an index (its root or its simple/ page) -> the URL of simple/."""
    if "://" not in index:
        path = Path(index).expanduser().resolve()
        if not path.exists():
            raise ConfigError(f"--index {index}: no such directory")
        index = path.as_uri()
    else:
        checked_url(index, schemes=INDEX_SCHEMES, what="--index")
    if not index.endswith("/"):
        index += "/"
    if not index.endswith("/simple/"):
        index += "simple/"
    return index


def fetch_page(url: str) -> str:
    """GET one HTML page (file:// directories read their index.html; user:pass@ becomes basic auth)."""
    parts = urlsplit(url)
    headers = {"Accept": "text/html"}
    if parts.scheme == "file":
        if url.endswith("/"):
            url += "index.html"
    elif parts.username is not None:
        userinfo = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(userinfo.encode()).decode()
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
        url = urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as resp:
            return resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        raise FactoryError(f"{without_credentials(url)}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise FactoryError(f"{without_credentials(url)}: {reason}") from None


@dataclass(frozen=True, kw_only=True)
class WhichResult:
    env: Environment
    choice: Choice
    variant_url: str | None
    projects: tuple[str, ...]
    commands: tuple[tuple[str, str], ...]  # (pip, uv) per project


def which(index: str, *, env: Environment, project: str | None = None) -> WhichResult:
    """Read the index's list of variant indexes and pick the one for `env`."""
    root = normalize_index_url(index)
    anchors = parse_anchors(fetch_page(root))
    variants = {a.text: urljoin(root, a.href) for a in anchors if parse_variant_id(a.text) is not None}
    choice = choose_variant(env, variants)
    if choice.match is None:
        return WhichResult(env=env, choice=choice, variant_url=None, projects=(), commands=())
    variant_url = variants[choice.match]
    listed = tuple(a.text for a in parse_anchors(fetch_page(variant_url)))
    projects: Sequence[str] = listed
    if project is not None:
        from packaging.utils import canonicalize_name

        wanted = canonicalize_name(project)
        if wanted not in {canonicalize_name(p) for p in listed}:
            raise FactoryError(
                f"{project} is not in the matching index {without_credentials(variant_url)} (it has: "
                f"{', '.join(listed) or 'nothing'})"
            )
        projects = (project,)
    commands = tuple(install_commands(variant_url, p) for p in projects)
    return WhichResult(
        env=env, choice=choice, variant_url=variant_url, projects=tuple(projects), commands=commands
    )
