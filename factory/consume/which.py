"""`factory which`: on a consumer host, find the variant index that matches its torch, CUDA, ABI and GPUs,
and leave out the projects whose manylinux wheels need a newer glibc than the host has.

pip and uv cannot see the installed torch, so the choice of index is the consumer's; this makes it exact.
Detection (`detect_environment`) runs a probe in the target interpreter; matching (`choose_variant`) is pure.

Without torch, the host's NVIDIA driver decides (`factory.consume.hostgpu`): the newest torch whose variant
the driver runs, whose archs cover every GPU and which has a wheel for this Python, installed together with
that torch from the index of its CUDA build in one command. The commands install exactly the wheel chosen
here, by URL and sha256 (`factory.publish.installcmd` composes them). When nothing fits, what is missing
becomes a build request for this host's platform
(`factory.plan.variantrequest`), printed as matrix lines and, with --request, sent to the index's server.

Where the index also publishes the experimental wheel-variant channel (PEP 825,
`factory.publish.wheelvariants`) and
the host has torch, the uv command for the variant index of its torch follows the safe commands, labelled
experimental (`wheel_variant_installs`).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import platform as _host
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from factory.consume.hostgpu import detect_driver, run_tool
from factory.consume.indexhttp import _http_request, fetch_page, open_url
from factory.consume.verify import verify_project
from factory.core import bounded
from factory.core.errors import ConfigError, FactoryError
from factory.core.platforms import (
    BUILDABLE,
    DEFAULT_PLATFORM,
    Platform,
    build_problem,
    host_platform,
    of_machine,
)
from factory.core.simpleapi import parse_anchors
from factory.core.tags import manylinux_tag, parse_glibc, parse_manylinux, python_tag
from factory.core.urls import INDEX_SCHEMES, checked_url, printable, without_credentials
from factory.core.variants import Arch, VariantKey, torch_minor, version_tuple
from factory.plan import variantrequest
from factory.plan.variantrequest import VariantRequest
from factory.publish import installcmd, wheelvariants
from factory.publish.index import DamagedState, projects_from_root_json
from factory.publish.installcmd import DEFAULT_INDEX, Host, Install, Torch, Wheel
from factory.spec.compat import CompatData
from factory.spec.options import PAGE_DEADLINE_S, PYTORCH_INDEX
from factory.spec.torchreq import torch_requirement

# PEP 508 project names: anything else an index page lists is not printed into a command.
_PROJECT = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)


@dataclass(frozen=True, kw_only=True)
class Environment:
    """What decides the variant on a consumer host."""

    python: str  # "3.11"
    torch: str | None  # release without local label, "2.14.1"; None without torch
    cuda: str | None  # torch.version.cuda, "13.0"; None for a CPU build of torch
    cxx11_abi: bool | None
    gpus: tuple[str, ...]  # compute capabilities of the visible GPUs, "9.0"
    gpu_source: str = "none"  # "torch", "nvidia-smi" or "none"
    glibc: str | None = None  # "2.36"; None where unknown (not glibc, or not probed)
    machine: str | None = None  # platform.machine(); None: not probed, this process's is taken
    # without torch: the newest CUDA the NVIDIA driver runs ("13.0") and where that came from
    driver_cuda: str | None = None
    driver_source: str = "none"


@dataclass(frozen=True, kw_only=True)
class Choice:
    match: str | None  # the variant id to use
    notes: tuple[str, ...]  # caveats of the match (e.g. CUDA minor differs)
    nearest: str | None  # when nothing matches: the closest variant id
    reasons: tuple[str, ...]  # why the nearest does not match


def parse_variant_id(variant_id: str) -> VariantKey | None:
    """ "cu130-torch2.14-abi1-sm80.90" -> its parts; None for names that are not variant ids."""
    try:
        return VariantKey.parse_id(variant_id)
    except ValueError:
        return None


def _gpu(capability: str) -> Arch | None:
    """A GPU's compute capability ("9.0"); None for anything else a probe or nvidia-smi printed."""
    try:
        arch = Arch.parse(capability)
    except ValueError:
        return None
    return arch if "." in capability and not arch.suffix else None


def _gpus(capabilities: Iterable[str]) -> tuple[str, ...]:
    found = {_gpu(str(c).strip()) for c in capabilities}
    return tuple(g.dotted for g in sorted(g for g in found if g is not None))


def covers(archs: Iterable[str], gpu: str) -> bool:
    """Does code for `archs` run on a GPU of compute capability `gpu`? (`Arch.runs_on`; PTX may be absent,
    so it is not counted on.)"""
    capability = Arch.parse(gpu)
    return any(Arch.parse(arch).runs_on(capability) for arch in archs)


