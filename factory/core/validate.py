"""The small pure checks a matrix file's and the command line's values pass, before anything is made of them.

Here rather than beside what uses each value (stores, the wheel check, the wheelhouse, the memory planner),
so that loading a matrix file (`factory.spec.config`) imports only what validation needs.
"""

from __future__ import annotations

import re

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import InvalidName, canonicalize_name

from factory.core.errors import ConfigError
from factory.core.units import format_gib
from factory.core.urls import printable, without_credentials

# --- names -------------------------------------------------------------------------------------------------

# A package's name: its wheel's file name ({name}-{version}+{label}-{tags}.whl, a label and tags of up to ~110
# characters) must fit in the 255 bytes of a file name, on every filesystem a wheelhouse or an index is on.
MAX_PACKAGE_NAME = 128
SHOWN_NAME = 64  # how much of a name a message shows


def shown_name(name: str, limit: int = SHOWN_NAME) -> str:
    """A name someone else chose (a package's, a wheel's, a document's key) as a message shows it: control
    characters escaped, at most `limit` characters (a longer one cut, with an ellipsis). Every message that
    echoes such a name goes through here: a 10,000-character package name is not a 10,000-character line."""
    text = printable(name)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def package_name_problem(name: str) -> str | None:
    """Why `name` cannot be a package's name (None: it can): a PEP 508 name, short enough for a wheel."""
    try:
        canonicalize_name(name, validate=True)
    except InvalidName:
        return "is not a valid distribution name"
    if len(name) > MAX_PACKAGE_NAME:
        return (
            f"is {len(name)} characters long; at most {MAX_PACKAGE_NAME} (its wheels' file names must fit "
            "in 255 bytes)"
        )
    return None


# --- what a matrix file names ------------------------------------------------------------------------------


def library_glob_problem(pattern: object) -> str | None:
    """Why `pattern` cannot name extension modules in a wheel (None: it can). A pattern is a path inside the
    wheel, '/'-separated, each segment an fnmatch glob that stays within its segment."""
    if not isinstance(pattern, str) or not pattern.strip():
        return "must be a non-empty glob on a path inside the wheel"
    if pattern != pattern.strip() or pattern.startswith("/") or "\\" in pattern:
        return "must be a relative '/'-separated path inside the wheel, without surrounding spaces"
    if any(part in ("", ".", "..") for part in pattern.split("/")):
        return "must not have empty, '.' or '..' segments"
    if not pattern.endswith((".so", "*")):
        return "must name extension modules (end in .so or a glob)"
    return None


# git's transports (gitprotocol-*, git-remote-helpers): a URL's scheme, "host:path" (ssh), a local path, or
# "<helper>::<address>", which runs `git-remote-<helper>` (`ext::` runs any command it is given). A scheme git
# does not know is a helper too (`s3://` runs git-remote-s3). A matrix file may name the first three kinds
# only; a wheel's rebuild document (`rebuild`), which anyone may have written, only remote ones.
GIT_TRANSPORTS = ("https", "http", "ssh", "git", "file")
REMOTE_GIT_TRANSPORTS = ("https", "ssh", "git")
_GIT_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_GIT_HELPER = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*::")
_GIT_SCHEME_ALIASES = {"git+ssh": "ssh", "ssh+git": "ssh"}


def git_transport(url: str) -> str:
    """The transport git takes for `url`, as git itself decides it: "https", "ssh" (also for scp-like
    "host:path"), "file" (a local path), another URL's scheme, or "NAME::" for a remote helper."""
    if helper := _GIT_HELPER.match(url):
        return helper.group()
    if scheme := _GIT_SCHEME.match(url):
        name = scheme.group(1).lower()
        return _GIT_SCHEME_ALIASES.get(name, name)
    colon, slash = url.find(":"), url.find("/")
    return "ssh" if colon > 0 and (slash < 0 or colon < slash) else "file"


def git_url_problem(url: str, transports: tuple[str, ...] = GIT_TRANSPORTS) -> str | None:
    """Why the factory does not clone `url` (None: it does): a transport outside `transports`, said before
    git runs (git would run `ext::`'s command, or any remote helper a host has installed)."""
    transport = git_transport(url)
    if transport in transports:
        return None
    shown = shown_name(without_credentials(url) if "://" in url else url)
    if transport.endswith("::"):
        what = f"the {transport} transport runs a program (a git remote helper)"
    elif transport == "file":
        what = "a repository on this host"
    else:
        what = f"the {transport}:// transport is not one the factory uses"
    allowed = ", ".join(f"{t}://" for t in transports if t != "file")
    if "file" in transports:
        allowed += ", file:// or a local path"
    return f"{shown!r}: {what}; the factory clones over {allowed} only"


