"""The plan a CI job matrix runs (GitHub Actions' `strategy.matrix`), pure.

A scheduled workflow plans only the jobs whose wheel is not published yet; GitHub rejects a matrix of more
than 256 jobs, so a larger matrix is planned in chunks (`--chunk I/K`, one workflow call per chunk). A chunk
is a fixed slice of the whole matrix, not of what is left to build: every call agrees on who builds what
whatever the others have published meanwhile.

Each job of the matrix names the runner it builds on (`runs_on`, which the workflow's `runs-on` reads): a host
of the job's own platform (`Platform.ci_runner`), so that every job builds natively, never under emulation.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from factory.core import platforms
from factory.core.errors import ConfigError
from factory.core.platforms import Platform
from factory.core.validate import runner_labels_problem, shown_name
from factory.spec.options import MAX_MATRIX_JOBS

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Chunk:
    """Chunk `index` (1-based) of `count` equal slices of a matrix's jobs."""

    index: int = 1
    count: int = 1

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_chunk(text: str) -> Chunk:
    """ "I/K" with 1 <= I <= K; ConfigError naming the value otherwise."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if match is None:
        raise ConfigError(f"--chunk {text!r}: expected I/K, like 1/2")
    index, count = int(match.group(1)), int(match.group(2))
    if not 1 <= index <= count:
        raise ConfigError(f"--chunk {text!r}: I must be between 1 and K")
    return Chunk(index=index, count=count)


def chunk_of(items: Sequence[T], chunk: Chunk) -> list[T]:
    """The chunk's contiguous slice of `items`; slices differ in size by at most one and cover every item."""
    start = len(items) * (chunk.index - 1) // chunk.count
    stop = len(items) * chunk.index // chunk.count
    return list(items[start:stop])


def chunks_needed(total: int, limit: int = MAX_MATRIX_JOBS) -> int:
    """The fewest chunks whose every slice of `total` jobs holds at most `limit`."""
    return max(1, math.ceil(total / limit))


def too_many(
    *, planned: int, left: int, total: int, chunk: Chunk, limit: int = MAX_MATRIX_JOBS
) -> str | None:
    """Why `left` unpublished jobs of a chunk of `planned` cannot be one GitHub matrix, and what to run
    instead; None when they can."""
    if left <= limit:
        return None
    need = chunks_needed(total, limit)
    calls = ", ".join(f"{i}/{need}" for i in range(1, min(need, 3) + 1)) + (", ..." if need > 3 else "")
    return (
        f"chunk {chunk} has {left} jobs to build (of {planned} planned), more than the {limit} a GitHub "
        f"matrix allows: plan the {total} jobs in {need} chunks, calling the workflow with chunk {calls}"
    )


def github_json(value: object) -> str:
    """JSON as every GitHub output of the factory writes it (stdout or $GITHUB_OUTPUT): one line, compact,
    keys sorted."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def github_matrix(jobs: Sequence[Mapping[str, object]]) -> str:
    """The `strategy.matrix` value GitHub reads with fromJSON, on one line."""
    return github_json({"include": list(jobs)})


def github_outputs(jobs: Sequence[Mapping[str, object]]) -> str:
    """The lines a step appends to $GITHUB_OUTPUT: the matrix, and its size for a job's `if:` (a build job
    with an empty matrix would fail the run instead of being skipped)."""
    return f"matrix={github_matrix(jobs)}\ncount={len(jobs)}\n"


# The key of a GitHub matrix entry that holds its job's runner labels (the workflow's `runs-on: ${{
# matrix.runs_on }}`); a matrix include entry's own (`factory.spec.config`) wins over `Runners`.
RUNS_ON = "runs_on"


@dataclass(frozen=True, kw_only=True)
class Runners:
    """The runner labels of each platform's CI jobs: the caller's (`--runner PLATFORM=LABELS`), else the
    platform's own (`Platform.ci_runner`)."""

    chosen: Mapping[Platform, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))

    def of(self, platform: Platform) -> tuple[str, ...]:
        return self.chosen.get(platform, platform.ci_runner)


def _labels(text: str) -> object:
    """The labels of a `--runner` value: a JSON string or list (what the workflow's runs-on inputs hold), or
    labels separated by commas."""
    stripped = text.strip()
    if stripped.startswith(("[", '"')):
        try:
            return json.loads(stripped)
        except ValueError:
            return None
    return [label.strip() for label in stripped.split(",")]


def parse_runners(values: Sequence[str]) -> Runners:
    """`--runner PLATFORM=LABELS`, once per platform at most: a platform's name, then one label, labels
    separated by commas ("self-hosted,linux,x64") or a JSON string or list ('["self-hosted","linux","x64"]',
    as the workflow's runs-on inputs are written); ConfigError naming the value."""
    example = f"{platforms.PLATFORMS[-1].name}=my-runner-label"
    chosen: dict[Platform, tuple[str, ...]] = {}
    for text in values:
        shown = shown_name(text)
        name, sep, rest = text.partition("=")
        if not sep:
            raise ConfigError(f"--runner {shown!r}: expected PLATFORM=LABELS, like {example}")
        found = platforms.by_name(name.strip())
        if found is None:
            raise ConfigError(
                f"--runner {shown!r}: unknown platform {shown_name(name.strip())!r}: expected one of "
                f"{', '.join(platforms.NAMES)}"
            )
        if found in chosen:
            raise ConfigError(f"--runner {shown!r}: the runner of {found.name} is given twice")
        labels = _labels(rest)
        problem = runner_labels_problem(labels)
        if problem is not None:
            raise ConfigError(f"--runner {shown!r}: {problem}")
        chosen[found] = tuple([labels] if isinstance(labels, str) else labels)  # type: ignore[arg-type]
    return Runners(chosen=MappingProxyType(chosen))