def _release(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split("+")[0].split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        out.append(int(digits.group()))
    return tuple(out)


def driver_runs(driver_cuda: str, cuda: str) -> tuple[str | None, str | None]:
    """(why not, caveat): can a driver whose newest CUDA is `driver_cuda` run code built with CUDA `cuda`?

    A driver runs every older major, and every minor of its own major (CUDA minor version compatibility;
    a newer minor than the driver's may lack features that need the newer driver, hence the caveat)."""
    have, want = version_tuple(driver_cuda)[:2], version_tuple(cuda)[:2]
    if want[0] > have[0]:
        return (
            f"built for CUDA {cuda}, the driver runs CUDA {driver_cuda} at most (a newer driver would)",
            None,
        )
    if want[0] == have[0] and want[1] > have[1]:
        return None, (
            f"built with CUDA {cuda}, the driver's is {driver_cuda}: runs by CUDA minor version compatibility"
        )
    return None, None


def mismatches(env: Environment, key: VariantKey) -> tuple[tuple[str, ...], tuple[str, ...], int]:
    """(blocking reasons, caveats, distance) of a variant for an environment; no reasons means usable."""
    reasons: list[str] = []
    notes: list[str] = []
    distance = 0
    if env.torch is None and env.driver_cuda is None:
        reasons.append("torch is not installed and no NVIDIA driver was found")
        distance += 100
    elif env.torch is None and env.driver_cuda is not None:
        problem, note = driver_runs(env.driver_cuda, key.cuda)
        if problem is not None:
            reasons.append(problem)
            distance += 40
        if note is not None:
            notes.append(note)
    else:
        assert env.torch is not None
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


def rank_without_torch(env: Environment, variant_ids: Iterable[str]) -> list[tuple[str, tuple[str, ...]]]:
    """The variants a host without torch can use (`mismatches`), best first, with their caveats: the newest
    torch, then a CUDA the driver runs without minor version compatibility, then the newest such CUDA, then
    the smallest arch set."""
    usable = []
    for vid in set(variant_ids):
        key = parse_variant_id(vid)
        if key is None:
            continue
        reasons, notes, _ = mismatches(env, key)
        if reasons:
            continue
        order = (
            tuple(-n for n in _release(key.torch)),
            len(notes),
            tuple(-n for n in _release(key.cuda)),
            len(key.archs),
            vid,
        )
        usable.append((order, vid, notes))
    return [(vid, notes) for _, vid, notes in sorted(usable)]


def choose_variant(env: Environment, variant_ids: Iterable[str]) -> Choice:
    """The best usable variant index for `env`, or the nearest one and why it does not fit."""
    variant_ids = set(variant_ids)
    if env.torch is None and env.driver_cuda is not None:
        ranked = rank_without_torch(env, variant_ids)
        if ranked:
            return Choice(match=ranked[0][0], notes=ranked[0][1], nearest=None, reasons=())
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


def glibc_misfit(filenames: Iterable[str], *, python: str, glibc: str) -> str | None:
    """Why pip on a host with `glibc` ("2.31") installs none of these wheels for CPython `python`, or None.

    A manylinux_X_Y tag installs where glibc >= X.Y (what `packaging.tags.sys_tags()` lists); linux_<machine>
    promises nothing, so pip installs it anywhere and it is not counted against the host."""
    have = parse_glibc(glibc)
    if have is None:
        return None
    interpreter = python_tag(python)
    needs: list[tuple[tuple[int, int], str]] = []
    for filename in filenames:
        try:
            tags = parse_wheel_filename(filename)[3]
        except InvalidWheelFilename:
            continue
        mine = [t for t in tags if t.interpreter == interpreter]
        if not mine:
            continue
        parsed = [parse_manylinux(t.platform) for t in mine]
        if any(p is None or p.glibc <= have for p in parsed):
            return None
        needs += [(p.glibc, p.machine) for p in parsed if p is not None]
    if not needs:
        return None
    oldest, machine = min(needs)
    return (
        f"its wheels for Python {python} need glibc {oldest[0]}.{oldest[1]} or newer "
        f"({manylinux_tag(oldest, machine)}); this host has glibc {glibc}"
    )


def _wheel_tags(filenames: Iterable[str]) -> list[frozenset[Any]]:
    out = []
    for filename in filenames:
        try:
            out.append(parse_wheel_filename(filename)[3])
        except InvalidWheelFilename:
            continue
    return out


def python_misfit(filenames: Iterable[str], *, python: str) -> str | None:
    """Why none of these wheels is for CPython `python`, naming the Pythons they are for; None when one is."""
    names = list(filenames)
    if has_wheel_for(names, python):
        return None
    found = sorted(
        {t.interpreter for tags in _wheel_tags(names) for t in tags},
        key=lambda i: (len(i), i),
    )
    return (
        f"its wheels are for {', '.join(found) or 'no Python'}, none for Python {python} "
        f"({python_tag(python)}), this host's"
    )


def machine_misfit(filenames: Iterable[str], *, python: str, machine: str) -> str | None:
    """Why none of the wheels for CPython `python` runs on `machine` (wheels of another platform), naming the
    machines they are for; None when one does (or a wheel for any platform is there)."""
    interpreter = python_tag(python)
    machines: set[str] = set()
    for tags in _wheel_tags(filenames):
        mine = [t for t in tags if t.interpreter in (interpreter, "py3") or t.abi == "abi3"]
        for tag in mine:
            if tag.platform == "any":
                return None
            parsed = parse_manylinux(tag.platform)
            found = parsed.machine if parsed is not None else tag.platform.removeprefix("linux_")
            if found == machine:
                return None
            machines.add(found)
    if not machines:
        return None
    return f"its wheels for Python {python} are for {', '.join(sorted(machines))}; this host is {machine}"


def project_misfit(filenames: Iterable[str], host: Host) -> str | None:
    """Why an installer on `host` takes none of a project's wheels: its Python, then its machine, then its
    glibc (`glibc_misfit`), the first that rules every wheel out; None when none does."""
    names = list(filenames)
    return (
        python_misfit(names, python=host.python)
        or machine_misfit(names, python=host.python, machine=host.machine)
        or (glibc_misfit(names, python=host.python, glibc=host.glibc) if host.glibc else None)
    )


def has_wheel_for(filenames: Iterable[str], python: str) -> bool:
    """Is one of these wheels for CPython `python` ("3.11"): its own cp tag, an abi3 one of an older or the
    same CPython 3, or a pure py3 one?"""
    want = version_tuple(python)
    for filename in filenames:
        try:
            tags = parse_wheel_filename(filename)[3]
        except InvalidWheelFilename:
            continue
        for tag in tags:
            if tag.interpreter == python_tag(python) or tag.interpreter == "py3":
                return True
            if tag.abi == "abi3" and tag.interpreter.startswith("cp3"):
                digits = tag.interpreter[3:]
                if digits.isascii() and digits.isdigit() and (3, int(digits)) <= want[:2]:
                    return True
    return False


def torch_for(key: VariantKey, compat: CompatData, *, installed: str | None = None) -> Torch:
    """The torch to install with a variant's wheel: the release `installed` here when there is one (so that
    no resolver swaps it under the wheel), else the variant's (`torchreq.torch_requirement`, exact); from
    PyTorch's index of the variant's CUDA, or None (the default index: PyPI) when that CUDA is the release's
    default build there."""
    requirement = str(torch_requirement(key.torch, exact=True))
    if installed is not None:
        with contextlib.suppress(ValueError):  # no version: the variant's pin stands
            requirement = str(torch_requirement(installed, exact=True))
    entry = compat.torch_entry(key.torch)
    if entry is not None and entry.get("default_cuda") == key.cuda:
        return Torch(requirement=requirement)
    return Torch(requirement=requirement, index=PYTORCH_INDEX.format(tag=key.cuda.replace(".", "")))


_PROBE = r"""
import json, sys
out = {"python": "%d.%d" % sys.version_info[:2], "torch": None, "cuda": None, "abi": None, "gpus": []}
out["gpu_source"] = "none"
try:
    import os
    out["glibc"] = os.confstr("CS_GNU_LIBC_VERSION").split()[1]  # "glibc 2.36"
except Exception:
    out["glibc"] = None
import platform
out["machine"] = platform.machine()
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
    return _gpus(output.splitlines())


_PROBE_TIMEOUT = 300
_PYTHON_VERSION = re.compile(r"3\.\d{1,2}")
_GLIBC_VERSION = re.compile(r"\d+\.\d+")
_MACHINE = re.compile(r"[A-Za-z0-9_]{1,32}")
_CUDA_VERSION = re.compile(r"\d{1,2}\.\d{1,2}(?:\.\d+)?")


def parse_probe(output: str, exe: str) -> Environment:
    """The probe's JSON line (the last line of `output`) -> the environment, GPUs from torch only.

    Output that is no JSON object means `exe` is not a Python (exit 2: the --python given is wrong); an
    object with a missing or malformed field is a probe that went wrong (exit 1)."""
    lines = output.strip().splitlines()
    try:
        data = json.loads(lines[-1]) if lines else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        said = f"it printed {lines[-1][:60]!r}" if lines else "it printed nothing"
        raise ConfigError(f"--python {exe}: not a Python interpreter ({said})")

    def field(key: str, ok: bool, want: str) -> None:
        if key not in data:
            raise FactoryError(f"probing {exe}: its answer lacks {key!r}")
        if not ok:
            raise FactoryError(f"probing {exe}: {key} {data[key]!r} is not {want}")

    def text(key: str, pattern: re.Pattern[str] | None = None) -> bool:
        value = data.get(key)
        return isinstance(value, str) and (pattern is None or pattern.fullmatch(value) is not None)

    field("python", text("python", _PYTHON_VERSION), "a Python version like 3.11")
    field(
        "torch", data.get("torch") is None or (text("torch") and bool(_release(data["torch"]))), "a version"
    )
    field("cuda", data.get("cuda") is None or text("cuda", _CUDA_VERSION), "a CUDA version like 12.8")
    field("abi", data.get("abi") is None or isinstance(data.get("abi"), bool), "true, false or null")
    gpus: Any = data.get("gpus")
    field("gpus", isinstance(gpus, list) and all(isinstance(g, str) for g in gpus), "a list of strings")
    for gpu in gpus:
        field("gpus", _gpu(gpu) is not None, "a list of compute capabilities like 9.0")
    field("gpu_source", data.get("gpu_source") in ("torch", "none"), "'torch' or 'none'")
    if data.get("glibc") is not None:  # absent or null: not glibc, or not known
        field("glibc", text("glibc", _GLIBC_VERSION), "a glibc version like 2.36")
    if data.get("machine") is not None:  # absent: an older probe's answer, this process's machine is taken
        field("machine", text("machine", _MACHINE), f"a machine name like {DEFAULT_PLATFORM.name}")
    return Environment(
        python=data["python"],
        torch=data["torch"],
        cuda=data["cuda"],
        cxx11_abi=data["abi"],
        gpus=_gpus(gpus),
        gpu_source=data["gpu_source"],
        glibc=data.get("glibc"),
        machine=data.get("machine"),
    )


def detect_environment(python: str | None = None) -> Environment:
    """Probe `python` (default: this interpreter) for torch, its CUDA and ABI, and the GPUs."""
    exe = python or sys.executable
    try:
        proc = subprocess.run(
            [exe, "-c", _PROBE],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=_PROBE_TIMEOUT,
            check=False,
        )
    except OSError as exc:
        raise ConfigError(f"--python {exe}: cannot run ({exc.strerror})") from None
    except subprocess.TimeoutExpired:
        raise FactoryError(f"probing {exe}: no answer within {_PROBE_TIMEOUT} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise FactoryError(f"probing {exe} failed: {last}")
    env = parse_probe(proc.stdout, exe)
    if env.torch is None:
        driver = detect_driver()
        gpus = _gpus(driver.gpus)
        return replace(
            env,
            gpus=gpus,
            gpu_source="nvidia-smi" if gpus else "none",
            driver_cuda=driver.cuda,
            driver_source=driver.source,
        )
    gpus, source = env.gpus, env.gpu_source
    if not gpus and shutil.which("nvidia-smi"):
        # bounded in size and time (driver.run_tool); no answer: no second opinion, torch's (none) stands
        smi = run_tool(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"])
        if smi is not None:
            gpus = parse_nvidia_smi(smi)
            source = "nvidia-smi" if gpus else "none"
    return replace(env, gpus=gpus, gpu_source=source)


def normalize_index_url(index: str) -> str:
    """A URL or local directory of an index (its root or its simple/ page) -> the URL of simple/."""
    if "://" not in index:
        path = Path(index).expanduser().resolve()
        if not path.exists():
            raise ConfigError(f"--index-url {index}: no such directory")
        index = path.as_uri()
    else:
        checked_url(index, schemes=INDEX_SCHEMES, what="--index-url")
    if not index.endswith("/"):
        index += "/"
    if not index.endswith("/simple/"):
        index += "simple/"
    return index


@dataclass(frozen=True, kw_only=True)
class WhichResult:
    env: Environment
    choice: Choice
    variant_url: str | None
    projects: tuple[str, ...]
    # per project: what its commands install (the wheel chosen here, torch pinned)
    installs: tuple[Install, ...] = ()
    # when no variant fits: the build request that would make one (None: nothing to request, see `missing`)
    request: VariantRequest | None = None
    missing: str | None = None
    # the experimental wheel-variant channel: per project it has, what its uv command installs (uv picks the
    # variant); or why the channel the index names is not offered
    variant_installs: tuple[Install, ...] = ()
    variant_note: str | None = None

    @property
    def commands(self) -> tuple[tuple[str, str], ...]:
        """Per project, its pip and uv commands."""
        return tuple(installcmd.commands(install) for install in self.installs)

    @property
    def variant_commands(self) -> tuple[str, ...]:
        """Per project on the wheel-variant channel, its uv command (pip takes no variant wheel)."""
        return tuple(installcmd.uv_command(install) for install in self.variant_installs)


def _index_links(page: str, base: str) -> dict[str, str]:
    """Anchor text -> absolute URL for the links of an index page that stay on a readable scheme (and hold
    no control characters, which would reach the terminal when printed)."""
    links = {}
    for anchor in parse_anchors(page):
        url = urljoin(base, anchor.href)
        if urlsplit(url).scheme in INDEX_SCHEMES and url.isprintable():
            links[anchor.text] = url
    return links


def host_of(env: Environment) -> Host:
    """What of an environment decides which wheel an installer takes: its machine as wheel tags name it
    (`platform.machine()` may say another of its names than its wheel tags do: `platforms.of_machine`)."""
    if env.machine is None:
        return Host(python=env.python, glibc=env.glibc)
    found = of_machine(env.machine)
    return Host(python=env.python, glibc=env.glibc, machine=found.name if found else env.machine)


def _variant_projects(
    env: Environment, variant_url: str, project: str | None, *, strict: bool
) -> tuple[list[tuple[str, Wheel]], list[str]]:
    """(the projects of a variant index this host can install, each with the wheel pip would take for it
    (`installcmd.choose`), notes on those left out). `strict` (torch installed: the variant is the one): a
    missing or unfit `project` is an error; otherwise (a candidate without torch) it is a note, and a
    project needs a wheel for this Python too."""
    links = _index_links(fetch_page(variant_url), variant_url)
    pages = {canonicalize_name(p): url for p, url in links.items() if _PROJECT.fullmatch(p)}
    listed = tuple(p for p in links if _PROJECT.fullmatch(p))
    projects: Sequence[str] = listed
    if project is not None:
        wanted = canonicalize_name(project)
        if wanted not in pages:
            if not strict:
                return [], [f"{project} is not in {without_credentials(variant_url)}"]
            raise FactoryError(
                f"{project} is not in the matching index {without_credentials(variant_url)} (it has: "
                f"{', '.join(listed) or 'nothing'})"
            )
        projects = (project,)
    notes: list[str] = []
    fitting = []
    for name in projects:
        page_url = pages[canonicalize_name(name)]
        page = fetch_page(page_url)
        filenames = [a.text for a in parse_anchors(page)]
        if not strict and not has_wheel_for(filenames, env.python):
            notes.append(f"{name} in {without_credentials(variant_url)} has no wheel for Python {env.python}")
            continue
        misfit = project_misfit(filenames, host_of(env))
        if misfit is None:
            wheel = installcmd.choose(page, page_url=page_url, project=name, host=host_of(env))
            if wheel is not None:
                fitting.append((name, wheel))
                continue
            misfit = (
                f"no wheel an installer would take for Python {env.python} (yanked, its Requires-Python "
                "excludes it, another platform, or its link has no sha256)"
            )
        if project is not None and strict:
            raise FactoryError(f"{name} in {without_credentials(variant_url)}: {misfit}")
        notes.append(f"{name} left out: {misfit}")
    return fitting, notes


def _without_torch(
    env: Environment,
    variants: dict[str, str],
    project: str | None,
    compat: CompatData,
    *,
    default_index: str,
) -> WhichResult:
    """The best variant a host without torch can install (`rank_without_torch`, then a wheel for its Python
    in it), with the one command that installs torch and the project."""
    ranked = rank_without_torch(env, variants)
    why: list[str] = []
    for vid, notes in ranked:
        url = variants[vid]
        fitting, left_out = _variant_projects(env, url, project, strict=False)
        if not fitting:
            why += left_out or [f"{without_credentials(url)} lists no project"]
            continue
        torch = torch_for(VariantKey.parse_id(vid), compat)
        installs = tuple(
            Install(project=name, torch=torch, wheel=wheel, default_index=default_index)
            for name, wheel in fitting
        )
        choice = Choice(match=vid, notes=(*notes, *left_out), nearest=None, reasons=())
        return WhichResult(
            env=env,
            choice=choice,
            variant_url=url,
            projects=tuple(name for name, _wheel in fitting),
            installs=installs,
        )
    choice = (
        choose_variant(env, variants)
        if not ranked
        else Choice(match=None, notes=(), nearest=ranked[0][0], reasons=tuple(why))
    )
    if choice.match is not None:  # usable, but no project fits this Python
        choice = Choice(match=None, notes=(), nearest=choice.match, reasons=tuple(why))
    return _unmatched(env, choice, project, compat)


def _request_torch(env: Environment, compat: CompatData) -> tuple[str, str] | None:
    """(torch minor, CUDA) to ask for on a host without torch: the newest torch the compatibility data knows
    with a CUDA build the driver runs (for this Python where the data says; without minor version
    compatibility where one does), its newest such CUDA."""
    assert env.driver_cuda is not None
    best: tuple[tuple[object, ...], str, str] | None = None
    for minor, entry in compat.data.get("torch", {}).items():
        for cuda in entry.get("cuda", []):
            problem, note = driver_runs(env.driver_cuda, cuda)
            if problem is not None:
                continue
            order = (
                env.python in entry.get("python", []),
                note is None,
                version_tuple(minor),
                version_tuple(cuda),
            )
            if best is None or order > best[0]:
                best = (order, minor, cuda)
    return None if best is None else (best[1], best[2])


def _request_platform(env: Environment) -> tuple[Platform | None, str]:
    """(the platform this host's wheel is for, the machine it was told by); None where the factory builds
    for no such machine."""
    if env.machine is None:  # not probed: this process's
        found = host_platform()
        return found, found.name if found is not None else _host.machine()
    return of_machine(env.machine), env.machine


def missing_request(
    env: Environment, project: str | None, compat: CompatData
) -> tuple[VariantRequest | None, str]:
    """(the request for what this host lacks, what it lacks in words); no request where there is nothing a
    build could make (a CPU build of torch, no driver, a machine the factory builds no wheel for). The
    request is for this host's platform."""
    target, machine = _request_platform(env)
    if target is None or build_problem(target) is not None:
        built = ", ".join(p.name for p in BUILDABLE)
        return None, f"the factory builds no wheel for this host's machine {machine} (it builds {built})"
    if env.torch is not None:
        if env.cuda is None:
            return None, "torch here is a CPU build: install a CUDA build of torch first"
        torch, cuda, abi = torch_minor(env.torch), ".".join(env.cuda.split(".")[:2]), env.cxx11_abi
    elif env.driver_cuda is None:
        return None, "no NVIDIA driver was found (nvidia-smi, libcuda, /proc/driver/nvidia/version)"
    else:
        chosen = _request_torch(env, compat)
        if chosen is None:
            return (
                None,
                f"the compatibility data knows no torch with a CUDA build driver CUDA {env.driver_cuda} runs",
            )
        (torch, cuda), abi = chosen, None
    if abi is None:
        entry = compat.torch_entry(torch) or {}
        abi = entry.get("cxx11_abi", [True])[-1] is not False
    try:
        request = variantrequest.make_request(
            package=project,
            python=env.python,
            cuda=cuda,
            torch=torch,
            cxx11_abi=abi,
            archs=env.gpus,
            platform=target,
        )
    except variantrequest.RequestError as exc:
        return None, f"cannot request it: {exc}"
    gpus = ", ".join(request.archs) or "unknown"
    # the platform where it is not the default's, as `describe_environment` says the machine
    on = f" on {target.name}" if target != DEFAULT_PLATFORM else ""
    what = (
        f"{project or 'a variant'} for Python {request.python}{on}, CUDA {request.cuda}, "
        f"torch {request.torch}, cxx11 ABI {int(request.cxx11_abi)}, GPUs {gpus}"
    )
    return request, what


def _unmatched(env: Environment, choice: Choice, project: str | None, compat: CompatData) -> WhichResult:
    request, missing = missing_request(env, project, compat)
    return WhichResult(
        env=env, choice=choice, variant_url=None, projects=(), request=request, missing=missing
    )


def _fetch_state(url: str) -> bytes:
    """GET one JSON state object of an index (`open_url`), never more than a state may be
    (wheelvariants.MAX_STATE_BYTES) and one byte: DamagedState for a longer one."""
    with open_url(url, accept="application/json") as resp:  # MAX_PAGE and PAGE_DEADLINE_S over it all
        try:
            data = resp.read(wheelvariants.MAX_STATE_BYTES + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise FactoryError(f"{without_credentials(url)}: {exc}") from None
    if len(data) > wheelvariants.MAX_STATE_BYTES:
        raise DamagedState(f"over {wheelvariants.MAX_STATE_BYTES >> 20} MiB, not a state the factory writes")
    return data


def wheel_variant_installs(
    root: str,
    env: Environment,
    key: VariantKey,
    projects: Sequence[str],
    torch: Torch,
    *,
    default_index: str = DEFAULT_INDEX,
) -> tuple[tuple[Install, ...], str | None]:
    """The experimental wheel-variant channel of the index whose `simple/` is `root`, for a host with torch
    for which the per-variant index `key` was chosen: (per project of `projects` that the variant index of
    the host's torch lists, what its uv command installs; a note).

    ROOT/variants/groups.json names the variant indexes (`wheelvariants.choose_group` picks the host's, by
    its torch and C++ ABI, the chosen variant's ABI where torch's is unknown); the projects.json of that one
    says which projects it has. An index without the channel prints nothing more: groups.json that cannot
    be read is taken for absent (a directory or server answers a missing one with 404, S3 without list
    permission with 403). Whatever it hands back that is not the format gives no command and one note.
    torch is pinned as in the safe commands (`torch`), so uv leaves the installed one in place."""
    assert env.torch is not None
    base = root.removesuffix("simple/")
    try:
        groups = wheelvariants.groups_from_json(_fetch_state(base + wheelvariants.GROUPS_STATE))
    except DamagedState as exc:
        return (), printable(f"no wheel-variant command: {wheelvariants.GROUPS_STATE}: {exc}")
    except FactoryError:  # not there, or not readable: no channel
        return (), None
    abi = key.cxx11_abi if env.cxx11_abi is None else env.cxx11_abi
    group = wheelvariants.choose_group(groups, env.torch, abi)
    if group is None:
        return (), None
    listing = wheelvariants.projects_key(group)
    try:
        listed = set(projects_from_root_json(_fetch_state(base + listing)))
    except (FactoryError, ValueError, RecursionError) as exc:  # json's own ValueError: a 5,000-digit number
        return (), printable(f"no wheel-variant command: {listing}: {exc}")
    variant_index = base + wheelvariants.root_dir(group)
    installs = tuple(
        Install(
            project=str(canonicalize_name(name)),
            torch=torch,
            variant_index=variant_index,
            default_index=default_index,
            wheel_variants=True,
        )
        for name in projects
        if canonicalize_name(name) in listed
    )
    return installs, None


def which(
    index: str,
    *,
    env: Environment,
    project: str | None = None,
    compat: CompatData | None = None,
    default_index: str = DEFAULT_INDEX,
    wheel_variants: bool = True,
) -> WhichResult:
    """Read the index's list of variant indexes and pick the one for `env`, and in it the wheel of each
    project an installer would take (`installcmd.choose`); the commands install exactly that file, torch
    pinned beside it and the dependencies from `default_index`.

    The index is not trusted: only anchors whose text is a variant id (the grammar of `factory.core.variants`)
    and, inside the variant index, a PEP 508 project name are considered, and of a project page only
    links to wheel files with a sha256, so nothing else it says reaches the printed commands. With
    `wheel_variants`, a host with torch also gets the experimental channel's uv command where the index
    has one (`wheel_variant_installs`)."""
    compat = compat or CompatData.load()
    root = normalize_index_url(index)
    links = _index_links(fetch_page(root), root)
    variants = {vid: url for vid, url in links.items() if parse_variant_id(vid) is not None}
    if env.torch is None and env.driver_cuda is not None:
        return _without_torch(env, variants, project, compat, default_index=default_index)
    choice = choose_variant(env, variants)
    if choice.match is None:
        return _unmatched(env, choice, project, compat)
    variant_url = variants[choice.match]
    fitting, notes = _variant_projects(env, variant_url, project, strict=True)
    key = VariantKey.parse_id(choice.match)
    torch = torch_for(key, compat, installed=env.torch)
    projects = tuple(name for name, _wheel in fitting)
    variant_installs: tuple[Install, ...] = ()
    variant_note = None
    if wheel_variants and projects and env.torch is not None:
        variant_installs, variant_note = wheel_variant_installs(
            root, env, key, projects, torch, default_index=default_index
        )
    return WhichResult(
        env=env,
        choice=replace(choice, notes=(*choice.notes, *notes)),
        variant_url=variant_url,
        projects=projects,
        installs=tuple(
            Install(project=name, torch=torch, wheel=wheel, default_index=default_index)
            for name, wheel in fitting
        ),
        variant_installs=variant_installs,
        variant_note=variant_note,
    )


def describe_environment(env: Environment) -> str:
    """The line `factory which` starts with: what of this host decides the variant."""
    gpus = ", ".join(env.gpus) if env.gpus else "none"
    abi = "unknown" if env.cxx11_abi is None else str(int(env.cxx11_abi))
    driver = ""
    if env.torch is None:
        driver = f", driver CUDA {env.driver_cuda or 'none'} (from {env.driver_source})"
    # the machine where it is not the default platform's (the one every line said before the axis)
    found = of_machine(env.machine) if env.machine else None
    machine = f" on {env.machine}" if env.machine and found != DEFAULT_PLATFORM else ""
    return (
        f"python {env.python}{machine}, torch {env.torch or 'not installed'}, CUDA {env.cuda or 'none'}, "
        f"cxx11 ABI {abi}, GPUs {gpus} (from {env.gpu_source}){driver}"
    )


def missing_lines(result: WhichResult) -> list[str]:
    """What `factory which` prints when no variant fits: what is missing and the matrix lines that would
    build it."""
    if result.missing is None:
        return []
    if result.request is None:
        return [f"missing: {result.missing}"]
    return [
        f"missing: {result.missing}",
        "a matrix with these lines would build it (factory which --request asks the index's team):",
        *variantrequest.matrix_lines(result.request),
    ]


def result_lines(result: WhichResult, *, signed: Sequence[str] = ()) -> list[str]:
    """What `factory which` prints of its result: the variant, its notes, the `signed` lines and the install
    commands, then the experimental wheel-variant commands (or the one note on why there are none);
    FactoryError when no variant index matches this host, naming the nearest and why."""
    choice = result.choice
    if choice.match is None:
        if choice.nearest:
            raise FactoryError(
                f"no variant index matches this host; nearest: {choice.nearest} ({'; '.join(choice.reasons)})"
            )
        raise FactoryError(f"no variant index matches this host: {'; '.join(choice.reasons)}")
    lines = [f"variant: {choice.match}", *(f"note: {note}" for note in choice.notes)]
    if not result.commands:
        lines.append(no_command_line(result))
        return lines  # `advise` raises its last line: nothing to run
    lines += [*signed, *(command for commands in result.commands for command in commands)]
    if result.variant_commands:
        lines.append(
            f"experimental, wheel variants (PEP 825; tested with uv {wheelvariants.UV_TESTED}): uv picks the "
            "build for this host's NVIDIA driver and GPU:"
        )
        lines += result.variant_commands
    elif result.variant_note is not None:
        lines.append(f"note: {result.variant_note}")
    return lines


def no_command_line(result: WhichResult) -> str:
    """The last line of a `factory which` that prints no command: why not, where the notes above do not
    already say it all (`factory which` then exits non-zero)."""
    url = without_credentials(result.variant_url or "")
    left_out = [note for note in result.choice.notes if " left out: " in note]
    if left_out:
        what = "its project does not" if len(left_out) == 1 else f"none of its {len(left_out)} projects"
        return f"index: {url}: no install command: {what} fit this host (the notes say why)"
    return f"index: {url}: no install command: no projects published there yet"


MAX_ANSWER = 4096  # of a server's answer to a request: one line is expected


def submit_request(index: str, request: VariantRequest) -> str:
    """Send `request` to the index's server (POST ROOT/_requests/, `factory serve --accept-requests`), or
    for a local index write it under its _requests/ directory; the line saying where it went."""
    root = normalize_index_url(index).removesuffix("simple/")
    short = request.id[:12]
    if root.startswith("file:"):
        directory = Path(unquote(urlsplit(root).path))
        try:
            created = variantrequest.store_request(directory, request)
        except variantrequest.InboxFull as exc:
            raise FactoryError(f"{directory}: not recording the request: {exc}") from None
        except OSError as exc:
            raise FactoryError(f"{directory}: cannot record the request ({exc.strerror or exc})") from None
        where = directory / variantrequest.DIRECTORY / request.file_name
        return f"request {short} {'recorded' if created else 'was recorded already'}: {where}"
    url = root + variantrequest.DIRECTORY + "/"
    http = _http_request(
        url, data=variantrequest.compose(request), headers={"Content-Type": "application/json"}
    )
    shown = without_credentials(url)
    try:
        with bounded.open_url(http, seconds=PAGE_DEADLINE_S, max_bytes=MAX_ANSWER, shown=shown) as resp:
            status = resp.status
    except bounded.Refused as exc:
        raise FactoryError(str(exc)) from None
    except urllib.error.HTTPError as exc:
        said = exc.read(MAX_ANSWER).decode("utf-8", "replace").strip().splitlines()
        detail = f": {printable(said[0])}" if said else ""
        raise FactoryError(f"{shown}: HTTP {exc.code}{detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise FactoryError(f"{shown}: {reason}") from None
    return f"request {short} {'recorded' if status == 201 else 'was recorded already'} at {shown}"


def advise(
    index: str,
    *,
    python: str | None,
    project: str | None,
    say: Callable[[str], None],
    request: bool = False,
    verify_key: Path | None = None,
    default_index: str = DEFAULT_INDEX,
) -> None:
    """`factory which`: probe `python` (default: this interpreter), then `say` what it is and the pip and uv
    commands for the variant index of `index` that fits it (`which`, `result_lines`), dependencies from
    `default_index`. When none fits: what is missing and the matrix lines that would build it, and with
    `request`, the request sent. With `verify_key`, the commands only once the wheels they install are
    signed with it (`verify.verify_project`), and for exactly the bytes verified; then no wheel-variant
    command, as no signature covers a variant wheel (it is rewritten from the signed one)."""
    from factory.trust.signing import public_key_file

    normalize_index_url(index)  # a bad --index-url fails before this host is probed
    checked_url(default_index, schemes=INDEX_SCHEMES, what="--default-index")
    key = public_key_file(verify_key, what="--verify-key") if verify_key is not None else None
    env = detect_environment(python)
    say(describe_environment(env))
    result = which(index, env=env, project=project, default_index=default_index, wheel_variants=key is None)
    if result.choice.match is None:
        for line in missing_lines(result):
            say(line)
        if request:
            if result.request is None:
                raise FactoryError(f"nothing to request: {result.missing}")
            say(submit_request(index, result.request))
            return
    signed: list[str] = []
    if key is not None and result.variant_url is not None:
        installs = []
        for install in result.installs:
            v = verify_project(result.variant_url, install.project, host=host_of(env), key=key)
            assert v.url is not None
            signed.append(f"signed: {v.filename} (key {v.key_id})")
            # the command installs the bytes just verified, whatever the page says by now
            installs.append(replace(install, wheel=Wheel(filename=v.filename, url=v.url, sha256=v.sha256)))
        result = replace(result, installs=tuple(installs))
    lines = result_lines(result, signed=signed)
    if not result.commands:
        # nothing to run: the reason is the error, so a script sees the non-zero exit
        for line in lines[:-1]:
            say(line)
        raise FactoryError(lines[-1])
    for line in lines:
        say(line)
