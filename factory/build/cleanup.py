"""`factory clean`: everything runs and publishes that died left behind on this host, removed in one call.

Above the modules that own each kind of leftover (`leftovers`, `stores`, `source`, `cache`, and through
`engine` the build containers and the work volume); each decides what of its own is stale.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from factory.build.source import remove_stale_partials
from factory.cache.sync import local_dir, remove_stale_outboxes
from factory.container import DRIVER, IMPORT_ROOT, protocol
from factory.core import leftovers
from factory.core.errors import BuildError, ConfigError, DockerError
from factory.core.home import factory_home
from factory.publish.stores import LocalStore


def clean(
    *, outputs: Sequence[Path] = (), indexes: Sequence[Path] = (), containers: bool = True
) -> list[str]:
    """Remove what dead runs left: with `containers`, their build containers and jobs' directories in the
    work volume (needs Docker); their `.tmp-*` directories in each of `outputs`; dead publishes' temporaries
    in each local index of `indexes`; half-made downloads and trees in $FACTORY_HOME and dead runs' cache
    outboxes. What was removed, one item each ("container NAME", "VOLUME:DIR" or a path), in that order."""
    for directory in [*outputs, *indexes]:
        if not directory.is_dir():  # an s3:// index has no temporaries: its writes are whole
            raise ConfigError(f"{directory}: not a local directory")
    removed: list[str] = []
    if containers:
        from factory.build.engine import connect, remove_stale_containers
        from factory.build.images import housekeeping_image, list_images
        from factory.build.jobspec import WORK_VOLUME

        client = connect()
        removed += [f"container {name}" for name in remove_stale_containers(client)]
        image = housekeeping_image(list_images(client))
        removed += [f"{WORK_VOLUME}:{d}" for d in remove_stale_job_dirs(client, image=image)]
    for directory in outputs:
        removed += map(str, leftovers.remove_stale_output_dirs(directory.resolve()))
    for directory in indexes:
        removed += map(str, LocalStore(directory.resolve()).remove_stale_temporaries())
    removed += map(str, remove_stale_partials(factory_home()))
    removed += map(str, remove_stale_outboxes(local_dir()))
    return removed


def remove_stale_job_dirs(client: Any, *, image: str | None) -> list[str]:
    """Remove the work volume's job directories that runs now gone left (a finished job removes its own; a
    killed or interrupted run's stay), by `leftovers.stale_job_dirs`, with the driver's housekeeping phases
    in `image` (a builder image: `images.housekeeping_image`); their paths in the volume. Nothing when the
    volume, or such an image, is not on this host."""
    # Docker only here, as in `clean`: the rest runs where no daemon is
    from factory.build import engine, jobspec

    if image is None or not engine.volume_exists(client, jobspec.WORK_VOLUME):
        return []
    box = engine.Engine(client, labels=engine.run_labels(f"clean-{os.getpid()}"), stop=threading.Event())

    def driver(*args: str) -> str:
        try:
            return box.run_short(
                image,
                [*DRIVER, *args],
                env={"PYTHONPATH": IMPORT_ROOT},
                user=jobspec.CONTAINER_USER,
                mounts=jobspec.work_mounts(),
            )
        except DockerError as exc:
            raise BuildError(
                f"volume {jobspec.WORK_VOLUME}: the driver's {args[0]} in {image} failed: {exc}"
            ) from None

    listed = protocol.parse_job_listing(driver("jobs", jobspec.JOBS_ROOT))
    # read after the listing, so that a container started meanwhile is seen
    stale = leftovers.stale_job_dirs(listed, running_runs=engine.running_runs(client))
    if not stale:
        return []
    removed = protocol.parse_removed(driver("remove-jobs", jobspec.JOBS_ROOT, *stale))
    return [f"{jobspec.JOBS_ROOT}/{name}" for name in removed]
