"""The wheel factory: build, check and publish torch CUDA extension wheels in containers."""

# The one place the version is written: pyproject.toml reads it from here.
__version__ = "0.1.0"


def version() -> str:
    """The factory's version: its installed distribution's (wheel-factory), else __version__ (a checkout on
    sys.path with no distribution installed)."""
    from importlib import metadata

    try:
        return metadata.version("wheel-factory")
    except metadata.PackageNotFoundError:
        return __version__
