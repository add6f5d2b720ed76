"""What the parts of one job share: what it builds from (`JobInputs`, prepared once per run), what every job
of a run shares (`JobContext`) and what one driver phase ended with (`DriverOutcome`). Below the job's run
(`jobrun`) and the acceptance of its wheel (`acceptance`), which both use them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from factory.build import facts as buildfacts
from factory.build.engine import Engine
from factory.build.report import JobResult
from factory.build.reuse import Reuse
from factory.cache import sync
from factory.container import heartbeat
from factory.core import reproducible
from factory.plan import shard as sharding
from factory.spec.config import MatrixFile


@dataclass(frozen=True, kw_only=True)
class JobInputs:
    """What a job builds from, prepared once per run and shared by its jobs."""

    image: str
    source: Path
    wheelhouse: Path
    cache_domain: str = ""  # the compile cache's trust domain of the source (`cache.trust_domain`)
    toolkit: str | None = None  # the CUDA release of the image's nvcc, when the image says
    # the install check's own wheelhouse: the package's runtime requirements (`runtimereqs`); None: none
    check_wheelhouse: Path | None = None
    check_requirements: tuple[str, ...] = ()
    check_note: str = ""  # what the log says of them
    image_id: str | None = None  # the image's docker id, for report.json
    facts: buildfacts.InputFacts | None = None  # what the wheel's provenance says of its inputs
    # SOURCE_DATE_EPOCH of the job's builds and of its wheel's archive (`reproducible`)
    source_date_epoch: int = reproducible.DEFAULT_EPOCH


@dataclass(frozen=True, kw_only=True)
class JobContext:
    """What every job of one run shares."""

    mf: MatrixFile
    engine: Engine
    run_id: str
    run_dir: Path
    output: Path
    memory_limit: int
    cpus: float
    on_change: Callable[[JobResult], None]
    log: Callable[[str], None]
    heartbeat_stale_s: float = heartbeat.STALE_S  # how long a build container outlives a silent factory
    shard: sharding.Shard | None = None  # --shard I/N: each job compiles that share into the cache, no wheel
    preflight: bool = False  # --preflight: each job compiles its host sources and one device source, no wheel
    compile_cache: sync.CacheSync | None = None  # None: the cache is off
    # stable-ABI jobs (by id) that take their published wheel instead of compiling (`factory.build.reuse`)
    reuse: Mapping[str, Reuse] = field(default_factory=dict)

    @property
    def heartbeat_file(self) -> Path:
        """The file the run touches while it lives (`engine.Heartbeat`); its directory is mounted into
        every build container."""
        return self.run_dir / "heartbeat" / heartbeat.FILE_NAME

    @property
    def stop(self) -> threading.Event:
        return self.engine.stop


@dataclass(frozen=True, kw_only=True)
class DriverOutcome:
    exit_code: int
    oom_killed: bool
    peak_bytes: int
    markers: Mapping[str, Any]
