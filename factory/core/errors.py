"""The factory's small error hierarchy; each error carries the process exit code."""

from __future__ import annotations


class FactoryError(Exception):
    """An expected failure, shown to the user as one line without a traceback."""

    exit_code: int = 1


class ConfigError(FactoryError):
    """Bad usage or configuration: a matrix file, an option value, a missing file."""

    exit_code = 2

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None) -> None:
        self.file = file
        self.line = line
        where = ""
        if file is not None:
            where = f"{file}:{line}: " if line is not None else f"{file}: "
        super().__init__(f"{where}{message}")


class PatchError(ConfigError):
    """A recipe's patch does not apply to the source: the recipe's error; a preflight reports it per job."""


class ImageError(FactoryError):
    """A builder image or its base cannot be had."""


class BuildError(FactoryError):
    """A build could not be run at all (as opposed to a job that failed)."""


class DockerError(BuildError):
    """The Docker daemon cannot be reached, or refused a request (`factory.build.engine` alone raises it)."""


class CheckError(FactoryError):
    """A built wheel failed one of the acceptance checks."""


class PublishError(FactoryError):
    """Publishing was refused or failed; nothing already published was changed."""