def requirement_problem(text: str) -> str | None:
    """Why `text` may not be one of pip's requirement arguments, or None. Only PEP 508 requirements by name
    (`ninja>=1.11`) pass: an option (`--index-url=...`, `-r FILE`) or a direct URL (`x @ https://...`) would
    change where the host's pip downloads from or what it reads."""
    try:
        parsed = Requirement(text)
    except InvalidRequirement:
        return "is not a requirement like 'ninja>=1.11' (no pip options)"
    if parsed.url is not None:
        return "is a direct URL; name a requirement that an index serves"
    return None


# --- matrix values that follow the index (resolved by factory.plan.specs at plan time)
# -------------------------

MAX_SPECIFIER = 100
_OPERATOR = re.compile(r"[<>=!~*,]")


def is_specifier(value: object) -> bool:
    """Whether a matrix value is a specifier (">=2.12", "2.14.*", "~=3.11") rather than an exact version."""
    return isinstance(value, str) and bool(_OPERATOR.search(value))


def parse_specifier(text: str) -> SpecifierSet:
    """`text` as a SpecifierSet ("2.14.*" is read as "==2.14.*"); ValueError saying why it is not one."""
    if len(text) > MAX_SPECIFIER:
        raise ValueError(f"longer than {MAX_SPECIFIER} characters")
    written = text.strip()
    if written and written[0].isdigit():
        written = "==" + written
    try:
        spec = SpecifierSet(written)
    except InvalidSpecifier as exc:
        raise ValueError(str(exc)) from None
    if not len(spec):
        raise ValueError("an empty specifier")
    return spec


def specifier_problem(text: str) -> str | None:
    """Why `text` is not a PEP 440 specifier a matrix's torch or python axis takes, or None."""
    try:
        parse_specifier(text)
    except ValueError as exc:
        return str(exc)
    return None


# --- CI runners --------------------------------------------------------------------------------------------

# The labels a GitHub Actions job's `runs-on` names: GitHub's hosted images ("ubuntu-24.04-arm") and what a
# self-hosted runner registers (`config.sh --labels a,b`, so never a comma). Nothing else: no whitespace, no
# quote, no `${{`: a label reaches the workflow as data and is shown in messages and logs.
_RUNNER_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_RUNNER_LABEL = 100
MAX_RUNNER_LABELS = 16


def runner_labels_problem(labels: object) -> str | None:
    """Why `labels` (a label, or a list of them: what a job's `runs-on` takes) is not a runner's labels;
    None when it is."""
    items = [labels] if isinstance(labels, str) else labels
    if not isinstance(items, list) or not items:
        return "expected a runner label or a non-empty list of them"
    if len(items) > MAX_RUNNER_LABELS:
        return f"{len(items)} runner labels; at most {MAX_RUNNER_LABELS}"
    for label in items:
        if not isinstance(label, str):
            return f"runner label {label!r} is not a string"
        if len(label) > MAX_RUNNER_LABEL or not _RUNNER_LABEL.fullmatch(label):
            return (
                f"runner label {shown_name(label)!r} is not a label like ubuntu-24.04-arm (letters, digits, "
                f"'.', '_', '-', at most {MAX_RUNNER_LABEL} characters)"
            )
    return None


# --- memory ------------------------------------------------------------------------------------------------

DEFAULT_BUDGET_FRACTION = 0.75  # of the host's memory, for all of a build's containers together


def container_limits(
    *,
    budget_bytes: int | None = None,
    concurrency: int,
    per_job_bytes: int | None = None,
    host_bytes: int | None = None,
    fraction: float = DEFAULT_BUDGET_FRACTION,
) -> list[int]:
    """Memory limit of each of `concurrency` containers, together at most the budget."""
    if concurrency < 1:
        raise ConfigError(f"concurrency must be at least 1, not {concurrency}")
    if budget_bytes is None:
        if host_bytes is None:
            import psutil

            host_bytes = int(psutil.virtual_memory().total)
        budget_bytes = int(host_bytes * fraction)
    if per_job_bytes is None:
        return [budget_bytes // concurrency] * concurrency
    if per_job_bytes * concurrency > budget_bytes:
        raise ConfigError(
            f"{concurrency} containers x {format_gib(per_job_bytes)} exceed "
            f"the memory budget of {format_gib(budget_bytes)}; "
            "lower the memory per container or the concurrency"
        )
    return [per_job_bytes] * concurrency
