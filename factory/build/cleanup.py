"""`factory clean`: everything runs and publishes that died left behind on this host, removed in one call.

Above the modules that own each kind of leftover (`leftovers`, `stores`, `source`, `cache`, and through
`engine` the build containers and the work volume); each decides what of its own is stale.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from factory.build import leftovers
from factory.build.source import remove_stale_partials
from factory.cache.sync import local_dir, remove_stale_outboxes
from factory.core.errors import ConfigError
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
        removed += [f"{WORK_VOLUME}:{d}" for d in leftovers.remove_stale_job_dirs(client, image=image)]
    for directory in outputs:
        removed += map(str, leftovers.remove_stale_output_dirs(directory.resolve()))
    for directory in indexes:
        removed += map(str, LocalStore(directory.resolve()).remove_stale_temporaries())
    removed += map(str, remove_stale_partials(factory_home()))
    removed += map(str, remove_stale_outboxes(local_dir()))
    return removed
